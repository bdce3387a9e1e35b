"""Serving jobs from a model's `serving:` defaults and CLI values."""

from __future__ import annotations

from autoshard.specs.job import ServeJob
from autoshard.specs.loader import validate
from autoshard.specs.model import ModelSpec

__all__ = ["serve_job_for", "INTERACTIVE_TPOT_MS", "interactive_job"]

INTERACTIVE_TPOT_MS = 50.0
"""The SLA serve mode plans for when the user gives none: 50 ms per output token (20 tokens/s per
user, faster than people read), the interactive tier serving benchmarks report beside max throughput."""


def serve_job_for(
    model: ModelSpec | None,
    input_len: int | None = None,
    output_len: int | None = None,
    max_model_len: int | None = None,
    tpot_ms: float | None = None,
    ttft_s: float | None = None,
    request_rate: float | None = None,
    weight_dtype: str | None = None,
    kv_cache_dtype: str | None = None,
) -> ServeJob:
    """A ServeJob from the model's `serving:` section, overridden by the given values."""
    data: dict = {}
    defaults = model.serving if model is not None else None
    if defaults is not None:
        for key in ("input_len", "output_len", "max_model_len"):
            value = getattr(defaults, key)
            if value is not None:
                data[key] = value
        if defaults.precision is not None:
            data["weight_dtype"] = defaults.precision
    given = {
        "input_len": input_len, "output_len": output_len, "max_model_len": max_model_len,
        "tpot_target_s": None if tpot_ms is None else tpot_ms / 1000.0, "ttft_target_s": ttft_s,
        "request_rate": request_rate, "weight_dtype": weight_dtype, "kv_cache_dtype": kv_cache_dtype,
    }
    data.update({k: v for k, v in given.items() if v is not None})
    name = model.name if model is not None else "the command's model"
    job = validate(ServeJob, data, source=f"serving job for {name}")
    wd = job.weight_dtype
    from autoshard.emit.vllm import VLLM_QUANTIZATION, no_checkpoint

    # the emitters' rule (emit.vllm.vllm_quantization): what engines cannot quantize online needs a
    # published checkpoint; refused before solving, not when the command is written
    if model is not None and wd not in VLLM_QUANTIZATION and not any(c.weights is wd for c in model.checkpoints):
        raise no_checkpoint(model.name, wd)
    return job


def interactive_job(job: ServeJob) -> ServeJob | None:
    """The job with the interactive TPOT target when it has no target and no request rate; else None."""
    if job.tpot_target_s is not None or job.ttft_target_s is not None or job.request_rate is not None:
        return None
    return job.model_copy(update={"tpot_target_s": INTERACTIVE_TPOT_MS / 1000.0})
