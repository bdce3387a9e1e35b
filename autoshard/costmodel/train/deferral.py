"""Megatron-Core's deferred output-layer weight gradient (`defer_embedding_wgrad_compute`,
`wgrad_deferral_limit`; NeMo 2.x `MegatronCommOverlapCallback`, which the performance recipes of
GPT-3 175B, Llama 3 70B / 3.1 405B and Nemotron-4 340B turn on).

With it, the output layer's backward (core_v0.12.0 `tensor_parallel/layers.py:454-457`) keeps its
output gradient (and the forward its input, :931-933) instead of running the wgrad GEMM, for the
first `limit` backward calls of the step (0: all of them); after the schedule,
`finish_embedding_wgrad_compute` (`pipeline_parallel/schedules.py`) runs the kept GEMMs on the last
pipeline rank, whose drain leaves it idle while the other ranks finish their backwards. So the last
rank's steady state loses those wgrad GEMMs, the flush gains them, and only what exceeds the
drain's idle time lengthens the step; the buffers hold one logits gradient and one layer input per
deferred call until then. Megatron requires PP > 1 and gradient-accumulation fusion.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoshard.costmodel.compute import gemm_time_s, wgrad_time_s
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import layer_gemms
from autoshard.costmodel.train.memory import BF16, TrainFramework
from autoshard.costmodel.train.types import TrainConfig
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = ["deferred_calls", "output_wgrad_s", "deferral_buffer_bytes", "apply_deferral"]

BACKWARD_SHARE = 2.0 / 3.0
"""Share of a rank's per-micro-batch time spent in backward (backward is twice forward, the
convention of costmodel.compute): the drain leaves the last rank idle for the other ranks' backwards."""


def deferred_calls(model: ModelSpec, cfg: TrainConfig) -> int:
    """Output-layer backward calls per step whose wgrad waits for the flush: every call (the main
    head and each MTP head) of every micro-batch, capped at the limit; 0 when deferral is off or
    cannot apply (PP 1, or a framework without Megatron's fused gradient accumulation)."""
    if not cfg.defer_embedding_wgrad or cfg.dims.pp < 2:
        return 0
    if cfg.framework not in (TrainFramework.MEGATRON, TrainFramework.NEMO):
        return 0
    calls = cfg.num_microbatches * (1 + model.mtp_num_layers)
    return calls if cfg.wgrad_deferral_limit == 0 else min(calls, cfg.wgrad_deferral_limit)


def output_wgrad_s(model: ModelSpec, pool: PoolSpec, cfg: TrainConfig) -> float:
    """One output-layer wgrad GEMM (BF16, accumulated into the main gradient), one micro-batch."""
    gpu = training_gpu(pool.gpu)
    tokens = cfg.micro_batch_size * cfg.seq_len // cfg.dims.cp
    main_grad = 4 if cfg.grad_reduce_fp32 else 2
    return sum(wgrad_time_s(g, gpu, cfg.precision, main_grad)
               for g in layer_gemms(model, LayerKind.OUTPUT, tokens=tokens, dims=cfg.dims))


def deferral_buffer_bytes(model: ModelSpec, cfg: TrainConfig) -> float:
    """Bytes one deferred call keeps until the flush: the BF16 logits gradient (tokens x vocab/TP) and
    the layer's input (tokens x h, split by TP with sequence parallelism)."""
    dims = cfg.dims
    tokens = cfg.micro_batch_size * cfg.seq_len // dims.cp
    logits = -(-model.vocab_size // dims.tp)
    return tokens * BF16 * (logits + model.hidden_size / (dims.tp if cfg.sequence_parallel else 1))


def apply_deferral(model: ModelSpec, pool: PoolSpec, cfg: TrainConfig,
                   rank_time: Sequence[float]) -> tuple[float, float, float]:
    """(seconds the last pipeline rank no longer spends per micro-batch, the deferred wgrad averaged
    over the micro-batches; seconds the flush adds beyond that rank's drain idle time, the other
    ranks' backwards over VPP; bytes the last rank keeps for the flush)."""
    d = deferred_calls(model, cfg)
    if d == 0:
        return 0.0, 0.0, 0.0
    w = output_wgrad_s(model, pool, cfg)
    idle = BACKWARD_SHARE * sum(rank_time[:-1]) / cfg.dims.vpp
    return d * w / cfg.num_microbatches, max(0.0, d * w - idle), d * deferral_buffer_bytes(model, cfg)
