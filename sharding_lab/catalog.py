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
        "With explicit prefetching, FSDP2 issues the next block's all-gather before the current block's compute ends, at the cost of a higher peak; by FSDP2's design, on a GPU its all-gather stream overlaps forward all-gathers with compute even without it (not measured on CPU).",
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
        "FSDP cuts per-rank memory but moves more bytes per step than DDP, with all-gathers DDP never needs: up to 1.5x in fp32 (less the root unit it keeps gathered), about fp32 DDP's bytes with bf16 all-gathers and fp32 reduce-scatters.",
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
    # The third deck (bank/beyond.yaml): what the two quizzes leave out.
    LabInfo(
        "activation-memory-per-rank",
        "Activations and temporaries as ranks are added",
        "As FSDP adds ranks, each rank's model states fall as 1/N while its activations and temporaries stay the same, so they become most of the peak.",
        ("beyond-activations-do-not-shrink",),
    ),
    LabInfo(
        "activation-checkpointing",
        "Activation checkpointing: memory against recomputation",
        "Checkpointing each block keeps only its input for backward and runs its forward again there: activation memory falls and every block's forward runs twice per step.",
        ("beyond-activation-checkpointing",),
    ),
    LabInfo(
        "fsdp2-mixed-precision",
        "FSDP2's mixed precision: which copy has which dtype",
        "FSDP2's mixed precision keeps fp32 parameter shards, gradients and Adam state (4/4/8 bytes per parameter, not the paper's 2/2/12), all-gathers bf16 copies for compute and, with reduce_dtype=fp32 as configured here, reduce-scatters fp32 gradients.",
        ("beyond-fsdp2-mixed-precision",),
    ),
    LabInfo(
        "cpu-offload-traffic",
        "CPU offload: what moves between host and device",
        "FSDP2's CPU offload keeps parameter shards, gradients and Adam state on the host, copies each rank's parameter shard to the device at every all-gather and its gradient shard back at every reduce-scatter, and runs the optimizer on the host.",
        ("beyond-cpu-offload",),
    ),
    LabInfo(
        "hsdp-two-collectives",
        "HSDP: reduce-scatter within a group, all-reduce across replicas",
        "HSDP all-gathers and reduce-scatters within a shard group and all-reduces the gradient shards across replicas; each rank holds 1/shards of the model states, more than full sharding's 1/N.",
        ("beyond-hsdp",),
    ),
    LabInfo(
        "grad-accumulation-no-sync",
        "Gradient accumulation under FSDP without syncing",
        "Accumulating without syncing makes FSDP skip the reduce-scatter on all but the last micro-batch: one reduce-scatter per optimizer step instead of one per micro-batch, while every rank holds unsharded gradients in between.",
        ("beyond-grad-accumulation",),
    ),
    LabInfo(
        "zero3-persistence-threshold",
        "Small parameters: DeepSpeed's persistence threshold against FSDP2",
        "FSDP2 shards and all-gathers every parameter, however small; DeepSpeed's ZeRO-3 keeps parameters of at most stage3_param_persistence_threshold (1e5) elements whole on every rank.",
        ("beyond-persistence-threshold",),
    ),
    LabInfo(
        "ring-all-reduce",
        "A ring all-reduce is a reduce-scatter plus an all-gather",
        "DDP's all-reduce and ZeRO-2's reduce-scatter plus all-gather carry the same logical bytes per step, so by the ring formulas each rank sends 2(N-1)/N of the gradient bytes for either.",
        ("beyond-ring-all-reduce",),
    ),
    LabInfo(
        "ddp-gradient-buckets",
        "DDP's gradient buckets",
        "DDP all-reduces gradients bucket by bucket in the order backward produces them: the first bucket closes at 1 MiB, later ones at bucket_cap_mb (25 MiB), so the number of all-reduces follows the model's size and shapes.",
        ("beyond-ddp-buckets",),
    ),
    LabInfo(
        "zero1-whole-tensors",
        "ZeroRedundancyOptimizer's whole tensors against DeepSpeed's flat partition",
        "PyTorch's ZeroRedundancyOptimizer gives each rank whole tensors, largest first to the emptiest rank; DeepSpeed's ZeRO-1 splits one flat buffer into N equal parts.",
        ("beyond-zero1-whole-tensors",),
    ),
)

LABS_BY_ID: dict[str, LabInfo] = {lab.id: lab for lab in CATALOG}


def lab_info(lab_id: str) -> LabInfo | None:
    return LABS_BY_ID.get(lab_id)
