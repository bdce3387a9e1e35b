"""The base of every spec: frozen, strict (unknown fields are errors), hashed once.

Numbers are finite (NaN and infinities are refused everywhere) and a YAML/JSON boolean is never a
number (`true` is not 1). The size caps below bound every field a user can set: beyond them the
planner would take hours or the numbers describe no machine or model that exists, so the input is
refused with a message that states the bound.
"""

from __future__ import annotations

from functools import cached_property
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

__all__ = ["FrozenSpec", "NAME_PATTERN", "MAX_NAME_LEN", "MAX_GPUS", "MAX_GPUS_PER_NODE", "MAX_LAYERS",
           "MAX_HIDDEN", "MAX_FFN", "MAX_HEADS", "MAX_VOCAB", "MAX_CONTEXT", "MAX_SEQ_LEN",
           "MAX_GLOBAL_BATCH", "MAX_EXPERTS", "MAX_TOKENS", "MAX_COUNT", "MAX_QUANTITY"]

NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+$"
"""Names (model, cluster, pool, GPU) are one line of printable text: no newline, tab or other C0/C1
control character, no Unicode line separator and no bidirectional override (which makes a script read
differently from how it runs). They end up in launch-script comments, report titles and file names."""
MAX_NAME_LEN = 200

MAX_GPUS = 131_072
"""GPUs in one cluster or job (2^17; the largest published training clusters have ~100k GPUs)."""
MAX_GPUS_PER_NODE = 576
"""GPUs per node or per NVLink domain (NVLink 5 switches reach at most 576 GPUs)."""
MAX_LAYERS = 1024
"""Decoder layers of one model (the deepest published LLMs have under 200)."""
MAX_HIDDEN = 131_072
"""hidden_size, head_dim and the latent ranks (largest published hidden size: 25,600)."""
MAX_FFN = 1_048_576
"""Intermediate (FFN) sizes."""
MAX_HEADS = 4096
"""Attention heads."""
MAX_VOCAB = 4_194_304
"""Vocabulary entries (largest published vocabularies: ~262k)."""
MAX_CONTEXT = 16_777_216
"""Positions a model or a serving request can hold (16M tokens)."""
MAX_SEQ_LEN = 1_048_576
"""Training sequence length (1M tokens)."""
MAX_GLOBAL_BATCH = 1_048_576
"""Sequences per optimizer step."""
MAX_EXPERTS = 4096
"""Routed experts per MoE layer."""
MAX_TOKENS = 1e17
"""Training tokens of one run (published runs are below 1e14)."""
MAX_COUNT = 1 << 40
"""The cap of a count or size with no tighter bound of its own (PosInt and friends)."""
MAX_QUANTITY = 1e12
"""The cap of a positive float with no tighter bound of its own (PosFloat)."""


def _is_number_annotation(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    origin = get_origin(annotation)
    if origin is Union or origin is UnionType:
        return any(_is_number_annotation(a) for a in get_args(annotation))
    if origin is Annotated:
        return _is_number_annotation(get_args(annotation)[0])
    return False


class FrozenSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _is_number_annotation(field.annotation):
                raise ValueError(f"expected a number, got the boolean {str(value).lower()}: write a number")
        return value

    @cached_property
    def _hash(self) -> int:
        return hash((type(self), tuple(self.__dict__[k] for k in type(self).model_fields)))

    def __hash__(self) -> int:  # specs key the cost-model caches: hash once, not per lookup
        return self._hash

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False):  # type: ignore[override]
        copied = super().model_copy(update=update, deep=deep)
        for key in [k for k in copied.__dict__ if k not in type(self).model_fields]:
            del copied.__dict__[key]  # cached properties describe the original, not the copy
        return copied
