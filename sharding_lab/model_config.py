"""The GPT's shape: its config, the named sizes, and the parameter shapes they give, without torch.

`sharding_lab.engine.model` builds the modules from a `GPTConfig`; what the labs and the analytic
side need of a model (how many elements, how they split between the root FSDP unit and the blocks)
is read off `parameter_shapes`, which a test holds equal to the real model's parameters.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class GPTConfig:
    block_size: int = 1024  # longest sequence; sizes the position embedding
    vocab_size: int = 50304  # GPT-2's 50257 tokens, padded up to a multiple of 64 for efficiency
    n_layer: int = 12  # transformer blocks: one FSDP unit each
    n_head: int = 12  # attention heads; must divide n_embd
    n_embd: int = 768  # residual stream width
    bias: bool = True  # biases in Linear and LayerNorm, as in GPT-2
    tied: bool = False  # lm_head shares wte's weight, as in GPT-2; the named sizes are untied, as LLaMA
    # No dropout: the labs compare gradients across strategies, and dropout would make them differ.

    def to_dict(self) -> dict:
        return asdict(self)


# Named sizes. `tiny` keeps CPU tests to seconds; the rest are shapes for estimates and simulation.
SIZES: dict[str, GPTConfig] = {
    # 4 blocks so per-block effects (one all-gather per block) are visible; 60k parameters.
    "tiny": GPTConfig(block_size=32, vocab_size=128, n_layer=4, n_head=2, n_embd=32),
    # Still seconds on CPU ranks (1.03M parameters), but shaped like a real model: its untied embedding
    # and head are 25.5% of Ψ each and the root unit 51% (gpt2-small: 23.7% and 47.9%), so effects that
    # depend on one tensor outweighing Ψ/N, or on the root's share, are real here and not in `tiny`.
    "mini": GPTConfig(block_size=64, vocab_size=4096, n_layer=10, n_head=4, n_embd=64),
    "gpt2-small": GPTConfig(n_layer=12, n_head=12, n_embd=768),  # 124M as GPT-2 (tied), 163M untied
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),  # 406M untied
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),  # 838M untied
    "1b": GPTConfig(block_size=2048, n_layer=20, n_head=16, n_embd=2048),  # 1.2B
    # LLaMA's depths and widths; GPT's 4x MLP (not SwiGLU) makes these 6.9B and 65B parameters.
    "7b": GPTConfig(block_size=2048, n_layer=32, n_head=32, n_embd=4096),
    "70b": GPTConfig(block_size=2048, n_layer=80, n_head=64, n_embd=8192),
}


def size_label(name: str) -> str:
    """A named size as findings print it: gpt2-small says it is untied, since GPT-2's own 124M ties
    its head to the embedding and so has other shares of Ψ."""
    return "gpt2-small (untied, 163M)" if name == "gpt2-small" else name


def model_label(name: str, fields: dict) -> str:
    """A measured model as findings print it: its named size, and any field a run changed from it
    (a wider `mini` is not `mini`); an unknown name is printed as it is."""
    named = SIZES.get(name)
    changed = [f"{key}={value}" for key, value in fields.items() if named is not None and getattr(named, key, value) != value]
    return size_label(name) + (f" with {', '.join(changed)}" if changed else "")


def config_for(name: str, **overrides) -> GPTConfig:
    """The named size, with any field overridden (e.g. `config_for("tiny", n_layer=2)`)."""
    if name not in SIZES:
        raise ValueError(f"unknown model size {name!r}; choose one of {', '.join(SIZES)}")
    return replace(SIZES[name], **overrides)


def parameter_shapes(config: GPTConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter, in the model's order (nanoGPT's layout). A tied head is no
    parameter of its own: `wte.weight` serves both, as `named_parameters()` lists it once."""
    C, bias = config.n_embd, config.bias

    def linear(name: str, n_in: int, n_out: int) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"{name}.weight", (n_out, n_in))] + ([(f"{name}.bias", (n_out,))] if bias else [])

    def layer_norm(name: str) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"{name}.weight", (C,))] + ([(f"{name}.bias", (C,))] if bias else [])

    shapes = [("wte.weight", (config.vocab_size, C)), ("wpe.weight", (config.block_size, C))]
    for i in range(config.n_layer):
        block = f"blocks.{i}"
        shapes += layer_norm(f"{block}.ln_1")
        shapes += linear(f"{block}.attn.c_attn", C, 3 * C) + linear(f"{block}.attn.c_proj", C, C)
        shapes += layer_norm(f"{block}.ln_2")
        shapes += linear(f"{block}.mlp.c_fc", C, 4 * C) + linear(f"{block}.mlp.c_proj", 4 * C, C)
    shapes += layer_norm("ln_f") + ([] if config.tied else [("lm_head.weight", (config.vocab_size, C))])
    return shapes


def num_params(config: GPTConfig) -> int:
    """Ψ: every parameter element."""
    return sum(math.prod(shape) for _, shape in parameter_shapes(config))


def root_share(config: GPTConfig) -> float:
    """The share of Ψ outside the blocks: embeddings, final norm and head, the root FSDP unit."""
    root = sum(math.prod(shape) for name, shape in parameter_shapes(config) if not name.startswith("blocks."))
    return root / num_params(config)
