"""The base of every spec: frozen, strict (unknown fields are errors), hashed once."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["FrozenSpec"]


class FrozenSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

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
