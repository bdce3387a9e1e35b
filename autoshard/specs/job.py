"""The workload: what to train or serve. Built from model defaults and CLI flags by the loader."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from autoshard.specs.base import MAX_CONTEXT, MAX_COUNT, MAX_GLOBAL_BATCH, MAX_SEQ_LEN, MAX_TOKENS, FrozenSpec

__all__ = ["Precision", "Optimizer", "TrainJob", "ServeJob", "WeightDtype"]

PosInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Context = Annotated[int, Field(gt=0, le=MAX_CONTEXT)]
MAX_REQUEST_RATE = 1e6
"""Requests per second one plan may be asked to sustain."""


class Precision(StrEnum):
    BF16 = "bf16"  # BF16 compute, FP32 master weights and optimizer state
    FP8 = "fp8"  # FP8 GEMMs (Transformer Engine), BF16 elsewhere; same optimizer state
    FP4 = "fp4"
    """NVFP4 GEMMs (Transformer Engine's NVFP4BlockScaling recipe, Blackwell FP4 tensor cores; Megatron
    --fp4-format e2m1 --fp4-recipe nvfp4): E2M1 values with one E4M3 scale per 16 and an FP32 tensor
    scale, in the forward, data-gradient and weight-gradient GEMMs; BF16 elsewhere, same optimizer state."""

    @property
    def quantized(self) -> bool:
        """The decoder's GEMMs run in a Transformer Engine low-precision recipe (FP8 or FP4)."""
        return self is not Precision.BF16

    @property
    def gemm_operand_bytes(self) -> float:
        """Bytes per element of a quantized GEMM operand, block scales included (FP8: 1; NVFP4:
        0.5 + 1/16), BF16: 2."""
        return {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1 / 16}[self.value]


class Optimizer(StrEnum):
    ADAM = "adam"  # Adam/AdamW: FP32 master weights, m and v (12 bytes/param)
    SGD = "sgd"  # SGD with momentum: FP32 master weights and momentum (8 bytes/param)

    @property
    def state_bytes_per_param(self) -> int:
        return 12 if self is Optimizer.ADAM else 8


class WeightDtype(StrEnum):
    """Weight storage for serving."""

    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    NVFP4 = "nvfp4"
    """4-bit floats (E2M1) with one FP8 (E4M3) scale per 16 values (NVIDIA NVFP4, Blackwell tensor cores)."""
    MXFP4 = "mxfp4"
    """4-bit floats (E2M1) with one 8-bit power-of-two (E8M0) scale per 32 values (OCP Microscaling
    Formats v1.0, Table 1)."""

    @property
    def bytes_per_param(self) -> float:
        """Storage per weight, block scales included (NVFP4: 0.5 + 1/16 B; MXFP4: 0.5 + 1/32 B)."""
        return {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "nvfp4": 0.5 + 1 / 16,
                "mxfp4": 0.5 + 1 / 32}[self.value]

    @property
    def is_fp4(self) -> bool:
        return self in (WeightDtype.NVFP4, WeightDtype.MXFP4)


class TrainJob(FrozenSpec):
    seq_len: Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)] = 4096
    global_batch_size: Annotated[int, Field(gt=0, le=MAX_GLOBAL_BATCH)] = 1024
    """Sequences per optimizer step."""
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAM
    tokens: float | None = Field(default=None, gt=0, le=MAX_TOKENS)
    """Total training tokens, for time and cost estimates."""

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size


class ServeJob(FrozenSpec):
    input_len: Context = 1024
    output_len: Context = 1024
    max_model_len: Context | None = None
    """Longest context a request may use; defaults to input_len + output_len."""
    weight_dtype: WeightDtype = WeightDtype.BF16
    kv_cache_dtype: WeightDtype = WeightDtype.BF16
    ttft_target_s: float | None = Field(default=None, gt=0, le=86400)
    tpot_target_s: float | None = Field(default=None, gt=0, le=3600)
    request_rate: float | None = Field(default=None, gt=0, le=MAX_REQUEST_RATE)
    """Requests per second to sustain (then the plan minimizes GPUs)."""

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, value: WeightDtype) -> WeightDtype:
        if value not in (WeightDtype.BF16, WeightDtype.FP8):
            raise ValueError(f"must be bf16 or fp8, got {value.value} (autoshard prices BF16 and FP8 KV caches only; "
                             "vLLM and SGLang have no int8/int4 one): use --kv-cache-dtype fp8")
        return value

    @model_validator(mode="after")
    def _check(self) -> ServeJob:
        if self.max_model_len is not None and self.max_model_len < self.input_len + self.output_len:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) is shorter than input_len + output_len "
                f"({self.input_len + self.output_len}): raise max_model_len (--max-model-len) or shorten the requests "
                f"(--input-len, --output-len)"
            )
        return self

    @property
    def context_len(self) -> int:
        return self.max_model_len or self.input_len + self.output_len
