"""Inputs made ready for a solve: a job from the model's defaults and the given values, the cluster at
the asked size, a precision its GPUs support. `autoshard.api` and the cost studies (`autoshard.study`)
both need these before solving."""

from __future__ import annotations

from autoshard.errors import SpecError
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import Precision, TrainJob
from autoshard.specs.layers import PositionKind
from autoshard.specs.loader import validate
from autoshard.specs.model import ModelSpec

__all__ = ["train_job", "resize", "check_precision"]


def train_job(
    model: ModelSpec,
    *,
    seq_len: int | None = None,
    global_batch_size: int | None = None,
    precision: str | Precision | None = None,
    tokens: float | None = None,
) -> TrainJob:
    """A TrainJob from the model's `training:` defaults, overridden by the given values."""
    defaults = model.training
    data: dict = {}
    if defaults is not None:
        for key in ("seq_len", "global_batch_size", "precision", "tokens"):
            value = getattr(defaults, key)
            if value is not None:
                data[key] = value
    for key, value in (("seq_len", seq_len), ("global_batch_size", global_batch_size),
                       ("precision", precision), ("tokens", tokens)):
        if value is not None:
            data[key] = value
    job = validate(TrainJob, data, source=f"training job for {model.name}")
    if model.position_embedding is PositionKind.LEARNED and job.seq_len > model.max_position_embeddings:
        raise SpecError(f"sequence length {job.seq_len} is longer than the {model.max_position_embeddings} learned "
                        f"position embeddings of {model.name}: use --seq-len {model.max_position_embeddings} or less, or "
                        "raise max_position_embeddings in the model file", source="--seq-len")
    return job


def resize(cluster: ClusterSpec, gpus: int | None) -> ClusterSpec:
    """The cluster at `gpus` GPUs (unchanged when None); SpecError naming --gpus when it cannot be."""
    if gpus is None:
        return cluster
    try:
        return cluster.with_gpus(gpus)
    except ValueError as exc:
        raise SpecError(f"{exc}", source="--gpus", field=None) from None


def check_precision(cluster: ClusterSpec, precision: Precision, *, source: str = "--precision") -> None:
    """FP8 training needs FP8 tensor cores (Hopper, Ada, Blackwell, MI300), FP4 (NVFP4) training FP4
    tensor cores (Blackwell): refuse either where a pool has none."""
    if precision is Precision.BF16:
        return
    if precision is Precision.FP4:
        lacking = [p.gpu.name for p in cluster.pools if p.gpu.fp4_tflops is None]
        if lacking:
            raise SpecError(f"FP4 (NVFP4) training needs FP4 tensor cores and {', '.join(dict.fromkeys(lacking))} has "
                            f"none (no fp4_tflops in {cluster.name}): train in fp8 or bf16", source=source)
        return
    lacking = [p.gpu.name for p in cluster.pools if p.gpu.fp8_tflops is None]
    if lacking:
        raise SpecError(f"FP8 needs FP8 tensor cores and {', '.join(dict.fromkeys(lacking))} has none (no fp8_tflops "
                        f"in {cluster.name}): train in bf16", source=source)
