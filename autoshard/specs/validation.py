"""Phrase a pydantic ValidationError as (field, message) with the fix, for every spec reader: the
YAML/JSON loader and the Hugging Face importer."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from autoshard.specs.base import NAME_PATTERN

__all__ = ["format_validation_error", "short"]


def short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif str(item).startswith(("function-", "tagged-union")):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def format_validation_error(exc: ValidationError, model: type[BaseModel]) -> tuple[str, str]:
    """(field, message) for the first error, phrased with the fix."""
    errors = exc.errors(include_url=False)
    # a misspelt required field shows up as "missing" plus "extra": report the misspelling
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    field = _loc(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = model
        for part in err["loc"][:-1]:
            info = getattr(parent, "model_fields", {}).get(part) if isinstance(part, str) else None
            ann = getattr(info, "annotation", None) if info else None
            inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
            if inner:
                parent = inner[0]
        allowed = sorted(getattr(parent, "model_fields", {}))
        close = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return field, f"unknown field; {hint}allowed fields here: {', '.join(allowed)}"
    if kind == "missing":
        return field, "required field is missing: add it"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if kind in ("greater_than", "greater_than_equal"):
        bound = (err.get("ctx") or {}).get("gt", (err.get("ctx") or {}).get("ge"))
        msg += f" (got {short(repr(err.get('input')), 60)})" + (": sizes must be positive" if bound == 0 else "")
    elif kind in ("int_parsing", "int_type", "float_parsing", "float_type", "bool_parsing", "bool_type",
                  "int_from_float", "enum", "literal_error", "string_type", "list_type", "model_type",
                  "dict_type", "less_than_equal", "less_than", "finite_number", "string_pattern_mismatch",
                  "string_too_long", "too_long", "int_parsing_size"):
        msg += f" (got {short(repr(err.get('input')), 60)})"
    if kind == "int_parsing_size":  # `num_nodes: 1e300` said only "exceeded maximum size"
        msg += ": write a whole number of a sensible size (e.g. 128)"
    if kind == "string_pattern_mismatch" and (err.get("ctx") or {}).get("pattern") == NAME_PATTERN:
        msg = f"must be one line of printable text, without control characters (got {short(repr(err.get('input')), 60)})"
    elif kind == "finite_number":
        msg += ": NaN and infinities are not sizes, write a finite number"
    if not field:
        field = "(top level)"
    return field, msg
