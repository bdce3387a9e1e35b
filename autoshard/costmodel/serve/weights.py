"""Bytes per GPU of a served model's weights (per storage dtype, per pipeline stage, TP/EP sharded)
and of its KV cache per token.

Facts modelled:
- KV cache per token `2 * layers * kv_heads * head_dim * bytes`; with TP > kv_heads each rank keeps
  one head (replicated); MLA caches the latent `kv_lora_rank + qk_rope_head_dim` per layer, and every
  TP rank keeps the whole latent (vLLM replicates it; decode context parallelism would shard it).

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.costmodel.serve.config import StageLayers
from autoshard.specs.job import WeightDtype
from autoshard.specs.layers import AttentionKind, NormKind
from autoshard.specs.model import ModelSpec

__all__ = [
    "weight_bytes_per_param",
    "WeightBytes",
    "stage_weight_bytes",
    "total_weight_bytes",
    "kv_cache_bytes_per_token",
    "kv_cache_bytes_per_token_per_gpu",
]

BF16 = 2
INT4_GROUP_SCALE_BYTES = 2.0 / 128
"""AWQ/GPTQ int4 keeps one 16-bit scale per group of 128 weights."""

# --------------------------------------------------------------------------- weights


def weight_bytes_per_param(dtype: WeightDtype) -> float:
    """Storage per quantized linear weight, group scales included."""
    return dtype.bytes_per_param + (INT4_GROUP_SCALE_BYTES if dtype is WeightDtype.INT4 else 0.0)


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Weight bytes one GPU of a pipeline stage holds."""

    embedding: float = 0.0
    attention: float = 0.0
    mlp: float = 0.0
    experts: float = 0.0
    output: float = 0.0

    @property
    def total(self) -> float:
        return self.embedding + self.attention + self.mlp + self.experts + self.output


def _kv_heads_local(model: ModelSpec, tp: int) -> float:
    """KV heads one TP rank holds: at least one (heads replicate when TP > kv_heads)."""
    return max(model.kv_heads / tp, 1.0)


def _attention_weight_bytes(model: ModelSpec, tp: int, wbytes: float) -> float:
    h, nh = model.hidden_size, model.num_attention_heads
    norm = 2 if model.norm is NormKind.LAYERNORM else 1
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q_in = m.q_lora_rank or h
        replicated = (h * m.q_lora_rank if m.q_lora_rank else 0) + h * (m.kv_lora_rank + m.qk_rope_head_dim)
        sharded = (
            q_in * nh * qk + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim) + nh * m.v_head_dim * h
        )
        norms = norm * (m.kv_lora_rank + (m.q_lora_rank or 0))
        return (replicated + sharded / tp) * wbytes + norms * BF16
    d = model.kv_channels
    kv_local = _kv_heads_local(model, tp)
    linear = h * (nh / tp + 2 * kv_local) * d + nh / tp * d * h
    bias = 0.0
    if model.linear_bias or model.qkv_bias:
        bias = (nh / tp + 2 * kv_local) * d + (h if model.linear_bias else 0)
    extra = bias + (2 * d if model.qk_norm else 0)
    return linear * wbytes + extra * BF16


def stage_weight_bytes(
    model: ModelSpec, stage: StageLayers, *, tp: int, ep: int, weight_dtype: WeightDtype, pp: int = 1,
    moe_tp: int | None = None, expert_tp: int | None = None,
) -> WeightBytes:
    """Weights of one GPU of `stage`. Linear layers are stored at `weight_dtype`; embedding, output
    projection, norms and MoE routers stay BF16 (vLLM quantizes neither the embedding nor lm_head).
    Routed experts are split over the EP ranks with expert parallelism, else TP-sharded.
    `moe_tp` (default `tp`): the ranks the dense MLPs, the shared and routed experts and the output
    projection are TP-sharded over, where they differ from the attention's (SGLang's attention DP
    with tensor-parallel experts, `ServeConfig.moe_tp`); the attention and the embedding stay at `tp`.
    `expert_tp` (default `moe_tp`): the ranks the routed experts alone are TP-sharded over (vLLM's DP
    without expert parallelism: TP x DP, `ServeConfig.expert_tp`)."""
    wb = weight_bytes_per_param(weight_dtype)
    ffn = moe_tp or tp
    h = model.hidden_size
    layer_norms = 2 * (2 if model.norm is NormKind.LAYERNORM else 1) * h * BF16
    attn = _attention_weight_bytes(model, tp, wb) + layer_norms
    embedding = output = mlp = experts = 0.0
    if stage.embedding:
        embedding = model.embedding_params() / tp * BF16
    if stage.output:
        proj = model.vocab_size * h if (not model.tied_embeddings or pp > 1) else 0
        output = (
            proj / ffn + (model.output_params() - (0 if model.tied_embeddings else model.vocab_size * h))
        ) * BF16
    mlp += stage.dense * model.mlp_params(model.ffn_hidden_size) / ffn * wb
    if stage.moe:
        assert model.moe is not None
        moe = model.moe
        router = h * moe.num_experts * BF16
        shared = model.shared_expert_params() / ffn * wb
        routed = moe.num_experts * model.expert_params() / (ep if ep > 1 else expert_tp or ffn) * wb
        mlp += stage.moe * (router + shared)
        experts = stage.moe * routed
    return WeightBytes(
        embedding=embedding, attention=attn * stage.decoders, mlp=mlp, experts=experts, output=output
    )


def total_weight_bytes(model: ModelSpec, weight_dtype: WeightDtype) -> float:
    """Bytes of one full copy of the weights (no sharding, no replication)."""
    return stage_weight_bytes(
        model,
        StageLayers(
            dense=model.num_layers - model.num_moe_layers,
            moe=model.num_moe_layers,
            embedding=True,
            output=True,
        ),
        tp=1,
        ep=1,
        weight_dtype=weight_dtype,
    ).total


# --------------------------------------------------------------------------- KV cache


def _kv_bytes_per_layer(model: ModelSpec, dtype: WeightDtype, kv_heads: float) -> float:
    b = dtype.bytes_per_param
    if model.attention is AttentionKind.MLA:
        assert model.mla is not None
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * b
    return 2 * kv_heads * model.kv_channels * b


def kv_cache_bytes_per_token(model: ModelSpec, dtype: WeightDtype = WeightDtype.BF16) -> float:
    """KV-cache bytes of one token for the whole model, counted once (no TP replication):
    `2 * layers * kv_heads * head_dim * bytes`, or `layers * (kv_lora_rank + qk_rope_head_dim) * bytes`
    for MLA."""
    return model.num_layers * _kv_bytes_per_layer(model, dtype, model.kv_heads)


def kv_cache_bytes_per_token_per_gpu(model: ModelSpec, *, tp: int, layers: int, dtype: WeightDtype) -> float:
    """KV-cache bytes one GPU stores per token for its `layers` decoder layers. GQA heads are split
    over TP, at least one per rank; the MLA latent is kept whole on every TP rank."""
    return layers * _kv_bytes_per_layer(model, dtype, _kv_heads_local(model, tp))
