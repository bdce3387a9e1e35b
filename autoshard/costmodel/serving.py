"""Serving physics of a vLLM-style engine: prefill and decode step times, and throughput, TTFT and
TPOT under continuous batching. Weight, KV-cache and vLLM memory accounting live in
`autoshard.costmodel.serving_memory`; their public names are re-exported here.

An *engine* is one vLLM server process group: TP x PP GPUs, or TP x PP x DP GPUs when expert
parallelism shards the MoE layers over attention data-parallel ranks (vLLM's
`--enable-expert-parallel`: EP size = TP x DP). Replicas of an engine are counted by the caller.

Facts modelled (sources in the docstrings below):
- Decode is HBM-bound at small batch (every step reads the weights and the KV cache of the batch) and
  turns compute-bound as the batch grows; prefill is compute-bound, attention grows with length squared.
  TP adds two all-reduces per layer (latency-bound for decode), PP one send per stage boundary, EP an
  all-to-all dispatch and combine per MoE layer. MoE decode reads only the experts the batch hits.
- Continuous batching with chunked prefill: each step carries the decode tokens of the running requests
  plus, on average, `batch * input_len / output_len` prefill tokens (every finished request is replaced).
  With PP, vLLM keeps PP micro-batches in flight, so a token advances once every PP stage ticks.

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autoshard.costmodel.comm import Collective, Link, collective_time_s, group_link
from autoshard.costmodel.compute import (
    Gemm,
    attention_dims,
    attention_gemms,
    attention_time_s,
    elementwise_bytes_per_token,
    gemm_time_s,
    mlp_gemms,
)
from autoshard.costmodel.serving_memory import (
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
from autoshard.specs.cluster import GpuSpec, PoolSpec
from autoshard.specs.job import Precision, ServeJob, WeightDtype
from autoshard.specs.model import LayerKind, ModelSpec

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

    @property
    def compute_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.logits_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.ep_comm_s + self.pp_comm_s

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
        )


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


def _moe_expert_gemms(model: ModelSpec, cfg: ServeConfig, tokens: float) -> list[Gemm]:
    """Routed-expert GEMMs one GPU runs for `tokens` tokens of its DP rank. Only the experts the batch
    hits are read: E * (1 - (1 - k/E)^n) of them for n tokens routed at random."""
    assert model.moe is not None
    moe = model.moe
    e, k = moe.num_experts, moe.top_k
    if cfg.expert_parallel:
        n = tokens * cfg.dp_attention  # tokens of every DP rank meet in the MoE layer
        local = e / cfg.ep
        pairs = tokens * k / cfg.tp  # token-expert pairs landing on this GPU
        shards = 1
    else:
        n, local, pairs, shards = tokens, float(e), tokens * k, cfg.tp
    hit = local * (1.0 - (1.0 - k / e) ** n)
    count = max(1, round(hit))
    return mlp_gemms(model, _rows(pairs / count), moe.expert_ffn_hidden_size, shards, count=count)


def _decode_attention_s(
    model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig, *, seqs: float, context_len: float
) -> float:
    """Paged decode attention of one layer: read the KV cache of `seqs` sequences of `context_len`
    tokens (HBM-bound), or the score/value math if larger. MLA decodes in the absorbed latent form."""
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
    mem_s = seqs * context_len * kv / (gpu.hbm_tbps * 1e12 * eff.hbm)
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
    """TP, EP and PP links in vLLM's rank order (TP innermost, then PP, DP outermost)."""
    return (
        group_link(pool, ranks=cfg.tp),
        group_link(pool, ranks=cfg.ep, stride=cfg.pp),
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
) -> StepTime:
    """One decoder layer on one GPU: `tokens` rows through the linear layers, decode attention over
    `decode_seqs` cached sequences, and `prefills` causal prefills of `prefill_len` tokens."""
    gpu = pool.gpu
    rows = _rows(tokens)
    gemms = attention_gemms(model, rows, cfg.tp)
    if kind is LayerKind.DENSE:
        gemms += mlp_gemms(model, rows, model.ffn_hidden_size, cfg.tp)
    else:
        assert model.moe is not None
        gemms.append(Gemm(rows, model.moe.num_experts, model.hidden_size, fp8_capable=False))
        if model.moe.shared_expert_ffn_hidden_size:
            gemms += mlp_gemms(model, rows, model.moe.shared_expert_ffn_hidden_size, cfg.tp)
        gemms += _moe_expert_gemms(model, cfg, tokens)
    gemm_s = sum(_gemm_s(g, gpu, cfg.weight_dtype) for g in gemms)
    attn_s = _decode_attention_s(model, gpu, cfg, seqs=decode_seqs, context_len=context_len)
    if prefills > 0:
        attn_s += prefills * attention_time_s(
            model, tokens=prefill_len, seq_len=prefill_len, dims=ParallelDims(tp=cfg.tp), gpu=gpu
        )
    ew_s = tokens * _elementwise_bytes(model, kind, cfg) / (gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm)
    tp_link, ep_link, _ = links
    tp_s = 2 * collective_time_s(Collective.ALL_REDUCE, tokens * model.hidden_size * BF16, cfg.tp, tp_link)
    ep_s = 0.0
    if kind is LayerKind.MOE and cfg.ep > 1:
        assert model.moe is not None
        size = tokens * model.moe.top_k * model.hidden_size * BF16
        ep_s = 2 * collective_time_s(Collective.ALL_TO_ALL, size, cfg.ep, ep_link)
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
    gpu = pool.gpu
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
    per_kind = {
        kind: _layer_time(
            model,
            kind,
            pool,
            cfg,
            links,
            tokens=tokens,
            decode_seqs=decode_seqs,
            context_len=context_len,
            prefills=prefills,
            prefill_len=prefill_len,
        )
        for kind in _decoder_kinds(model)
    }
    worst: StepTime | None = None
    for st in _stage_layers(model, cfg.pp):
        t = _edge_time(model, st, pool, cfg, links, tokens=tokens, logit_rows=decode_seqs + prefills)
        for kind, n in ((LayerKind.DENSE, st.dense), (LayerKind.MOE, st.moe)):
            if n:
                t = t + per_kind[kind].scaled(n)
        if worst is None or t.total_s > worst.total_s:
            worst = t
    assert worst is not None
    if cfg.pp > 1:
        hop = collective_time_s(Collective.P2P, tokens * model.hidden_size * BF16, 2, links[2])
        worst = replace(worst, pp_comm_s=hop)
    return worst


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
    return total


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
    ttft_s: float
    throughput_tokens_per_s: float
    """Output tokens/s of the engine (all its DP ranks)."""
    input_len: int
    output_len: int

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
) -> ServePrediction:
    """Throughput, TPOT and TTFT of one engine running `concurrency` requests per DP rank (default: as
    many as max_num_seqs and the KV cache allow). Raises InfeasibleError when the engine cannot start."""
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
    return ServePrediction(
        config=cfg,
        concurrency=batch,
        memory=mem,
        decode=decode,
        prefill=prefill,
        tpot_s=tpot,
        ttft_s=prefill.total_s + ride,
        throughput_tokens_per_s=batch * cfg.dp_attention / tpot,
        input_len=job.input_len,
        output_len=job.output_len,
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
