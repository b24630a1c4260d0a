"""What each lab is, as plain data: id, title, claim and the questions it backs.

Importing this module never imports torch, so the web app and the Anki export can show a
card's lab cheaply. The runnable side of each lab (what it runs, its check and its report)
lives in `sharding_lab.labs`, keyed by the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LabInfo:
    id: str  # the slug the bank's `lab` field uses
    title: str
    claim: str  # the correct answer's claim, in one sentence, as the lab checks it
    questions: tuple[str, ...]  # ids of the bank questions this lab backs

    @property
    def command(self) -> str:
        return f"sharding-lab run {self.id}"


CATALOG: tuple[LabInfo, ...] = (
    LabInfo(
        "what-fsdp-shards",
        "What FSDP shards that DDP replicates",
        "Under DDP every rank holds full parameters, gradients and optimizer state; under FSDP each rank holds about 1/N of each.",
        ("fsdp-what-is-sharded",),
    ),
    LabInfo(
        "allgather-before-layer",
        "An all-gather before each block's forward",
        "In forward, FSDP all-gathers each block's full parameters just before that block runs.",
        ("fsdp-all-gather-before-layer",),
    ),
    LabInfo(
        "reshard-after-forward",
        "Freeing gathered weights after each block",
        "With reshard-after-forward, only one or two blocks' full parameters are unsharded at a time; without it, every block's stay until backward; between steps only the shard remains.",
        ("fsdp-free-gathered-weights", "zero-gather-then-discard"),
    ),
    LabInfo(
        "fsdp-is-zero3",
        "FSDP measured against the ZeRO stage-3 formula",
        "FSDP's measured per-rank model-state bytes equal ZeRO stage 3's prediction, and with reshard-after-forward off they match stage 2's sharding of gradients and optimizer state.",
        ("fsdp-inspired-by-zero", "zero-fsdp-implements"),
    ),
    LabInfo(
        "prefetch-overlap",
        "Prefetching the next block's parameters: issue order and its memory cost",
        "With explicit prefetching, FSDP2 issues the next block's all-gather before the current block's compute ends, at the cost of a higher peak; on a GPU its all-gather stream overlaps forward all-gathers with compute even without it.",
        ("fsdp-prefetch-overlap",),
    ),
    LabInfo(
        "reduce-scatter-backward",
        "Reduce-scatter of gradients in backward",
        "In backward, FSDP reduce-scatters each block's gradients so every rank keeps only its 1/N slice.",
        ("fsdp-reduce-scatter-gradients",),
    ),
    LabInfo(
        "persistent-memory-scaling",
        "Persistent memory per rank as ranks are added",
        "Persistent per-rank model-state memory falls as 1/N under FSDP and stays flat under DDP; each rank's activations do not shrink with N, so the peak falls slower.",
        ("fsdp-persistent-memory",),
    ),
    LabInfo(
        "memory-communication-tradeoff",
        "Memory saved against communication added",
        "FSDP cuts per-rank memory but moves more bytes per step than DDP, with all-gathers DDP never needs: up to 1.5x in fp32 (less the root unit it keeps gathered), about DDP's bytes with bf16 all-gathers.",
        ("fsdp-memory-communication-tradeoff", "zero-practical-cost"),
    ),
    LabInfo(
        "zero-stages-model-states",
        "Model states per rank across ZeRO stages",
        "Each ZeRO stage removes one more replicated model state: optimizer state (1), gradients (2), parameters (3).",
        ("zero-redundancy-removed",),
    ),
    LabInfo(
        "adam-optimizer-state",
        "Adam's optimizer state against the model",
        "Adam keeps two fp32 values per parameter, 2x the fp32 parameter bytes; with PyTorch's mixed precision a rank still keeps 4/4/8 bytes per parameter (fp32 shards as master weights), where the ZeRO paper counts 2/2/12.",
        ("zero-adam-state",),
    ),
    LabInfo(
        "stage3-shards-params",
        "Stage 3 shards the parameters",
        "From forward to backward, parameter bytes per rank are full under stage 2 and about 1/N under stage 3, which gathers each block only while it runs.",
        ("zero-stage3-parameters",),
    ),
    LabInfo(
        "communication-volume",
        "Communication volume per step by stage",
        "DDP and ZeRO stages 1-2 move about 2x the model bytes per step per rank and stage 3 about 3x; PyTorch's stage 1 (an all-reduce plus a broadcast) moves 3x.",
        ("zero-communication-cost",),
    ),
    LabInfo(
        "stage1-optimizer-only",
        "Stage 1 shards only the optimizer state",
        "Under ZeRO stage 1 each rank keeps optimizer state for only the parameters it owns while parameters and gradients stay full; PyTorch assigns whole tensors, so a rank's share is 1/N only while every tensor is small beside Ψ/N.",
        ("zero-stage1-optimizer",),
    ),
)

LABS_BY_ID: dict[str, LabInfo] = {lab.id: lab for lab in CATALOG}


def lab_info(lab_id: str) -> LabInfo | None:
    return LABS_BY_ID.get(lab_id)
