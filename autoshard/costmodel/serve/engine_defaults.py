"""What vLLM 0.33.0 and SGLang 0.5.23 choose by default at start-up that sets an engine's memory: the
KV-cache block (page) of the attention backend they select, and the batch sizes they capture decode CUDA
graphs at. `autoshard.costmodel.serve.memory` charges both.

KV blocks. A request of L tokens holds ceil(L / block) whole blocks, and the pool holds whole blocks.
- vLLM: the block is the attention backend's preferred size, unless --block-size is given
  (`Platform.update_block_size_for_backend`, vllm/platforms/interface.py:750-780; one backend:
  `AttentionBackend.get_preferred_block_size`, vllm/v1/attention/backend.py:155-163: the default 16
  where the backend takes it, else its smallest supported size). MLA models on CUDA take the first
  valid backend of `_get_backend_priorities` (vllm/platforms/cuda.py:96-153): on Hopper FLASH_ATTN_MLA
  (MultipleOf(16): 16-token blocks; BF16/FP16 caches only, flashattn_mla.py:40-50), so an FP8 cache
  runs FLASHMLA, whose kernels take only 64 (flashmla.py:56-58); on datacenter Blackwell (SM100 family)
  FLASHINFER_MLA ([32, 64]: 32-token blocks, flashinfer_mla.py:204-205; it needs qk_nope_head_dim in
  64/128/192, which DeepSeek's 128 is); elsewhere TRITON_MLA (MultipleOf(16)). Other models run
  FLASH_ATTN (Hopper and older) or FLASHINFER (Blackwell), both taking 16.
- SGLang: `--page-size` defaults to 1 (`_page_size_default`, srt/arg_groups/overrides.py:1342-1363), so its
  pool is token-granular, except under backends that force a page (`_mla_backend_page_constraints`,
  overrides.py:1143-1200): DeepSeek-V3-architecture models (V3/R1, Kimi-K2) on SM100 run trtllm_mla
  (srt/arg_groups/model_overrides/deepseek_v2.py:177-187), forced to 64; other models there run
  trtllm_mha (`get_default_attn_backend`, model_override_base.py:278-320), also forced to 64 from the
  default. On Hopper MLA and MHA run fa3, page 1.

CUDA graphs.
- vLLM (`VllmConfig._set_cudagraph_sizes`, vllm/config/vllm.py:2451-2600): a ceiling of
  min(2 x max_num_seqs x q, 1024 on the SM100 family else 512) tokens, q = 1 + draft tokens; the sizes
  1, 2, 4, steps of 8 below 256 and of 16 from 256, all at most min(ceiling, max_num_batched_tokens),
  plus max_num_batched_tokens where it fits under that, plus max_num_seqs itself (q = 1, when within
  the ceiling) or, with drafts, q x each request count of the same 1/2/4/8/16 grid up to max_num_seqs
  that fits the ceiling.
- SGLang (`handle_gpu_memory_settings`, srt/arg_groups/memory_hook.py:47-190;
  `generate_decode_cuda_graph_batch_sizes`, cuda_graph_hook.py:500-533): a largest batch by HBM and
  --tp-size (`SGLANG_MAX_BS_TIERS`: 256 requests on 80 GB and 141 GB parts below --tp-size 4, else 512),
  capped at
  --max-running-requests when not given (`--cuda-graph-max-bs-decode` autoshard's DeepEP lines pass is),
  over the list 1, 2, 4, 8, 12, steps of 8 from 16 to 256, of 16 to 496, of 32 from 512 (with drafts:
  1-8, steps of 2 to 32, of 4 to 64, of 8 to 256, of 16 beyond), plus the largest; the runner keeps the
  sizes up to the requests per DP rank and adds that count (`get_batch_sizes_to_capture`,
  srt/model_executor/runner/base_cuda_graph_runner.py:65-102). A graph runs bs x (1 + drafts) tokens.

SGLang's memory baseline. SGLang sizes its KV pool as --mem-fraction-static of the memory free after its
parallel initialization, not of the GPU's capacity: `measure_pre_model_load_memory`
(srt/distributed/bootstrap.py:193-223, "Call after parallel initialization and before allocating model
weights") takes B = the free memory then (the minimum over ranks), and the pool is what is free after the
weights load less B x (1 - fraction) (`_profile_available_bytes`,
srt/mem_cache/kv_cache_configurator.py:2990-3061), i.e. fraction x B - weights. B is the capacity less the
CUDA context (`CUDA_CONTEXT_BYTES`) and NCCL's communicators, NVLS off as SGLang runs it
(`comm_memory.startup_comm_bytes`): `sglang_baseline_bytes`.

Pure functions of the specs: no I/O.
"""

from __future__ import annotations

import dataclasses
import math

from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.serve.comm_memory import startup_comm_bytes
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.specs.cluster import GpuSpec, PoolSpec
from autoshard.specs.job import WeightDtype
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB, MIB

__all__ = [
    "VLLM_BLOCK_TOKENS",
    "FLASHMLA_BLOCK_TOKENS",
    "FLASHINFER_MLA_BLOCK_TOKENS",
    "SGLANG_SM100_PAGE_TOKENS",
    "kv_block_tokens",
    "vllm_capture_sizes",
    "sglang_capture_batch_sizes",
    "capture_sizes",
    "CUDA_CONTEXT_BYTES",
    "sglang_baseline_bytes",
]

VLLM_BLOCK_TOKENS = 16
"""vLLM's `CacheConfig.DEFAULT_BLOCK_SIZE` (vllm/config/cache.py:185), kept by backends that take it."""
FLASHMLA_BLOCK_TOKENS = 64
"""FlashMLA's only block size (`FlashMLABackend.get_supported_kernel_block_sizes`)."""
FLASHINFER_MLA_BLOCK_TOKENS = 32
"""FlashInfer MLA's smallest block ([32, 64]), which vLLM picks when 16 is not supported."""
SGLANG_SM100_PAGE_TOKENS = 64
"""The page SGLang forces for trtllm_mla / trtllm_mha when none is given."""
VLLM_MAX_CAPTURE = 512
VLLM_MAX_CAPTURE_SM100 = 1024
CUDA_CONTEXT_BYTES = 81559 * MIB - 78.59 * GIB
"""Memory in use on a GPU before an engine initializes NCCL (the CUDA context and what the driver keeps),
against the capacity nvidia-smi reports: the H100 of vLLM PR #25359 (vllm-project/vllm, "Fix OOM in vLLM
replicas by ensuring consistent NCCL memory accounting") had 78.59 GiB free before NCCL's initialization,
of the 81,559 MiB (79.65 GiB) an H100 SXM reports: 1.06 GiB."""
SGLANG_MAX_BS_TIERS: tuple[tuple[float, int, int], ...] = (
    (20, 8, 8), (35, 48, 160), (60, 32, 160), (160, 256, 512), (math.inf, 512, 512),
)
"""SGLang's default largest decode graph by HBM (GiB below which, --tp-size < 4, --tp-size >= 4):
`handle_gpu_memory_settings`, srt/arg_groups/memory_hook.py:90-170 (its 90 GiB tier repeats 160's)."""


def _sm100(gpu: GpuSpec) -> bool:
    return gpu_generation(gpu.name) == "blackwell"


def kv_block_tokens(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> int:
    """Tokens per KV-cache block of the engine as its launch line starts it (module docstring):
    `cfg.kv_block_tokens` where set (TensorRT-LLM's tokens_per_block), else vLLM's or SGLang's default
    for the attention backend it selects on this GPU."""
    if cfg.kv_block_tokens is not None:
        return cfg.kv_block_tokens
    if cfg.engine == "sglang":
        return SGLANG_SM100_PAGE_TOKENS if _sm100(gpu) else 1
    if model.mla is None:
        return VLLM_BLOCK_TOKENS
    if _sm100(gpu):
        return FLASHINFER_MLA_BLOCK_TOKENS
    if gpu_generation(gpu.name) == "hopper" and cfg.kv_cache_dtype is WeightDtype.FP8:
        return FLASHMLA_BLOCK_TOKENS
    return VLLM_BLOCK_TOKENS


def _grid(top: int) -> list[int]:
    """vLLM's grid: 1, 2, 4, steps of 8 below 256, steps of 16 from 256, up to `top`."""
    sizes = [i for i in (1, 2, 4) if i <= top]
    sizes += list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    return sizes


def vllm_capture_sizes(
    max_num_seqs: int, *, max_num_batched_tokens: int | None = None, decode_query_len: int = 1,
    max_size: int = VLLM_MAX_CAPTURE,
) -> list[int]:
    """vLLM's default CUDA-graph capture sizes in tokens (module docstring); `max_num_batched_tokens`
    None: no step-budget cap; `max_size` 1024 on the SM100 family."""
    ceiling = min(max_num_seqs * decode_query_len * 2, max_size)
    if decode_query_len > 1:
        counts = sorted(set(_grid(min(max_num_seqs, max_size)) + [min(max_num_seqs, max_size)]))
        uniform = [n * decode_query_len for n in counts if n * decode_query_len <= ceiling]
    else:
        uniform = [max_num_seqs] if max_num_seqs <= ceiling else []
    budget = math.inf if max_num_batched_tokens is None else max_num_batched_tokens
    top = int(min(budget, ceiling))
    sizes = _grid(top)
    if budget <= top:
        sizes.append(int(budget))
    sizes += [s for s in uniform if s <= budget]
    return sorted(set(sizes))


def sglang_capture_batch_sizes(max_bs: int, *, requests: int, drafts: int = 0) -> list[int]:
    """SGLang's decode capture list in requests (module docstring) for a largest batch `max_bs`, kept at
    most `requests` per DP rank (that count added)."""
    if drafts:
        grid = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
                + list(range(272, max_bs + 1, 16)))
    else:
        grid = ([1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
                + list(range(512, max_bs + 1, 32)))
    sizes = [b for b in grid if b <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    if max(sizes) > requests:
        sizes.append(requests)
    return sorted({b for b in sizes if b <= requests})


def capture_sizes(gpu: GpuSpec, cfg: ServeConfig, *, max_bs: int | None = None) -> list[int]:
    """Tokens of each decode graph the engine captures by default on `gpu`. `max_bs`: SGLang's
    --cuda-graph-max-bs-decode where the line passes it (autoshard's DeepEP lines), else its default."""
    q = 1 + cfg.speculative_tokens
    if cfg.engine == "sglang":
        if max_bs is None:
            small, large = next((s, la) for top, s, la in SGLANG_MAX_BS_TIERS if gpu.hbm_gib < top)
            max_bs = small if cfg.tp * cfg.dp_attention < 4 else large  # SGLang's --tp-size is TP x DP
            max_bs = min(max_bs, cfg.max_num_seqs * cfg.dp_attention)  # --max-running-requests
        batches = sglang_capture_batch_sizes(max_bs, requests=cfg.max_num_seqs, drafts=cfg.speculative_tokens)
        return [b * q for b in batches]
    top = VLLM_MAX_CAPTURE_SM100 if _sm100(gpu) else VLLM_MAX_CAPTURE
    return vllm_capture_sizes(cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                              decode_query_len=q, max_size=top)


def sglang_baseline_bytes(pool: PoolSpec, cfg: ServeConfig) -> float:
    """SGLang's memory baseline per GPU (module docstring): the capacity less the CUDA context and the
    NCCL communicators it creates before measuring, with NVLS off as SGLang runs it (at least one
    communicator on a multi-GPU engine, `comm_memory.startup_comm_bytes`; none on one GPU)."""
    nccl = startup_comm_bytes(pool, dataclasses.replace(cfg, nccl_nvls=False))
    return pool.gpu.hbm_gib * GIB - CUDA_CONTEXT_BYTES - nccl
