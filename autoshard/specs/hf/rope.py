"""`rope_scaling` of a Hugging Face config.json -> the ModelSpec's `rope_scaling` (a launch fact: the
Megatron-LM command must apply it, no cost depends on it).

transformers names the type `rope_type` (older configs, DeepSeek's: `type`); newer configs may hold the
same dict as `rope_parameters`. `default` is unscaled RoPE. llama3, yarn and linear are carried; any
other type (dynamic, longrope, ...) is a warning naming it: the launch would train unscaled RoPE.

transformers v5 also moves `rope_theta` and `partial_rotary_factor` into `rope_parameters`
(`{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, ...}`): they are read there when the
top level lacks them (`rope_base_fields`); both present and different is refused naming both keys, since
the launch's --rotary-base / --rotary-percent would follow one and the checkpoint may follow the other."""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import ValidationError

from autoshard.specs.hf.reader import Reader
from autoshard.specs.rope import ROPE_SCALING_KEYS, ROPE_SCALING_TYPES, RopeScaling
from autoshard.specs.validation import format_validation_error

__all__ = ["rope_scaling_fields", "rope_base_fields"]

# keys a rope_scaling dict carries that are not parameters of the scaling itself
_BOOKKEEPING = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def rope_scaling_fields(reader: Reader, max_position_embeddings: int) -> dict[str, Any] | None:
    """The spec's rope_scaling dict, or None for unscaled RoPE (or a type autoshard does not carry,
    with a warning). Every bad value is a SpecError naming `rope_scaling.<key>`."""
    key = "rope_scaling" if reader.data.get("rope_scaling") is not None else "rope_parameters"
    raw = reader.data.get(key)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise reader.error(key, f"expected a mapping like {{rope_type: llama3, factor: 8.0, ...}} (got {raw!r})")
    kind = raw.get("rope_type", raw.get("type"))
    type_key = f"{key}.{'rope_type' if 'rope_type' in raw else 'type'}"
    if kind is None or kind == "default":
        return None
    if not isinstance(kind, str):
        raise reader.error(type_key, f"expected a RoPE scaling type name (got {kind!r})")
    if kind not in ROPE_SCALING_TYPES:
        warnings.warn(f"{reader.source}: {reader.where(type_key)}: RoPE scaling type {kind!r} is not carried "
                      f"(autoshard carries {', '.join(ROPE_SCALING_TYPES)}): the Megatron-LM launch trains "
                      "unscaled RoPE; no cost depends on it", UserWarning, stacklevel=3)
        return None
    fields: dict[str, Any] = {"type": kind}
    for name in ROPE_SCALING_KEYS[kind]:
        value = raw.get(name)
        if value is None:
            continue
        want_bool = name == "truncate"
        if isinstance(value, bool) != want_bool or not want_bool and not isinstance(value, int | float):
            raise reader.error(f"{key}.{name}", f"expected {'true or false' if want_bool else 'a number'} "
                                                f"(got {value!r})")
        fields[name] = value
    if kind == "yarn" and "original_max_position_embeddings" not in fields:
        # transformers' fallback: the config's max_position_embeddings is the pre-training context
        fields["original_max_position_embeddings"] = max_position_embeddings
    ignored = sorted(k for k in raw if k not in _BOOKKEEPING and k not in ROPE_SCALING_KEYS[kind]
                     and raw[k] is not None)
    if ignored:
        warnings.warn(f"{reader.source}: {reader.where(key)}: {', '.join(ignored)} not carried for {kind} "
                      "RoPE scaling (the Megatron-LM launch uses its own value)", UserWarning, stacklevel=3)
    try:
        RopeScaling.model_validate(fields)
    except ValidationError as exc:
        field, message = format_validation_error(exc, RopeScaling)
        where = f"{key}.{field}" if field and field not in ("type", "(top level)") else key
        raise reader.error(where, f"{message} ({key} {kind})") from None
    reader.origin["rope_scaling"] = reader.where(key)
    return fields


def _nested_number(reader: Reader, top_keys: tuple[str, ...], name: str, maximum: float,
                   spec_field: str) -> float | None:
    """`name` from the top level (any of `top_keys`) or from rope_parameters; both and different: refused."""
    top = reader.number(*top_keys, maximum=maximum, spec_field=spec_field)
    params = reader.data.get("rope_parameters")
    value = params.get(name) if isinstance(params, dict) else None
    if value is None:
        return top
    key = f"rope_parameters.{name}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= maximum:
        raise reader.error(key, f"expected a positive number of at most {maximum:g} (got {value!r})")
    if top is None:
        reader.origin[spec_field] = reader.where(key)
        return float(value)
    if float(value) != top:
        top_key, _ = reader.lookup(top_keys)
        raise reader.error(key, f"{value:g} contradicts {reader.where(top_key)} {top:g}: the Megatron-LM "
                                "launch would train one of them; keep the checkpoint's value in one place")
    return top


def rope_base_fields(reader: Reader) -> tuple[float | None, float | None]:
    """(rope_theta, rotary fraction) from the top level (``rope_theta`` / ``rotary_emb_base``,
    ``partial_rotary_factor`` / ``rotary_pct``) or transformers v5's ``rope_parameters``; None where
    neither says (Megatron-LM's defaults then apply: base 10,000, the full head rotated)."""
    theta = _nested_number(reader, ("rope_theta", "rotary_emb_base"), "rope_theta", 1e12, "rope_theta")
    percent = _nested_number(reader, ("partial_rotary_factor", "rotary_pct"), "partial_rotary_factor", 1,
                             "rotary_percent")
    return theta, percent
