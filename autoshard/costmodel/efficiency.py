"""Where a GPU's efficiency factors come from: fitted on published runs of that GPU, or borrowed
from another GPU's fit (its predictions then scale that fit by datasheet peaks and are less sure)."""

from __future__ import annotations

from functools import lru_cache

from autoshard.specs.cluster import TRAIN_KNOBS, GpuSpec

__all__ = ["efficiency_source", "is_borrowed", "training_gpu", "KERNEL_TRAIN_KNOBS"]

# Fused causal attention in training, measured at kernel level instead of fitted: on Hopper, cuDNN's
# fused attention (what Transformer Engine runs on H100) at head dim 128 in BF16, FlashAttention-3
# paper (Shah et al. 2024, arXiv:2407.08608, Figs. 5-6, H100 80GB SXM5): causal forward 410/484/518/
# 529/539 TFLOP/s at 1k/2k/4k/8k/16k tokens, backward (non-causal, scaled by the forward's causal/
# non-causal ratio) 408/465/499/518/516 x that ratio. A training step runs forward + backward at 1 : 2.5
# FLOPs, so per sequence length the blended speed is 3.5 / (1/fwd + 2.5/bwd): 448 TFLOP/s = 0.45 of
# the dense BF16 peak at 4,096 tokens, and r(s) = s / (s + 630) fits its rise over 1k-16k
# (tests/costmodel/test_train_physics.py recomputes both). The published training runs cannot pin this
# knob: without the long-context runs no run spends enough of its step in attention, and the dense
# runs of 2023-24 software measure older kernels (README, "Accuracy against published runs").
KERNEL_TRAIN_KNOBS: dict[str, dict[str, float]] = {
    "hopper": {"attention": 0.45, "attention_half_seq": 630.0},
}
"""Per GPU generation (autoshard.costmodel.band_table.gpu_generation): training efficiency knobs taken
from kernel benchmarks; tests/validation/fit_efficiency.py holds them fixed instead of fitting them."""


@lru_cache(maxsize=1024)
def training_gpu(gpu: GpuSpec) -> GpuSpec:
    """`gpu` with the efficiencies a training step uses (EfficiencySpec.training(): the train_*
    overrides in place of the shared knobs serving uses)."""
    eff = gpu.efficiency
    if all(getattr(eff, "train_" + k) is None for k in TRAIN_KNOBS):
        return gpu
    return gpu.model_copy(update={"efficiency": eff.training()})


def is_borrowed(gpu: GpuSpec) -> bool:
    eff = gpu.efficiency
    return eff.fitted_gpu is None or eff.fitted_gpu != gpu.name or eff.fitted_runs == 0


def efficiency_source(gpu: GpuSpec) -> str:
    """'fitted on N runs' or 'borrowed from <GPU>' (or 'not fitted on any published run')."""
    eff = gpu.efficiency
    if eff.fitted_gpu is None or eff.fitted_runs == 0:
        return "not fitted on any published run"
    if eff.fitted_gpu != gpu.name:
        return f"borrowed from {eff.fitted_gpu}"
    return f"fitted on {eff.fitted_runs} runs"
