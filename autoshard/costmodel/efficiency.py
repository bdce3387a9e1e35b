"""Where a GPU's efficiency factors come from: fitted on published runs of that GPU, or borrowed
from another GPU's fit (its predictions then scale that fit by datasheet peaks and are less sure)."""

from __future__ import annotations

from functools import lru_cache

from autoshard.specs.cluster import TRAIN_KNOBS, GpuSpec, PoolSpec

__all__ = ["efficiency_source", "is_borrowed", "training_gpu", "training_pool", "KERNEL_TRAIN_KNOBS"]

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
# On CDNA 3 (MI300X, MI325X: one gfx942 die, 1,307.4 TFLOP/s dense BF16), AMD's hand-written assembly
# attention kernels that Transformer Engine's ROCm build (NVTE_CK_USES_FWD_V3/BWD_V3) and Primus-Turbo
# run, measured by AMD on MI300X: ROCm/aiter op_tests/cpp/mha/README.md (added in a83421be, 2025-10-31,
# unchanged at e4048607), BF16, BSHD, head dim 128, GQA, 9 configurations (batch 1/4/8 x 32:8, 64:8,
# 64:4 query:KV heads; 2 at 16k), causal TFLOP/s counted on half the square like FlashAttention's (the
# benchmark at a83421be counts the full square; the table's causal entries are its figures halved:
# x.xx5 values, 0.9x the non-causal ones at 8k). Backward with FP32 dQ atomics ("a32"), the path gfx942
# trains with (AMD-AGI/Primus fd1eeab docs/01-getting-started/bare-metal-installation.md: with FP16
# atomics the v3 backward gives Inf gradients on MI300X/MI325X). Median over the configurations at
# 1k/2k/4k/8k/10k/16k tokens: forward 315/419/509/541/547/543, backward 258/327/402/433/441/416;
# blended as above 272/349/428/459/467/446 TFLOP/s: 0.33 of peak at 4,096 tokens (0.36 with the FP16-
# atomic backward), and the least-squares s0 over 1k-16k is 850 (tests/costmodel/test_train_physics.py
# recomputes both).
KERNEL_TRAIN_KNOBS: dict[str, dict[str, float]] = {
    "hopper": {"attention": 0.45, "attention_half_seq": 630.0},
    "cdna3": {"attention": 0.33, "attention_half_seq": 850.0},
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


@lru_cache(maxsize=1024)
def training_pool(pool: PoolSpec) -> PoolSpec:
    """`pool` with its GPU's training efficiencies (training_gpu): what the training step's
    collectives (their bandwidth fractions, TP overlap) and GEMMs read."""
    gpu = training_gpu(pool.gpu)
    return pool if gpu is pool.gpu else pool.model_copy(update={"gpu": gpu})


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
