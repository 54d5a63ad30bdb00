"""Read a Hugging Face ``config.json`` into the tensors of the model it describes.

Users know their model by its config, not by our shape fields. For each family we accept, the
tensor list below is the one transformers 5.x builds (checked against real tiny models in
tests/unit/test_advisor_shapes.py), so the parameter count equals ``sum(p.numel())``. Work is
bounded: one block's tensors are listed once and multiplied by the layer count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.core.limits import MAX_DIMENSION, MAX_LAYERS, MAX_TOKENS

FIELD = "model.hf_config"


@dataclass(frozen=True)
class Architecture:
    """What the memory model needs from a config: sizes, tensors and the kind of block."""

    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool
    experts: int  # 1 for a dense MLP
    experts_per_token: int
    first_tensors: tuple[int, ...]  # before the blocks: embeddings, learned positions
    block_tensors: tuple[int, ...]  # one block, in registration order
    last_tensors: tuple[int, ...]  # after the blocks: final norm, untied head


def _int(
    config: dict[str, Any], *names: str, default: int | None = None, most: int = MAX_DIMENSION
) -> int:
    """A positive size, no larger than the shape fields allow (``most``)."""
    for name in names:
        value = config.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{FIELD}.{name} must be a positive integer, not {value!r}")
            if value > most:
                raise ValueError(f"{FIELD}.{name} ({value}) is over the limit of {most}")
            return value
    if default is None:
        raise ValueError(f"{FIELD}.{names[0]} is missing")
    return default


def _bool(config: dict[str, Any], name: str, default: bool) -> bool:
    value = config.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"{FIELD}.{name} must be true or false, not {value!r}")
    return value


def _attention(h: int, heads: int, kv: int, head_dim: int, bias: bool, out_bias: bool) -> list[int]:
    q, kv_dim = heads * head_dim, kv * head_dim
    tensors = [h * q, *([q] if bias else [])]
    tensors += [h * kv_dim, *([kv_dim] if bias else [])] * 2
    return [*tensors, q * h, *([h] if out_bias else [])]


def _gated_mlp(h: int, f: int, bias: bool) -> list[int]:
    one = [h * f, *([f] if bias else [])]
    return [*one, *one, f * h, *([h] if bias else [])]


def _llama_like(c: dict[str, Any], family: str) -> Architecture:
    h, layers = _int(c, "hidden_size"), _int(c, "num_hidden_layers", most=MAX_LAYERS)
    heads = _int(c, "num_attention_heads")
    kv = _int(c, "num_key_value_heads", default=heads)
    head_dim = _int(c, "head_dim", default=256 if family == "gemma" else h // heads)
    f, vocab = _int(c, "intermediate_size"), _int(c, "vocab_size", most=MAX_TOKENS)
    tied = _bool(c, "tie_word_embeddings", family == "gemma")
    qkv_bias = family == "qwen2" or _bool(c, "attention_bias", False)
    out_bias = family != "qwen2" and _bool(c, "attention_bias", False)
    mlp_bias = family == "llama" and _bool(c, "mlp_bias", False)
    experts = _int(c, "num_local_experts", default=8) if family == "mixtral" else 1
    top_k = _int(c, "num_experts_per_tok", default=2) if family == "mixtral" else 1
    attention = _attention(h, heads, kv, head_dim, qkv_bias, out_bias)
    if family == "phi3":  # fused qkv_proj and gate_up_proj
        attention = [h * (heads + 2 * kv) * head_dim, heads * head_dim * h]
        mlp = [2 * f * h, f * h]
    elif family == "mixtral":  # router, then every expert's gate_up and down in two 3-D tensors
        mlp = [experts * h, experts * 2 * f * h, experts * h * f]
    else:
        mlp = _gated_mlp(h, f, mlp_bias)
    return Architecture(
        family, h, layers, heads, kv, head_dim, f, vocab, tied, True, experts, top_k,
        first_tensors=(vocab * h,),
        block_tensors=(*attention, *mlp, h, h),
        last_tensors=(h, *(() if tied else (vocab * h,))),
    )  # fmt: skip


def _gpt2(c: dict[str, Any]) -> Architecture:
    h = _int(c, "n_embd", "hidden_size")
    layers = _int(c, "n_layer", "num_hidden_layers", most=MAX_LAYERS)
    heads = _int(c, "n_head", "num_attention_heads")
    f, vocab = _int(c, "n_inner", default=4 * h), _int(c, "vocab_size", most=MAX_TOKENS)
    positions = _int(c, "n_positions", "max_position_embeddings", most=MAX_TOKENS)
    tied = _bool(c, "tie_word_embeddings", True)
    block = (h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * f, f, f * h, h)
    return Architecture(
        "gpt2", h, layers, heads, heads, h // heads, f, vocab, tied, False, 1, 1,
        first_tensors=(vocab * h, positions * h),
        block_tensors=block,
        last_tensors=(h, h, *(() if tied else (vocab * h,))),
    )  # fmt: skip


def _gpt_neox(c: dict[str, Any]) -> Architecture:
    h, layers = _int(c, "hidden_size"), _int(c, "num_hidden_layers", most=MAX_LAYERS)
    heads = _int(c, "num_attention_heads")
    f, vocab = _int(c, "intermediate_size"), _int(c, "vocab_size", most=MAX_TOKENS)
    tied = _bool(c, "tie_word_embeddings", False)
    bias = _bool(c, "attention_bias", True)
    attention = (h * 3 * h, *((3 * h,) if bias else ()), h * h, *((h,) if bias else ()))
    block = (h, h, h, h, *attention, h * f, f, f * h, h)
    return Architecture(
        "gpt_neox", h, layers, heads, heads, h // heads, f, vocab, tied, False, 1, 1,
        first_tensors=(vocab * h,),
        block_tensors=block,
        last_tensors=(h, h, *(() if tied else (vocab * h,))),
    )  # fmt: skip


LLAMA_LIKE = ("llama", "mistral", "qwen2", "gemma", "phi3", "mixtral")
FAMILIES = (*LLAMA_LIKE, "gpt2", "gpt_neox")


def read_hf_config(config: dict[str, Any]) -> Architecture:
    """The architecture a config.json describes; ValueError naming the field when it cannot."""
    family = config.get("model_type")
    if family in LLAMA_LIKE:
        arch = _llama_like(config, str(family))
    elif family == "gpt2":
        arch = _gpt2(config)
    elif family == "gpt_neox":
        arch = _gpt_neox(config)
    else:
        raise ValueError(
            f"{FIELD}.model_type {family!r} is not a family the advisor knows "
            f"({', '.join(FAMILIES)}); give the shape fields instead"
        )
    if arch.head_dim == 0:  # more heads than hidden units: each head would be empty
        raise ValueError(
            f"{FIELD}.num_attention_heads ({arch.heads}) must not exceed "
            f"hidden_size ({arch.hidden})"
        )
    if arch.heads % arch.kv_heads:
        raise ValueError(
            f"{FIELD}.num_key_value_heads ({arch.kv_heads}) must divide "
            f"num_attention_heads ({arch.heads})"
        )
    return arch
