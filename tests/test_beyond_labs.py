"""The third deck's labs (sharding_lab/labs/beyond_*.py): each holds on a real CPU run at 2 ranks (4 for
HSDP and the scaling runs), and each check fails on a doctored measurement where its claim does not hold.

One module fixture measures every configuration these labs need (one launch per world size and
placement, under a minute on two cores); each negative control doctors a JSON copy of them. The rules
the labs derive from shapes (DDP's buckets, ZeroRedundancyOptimizer's and DeepSpeed's partitions,
DeepSpeed's persistence threshold) are checked against numbers worked out by hand.
"""

from __future__ import annotations

import copy
import json
import math
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable

import pytest

from sharding_lab.catalog import CATALOG
from sharding_lab.labs import LABS, evaluate
from sharding_lab.labs.beyond_comm_labs import (
    BUCKETS_MINI,
    BUCKETS_WIDE,
    bucket_sizes,
    hsdp_keys,
    ready_order_bytes,
    ring_key,
)
from sharding_lab.labs.beyond_memory_labs import (
    ACCUMULATED,
    CHECKPOINTED,
    MIXED,
    OFFLOADED,
    PLAIN,
    RankMemoryAtN,
    activation_key,
    check_activation_memory,
)
from sharding_lab.labs.beyond_partition_labs import (
    DEEPSPEED_PERSISTENCE_THRESHOLD,
    deepspeed_flat_partition,
    deepspeed_zero3_params_per_rank,
    greedy_owners,
    named_numels,
    small_share,
)
from sharding_lab.measurement import Measurement
from sharding_lab.model_config import config_for, parameter_shapes

WORLD_SIZE = 2
BEYOND_LABS = [info.id for info in CATALOG if all(q.startswith("beyond-") for q in info.questions)]


# --- the rules derived from shapes, by hand -------------------------------------------------------------


def _at(world_size: int, temporaries: int) -> RankMemoryAtN:
    states = 16 * 1_000_000 // world_size
    return RankMemoryAtN(world_size, states, True, 9_547_272, temporaries, states + 9_547_272 + temporaries)


def test_temporaries_may_read_the_n1_root_copies_but_not_shrink_beyond_them():
    # mini at N=1: the root's gradients copied into a reduce-scatter input and an output as large
    # (2 x 2,114,048 B) outweigh the loss's backward, 4 MiB at every N: 0.8% more than at N=2.
    n1, others = 2 * 2_114_048, 4 * 1024 * 1024
    assert check_activation_memory([_at(1, n1), _at(2, others), _at(4, others)]).holds
    shrunk = int(n1 * 0.98)
    verdict = check_activation_memory([_at(1, n1), _at(2, shrunk), _at(4, shrunk)])
    assert not verdict.holds
    assert f"NOT each rank's temporaries do not shrink as N grows, within 1.0% ({n1:,} / {shrunk:,} / {shrunk:,} B)" \
        in verdict.reasons


def test_the_beyond_labs_are_the_ten_the_deck_names():
    assert BEYOND_LABS == [
        "activation-memory-per-rank",
        "activation-checkpointing",
        "fsdp2-mixed-precision",
        "cpu-offload-traffic",
        "hsdp-two-collectives",
        "grad-accumulation-no-sync",
        "zero3-persistence-threshold",
        "ring-all-reduce",
        "ddp-gradient-buckets",
        "zero1-whole-tensors",
    ]
    assert set(BEYOND_LABS) <= set(LABS)
    assert set(DOCTORED) == set(BEYOND_LABS), "every lab of the deck has a negative control here"


def test_ddp_buckets_close_at_the_first_cap_then_the_cap():
    mib = 1024**2
    # 1 MiB closes the first bucket; later ones take gradients until they hold at least 25 MiB.
    assert bucket_sizes([mib, mib // 2, mib // 2]) == [mib, mib]
    assert bucket_sizes([mib // 2] * 3) == [mib, mib // 2]  # two halves reach 1 MiB: the first bucket closes
    assert bucket_sizes([600_000] * 3) == [1_200_000, 600_000]  # crossed by the second gradient
    assert bucket_sizes([30 * mib, mib]) == [30 * mib, mib]  # above the cap and first in its bucket: alone
    # above the cap with a bucket open: it joins that bucket and closes it, as torch's own
    # _compute_bucket_assignment_by_size([2, 10, 30 MiB], [1, 25 MiB]) gives [[0], [1, 2]]
    assert bucket_sizes([2 * mib, 10 * mib, 30 * mib]) == [2 * mib, 40 * mib]
    assert bucket_sizes([mib, 24 * mib, 2 * mib, mib]) == [mib, 26 * mib, mib]
    # mini: lm_head's 4096 x 64 fp32 gradient (exactly 1 MiB) comes first and fills the first bucket alone.
    order = ready_order_bytes(config_for("mini"))
    assert order[0] == 4096 * 64 * 4 == mib
    assert bucket_sizes(order) == [mib, 4 * 1_028_352 - mib]


def test_zero_redundancy_optimizer_assigns_whole_tensors_largest_first():
    owners = greedy_owners([("a", 5), ("b", 3), ("c", 3), ("d", 1)], 2)
    assert owners == [["a", "d"], ["b", "c"]]  # a -> 0, b -> 1 (emptiest), c -> 1 (3 < 5), d -> 0 (5 < 6)
    # DeepSpeed pads the flat buffer to a multiple of 2N elements and cuts N equal parts.
    assert deepspeed_flat_partition(10, 4) == [4, 4, 4, 4]  # 10 -> 16
    assert deepspeed_flat_partition(1_028_352, 8) == [128_544] * 8


def test_the_persistence_threshold_is_deepspeeds_default_and_splits_mini_as_worked_out():
    assert DEEPSPEED_PERSISTENCE_THRESHOLD == int(1e5)  # zero/config.py: pp_int(1e5)
    numels = [math.prod(shape) for _, shape in parameter_shapes(config_for("mini"))]
    large = [n for n in numels if n > 1e5]
    assert large == [4096 * 64, 4096 * 64]  # wte and lm_head; every block matrix is at most 64 x 256
    assert sum(numels) - sum(large) == 504_064
    # gpt2-small: only biases and LayerNorms (at most 3072 elements each) stay under 1e5.
    assert small_share("gpt2-small") < 0.001
    # A DeepSpeed rank at N=2: the 504,064 small elements whole, beside half of all 1,028,352 (every
    # mini tensor has an even number of elements), the small ones' slices included.
    assert deepspeed_zero3_params_per_rank(numels, 2) == 504_064 + 1_028_352 // 2
    assert deepspeed_zero3_params_per_rank([100_000, 100_001, 7], 4) == 100_007 + 25_000 + 25_001 + 2


# --- measured ------------------------------------------------------------------------------------------------


pytest_slow = pytest.mark.slow


@pytest.fixture(scope="module")
def measured() -> dict:
    from sharding_lab.engine.run_labs import measure_configs

    results, _ = measure_configs(
        [spec.config for lab_id in BEYOND_LABS for spec in LABS[lab_id].runs(WORLD_SIZE)]
    )
    return results


def lab_measurements(measured: dict, lab_id: str) -> dict[str, Measurement]:
    return {spec.key: measured[spec.config] for spec in LABS[lab_id].runs(WORLD_SIZE)}


def as_json(measurements: dict[str, Measurement]) -> dict[str, dict]:
    return {key: copy.deepcopy(m.to_json()) for key, m in measurements.items()}


def from_json(raw: dict[str, dict]) -> dict[str, Measurement]:
    return {key: Measurement.from_json(m) for key, m in raw.items()}


@pytest_slow
@pytest.mark.parametrize("lab_id", BEYOND_LABS)
def test_each_beyond_lab_holds_on_cpu_ranks(measured, lab_id):
    lab = LABS[lab_id]
    run = evaluate(lab, WORLD_SIZE, lab.runs(WORLD_SIZE), lab_measurements(measured, lab_id))
    assert run["holds"] is True, "\n".join(run["reasons"])
    assert len(run["reasons"]) >= 3 and all(any(ch.isdigit() for ch in r) for r in run["reasons"]), (
        "with numbers"
    )
    assert any(ch.isdigit() for ch in run["finding"])
    rows, columns = run["table"]["rows"], run["table"]["columns"]
    assert rows and all(len(row) == len(columns) for row in rows)
    assert run["charts"]
    for chart in run["charts"].values():
        assert ElementTree.fromstring(chart).tag.endswith("svg")
    json.dumps(run)


# --- negative controls: doctored measurements -------------------------------------------------------------


def _set_ranks(m: dict, field: str, value: Callable[[dict], int]) -> None:
    for rank in m["memory"]["per_rank"]:
        rank[field] = value(rank)


def _drop_collectives(m: dict, is_dropped: Callable[[dict], bool]) -> None:
    m["comm"]["collectives"] = [c for c in m["comm"]["collectives"] if not is_dropped(c)]
    m["comm"]["timeline"] = [
        e for e in m["comm"]["timeline"] if e["event"] != "collective" or not is_dropped(e)
    ]


def _halve_activations_at_2n(ms: dict) -> None:
    for rank in ms[activation_key(2 * WORLD_SIZE)]["memory"]["per_rank"]:
        rank["category_peaks"]["activations"] //= 2


def _no_recompute(ms: dict) -> None:
    # Each block's forward started once: the recompute in backward is gone.
    seen: set[str] = set()
    timeline = []
    for event in ms[CHECKPOINTED]["comm"]["timeline"]:
        if event["event"] == "forward_start" and event["module"].startswith("blocks."):
            if event["module"] in seen:
                continue
            seen.add(event["module"])
        timeline.append(event)
    ms[CHECKPOINTED]["comm"]["timeline"] = timeline


def _gathers_in_fp32(ms: dict) -> None:
    for c in ms[MIXED]["comm"]["collectives"]:
        if c["op"] == "all_gather":
            c["dtype"], c["bytes"] = "float32", 2 * c["bytes"]


def _no_backward_gathers(ms: dict) -> None:
    _drop_collectives(ms[OFFLOADED], lambda c: c["op"] == "all_gather" and c["phase"] == "backward")


def _hsdp_without_all_reduces(ms: dict) -> None:
    _drop_collectives(ms[hsdp_keys(WORLD_SIZE)[0]], lambda c: c["op"] == "all_reduce")


def _synced_every_micro_batch(ms: dict) -> None:
    m = ms[ACCUMULATED]
    m["comm"]["collectives"] += [c for c in m["comm"]["collectives"] if c["op"] == "reduce_scatter"] * 3


def _small_params_kept_whole(ms: dict) -> None:
    # As DeepSpeed would: every rank also holds the other half of each parameter under 1e5 elements.
    small = 504_064
    _set_ranks(ms["zero3, mini"], "params_bytes", lambda r: r["params_bytes"] + 4 * small // WORLD_SIZE)


def _two_all_reduces_per_step(ms: dict) -> None:
    m = ms[ring_key("ddp", WORLD_SIZE)]
    m["comm"]["collectives"] = m["comm"]["collectives"] * 2


def _one_bucket(ms: dict) -> None:
    m = ms[BUCKETS_WIDE]
    reduces = [c for c in m["comm"]["collectives"] if c["op"] == "all_reduce"]
    merged = {**reduces[0], "bytes": sum(c["bytes"] for c in reduces)}
    m["comm"]["collectives"] = [merged]


def _flat_split(ms: dict) -> None:
    # DeepSpeed's even split instead of whole tensors: rank 0 of 8 holds 1/8 of Adam's state.
    view = next(m for key, m in ms.items() if key not in ("zero1, mini",))
    view["memory"]["per_rank"][0]["optimizer_bytes"] = 8 * 128_544


# lab id -> a change to a copy of its measurements after which its claim does not hold.
DOCTORED: dict[str, Callable[[dict], None]] = {
    "activation-memory-per-rank": _halve_activations_at_2n,
    "activation-checkpointing": _no_recompute,
    "fsdp2-mixed-precision": _gathers_in_fp32,
    "cpu-offload-traffic": _no_backward_gathers,
    "hsdp-two-collectives": _hsdp_without_all_reduces,
    "grad-accumulation-no-sync": _synced_every_micro_batch,
    "zero3-persistence-threshold": _small_params_kept_whole,
    "ring-all-reduce": _two_all_reduces_per_step,
    "ddp-gradient-buckets": _one_bucket,
    "zero1-whole-tensors": _flat_split,
}


@pytest_slow
@pytest.mark.parametrize("lab_id", list(DOCTORED))
def test_each_beyond_check_fails_on_doctored_measurements(measured, lab_id):
    raw = as_json(lab_measurements(measured, lab_id))
    assert LABS[lab_id].check(from_json(raw)).holds is True, "holds before doctoring"
    DOCTORED[lab_id](raw)
    verdict = LABS[lab_id].check(from_json(raw))
    assert verdict.holds is False
    assert any(reason.startswith("NOT ") for reason in verdict.reasons)


@pytest_slow
def test_on_a_gpu_the_offload_check_reads_where_the_states_are(measured):
    # The CPU run's figures as a GPU run would report them: the plain run's states on the device.
    raw = as_json(lab_measurements(measured, "cpu-offload-traffic"))
    for m in raw.values():
        m["config"]["device"] = "cuda:0"
    for rank in raw[PLAIN]["memory"]["per_rank"]:
        rank["states_device"] = "cuda"
    assert LABS["cpu-offload-traffic"].check(from_json(raw)).holds is True
    # The offloaded run's states left on the device: offload did not happen.
    for rank in raw[OFFLOADED]["memory"]["per_rank"]:
        rank["states_device"] = "cuda"
    verdict = LABS["cpu-offload-traffic"].check(from_json(raw))
    assert verdict.holds is False and any("ranks (cuda)" in r and r.startswith("NOT ") for r in verdict.reasons)


# --- negative controls: the wrong configuration ---------------------------------------------------------------


def _swap(measured: dict, lab_id: str, key: str, other_key: str) -> dict[str, Measurement]:
    measurements = lab_measurements(measured, lab_id)
    return {**measurements, key: measurements[other_key]}


@pytest_slow
@pytest.mark.parametrize(
    ("lab_id", "key", "instead"),
    [
        # The checkpointed run was not checkpointed.
        ("activation-checkpointing", CHECKPOINTED, "zero3, mini"),
        # The mixed-precision run was fp32.
        ("fsdp2-mixed-precision", MIXED, "zero3"),
        # The offloaded run was not offloaded.
        ("cpu-offload-traffic", OFFLOADED, "zero3, mini"),
        # HSDP measured as full sharding over the same ranks.
        ("hsdp-two-collectives", hsdp_keys(WORLD_SIZE)[0], hsdp_keys(WORLD_SIZE)[1]),
        # The accumulating run took one micro-batch.
        ("grad-accumulation-no-sync", ACCUMULATED, "zero3"),
        # ZeRO-2 measured as DDP: no reduce-scatter, no all-gather.
        ("ring-all-reduce", ring_key("zero2", WORLD_SIZE), ring_key("ddp", WORLD_SIZE)),
        # The wider model measured as mini: no more all-reduces than mini's.
        ("ddp-gradient-buckets", BUCKETS_WIDE, BUCKETS_MINI),
    ],
)
def test_each_beyond_check_fails_on_the_wrong_configuration(measured, lab_id, key, instead):
    assert LABS[lab_id].check(_swap(measured, lab_id, key, instead)).holds is False


@pytest_slow
def test_the_whole_tensor_rule_is_what_the_mini_run_measured(measured):
    zero1 = lab_measurements(measured, "zero1-whole-tensors")["zero1, mini"]
    owners = greedy_owners(named_numels(zero1), WORLD_SIZE)
    numels = dict(named_numels(zero1))
    assert [8 * sum(numels[name] for name in names) for names in owners] == zero1.part_bytes("optimizer")
    assert "wte.weight" in owners[0] and "lm_head.weight" in owners[1]


@pytest_slow
def test_reduce_scattering_each_backward_holds_one_units_unsharded_gradient_beside_the_shards(measured):
    raw = as_json(lab_measurements(measured, "grad-accumulation-no-sync"))
    rank0 = raw["zero3"]["memory"]["per_rank"][0]
    gathered = {c["module"]: c["bytes"] for c in raw["zero3"]["comm"]["collectives"]
                if c["op"] == "all_gather" and c["phase"] == "forward"}
    # tiny's largest unit is a block (the root is lighter); its fp32 gradient is its parameters' bytes.
    largest = max(gathered.values())
    assert largest == gathered["blocks.0"] > gathered["root"]
    # Measured, to the byte: the most gradient bytes alive at one moment is the blocks' shards beside the
    # root's whole unsharded gradient, just before the root's reduce-scatter, the step's last (its
    # embedding's gradient arrives last). Each category's own maximum, added up, gave largest + every shard.
    root_shard = gathered["root"] // 2  # N = 2
    assert rank0["category_peaks"]["grads"] == rank0["grads_bytes"] - root_shard + gathered["root"] == 138_752
    assert rank0["category_peaks"]["grads"] < largest + rank0["grads_bytes"]
    rank0["category_peaks"]["grads"] += gathered["blocks.0"]  # a second unit's gradient kept as well
    verdict = LABS["grad-accumulation-no-sync"].check(from_json(raw))
    assert not verdict.holds
    assert any(r.startswith("NOT between micro-batches") and f"the largest unit's {largest:,} B" in r
               for r in verdict.reasons)


@pytest_slow
def test_accumulating_without_sync_holds_the_full_4psi_of_gradients_at_once(measured):
    # tiny: Ψ = 60,096, so every unit's unsharded fp32 gradient together is 4Ψ = 240,384 B; held between
    # micro-batches, and the most ever alive at once: each shard of the last backward replaces an unsharded
    # gradient. (Adding the unsharded and sharded gradients' own maxima had read 360,576 B.)
    raw = as_json(lab_measurements(measured, "grad-accumulation-no-sync"))
    assert [rank["category_peaks"]["grads"] for rank in raw[ACCUMULATED]["memory"]["per_rank"]] == [240_384] * WORLD_SIZE
    run = evaluate(LABS["grad-accumulation-no-sync"], WORLD_SIZE, LABS["grad-accumulation-no-sync"].runs(WORLD_SIZE),
                   from_json(raw))
    assert "the gradients peaked at 234.8 KiB (the full 4Ψ: every unit's unsharded gradient at once)" in run["finding"]


@pytest_slow
def test_the_mixed_precision_table_reads_each_bytes_per_parameter_off_the_run(measured):
    ms = lab_measurements(measured, "fsdp2-mixed-precision")
    raw = as_json(ms)[MIXED]
    padded = raw["config"]["padded_num_params"]
    forward_gathers = sum(c["bytes"] for c in raw["comm"]["collectives"] if c["op"] == "all_gather" and c["phase"] == "forward")
    scatters = sum(c["bytes"] for c in raw["comm"]["collectives"] if c["op"] == "reduce_scatter")
    run = evaluate(LABS["fsdp2-mixed-precision"], WORLD_SIZE, LABS["fsdp2-mixed-precision"].runs(WORLD_SIZE), ms)
    rows = {row[0]: row[1:] for row in run["table"]["rows"]}
    assert rows["gathered parameters for compute (transient)"][:2] == ["bfloat16", forward_gathers / padded] == ["bfloat16", 2.0]
    assert rows["reduce-scatter (on the wire)"][:2] == ["float32", scatters / padded] == ["float32", 4.0]
    # The shards' dtype is what their bytes per element say: 4 B a parameter, and Adam's two moments 8 B.
    assert rows["parameter shard (master weights)"][:2] == ["float32", 4.0]
    assert rows["Adam state (two moments)"][:2] == ["float32", 8.0]


@pytest_slow
def test_a_widened_model_is_named_with_its_width_where_the_finding_holds(measured):
    lab = LABS["ddp-gradient-buckets"]
    run = evaluate(lab, WORLD_SIZE, lab.runs(WORLD_SIZE), lab_measurements(measured, "ddp-gradient-buckets"))
    wide_params = sum(math.prod(shape) for _, shape in parameter_shapes(config_for("mini", n_embd=256)))
    assert f"the mini with n_embd=256 model ({wide_params:,} parameters)" in run["finding"]
    assert f"the mini model ({sum(math.prod(s) for _, s in parameter_shapes(config_for('mini'))):,} parameters)" in run["finding"]
    assert run["config"]["size"] == "mini and mini with n_embd=256"
