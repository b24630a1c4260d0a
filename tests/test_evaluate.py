"""sharding_lab.labs.evaluate: the sentence that says what a finding's figures are true of."""

from __future__ import annotations

from sharding_lab.labs.evaluate import MeasuredRun, where_phrase


def tiny(world_size: int, mixed: bool = False, ranks: str = "gloo") -> MeasuredRun:
    return MeasuredRun("tiny", 60_096, ranks, world_size, mixed)


def test_one_run_names_its_model_ranks_and_dtype():
    assert where_phrase([tiny(2)]) == "the tiny model (60,096 parameters) on 2 gloo ranks, fp32"
    assert where_phrase([tiny(1)]) == "the tiny model (60,096 parameters) on 1 gloo rank, fp32"


def test_world_sizes_of_one_dtype_are_listed_once_in_order():
    # It read "on 1 gloo rank, fp32 and 2 gloo ranks, fp32 and 4 gloo ranks, fp32".
    runs = [tiny(4), tiny(1), tiny(2), tiny(2)]
    assert where_phrase(runs) == "the tiny model (60,096 parameters) on 1, 2 and 4 gloo ranks, fp32"


def test_two_dtypes_on_the_same_ranks_share_them():
    # It read "on 2 gloo ranks, fp32 and 2 gloo ranks, bf16 mixed precision".
    runs = [tiny(2), tiny(2, mixed=True)]
    assert where_phrase(runs) == "the tiny model (60,096 parameters) on 2 gloo ranks, fp32 and bf16 mixed precision"


def test_dtypes_on_different_ranks_each_say_theirs():
    runs = [tiny(2), tiny(4, mixed=True)]
    assert where_phrase(runs) == (
        "the tiny model (60,096 parameters) on 2 gloo ranks (fp32) and 4 gloo ranks (bf16 mixed precision)"
    )


def test_real_ranks_and_a_rank_view_and_two_models():
    runs = [tiny(2), tiny(8, ranks="rank view"), MeasuredRun("mini", 1_028_352, "rank view", 8, False),
            MeasuredRun("mini", 1_028_352, "rank view", 16, False)]
    assert where_phrase(runs) == (
        "the tiny model (60,096 parameters) on 2 gloo ranks and a rank view of 8 ranks, fp32; "
        "the mini model (1,028,352 parameters) on rank views of 8 and 16 ranks, fp32"
    )
