"""The RoPE facts of a Megatron-LM launch: `--rotary-base` (Hugging Face rope_theta; Megatron's default
is 10,000, which Llama 3's 500,000 or Qwen's 1,000,000 are not) and `--rotary-percent` (partial rotary
embeddings: GLM-4.5, Nemotron, GPT-NeoX). Written only when the model states them; no cost depends on
them, but the command would otherwise train another model."""

from __future__ import annotations

from autoshard.specs.layers import PositionKind
from autoshard.specs.model import ModelSpec

__all__ = ["rope_args"]


def rope_args(model: ModelSpec) -> list[tuple[str, str | None]]:
    """`--rotary-base` (an integer flag in Megatron-LM) and `--rotary-percent` when the model sets them."""
    if model.position_embedding is not PositionKind.ROPE:
        return []
    args: list[tuple[str, str | None]] = []
    if model.rope_theta is not None:
        args.append(("--rotary-base", str(round(model.rope_theta))))
    if model.rotary_percent is not None and model.rotary_percent != 1:
        args.append(("--rotary-percent", f"{model.rotary_percent:g}"))
    return args
