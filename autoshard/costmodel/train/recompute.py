"""Megatron-Core's selective recompute by module (`--recompute-granularity selective
--recompute-modules ...`): what each module's recomputation saves in activation memory and costs in
extra forward work, per micro-batch on one GPU.

Modules (Megatron-Core TransformerConfig.recompute_modules; the default is ["core_attn"]):
  core_attn       the attention core (with flash attention it keeps no s x s scores: no memory effect;
                  its forward re-runs in backward)
  layernorm       the two norms: their outputs (the inputs of QKV and of the MLP) are not kept
  mlp             the dense MLP of dense layers: its intermediates are not kept
  moe_act         the routed experts' activation function: its output is not kept
  shared_experts  the shared experts' MLP
  moe             the whole MoE block: router, dispatch, experts and combine (supersedes moe_act and
                  shared_experts; re-runs the token all-to-all)
  mla_up_proj     MLA's query/key/value up-projections: Q, K and V are not kept, the latents are
The saved tensors are those `memory.layer_activation_bytes` counts for the layer (same names), so the
two stay consistent; the extra time is the forward of the recomputed GEMMs (`compute.gemm_time_s`) or
the element-wise passes at the HBM efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.costmodel.attention import fp8_attention_s
from autoshard.costmodel.compute import attention_time_s, gemm_time_s, moe_block_recompute_s
from autoshard.costmodel.flops import Gemm, layer_gemms, mlp_gemms
from autoshard.costmodel.train.memory import layer_activation_bytes
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import Precision
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = ["RECOMPUTE_MODULES", "ModuleRecompute", "module_recompute"]

RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
BF16 = 2


@dataclass(frozen=True, slots=True)
class ModuleRecompute:
    saved_bytes: float
    """Activation bytes no longer kept for backward (relative to keeping everything)."""
    extra_s: float
    """Forward work re-run in backward."""
    extra_comm_s_fraction: float
    """Fraction of the layer's expert-parallel traffic that runs once more (the `moe` module)."""
    attention_recomputed: bool
    """Whether the attention core is among the modules (Megatron's default selective recompute)."""


def module_recompute(
    model: ModelSpec, kind: LayerKind, modules: tuple[str, ...], *, gpu: GpuSpec, dims: ParallelDims,
    micro_batch_size: int, seq_len: int, sequence_parallel: bool, precision: Precision, fp8_attention: bool = False,
) -> ModuleRecompute:
    """Savings and cost of recomputing `modules` in one decoder layer of `kind` (fp8_attention: the attention
    core a module list leaves out runs in FP8, costmodel.attention.fp8_attention_s)."""
    tokens = micro_batch_size * seq_len // dims.cp
    h, tp = model.hidden_size, dims.tp
    rep = tp if sequence_parallel else 1
    hbm = gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm
    mats = model.mlp.num_matrices
    saved = extra = 0.0
    comm = 0.0
    mods = set(modules)
    if "layernorm" in mods:
        saved += tokens * 2 * BF16 * h / rep
        extra += tokens * 2 * 2 * BF16 * h / rep / hbm  # read the input, write the output, twice
    if "mla_up_proj" in mods and model.mla is not None:
        m = model.mla
        heads = model.num_attention_heads / tp
        q = heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        kv_up = heads * (m.qk_nope_head_dim + m.v_head_dim)
        saved += tokens * BF16 * (q + q + kv_up)
        ups = [Gemm(tokens, int(q), m.q_lora_rank or h), Gemm(tokens, int(kv_up), m.kv_lora_rank)]
        extra += sum(gemm_time_s(g, gpu, precision) for g in ups)
    if kind is LayerKind.DENSE and "mlp" in mods:
        saved += tokens * BF16 * mats * model.ffn_hidden_size / tp
        extra += sum(gemm_time_s(g, gpu, precision) for g in mlp_gemms(model, tokens, model.ffn_hidden_size, tp))
    if kind is LayerKind.MOE and model.moe is not None:
        moe = model.moe
        routed = moe.top_k * dims.expert_tp / tp  # token-expert pairs per token of this rank
        ffn_local = moe.expert_ffn_hidden_size / dims.expert_tp
        shared = moe.shared_expert_ffn_hidden_size
        if "moe" in mods:
            # the MoE block's physics is memory's and compute's recompute_moe (validated on the
            # Megatron-MoE-ModelZoo runs that recompute it): what it no longer keeps, what re-runs
            act = dict(dims=dims, micro_batch_size=micro_batch_size, seq_len=seq_len, recompute=Recompute.SELECTIVE,
                       sequence_parallel=sequence_parallel,
                       fp8=precision is Precision.FP8 and gpu.fp8_tflops is not None,
                       fp4=precision is Precision.FP4 and gpu.fp4_tflops is not None)
            saved += layer_activation_bytes(model, kind, **act) - layer_activation_bytes(
                model, kind, recompute_moe=True, **act)
            extra += moe_block_recompute_s(model, layer_gemms(model, kind, tokens=tokens, dims=dims), tokens=tokens,
                                           dims=dims, gpu=gpu, precision=precision)
            comm = 0.5  # dispatch + combine once more: forward, backward, and now the recompute
        else:
            if "moe_act" in mods:
                saved += tokens * routed * BF16 * ffn_local  # the activation output (down-proj input)
                extra += tokens * routed * ffn_local * BF16 * (mats + 1) / hbm
            if "shared_experts" in mods and shared:
                saved += tokens * BF16 * mats * shared / tp
                extra += sum(gemm_time_s(g, gpu, precision) for g in mlp_gemms(model, tokens, shared, tp))
    attention = "core_attn" in mods
    if not attention:
        # Megatron's selective default recomputes the attention core; a module list without it does not
        if fp8_attention:
            extra -= fp8_attention_s(model, tokens=tokens, seq_len=seq_len, dims=dims, gpu=gpu)[0]
        else:
            extra -= attention_time_s(model, tokens=tokens, seq_len=seq_len, dims=dims, gpu=gpu, precision=precision)
    return ModuleRecompute(saved_bytes=saved, extra_s=extra, extra_comm_s_fraction=comm, attention_recomputed=attention)


def module_recompute_flops(model: ModelSpec, kind: LayerKind, modules: tuple[str, ...], *, tokens: int,
                           seq_len: int) -> float:
    """Forward FLOPs (whole layer, all ranks) that selective recompute of `modules` re-runs for `tokens`
    tokens: the attention core (core_attn), the dense MLP (mlp), the MoE block with router and shared
    experts (moe) or only the shared experts, and MLA's up-projections (mla_up_proj). Element-wise
    modules (layernorm, moe_act) do no GEMM work."""
    from autoshard.costmodel.flops import attention_dims

    mods = set(modules) or {"core_attn"}
    h = model.hidden_size
    mats = model.mlp.num_matrices
    flops = 0.0
    if "core_attn" in mods:
        qk_dim, v_dim = attention_dims(model)
        flops += 2.0 * tokens * seq_len * model.num_attention_heads * (qk_dim + v_dim)
    if "mla_up_proj" in mods and model.mla is not None:
        m = model.mla
        heads = model.num_attention_heads
        flops += 2.0 * tokens * heads * ((m.qk_nope_head_dim + m.qk_rope_head_dim) * (m.q_lora_rank or h)
                                         + (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank)
    if kind is LayerKind.DENSE and "mlp" in mods:
        flops += 2.0 * tokens * mats * h * model.ffn_hidden_size
    if kind is LayerKind.MOE and model.moe is not None:
        moe = model.moe
        shared = 2.0 * tokens * mats * h * moe.shared_expert_ffn_hidden_size
        if "moe" in mods:
            flops += 2.0 * tokens * (moe.top_k * mats * h * moe.expert_ffn_hidden_size + h * moe.num_experts) + shared
        elif "shared_experts" in mods:
            flops += shared
    return flops
