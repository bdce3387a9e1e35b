"""The optimizer step's HBM traffic per framework: Megatron's fused Adam against the eager,
per-tensor AdamW of PyTorch FSDP frameworks (Composer's DecoupledAdamW), counted pass by pass."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.costmodel.train.memory import TrainFramework
from autoshard.costmodel.train.step import optimizer_bytes_per_param, predict_train
from autoshard.costmodel.train.types import TrainConfig
from autoshard.emit.megatron.layout import default_stages
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import Optimizer, load_cluster, load_model

# (reads, writes) per FP32 element of each eager op (composer/optim/decoupled_weight_decay.py)
COMPOSER_ADAMW = [
    (4, 4),  # param.mul_(1 - decay)
    (4, 4), (8, 4),  # exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    (4, 4), (8, 4),  # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    (4, 4), (4, 4), (4, 4),  # exp_avg_sq.sqrt() / sqrt(bias_correction2), .add_(eps)
    (12, 4),  # param.addcdiv_(exp_avg, denom, value=-step_size)
]
CLIP_BY_NORM = [(4, 0), (4, 4)]  # gradient norm, then grads.mul_(clip_coef)


def test_eager_adamw_bytes_are_the_passes():
    assert optimizer_bytes_per_param(Optimizer.ADAM, TrainFramework.FSDP) == sum(
        r + w for r, w in COMPOSER_ADAMW + CLIP_BY_NORM) == 100
    assert optimizer_bytes_per_param(Optimizer.ADAM) == 30  # fused: read p, g, m, v; write p, m, v, BF16 p
    assert optimizer_bytes_per_param(Optimizer.SGD, TrainFramework.FSDP) == 8 + 20 + 12 + 12


def test_fsdp_step_pays_the_eager_optimizer_on_its_shard():
    """Llama-2 7B on 8 H100 under FSDP (ZeRO-3): the optimizer step moves 100 B per local
    parameter instead of Megatron's 30."""
    model = load_model("llama-2-7b")
    cluster = load_cluster("dgx-h100").with_gpus(8)
    cfg = TrainConfig(dims=ParallelDims(dp=8), micro_batch_size=2, global_batch_size=16, seq_len=2048,
                      recompute=Recompute.NONE, zero_stage=3, framework=TrainFramework.FSDP)
    stages = default_stages(model, pp=1, vpp=1)
    fsdp = predict_train(model, cluster, cfg, stages).time.optimizer
    mega = predict_train(model, cluster, dataclasses.replace(cfg, framework=TrainFramework.MEGATRON), stages).time.optimizer
    gpu = cluster.primary.gpu  # a training-time kernel: priced at train_hbm (as the solver's tables do), not serving's hbm
    assert gpu.efficiency.train_hbm != gpu.efficiency.hbm
    local = model.num_params / 8
    assert fsdp == pytest.approx(local * 100 / (gpu.hbm_tbps * 1e12 * gpu.efficiency.train_hbm), rel=1e-3)
    assert fsdp / mega == pytest.approx(100 / 30, rel=1e-9)
