"""Megatron-Core's deferred output-layer wgrad (defer_embedding_wgrad_compute / wgrad_deferral_limit,
NeMo 2.x performance recipes; costmodel.train.deferral): the last pipeline rank runs the first
`limit` output-layer wgrad GEMMs of a step at the flush, inside its drain idle time, and keeps their
logits gradients and inputs until then."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.costmodel.compute import wgrad_time_s
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import Gemm
from autoshard.costmodel.train.deferral import (
    BACKWARD_SHARE, deferral_buffer_bytes, deferred_calls, output_wgrad_s,
)
from autoshard.costmodel.train.memory import TrainFramework
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import TrainConfig
from autoshard.emit.megatron.layout import default_stages
from autoshard.parallel import ParallelDims
from autoshard.specs import Precision, load_cluster, load_model

LLAMA70 = load_model("llama-3.1-70b")
CLUSTER = load_cluster("dgx-h100").with_gpus(64)
# Megatron-LM examples/llama's 70B plan: TP 4, PP 8, VPP 5, 64 micro-batches of 8,192 tokens
CFG = TrainConfig(dims=ParallelDims(tp=4, pp=8, dp=2, vpp=5), micro_batch_size=1, global_batch_size=128,
                  seq_len=8192, precision=Precision.FP8, tp_comm_overlap=True, grad_reduce_fp32=False,
                  defer_embedding_wgrad=True, wgrad_deferral_limit=22)
STAGES = default_stages(LLAMA70, pp=8, vpp=5)


def test_deferred_calls_follow_megatron():
    assert CFG.num_microbatches == 64
    assert deferred_calls(LLAMA70, CFG) == 22
    assert deferred_calls(LLAMA70, dataclasses.replace(CFG, wgrad_deferral_limit=0)) == 64  # 0: all
    assert deferred_calls(LLAMA70, dataclasses.replace(CFG, wgrad_deferral_limit=100)) == 64
    assert deferred_calls(LLAMA70, dataclasses.replace(CFG, defer_embedding_wgrad=False)) == 0
    pp1 = dataclasses.replace(CFG, dims=ParallelDims(tp=4, dp=16), wgrad_deferral_limit=0)
    assert deferred_calls(LLAMA70, pp1) == 0  # Megatron refuses it without pipeline parallelism
    fsdp = dataclasses.replace(CFG, framework=TrainFramework.FSDP)
    assert deferred_calls(LLAMA70, fsdp) == 0


def test_wgrad_and_buffers_in_closed_form():
    """One wgrad: dW (8192 x 32064) = X^T (8192 x 8192) @ dY (8192 x 32064), BF16, accumulated into the
    BF16 main gradient; one buffer: the BF16 logits gradient (8192 x 32064) and the SP-split input
    (8192 x 8192 / 4)."""
    gpu = training_gpu(CLUSTER.primary.gpu)
    g = Gemm(8192, 32064, 8192, fp8_capable=False)
    assert output_wgrad_s(LLAMA70, CLUSTER.primary, CFG) == pytest.approx(wgrad_time_s(g, gpu, Precision.BF16, 2))
    assert deferral_buffer_bytes(LLAMA70, CFG) == 8192 * 2 * (32064 + 8192 / 4)


def test_step_loses_the_deferred_wgrad_beyond_the_drain_idle_time():
    """The last rank holds the output layer and is the slowest: the step loses 22 wgrads from its
    steady state and gains what of them exceeds its drain idle time (the other ranks' backward, 2/3
    of their time, over VPP); the last rank keeps 22 buffers more."""
    on = predict_train(LLAMA70, CLUSTER, CFG, STAGES)
    off = predict_train(LLAMA70, CLUSTER, dataclasses.replace(CFG, defer_embedding_wgrad=False), STAGES)
    w = output_wgrad_s(LLAMA70, CLUSTER.primary, CFG)
    assert off.rank_time_s[-1] == max(off.rank_time_s)
    assert off.rank_time_s[-1] - on.rank_time_s[-1] == pytest.approx(22 * w / 64, rel=1e-9)
    assert on.rank_time_s[:-1] == off.rank_time_s[:-1]
    idle = BACKWARD_SHARE * sum(off.rank_time_s[:-1]) / 5
    flush = max(0.0, 22 * w - idle)
    assert on.rank_time_s[-1] > max(on.rank_time_s[:-1])  # still the bottleneck: busy time drops by 22 wgrads
    assert 0 < flush < 22 * w  # the drain hides part of the flush, not all of it
    assert off.step_time_s - on.step_time_s == pytest.approx(22 * w - flush, rel=1e-6)
    grown = on.rank_memory_bytes[-1] - off.rank_memory_bytes[-1]
    assert grown >= 22 * deferral_buffer_bytes(LLAMA70, CFG)
    assert on.rank_memory_bytes[:-1] == off.rank_memory_bytes[:-1]
