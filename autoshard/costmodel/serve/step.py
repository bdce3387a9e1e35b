"""Serving step time of a vLLM-style engine: one engine step (decode tokens plus chunked prefill) and
a prompt's own prefill, assembled from the per-GPU compute terms (`serve.compute`) and the parallel
communication (`serve.sharding`) over the pipeline stages. Throughput, TTFT and TPOT built on these
are in `autoshard.costmodel.serve.predict`; weight, KV-cache and vLLM memory accounting in
`autoshard.costmodel.serve.weights` and `autoshard.costmodel.serve.memory`.

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
  plus, on average, `batch * input_len / output_len` prefill tokens (every finished request is replaced),
  as whole chunks: some steps carry a prompt's chunk, the others none (`mean_step_time`).
  With PP, vLLM keeps PP micro-batches in flight, so a token advances once every PP stage ticks.
- Every step also pays the engine's serial host work per request in it (scheduling, stop checks,
  responses: ServeConfig.host_us_per_seq, fitted on the published offline runs).

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

from autoshard.costmodel.comm import Link, group_link
from autoshard.costmodel.compute import elementwise_bytes_per_token, gemm_time_s
from autoshard.costmodel.flops import Gemm, attention_gemms, mlp_gemms
from autoshard.costmodel.serve.attention import _decode_attention_s, prefill_attention_s
from autoshard.costmodel.serve.compute import (
    ELEMENTWISE_KERNELS,
    _elementwise_bytes,
    _gemm_s,
    _grouped_experts_s,
    _rows,
    extra_kernels_s,
    model_serving_gpu,
    moe_dp_chunks,
    serving_gpu,
)
from autoshard.costmodel.serve.config import ServeConfig, StageLayers, _stage_layers
from autoshard.costmodel.serve.dp_tp_moe import (
    attention_dp_tp_moe, custom_all_reduce_v2, dp_gather_combine_s, edge_engine, ffn_config, gathered_rows,
    split_elementwise_s,
)
from autoshard.costmodel.serve.ep_dispatch import deepep_normal_step
from autoshard.costmodel.serve.vllm_dp_moe import agrs_ep_comm_s, agrs_ep_engine, vllm_dp_moe_layer
from autoshard.costmodel.serve.memory import FP32, SAMPLER_FP32_COPIES
from autoshard.costmodel.serve.sharding import (
    _links,
    ep_dispatch_s,
    expected_max_prefill_tokens,
    layer_tp_comm_s,
    logits_all_gather_s,
    pp_send_s,
)
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.job import Precision, WeightDtype
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = ["StepTime", "step_time", "mean_step_time", "prefill_time"]


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
    query_len: int = 1,
    rows_sum: float | None = None,
    part: str = "all",
) -> StepTime:
    """One decoder layer on one GPU: `tokens` rows through the linear layers, decode attention over
    `decode_seqs` cached sequences, and `prefills` causal prefills of `prefill_len` tokens.
    `expert_tokens` (default `tokens`): the DP rank's mean tokens the MoE layer routes when `tokens`
    is the busiest attention-DP rank's load. SGLang's attention DP with TP experts: `_dp_tp_moe_layer`,
    `rows_sum` (default DP x `expert_tokens`) the step's tokens over all DP ranks; `part` "attention"
    or "ffn" prices that half of the layer alone (elementwise kernels: `dp_tp_moe.split_elementwise_s`)."""
    if part == "all" and cfg.dp_attention > 1 and not cfg.expert_parallel:  # vLLM's: `serve.vllm_dp_moe`
        return (_dp_tp_moe_layer if attention_dp_tp_moe(cfg) else partial(vllm_dp_moe_layer, _layer_time))(
            model, kind, pool, cfg, links, tokens=tokens, decode_seqs=decode_seqs, context_len=context_len,
            prefills=prefills, prefill_len=prefill_len, query_len=query_len,
            rows_sum=rows_sum if rows_sum is not None else cfg.dp_attention * (expert_tokens or tokens),
        )
    gpu = model_serving_gpu(model, pool.gpu, cfg.weight_dtype)
    rows = _rows(tokens)
    gemms = attention_gemms(model, rows, cfg.tp) if part != "ffn" else []
    if kind is LayerKind.DENSE and part != "attention":
        gemms += mlp_gemms(model, rows, model.ffn_hidden_size, cfg.tp)
    elif part != "attention":
        assert model.moe is not None
        gemms.append(Gemm(rows, model.moe.num_experts, model.hidden_size, fp8_capable=False))
        if model.moe.shared_expert_ffn_hidden_size:
            gemms += mlp_gemms(model, rows, model.moe.shared_expert_ffn_hidden_size, cfg.tp)
    gemm_s = sum(_gemm_s(g, gpu, cfg.weight_dtype) for g in gemms)
    routed = expert_tokens if expert_tokens is not None else tokens
    chunks = moe_dp_chunks(cfg, tokens) if kind is LayerKind.MOE and prefills <= 0 else 1
    if kind is LayerKind.MOE and part != "attention":
        gemm_s += chunks * _grouped_experts_s(model, gpu, cfg, routed / chunks)
    if part != "all":
        ew_s = split_elementwise_s(model, kind, cfg, gpu, gemms, tokens=tokens, part=part)
        attn_s = 0.0 if part == "ffn" else _decode_attention_s(
            model, gpu, cfg, seqs=decode_seqs, context_len=context_len, query_len=query_len
        )
        if prefills > 0 and part == "attention":
            fp8 = cfg.fp8_context_attention and cfg.kv_cache_dtype is WeightDtype.FP8
            attn_s += prefills * prefill_attention_s(model, gpu, tp=cfg.tp, prompt_len=prefill_len, fp8=fp8)
        tp_s = 0.0 if part == "ffn" else layer_tp_comm_s(model, pool, cfg, links[0], tokens=tokens) / 2
        return StepTime(gemm_s=gemm_s, attention_s=attn_s, elementwise_s=ew_s, tp_comm_s=tp_s)
    attn_s = _decode_attention_s(
        model, gpu, cfg, seqs=decode_seqs, context_len=context_len, query_len=query_len
    )
    if prefills > 0:
        fp8 = cfg.fp8_context_attention and cfg.kv_cache_dtype is WeightDtype.FP8
        attn_s += prefills * prefill_attention_s(model, gpu, tp=cfg.tp, prompt_len=prefill_len, fp8=fp8)
    ew_s = tokens * _elementwise_bytes(model, kind, cfg) / (gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm)
    ew_s += ELEMENTWISE_KERNELS[kind] * gpu.efficiency.kernel_overhead_us * 1e-6
    ew_s += extra_kernels_s(model, kind, cfg, gpu, gemms, tokens=rows, routed=routed)
    if chunks > 1:  # each further MoE pass routes its tokens (top-k, align, un-permute) again
        moe_kernels = ELEMENTWISE_KERNELS[LayerKind.MOE] - ELEMENTWISE_KERNELS[LayerKind.DENSE]
        ew_s += (chunks - 1) * moe_kernels * gpu.efficiency.kernel_overhead_us * 1e-6
    tp_link, ep_link, _ = links
    tp_s = layer_tp_comm_s(model, pool, cfg, tp_link, tokens=tokens)
    ep_s = agrs_ep_comm_s(model, pool, cfg, ep_link, tokens=tokens, rows_sum=rows_sum or cfg.dp_attention * routed
                          ) if kind is LayerKind.MOE and agrs_ep_engine(cfg) else chunks * ep_dispatch_s(
        model, kind, cfg, ep_link, routed=routed / chunks, pool=pool,
        high_throughput=deepep_normal_step(model, pool, cfg, prefill=prefills > 0))
    return StepTime(gemm_s=gemm_s, attention_s=attn_s, elementwise_s=ew_s, tp_comm_s=tp_s, ep_comm_s=ep_s)


def _dp_tp_moe_layer(
    model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: ServeConfig, links: tuple[Link, Link, Link], *,
    tokens: float, decode_seqs: float, context_len: float, prefills: float, prefill_len: int, query_len: int,
    rows_sum: float,
) -> StepTime:
    """One layer of SGLang's attention DP with TP experts (`serve.dp_tp_moe`): the attention half at
    attention TP on this rank's `tokens` (the busiest rank's), the FFN half as a TP-N engine's on the
    gathered rows, and the gather and combine over the N ranks."""
    prefill = prefills > 0
    attn = _layer_time(
        model, kind, pool, replace(cfg, dp_attention=1), links, tokens=tokens, decode_seqs=decode_seqs,
        context_len=context_len, prefills=prefills, prefill_len=prefill_len, query_len=query_len, part="attention",
    )
    link = group_link(pool, ranks=cfg.moe_tp)
    custom = custom_all_reduce_v2(pool, cfg, link)
    rows = gathered_rows(model, cfg, rows_sum=rows_sum, rows_max=tokens, prefill=prefill, custom=custom)
    ffn = _layer_time(
        model, kind, pool, ffn_config(cfg), links, tokens=rows, decode_seqs=0, context_len=0, prefills=0,
        prefill_len=prefill_len, part="ffn",
    )
    comm = dp_gather_combine_s(model, pool, cfg, link, rows_sum=rows_sum, rows_max=tokens, prefill=prefill)
    return attn + replace(ffn, tp_comm_s=comm)


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
        tp = logits_all_gather_s(model, cfg, links[0], rows=rows)
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
    decode_query_len: int = 1,
    balanced_prefill: bool = False,
) -> StepTime:
    """One tick of the engine: every pipeline stage works on its own micro-batch of `decode_seqs`
    decode tokens plus `prefill_tokens` prefill tokens (`prefills` prompts' worth of attention); the
    slowest stage sets the tick, plus the activation send to the next stage. `decode_query_len`:
    tokens each decoding sequence runs through the model (1, or 1 + the draft tokens a speculative
    step verifies). `balanced_prefill`: every attention-DP rank carries exactly `prefill_tokens` (a
    saturated prefill-only engine, each rank's scheduler filling its token budget from its own
    backlog) instead of the busiest rank of whole prompts arriving at random."""
    links = _links(pool, cfg)
    q = decode_query_len
    tokens = decode_seqs * q + prefill_tokens
    busiest, busiest_prefills = tokens, prefills
    if cfg.dp_attention > 1 and prefill_tokens > 0 and not balanced_prefill:
        chunk = min(prefill_len, cfg.max_num_batched_tokens)
        worst_prefill = expected_max_prefill_tokens(
            prefill_tokens, ranks=cfg.dp_attention, prompt_tokens=chunk
        )
        busiest = decode_seqs * q + worst_prefill
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
            query_len=q,
        )
        for kind in _decoder_kinds(model)
    }
    worst: StepTime | None = None
    edge_cfg, edge_links, ranks = edge_engine(pool, cfg, links)
    for st in _stage_layers(model, cfg.pp):
        t = _edge_time(
            model, st, pool, edge_cfg, edge_links, tokens=busiest, logit_rows=ranks * (decode_seqs * q + busiest_prefills)
        )
        for kind, n in ((LayerKind.DENSE, st.dense), (LayerKind.MOE, st.moe)):
            if n:
                t = t + per_kind[kind].scaled(n)
        if worst is None or t.total_s > worst.total_s:
            worst = t
    assert worst is not None
    if cfg.pp > 1:
        hop = pp_send_s(model, links[2], tokens=tokens)
        worst = replace(worst, pp_comm_s=hop)
    return replace(worst, host_s=cfg.host_us_per_seq * 1e-6 * (decode_seqs + prefills))


def mean_step_time(
    model: ModelSpec,
    pool: PoolSpec,
    cfg: ServeConfig,
    *,
    decode_seqs: float,
    prefill_tokens: float,
    prefill_len: int,
    context_len: float,
) -> StepTime:
    """Mean engine step when, on average, `prefill_tokens` prompt tokens ride along with
    `decode_seqs` decodes. Prompts arrive whole: a step carries k or k + 1 prefill chunks of
    min(prompt, token budget left after the decodes), in the proportions that give that mean, not a
    sliver of every prompt in every step. The distinction is the roofline's: a decode step reads the
    weights whatever its rows, so a 90-token sliver rides almost free while the whole 467-token prompt
    it stands for makes its step compute-bound; averaging the tokens first (`step_time` of the mean)
    would price E[t(X)] as t(E[X]) and miss that cost (Jensen: t is convex in the step's tokens).
    With attention data parallelism `step_time` already prices whole chunks (the busiest rank's)."""
    if prefill_tokens <= 0 or cfg.dp_attention > 1:
        return step_time(
            model, pool, cfg, decode_seqs=decode_seqs, prefill_tokens=prefill_tokens,
            prefills=prefill_tokens / prefill_len, prefill_len=prefill_len, context_len=context_len,
        )
    free = cfg.max_num_batched_tokens - decode_seqs
    chunk = float(min(prefill_len, free)) if free >= 1 else float(prefill_len)
    chunks = prefill_tokens / chunk
    k = math.floor(chunks)
    frac = chunks - k

    def with_chunks(n: int) -> StepTime:
        return step_time(
            model, pool, cfg, decode_seqs=decode_seqs, prefill_tokens=n * chunk,
            prefills=n * chunk / prefill_len, prefill_len=prefill_len, context_len=context_len,
        )

    low = with_chunks(k)
    if frac < 1e-9:
        return low
    return low.scaled(1.0 - frac) + with_chunks(k + 1).scaled(frac)


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
            rows_sum=chunk,
        ).scaled(chunks)
        for kind in _decoder_kinds(model)
    }
    total = StepTime()
    edge_cfg, edge_links, _ = edge_engine(pool, cfg, links)
    for st in _stage_layers(model, cfg.pp):
        total = total + _edge_time(model, st, pool, edge_cfg, edge_links, tokens=prompt_len, logit_rows=1)
        for kind, n in ((LayerKind.DENSE, st.dense), (LayerKind.MOE, st.moe)):
            if n:
                total = total + per_kind[kind].scaled(n)
    if cfg.pp > 1:
        hop = pp_send_s(model, links[2], tokens=chunk)
        total = replace(total, pp_comm_s=(cfg.pp - 1) * chunks * hop)
    return replace(total, host_s=cfg.host_us_per_seq * 1e-6 * chunks)
