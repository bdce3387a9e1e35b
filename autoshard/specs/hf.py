"""Import a Hugging Face transformers ``config.json`` as a :class:`ModelSpec`.

One converter per ``model_type``, each reading the field names that transformers itself uses for that
architecture (and its defaults when a field is absent, as ``from_pretrained`` would). Only the facts that
decide weight shapes, memory and FLOPs are read; dropout, token ids, RoPE scaling, sliding windows and
quantization settings are ignored.

Where the schema cannot represent a detail exactly the importer approximates, and says so here:

* BLOOM's layernorm right after the word embedding (2*hidden parameters) has no field: it is not counted.
* OPT stores ``max_position_embeddings + 2`` learned position rows (fairseq's padding offset); the spec's
  ``max_position_embeddings`` is set to that row count so the parameter count is exact, which makes the
  advertised context two tokens longer than the real one.
* OPT with ``word_embed_proj_dim != hidden_size`` (opt-350m) has a narrower embedding plus two projections;
  the spec counts a full-width embedding instead and a :class:`UserWarning` says so.
* Biases: the spec knows "every linear layer" (``linear_bias``) or "only Q/K/V" (``qkv_bias``). Llama-style
  ``attention_bias`` (which also covers the output projection) maps to ``qkv_bias``; ``mlp_bias`` maps to
  ``linear_bias``. The difference is ``hidden`` parameters per layer.
* MoE router extras (Qwen2-MoE's 1-wide shared-expert gate, DeepSeek-V3's expert-score correction bias)
  are not counted in parameters. DeepSeek-V2/V3 routing is imported: ``scoring_func`` (sigmoid/softmax),
  group-limited routing (``n_group``, ``topk_group``; only with ``topk_method`` group_limited_greedy or
  noaux_tc), the auxiliary-loss-free expert bias (``topk_method: noaux_tc``) and ``routed_scaling_factor``.
  DeepSeek-V3's multi-token-prediction modules (``num_nextn_predict_layers``) become ``mtp_num_layers``:
  trained and costed, but outside ``num_params`` (the published 671B; the hub's 685B adds the 14B MTP
  module with its copies of the embedding and head).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoshard.errors import SpecError
from autoshard.specs.model import (
    AttentionKind,
    LayerKind,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionKind,
)

__all__ = ["model_from_hf_config", "SUPPORTED_MODEL_TYPES"]

_MISSING: Any = object()
_MAX_LAYERS = 100_000


class _Reader:
    """Typed access to the config dict; every failure is a SpecError naming the config key."""

    def __init__(self, data: dict[str, Any], *, source: str, prefix: str = "") -> None:
        self.data = data
        self.source = source
        self.prefix = prefix
        self.origin: dict[str, str] = {}
        """ModelSpec field -> config key it was read from (to name the key when validation fails)."""

    def where(self, key: str) -> str:
        return self.prefix + key

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(message, source=self.source, field=self.where(key))

    def _lookup(self, keys: Sequence[str]) -> tuple[str, Any]:
        for key in keys:
            if key in self.data and self.data[key] is not None:
                return key, self.data[key]
        return keys[0], _MISSING

    def int(self, *keys: str, default: Any = _MISSING, spec_field: str | None = None, minimum: int = 1,
            maximum: int | None = None) -> Any:
        """A whole number in [minimum, maximum] from the first present key, else `default` (may be None)."""
        key, value = self._lookup(keys)
        if value is _MISSING:
            if default is _MISSING:
                alias = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
                raise self.error(key, f"required key is missing{alias}: the model's shape cannot be derived "
                                      "without it; use the checkpoint's complete config.json")
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected a whole number (got {value!r})")
        if value < minimum:
            raise self.error(key, f"must be at least {minimum} (got {value})")
        if maximum is not None and value > maximum:
            raise self.error(key, f"implausibly large (got {value}, at most {maximum}): check the config")
        if spec_field:
            self.origin[spec_field] = self.where(key)
        return value

    def layers(self, *keys: str) -> int:
        """The decoder layer count (one entry per layer is built, so absurd values are refused)."""
        return self.int(*keys, maximum=_MAX_LAYERS)

    def bool(self, *keys: str, default: bool) -> bool:
        key, value = self._lookup(keys)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false (got {value!r})")
        return value

    def str(self, *keys: str, default: str) -> str:
        key, value = self._lookup(keys)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"expected a string (got {value!r})")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise self.error(key, f"expected a list of layer indices (got {value!r})")
        return list(value)


# ------------------------------------------------------------------------------------------ helpers
def _act_to_mlp(r: _Reader, key: str, default: str) -> MlpKind:
    """Activation of a two-matrix (non-gated) MLP."""
    act = r.str(key, default=default).lower()
    if act in ("relu2", "squared_relu", "squared-relu"):
        return MlpKind.SQUARED_RELU
    if act == "relu":
        return MlpKind.RELU
    if act.startswith("gelu") or act in ("quick_gelu", "bias_gelu", "fast_gelu"):
        return MlpKind.GELU
    raise r.error(key, f"unsupported activation {act!r} for this architecture's two-matrix MLP "
                       "(supported: gelu variants, relu, relu2); write a YAML model spec instead")


def _run_length(kinds: list[LayerKind]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = [{"kind": LayerKind.EMBEDDING}]
    for kind in kinds:
        if groups[-1]["kind"] is kind:
            groups[-1]["count"] += 1
        else:
            groups.append({"kind": kind, "count": 1})
    groups.append({"kind": LayerKind.OUTPUT})
    return groups


def _bias_flags(r: _Reader, *, attention_default: bool = False, mlp_default: bool = False) -> dict[str, bool]:
    attention_bias = r.bool("attention_bias", default=attention_default)
    mlp_bias = r.bool("mlp_bias", default=mlp_default)
    return {"linear_bias": mlp_bias, "qkv_bias": attention_bias and not mlp_bias}


def _common_dense(r: _Reader) -> dict[str, Any]:
    """Sizes every Llama-style config spells the same way."""
    return {
        "hidden_size": r.int("hidden_size", spec_field="hidden_size"),
        "num_attention_heads": r.int("num_attention_heads", spec_field="num_attention_heads"),
        "vocab_size": r.int("vocab_size", spec_field="vocab_size"),
    }


def _kv_heads(r: _Reader, default: Any = None) -> Any:
    return r.int("num_key_value_heads", default=default, spec_field="num_kv_heads")


def _moe_layer_kinds(r: _Reader, num_layers: int, *, has_experts: bool) -> list[LayerKind]:
    """Qwen2-MoE / Qwen3-MoE rule: layer i is sparse unless listed in mlp_only_layers, every
    decoder_sparse_step-th layer (1-based)."""
    step = r.int("decoder_sparse_step", default=1)
    dense_only = set(r.int_list("mlp_only_layers"))
    return [
        LayerKind.MOE if has_experts and i not in dense_only and (i + 1) % step == 0 else LayerKind.DENSE
        for i in range(num_layers)
    ]


# ------------------------------------------------------------------------------------------ converters
def _llama(r: _Reader, model_type: str) -> dict[str, Any]:
    # Llama, Mistral: gated (SwiGLU) MLP, RMSNorm, RoPE, untied by default.
    layers = r.layers("num_hidden_layers")
    return {
        **_common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": _kv_heads(r),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings",
                                         default=131072 if model_type == "mistral" else 2048,
                                         spec_field="max_position_embeddings"),
        **_bias_flags(r),
        "layers": _run_length([LayerKind.DENSE] * layers),
    }


def _mixtral(r: _Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    ffn = r.int("intermediate_size", spec_field="ffn_hidden_size")
    return {
        **_common_dense(r),
        "ffn_hidden_size": ffn,
        "num_kv_heads": _kv_heads(r, default=8),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=131072,
                                         spec_field="max_position_embeddings"),
        "moe": {
            "num_experts": r.int("num_local_experts", "num_experts", default=8, spec_field="moe.num_experts"),
            "top_k": r.int("num_experts_per_tok", default=2, spec_field="moe.top_k"),
            "expert_ffn_hidden_size": ffn,
        },
        "layers": _run_length([LayerKind.MOE] * layers),
    }


def _qwen2(r: _Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    return {
        **_common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": _kv_heads(r),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=32768,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": True,  # Qwen2Attention: q/k/v with bias, o_proj without
        "layers": _run_length([LayerKind.DENSE] * layers),
    }


def _qwen2_moe(r: _Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    experts = r.int("num_experts", "num_local_experts", default=60, minimum=0, spec_field="moe.num_experts")
    shared = r.int("shared_expert_intermediate_size", default=5632, minimum=0,
                   spec_field="moe.shared_expert_ffn_hidden_size")
    kinds = _moe_layer_kinds(r, layers, has_experts=experts > 0)
    spec: dict[str, Any] = {
        **_common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", default=5632, spec_field="ffn_hidden_size"),
        "num_kv_heads": _kv_heads(r, default=16),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=32768,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": r.bool("qkv_bias", default=True),
        "layers": _run_length(kinds),
    }
    if LayerKind.MOE in kinds:
        spec["moe"] = {
            "num_experts": experts,
            "top_k": r.int("num_experts_per_tok", default=4, spec_field="moe.top_k"),
            "expert_ffn_hidden_size": r.int("moe_intermediate_size", default=1408,
                                            spec_field="moe.expert_ffn_hidden_size"),
            # transformers builds one shared-expert MLP of this width (plus a 1-wide sigmoid gate).
            "num_shared_experts": 1 if shared else 0,
            "shared_expert_ffn_hidden_size": shared,
        }
    return spec


def _qwen3(r: _Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    return {
        **_common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": _kv_heads(r),
        "head_dim": r.int("head_dim", default=128, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=32768,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": r.bool("attention_bias", default=False),
        "qk_norm": True,
        "layers": _run_length([LayerKind.DENSE] * layers),
    }


def _qwen3_moe(r: _Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    experts = r.int("num_experts", "num_local_experts", default=128, minimum=0, spec_field="moe.num_experts")
    kinds = _moe_layer_kinds(r, layers, has_experts=experts > 0)
    spec: dict[str, Any] = {
        **_common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", default=6144, spec_field="ffn_hidden_size"),
        "num_kv_heads": _kv_heads(r, default=4),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=32768,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": r.bool("attention_bias", default=False),
        "qk_norm": True,
        "layers": _run_length(kinds),
    }
    if LayerKind.MOE in kinds:
        spec["moe"] = {
            "num_experts": experts,
            "top_k": r.int("num_experts_per_tok", default=8, spec_field="moe.top_k"),
            "expert_ffn_hidden_size": r.int("moe_intermediate_size", default=768,
                                            spec_field="moe.expert_ffn_hidden_size"),
        }
    return spec


def _deepseek(r: _Reader, model_type: str) -> dict[str, Any]:
    v3 = model_type == "deepseek_v3"
    layers = r.layers("num_hidden_layers")
    hidden = r.int("hidden_size", spec_field="hidden_size")
    heads = r.int("num_attention_heads", spec_field="num_attention_heads")
    routed = r.int("n_routed_experts", "num_local_experts", default=256 if v3 else 64, minimum=0,
                   spec_field="moe.num_experts")
    first_dense = r.int("first_k_dense_replace", default=3 if v3 else 0, minimum=0)
    freq = r.int("moe_layer_freq", default=1)
    kinds = [
        LayerKind.MOE if routed and i >= first_dense and i % freq == 0 else LayerKind.DENSE
        for i in range(layers)
    ]
    v_head_dim = r.int("v_head_dim", default=128, spec_field="mla.v_head_dim")
    spec: dict[str, Any] = {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "vocab_size": r.int("vocab_size", spec_field="vocab_size"),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        # MLA caches a latent, not per-head K/V: head counts and head_dim of the GQA path do not apply.
        # head_dim is only set when hidden_size is not a multiple of the head count (the schema needs one).
        "head_dim": v_head_dim if hidden % heads else None,
        "attention": AttentionKind.MLA,
        "mla": {
            "q_lora_rank": r.int("q_lora_rank", default=1536 if v3 else None, spec_field="mla.q_lora_rank"),
            "kv_lora_rank": r.int("kv_lora_rank", default=512, spec_field="mla.kv_lora_rank"),
            "qk_nope_head_dim": r.int("qk_nope_head_dim", default=128, spec_field="mla.qk_nope_head_dim"),
            "qk_rope_head_dim": r.int("qk_rope_head_dim", default=64, spec_field="mla.qk_rope_head_dim"),
            "v_head_dim": v_head_dim,
        },
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=4096 if v3 else 2048,
                                         spec_field="max_position_embeddings"),
        "layers": _run_length(kinds),
    }
    if LayerKind.MOE in kinds:
        expert_ffn = r.int("moe_intermediate_size", default=2048 if v3 else 1407,
                           spec_field="moe.expert_ffn_hidden_size")
        shared = r.int("n_shared_experts", default=1 if v3 else 2, minimum=0,
                       spec_field="moe.num_shared_experts")
        spec["moe"] = {
            "num_experts": routed,
            "top_k": r.int("num_experts_per_tok", default=8 if v3 else _MISSING, spec_field="moe.top_k"),
            "expert_ffn_hidden_size": expert_ffn,
            "num_shared_experts": shared,
            "shared_expert_ffn_hidden_size": shared * expert_ffn,
            **_deepseek_routing(r, v3),
        }
    spec["mtp_num_layers"] = r.int("num_nextn_predict_layers", default=0, minimum=0, maximum=16)
    return spec


def _deepseek_routing(r: _Reader, v3: bool) -> dict[str, Any]:
    """DeepSeek router: score function, group-limited routing, expert bias, routed scaling."""
    score = r.str("scoring_func", default="sigmoid" if v3 else "softmax")
    if score not in ("softmax", "sigmoid"):
        raise r.error("scoring_func", f"expected softmax or sigmoid (got {score!r})")
    method = r.str("topk_method", default="noaux_tc" if v3 else "greedy")
    out: dict[str, Any] = {"score_function": score, "expert_bias": method == "noaux_tc"}
    if method in ("group_limited_greedy", "noaux_tc"):
        groups = r.int("n_group", default=None)
        topk = r.int("topk_group", default=None)
        if groups is not None and topk is not None and groups > 1:
            out["num_groups"], out["topk_groups"] = groups, topk
    key, factor = r._lookup(("routed_scaling_factor",))
    if factor is not _MISSING:
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1000:
            raise r.error(key, f"expected a positive number (got {factor!r})")
        if factor != 1:
            out["topk_scaling_factor"] = float(factor)
    return out


def _nemotron(r: _Reader, model_type: str) -> dict[str, Any]:
    # Nemotron-3/4, Minitron: squared-ReLU two-matrix MLP, LayerNorm (weight + bias), partial RoPE.
    layers = r.layers("num_hidden_layers")
    return {
        **_common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "num_kv_heads": _kv_heads(r),
        # NeMo's converter writes Megatron's kv_channels; newer configs say head_dim.
        "head_dim": r.int("head_dim", "kv_channels", default=None, spec_field="head_dim"),
        "mlp": _act_to_mlp(r, "hidden_act", "relu2"),
        "norm": NormKind.LAYERNORM,
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=4096,
                                         spec_field="max_position_embeddings"),
        **_bias_flags(r),
        "layers": _run_length([LayerKind.DENSE] * layers),
    }


def _gpt2(r: _Reader, model_type: str) -> dict[str, Any]:
    hidden = r.int("n_embd", "hidden_size", spec_field="hidden_size")
    layers = r.layers("n_layer", "num_hidden_layers")
    return {
        "hidden_size": hidden,
        "ffn_hidden_size": r.int("n_inner", "intermediate_size", default=4 * hidden,
                                 spec_field="ffn_hidden_size"),
        "num_attention_heads": r.int("n_head", "num_attention_heads", spec_field="num_attention_heads"),
        "vocab_size": r.int("vocab_size", spec_field="vocab_size"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=True),
        "mlp": _act_to_mlp(r, "activation_function", "gelu_new"),
        "norm": NormKind.LAYERNORM,
        "position_embedding": PositionKind.LEARNED,
        "max_position_embeddings": r.int("n_positions", "max_position_embeddings", default=1024,
                                         spec_field="max_position_embeddings"),
        "linear_bias": True,
        "layers": _run_length([LayerKind.DENSE] * layers),
    }


def _gpt_neox(r: _Reader, model_type: str) -> dict[str, Any]:
    # GPT-NeoX-20B, Pythia: partial RoPE (rotary_pct), parallel residual, biased linears, untied head.
    layers = r.layers("num_hidden_layers")
    return {
        **_common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", spec_field="ffn_hidden_size"),
        "mlp": _act_to_mlp(r, "hidden_act", "gelu"),
        "norm": NormKind.LAYERNORM,
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=2048,
                                         spec_field="max_position_embeddings"),
        # attention_bias=false drops only the attention biases; the MLP keeps its own, so the
        # spec's all-or-nothing linear_bias stays on (the difference is ~4*hidden per layer).
        "linear_bias": True,
        "layers": _run_length([LayerKind.DENSE] * layers),
    }


def _bloom(r: _Reader, model_type: str) -> dict[str, Any]:
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
        "layers": _run_length([LayerKind.DENSE] * layers),
    }


def _opt(r: _Reader, model_type: str) -> dict[str, Any]:
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
        "mlp": _act_to_mlp(r, "activation_function", "relu"),
        "norm": NormKind.LAYERNORM,
        "position_embedding": PositionKind.LEARNED,
        # OPTLearnedPositionalEmbedding holds max_position_embeddings + 2 rows (offset 2).
        "max_position_embeddings": positions + 2,
        "linear_bias": r.bool("enable_bias", default=True),
        "layers": _run_length([LayerKind.DENSE] * layers),
    }


_CONVERTERS: dict[str, Callable[[_Reader, str], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _llama,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "nemotron": _nemotron,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "opt": _opt,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_CONVERTERS))


# ------------------------------------------------------------------------------------------ entry point
def _default_name(source: str) -> str:
    path = Path(source)
    if path.name != "config.json":
        return path.stem or "model"
    parent = path.resolve().parent if path.parent in (Path(""), Path(".")) else path.parent
    # Hugging Face cache: .../models--org--name/snapshots/<commit>/config.json
    if parent.parent.name == "snapshots" and parent.parent.parent.name.startswith("models--"):
        return parent.parent.parent.name[len("models--"):].replace("--", "/")
    return parent.name or "model"


def model_from_hf_config(config: dict[str, Any], *, source: str) -> ModelSpec:
    """A ModelSpec from a parsed Hugging Face ``config.json``.

    Bad input raises SpecError naming the config key, never another exception."""
    if not isinstance(config, dict):
        raise SpecError(f"expected a JSON object of config fields, got {type(config).__name__}",
                        source=source)
    data, prefix = config, ""
    text = config.get("text_config")
    if isinstance(text, dict):
        # Multimodal wrappers (Llava, Mistral3, ...) keep the language model in text_config.
        data = {k: config[k] for k in ("_name_or_path", "tie_word_embeddings") if k in config}
        data.update(text)
        if "model_type" not in text and "model_type" in config:
            data["model_type"] = config["model_type"]
        prefix = "text_config."
    reader = _Reader(data, source=source, prefix=prefix)

    model_type = data.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is None:
        raise reader.error("model_type", f"required key is missing: cannot tell the architecture (supported: "
                                         f"{supported}); add it, or write a YAML model spec instead")
    if not isinstance(model_type, str) or model_type not in _CONVERTERS:
        raise reader.error("model_type", f"unsupported model_type {model_type!r}: autoshard imports "
                                         f"{supported}; for other architectures write a YAML model spec "
                                         "(see models/ for examples)")

    fields = _CONVERTERS[model_type](reader, model_type)
    name = data.get("_name_or_path")
    fields["name"] = name.rstrip("/") if isinstance(name, str) and name.strip("/ ") else _default_name(source)
    if isinstance(name, str) and name.strip("/ "):
        reader.origin["name"] = "_name_or_path"  # a bad name is named by its config key
    fields["source"] = source
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        from autoshard.specs.loader import format_validation_error

        field, message = format_validation_error(exc, ModelSpec)
        raise SpecError(f"{message} (model_type {model_type})", source=source,
                        field=_config_key(reader.origin, field, message)) from None


def _config_key(origin: dict[str, str], field: str, message: str) -> str:
    """The config.json key behind a ModelSpec validation error: the failing field itself, else the
    first spec field the message names (cross-field checks fail at the top level)."""
    if field in origin:
        return origin[field]
    named = [
        (m.start(), key)
        for spec_field, key in origin.items()
        if (m := re.search(rf"(?<![\w.]){re.escape(spec_field)}(?!\w)", message))
    ]
    return min(named)[1] if named else field
