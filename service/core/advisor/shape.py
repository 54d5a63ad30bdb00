"""The model's shape as the memory model needs it: sizes of its tensors and of its layers.

A spec gives a Hugging Face config (read by ``hf_config``), a bare shape (hidden size, layers,
heads, vocabulary, and ``mlp: gated`` for a Llama-style block), or only a parameter count. From a
count alone we infer a shape (hidden/layers ~ 128, 128-wide heads, a 32k vocabulary) and say so,
because activations depend on the shape, not on the count. Tensors are kept as one block's list
times the layer count, so no work grows with the model's size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from service.core.advisor.hf_config import Architecture, read_hf_config
from service.core.spec import AttentionImpl, MlpKind, ModelSpec

DEFAULT_VOCAB = 32_000
HIDDEN_PER_LAYER = 128  # GPT-3 / LLaMA family: 4096 hidden over 32 layers
HEAD_DIM = 128
GATED_MULTIPLE = 256  # Llama rounds its 8h/3 MLP width up to a multiple of 256


@dataclass(frozen=True)
class ModelShape:
    """A decoder transformer, resolved to concrete numbers and its parameter tensors."""

    parameters: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    flash_attention: bool
    inferred: bool
    gated_mlp: bool
    head_dim: int
    first_tensors: tuple[int, ...]  # embeddings (and learned positions), before the blocks
    block_tensors: tuple[int, ...]  # one block's tensors, repeated ``layers`` times
    last_tensors: tuple[int, ...]  # final norm and an untied head
    experts: int = 1  # MoE experts per block (1: dense)
    experts_per_token: int = 1

    @property
    def layer_params(self) -> int:
        return sum(self.block_tensors)

    @property
    def counted_parameters(self) -> int:
        """The exact count of the tensors, whatever ``parameters`` was given as."""
        outer = sum(self.first_tensors) + sum(self.last_tensors)
        return outer + self.layers * self.layer_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def tensor_counts(self) -> tuple[tuple[int, int], ...]:
        """(size, how many) for every parameter tensor, as DeepSpeed partitions them."""
        outer = ((n, 1) for n in (*self.first_tensors, *self.last_tensors))
        return (*outer, *((n, self.layers) for n in self.block_tensors))

    @cached_property
    def largest_tensor(self) -> int:
        return max(self.first_tensors + self.block_tensors + self.last_tensors)

    @property
    def largest_module_params(self) -> int:
        """The most parameters one module gathers at once under ZeRO-3."""
        return self.largest_tensor

    @property
    def attention_width(self) -> int:
        """Query width (heads x head size); Gemma's differs from the hidden size."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


def block_tensors(
    hidden: int, heads: int, kv_heads: int, ffn: int, *, gated: bool
) -> tuple[int, ...]:
    """One block of a bare shape: Llama-style (no biases, RMSNorm) when gated, else GPT-style
    (fused qkv with bias, GELU MLP with biases, two LayerNorms with bias)."""
    h, kv_dim = hidden, kv_heads * (hidden // heads)
    if gated:
        return (h * h, h * kv_dim, h * kv_dim, h * h, h * ffn, h * ffn, ffn * h, h, h)
    qkv = h * (h + 2 * kv_dim)
    return (qkv, h + 2 * kv_dim, h * h, h, h * ffn, ffn, ffn * h, h, h, h, h, h)


def count_parameters(
    hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, tied: bool,
    gated: bool = False,
) -> int:  # fmt: skip
    """Parameters of a bare shape, counted tensor by tensor."""
    shape = bare_shape(0, hidden, layers, heads, kv_heads, ffn, vocab, tied, gated)
    return shape.counted_parameters


def bare_shape(
    parameters: int, hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int,
    tied: bool, gated: bool, *, flash: bool = True, inferred: bool = False,
) -> ModelShape:  # fmt: skip
    final_norm = (hidden,) if gated else (hidden, hidden)
    shape = ModelShape(
        parameters=parameters,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        vocab=vocab,
        tied_embeddings=tied,
        flash_attention=flash,
        inferred=inferred,
        gated_mlp=gated,
        head_dim=hidden // heads,
        first_tensors=(vocab * hidden,),
        block_tensors=block_tensors(hidden, heads, kv_heads, ffn, gated=gated),
        last_tensors=final_norm + (() if tied else (vocab * hidden,)),
    )
    return shape if parameters else _with_count(shape, shape.counted_parameters)


def _with_count(shape: ModelShape, parameters: int) -> ModelShape:
    return replace(shape, parameters=parameters)


def from_architecture(arch: Architecture, model: ModelSpec) -> ModelShape:
    shape = ModelShape(
        parameters=0,
        hidden=arch.hidden,
        layers=arch.layers,
        heads=arch.heads,
        kv_heads=arch.kv_heads,
        ffn=arch.ffn,
        vocab=arch.vocab,
        tied_embeddings=arch.tied_embeddings,
        flash_attention=model.attention == AttentionImpl.FLASH,
        inferred=False,
        gated_mlp=arch.gated_mlp,
        head_dim=arch.head_dim,
        first_tensors=arch.first_tensors,
        block_tensors=arch.block_tensors,
        last_tensors=arch.last_tensors,
        experts=arch.experts,
        experts_per_token=arch.experts_per_token,
    )
    return _with_count(shape, model.parameters or shape.counted_parameters)


def resolve_shape(model: ModelSpec) -> ModelShape:
    """The shape to plan with; a given ``parameters`` overrides the count derived from a shape."""
    if model.hf_config is not None:
        return from_architecture(read_hf_config(model.hf_config), model)
    if model.hidden_size and model.num_layers and model.num_heads and model.vocab_size:
        return _from_shape(model)
    if model.parameters is None:  # ModelSpec's validator makes this unreachable
        raise ValueError("model needs either parameters or a full shape")
    return _infer_shape(model.parameters, model)


def _from_shape(model: ModelSpec) -> ModelShape:
    assert model.hidden_size and model.num_layers and model.num_heads and model.vocab_size
    hidden, heads = model.hidden_size, model.num_heads
    gated = model.mlp == MlpKind.GATED
    return bare_shape(
        model.parameters or 0,
        hidden,
        model.num_layers,
        heads,
        model.num_kv_heads or heads,
        model.ffn_size or (_gated_ffn(hidden) if gated else 4 * hidden),
        model.vocab_size,
        model.tied_embeddings,
        gated,
        flash=model.attention == AttentionImpl.FLASH,
    )


def _gated_ffn(hidden: int) -> int:
    return -(-(8 * hidden // 3) // GATED_MULTIPLE) * GATED_MULTIPLE


def _infer_shape(parameters: int, model: ModelSpec) -> ModelShape:
    vocab = model.vocab_size or DEFAULT_VOCAB
    hidden = _hidden_for(parameters, vocab)
    heads = max(1, hidden // HEAD_DIM) if hidden >= HEAD_DIM else 1
    gated = model.mlp == MlpKind.GATED
    ffn = _gated_ffn(hidden) if gated else 4 * hidden
    one_layer = bare_shape(0, hidden, 1, heads, heads, ffn, vocab, model.tied_embeddings, gated)
    outer = one_layer.counted_parameters - one_layer.layer_params
    layers = max(1, round((parameters - outer) / one_layer.layer_params))
    return _with_count(
        bare_shape(0, hidden, layers, heads, heads, ffn, vocab, model.tied_embeddings, gated,
              flash=model.attention == AttentionImpl.FLASH, inferred=True),
        parameters,
    )  # fmt: skip


def _hidden_for(parameters: int, vocab: int) -> int:
    """Hidden size h with 12 h^3 / 128 + vocab h ~ parameters, rounded to a multiple of 64."""
    low, high = 1.0, 65536.0
    for _ in range(60):
        mid = (low + high) / 2
        if 12 * mid**3 / HIDDEN_PER_LAYER + vocab * mid < parameters:
            low = mid
        else:
            high = mid
    return max(64, round(low / 64) * 64)
