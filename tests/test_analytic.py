"""The ZeRO paper's analytic model: exact known values and the paper's Table 1."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharding_lab.analytic import (
    adam_step_temporaries,
    communication_bytes_per_step,
    fsdp_padded_numel,
    fsdp_rank_numel,
    model_states_bytes_per_rank,
    zero1_partition,
    zero1_placement,
)
from sharding_lab.estimate import PAPER_STAGE_NAMES, paper_style, table1
from sharding_lab.strategies import STRATEGIES

# Table 1 of Rajbhandari et al. 2020 (arXiv 1910.02054), per-device model-state
# memory in GB with K = 12, as printed: {(params, DP): (Pos, Pos+g, Pos+g+p)}.
# The DP = 1 row is the baseline (16Ψ) for every column.
PAPER_TABLE1 = {
    (7_500_000_000, 1): ("120", "120", "120"),
    (7_500_000_000, 4): ("52.5", "41.3", "30"),
    (7_500_000_000, 16): ("35.6", "21.6", "7.5"),
    (7_500_000_000, 64): ("31.4", "16.6", "1.88"),
    (7_500_000_000, 256): ("30.4", "15.4", "0.47"),
    (7_500_000_000, 1024): ("30.1", "15.1", "0.12"),
    (128_000_000_000, 1): ("2048", "2048", "2048"),
    (128_000_000_000, 4): ("896", "704", "512"),
    (128_000_000_000, 16): ("608", "368", "128"),
    (128_000_000_000, 64): ("536", "284", "32"),
    (128_000_000_000, 256): ("518", "263", "8"),
    (128_000_000_000, 1024): ("513", "257", "2"),
    (1_000_000_000_000, 1): ("16000", "16000", "16000"),
    (1_000_000_000_000, 4): ("7000", "5500", "4000"),
    (1_000_000_000_000, 16): ("4750", "2875", "1000"),
    (1_000_000_000_000, 64): ("4187", "2218", "250"),
    (1_000_000_000_000, 256): ("4046", "2054", "62.5"),
    (1_000_000_000_000, 1024): ("4011", "2013", "15.6"),
}
PAPER_BASELINE_GB = {7_500_000_000: 120, 128_000_000_000: 2048, 1_000_000_000_000: 16000}


def test_fp32_adam_is_16_bytes_per_param_replicated_under_ddp():
    assert model_states_bytes_per_rank(1000, 8, "ddp") == {
        "params": 4000,
        "grads": 4000,
        "optimizer": 8000,
        "total": 16000,
    }


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("ddp", {"params": 4000, "grads": 4000, "optimizer": 8000, "total": 16000}),
        ("zero1", {"params": 4000, "grads": 4000, "optimizer": 2000, "total": 10000}),
        ("zero2", {"params": 4000, "grads": 1000, "optimizer": 2000, "total": 7000}),
        ("zero3", {"params": 1000, "grads": 1000, "optimizer": 2000, "total": 4000}),
        ("fsdp", {"params": 1000, "grads": 1000, "optimizer": 2000, "total": 4000}),
    ],
)
def test_each_stage_shards_its_parts_fp32(strategy, expected):
    assert model_states_bytes_per_rank(1000, 4, strategy) == expected


def test_mixed_precision_7_5b_at_64_ranks_matches_the_papers_bytes():
    psi, n = 7_500_000_000, 64
    assert model_states_bytes_per_rank(psi, n, "ddp", mixed_precision=True)["total"] == 16 * psi
    assert model_states_bytes_per_rank(psi, n, "zero1", mixed_precision=True) == {
        "params": 2 * psi,
        "grads": 2 * psi,
        "optimizer": 12 * psi // n,
        "total": 4 * psi + 12 * psi // n,
    }
    assert model_states_bytes_per_rank(psi, n, "zero2", mixed_precision=True)["total"] == 2 * psi + 14 * psi // n
    assert model_states_bytes_per_rank(psi, n, "zero3", mixed_precision=True)["total"] == 16 * psi // n


def test_uneven_shards_round_up_to_the_largest_rank():
    # 10 params over 4 ranks: a flat buffer padded to 12, 3 per rank.
    assert model_states_bytes_per_rank(10, 4, "zero3")["params"] == 12


def test_padded_num_params_is_what_each_rank_holds_exactly():
    shapes = [(5, 3), (7,), ()]  # 15 + 7 + 1 = 23 elements
    padded = fsdp_padded_numel(shapes, 4)
    assert padded == 8 * 3 + 8 + 4
    states = model_states_bytes_per_rank(23, 4, "zero3", padded_num_params=padded)
    assert states == {"params": 36, "grads": 36, "optimizer": 72, "total": 144}
    # ddp replicates the unpadded parameters; zero1 pads only the optimizer state.
    assert model_states_bytes_per_rank(23, 4, "ddp", padded_num_params=padded)["params"] == 92
    assert model_states_bytes_per_rank(23, 4, "zero1", padded_num_params=padded)["optimizer"] == 72


def test_padded_num_params_must_be_a_multiple_of_world_size():
    with pytest.raises(ValueError, match="multiple of world_size"):
        model_states_bytes_per_rank(10, 4, "zero3", padded_num_params=10)


def test_fsdp_padded_numel_pads_dim0_only():
    assert fsdp_padded_numel([(50304, 768)], 1024) == 50176 * 768 + 1024 * 768
    assert fsdp_padded_numel([(768,)], 1024) == 1024
    assert fsdp_padded_numel([(8, 2)], 8) == 16
    assert fsdp_padded_numel([], 8) == 0


def test_each_rank_holds_its_torch_chunk_of_dim0_padding_left_out():
    # 5 rows over 4 ranks: chunks of ceil(5/4) = 2 rows, so 2, 2, 1 and none.
    assert [fsdp_rank_numel((5, 3), 4, r) for r in range(4)] == [6, 6, 3, 0]
    assert [fsdp_rank_numel((8,), 2, r) for r in range(2)] == [4, 4]
    assert fsdp_rank_numel((), 3, 0) == 1 and fsdp_rank_numel((), 3, 1) == 0  # a scalar is one row


@given(dim0=st.integers(1, 200), rest=st.integers(1, 5), world_size=st.integers(1, 16))
def test_the_ranks_chunks_add_up_to_the_tensor(dim0, rest, world_size):
    assert sum(fsdp_rank_numel((dim0, rest), world_size, r) for r in range(world_size)) == dim0 * rest


@given(
    dims=st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=3), max_size=6),
    world_size=st.integers(1, 64),
)
def test_padded_numel_is_a_multiple_of_world_size_and_never_less(dims, world_size):
    padded = fsdp_padded_numel([tuple(d) for d in dims], world_size)
    numel = sum(math.prod(d) for d in dims)
    assert padded % world_size == 0
    assert numel <= padded


def test_unknown_strategy_names_the_valid_ones():
    with pytest.raises(ValueError, match="ddp, zero1, zero2, zero3, fsdp"):
        model_states_bytes_per_rank(10, 2, "zero4")
    with pytest.raises(ValueError, match="ddp, zero1, zero2, zero3, fsdp"):
        communication_bytes_per_step(10, 2, "pipeline")


@pytest.mark.parametrize(("strategy", "multiple"), [("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 3), ("fsdp", 3)])
def test_communication_volume_is_2_psi_or_3_psi(strategy, multiple):
    comm = communication_bytes_per_step(1000, 8, strategy)
    assert comm["elements"] == multiple * 1000
    assert comm["bytes"] == multiple * 4000
    assert communication_bytes_per_step(1000, 8, strategy, bytes_per_element=2)["bytes"] == multiple * 2000


def test_ring_wire_bytes_follow_the_ring_formulas():
    # 1000 fp32 elements over 4 ranks: a 4000 B buffer.
    assert communication_bytes_per_step(1000, 4, "ddp")["wire_bytes"] == 2 * 3 * 4000 // 4  # all-reduce
    assert communication_bytes_per_step(1000, 4, "zero2")["wire_bytes"] == 2 * 3000  # RS + AG
    zero3 = communication_bytes_per_step(1000, 4, "zero3")
    assert zero3["wire_bytes"] == 3 * 3000
    assert [(c["op"], c["phase"]) for c in zero3["collectives"]] == [
        ("all_gather", "forward"),
        ("all_gather", "backward"),
        ("reduce_scatter", "backward"),
    ]
    assert communication_bytes_per_step(1000, 1, "zero3")["wire_bytes"] == 0


def test_table1_prints_every_cell_exactly_as_the_paper_does():
    rows = {(r["params"], r["world_size"]): r for r in table1()}
    assert set(rows) == set(PAPER_TABLE1)
    for key, printed_cells in PAPER_TABLE1.items():
        row = rows[key]
        assert row["baseline"] == PAPER_BASELINE_GB[key[0]]
        for column, printed in zip(("Pos", "Pos+g", "Pos+g+p"), printed_cells, strict=True):
            assert paper_style(row[column]) == printed, (key, column, row[column], printed)


def test_table1_7_5b_at_64_ranks():
    row = next(r for r in table1() if r["params"] == 7_500_000_000 and r["world_size"] == 64)
    assert row == {
        "params": 7_500_000_000,
        "world_size": 64,
        "baseline": 120.0,
        "Pos": 31.40625,
        "Pos+g": 16.640625,
        "Pos+g+p": 1.875,
    }
    assert [paper_style(row[c]) for c in PAPER_STAGE_NAMES.values()] == ["120", "31.4", "16.6", "1.88"]


@pytest.mark.parametrize(
    ("gigabytes", "printed"),
    [(41.25, "41.3"), (7.5, "7.5"), (0.46875, "0.47"), (0.1171875, "0.12"), (2.0, "2"), (62.5, "62.5"), (896.0, "896"),
     (4011.71875, "4011"), (513.5, "513"), (257.75, "257")],
)
def test_paper_style_prints_like_table1(gigabytes, printed):
    assert paper_style(gigabytes) == printed


def test_every_strategy_is_covered():
    assert STRATEGIES == ("ddp", "zero1", "zero2", "zero3")  # ZeRO-stage order


@pytest.mark.parametrize(("numels", "expected"), [
    ([4096, 4096], 4096 + 2 * 4096),  # the first quotient is still held while the second tensor is stepped
    ([4096, 128, 4096], 128 + 2 * 4096),
    ([128, 4096, 4096, 32], 4096 + 2 * 4096),
    ([1024, 16, 4096], 16 + 2 * 4096),
    ([7], 2 * 7),
])
def test_adam_step_temporaries_are_what_torchs_adam_holds_at_once(numels, expected):
    # Counted on torch's own Adam (foreach=False, as the engine builds it): every tensor an op returns on
    # new memory is live until its last reference goes; in-place ops return memory already held.
    import weakref

    import torch
    from torch.overrides import TorchFunctionMode

    params = [torch.nn.Parameter(torch.ones(n)) for n in numels]
    optimizer = torch.optim.Adam(params, foreach=False)
    for parameter in params:
        parameter.grad = torch.ones_like(parameter)
    optimizer.step()  # makes Adam's state: the next step allocates its temporaries only
    held = {t.data_ptr() for t in params} | {t.data_ptr() for s in optimizer.state.values() for t in s.values()}
    held |= {p.grad.data_ptr() for p in params}

    class LiveElements(TorchFunctionMode):
        live = peak = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.numel() and out.data_ptr() not in held:
                held.add(out.data_ptr())
                self.live += out.numel()
                self.peak = max(self.peak, self.live)
                weakref.finalize(out, self._freed, out.data_ptr(), out.numel())
            return out

        def _freed(self, pointer, numel):
            held.discard(pointer)
            self.live -= numel

    counter = LiveElements()
    with counter:
        optimizer.step()
    assert counter.peak == expected
    assert adam_step_temporaries(numels) == expected


def test_mixed_precision_communication_counts_each_collective_in_its_own_dtype():
    # PyTorch's mixed precision: bf16 all-gathers (2 B), fp32 reduce-scatters (4 B); Ψ = 1000 at N = 4.
    zero3 = communication_bytes_per_step(1000, 4, "zero3", gather_bytes_per_element=2, reduce_bytes_per_element=4)
    assert [c["bytes"] for c in zero3["collectives"]] == [2000, 2000, 4000]
    assert zero3["bytes"] == 8000 and zero3["wire_bytes"] == 1500 + 1500 + 3000
    # The paper's accounting counts DDP's all-reduce twice: 2Ψ elements, 8000 B in fp32.
    assert communication_bytes_per_step(1000, 4, "ddp")["bytes"] == 8000
    assert communication_bytes_per_step(1000, 4, "ddp", bytes_per_element=2)["bytes"] == 4000


def test_zero1_partition_is_pytorchs_greedy_whole_tensor_rule():
    # Largest first, each to the emptiest rank (the lowest on a tie): 9 -> r0, 5 -> r1, 4 -> r1, 3 -> r0 ...
    assert zero1_partition([3, 9, 4, 5, 1], 2) == [9 + 3, 5 + 4 + 1]
    # One tensor bigger than Ψ/N sets the fullest rank, whatever the rest do.
    assert zero1_partition([100, 10, 10, 10, 10], 4) == [100, 20, 10, 10]
    with pytest.raises(ValueError):
        zero1_partition([1], 0)
    # The same placement, tensor by tensor in the order each rank is given them (rank 2 of 3 is given none).
    assert zero1_placement([3, 9, 4, 5, 1], 2) == [[9, 3], [5, 4, 1]]
    assert zero1_placement([7, 2], 3) == [[7], [2], []]
