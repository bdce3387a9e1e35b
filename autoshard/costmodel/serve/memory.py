"""Memory of a vLLM-style engine: the engine's settings (`ServeConfig`), decoder layers per pipeline
stage, weight and KV-cache bytes per GPU, and vLLM's memory accounting (`ServeMemory`).

Facts modelled:
- KV cache per token `2 * layers * kv_heads * head_dim * bytes`; with TP > kv_heads each rank keeps
  one head (replicated); MLA caches the latent `kv_lora_rank + qk_rope_head_dim` per layer, and every
  TP rank keeps the whole latent (vLLM replicates it; decode context parallelism would shard it).
- vLLM (v1 worker `determine_available_memory`): KV cache = gpu_memory_utilization x HBM - weights -
  profiled activation peak (a dummy forward of max_num_batched_tokens tokens plus a sampler pass over
  max_num_seqs rows) - non-torch memory (NCCL, custom all-reduce buffers) - CUDA graph pools. The engine
  refuses to start unless the KV cache holds one max_model_len request.

Step times and predictions built on these live in `autoshard.costmodel.serve.step`, which re-exports
every public name here. Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from autoshard.costmodel.compute import attention_dims
from autoshard.parallel import ParallelDims
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import WeightDtype
from autoshard.specs.model import AttentionKind, LayerKind, ModelSpec, NormKind
from autoshard.units import GIB, MIB

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
    "cuda_graph_capture_sizes",
    "cuda_graph_bytes",
    "default_max_num_batched_tokens",
    "ServeMemory",
    "serve_memory",
]

BF16 = 2
FP32 = 4
KV_BLOCK_TOKENS = 16
"""vLLM's default KV block size: capacity is counted in whole blocks."""
INT4_GROUP_SCALE_BYTES = 2.0 / 128
"""AWQ/GPTQ int4 keeps one 16-bit scale per group of 128 weights."""
NON_TORCH_BYTES = 256 * MIB
"""NCCL communicators and vLLM's custom all-reduce buffers allocated after vLLM's baseline snapshot
(vLLM logs them as "non-torch memory", typically 0.1-0.5 GiB on a multi-GPU engine)."""
CUDA_GRAPH_POOL_BYTES = 256 * MIB
"""Fixed part of the CUDA graph memory pools (vLLM logs 0.3-1.5 GiB for "graph capturing")."""
CUDA_GRAPH_BYTES_PER_LAYER_GRAPH = 64 * 1024
"""Per captured graph and decoder layer: kernel nodes and their private buffers."""
SAMPLER_FP32_COPIES = 3
"""Sampler tensors of [rows, vocab] in FP32 (logits, probabilities, log-probabilities)."""


HOST_US_PER_SEQ = 5.0
"""Host (CPU) work of one engine step per request in it, microseconds, serial with the GPU work:
scheduling, stop-criteria checks, updating each request's response (what TensorRT-LLM's later
"overlap scheduler" hides: nvidia.github.io/TensorRT-LLM/features/overlap-scheduler.html; the
0.14-0.17 engines in tests/validation/serving_runs.yaml run it serially). Fitted, with the serving
GPU efficiencies, on the published offline runs by tests/validation/validate_serving.py (a grid of
0 / 2.5 / 5 / 7.5 / 10, leave-one-source-out there)."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """One engine's settings, named as vLLM's flags."""

    tp: int = 1
    pp: int = 1
    dp_attention: int = 1
    """Attention data-parallel ranks inside the engine; > 1 only with expert parallelism, where the
    MoE layers are sharded over all TP x DP ranks (vLLM --data-parallel-size with
    --enable-expert-parallel)."""
    expert_parallel: bool = False
    weight_dtype: WeightDtype = WeightDtype.BF16
    kv_cache_dtype: WeightDtype = WeightDtype.BF16
    gpu_memory_utilization: float = 0.90
    max_num_seqs: int = 256
    """Running requests per DP rank (vLLM --max-num-seqs)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one scheduler step, the prefill chunk size (vLLM --max-num-batched-tokens)."""
    kv_cache_memory_bytes: float | None = None
    """A fixed KV-cache size per GPU (vLLM --kv-cache-memory-bytes); None: derive it from the utilization."""
    cuda_graphs: bool = True
    """False models --enforce-eager (no graph pools, but no launch-overhead savings either)."""
    custom_all_reduce: bool = True
    """The engine's custom all-reduce for small TP messages on NVLink (False: vLLM
    --disable-custom-all-reduce, NCCL only)."""
    host_us_per_seq: float = HOST_US_PER_SEQ
    """Serial host work per request per engine step, microseconds (0: an engine that overlaps it
    with the GPU work)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp_attention", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dp_attention > 1 and not self.expert_parallel:
            raise ValueError(
                "dp_attention > 1 describes an expert-parallel engine; replicate the engine instead"
            )
        if self.kv_cache_dtype not in (WeightDtype.BF16, WeightDtype.FP8):
            raise ValueError("kv_cache_dtype must be bf16 or fp8")
        if not self.host_us_per_seq >= 0:
            raise ValueError(f"host_us_per_seq must be >= 0, got {self.host_us_per_seq!r}")

    @property
    def ep(self) -> int:
        """Expert-parallel size: TP x DP with expert parallelism, else 1 (experts TP-sharded)."""
        return self.tp * self.dp_attention if self.expert_parallel else 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp_attention

    @property
    def dims(self) -> ParallelDims:
        ep = self.ep
        return ParallelDims(tp=self.tp, pp=self.pp, dp=self.dp_attention, ep=ep, etp=1 if ep > 1 else None)


# --------------------------------------------------------------------------- layers per stage


@dataclass(frozen=True, slots=True)
class StageLayers:
    """What one pipeline rank hosts."""

    dense: int
    moe: int
    embedding: bool
    output: bool

    @property
    def decoders(self) -> int:
        return self.dense + self.moe


def pp_layer_split(num_layers: int, pp: int) -> list[int]:
    """Decoder layers per pipeline rank as vLLM's `get_pp_indices` splits them: an even share each,
    the remainder going one apiece to the ranks before the last (first and last also hold the
    embedding and the output layer)."""
    if pp > num_layers:
        raise ValueError(f"PP {pp} exceeds the {num_layers} decoder layers")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_layers(model: ModelSpec, pp: int) -> list[StageLayers]:
    return list(_stage_layers(model, pp))


@lru_cache(maxsize=256)
def _stage_layers(model: ModelSpec, pp: int) -> tuple[StageLayers, ...]:
    kinds = [k for k in model.layer_kinds if k in (LayerKind.DENSE, LayerKind.MOE)]
    out, start = [], 0
    for i, n in enumerate(pp_layer_split(len(kinds), pp)):
        chunk = kinds[start : start + n]
        start += n
        out.append(
            StageLayers(
                dense=chunk.count(LayerKind.DENSE),
                moe=chunk.count(LayerKind.MOE),
                embedding=i == 0,
                output=i == pp - 1,
            )
        )
    return tuple(out)


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
    model: ModelSpec, stage: StageLayers, *, tp: int, ep: int, weight_dtype: WeightDtype, pp: int = 1
) -> WeightBytes:
    """Weights of one GPU of `stage`. Linear layers are stored at `weight_dtype`; embedding, output
    projection, norms and MoE routers stay BF16 (vLLM quantizes neither the embedding nor lm_head).
    Routed experts are split over the EP ranks with expert parallelism, else TP-sharded."""
    wb = weight_bytes_per_param(weight_dtype)
    h = model.hidden_size
    layer_norms = 2 * (2 if model.norm is NormKind.LAYERNORM else 1) * h * BF16
    attn = _attention_weight_bytes(model, tp, wb) + layer_norms
    embedding = output = mlp = experts = 0.0
    if stage.embedding:
        embedding = model.embedding_params() / tp * BF16
    if stage.output:
        proj = model.vocab_size * h if (not model.tied_embeddings or pp > 1) else 0
        output = (
            proj / tp + (model.output_params() - (0 if model.tied_embeddings else model.vocab_size * h))
        ) * BF16
    mlp += stage.dense * model.mlp_params(model.ffn_hidden_size) / tp * wb
    if stage.moe:
        assert model.moe is not None
        moe = model.moe
        router = h * moe.num_experts * BF16
        shared = model.shared_expert_params() / tp * wb
        routed = moe.num_experts * model.expert_params() / (ep if ep > 1 else tp) * wb
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


# --------------------------------------------------------------------------- vLLM memory accounting


def activation_peak_bytes(model: ModelSpec, *, tp: int, ep: int, tokens: int, num_seqs: int) -> float:
    """Peak of vLLM's profiling forward pass on one GPU: `tokens` tokens through one layer at a time
    (residual, hidden, normed and attention-output streams live together with the larger of the QKV
    output and the MLP/MoE intermediates), then the sampler over `num_seqs` rows of FP32 logits."""
    h = model.hidden_size
    streams = 4 * tokens * h * BF16
    qk_dim, v_dim = attention_dims(model)
    nh = model.num_attention_heads / tp
    if model.mla is not None:
        qkv = (
            tokens
            * (
                nh * (qk_dim + model.mla.qk_nope_head_dim + v_dim)
                + model.mla.kv_lora_rank
                + model.mla.qk_rope_head_dim
            )
            * BF16
        )
    else:
        qkv = tokens * (nh + 2 * _kv_heads_local(model, tp)) * qk_dim * BF16
    gates = model.mlp.num_matrices  # gate/up outputs plus the activation output
    layer = qkv
    if model.num_layers > model.num_moe_layers:
        layer = max(layer, tokens * gates * model.ffn_hidden_size / tp * BF16)
    if model.moe is not None and model.num_moe_layers:
        moe = model.moe
        shard = 1 if ep > 1 else tp
        routed = tokens * moe.top_k * (gates * moe.expert_ffn_hidden_size / shard + 2 * h) * BF16
        layer = max(layer, routed + tokens * gates * moe.shared_expert_ffn_hidden_size / tp * BF16)
    sampler = num_seqs * model.vocab_size * FP32 * SAMPLER_FP32_COPIES
    return streams + layer + sampler


def cuda_graph_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default decode graph sizes: 1, 2, 4, then steps of 8 to 256 and of 16 beyond, up to
    min(2 * max_num_seqs, 512)."""
    top = min(2 * max_num_seqs, 512)
    sizes = [s for s in (1, 2, 4) if s <= top]
    sizes += list(range(8, min(top, 255) + 1, 8)) + list(range(256, top + 1, 16))
    return sizes


def cuda_graph_bytes(model: ModelSpec, *, tp: int, ep: int, layers: int, max_num_seqs: int) -> float:
    """Graph pools: a fixed part, per-graph per-layer node memory, and the activations of the largest
    captured decode batch (graph pools are shared across sizes)."""
    sizes = cuda_graph_capture_sizes(max_num_seqs)
    largest = activation_peak_bytes(model, tp=tp, ep=ep, tokens=sizes[-1], num_seqs=0)
    return CUDA_GRAPH_POOL_BYTES + len(sizes) * layers * CUDA_GRAPH_BYTES_PER_LAYER_GRAPH + largest


def default_max_num_batched_tokens(gpu: GpuSpec) -> int:
    """`vllm serve`'s default step budget: 16384 on GPUs of 160 GiB or more, 8192 on 70 GiB or more
    (A100 excluded), else 2048."""
    if gpu.hbm_gib >= 160:
        return 16384
    if gpu.hbm_gib >= 70 and "A100" not in gpu.name.upper():
        return 8192
    return 2048


@dataclass(frozen=True, slots=True)
class ServeMemory:
    """Per-GPU memory of an engine under vLLM's accounting (the fullest pipeline stage)."""

    capacity_bytes: float
    budget_bytes: float
    """gpu_memory_utilization x HBM."""
    weights_bytes: float
    activation_bytes: float
    cuda_graph_bytes: float
    non_torch_bytes: float
    kv_cache_bytes: float
    """KV-cache bytes per GPU (the smallest over stages: vLLM sizes all ranks alike)."""
    kv_cache_tokens: int
    """Tokens the engine's KV cache holds (per DP rank)."""
    context_len: int
    stage_weights_bytes: tuple[float, ...] = ()
    weights: WeightBytes = field(default_factory=WeightBytes)

    @property
    def overhead_bytes(self) -> float:
        return self.cuda_graph_bytes + self.non_torch_bytes

    @property
    def non_kv_bytes(self) -> float:
        return self.weights_bytes + self.activation_bytes + self.overhead_bytes

    @property
    def used_bytes(self) -> float:
        return self.non_kv_bytes + max(self.kv_cache_bytes, 0.0)

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len tokens the KV cache holds at once (vLLM's "Maximum concurrency")."""
        return self.kv_cache_tokens / self.context_len

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes > 0 and self.kv_cache_tokens >= self.context_len

    def problem(self) -> str | None:
        """Why the engine would not start, phrased as needs/has; None when it fits."""
        gib = GIB
        if self.kv_cache_bytes <= 0:
            return (
                f"weights ({self.weights_bytes / gib:.1f} GiB) + activations "
                f"({self.activation_bytes / gib:.1f} GiB)"
                f" + CUDA graphs and buffers ({self.overhead_bytes / gib:.1f} GiB) need "
                f"{self.non_kv_bytes / gib:.1f} GiB per GPU; gpu_memory_utilization leaves "
                f"{self.budget_bytes / gib:.1f} GiB"
            )
        if self.kv_cache_tokens < self.context_len:
            return (
                f"the KV cache holds {self.kv_cache_tokens} tokens, less than one request of "
                f"max_model_len {self.context_len}"
            )
        return None


def serve_memory(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig, *, context_len: int) -> ServeMemory:
    stages = stage_layers(model, cfg.pp)
    tokens = cfg.max_num_batched_tokens
    act = activation_peak_bytes(
        model, tp=cfg.tp, ep=cfg.ep, tokens=tokens, num_seqs=min(cfg.max_num_seqs, tokens)
    )
    non_torch = NON_TORCH_BYTES if cfg.gpus > 1 else 0.0
    capacity = gpu.hbm_gib * GIB
    budget = cfg.gpu_memory_utilization * capacity
    worst_kv, kv_tokens, worst_w = math.inf, math.inf, None
    stage_w, graphs_max = [], 0.0
    for st in stages:
        w = stage_weight_bytes(model, st, tp=cfg.tp, ep=cfg.ep, weight_dtype=cfg.weight_dtype, pp=cfg.pp)
        stage_w.append(w.total)
        graphs = (
            cuda_graph_bytes(model, tp=cfg.tp, ep=cfg.ep, layers=st.decoders, max_num_seqs=cfg.max_num_seqs)
            if cfg.cuda_graphs
            else 0.0
        )
        graphs_max = max(graphs_max, graphs)
        kv = (
            cfg.kv_cache_memory_bytes
            if cfg.kv_cache_memory_bytes is not None
            else (budget - w.total - act - non_torch - graphs)
        )
        per_token = kv_cache_bytes_per_token_per_gpu(
            model, tp=cfg.tp, layers=st.decoders, dtype=cfg.kv_cache_dtype
        )
        toks = max(kv, 0.0) / per_token if per_token else math.inf
        if worst_w is None or w.total > worst_w.total:
            worst_w = w
        worst_kv = min(worst_kv, kv)
        kv_tokens = min(kv_tokens, toks)
    assert worst_w is not None
    blocks = int(kv_tokens // KV_BLOCK_TOKENS) if math.isfinite(kv_tokens) else 0
    return ServeMemory(
        capacity_bytes=capacity,
        budget_bytes=budget,
        weights_bytes=worst_w.total,
        activation_bytes=act,
        cuda_graph_bytes=graphs_max,
        non_torch_bytes=non_torch,
        kv_cache_bytes=worst_kv,
        kv_cache_tokens=blocks * KV_BLOCK_TOKENS,
        context_len=context_len,
        stage_weights_bytes=tuple(stage_w),
        weights=worst_w,
    )
