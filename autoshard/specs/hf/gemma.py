"""Hugging Face converters for Gemma 2 and Gemma 3 (text): local sliding-window layers between global
ones (window.py reads which), a gated GELU MLP (``gelu_pytorch_tanh`` on gate_proj, times up_proj, then
down_proj: `MlpKind.GEGLU`), RMSNorm, RoPE, tied embeddings, head_dim 256 by default.

Read as transformers reads them (configuration_gemma2.py / configuration_gemma3.py defaults where a key
is absent): tie_word_embeddings true, vocab_size 256,000 (Gemma 2) or 262,208 (Gemma 3), head_dim 256,
sliding_window 4096, max_position_embeddings 8,192 (Gemma 2) or 131,072 (Gemma 3). Gemma 3 normalizes
queries and keys per head (q_norm / k_norm: `qk_norm`). Not priced, and said here: the two extra RMSNorms per layer (post-attention and
post-feed-forward, 2 x hidden weights a layer: 0.67M of Gemma-3-27B's 27B), the embedding's
sqrt(hidden) scaling, Gemma 3's local RoPE base (``rope_local_base_freq``, a launch fact of the
sliding layers) and Gemma 2's soft-capping of the attention scores and the final logits
(``attn_logit_softcapping`` 50, ``final_logit_softcapping`` 30: one tanh per score and per logit,
a few FLOPs beside the products)."""

from __future__ import annotations

from typing import Any

from autoshard.specs.hf.reader import Converter, Reader, kv_heads, run_length
from autoshard.specs.layers import LayerKind, MlpKind

__all__ = ["CONVERTERS"]

_GATED_GELU = ("gelu_pytorch_tanh", "gelu", "gelu_new", "gelu_fast", "gelu_tanh")


def _gemma(r: Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    act = r.str("hidden_activation", "hidden_act", default="gelu_pytorch_tanh")
    if act.lower() not in _GATED_GELU:
        raise r.error(r.lookup(("hidden_activation", "hidden_act"))[0],
                      f"unsupported activation {act!r} for Gemma's gated MLP (supported: "
                      f"{', '.join(_GATED_GELU)}); write a YAML model spec instead")
    gemma2 = model_type == "gemma2"
    return {
        "hidden_size": r.int("hidden_size", spec_field="hidden_size"),
        "num_attention_heads": r.int("num_attention_heads", spec_field="num_attention_heads"),
        # transformers' defaults: Gemma 2 256,000; Gemma 3 262,208 (the 27B's text_config leaves it out)
        "vocab_size": r.int("vocab_size", default=256000 if gemma2 else 262208, spec_field="vocab_size"),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r),
        "head_dim": r.int("head_dim", default=256, spec_field="head_dim"),
        "mlp": MlpKind.GEGLU,
        "tied_embeddings": r.bool("tie_word_embeddings", default=True),
        "max_position_embeddings": r.int("max_position_embeddings", default=8192 if gemma2 else 131072,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": r.bool("attention_bias", default=False),
        "qk_norm": not gemma2,
        "layers": run_length([LayerKind.DENSE] * layers),
    }


CONVERTERS: dict[str, Converter] = {
    "gemma2": _gemma,
    "gemma3": _gemma,
    "gemma3_text": _gemma,
}
