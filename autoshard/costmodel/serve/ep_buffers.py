"""DeepEP low-latency buffers of an expert-parallel serving engine: device memory outside PyTorch's
allocator that wide-EP decode engines hold on every GPU.

Facts modelled:
- DeepEP's low-latency (decode) kernels exchange tokens through one RDMA buffer per GPU (NVSHMEM
  symmetric memory), sized by `get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank,
  hidden, num_ranks, num_experts)`, i.e. the `LowLatencyLayout` of deepseek-ai/DeepEP csrc/config.hpp
  (commit 79bbb546f6921fbed57f000627a0b92f0d468cf0; csrc/legacy/config.hpp at dd758caf, unchanged):
  a dispatch message is 16 + max(2 h, h + 4 h/128) bytes (an int4 header and BF16 or FP8-plus-scales
  data), a combine message 4 h/128 + 2 h; odd/even send buffers of max(cap x dispatch, E x cap x
  combine), odd/even receive buffers of E x cap x max(dispatch, combine), odd/even signalling buffers
  of E int32 aligned to 128 bytes, and the total rounded up by `(n + 128) // 128 * 128`. E is the
  number of experts the router picks from (redundant replicas included), cap the most tokens one
  rank dispatches per call. The EP size does not enter the layout.
- vLLM's `DeepEPLLAll2AllManager` (vllm/distributed/device_communicators/all2all.py:327-352 in vLLM
  0.33.0) creates the buffer with cap = `moe.max_num_tokens` (all2all_utils.py:260), which vLLM 0.33.0
  sets to the scheduler's `--max-num-batched-tokens` (`FusedMoEConfig.max_num_tokens`,
  model_executor/layers/fused_moe/layer.py:286,373; 256 when the line passes none,
  `DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP`, config/scheduler.py:42, engine/arg_utils.py:3166-3170),
  and runs a step's MoE in one pass through it; vLLM 0.11.0 used cap = VLLM_MOE_DP_CHUNK_SIZE = 256 and
  256-token DP chunks (`ServeConfig.moe_dp_chunk`, for the validation rows measured on it). Plus an
  NVLink buffer of VLLM_DEEPEP_BUFFER_SIZE_MB (1024 MiB by default) that DeepEP's `Buffer`
  cudaMallocs. Both are allocated after vLLM's memory baseline, so its profiler counts them as
  non-torch memory and the KV cache shrinks by them. autoshard's vLLM lines on this backend pass the
  budget the plan chose for it (`vllm_deepep_ll_budget` and the search's budget ladder): 8,192 would
  ask 113.8 GiB per GPU for DeepSeek-V3.
- SGLang (`--moe-a2a-backend deepep`, default `--deepep-mode auto`) creates one DeepEP `Buffer` per
  GPU for both modes (`DeepEPBuffer.get_deepep_buffer`, sglang/srt/layers/moe/token_dispatcher/
  deepep.py, sgl-project/sglang 003a81bf): the RDMA buffer is the larger of the low-latency layout at
  cap = SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK (128 by default, asserted <= 1024) and the
  normal kernels' `get_rdma_buffer_size_hint`; the NVLink buffer is the normal kernels'
  `get_nvl_buffer_size_hint` (no 1 GiB default), both from DeepEP's recommended dispatch and combine
  `Config` for the EP size (deep_ep/buffer.py `get_dispatch_config` / `get_combine_config`, 20 SMs)
  at hidden x 1 byte per element (SGLang's FP8 dispatch, its default: `get_deepep_output_dtype`) or
  2 for BF16 models. autoshard's SGLang lines set the variable to the planned decode tokens per rank
  rounded up to 128, at most SGLANG_DEEPEP_TOKENS_MAX (`sglang_deepep_tokens`), so the memory counts
  the buffer the line allocates (`deepep_sglang_engine_bytes`).
- vLLM prefill instances (`ServeConfig.role == "prefill"`) run `--all2all-backend deepep_high_throughput`
  (autoshard's prefill lines), whose `DeepEPHTAll2AllManager` creates a normal-mode `Buffer` of
  VLLM_DEEPEP_BUFFER_SIZE_MB of NVLink buffer and, across nodes, as much RDMA buffer: 1 or 2 GiB, no
  low-latency layout (`vllm_deepep_ht_bytes`), and vLLM captures no CUDA graphs on that backend
  (`vllm_runs_cuda_graphs`). SGLang's prefill lines keep `--deepep-mode auto`, whose buffer includes
  the low-latency layout (above). SGLang split instances on DeepEP without attention DP
  (`scattered_deepep`) hold the same SGLang buffer.

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.job import WeightDtype
from autoshard.specs.model import ModelSpec
from autoshard.units import MIB

__all__ = [
    "DEEPEP_ALIGNMENT_BYTES",
    "DEEPEP_EP_RANKS",
    "SGLANG_DEEPEP_TOKENS_MAX",
    "SGLANG_DEEPEP_TOKENS_STEP",
    "deepep_normal_buffer_bytes",
    "deepep_sglang_engine_bytes",
    "sglang_deepep_tokens",
    "scattered_deepep",
    "DEEPEP_LL_GENERATIONS",
    "NUM_MAX_NVL_PEERS",
    "SGLANG_DEEPEP_MAX_DISPATCH_TOKENS",
    "VLLM_DEEPEP_NVL_BYTES",
    "VLLM_MOE_DP_CHUNK_SIZE",
    "VLLM_LL_BUDGET_STEP",
    "vllm_deepep_ll_budget",
    "vllm_deepep_ll_cap",
    "deepep_ll_buffer_bytes",
    "deepep_ll_engine_bytes",
    "deepep_buffer_label",
    "uses_deepep_low_latency",
    "vllm_deepep_ht_bytes",
    "vllm_runs_cuda_graphs",
    "runs_cuda_graphs",
]

DEEPEP_ALIGNMENT_BYTES = 128
"""DeepEP's NUM_BUFFER_ALIGNMENT_BYTES (csrc/kernels/configs.cuh)."""
VLLM_MOE_DP_CHUNK_SIZE = 256
"""vLLM 0.11.0's VLLM_MOE_DP_CHUNK_SIZE default: the tokens per DP rank of one MoE pass and the `cap` of
its DeepEP low-latency buffer (vllm/envs.py there); also vLLM 0.33.0's default step budget for engines
on that backend (`SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP`)."""
VLLM_LL_BUDGET_STEP = 256
"""autoshard's vLLM DeepEP low-latency lines pass a --max-num-batched-tokens that is a multiple of this
(vLLM's default for the backend)."""
SGLANG_DEEPEP_MAX_DISPATCH_TOKENS = 128
"""SGLang's SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK default (asserted <= 1024 there)."""
VLLM_DEEPEP_NVL_BYTES = 1024 * MIB
"""The NVLink buffer vLLM's DeepEP managers pass as num_nvl_bytes (VLLM_DEEPEP_BUFFER_SIZE_MB, default
1024; vllm/envs.py, vllm/distributed/device_communicators/all2all.py)."""
DEEPEP_LL_GENERATIONS = ("hopper", "blackwell")
"""GPUs DeepEP's low-latency kernels run on (SM90 and later; its SM80 build has intranode kernels
only). AMD engines use other all-to-all libraries (MORI), whose buffers are not modelled here."""


SGLANG_DEEPEP_TOKENS_STEP = 128
"""autoshard's SGLang lines size the low-latency buffer in steps of SGLang's default cap."""
SGLANG_DEEPEP_TOKENS_MAX = VLLM_MOE_DP_CHUNK_SIZE
"""The most decode tokens per rank autoshard plans for an SGLang engine on DeepEP (its line's
SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK): SGLang does not split a decode batch into passes,
and a batch or captured CUDA graph with more tokens on a rank fails DeepEP's assert (`x.size(0) <=
num_max_dispatch_tokens_per_rank`), so its plans keep at most this many running requests x (1 + MTP
drafts) per attention-DP rank; 256, as vLLM's MoE chunk, bounds the buffer (3.6 GiB for DeepSeek-V3)."""
DEEPEP_EP_RANKS = (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)
"""EP sizes DeepEP's `Buffer.get_dispatch_config` / `get_combine_config` have a config for (it asserts
`num_ranks in config_map`; deepseek-ai/DeepEP deep_ep/buffer.py at 04b06f7a): the normal kernels SGLang's
`--deepep-mode auto` runs for prefill start nowhere else."""
DEEPEP_NUM_SMS = 20
"""DeepEP's `Buffer.num_sms` default: the high-throughput kernels run num_sms / 2 channels."""
_DEEPEP_NORMAL_CONFIGS: dict[int, tuple[tuple[int, int, int, int], tuple[int, int, int, int]]] = {
    # EP ranks: (dispatch, combine) Config(nvl send, nvl recv, rdma send, rdma recv) at 04b06f7a
    2: ((24, 256, 6, 128), (10, 256, 6, 128)),
    4: ((6, 256, 6, 128), (9, 256, 6, 128)),
    8: ((6, 256, 6, 128), (4, 256, 6, 128)),
    16: ((16, 288, 20, 128), (2, 288, 28, 128)),
    24: ((8, 288, 32, 128), (1, 288, 20, 128)),
    32: ((8, 288, 32, 128), (1, 288, 20, 128)),
    64: ((20, 288, 28, 128), (1, 288, 20, 128)),
    128: ((20, 560, 32, 128), (1, 560, 12, 128)),
    144: ((32, 720, 12, 128), (2, 720, 8, 128)),
    160: ((28, 720, 12, 128), (2, 720, 8, 128)),
}
NUM_MAX_NVL_PEERS = 8
DEEPEP_SOURCE_META_BYTES = 8
"""`internode::get_source_meta_bytes()`: SourceMeta's two ints (src_rdma_rank, is_token_in_nvl_rank_bits)."""
_MAX_TOPK = 128
_MAX_SCALES = 128


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def deepep_ll_buffer_bytes(model: ModelSpec, cap: int, ep: int) -> int:
    """Bytes of DeepEP's low-latency RDMA buffer on each GPU of an `ep`-rank expert-parallel group
    whose ranks dispatch at most `cap` tokens per call (`get_low_latency_rdma_size_hint`). As in
    DeepEP's layout, `ep` does not change the size (every rank can receive from every expert's
    senders). A model without MoE layers needs none (0)."""
    if not isinstance(cap, int) or cap < 1:
        raise ValueError(f"cap (tokens dispatched per rank) must be a positive integer, got {cap!r}")
    if not isinstance(ep, int) or ep < 1:
        raise ValueError(f"ep must be a positive integer, got {ep!r}")
    if model.moe is None or not model.num_moe_layers:
        return 0
    experts, hidden = model.moe.num_experts, model.hidden_size
    scales = hidden // 128
    dispatch_msg = 16 + max(2 * hidden, hidden + 4 * scales)
    combine_msg = 4 * scales + 2 * hidden
    send = max(cap * dispatch_msg, experts * cap * combine_msg)
    recv = experts * cap * max(dispatch_msg, combine_msg)
    signaling = _align(experts * 4, DEEPEP_ALIGNMENT_BYTES)
    total = 2 * send + 2 * recv + 2 * signaling
    return (total + DEEPEP_ALIGNMENT_BYTES) // DEEPEP_ALIGNMENT_BYTES * DEEPEP_ALIGNMENT_BYTES


def uses_deepep_low_latency(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> bool:
    """Whether the engine runs DeepEP's low-latency kernels: an MoE model with expert parallelism over
    attention-DP ranks on a GPU DeepEP's low-latency kernels support, on the backend autoshard's lines
    pass (not a vLLM line read back on allgather_reducescatter, `ServeConfig.all2all_backend`, which
    allocates no DeepEP buffer: `AgRsAll2AllManager` has no handle, and its NCCL symmetric-memory scratch
    is off unless VLLM_USE_NCCL_SYMM_MEM=1, vllm/envs.py in 0.33.0)."""
    return (
        cfg.all2all_backend is None
        and model.moe is not None
        and model.num_moe_layers > 0
        and cfg.expert_parallel
        and cfg.dp_attention > 1
        and gpu_generation(gpu.name) in DEEPEP_LL_GENERATIONS
    )


def scattered_deepep(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> bool:
    """Whether the engine is an SGLang expert-parallel prefill or decode instance without attention DP
    that runs DeepEP (autoshard's SGLang lines pass `--moe-a2a-backend deepep` to expert-parallel split
    instances over more than one node: `serve.engines.sglang_deepep`, which sets `cfg.deep_gemm` for
    them; its aggregated lines only to attention-DP engines). SGLang then runs its MoE layers
    "scattered": with an all-to-all backend `LayerScatterModes._compute_mlp_mode`
    (python/sglang/srt/layers/communicator.py) gives sparse layers ScatterMode.SCATTERED, so the
    attention output is reduce-scattered over the TP group, each TP rank dispatches and combines its
    1/TP of the tokens through DeepEP, and the next layer all-gathers them: the data movement of an
    attention-DP engine of TP ranks with one GPU each (`serve.sharding.ep_dispatch_s`)."""
    return (
        cfg.engine == "sglang"
        and cfg.role != "aggregated"
        and cfg.deep_gemm
        and cfg.expert_parallel
        and cfg.dp_attention == 1
        and cfg.tp > 1
        and model.moe is not None
        and model.num_moe_layers > 0
        and gpu_generation(gpu.name) in DEEPEP_LL_GENERATIONS
    )


def deepep_ll_engine_bytes(
    model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig, *, gpus_per_node: int = NUM_MAX_NVL_PEERS
) -> float:
    """Non-torch bytes DeepEP holds on each GPU of an engine: 0 for engines that run no DeepEP
    (`uses_deepep_low_latency`, `scattered_deepep`); an SGLang engine (`cfg.engine`): `deepep_sglang_engine_bytes`; a vLLM prefill
    instance (high-throughput backend): `vllm_deepep_ht_bytes`; any other vLLM engine (low-latency
    backend): the RDMA buffer at `vllm_deepep_ll_cap` tokens per rank plus vLLM's NVLink buffer.
    `gpus_per_node`: the node the engine's EP group is laid out on (whether it spans nodes)."""
    if cfg.engine == "sglang":
        return deepep_sglang_engine_bytes(model, gpu, cfg)
    if not uses_deepep_low_latency(model, gpu, cfg):
        return 0.0
    if cfg.role == "prefill":
        return float(vllm_deepep_ht_bytes(cfg, gpus_per_node))
    return float(deepep_ll_buffer_bytes(model, vllm_deepep_ll_cap(cfg), cfg.ep) + VLLM_DEEPEP_NVL_BYTES)


def deepep_buffer_label(cfg: ServeConfig) -> str:
    """What an engine's DeepEP buffer (`deepep_ll_engine_bytes`) is, by the kernels its line runs: an
    SGLang engine's `--deepep-mode auto` holds the normal and the low-latency kernels' buffers
    (`deepep_sglang_engine_bytes`), a vLLM prefill instance's `deepep_high_throughput` the normal
    kernels' (`vllm_deepep_ht_bytes`), any other vLLM engine's `deepep_low_latency` the low-latency
    ones'."""
    if cfg.engine == "sglang":
        return "DeepEP normal + low-latency buffers"
    if cfg.role == "prefill":
        return "DeepEP high-throughput buffers"
    return "DeepEP low-latency buffers"


def vllm_deepep_ll_cap(cfg: ServeConfig) -> int:
    """Tokens per rank vLLM's DeepEP low-latency buffer holds (`num_max_dispatch_tokens_per_rank`): the
    engine's step budget `max_num_batched_tokens` in vLLM 0.33.0, its DP chunk where it chunks
    (`ServeConfig.moe_dp_chunk`, vLLM 0.11.0)."""
    return cfg.moe_dp_chunk if cfg.moe_dp_chunk is not None else cfg.max_num_batched_tokens


def vllm_deepep_ll_budget(seqs: int, drafts: int = 0) -> int:
    """The smallest --max-num-batched-tokens a vLLM 0.33.0 engine on DeepEP's low-latency backend with
    `seqs` running requests per DP rank, each sending 1 + `drafts` MTP tokens a step, takes: its decode
    tokens (one MoE pass, which the buffer must hold; vLLM also requires the budget >= --max-num-seqs)
    rounded up to VLLM_LL_BUDGET_STEP, at least vLLM's own default of 256 for the backend."""
    if not isinstance(seqs, int) or seqs < 1 or not isinstance(drafts, int) or drafts < 0:
        raise ValueError(f"seqs must be a positive and drafts a non-negative integer, got {seqs!r}, {drafts!r}")
    return max(VLLM_MOE_DP_CHUNK_SIZE, _align(seqs * (1 + drafts), VLLM_LL_BUDGET_STEP))


def vllm_deepep_ht_bytes(cfg: ServeConfig, gpus_per_node: int) -> int:
    """Bytes of the DeepEP `Buffer` vLLM's high-throughput backend (`--all2all-backend
    deepep_high_throughput`, autoshard's prefill instances) creates on each GPU:
    `DeepEPHTAll2AllManager._make_all2all_kwargs` (vllm/distributed/device_communicators/all2all.py,
    lines 261-283 in vLLM 0.33.0, the same sizes in 0.11.0) passes num_nvl_bytes =
    VLLM_DEEPEP_BUFFER_SIZE_MB MiB (default 1024, vllm/envs.py) and num_rdma_bytes the same when the
    EP group spans nodes (`self.internode`: not every rank on rank 0's node), else 0, and
    low_latency_mode=False: no low-latency buffer. 1 GiB on one node, 2 GiB across nodes, whatever
    the model (the low-latency layout grows with experts x hidden: 4.55 GiB for DeepSeek-V3)."""
    internode = cfg.gpus > max(1, gpus_per_node)  # DP outermost: each PP stage's EP group spans the engine's nodes
    return VLLM_DEEPEP_NVL_BYTES + (VLLM_DEEPEP_NVL_BYTES if internode else 0)


def vllm_runs_cuda_graphs(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> bool:
    """Whether vLLM captures CUDA graphs for this engine: not on DeepEP's high-throughput backend with
    DP > 1, where `CompilationConfig` sets cudagraph_mode to NONE ("DeepEP high-throughput kernels are
    optimized for prefill and are incompatible with CUDA Graphs": vllm/config/compilation.py lines
    1243-1257 in vLLM 0.33.0), so autoshard's vLLM prefill instances on it hold no graph pool."""
    if not cfg.cuda_graphs:
        return False
    return not (cfg.engine == "vllm" and cfg.role == "prefill" and uses_deepep_low_latency(model, gpu, cfg))


def runs_cuda_graphs(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> bool:
    """Whether the engine captures CUDA graphs (holds a graph pool): vLLM's rule
    (`vllm_runs_cuda_graphs`); an SGLang prefill instance never does: `ServerArgs._handle_disaggregation`
    sets disable_cuda_graph for `--disaggregation-mode prefill` ("Cuda graph is disabled for prefill
    server", sgl-project/sglang python/sglang/srt/server_args.py)."""
    if cfg.engine == "sglang":
        return cfg.cuda_graphs and cfg.role != "prefill"
    return vllm_runs_cuda_graphs(model, gpu, cfg)


def sglang_deepep_tokens(seqs: int, drafts: int = 0) -> int:
    """SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK autoshard's SGLang lines set for `seqs` running
    requests per attention-DP rank with `drafts` MTP draft tokens each: the decode tokens per rank
    rounded up to SGLANG_DEEPEP_TOKENS_STEP, at most SGLANG_DEEPEP_TOKENS_MAX."""
    if not isinstance(seqs, int) or seqs < 1 or not isinstance(drafts, int) or drafts < 0:
        raise ValueError(f"seqs must be a positive and drafts a non-negative integer, got {seqs!r}, {drafts!r}")
    tokens = _align(seqs * (1 + drafts), SGLANG_DEEPEP_TOKENS_STEP)
    return min(SGLANG_DEEPEP_TOKENS_MAX, tokens)


def deepep_normal_buffer_bytes(hidden_bytes: int, ranks: int) -> tuple[int, int]:
    """(NVLink bytes, RDMA bytes) of DeepEP's normal (high-throughput) kernels for an `ranks`-rank EP
    group moving `hidden_bytes` per token: the larger of the dispatch and combine configs'
    `get_nvl_buffer_size_hint` / `get_rdma_buffer_size_hint` (deepseek-ai/DeepEP csrc/config.hpp), as
    SGLang sizes them. The RDMA part is 0 inside one node (<= 8 ranks)."""
    if ranks not in _DEEPEP_NORMAL_CONFIGS:
        raise ValueError(f"DeepEP has no config for {ranks} EP ranks (it has {', '.join(map(str, DEEPEP_EP_RANKS))})")
    channels = DEEPEP_NUM_SMS // 2
    rdma_ranks, nvl_ranks = max(ranks // NUM_MAX_NVL_PEERS, 1), min(ranks, NUM_MAX_NVL_PEERS)
    per_token = hidden_bytes + DEEPEP_SOURCE_META_BYTES + _MAX_TOPK * 8 + _MAX_TOPK * 4 + _MAX_SCALES * 4
    nvl = rdma = 0
    for _, nvl_recv, rdma_send, rdma_recv in _DEEPEP_NORMAL_CONFIGS[ranks]:
        n = channels * nvl_ranks * (2 * rdma_ranks + 3) * 4 + channels * nvl_ranks * nvl_recv * per_token
        nvl = max(nvl, _align(n, DEEPEP_ALIGNMENT_BYTES))
        if ranks > NUM_MAX_NVL_PEERS:
            recv = _align(rdma_recv, rdma_send)  # Config rounds the RDMA receive tokens up to the send chunk
            r = channels * rdma_ranks * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
            r += channels * rdma_ranks * recv * (per_token + 16) * 2  # plus an int4 per token
            rdma = max(rdma, _align(r + 1048576, DEEPEP_ALIGNMENT_BYTES))
    return nvl, rdma


def deepep_sglang_engine_bytes(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> float:
    """Bytes of the DeepEP buffer SGLang's `--moe-a2a-backend deepep --deepep-mode auto` allocates on
    each GPU (see the module docstring): the NVLink buffer of the normal kernels plus the larger of
    their RDMA buffer and the low-latency one at `sglang_deepep_tokens` of the engine's running
    requests; 0 for engines that run no DeepEP (`uses_deepep_low_latency`). An EP size DeepEP has no
    config for keeps the low-latency buffer alone (SGLang does not start such an engine: it is left
    out, `costmodel.serve.engines.sglang_priced`)."""
    if not (uses_deepep_low_latency(model, gpu, cfg) or scattered_deepep(model, gpu, cfg)):
        return 0.0
    cap = sglang_deepep_tokens(cfg.max_num_seqs, cfg.speculative_tokens)
    low_latency = deepep_ll_buffer_bytes(model, cap, cfg.ep)
    if cfg.ep not in _DEEPEP_NORMAL_CONFIGS:
        return float(low_latency)
    hidden_bytes = model.hidden_size * (1 if cfg.weight_dtype is WeightDtype.FP8 else 2)
    nvl, rdma = deepep_normal_buffer_bytes(hidden_bytes, cfg.ep)
    return float(nvl + max(rdma, low_latency))
