"""Memory of a vLLM-style engine: vLLM's memory accounting (`ServeMemory`: weights, activation peak,
CUDA graphs, KV cache). The engine's settings and layers per stage are in
`autoshard.costmodel.serve.config`, weight and KV-cache bytes per GPU in
`autoshard.costmodel.serve.weights`.

Facts modelled:
- vLLM (v1 worker `determine_available_memory`): KV cache = gpu_memory_utilization x HBM - weights -
  profiled activation peak (a dummy forward of max_num_batched_tokens tokens plus a sampler pass over
  max_num_seqs rows) - non-torch memory (NCCL, custom all-reduce buffers) - CUDA graph pools. The engine
  refuses to start unless the KV cache holds one max_model_len request.
- Where NCCL's memory lands. Since vLLM PR #25359 (v0.11.0, v1 `gpu_worker.py` `init_device`) the
  worker initializes its process groups first and only then takes the baseline snapshot
  (`init_snapshot`) that `memory_profiling` measures against, so the communicators' start-up memory
  (their buffers and, on NVSwitch Hopper and later, NCCL's NVLink SHARP buffers, `nvls_bytes`; the PR
  measured 78.59 -> 74.07 GiB free on an H100 across NCCL's initialization) sits outside the
  gpu_memory_utilization budget, in the headroom beside the CUDA context: it does not shrink the KV
  cache. The profile's `non_torch_increase` is what the dummy forward then allocates outside torch
  (`engine_comm_bytes`, NON_TORCH_BYTES). Instead vLLM refuses to start when the free memory after
  that initialization is below gpu_memory_utilization x HBM ("Free memory on device ... on startup is
  less than desired GPU memory utilization"): `startup_comm_bytes` (at least one communicator and the
  NVLS buffers of every group that runs collectives) must fit in the headroom. Those communicator
  terms live in `autoshard.costmodel.serve.comm_memory`. NCCL_NVLS_ENABLE
  defaults on and vLLM leaves it; SGLang sets it to 0 unless --enable-nccl-nvls or --enable-symm-mem
  (`_set_envs_and_config`, sglang/srt/entrypoints/engine.py; sgl-project/sglang PRs #631, #3502).

- The KV cache is whole blocks of the engine's attention backend and a request holds whole blocks; the
  graph pool holds the engine's default capture list (`autoshard.costmodel.serve.engine_defaults`).
  Sliding-window layers share vLLM's pool in hybrid KV-cache groups, each holding at most its window
  plus the tokens in flight (`autoshard.costmodel.serve.kv_window`); SGLang stores them whole.

Step times built on these live in `autoshard.costmodel.serve.step`, predictions in
`autoshard.costmodel.serve.predict`. Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from autoshard.costmodel.flops import attention_dims
from autoshard.costmodel.serve.comm_memory import (
    engine_comm_bytes,
    engine_nvls_bytes,
    startup_comm_bytes,
)
from autoshard.costmodel.serve.config import AGRS_BACKEND, ServeConfig, StageLayers, stage_layers
from autoshard.costmodel.serve.engine_defaults import capture_sizes, kv_block_tokens, vllm_capture_sizes
from autoshard.costmodel.serve.engines import sglang_deepep_seqs
from autoshard.costmodel.serve.kv_window import KVLayout, engine_stage_layouts, stage_windows
from autoshard.costmodel.serve.ep_buffers import NUM_MAX_NVL_PEERS, deepep_ll_engine_bytes, runs_cuda_graphs
from autoshard.costmodel.serve.weights import (
    WeightBytes,
    _kv_heads_local,
    kv_cache_bytes_per_token_per_gpu,
    stage_weight_bytes,
    weight_bytes_per_param,
)
from autoshard.specs.cluster import GpuSpec, PoolSpec
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB, MIB

__all__ = [
    "activation_peak_bytes",
    "cuda_graph_capture_sizes",
    "cuda_graph_bytes",
    "default_max_num_batched_tokens",
    "ServeMemory",
    "serve_memory",
]

BF16 = 2
FP32 = 4
CUDA_GRAPH_POOL_BYTES = 256 * MIB
"""Fixed part of the CUDA graph memory pools (vLLM logs 0.3-1.5 GiB for "graph capturing")."""
CUDA_GRAPH_BYTES_PER_LAYER_GRAPH = 64 * 1024
"""Per captured graph and decoder layer: kernel nodes and their private buffers."""
SAMPLER_FP32_COPIES = 3
"""Sampler tensors of [rows, vocab] in FP32 (logits, probabilities, log-probabilities)."""


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


cuda_graph_capture_sizes = vllm_capture_sizes
"""vLLM's default decode graph sizes (`serve.engine_defaults.vllm_capture_sizes`)."""


def cuda_graph_bytes(
    model: ModelSpec, *, tp: int, ep: int, layers: int, sizes: list[int], gathered: int = 1,
    moe_tp: int | None = None,
) -> float:
    """Graph pools: a fixed part, per-graph per-layer node memory, and the activations of the largest
    captured decode batch (graph pools are shared across sizes); `sizes`: the tokens of each captured
    graph (`serve.engine_defaults.capture_sizes`). `gathered` > 1: attention DP with TP experts (SGLang,
    vLLM) or vLLM's EP on allgather_reducescatter, whose captured FFNs run on `gathered` DP ranks' rows
    (sharded over `moe_tp` GPUs, or `ep` of them holding whole experts)."""
    largest = activation_peak_bytes(model, tp=tp, ep=ep, tokens=sizes[-1], num_seqs=0)
    if gathered > 1:
        ffn = activation_peak_bytes(model, tp=moe_tp or tp, ep=ep, tokens=gathered * sizes[-1], num_seqs=0)
        largest = max(largest, ffn)
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
    nvls_bytes: float = 0.0
    """NCCL's NVLS buffers per GPU (none where the engine runs NVLS off, as SGLang does by default),
    part of `startup_bytes`."""
    startup_bytes: float = 0.0
    """NCCL memory allocated before vLLM's baseline snapshot, which the headroom outside the budget
    (capacity - budget) must hold for the engine to start (`startup_comm_bytes`)."""

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.budget_bytes
    ep_buffer_bytes: float = 0.0
    """DeepEP's low-latency buffers (`autoshard.costmodel.serve.ep_buffers`), part of non_torch_bytes."""
    kv_block_tokens: int = 1
    """Tokens per KV-cache block (`serve.engine_defaults.kv_block_tokens`): the pool holds whole blocks and
    a request of L tokens holds ceil(L / block) of them (1: token-granular, SGLang's default page)."""
    kv_layout: KVLayout | None = None
    """The KV-cache groups of a model with sliding-window layers as vLLM's hybrid manager builds them
    (`serve.kv_window`); `kv_cache_tokens` is then the KV cache size vLLM logs (max concurrency x
    max_model_len) and a request holds its blocks summed over the groups in those tokens
    (`request_tokens`). None: every layer holds every token."""

    def request_tokens(self, tokens: int, *, startup: bool = False) -> int:
        """Cache tokens a request of `tokens` tokens holds: whole blocks; with sliding-window groups, the
        blocks of every group in the tokens of `kv_cache_tokens` (`KVLayout.request_tokens`; `startup`: vLLM's
        start check and logged concurrency, which count a sliding group's cap whole)."""
        if self.kv_layout is not None and self.kv_layout.windowed:
            return self.kv_layout.request_tokens(tokens, startup=startup)
        return self.kv_block_tokens * math.ceil(tokens / self.kv_block_tokens)

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
        """Requests of max_model_len tokens the KV cache holds at once, each in whole blocks (vLLM's
        "Maximum concurrency": num_blocks / cdiv(max_model_len, block_size), with sliding-window groups
        num_blocks / the blocks summed over the groups, `get_max_concurrency_for_kv_cache_config`,
        vllm/v1/core/kv_cache_utils.py:1061-1093)."""
        return self.kv_cache_tokens / self.request_tokens(self.context_len, startup=True)

    @property
    def short_of_one_request(self) -> bool:
        """The engine's memory leaves a KV cache, but one too small for a single request of max_model_len
        (vLLM's start check, `check_enough_kv_cache_memory`: a shorter max_model_len starts it)."""
        return self.kv_cache_bytes > 0 and self.kv_cache_tokens < self.request_tokens(self.context_len, startup=True)

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes > 0 and not self.short_of_one_request and self.startup_bytes <= self.headroom_bytes

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
        if self.short_of_one_request:
            return (
                f"the KV cache holds {self.kv_cache_tokens} tokens, less than one request of "
                f"max_model_len {self.context_len}"
                + (f" in {self.kv_block_tokens}-token blocks" if self.kv_block_tokens > 1 else "")
            )
        if self.startup_bytes > self.headroom_bytes:
            top = math.floor(100 * (1 - self.startup_bytes / self.capacity_bytes)) / 100
            return (
                f"NCCL's communicators (NVLS buffers included) need at least {self.startup_bytes / gib:.2f} "
                f"GiB per GPU outside gpu_memory_utilization before vLLM measures free memory; "
                f"{self.budget_bytes / self.capacity_bytes:.2f} leaves {self.headroom_bytes / gib:.2f} GiB "
                f"(vLLM refuses to start): use gpu_memory_utilization <= {top:.2f}"
            )
        return None


def _with_mtp_modules(model: ModelSpec, w: WeightBytes, cfg: ServeConfig, layers: int) -> WeightBytes:
    """The last stage's weights plus the MTP modules speculative decoding loads there (each: the
    2h -> h projection, its norms and one decoder layer of the model's last kind; the embedding and
    the output head are shared with the main model)."""
    kind = model.mtp_layer_kind
    one = stage_weight_bytes(
        model,
        StageLayers(
            dense=int(kind is LayerKind.DENSE), moe=int(kind is LayerKind.MOE), embedding=False, output=False
        ),
        tp=cfg.tp, ep=cfg.ep, weight_dtype=cfg.weight_dtype, moe_tp=cfg.moe_tp, expert_tp=cfg.expert_tp,
    )
    proj = 2 * model.hidden_size * model.hidden_size / cfg.tp * weight_bytes_per_param(cfg.weight_dtype)
    return dataclasses.replace(
        w, attention=w.attention + layers * (one.attention + proj), mlp=w.mlp + layers * one.mlp,
        experts=w.experts + layers * one.experts,
    )


def serve_memory(
    model: ModelSpec, gpu: GpuSpec | PoolSpec, cfg: ServeConfig, *, context_len: int
) -> ServeMemory:
    """vLLM's accounting on the fullest stage. Given the pool, the start-up check counts NCCL's NVLS
    buffers where the node's NVSwitch enables them (`startup_comm_bytes`); a bare GpuSpec knows no
    node and counts none."""
    pool = gpu if isinstance(gpu, PoolSpec) else None
    if pool is not None:
        gpu = pool.gpu
    stages = stage_layers(model, cfg.pp)
    tokens = cfg.max_num_batched_tokens
    act = activation_peak_bytes(
        model, tp=cfg.tp, ep=cfg.ep, tokens=tokens, num_seqs=min(cfg.max_num_seqs, tokens)
    )
    # attention DP with TP experts (SGLang, vLLM), or vLLM's EP on allgather_reducescatter, whose experts'
    # workspace takes the gathered rows whole (`serve.vllm_dp_moe`): FFNs on every DP rank's tokens
    gathers = cfg.expert_tp != cfg.tp or (cfg.all2all_backend == AGRS_BACKEND and cfg.expert_parallel)
    if gathers:
        act = max(act, activation_peak_bytes(
            model, tp=cfg.expert_tp, ep=cfg.ep, tokens=tokens * cfg.dp_attention, num_seqs=min(cfg.max_num_seqs, tokens)
        ))
    per_node = pool.node.gpus_per_node if pool is not None else NUM_MAX_NVL_PEERS
    ep_buffers = deepep_ll_engine_bytes(model, gpu, cfg, gpus_per_node=per_node)
    cuda_graphs = runs_cuda_graphs(model, gpu, cfg)
    non_torch = engine_comm_bytes(pool, cfg) + ep_buffers
    capacity = gpu.hbm_gib * GIB
    budget = cfg.gpu_memory_utilization * capacity
    worst_kv, kv_tokens, worst_w = math.inf, math.inf, None
    block = kv_block_tokens(model, gpu, cfg)
    layout, held, stage_w, graphs_max = None, math.inf, [], 0.0
    # vLLM's hybrid groups over the whole model's layers, projected on each stage (`serve.kv_window`), the MTP
    # layers on the last; in-flight batches PP + 1 (async)
    mtp = [model.mtp_num_layers if cfg.speculative_tokens and st.output else 0 for st in stages]
    layouts = engine_stage_layouts(
        [ws + (None,) * n for ws, n in zip(stage_windows(model, cfg.pp), mtp)], engine=cfg.engine, block=block,
        in_flight=(cfg.pp + 1) * cfg.max_num_batched_tokens, max_model_len=context_len,
        pinned_blocks=cfg.kv_block_tokens is not None, hybrid=cfg.hybrid_kv_cache)
    deepep_bs = sglang_deepep_seqs(model, gpu, cfg)  # the line's --cuda-graph-max-bs-decode
    sizes = capture_sizes(gpu, cfg, max_bs=None if deepep_bs is None else min(cfg.max_num_seqs, deepep_bs))
    for i, st in enumerate(stages):
        w = stage_weight_bytes(
            model, st, tp=cfg.tp, ep=cfg.ep, weight_dtype=cfg.weight_dtype, pp=cfg.pp, moe_tp=cfg.moe_tp,
            expert_tp=cfg.expert_tp,
        )
        if mtp[i]:
            w = _with_mtp_modules(model, w, cfg, mtp[i])
        stage_w.append(w.total)
        graphs = (
            cuda_graph_bytes(model, tp=cfg.tp, ep=cfg.ep, layers=st.decoders, sizes=sizes,
                             gathered=cfg.dp_attention if gathers else 1, moe_tp=cfg.expert_tp)
            if cuda_graphs
            else 0.0
        )
        graphs_max = max(graphs_max, graphs)
        kv = (
            cfg.kv_cache_memory_bytes
            if cfg.kv_cache_memory_bytes is not None
            else (budget - w.total - act - non_torch - graphs)
        )
        st_layout = layouts[i]
        per_token = kv_cache_bytes_per_token_per_gpu(
            model, tp=cfg.tp, layers=st_layout.paged_layers, dtype=cfg.kv_cache_dtype
        )
        toks = max(kv, 0.0) / per_token if per_token else math.inf
        if st_layout.windowed:  # pool blocks of one group's layers, counted as vLLM logs them
            toks = st_layout.pool_tokens(toks * len(st_layout.groups) / block)
        if worst_w is None or w.total > worst_w.total:
            worst_w = w
        worst_kv = min(worst_kv, kv)
        if (fit := toks / st_layout.request_tokens(context_len, startup=True)) < held:
            # the stage holding the fewest requests decides (without windows: the fewest tokens)
            held, kv_tokens = fit, toks
            layout = st_layout if st_layout.windowed else None
    assert worst_w is not None
    blocks = int(kv_tokens // block) if math.isfinite(kv_tokens) else 0
    return ServeMemory(
        capacity_bytes=capacity,
        budget_bytes=budget,
        weights_bytes=worst_w.total,
        activation_bytes=act,
        cuda_graph_bytes=graphs_max,
        non_torch_bytes=non_torch,
        kv_cache_bytes=worst_kv,
        kv_cache_tokens=blocks * block,
        context_len=context_len,
        stage_weights_bytes=tuple(stage_w),
        weights=worst_w,
        nvls_bytes=engine_nvls_bytes(pool, cfg),
        startup_bytes=startup_comm_bytes(pool, cfg),
        ep_buffer_bytes=ep_buffers,
        kv_block_tokens=block,
        kv_layout=layout,
    )
