"""Model shapes from Hugging Face configs: the advisor counts exactly what transformers builds.

Each case builds a real tiny model of the family with transformers on the CPU and compares the
advisor's tensors with the model's own parameters (tied ones counted once, as
``model.parameters()`` does), so a family whose layout we get wrong fails here.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest
import transformers
from pydantic import ValidationError

from service.core.advisor.shape import ModelShape, resolve_shape
from service.core.limits import MAX_LAYERS
from service.core.spec import ModelSpec

SMALL = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 120}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama GQA untied": ("llama", {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2}),
    "llama tied with biases": (
        "llama",
        {**SMALL, "intermediate_size": 96, "tie_word_embeddings": True, "attention_bias": True,
         "mlp_bias": True},
    ),
    "mistral": ("mistral", {**SMALL, "intermediate_size": 112, "num_key_value_heads": 1}),
    "qwen2 (qkv bias)": ("qwen2", {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2}),
    "qwen2 tied": (
        "qwen2",
        {**SMALL, "intermediate_size": 96, "num_key_value_heads": 4, "tie_word_embeddings": True},
    ),
    "gemma (head_dim != hidden/heads)": (
        "gemma", {**SMALL, "intermediate_size": 96, "num_key_value_heads": 1, "head_dim": 24},
    ),
    "phi3 (fused qkv, gate_up)": (
        "phi3", {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2, "pad_token_id": 0},
    ),
    "gpt2": ("gpt2", {"n_embd": 64, "n_layer": 3, "n_head": 4, "vocab_size": 120,
                      "n_positions": 40}),
    "gpt2 n_inner": ("gpt2", {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 120,
                              "n_positions": 40, "n_inner": 80}),
    "gpt_neox": ("gpt_neox", {**SMALL, "intermediate_size": 96}),
    "gpt_neox tied, no attention bias": (
        "gpt_neox", {**SMALL, "intermediate_size": 96, "tie_word_embeddings": True,
                     "attention_bias": False},
    ),
    "mixtral experts": (
        "mixtral", {**SMALL, "intermediate_size": 48, "num_key_value_heads": 2,
                    "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
}  # fmt: skip


def real_model(family: str, fields: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    config = transformers.AutoConfig.for_model(family, **fields)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return config.to_dict(), model


def expanded_tensors(shape: ModelShape) -> Counter[int]:
    """How many tensors of each size the shape lists, layers multiplied out."""
    totals: Counter[int] = Counter()
    for numel, count in shape.tensor_counts():
        totals[numel] += count
    return totals


@pytest.mark.parametrize("case", CASES)
def test_hf_config_counts_what_transformers_builds(case: str) -> None:
    family, fields = CASES[case]
    config, model = real_model(family, fields)

    shape = resolve_shape(ModelSpec(hf_config=config))

    real = [p.numel() for p in model.parameters()]
    assert shape.parameters == sum(real)
    assert expanded_tensors(shape) == Counter(real)  # tensor by tensor: ZeRO-3 partitions these
    assert shape.largest_tensor == max(real)
    assert shape.gated_mlp == (family not in ("gpt2", "gpt_neox"))


def test_mixtral_keeps_its_routing_for_activations() -> None:
    config, _ = real_model(*CASES["mixtral experts"])

    shape = resolve_shape(ModelSpec(hf_config=config))

    assert (shape.experts, shape.experts_per_token) == (4, 2)


@pytest.mark.parametrize(
    ("model", "parameters"),
    [  # the real counts of the H200 runs' LlamaForCausalLM (../shared/data/h200-2026-11-30)
        ({"hidden_size": 768, "num_layers": 12, "num_heads": 12, "ffn_size": 2048}, 134_105_856),
        (
            {"hidden_size": 2048, "num_layers": 16, "num_heads": 32, "num_kv_heads": 8,
             "ffn_size": 8192},
            1_104_218_112,
        ),
    ],
)  # fmt: skip
def test_bare_gated_shape_counts_a_llama_exactly(model: dict[str, Any], parameters: int) -> None:
    spec = ModelSpec(**model, vocab_size=32000, tied_embeddings=False, mlp="gated")

    assert resolve_shape(spec).parameters == parameters


def test_bare_gated_shape_equals_transformers_llama() -> None:
    fields = {**SMALL, "intermediate_size": 96, "num_key_value_heads": 2}
    _, model = real_model("llama", fields)
    spec = ModelSpec(
        hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, ffn_size=96, vocab_size=120,
        tied_embeddings=False, mlp="gated",
    )  # fmt: skip

    assert resolve_shape(spec).parameters == sum(p.numel() for p in model.parameters())


def test_plain_is_the_default_and_counts_a_gelu_block() -> None:
    gated = ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=128, mlp="gated")
    plain = ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=128)

    assert plain.mlp == "plain"
    assert resolve_shape(plain).ffn == 256  # 4h
    assert resolve_shape(gated).ffn == 256  # 8h/3 rounded up to a multiple of 256
    assert not resolve_shape(plain).gated_mlp and resolve_shape(gated).gated_mlp


def test_a_huge_model_resolves_without_per_layer_work() -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 16384,
        "num_hidden_layers": MAX_LAYERS,
        "num_attention_heads": 128,
        "intermediate_size": 53248,
        "vocab_size": 128256,
    }

    shape = resolve_shape(ModelSpec(hf_config=config))

    assert len(shape.tensor_counts()) == 9 + 3  # one block's tensors, embeddings, norm, head
    assert shape.parameters > 10**14


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "bert"}, "model.hf_config.model_type 'bert' is not a family"),
        (
            {"model_type": "llama", "hidden_size": 64},
            "model.hf_config.num_hidden_layers is missing",
        ),
        (
            {**SMALL, "model_type": "llama", "intermediate_size": -1},
            "model.hf_config.intermediate_size must be a positive integer",
        ),
        (
            {**SMALL, "model_type": "llama", "num_hidden_layers": MAX_LAYERS + 1},
            "model.hf_config.num_hidden_layers (100001) is over the limit of 100000",
        ),
        (
            {**SMALL, "model_type": "llama", "num_attention_heads": 128, "intermediate_size": 96},
            "model.hf_config.num_attention_heads (128) must not exceed hidden_size (64)",
        ),
        (
            {**SMALL, "model_type": "mistral", "intermediate_size": 96, "num_key_value_heads": 3},
            "num_key_value_heads (3) must divide num_attention_heads (4)",
        ),
        ("config.json", "is read only by the zeropilot CLI"),
    ],
)
def test_bad_hf_configs_are_named(config: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        ModelSpec(hf_config=config)


def test_hf_config_and_shape_fields_are_exclusive() -> None:
    config = {**SMALL, "model_type": "llama", "intermediate_size": 96}

    with pytest.raises(ValidationError, match=r"either model\.hf_config or the shape fields"):
        ModelSpec(hf_config=config, hidden_size=64)
