"""Hugging Face converters for the Llama-like dense families: Llama, Mistral, Phi-3/Phi-4, Qwen2, Qwen3 and
Nemotron (RoPE, untied by default; gated SwiGLU MLP and RMSNorm, or Nemotron's squared-ReLU MLP and
LayerNorm)."""

from __future__ import annotations

from typing import Any

from autoshard.specs.hf.reader import (
    Converter, Reader, act_to_mlp, bias_flags, common_dense, kv_heads, run_length,
)
from autoshard.specs.layers import LayerKind, NormKind

__all__ = ["CONVERTERS"]


def _llama(r: Reader, model_type: str) -> dict[str, Any]:
    # Llama, Mistral: gated (SwiGLU) MLP, RMSNorm, RoPE, untied by default.
    layers = r.layers("num_hidden_layers")
    return {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings",
                                         default=131072 if model_type == "mistral" else 2048,
                                         spec_field="max_position_embeddings"),
        **bias_flags(r),
        "layers": run_length([LayerKind.DENSE] * layers),
    }


def _phi3(r: Reader, model_type: str) -> dict[str, Any]:
    # Phi-3 / Phi-3.5 / Phi-4 (Phi3ForCausalLM): Llama's weights with Q/K/V fused into one qkv_proj and
    # gate/up into one gate_up_proj (same shapes in total), no biases, head_dim = hidden / heads.
    # partial_rotary_factor (Phi-4-mini) rotates part of each head and changes no weight shape.
    layers = r.layers("num_hidden_layers")
    return {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=4096,
                                         spec_field="max_position_embeddings"),
        "layers": run_length([LayerKind.DENSE] * layers),
    }


def _qwen2(r: Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    return {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=32768,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": True,  # Qwen2Attention: q/k/v with bias, o_proj without
        "layers": run_length([LayerKind.DENSE] * layers),
    }


def _qwen3(r: Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    return {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r),
        "head_dim": r.int("head_dim", default=128, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=32768,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": r.bool("attention_bias", default=False),
        "qk_norm": True,
        "layers": run_length([LayerKind.DENSE] * layers),
    }


def _nemotron(r: Reader, model_type: str) -> dict[str, Any]:
    # Nemotron-3/4, Minitron: squared-ReLU two-matrix MLP, LayerNorm (weight + bias), partial RoPE.
    layers = r.layers("num_hidden_layers")
    return {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r),
        # NeMo's converter writes Megatron's kv_channels; newer configs say head_dim.
        "head_dim": r.int("head_dim", "kv_channels", default=None, spec_field="head_dim"),
        "mlp": act_to_mlp(r, "hidden_act", "relu2"),
        "norm": NormKind.LAYERNORM,
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=4096,
                                         spec_field="max_position_embeddings"),
        **bias_flags(r),
        "layers": run_length([LayerKind.DENSE] * layers),
    }


CONVERTERS: dict[str, Converter] = {
    "llama": _llama,
    "mistral": _llama,
    "phi3": _phi3,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "nemotron": _nemotron,
}
