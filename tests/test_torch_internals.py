"""Every private torch name the engine uses resolves in this torch, and a missing one fails loudly."""

from __future__ import annotations

import pytest
import torch

from sharding_lab.engine import _torch_internals as internals


@pytest.mark.parametrize("name", list(internals.ACCESSORS))
def test_each_accessor_resolves_in_this_torch(name):
    assert internals.ACCESSORS[name]() is not None


def test_this_torch_is_one_the_engine_has_run_on():
    from sharding_lab import torch_versions

    assert torch_versions.check(torch.__version__) is None
    assert torch_versions.OLDEST <= internals.torch_version() <= torch_versions.NEWEST


def test_a_missing_internal_names_the_torch_version_and_the_feature_lost(monkeypatch):
    from torch.nn.parallel import distributed

    monkeypatch.delattr(distributed, "_MixedPrecision")
    with pytest.raises(internals.TorchInternalMissing) as error:
        internals.ddp_mixed_precision(torch.bfloat16, torch.float32)
    message = str(error.value)
    assert torch.__version__ in message and "DDP with mixed precision" in message
    assert "_MixedPrecision" in message


def test_a_missing_attribute_on_an_object_fails_the_same_way():
    class NotAGroup:
        pass

    with pytest.raises(internals.TorchInternalMissing, match="NotAGroup._module_fqn"):
        internals.fsdp_group_module_name(NotAGroup())


def test_the_category_peak_tracker_keeps_each_categorys_maximum():
    tracker = internals.with_category_peaks(internals.mem_tracker_class())()
    with tracker:
        big = torch.empty(1024, 1024)  # 4 MiB, freed before the end
        del big
        torch.empty(16)
    peaks = tracker.__dict__["category_peaks"][torch.device("cpu")]
    assert max(peaks.values()) >= 4 * 1024 * 1024


def test_the_observing_tracker_hands_each_ops_bytes_and_context_to_observe():
    from types import SimpleNamespace

    cls = internals.observing_each_op(internals.fsdp_mem_tracker_class())
    tracker = object.__new__(cls)  # FSDPMemTracker's __init__ wants an FSDP module; the hook does not
    snapshot = {torch.device("cpu"): {"Total": 64}}
    tracker._curr_mem_snap, tracker._in_opt = snapshot, True
    tracker._mod_tracker = SimpleNamespace(parents={"Global", "GPT.blocks.3"}, is_bw=False)
    seen = []
    tracker.observe = lambda *args: seen.append(args)
    tracker._update_peak_stats(None)
    assert seen == [(snapshot, {"Global", "GPT.blocks.3"}, False, True)]


def test_cublas_workspaces_clear_on_a_cuda_build_and_are_named_missing_on_a_cpu_build():
    if torch.version.cuda:  # 2.11.0+cu130 in CI's second pass, as on the lent GPU machine
        internals.clear_cublas_workspaces()  # drops torch's cached workspaces: no GPU needed, none touched
        assert not torch.cuda.is_initialized()
    else:
        with pytest.raises(internals.TorchInternalMissing, match="_cuda_clearCublasWorkspaces") as error:
            internals.clear_cublas_workspaces()
        assert torch.__version__ in str(error.value)


def gradients_alive_after_each_reduce(ctx, tracker: str):
    """One real fp32 FSDP2 step of a 1-block GPT on this rank, under `tracker` ("none", "torch": torch's
    FSDPMemTracker, "ours": the engine's); for each FSDP2 reduce, which of the unsharded gradients it was
    handed are still alive (weakly referenced) once it returns. FSDP2 frees them all in it."""
    import contextlib
    import weakref

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    from sharding_lab.engine.model import GPT, GPTConfig

    model = GPT(GPTConfig(block_size=4, vocab_size=64, n_layer=1, n_head=1, n_embd=16))
    for block in model.blocks:
        fully_shard(block, mesh=ctx.mesh)
    fully_shard(model, mesh=ctx.mesh)
    alive, reduce = [], _fsdp_param_group.foreach_reduce

    def watched(fsdp_params, unsharded_grads, *args, **kwargs):
        held = [(p._param_fqn, weakref.ref(g)) for p, g in zip(fsdp_params, unsharded_grads, strict=True)]
        result = reduce(fsdp_params, unsharded_grads, *args, **kwargs)
        alive.append([name for name, grad in held if grad() is not None])
        return result

    _fsdp_param_group.foreach_reduce = watched
    classes = {"torch": internals.fsdp_mem_tracker_class(),
               "ours": internals.with_category_peaks(internals.fsdp_mem_tracker_class())}
    tokens = torch.randint(0, 64, (2, 4))
    with classes[tracker](mod=model) if tracker in classes else contextlib.nullcontext():
        model(tokens, tokens).backward()
    _fsdp_param_group.foreach_reduce = reduce
    return alive


@pytest.mark.slow
def test_the_engines_fsdp_tracker_holds_no_gradient_fsdp2_freed_and_torchs_holds_the_last():
    # torch's tracker wraps each post-backward in a loop whose variable keeps the group's last unsharded
    # gradient alive through the reduce that frees the rest: the tracked step held (and counted) it.
    from sharding_lab.engine.launch import run_ranks

    (untracked,) = run_ranks(gradients_alive_after_each_reduce, 1, "none", timeout_s=120)
    (ours,) = run_ranks(gradients_alive_after_each_reduce, 1, "ours", timeout_s=120)
    (torchs,) = run_ranks(gradients_alive_after_each_reduce, 1, "torch", timeout_s=120)
    assert untracked == ours == [[], []]  # the block's reduce, then the root's
    assert torchs == [["blocks.0.mlp.c_proj.bias"], ["lm_head.weight"]]
