"""The model's shape as the memory model needs it: sizes of its tensors and of its layers.

A spec gives either the shape (hidden size, layers, heads, vocabulary) or only a parameter count.
From a count alone we infer a GPT-like shape (hidden/layers ~ 128, 128-wide heads, a 32k
vocabulary) and say so, because activations depend on the shape, not on the count.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.core.spec import AttentionImpl, ModelSpec

DEFAULT_VOCAB = 32_000
HIDDEN_PER_LAYER = 128  # GPT-3 / LLaMA family: 4096 hidden over 32 layers
HEAD_DIM = 128


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder transformer, resolved to concrete numbers."""

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

    @property
    def layer_tensor_numels(self) -> tuple[int, ...]:
        """Sizes of one block's tensors (attention, MLP, norms), biases included."""
        h, kv_dim = self.hidden, self.kv_heads * (self.hidden // self.heads)
        qkv, out = h * (h + 2 * kv_dim), h * h
        return (qkv, h + 2 * kv_dim, out, h, h * self.ffn, self.ffn, self.ffn * h, h, h, h, h, h)

    @property
    def layer_params(self) -> int:
        return sum(self.layer_tensor_numels)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def tensor_numels(self) -> list[int]:
        """Every parameter tensor's size, as DeepSpeed partitions them one by one."""
        sizes = list(self.layer_tensor_numels) * self.layers + [self.embedding_params]
        if not self.tied_embeddings:
            sizes.append(self.embedding_params)
        return [*sizes, self.hidden, self.hidden]

    @property
    def largest_tensor(self) -> int:
        return max(self.embedding_params, *self.layer_tensor_numels)

    @property
    def largest_module_params(self) -> int:
        """The most parameters one module gathers at once under ZeRO-3."""
        biggest_layer_tensor = max(self.layer_tensor_numels)
        return max(self.embedding_params, biggest_layer_tensor)


def count_parameters(
    hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, tied: bool
) -> int:
    """Parameters of the shape, counted tensor by tensor."""
    shape = ModelShape(0, hidden, layers, heads, kv_heads, ffn, vocab, tied, True, False)
    return sum(shape.tensor_numels())


def resolve_shape(model: ModelSpec) -> ModelShape:
    """The shape to plan with; a given ``parameters`` overrides the count derived from a shape."""
    if model.hidden_size and model.num_layers and model.num_heads and model.vocab_size:
        return _from_shape(model)
    if model.parameters is None:  # ModelSpec's validator makes this unreachable
        raise ValueError("model needs either parameters or a full shape")
    return _infer_shape(model.parameters, model)


def _from_shape(model: ModelSpec) -> ModelShape:
    assert model.hidden_size and model.num_layers and model.num_heads and model.vocab_size
    hidden, heads = model.hidden_size, model.num_heads
    kv_heads = model.num_kv_heads or heads
    ffn = model.ffn_size or 4 * hidden
    counted = count_parameters(
        hidden, model.num_layers, heads, kv_heads, ffn, model.vocab_size, model.tied_embeddings
    )
    return ModelShape(
        parameters=model.parameters or counted,
        hidden=hidden,
        layers=model.num_layers,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        vocab=model.vocab_size,
        tied_embeddings=model.tied_embeddings,
        flash_attention=model.attention == AttentionImpl.FLASH,
        inferred=False,
    )


def _infer_shape(parameters: int, model: ModelSpec) -> ModelShape:
    vocab = model.vocab_size or DEFAULT_VOCAB
    hidden = _hidden_for(parameters, vocab)
    heads = max(1, hidden // HEAD_DIM) if hidden >= HEAD_DIM else 1
    per_layer = 12 * hidden * hidden + 13 * hidden
    embeddings = vocab * hidden * (1 if model.tied_embeddings else 2)
    layers = max(1, round((parameters - embeddings) / per_layer))
    return ModelShape(
        parameters=parameters,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        ffn=4 * hidden,
        vocab=vocab,
        tied_embeddings=model.tied_embeddings,
        flash_attention=model.attention == AttentionImpl.FLASH,
        inferred=True,
    )


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
