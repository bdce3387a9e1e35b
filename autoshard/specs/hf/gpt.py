"""Hugging Face converters for the GPT-style families: GPT-2, GPT-NeoX (Pythia), BLOOM and OPT (LayerNorm,
biased linears, two-matrix GELU/ReLU MLP; learned positions, partial RoPE or ALiBi)."""

from __future__ import annotations

import warnings
from typing import Any

from autoshard.specs.hf.reader import Converter, Reader, act_to_mlp, common_dense, run_length
from autoshard.specs.layers import LayerKind, MlpKind, NormKind, PositionKind

__all__ = ["CONVERTERS"]


def _gpt2(r: Reader, model_type: str) -> dict[str, Any]:
    hidden = r.int("n_embd", "hidden_size", spec_field="hidden_size")
    layers = r.layers("n_layer", "num_hidden_layers")
    return {
        "hidden_size": hidden,
        "ffn_hidden_size": r.int("n_inner", "intermediate_size", default=4 * hidden,
                                 spec_field="ffn_hidden_size"),
        "num_attention_heads": r.int("n_head", "num_attention_heads", spec_field="num_attention_heads"),
        "vocab_size": r.int("vocab_size", spec_field="vocab_size"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=True),
        "mlp": act_to_mlp(r, "activation_function", "gelu_new"),
        "norm": NormKind.LAYERNORM,
        "position_embedding": PositionKind.LEARNED,
        "max_position_embeddings": r.int("n_positions", "max_position_embeddings", default=1024,
                                         spec_field="max_position_embeddings"),
        "linear_bias": True,
        "layers": run_length([LayerKind.DENSE] * layers),
    }


def _gpt_neox(r: Reader, model_type: str) -> dict[str, Any]:
    # GPT-NeoX-20B, Pythia: partial RoPE (rotary_pct), parallel residual, biased linears, untied head.
    layers = r.layers("num_hidden_layers")
    return {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "mlp": act_to_mlp(r, "hidden_act", "gelu"),
        "norm": NormKind.LAYERNORM,
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=2048,
                                         spec_field="max_position_embeddings"),
        # attention_bias=false drops only the attention biases; the MLP keeps its own, so the
        # spec's all-or-nothing linear_bias stays on (the difference is ~4*hidden per layer).
        "linear_bias": True,
        "layers": run_length([LayerKind.DENSE] * layers),
    }


def _bloom(r: Reader, model_type: str) -> dict[str, Any]:
    # ALiBi (no position table), 4*hidden GELU MLP, biased linears, LayerNorm, tied head. The extra
    # word_embeddings_layernorm (2*hidden parameters) has no field in the spec and is not counted.
    hidden = r.int("hidden_size", "n_embed", spec_field="hidden_size")
    layers = r.layers("n_layer", "num_hidden_layers")
    return {
        "hidden_size": hidden,
        "ffn_hidden_size": 4 * hidden,  # BloomMLP is always 4*hidden (n_inner is ignored by transformers)
        "num_attention_heads": r.int("n_head", "num_attention_heads", spec_field="num_attention_heads"),
        "vocab_size": r.int("vocab_size", spec_field="vocab_size"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=True),
        "mlp": MlpKind.GELU,
        "norm": NormKind.LAYERNORM,
        "position_embedding": PositionKind.ALIBI,
        # ALiBi has no table; BLOOM was trained at 2048 tokens (some configs record it as seq_length).
        "max_position_embeddings": r.int("max_position_embeddings", "seq_length", default=2048,
                                         spec_field="max_position_embeddings"),
        "linear_bias": True,
        "layers": run_length([LayerKind.DENSE] * layers),
    }


def _opt(r: Reader, model_type: str) -> dict[str, Any]:
    hidden = r.int("hidden_size", spec_field="hidden_size")
    layers = r.layers("num_hidden_layers")
    proj = r.int("word_embed_proj_dim", default=hidden)
    if proj != hidden:
        warnings.warn(
            f"{r.source}: OPT word_embed_proj_dim ({proj}) differs from hidden_size ({hidden}): the "
            f"embedding is {proj} wide with projections in and out, which the spec cannot express; it is "
            f"counted as a {hidden}-wide embedding instead (an overestimate)",
            UserWarning,
            stacklevel=3,
        )
    positions = r.int("max_position_embeddings", default=2048, spec_field="max_position_embeddings")
    return {
        "hidden_size": hidden,
        "ffn_hidden_size": r.int("ffn_dim", spec_field="ffn_hidden_size"),
        "num_attention_heads": r.int("num_attention_heads", spec_field="num_attention_heads"),
        "vocab_size": r.int("vocab_size", spec_field="vocab_size"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=True),
        "mlp": act_to_mlp(r, "activation_function", "relu"),
        "norm": NormKind.LAYERNORM,
        "position_embedding": PositionKind.LEARNED,
        # OPTLearnedPositionalEmbedding holds max_position_embeddings + 2 rows (offset 2).
        "max_position_embeddings": positions + 2,
        "linear_bias": r.bool("enable_bias", default=True),
        "layers": run_length([LayerKind.DENSE] * layers),
    }


CONVERTERS: dict[str, Converter] = {
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "opt": _opt,
}
