"""Serving physics of a vLLM-style engine: prefill and decode step times, and throughput, TTFT and
TPOT under continuous batching. Weight, KV-cache and vLLM memory accounting live in
`autoshard.costmodel.serve.memory`; their public names are re-exported here.

An *engine* is one vLLM server process group: TP x PP GPUs, or TP x PP x DP GPUs when expert
parallelism shards the MoE layers over attention data-parallel ranks (vLLM's
`--enable-expert-parallel`: EP size = TP x DP). Replicas of an engine are counted by the caller.

Facts modelled (sources in the docstrings below):
- Decode is HBM-bound at small batch (every step reads the weights and the KV cache of the batch) and
  turns compute-bound as the batch grows; prefill is compute-bound, attention grows with length squared.
  TP adds two all-reduces per layer (latency-bound for decode), PP one send per stage boundary, EP an
  all-to-all dispatch and combine per MoE layer. MoE decode reads only the experts the batch hits.
- Small TP all-reduces run on the engines' custom all-reduce kernels (vLLM, SGLang and TensorRT-LLM
  all ship one: one-shot/two-shot through peer memory over NVLink, up to 8 MiB), far faster than an
  NCCL ring at decode sizes; larger messages and PCIe engines fall back to NCCL.
- Routed experts run as one grouped GEMM per weight matrix (vLLM fused_moe, TensorRT-LLM/SGLang MoE
  kernels): one launch for all local experts, each expert's rows padded to the kernel's row block,
  weights of the experts the batch hits read once.
- Expert parallelism moves tokens only between attention-DP groups (TP ranks of one DP rank hold the
  same tokens, so EP = TP alone needs no dispatch: the combine is the TP all-reduce); FP8 models
  dispatch FP8 activations, the combine returns BF16.
- Attention data parallelism: every DP rank schedules its own requests, and all ranks meet at every MoE
  layer, so the dense part of a step waits for the rank with the most prefill tokens in it (the
  expected maximum over DP ranks of whole prompt chunks arriving at random).
- Continuous batching with chunked prefill: each step carries the decode tokens of the running requests
  plus, on average, `batch * input_len / output_len` prefill tokens (every finished request is replaced).
  With PP, vLLM keeps PP micro-batches in flight, so a token advances once every PP stage ticks.
- Every step also pays the engine's serial host work per request in it (scheduling, stop checks,
  responses: ServeConfig.host_us_per_seq, fitted on the published offline runs).

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from autoshard.costmodel.comm import Collective, Link, collective_time_s, group_link
from autoshard.costmodel.compute import (
    Gemm,
    attention_dims,
    attention_gemms,
    elementwise_bytes_per_token,
    gemm_time_s,
    mlp_gemms,
)
from autoshard.costmodel.serve.latency import NO_WAIT, LatencyQuantiles, Wait, mdc_wait
from autoshard.costmodel.serve.memory import (
    BF16,
    FP32,
    SAMPLER_FP32_COPIES,
    ServeConfig,
    ServeMemory,
    StageLayers,
    WeightBytes,
    _stage_layers,
    activation_peak_bytes,
    cuda_graph_bytes,
    cuda_graph_capture_sizes,
    default_max_num_batched_tokens,
    kv_cache_bytes_per_token,
    kv_cache_bytes_per_token_per_gpu,
    pp_layer_split,
    serve_memory,
    stage_layers,
    stage_weight_bytes,
    total_weight_bytes,
    weight_bytes_per_param,
)
from autoshard.errors import InfeasibleError
from autoshard.parallel import ParallelDims
from autoshard.specs.cluster import GpuSpec, LinkKind, PoolSpec
from autoshard.specs.job import Precision, ServeJob, WeightDtype
from autoshard.specs.model import LayerKind, ModelSpec

CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024
"""Largest message the custom all-reduce takes (vLLM `CustomAllreduce(max_size=8192 * 1024)`)."""
CUSTOM_AR_SYNC_US = (3.0, 0.36)
"""Fixed time of one custom all-reduce on TP n ranks, `a + b * n` microseconds: launch plus the
peer-flag barriers. From SGLang PR #2904's H100 measurements of the TensorRT-LLM-derived kernel
(no CUDA graph): 3.7 / 4.8 / 5.9 us at 512 B on TP 2 / 4 / 8."""
CUSTOM_AR_LINK_FRACTION = 0.135
"""Bus bandwidth the custom all-reduce reaches at <= 1 MiB, as a fraction of the NVLink figure (it runs
on a few dozen SMs, far from NVLink's peak): same measurements, 16.2 / 26.6 / 27.9 us per extra MiB
on TP 2 / 4 / 8 = ~60 GB/s of ring-equivalent bus bandwidth on 450 GB/s NVLink 4."""
ELEMENTWISE_KERNELS = {LayerKind.DENSE: 4, LayerKind.MOE: 7}
"""Memory-bound kernels one decoder layer launches besides its GEMMs, attention and collectives: the
two fused add+RMSNorms, rotary embedding and the MLP activation (vLLM `fused_add_rms_norm`,
`rotary_embedding`, `silu_and_mul`); an MoE layer adds top-k softmax, the align/permute of tokens to
experts and the weighted un-permute (vLLM `topk_softmax`, `moe_align_block_size`, `moe_sum`). Each
costs the GPU's `kernel_overhead_us` however few bytes it moves (what sets decode at small batch)."""
HOPPER_NAMES = ("H100", "H200", "GH200")
FLASH_FWD_HOPPER = (0.64, 241.0)
"""Forward flash attention on Hopper as `top * s / (s + half)` of the BF16 peak: FlashAttention-3,
head dim 128, measured on H100 by pytorch/benchmark PR #2391 (commit ff65cb67): 430 / 517 / 566 /
590 / 614 / 621 TFLOP/s at 512 / 1K / 2K / 4K / 8K / 16K tokens = 0.43-0.63 of 989. The engines'
prefill kernels on Hopper are FlashAttention-3 (vLLM, SGLang) or TensorRT-LLM's own fused MHA of the
same design."""
MOE_ROW_BLOCK = 16
"""Rows of one grouped-GEMM tile at decode sizes: each expert's tokens are padded to a multiple
(vLLM `moe_align_block_size`; the smallest BLOCK_SIZE_M of its fused_moe configs)."""

__all__ = [
    "ServeConfig",
    "StageLayers",
    "pp_layer_split",
    "stage_layers",
    "weight_bytes_per_param",
    "WeightBytes",
    "stage_weight_bytes",
    "total_weight_bytes",
    "kv_cache_bytes_per_token",
    "kv_cache_bytes_per_token_per_gpu",
    "activation_peak_bytes",
    "cuda_graph_bytes",
    "default_max_num_batched_tokens",
    "ServeMemory",
    "serve_memory",
    "StepTime",
    "step_time",
    "prefill_time",
    "ServePrediction",
    "predict_serve",
    "decode_context_len",
    "kv_limited_concurrency",
    "concurrency_ladder",
    "cuda_graph_capture_sizes",
    "tp_all_reduce_s",
    "latency_at_rate",
    "LatencyQuantiles",
    "expected_max_prefill_tokens",
    "prefill_attention_s",
    "serving_gpu",
]

# --------------------------------------------------------------------------- step time


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds of one engine step (or of a prefill), by kind of work."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    elementwise_s: float = 0.0
    logits_s: float = 0.0
    tp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    pp_comm_s: float = 0.0
    host_s: float = 0.0
    """Serial host (CPU) work of the engine's steps (ServeConfig.host_us_per_seq per request)."""

    @property
    def compute_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.logits_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.ep_comm_s + self.pp_comm_s + self.host_s

    def __add__(self, other: StepTime) -> StepTime:
        return StepTime(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def scaled(self, factor: float) -> StepTime:
        return StepTime(*(a * factor for a in self._values()))

    def _values(self) -> tuple[float, ...]:
        return (
            self.gemm_s,
            self.attention_s,
            self.elementwise_s,
            self.logits_s,
            self.tp_comm_s,
            self.ep_comm_s,
            self.pp_comm_s,
            self.host_s,
        )


@functools.lru_cache(maxsize=64)
def serving_gpu(gpu: GpuSpec) -> GpuSpec:
    """The GPU as an inference engine's GEMMs see it: the efficiency field `serve_gemm` (fitted per
    GPU type on published serving runs) in place of the training-fitted `gemm`, FP8 GEMMs at the
    training ratio gemm_fp8 / gemm. A GPU type without it keeps its training values (no serving run
    of it to learn from)."""
    eff = gpu.efficiency
    if eff.serve_gemm is None:
        return gpu
    update = {"gemm": eff.serve_gemm, "gemm_fp8": min(1.0, eff.gemm_fp8 * eff.serve_gemm / eff.gemm)}
    return gpu.model_copy(update={"efficiency": eff.model_copy(update=update)})


def _weight_only_gemm_s(g: Gemm, gpu: GpuSpec, wbytes: float) -> float:
    """A W8A16/W4A16 (Marlin-style) GEMM: BF16 math on weights read at their storage size. Same
    roofline and shape fall-off as `gemm_time_s`."""
    eff = gpu.efficiency
    smallest = min(g.m, g.n, g.k)
    math_s = (
        2.0
        * g.m
        * g.n
        * g.k
        / (gpu.bf16_tflops * 1e12 * eff.gemm * smallest / (smallest + eff.gemm_half_dim))
    )
    traffic = g.k * g.n * wbytes + (g.m * g.k + g.m * g.n) * BF16
    mem_s = traffic / (gpu.hbm_tbps * 1e12 * eff.hbm)
    return g.count * (max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6)


def _gemm_s(g: Gemm, gpu: GpuSpec, dtype: WeightDtype) -> float:
    """Linear layers in vLLM: BF16 GEMMs; FP8 weights use FP8 GEMMs on GPUs with FP8 tensor cores
    (W8A8, dynamic activation scales) and weight-only kernels elsewhere; NVFP4/MXFP4 weights use FP4
    GEMMs on GPUs with FP4 tensor cores (Blackwell) and weight-only (Marlin) kernels elsewhere;
    int8/int4 are weight-only."""
    if dtype is WeightDtype.BF16 or not g.fp8_capable:
        return gemm_time_s(g, gpu, Precision.BF16)
    if dtype is WeightDtype.FP8 and gpu.fp8_tflops:
        return gemm_time_s(g, gpu, Precision.FP8)
    if dtype.is_fp4 and gpu.fp4_tflops:
        return _fp4_gemm_s(g, gpu, weight_bytes_per_param(dtype))
    return _weight_only_gemm_s(g, gpu, weight_bytes_per_param(dtype))


def _fp4_gemm_s(g: Gemm, gpu: GpuSpec, wbytes: float) -> float:
    """A W4A4 GEMM on FP4 tensor cores (Blackwell; activations quantized to the same format on the fly):
    math at the dense FP4 peak with the FP8 GEMM efficiency (no measured FP4 fit yet), weights and
    activations read at their FP4 size, BF16 output."""
    eff = gpu.efficiency
    assert gpu.fp4_tflops is not None
    smallest = min(g.m, g.n, g.k)
    math_s = 2.0 * g.m * g.n * g.k / (gpu.fp4_tflops * 1e12 * eff.gemm_fp8 * smallest / (smallest + eff.gemm_half_dim))
    traffic = (g.k * g.n + g.m * g.k) * wbytes + g.m * g.n * BF16
    mem_s = traffic / (gpu.hbm_tbps * 1e12 * eff.hbm)
    return g.count * (max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6)


def _rows(x: float) -> int:
    return max(1, math.ceil(x - 1e-9))


def _expert_routing(model: ModelSpec, cfg: ServeConfig, tokens: float) -> tuple[float, float, int]:
    """(local experts hit, token-expert pairs on this GPU, TP shards of each expert) for `tokens`
    tokens of one DP rank. Only the experts the batch hits are read: E * (1 - (1 - k/E)^n) of them for
    n tokens routed at random."""
    assert model.moe is not None
    moe = model.moe
    e, k = moe.num_experts, moe.top_k
    if cfg.expert_parallel:
        n = tokens * cfg.dp_attention  # tokens of every DP rank meet in the MoE layer
        local = e / cfg.ep
        pairs = n * k / cfg.ep  # token-expert pairs landing on this GPU
        shards = 1
    else:
        n, local, pairs, shards = tokens, float(e), tokens * k, cfg.tp
    hit = local * (1.0 - (1.0 - k / e) ** n)
    return max(hit, 1e-9), pairs, shards


def _grouped_experts_s(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig, tokens: float) -> float:
    """Routed experts of one MoE layer on one GPU as grouped GEMMs (one kernel per weight matrix):
    the slower of the math over every hit expert's rows, padded to MOE_ROW_BLOCK, at the GEMM
    efficiency and shape fall-off of `gemm_time_s`, and the HBM traffic (hit experts' weights once,
    plus the activations in and out); one launch per matrix."""
    assert model.moe is not None
    hit, pairs, shards = _expert_routing(model, cfg, tokens)
    rows = max(pairs / hit, 1.0)
    padded = MOE_ROW_BLOCK * math.ceil(rows / MOE_ROW_BLOCK - 1e-9)
    eff = gpu.efficiency
    dtype = cfg.weight_dtype
    fp8_math = dtype is WeightDtype.FP8 and bool(gpu.fp8_tflops)
    peak, gemm_eff = (gpu.fp8_tflops * 1e12, eff.gemm_fp8) if fp8_math else (gpu.bf16_tflops * 1e12, eff.gemm)
    wbytes = weight_bytes_per_param(dtype)
    act = 1 if fp8_math else BF16
    total = 0.0
    for g in mlp_gemms(model, 1, model.moe.expert_ffn_hidden_size, shards):
        smallest = min(padded, g.n, g.k)
        shape_eff = gemm_eff * smallest / (smallest + eff.gemm_half_dim)
        math_s = 2.0 * hit * padded * g.n * g.k / (peak * shape_eff)
        traffic = hit * g.n * g.k * wbytes + pairs * (g.k * act + g.n * BF16)
        mem_s = traffic / (gpu.hbm_tbps * 1e12 * eff.hbm)
        total += max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6
    return total


def tp_all_reduce_s(
    size_bytes: float, ranks: int, link: Link, pool: PoolSpec, *, custom: bool = True
) -> float:
    """One TP all-reduce of `size_bytes` per rank: the engine's custom all-reduce when it applies
    (NVLink-class link inside one domain, message <= CUSTOM_AR_MAX_BYTES) and is faster, else NCCL."""
    nccl = collective_time_s(Collective.ALL_REDUCE, size_bytes, ranks, link)
    if (
        not custom
        or ranks <= 1
        or link.crosses_nodes
        or pool.node.intra_node_link is LinkKind.PCIE
        or size_bytes > CUSTOM_AR_MAX_BYTES
    ):
        return nccl
    a, b = CUSTOM_AR_SYNC_US
    bus = pool.node.intra_node_gbps * 1e9 * CUSTOM_AR_LINK_FRACTION
    custom_s = (a + b * ranks) * 1e-6 + 2 * (ranks - 1) / ranks * size_bytes / bus
    return min(nccl, custom_s)


def expected_max_prefill_tokens(
    prefill_tokens: float, *, ranks: int, prompt_tokens: float
) -> float:
    """Expected largest prefill load among `ranks` DP ranks in one step when each rank carries on
    average `prefill_tokens` prefill tokens that arrive as whole chunks of `prompt_tokens`: the number
    of chunks per rank is Poisson, E[max] = sum_k>=1 P(max >= k) = sum_k (1 - F(k-1)^ranks)."""
    if ranks <= 1 or prefill_tokens <= 0 or prompt_tokens <= 0:
        return prefill_tokens
    lam = prefill_tokens / prompt_tokens
    expected, cdf, term, k = 0.0, 0.0, math.exp(-lam), 0
    while True:
        cdf += term  # F(k)
        tail = 1.0 - cdf**ranks  # P(max >= k + 1)
        expected += tail
        k += 1
        term *= lam / k
        if tail < 1e-9 or k > 10_000:
            break
    return max(expected * prompt_tokens, prefill_tokens)


def _forward_attention_efficiency(gpu: GpuSpec, seq_len: float) -> float:
    """Fraction of dense BF16 peak a forward (prefill) flash-attention kernel reaches on a causal
    prompt of `seq_len` tokens: FlashAttention-3's measured curve on Hopper (FLASH_FWD_HOPPER), the
    GPU type's (training-fitted) attention efficiency elsewhere."""
    if any(tag in gpu.name for tag in HOPPER_NAMES):
        top, half = FLASH_FWD_HOPPER
        return max(top * seq_len / (seq_len + half), gpu.efficiency.attention)
    return gpu.efficiency.attention


def prefill_attention_s(model: ModelSpec, gpu: GpuSpec, *, tp: int, prompt_len: float) -> float:
    """Causal attention of one prompt's prefill on one TP rank: half the s x s square of score and
    value products at the forward flash-attention efficiency for that length."""
    qk_dim, v_dim = attention_dims(model)
    heads = model.num_attention_heads / tp
    flops = 2.0 * prompt_len * prompt_len * heads * (qk_dim + v_dim) * 0.5
    return flops / (gpu.bf16_tflops * 1e12 * _forward_attention_efficiency(gpu, prompt_len))


def _decode_attention_s(
    model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig, *, seqs: float, context_len: float
) -> float:
    """Paged decode attention of one layer: read the KV cache of `seqs` sequences of `context_len`
    tokens (HBM-bound, at the GPU's `serve_attention_hbm` when set), or the score/value math if
    larger. MLA decodes in the absorbed latent form."""
    if seqs <= 0:
        return 0.0
    kv = kv_cache_bytes_per_token_per_gpu(model, tp=cfg.tp, layers=1, dtype=cfg.kv_cache_dtype)
    heads = model.num_attention_heads / cfg.tp
    if model.mla is not None:
        dims = 2 * model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
    else:
        qk, v = attention_dims(model)
        dims = qk + v
    eff = gpu.efficiency
    hbm = eff.serve_attention_hbm if eff.serve_attention_hbm is not None else eff.hbm
    mem_s = seqs * context_len * kv / (gpu.hbm_tbps * 1e12 * hbm)
    math_s = 2.0 * seqs * context_len * heads * dims / (gpu.bf16_tflops * 1e12 * eff.attention)
    return max(mem_s, math_s) + eff.kernel_overhead_us * 1e-6


def _elementwise_bytes(model: ModelSpec, kind: LayerKind, cfg: ServeConfig) -> float:
    """HBM bytes of memory-bound kernels per token of the DP rank on one GPU: the dense layer's norms,
    residual adds and rotary embedding (`elementwise_bytes_per_token`, no sequence parallelism); for
    MoE layers the activation of the routed and shared experts this GPU runs (1/TP of the token's top-k
    expert intermediates either way) and the permute/unpermute copies of the routed hidden states."""
    dense = elementwise_bytes_per_token(
        model, LayerKind.DENSE, dims=ParallelDims(tp=cfg.tp), sequence_parallel=False
    )
    if kind is not LayerKind.MOE:
        return dense
    assert model.moe is not None
    moe = model.moe
    gates = model.mlp.num_matrices  # activation reads gate (and up), writes one output
    dense_act = gates * model.ffn_hidden_size / cfg.tp * BF16
    act = gates * (moe.top_k * moe.expert_ffn_hidden_size + moe.shared_expert_ffn_hidden_size) / cfg.tp * BF16
    copies = moe.top_k / (cfg.tp if cfg.expert_parallel else 1)
    return dense - dense_act + act + 2 * 2 * copies * model.hidden_size * BF16


def _links(pool: PoolSpec, cfg: ServeConfig) -> tuple[Link, Link, Link]:
    """TP, EP (between attention-DP groups) and PP links in vLLM's rank order (TP innermost, then PP,
    DP outermost)."""
    return (
        group_link(pool, ranks=cfg.tp),
        group_link(pool, ranks=cfg.dp_attention, stride=cfg.tp * cfg.pp),
        group_link(pool, ranks=2, stride=cfg.tp),
    )


def _layer_time(
    model: ModelSpec,
    kind: LayerKind,
    pool: PoolSpec,
    cfg: ServeConfig,
    links: tuple[Link, Link, Link],
    *,
    tokens: float,
    decode_seqs: float,
    context_len: float,
    prefills: float,
    prefill_len: int,
    expert_tokens: float | None = None,
) -> StepTime:
    """One decoder layer on one GPU: `tokens` rows through the linear layers, decode attention over
    `decode_seqs` cached sequences, and `prefills` causal prefills of `prefill_len` tokens.
    `expert_tokens` (default `tokens`): the DP rank's mean tokens the MoE layer routes when `tokens`
    is the busiest attention-DP rank's load."""
    gpu = serving_gpu(pool.gpu)
    rows = _rows(tokens)
    gemms = attention_gemms(model, rows, cfg.tp)
    if kind is LayerKind.DENSE:
        gemms += mlp_gemms(model, rows, model.ffn_hidden_size, cfg.tp)
    else:
        assert model.moe is not None
        gemms.append(Gemm(rows, model.moe.num_experts, model.hidden_size, fp8_capable=False))
        if model.moe.shared_expert_ffn_hidden_size:
            gemms += mlp_gemms(model, rows, model.moe.shared_expert_ffn_hidden_size, cfg.tp)
    gemm_s = sum(_gemm_s(g, gpu, cfg.weight_dtype) for g in gemms)
    if kind is LayerKind.MOE:
        gemm_s += _grouped_experts_s(model, gpu, cfg, expert_tokens if expert_tokens is not None else tokens)
    attn_s = _decode_attention_s(model, gpu, cfg, seqs=decode_seqs, context_len=context_len)
    if prefills > 0:
        attn_s += prefills * prefill_attention_s(model, gpu, tp=cfg.tp, prompt_len=prefill_len)
    ew_s = tokens * _elementwise_bytes(model, kind, cfg) / (gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm)
    ew_s += ELEMENTWISE_KERNELS[kind] * gpu.efficiency.kernel_overhead_us * 1e-6
    tp_link, ep_link, _ = links
    tp_s = 2 * tp_all_reduce_s(
        tokens * model.hidden_size * BF16, cfg.tp, tp_link, pool, custom=cfg.custom_all_reduce
    )
    ep_s = 0.0
    if kind is LayerKind.MOE and cfg.expert_parallel and cfg.dp_attention > 1:
        assert model.moe is not None
        routed = expert_tokens if expert_tokens is not None else tokens
        moved = routed * model.moe.top_k * model.hidden_size / cfg.tp
        dispatch = 1 if cfg.weight_dtype is WeightDtype.FP8 else BF16
        ep_s = sum(
            collective_time_s(Collective.ALL_TO_ALL, moved * b, cfg.dp_attention, ep_link)
            for b in (dispatch, BF16)
        )
    return StepTime(gemm_s=gemm_s, attention_s=attn_s, elementwise_s=ew_s, tp_comm_s=tp_s, ep_comm_s=ep_s)


def _edge_time(
    model: ModelSpec,
    st: StageLayers,
    pool: PoolSpec,
    cfg: ServeConfig,
    links: tuple[Link, Link, Link],
    *,
    tokens: float,
    logit_rows: float,
) -> StepTime:
    """Embedding lookup on the first stage; output projection, logit gather and sampling on the last."""
    gpu = serving_gpu(pool.gpu)
    bw = gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm
    ew = 0.0
    logits = tp = 0.0
    if st.embedding:
        ew += (
            tokens
            * elementwise_bytes_per_token(model, LayerKind.EMBEDDING, dims=cfg.dims, sequence_parallel=False)
            / bw
        )
    if st.output and logit_rows > 0:
        rows = _rows(logit_rows)
        vocab_local = -(-model.vocab_size // cfg.tp)
        logits = gemm_time_s(Gemm(rows, vocab_local, model.hidden_size), gpu, Precision.BF16)
        logits += rows * model.vocab_size * FP32 * SAMPLER_FP32_COPIES / bw
        tp = collective_time_s(Collective.ALL_GATHER, rows * model.vocab_size * BF16, cfg.tp, links[0])
    return StepTime(elementwise_s=ew, logits_s=logits, tp_comm_s=tp)


def step_time(
    model: ModelSpec,
    pool: PoolSpec,
    cfg: ServeConfig,
    *,
    decode_seqs: float,
    prefill_tokens: float,
    prefills: float,
    prefill_len: int,
    context_len: float,
) -> StepTime:
    """One tick of the engine: every pipeline stage works on its own micro-batch of `decode_seqs`
    decode tokens plus `prefill_tokens` prefill tokens (`prefills` prompts' worth of attention); the
    slowest stage sets the tick, plus the activation send to the next stage."""
    links = _links(pool, cfg)
    tokens = decode_seqs + prefill_tokens
    busiest, busiest_prefills = tokens, prefills
    if cfg.dp_attention > 1 and prefill_tokens > 0:
        chunk = min(prefill_len, cfg.max_num_batched_tokens)
        worst_prefill = expected_max_prefill_tokens(
            prefill_tokens, ranks=cfg.dp_attention, prompt_tokens=chunk
        )
        busiest = decode_seqs + worst_prefill
        busiest_prefills = prefills * worst_prefill / prefill_tokens
    per_kind = {
        kind: _layer_time(
            model,
            kind,
            pool,
            cfg,
            links,
            tokens=busiest,
            decode_seqs=decode_seqs,
            context_len=context_len,
            prefills=busiest_prefills,
            prefill_len=prefill_len,
            expert_tokens=tokens,
        )
        for kind in _decoder_kinds(model)
    }
    worst: StepTime | None = None
    for st in _stage_layers(model, cfg.pp):
        t = _edge_time(model, st, pool, cfg, links, tokens=busiest, logit_rows=decode_seqs + busiest_prefills)
        for kind, n in ((LayerKind.DENSE, st.dense), (LayerKind.MOE, st.moe)):
            if n:
                t = t + per_kind[kind].scaled(n)
        if worst is None or t.total_s > worst.total_s:
            worst = t
    assert worst is not None
    if cfg.pp > 1:
        hop = collective_time_s(Collective.P2P, tokens * model.hidden_size * BF16, 2, links[2])
        worst = replace(worst, pp_comm_s=hop)
    return replace(worst, host_s=cfg.host_us_per_seq * 1e-6 * (decode_seqs + prefills))


def _decoder_kinds(model: ModelSpec) -> list[LayerKind]:
    kinds = [LayerKind.DENSE] if model.num_layers > model.num_moe_layers else []
    return kinds + ([LayerKind.MOE] if model.num_moe_layers else [])


def prefill_time(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, *, prompt_len: int) -> StepTime:
    """A prompt alone through the engine: chunks of max_num_batched_tokens tokens, every stage in turn
    (the pipeline does not overlap the chunks of one prompt), one activation send per stage boundary."""
    links = _links(pool, cfg)
    chunks = math.ceil(prompt_len / cfg.max_num_batched_tokens)
    chunk = prompt_len / chunks
    per_kind = {
        kind: _layer_time(
            model,
            kind,
            pool,
            cfg,
            links,
            tokens=chunk,
            decode_seqs=0,
            context_len=0,
            prefills=1.0 / chunks,
            prefill_len=prompt_len,
        ).scaled(chunks)
        for kind in _decoder_kinds(model)
    }
    total = StepTime()
    for st in _stage_layers(model, cfg.pp):
        total = total + _edge_time(model, st, pool, cfg, links, tokens=prompt_len, logit_rows=1)
        for kind, n in ((LayerKind.DENSE, st.dense), (LayerKind.MOE, st.moe)):
            if n:
                total = total + per_kind[kind].scaled(n)
    if cfg.pp > 1:
        hop = collective_time_s(Collective.P2P, chunk * model.hidden_size * BF16, 2, links[2])
        total = replace(total, pp_comm_s=(cfg.pp - 1) * chunks * hop)
    return replace(total, host_s=cfg.host_us_per_seq * 1e-6 * chunks)


# --------------------------------------------------------------------------- prediction


def decode_context_len(job: ServeJob) -> float:
    """Mean context a decode step attends to: the prompt plus half the output."""
    return job.input_len + job.output_len / 2


@dataclass(frozen=True, slots=True)
class ServePrediction:
    """One engine at a fixed concurrency, in steady state."""

    config: ServeConfig
    concurrency: int
    """Running requests per DP rank."""
    memory: ServeMemory
    decode: StepTime
    """Breakdown of one TPOT (PP ticks of the slowest stage, prefill share included)."""
    prefill: StepTime
    """The prompt's own prefill work (the TTFT floor)."""
    tpot_s: float
    """Mean TPOT at this concurrency (also its p50: a request's TPOT averages hundreds of steps)."""
    ttft_s: float
    """p50 TTFT at this concurrency: the prompt's own prefill chunks riding the running decodes and the
    wait behind other prompts in the step's token budget (closed loop: a request arrives as another
    leaves, at a step boundary; `at_rate` adds the alignment of random arrivals)."""
    throughput_tokens_per_s: float
    """Output tokens/s of the engine (all its DP ranks)."""
    input_len: int
    output_len: int
    ttft_p90_s: float | None = None
    """p90 of TTFT at this concurrency (closed loop: chunked-prefill interference, no slot queue);
    `ttft_s` is the p50. None only when built by hand."""
    tpot_p90_s: float | None = None
    """p90 of one request's mean TPOT at this concurrency; `tpot_s` is the mean."""
    latency: LatencyQuantiles | None = None
    """p50/p90 breakdown at this concurrency (closed loop)."""
    at_rate: LatencyQuantiles | None = None
    """TTFT/TPOT at the open-loop request rate passed as `arrival_rate` (Poisson arrivals)."""

    @property
    def gpus(self) -> int:
        return self.config.gpus

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.throughput_tokens_per_s / self.gpus

    @property
    def requests_per_s(self) -> float:
        return self.throughput_tokens_per_s / self.output_len

    @property
    def max_concurrency(self) -> float:
        return self.memory.max_concurrency


def kv_limited_concurrency(memory: ServeMemory, job: ServeJob) -> int:
    """Requests whose whole prompt + output fit in the KV cache at once (no preemption)."""
    return memory.kv_cache_tokens // (job.input_len + job.output_len)


def predict_serve(
    model: ModelSpec,
    pool: PoolSpec,
    job: ServeJob,
    cfg: ServeConfig,
    *,
    concurrency: int | None = None,
    memory: ServeMemory | None = None,
    prefill: StepTime | None = None,
    arrival_rate: float | None = None,
) -> ServePrediction:
    """Throughput, TPOT and TTFT of one engine running `concurrency` requests per DP rank (default: as
    many as max_num_seqs and the KV cache allow), with p90s (closed loop at that concurrency); with
    `arrival_rate` (requests/s into the engine) also the latencies at that open-loop load (`at_rate`).
    Raises InfeasibleError when the engine cannot start."""
    mem = memory or serve_memory(model, pool.gpu, cfg, context_len=job.context_len)
    problem = mem.problem()
    if problem:
        raise InfeasibleError(
            f"{model.name} on {cfg.gpus}x {pool.gpu.name} (TP{cfg.tp} PP{cfg.pp}): {problem}"
        )
    limit = min(cfg.max_num_seqs, kv_limited_concurrency(mem, job))
    if limit < 1:
        raise InfeasibleError(
            f"the KV cache holds {mem.kv_cache_tokens} tokens, less than one request of "
            f"{job.input_len + job.output_len} tokens"
        )
    batch = limit if concurrency is None else max(1, min(concurrency, limit))
    per_mb = batch / cfg.pp
    ctx = decode_context_len(job)
    tick = step_time(
        model,
        pool,
        cfg,
        decode_seqs=per_mb,
        prefill_tokens=per_mb * job.input_len / job.output_len,
        prefills=per_mb / job.output_len,
        prefill_len=job.input_len,
        context_len=ctx,
    )
    decode = tick.scaled(cfg.pp)
    tpot = decode.total_s
    if prefill is None:
        prefill = prefill_time(model, pool, cfg, prompt_len=job.input_len)
    # TTFT: the prompt's own chunks, each riding one step of the other running requests' decodes.
    chunks = math.ceil(job.input_len / cfg.max_num_batched_tokens)
    others = (batch - 1) / cfg.pp
    ride = 0.0
    if others > 0:
        ride = (
            chunks
            * cfg.pp
            * step_time(
                model,
                pool,
                cfg,
                decode_seqs=others,
                prefill_tokens=0,
                prefills=0,
                prefill_len=job.input_len,
                context_len=ctx,
            ).total_s
        )
    ttft = prefill.total_s + ride
    decode_only = _decode_tpot_s(model, pool, cfg, per_mb=per_mb, ctx=ctx)
    closed = _latency(
        job,
        cfg,
        running=batch,
        tpot_s=tpot,
        tpot_decode_s=decode_only,
        ttft_s=ttft,
        step_s=tick.total_s,
        align_s=0.0,
        rate=batch / (job.output_len * tpot),
        slot_wait=NO_WAIT,
        utilization=1.0,
        closed_loop=True,
    )
    at_rate = None
    if arrival_rate is not None:
        at_rate = latency_at_rate(
            model, pool, job, cfg, concurrency=batch, arrival_rate=arrival_rate, prefill=prefill
        )
    return ServePrediction(
        config=cfg,
        concurrency=batch,
        memory=mem,
        decode=decode,
        prefill=prefill,
        tpot_s=tpot,
        ttft_s=closed.ttft_p50_s,
        throughput_tokens_per_s=batch * cfg.dp_attention / tpot,
        input_len=job.input_len,
        output_len=job.output_len,
        ttft_p90_s=closed.ttft_p90_s,
        tpot_p90_s=closed.tpot_p90_s,
        latency=closed,
        at_rate=at_rate,
    )


def _decode_tpot_s(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, *, per_mb: float, ctx: float) -> float:
    """TPOT of pure decode steps (no prefill chunk in them)."""
    return cfg.pp * step_time(
        model, pool, cfg, decode_seqs=per_mb, prefill_tokens=0, prefills=0, prefill_len=1, context_len=ctx
    ).total_s


def _latency(
    job: ServeJob,
    cfg: ServeConfig,
    *,
    running: float,
    tpot_s: float,
    tpot_decode_s: float,
    ttft_s: float,
    step_s: float,
    align_s: float,
    rate: float,
    slot_wait: Wait,
    utilization: float,
    closed_loop: bool = False,
) -> LatencyQuantiles:
    """p50/p90 of TTFT and TPOT for one DP rank running `running` requests that arrive at `rate`
    requests/s. The prefill lane: one step's token budget left after the decode tokens holds
    `budget // input_len` prompts (or one prompt's chunk), each prompt taking `chunks` steps."""
    per_mb = running / cfg.pp
    free = cfg.max_num_batched_tokens - per_mb
    if free <= 0:
        free = cfg.max_num_batched_tokens
    if free >= job.input_len:
        lanes, chunks = int(free // job.input_len), 1
    else:
        lanes, chunks = 1, math.ceil(job.input_len / free)
    prefill_wait = mdc_wait(rate, chunks * step_s, lanes)
    if closed_loop:
        # A closed loop holds `running` requests: at worst a prompt waits behind all the others'
        # prefills. When the budget cannot keep up (the engine is prefill-bound), or the open-queue
        # wait exceeds that, the wait is exponential with half that worst case as its mean.
        worst = max(running - 1, 0.0) * chunks * step_s / lanes
        if prefill_wait.unstable or prefill_wait.mean_s > worst / 2:
            prefill_wait = Wait(1.0, 2.0 / worst) if worst > 0 else NO_WAIT
    extra = max(tpot_s - tpot_decode_s, 0.0)
    return LatencyQuantiles.combine(
        prefill_s=ttft_s,
        align_s=align_s,
        slot_wait=slot_wait,
        prefill_wait=prefill_wait,
        tpot_decode_s=min(tpot_decode_s, tpot_s),
        tpot_per_prompt_s=extra / running if running > 0 else 0.0,
        prompts_per_life=running,
        running=running,
        utilization=utilization,
    )


def latency_at_rate(
    model: ModelSpec,
    pool: PoolSpec,
    job: ServeJob,
    cfg: ServeConfig,
    *,
    concurrency: int,
    arrival_rate: float,
    prefill: StepTime | None = None,
) -> LatencyQuantiles:
    """TTFT and TPOT (p50, p90, mean) of one engine fed `arrival_rate` requests/s (Poisson, open
    loop), spread evenly over its DP ranks, with at most `concurrency` running per DP rank.

    The running count N per DP rank solves Little's law N = lambda x (TTFT(N) + output_len x TPOT(N))
    by bisection (step times at N running requests, prefill share lambda x input_len per second);
    requests beyond `concurrency` wait for a slot (M/D/c over the slots). Above capacity the waits
    are infinite and `utilization` >= 1."""
    if arrival_rate <= 0:
        raise ValueError(f"arrival_rate must be positive, got {arrival_rate}")
    lam = arrival_rate / cfg.dp_attention
    ctx = decode_context_len(job)
    if prefill is None:
        prefill = prefill_time(model, pool, cfg, prompt_len=job.input_len)
    chunks = math.ceil(job.input_len / cfg.max_num_batched_tokens)

    def step(decode_seqs: float, prompts: float) -> float:
        return step_time(
            model,
            pool,
            cfg,
            decode_seqs=decode_seqs,
            prefill_tokens=prompts * job.input_len,
            prefills=prompts,
            prefill_len=job.input_len,
            context_len=ctx,
        ).total_s

    def times(n: float) -> tuple[float, float, float, float]:
        """(TPOT, own prefill + ride, tick, pure-decode TPOT) at n running requests per DP rank."""
        per_mb = n / cfg.pp
        tick = step(per_mb, 0.0)
        for _ in range(3):  # prompts admitted per tick (lam x tick) add their prefill to the tick
            tick = step(per_mb, lam * tick)
        others = max(n - 1, 0.0) / cfg.pp
        ride = chunks * cfg.pp * step(others, 0.0) if others > 0 else 0.0
        decode_only = _decode_tpot_s(model, pool, cfg, per_mb=per_mb, ctx=ctx)
        return cfg.pp * tick, prefill.total_s + ride, tick, decode_only

    n = float(concurrency)
    tpot, ttft, tick, dec = times(n)
    saturated = lam * (ttft + job.output_len * tpot) >= concurrency
    if not saturated:
        lo, hi = 0.0, float(concurrency)
        for _ in range(30):  # N - lam * stay(N) is increasing in N: bisect its root
            mid = (lo + hi) / 2
            t_mid, f_mid, _, _ = times(max(mid, 1e-6))
            if mid - lam * (f_mid + job.output_len * t_mid) < 0:
                lo = mid
            else:
                hi = mid
        n = max(hi, 1e-6)
        tpot, ttft, tick, dec = times(n)
    stay = ttft + job.output_len * tpot
    slot_wait = mdc_wait(lam, stay, concurrency)
    return _latency(
        job,
        cfg,
        running=n,
        tpot_s=tpot,
        tpot_decode_s=dec,
        ttft_s=ttft,
        step_s=tick,
        align_s=tick,
        rate=lam,
        slot_wait=slot_wait,
        utilization=lam * stay / concurrency,
    )


def concurrency_ladder(limit: int) -> list[int]:
    """Concurrencies worth tabulating up to `limit`: powers of two, their 1.5x, and the limit itself."""
    out = set()
    b = 1
    while b <= limit:
        out.add(b)
        if b * 3 // 2 <= limit and b >= 2:
            out.add(b * 3 // 2)
        b *= 2
    out.add(limit)
    return sorted(x for x in out if x >= 1)
