"""Sliding-window attention in a Hugging Face config: which decoder layers attend over the last
``sliding_window`` positions, read as transformers reads them, onto `LayerGroup.attention_window`.

Per layer, in this order (transformers' configuration classes):

* ``layer_types``, when the config lists it (transformers >= 4.53 writes it for every family with
  windows): ``"sliding_attention"`` layers take ``sliding_window``, ``"full_attention"`` layers none;
  any other type (chunked or linear attention) is refused naming the key.
* Gemma 2: every other layer, from the first (``"sliding_attention" if (i + 1) % 2``,
  configuration_gemma2.py); Gemma 3: all but every ``sliding_window_pattern``-th layer (default 6:
  ``"sliding_attention" if (i + 1) % pattern``, configuration_gemma3.py), 5 local : 1 global.
* Qwen2 / Qwen2-MoE / Qwen3 / Qwen3-MoE: only with ``use_sliding_window: true``, then the layers from
  ``max_window_layers`` on (``i >= max_window_layers``, configuration_qwen2.py; transformers drops
  ``sliding_window`` to None when the switch is off).
* Mistral, Mixtral, Phi-3: ``sliding_window`` applies to every layer (Mistral-7B-v0.1: 4,096 of a
  32,768 context; null in later releases).

``sliding_window`` null or 0 means no window (vLLM 0.33 reads 0 as None, config/model.py:815-821).

A window is stored as the config gives it, also where it reaches the context (it then changes no
price: attention and the cache are bounded by min(tokens, window))."""

from __future__ import annotations

import warnings
from typing import Any

from autoshard.specs.hf.reader import Reader
from autoshard.specs.layers import LayerKind

__all__ = ["WINDOWED_TYPES", "layer_windows", "with_windows"]

_SWITCHED = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}
_EVERY_LAYER = {"mistral", "mixtral", "phi3"}
_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}
WINDOWED_TYPES = frozenset(_SWITCHED | _EVERY_LAYER | set(_PATTERN))
"""model_types whose modeling code applies ``sliding_window``."""


def layer_windows(r: Reader, model_type: str, num_layers: int) -> list[int | None]:
    """Each decoder layer's window (None: full attention)."""
    full: list[int | None] = [None] * num_layers
    if model_type not in WINDOWED_TYPES:
        return full
    if model_type in _SWITCHED and not r.bool("use_sliding_window", default=False):
        return full
    default = 4096 if model_type in _PATTERN else None  # Gemma 2/3's configuration default
    window = r.int("sliding_window", default=default, minimum=0)
    if not window:  # some checkpoints write 0 for "no window"; vLLM reads it as None (ModelConfig.__post_init__)
        return full
    types = r.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise r.error("layer_types", f"expected a list of {num_layers} layer types, one per decoder layer "
                                         f"(got {types!r:.200})")
        out: list[int | None] = []
        for i, kind in enumerate(types):
            if kind == "sliding_attention":
                out.append(window)
            elif kind == "full_attention":
                out.append(None)
            else:
                raise r.error("layer_types", f"layer {i} is {kind!r}: autoshard models full_attention and "
                                             "sliding_attention layers only; write a YAML model spec instead")
        return out
    if model_type in _PATTERN:
        pattern = r.int("sliding_window_pattern", default=_PATTERN[model_type]) if model_type != "gemma2" else 2
        return [window if (i + 1) % pattern else None for i in range(num_layers)]
    if model_type in _SWITCHED:
        first = r.int("max_window_layers", default=28, minimum=0)
        if 0 < first < num_layers:
            warnings.warn(f"{r.source}: {r.where('max_window_layers')}: layers {first}-{num_layers - 1} slide over "
                          f"{window} tokens, the first {first} attend in full: priced so, but vLLM 0.33 refuses a "
                          "Qwen2 model that mixes them (model_executor/models/qwen2.py:351-360)", UserWarning,
                          stacklevel=4)
        return [window if i >= first else None for i in range(num_layers)]
    return [window] * num_layers


def with_windows(groups: list[dict[str, Any]], windows: list[int | None]) -> list[dict[str, Any]]:
    """The converter's `layers:` groups split where the window changes (run lengths of (kind, window))."""
    out: list[dict[str, Any]] = []
    i = 0
    for group in groups:
        kind = group["kind"]
        if kind in (LayerKind.EMBEDDING, LayerKind.OUTPUT):
            out.append(dict(group))
            continue
        for _ in range(group.get("count", 1)):
            window = windows[i]
            i += 1
            last = out[-1] if out else None
            if last is not None and last["kind"] is kind and last.get("attention_window") == window:
                last["count"] += 1
            else:
                out.append({"kind": kind, "count": 1, **({"attention_window": window} if window else {})})
    return out
