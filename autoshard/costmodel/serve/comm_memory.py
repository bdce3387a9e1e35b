"""What NCCL holds on each GPU of a serving engine: its communicators, NVLink SHARP (NVLS) buffers and
the non-torch memory vLLM's profile sees, and where each lands in vLLM's accounting (see
`autoshard.costmodel.serve.memory`, which charges them).

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.specs.cluster import LinkKind, PoolSpec
from autoshard.units import GIB, MIB

__all__ = [
    "NON_TORCH_BYTES",
    "NCCL_COMMUNICATOR_BYTES",
    "NVLS_BYTES_PER_RANK",
    "engine_comm_bytes",
    "engine_nvls_bytes",
    "engine_reserved_bytes",
    "nvls_bytes",
    "nvls_group_ranks",
    "startup_comm_bytes",
]

NON_TORCH_BYTES = 256 * MIB
"""NCCL connections a multi-GPU engine's profiling forward opens after vLLM's baseline snapshot (vLLM
logs them as "non-torch memory", typically 0.1-0.5 GiB on a multi-GPU engine), NVLS buffers apart
(`engine_comm_bytes`)."""
NCCL_COMMUNICATOR_BYTES = 1.5 * GIB
"""Device memory of one NCCL communicator that has run its all-reduces (channel buffers for every
protocol and peer, proxy and work FIFOs): "about 1.6GB" measured for one communicator after an
all-reduce (NVIDIA/nccl issue #864). On NVSwitch Hopper at more than 2 ranks NCCL adds NVLink SHARP
buffers on top (NCCL's own log on 8 H200: "nvlsTotalSize 2415919104", vllm-project/vllm issue #9699),
so this is the smaller, general figure. A one-GPU engine creates no communicator at all."""
NVLS_BYTES_PER_RANK = 301_989_888
"""NCCL's NVLink SHARP (NVLS) buffers, per rank of the group: NCCL enables NVLS on NVSwitch systems of
Hopper and later for groups of more than 2 GPUs, and every GPU of the group backs the whole
multicast buffer, ranks x this (NCCL's own log on 8 H200: "NVLS comm ... nHeads 8 buffSize 4194304
... nvlsPerRankSize 301989888 nvlsTotalSize 2415919104", i.e. 2.25 GiB per GPU at TP 8,
vllm-project/vllm issue #9699, which measured the KV cache it costs; NeMo's launcher and SGLang turn
NVLS off to save that memory)."""
NVLS_GENERATIONS = ("hopper", "blackwell")


def nvls_bytes(pool: PoolSpec, *, ranks: int) -> float:
    """NCCL's NVLink SHARP buffers on each GPU of a `ranks`-GPU group: NVLS_BYTES_PER_RANK per rank of
    the group inside one NVLink domain (on a rack-scale domain at most the GPUs a rack holds of consecutive
    ranks, `PoolSpec.domain_fill_size`), on NVSwitch nodes of Hopper and later, for more than 2 ranks;
    none elsewhere (PCIe, Ampere, Ada, AMD)."""
    local = min(ranks, pool.domain_fill_size)
    if local <= 2 or pool.node.intra_node_link not in (LinkKind.NVLINK, LinkKind.NVLINK_SWITCH):
        return 0.0
    if gpu_generation(pool.gpu.name) not in NVLS_GENERATIONS:
        return 0.0
    return local * NVLS_BYTES_PER_RANK


def nvls_group_ranks(cfg: ServeConfig) -> tuple[int, ...]:
    """The engine's NCCL communicators that run collectives, by ranks: the TP group (all-reduces) and,
    with expert parallelism over attention-DP ranks, the DP group vLLM's default all-to-all runs its
    all-gather (dispatch) and reduce-scatter (combine) on (`AgRsAll2AllManager`, vLLM
    `distributed/device_communicators/all2all.py`: `get_dp_group().all_gatherv`). The PP group only
    sends and receives, which NVLS does not serve."""
    groups = [cfg.tp]
    if cfg.dp_attention > 1 and (cfg.expert_parallel or cfg.engine == "vllm"):  # vLLM without EP: the same
        groups.append(cfg.dp_attention)
    elif cfg.dp_attention > 1:  # SGLang's attention DP with TP experts: the gather and combine over all TP x DP
        groups.append(cfg.moe_tp)
    return tuple(groups)


def engine_nvls_bytes(pool: PoolSpec | None, cfg: ServeConfig) -> float:
    """NCCL's NVLS buffers on each GPU of the engine: those of every communicator of
    `nvls_group_ranks` (each holds its own) where NCCL enables them and the engine leaves NVLS on
    (`cfg.nccl_nvls`); none on a one-GPU engine or without a pool (no node known)."""
    if cfg.gpus <= 1 or pool is None or not cfg.nccl_nvls:
        return 0.0
    return sum(nvls_bytes(pool, ranks=r) for r in nvls_group_ranks(cfg))


def engine_comm_bytes(pool: PoolSpec | None, cfg: ServeConfig) -> float:
    """Per-GPU communication memory vLLM's profile charges against its budget ("non-torch memory",
    measured after the communicators exist): NON_TORCH_BYTES on a multi-GPU engine, none on one GPU.
    NVLS buffers are not in it: they are allocated with the communicators, before the snapshot
    (`startup_comm_bytes`)."""
    del pool  # the same on every node: what the profiling forward connects
    return NON_TORCH_BYTES if cfg.gpus > 1 else 0.0


def startup_comm_bytes(pool: PoolSpec | None, cfg: ServeConfig) -> float:
    """What NCCL holds on each GPU before vLLM's baseline snapshot, outside gpu_memory_utilization: at
    least one communicator (NCCL_COMMUNICATOR_BYTES) plus the NVLS buffers of `engine_nvls_bytes`,
    counting at most one node's ranks per group (NCCL's log shows one head per GPU of an 8-GPU node;
    multi-node NVLink domains are not measured here); none on one GPU. A lower bound (vLLM builds more
    than one communicator per group) used to refuse engines whose headroom cannot hold it."""
    if cfg.gpus <= 1:
        return 0.0
    if pool is None or not cfg.nccl_nvls:
        return NCCL_COMMUNICATOR_BYTES
    per_node = pool.node.gpus_per_node
    return NCCL_COMMUNICATOR_BYTES + sum(nvls_bytes(pool, ranks=min(r, per_node)) for r in nvls_group_ranks(cfg))


def engine_reserved_bytes(pool: PoolSpec, *, gpus: int) -> float:
    """Device memory an engine of `gpus` GPUs (TP x PP) holds per GPU besides weights, activations and
    KV cache: the GPU type's `reserved_memory_gib` (CUDA context, cuBLAS workspace, runtime and NCCL
    ring buffers) for a multi-GPU engine, plus NCCL's NVLS buffers where NCCL enables them
    (`nvls_bytes`); a one-GPU engine creates no NCCL communicator and holds NCCL_COMMUNICATOR_BYTES less
    (never below zero). Used for engines that size their KV cache as a fraction of the memory left
    after loading (TensorRT-LLM's kv_cache_free_gpu_mem_fraction); vLLM's own accounting
    (`serve_memory`) charges what its profile sees (`engine_comm_bytes`) and keeps the communicators
    and the same NVLS buffers in the headroom outside its budget (`startup_comm_bytes`)."""
    reserved = pool.gpu.efficiency.reserved_memory_gib * GIB
    if gpus > 1:
        return reserved + nvls_bytes(pool, ranks=gpus)
    return max(reserved - NCCL_COMMUNICATOR_BYTES, 0.0)
