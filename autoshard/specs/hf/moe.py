"""Hugging Face converters for the mixture-of-experts families: Mixtral, Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE,
DeepSeek-V2/V3 and Kimi K2 (multi-head latent attention, shared experts, group-limited routing, MTP
modules) and GLM-4.5 (the DeepSeek-V3 MoE block under grouped-query attention)."""

from __future__ import annotations

from typing import Any

from autoshard.specs.hf.reader import MISSING, Converter, Reader, common_dense, kv_heads, run_length
from autoshard.specs.layers import AttentionKind, LayerKind

__all__ = ["CONVERTERS"]


def _moe_layer_kinds(r: Reader, num_layers: int, *, has_experts: bool) -> list[LayerKind]:
    """Qwen2-MoE / Qwen3-MoE rule: layer i is sparse unless listed in mlp_only_layers, every
    decoder_sparse_step-th layer (1-based)."""
    step = r.int("decoder_sparse_step", default=1)
    dense_only = set(r.int_list("mlp_only_layers"))
    return [
        LayerKind.MOE if has_experts and i not in dense_only and (i + 1) % step == 0 else LayerKind.DENSE
        for i in range(num_layers)
    ]


def _mixtral(r: Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    ffn = r.int("intermediate_size", spec_field="ffn_hidden_size")
    return {
        **common_dense(r),
        "ffn_hidden_size": ffn,
        "num_kv_heads": kv_heads(r, default=8),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=131072,
                                         spec_field="max_position_embeddings"),
        "moe": {
            "num_experts": r.int("num_local_experts", "num_experts", default=8, spec_field="moe.num_experts"),
            "top_k": r.int("num_experts_per_tok", default=2, spec_field="moe.top_k"),
            "expert_ffn_hidden_size": ffn,
        },
        "layers": run_length([LayerKind.MOE] * layers),
    }


def _qwen2_moe(r: Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    experts = r.int("num_experts", "num_local_experts", default=60, minimum=0, spec_field="moe.num_experts")
    shared = r.int("shared_expert_intermediate_size", default=5632, minimum=0,
                   spec_field="moe.shared_expert_ffn_hidden_size")
    kinds = _moe_layer_kinds(r, layers, has_experts=experts > 0)
    spec: dict[str, Any] = {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", default=5632, spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r, default=16),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=32768,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": r.bool("qkv_bias", default=True),
        "layers": run_length(kinds),
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


def _qwen3_moe(r: Reader, model_type: str) -> dict[str, Any]:
    layers = r.layers("num_hidden_layers")
    experts = r.int("num_experts", "num_local_experts", default=128, minimum=0, spec_field="moe.num_experts")
    kinds = _moe_layer_kinds(r, layers, has_experts=experts > 0)
    spec: dict[str, Any] = {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", default=6144, spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r, default=4),
        "head_dim": r.int("head_dim", default=None, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=32768,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": r.bool("attention_bias", default=False),
        "qk_norm": True,
        "layers": run_length(kinds),
    }
    if LayerKind.MOE in kinds:
        spec["moe"] = {
            "num_experts": experts,
            "top_k": r.int("num_experts_per_tok", default=8, spec_field="moe.top_k"),
            "expert_ffn_hidden_size": r.int("moe_intermediate_size", default=768,
                                            spec_field="moe.expert_ffn_hidden_size"),
        }
    return spec


def _deepseek(r: Reader, model_type: str) -> dict[str, Any]:
    # Kimi K2 (model_type kimi_k2) is the DeepSeek-V3 architecture (DeepseekV3ForCausalLM) with 384 experts.
    v3 = model_type in ("deepseek_v3", "kimi_k2")
    layers = r.layers("num_hidden_layers")
    hidden = r.int("hidden_size", spec_field="hidden_size")
    heads = r.int("num_attention_heads", spec_field="num_attention_heads")
    routed = r.int("n_routed_experts", "num_local_experts", default=256 if v3 else 64, minimum=1,
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
            # null: no query LoRA, a dense q_proj (Moonlight, Kimi-VL-A3B); absent: transformers' default
            "q_lora_rank": r.int("q_lora_rank", default=1536 if v3 else None, null=None,
                                 spec_field="mla.q_lora_rank"),
            "kv_lora_rank": r.int("kv_lora_rank", default=512, spec_field="mla.kv_lora_rank"),
            "qk_nope_head_dim": r.int("qk_nope_head_dim", default=128, spec_field="mla.qk_nope_head_dim"),
            "qk_rope_head_dim": r.int("qk_rope_head_dim", default=64, spec_field="mla.qk_rope_head_dim"),
            "v_head_dim": v_head_dim,
        },
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=4096 if v3 else 2048,
                                         spec_field="max_position_embeddings"),
        "layers": run_length(kinds),
    }
    if LayerKind.MOE in kinds:
        spec["moe"] = _deepseek_moe(r, routed, expert_ffn_default=2048 if v3 else 1407,
                                    shared_default=1 if v3 else 2, top_k_default=8 if v3 else MISSING,
                                    routing=_deepseek_routing(r, v3))
    spec["mtp_num_layers"] = r.int("num_nextn_predict_layers", default=0, minimum=0, maximum=16)
    return spec


def _deepseek_moe(r: Reader, routed: int, *, expert_ffn_default: int, shared_default: int, top_k_default: Any,
                  routing: dict[str, Any]) -> dict[str, Any]:
    """The DeepSeek MoE block (routed experts plus n_shared_experts of the same width), as DeepSeek-V2/V3,
    Kimi K2 and GLM-4.5 configure it."""
    expert_ffn = r.int("moe_intermediate_size", default=expert_ffn_default,
                       spec_field="moe.expert_ffn_hidden_size")
    # null: no shared expert (transformers builds shared_experts only when n_shared_experts is not None)
    shared = r.int("n_shared_experts", default=shared_default, null=0, minimum=0,
                   spec_field="moe.num_shared_experts")
    return {
        "num_experts": routed,
        "top_k": r.int("num_experts_per_tok", default=top_k_default, spec_field="moe.top_k"),
        "expert_ffn_hidden_size": expert_ffn,
        "num_shared_experts": shared,
        "shared_expert_ffn_hidden_size": shared * expert_ffn,
        **routing,
    }


def _glm4_moe(r: Reader, model_type: str) -> dict[str, Any]:
    """GLM-4.5 / GLM-4.5-Air (transformers Glm4MoeForCausalLM): grouped-query attention with head_dim
    wider than hidden_size / heads, Q/K/V biases (attention_bias), optional per-head QK RMSNorm
    (use_qk_norm); first_k_dense_replace dense layers, then DeepSeek-V3 MoE layers (sigmoid router with
    the expert-score correction bias, n_shared_experts shared experts); num_nextn_predict_layers MTP
    layers. Partial RoPE (partial_rotary_factor) changes no weight shape."""
    layers = r.layers("num_hidden_layers")
    routed = r.int("n_routed_experts", default=128, minimum=0, spec_field="moe.num_experts")
    first_dense = r.int("first_k_dense_replace", default=1, minimum=0)
    kinds = [LayerKind.MOE if routed and i >= first_dense else LayerKind.DENSE for i in range(layers)]
    spec: dict[str, Any] = {
        **common_dense(r),
        "ffn_hidden_size": r.int("intermediate_size", default=10944, spec_field="ffn_hidden_size"),
        "num_kv_heads": kv_heads(r, default=8),
        "head_dim": r.int("head_dim", default=128, spec_field="head_dim"),
        "tied_embeddings": r.bool("tie_word_embeddings", default=False),
        "max_position_embeddings": r.int("max_position_embeddings", default=131072,
                                         spec_field="max_position_embeddings"),
        "qkv_bias": r.bool("attention_bias", default=False),  # q/k/v_proj biased, o_proj not
        "qk_norm": r.bool("use_qk_norm", default=False),
        "layers": run_length(kinds),
    }
    if LayerKind.MOE in kinds:
        # Glm4MoeTopkRouter always scores with a sigmoid and selects with e_score_correction_bias.
        routing = _deepseek_routing(r, True) | {"score_function": "sigmoid", "expert_bias": True}
        spec["moe"] = _deepseek_moe(r, routed, expert_ffn_default=1408, shared_default=1, top_k_default=8,
                                    routing=routing)
    spec["mtp_num_layers"] = r.int("num_nextn_predict_layers", default=0, minimum=0, maximum=16)
    return spec


def _deepseek_routing(r: Reader, v3: bool) -> dict[str, Any]:
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
    key, factor = r.lookup(("routed_scaling_factor",))
    if factor is not MISSING:
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1000:
            raise r.error(key, f"expected a positive number (got {factor!r})")
        if factor != 1:
            out["topk_scaling_factor"] = float(factor)
    return out


CONVERTERS: dict[str, Converter] = {
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "glm4_moe": _glm4_moe,
}
