"""DeepSpeed's published model-state estimators, reproduced (not imported: no deepspeed dependency).

A reproduction of the formulas in deepspeedai/DeepSpeed:
- `deepspeed/runtime/zero/stage3.py`: `estimate_zero3_model_states_mem_needs` (and `model_to_params`,
  which takes the largest layer as the module with the most parameters of its own),
- `deepspeed/runtime/zero/stage_1_and_2.py`: `estimate_zero2_model_states_mem_needs`,
read at commit edaa7221267243c7be7fb49c5d5f5c4fb97b4641. Their `..._all_cold` functions print these
figures divided by 2**30 with the label "GB" (so GiB). They count model states of mixed-precision Adam by
DeepSpeed's own byte counts (2 + 18/N per parameter at stage 2, with an fp32 gradient partition; 18/N at
stage 3), whatever the precision of the plan they are shown beside, plus, at
stage 3, a buffer of the largest layer: no activations, no temporaries, no batch or sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SOURCE = "deepspeedai/DeepSpeed deepspeed/runtime/zero/stage3.py and stage_1_and_2.py (reproduced formula)"
# Its byte counts are for DeepSpeed's mixed-precision Adam, whatever precision the plan beside it is for:
# beside an fp32 plan the gap is not all activations.
ASSUMES = "mixed-precision Adam (fp16 or bf16 parameters and gradients, fp32 master parameters and Adam state)"
LEAVES_OUT = "activations, temporaries, communication buckets and the CUDA context"


def estimate_zero3_model_states_mem_needs(
    total_params: int,
    largest_layer_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int, int]:
    """(cpu_mem, gpu_mem, largest_layer_memory) in bytes, as DeepSpeed's function returns them."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def estimate_zero2_model_states_mem_needs(
    total_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int]:
    """(cpu_mem, gpu_mem) in bytes: 2Ψ of fp16 parameters on every GPU, plus 18Ψ/N (2 fp16 grads, 4 fp32
    grads, 4 fp32 params, 8 Adam) unless offloaded."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def largest_layer_params(parameter_shapes: Sequence[tuple[str, tuple[int, ...]]]) -> int:
    """DeepSpeed's `model_to_params`: the module with the most parameters of its own (not recursing), read
    off parameter names: `blocks.0.mlp.c_fc.weight` and `.bias` belong to module `blocks.0.mlp.c_fc`."""
    per_module: dict[str, int] = {}
    for name, shape in parameter_shapes:
        module = name.rpartition(".")[0]
        per_module[module] = per_module.get(module, 0) + math.prod(shape)
    return max(per_module.values(), default=0)


@dataclass(frozen=True)
class DeepSpeedEstimate:
    """DeepSpeed's per-GPU figure for one configuration, and what it is."""

    stage: int  # 2 or 3
    gpu_bytes: int
    cpu_bytes: int
    options: str  # the row of DeepSpeed's printed table it is
    counts: str  # what the GPU figure counts, for this stage and offload
    # DeepSpeed's host figure is per node: this one is for a single node holding all N GPUs.
    cpu_bytes_means: str = "host memory of one node holding all N GPUs (DeepSpeed's formula is per node)"
    assumes: str = ASSUMES
    leaves_out: str = LEAVES_OUT
    source: str = SOURCE


# What each formula's GPU figure counts, by (stage, cpu_offload): offload drops the N-split states from it.
_COUNTS = {
    (2, False): "model states by DeepSpeed's byte counts, 2 + 18/N B per parameter",
    (2, True): "2 B per parameter, the fp16 parameters every GPU keeps (the rest offloaded to host memory)",
    (3, False): "model states by DeepSpeed's byte counts, 18/N B per parameter, and 4 B per parameter of the largest layer",
    (3, True): ("only a buffer of the largest layer, 4 B per parameter of it (parameters and optimizer states "
                "offloaded to host memory)"),
}


def deepspeed_estimate(
    stage: int, total_params: int, largest_layer: int, gpus: int, *, cpu_offload: bool = False,
    gpus_are: str = "all the GPUs",
) -> DeepSpeedEstimate:
    """The row of DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs_all_cold` table for `gpus` GPUs on
    one node: without offload, or (cpu_offload) with the optimizer and, for stage 3, the parameters offloaded.
    `gpus_are` says which GPUs those N are, for the description."""
    if stage not in (2, 3):
        raise ValueError(f"DeepSpeed publishes estimators for ZeRO stages 2 and 3, not {stage}")
    counts = f"{_COUNTS[stage, cpu_offload]}; N = {gpus}, {gpus_are}"
    if stage == 3:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            total_params, largest_layer, num_gpus_per_node=gpus, cpu_offload=cpu_offload,
            cpu_offload_params=cpu_offload,
        )
        options = "offload_param=cpu, offload_optimizer=cpu, zero_init=1" if cpu_offload else (
            "offload_param=none, offload_optimizer=none, zero_init=1")
        return DeepSpeedEstimate(3, gpu, cpu, options, counts)
    cpu, gpu = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=gpus, cpu_offload=cpu_offload)
    return DeepSpeedEstimate(2, gpu, cpu, f"offload_optimizer={'cpu' if cpu_offload else 'none'}", counts)
