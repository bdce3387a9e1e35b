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
- vLLM's `DeepEPLLAll2AllManager` (vllm/distributed/device_communicators/all2all.py) creates the
  buffer with cap = `moe.max_num_tokens` = VLLM_MOE_DP_CHUNK_SIZE (256 by default; the same chunk the
  MoE passes of `autoshard.costmodel.serve.compute` use) and the model's global experts, plus an
  NVLink buffer of VLLM_DEEPEP_BUFFER_SIZE_MB (1024 MiB by default) that DeepEP's `Buffer`
  cudaMallocs. Both are allocated after vLLM's memory baseline, so its profiler counts them as
  non-torch memory and the KV cache shrinks by them.
- SGLang (`--moe-a2a-backend deepep`) sizes the same RDMA buffer with cap =
  SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK (128 by default, at most 1024).

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.model import ModelSpec
from autoshard.units import MIB

__all__ = [
    "DEEPEP_ALIGNMENT_BYTES",
    "DEEPEP_LL_GENERATIONS",
    "SGLANG_DEEPEP_MAX_DISPATCH_TOKENS",
    "VLLM_DEEPEP_NVL_BYTES",
    "VLLM_MOE_DP_CHUNK_SIZE",
    "deepep_ll_buffer_bytes",
    "deepep_ll_engine_bytes",
    "uses_deepep_low_latency",
]

DEEPEP_ALIGNMENT_BYTES = 128
"""DeepEP's NUM_BUFFER_ALIGNMENT_BYTES (csrc/kernels/configs.cuh)."""
VLLM_MOE_DP_CHUNK_SIZE = 256
"""vLLM's VLLM_MOE_DP_CHUNK_SIZE default: the tokens per DP rank of one MoE pass and the `cap` of its
DeepEP low-latency buffer (vllm/envs.py)."""
SGLANG_DEEPEP_MAX_DISPATCH_TOKENS = 128
"""SGLang's SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK default (asserted <= 1024 there)."""
VLLM_DEEPEP_NVL_BYTES = 1024 * MIB
"""The NVLink buffer vLLM's DeepEP managers pass as num_nvl_bytes (VLLM_DEEPEP_BUFFER_SIZE_MB, default
1024; vllm/envs.py, vllm/distributed/device_communicators/all2all.py)."""
DEEPEP_LL_GENERATIONS = ("hopper", "blackwell")
"""GPUs DeepEP's low-latency kernels run on (SM90 and later; its SM80 build has intranode kernels
only). AMD engines use other all-to-all libraries (MORI), whose buffers are not modelled here."""


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
    attention-DP ranks (the engines whose decode-only steps `compute.moe_dp_chunks` prices in
    256-token passes) on a GPU DeepEP's low-latency kernels support."""
    return (
        model.moe is not None
        and model.num_moe_layers > 0
        and cfg.expert_parallel
        and cfg.dp_attention > 1
        and gpu_generation(gpu.name) in DEEPEP_LL_GENERATIONS
    )


def deepep_ll_engine_bytes(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> float:
    """Non-torch bytes DeepEP holds on each GPU of a vLLM engine with the low-latency backend: the
    RDMA buffer at cap VLLM_MOE_DP_CHUNK_SIZE plus vLLM's NVLink buffer; 0 for engines that do not
    run it (`uses_deepep_low_latency`)."""
    if not uses_deepep_low_latency(model, gpu, cfg):
        return 0.0
    return float(deepep_ll_buffer_bytes(model, VLLM_MOE_DP_CHUNK_SIZE, cfg.ep) + VLLM_DEEPEP_NVL_BYTES)
