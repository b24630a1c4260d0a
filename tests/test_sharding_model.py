"""The GPT: named sizes, meta-device construction, initialisation, and no distributed code inside."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sharding_lab.engine import model as model_module
from sharding_lab.engine.model import GPT, SIZES, GPTConfig, config_for
from sharding_lab.model_config import model_label, parameter_shapes


def gpt_params(c: GPTConfig) -> int:
    """Parameters by hand: embeddings, 12·d² + 13·d per block, final norm, untied head."""
    d = c.n_embd
    per_block = 12 * d * d + 13 * d
    return c.vocab_size * d + c.block_size * d + c.n_layer * per_block + 2 * d + c.vocab_size * d


@pytest.mark.parametrize("name", list(SIZES))
def test_every_size_builds_on_meta_with_the_expected_parameter_count(name):
    with torch.device("meta"):
        model = GPT(config_for(name))
    assert model.num_params() == gpt_params(SIZES[name])
    assert len(model.blocks) == SIZES[name].n_layer
    assert all(p.is_meta for p in model.parameters())


def test_sizes_span_tiny_to_70b():
    assert gpt_params(SIZES["tiny"]) < 100_000
    assert 6.5e9 < gpt_params(SIZES["7b"]) < 7.5e9
    assert 6e10 < gpt_params(SIZES["70b"]) < 7.5e10


def test_unknown_size_names_the_valid_ones():
    with pytest.raises(ValueError, match="tiny, mini, gpt2-small"):
        config_for("huge")
    assert config_for("tiny", n_layer=2).n_layer == 2


def test_a_model_label_names_the_size_and_only_the_fields_a_run_changed():
    mini = config_for("mini").to_dict()
    assert model_label("mini", mini) == "mini"
    assert model_label("mini", {**mini, "n_embd": 256}) == "mini with n_embd=256"
    assert model_label("tiny", {**config_for("tiny").to_dict(), "n_layer": 2, "tied": True}) == "tiny with n_layer=2, tied=True"
    assert model_label("gpt2-small", config_for("gpt2-small").to_dict()) == "gpt2-small (untied, 163M)"
    assert model_label("custom", {"n_embd": 8}) == "custom"  # no named size to differ from


def test_a_tied_head_is_the_embeddings_own_weight():
    config = config_for("tiny", tied=True)
    model = GPT(config)
    assert model.lm_head.weight is model.wte.weight
    assert model.num_params() == gpt_params(config) - config.vocab_size * config.n_embd  # one V x C, not two
    assert "lm_head.weight" not in dict(model.named_parameters())
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == parameter_shapes(config)
    # Its gradient is the sum of the head's and the embedding's.
    model.init_weights()
    idx = torch.randint(0, 128, (2, 16))
    model(idx, idx).backward()
    head_only = GPT(config_for("tiny"))
    head_only.load_state_dict({**model.state_dict(), "lm_head.weight": model.wte.weight.detach().clone()})
    head_only(idx, idx).backward()
    summed = head_only.wte.weight.grad + head_only.lm_head.weight.grad
    assert torch.allclose(model.wte.weight.grad, summed, atol=1e-7)


def test_meta_model_materialises_and_initialises_like_gpt2():
    torch.manual_seed(0)
    with torch.device("meta"):
        model = GPT(config_for("tiny"))
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.equal(model.blocks[0].ln_1.weight, torch.ones(32))
    assert torch.equal(model.blocks[0].attn.c_attn.bias, torch.zeros(96))
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.1)
    # Residual projections are scaled down by depth.
    assert model.blocks[0].mlp.c_proj.weight.std().item() == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.15)


def test_forward_gives_logits_or_the_loss_and_trains():
    torch.manual_seed(0)
    model = GPT(config_for("tiny"))
    model.init_weights()
    idx = torch.randint(0, 128, (2, 16))
    assert model(idx).shape == (2, 16, 128)
    loss = model(idx, idx)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(128.0)).item(), rel=0.05)  # near uniform at init
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_the_model_file_has_no_distributed_code():
    source = Path(model_module.__file__).read_text()
    assert "torch.distributed" not in source and "fully_shard" not in source


@pytest.mark.parametrize("size", ["tiny", "gpt2-small", "1b"])
def test_the_torch_free_shapes_are_the_models_parameters(size):
    from sharding_lab.model_config import num_params, parameter_shapes

    with torch.device("meta"):
        model = GPT(config_for(size))
    assert parameter_shapes(model.config) == [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    assert num_params(model.config) == model.num_params()


def test_root_share_of_gpt2_small_is_its_untied_embeddings_and_head():
    from sharding_lab.model_config import root_share

    # 2 x 50304 x 768 (wte, lm_head) + 1024 x 768 (wpe) + 2 x 768 (ln_f) of 163,109,376 elements.
    assert root_share(config_for("gpt2-small")) == pytest.approx(78_054_912 / 163_109_376)
    assert root_share(config_for("tiny")) == pytest.approx((2 * 128 * 32 + 32 * 32 + 64) / 60_096)
