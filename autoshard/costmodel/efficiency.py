"""Where a GPU's efficiency factors come from: fitted on published runs of that GPU, or borrowed
from another GPU's fit (its predictions then scale that fit by datasheet peaks and are less sure)."""

from __future__ import annotations

from functools import lru_cache

from autoshard.specs.cluster import TRAIN_KNOBS, GpuSpec

__all__ = ["efficiency_source", "is_borrowed", "training_gpu"]


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
