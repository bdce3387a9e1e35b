"""The shared field reader of the Hugging Face importer: typed access to a ``config.json`` dict where
every failure is a SpecError naming the config key, and the helpers every model family uses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autoshard.errors import SpecError
from autoshard.specs.base import MAX_LAYERS as SPEC_MAX_LAYERS
from autoshard.specs.layers import LayerKind, MlpKind

__all__ = [
    "MISSING", "MAX_LAYERS", "Reader", "Converter",
    "act_to_mlp", "run_length", "bias_flags", "common_dense", "kv_heads",
]

MISSING: Any = object()
MAX_LAYERS = SPEC_MAX_LAYERS
"""The ModelSpec's cap on decoder layers (base.py), checked here so the error names the config key."""


class Reader:
    """Typed access to the config dict; every failure is a SpecError naming the config key."""

    def __init__(self, data: dict[str, Any], *, source: str, prefix: str = "") -> None:
        self.data = data
        self.source = source
        self.prefix = prefix
        self.origin: dict[str, str] = {}
        """ModelSpec field -> config key it was read from (to name the key when validation fails)."""

    def where(self, key: str) -> str:
        return self.prefix + key

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(message, source=self.source, field=self.where(key))

    def lookup(self, keys: Sequence[str]) -> tuple[str, Any]:
        for key in keys:
            if key in self.data and self.data[key] is not None:
                return key, self.data[key]
        return keys[0], MISSING

    def int(self, *keys: str, default: Any = MISSING, null: Any = MISSING, spec_field: str | None = None,
            minimum: int = 1, maximum: int | None = None) -> Any:
        """A whole number in [minimum, maximum] from the first present key, else `default` (may be None).

        `null`: what an explicit JSON null in the first key means, where Hugging Face uses null for "none"
        rather than "unset" (DeepSeek's q_lora_rank: no query LoRA; n_shared_experts: no shared expert);
        without it a null is read as absent and `default` applies."""
        if null is not MISSING and keys[0] in self.data and self.data[keys[0]] is None:
            if spec_field:
                self.origin[spec_field] = self.where(keys[0])
            return null
        key, value = self.lookup(keys)
        if value is MISSING:
            if default is MISSING:
                alias = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
                raise self.error(key, f"required key is missing{alias}: the model's shape cannot be derived "
                                      "without it; use the checkpoint's complete config.json")
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected a whole number (got {value!r})")
        if value < minimum:
            raise self.error(key, f"must be at least {minimum} (got {value})")
        if maximum is not None and value > maximum:
            raise self.error(key, f"implausibly large (got {value}, at most {maximum}): check the config")
        if spec_field:
            self.origin[spec_field] = self.where(key)
        return value

    def number(self, *keys: str, maximum: float, spec_field: str | None = None) -> float | None:
        """A positive finite number in (0, maximum] from the first present key, else None."""
        key, value = self.lookup(keys)
        if value is MISSING:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= maximum:
            raise self.error(key, f"expected a positive number of at most {maximum:g} (got {value!r})")
        if spec_field:
            self.origin[spec_field] = self.where(key)
        return float(value)

    def layers(self, *keys: str) -> int:
        """The decoder layer count, refused past the ModelSpec's MAX_LAYERS naming this key (it used to be
        blamed on the spec's `layers[1].count` between 1,025 and 100,000)."""
        value = self.int(*keys)
        if value > MAX_LAYERS:
            raise self.error(self.lookup(keys)[0], f"{value} decoder layers: autoshard models at most {MAX_LAYERS} "
                                                   "(the deepest published LLMs have under 200): check the config")
        return value

    def bool(self, *keys: str, default: bool) -> bool:
        key, value = self.lookup(keys)
        if value is MISSING:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false (got {value!r})")
        return value

    def str(self, *keys: str, default: str) -> str:
        key, value = self.lookup(keys)
        if value is MISSING:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"expected a string (got {value!r})")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise self.error(key, f"expected a list of layer indices (got {value!r})")
        return list(value)


Converter = Callable[[Reader, str], dict[str, Any]]
"""One model family's converter: (reader, model_type) -> the ModelSpec fields."""


# ------------------------------------------------------------------------------------------ helpers
def act_to_mlp(r: Reader, key: str, default: str) -> MlpKind:
    """Activation of a two-matrix (non-gated) MLP."""
    act = r.str(key, default=default).lower()
    if act in ("relu2", "squared_relu", "squared-relu"):
        return MlpKind.SQUARED_RELU
    if act == "relu":
        return MlpKind.RELU
    if act.startswith("gelu") or act in ("quick_gelu", "bias_gelu", "fast_gelu"):
        return MlpKind.GELU
    raise r.error(key, f"unsupported activation {act!r} for this architecture's two-matrix MLP "
                       "(supported: gelu variants, relu, relu2); write a YAML model spec instead")


def run_length(kinds: list[LayerKind]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = [{"kind": LayerKind.EMBEDDING}]
    for kind in kinds:
        if groups[-1]["kind"] is kind:
            groups[-1]["count"] += 1
        else:
            groups.append({"kind": kind, "count": 1})
    groups.append({"kind": LayerKind.OUTPUT})
    return groups


def bias_flags(r: Reader, *, attention_default: bool = False, mlp_default: bool = False) -> dict[str, bool]:
    attention_bias = r.bool("attention_bias", default=attention_default)
    mlp_bias = r.bool("mlp_bias", default=mlp_default)
    return {"linear_bias": mlp_bias, "qkv_bias": attention_bias and not mlp_bias}


def common_dense(r: Reader) -> dict[str, Any]:
    """Sizes every Llama-style config spells the same way."""
    return {
        "hidden_size": r.int("hidden_size", spec_field="hidden_size"),
        "num_attention_heads": r.int("num_attention_heads", spec_field="num_attention_heads"),
        "vocab_size": r.int("vocab_size", spec_field="vocab_size"),
    }


def kv_heads(r: Reader, default: Any = None) -> Any:
    return r.int("num_key_value_heads", default=default, spec_field="num_kv_heads")

