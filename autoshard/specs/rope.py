"""RoPE scaling: how a model stretches its rotary frequencies past the context it was pre-trained at.

Hugging Face `rope_scaling` conventions (transformers' modeling_rope_utils):
- `llama3` (Llama 3.1 / 3.2 / 3.3): wavelengths longer than original / low_freq_factor are divided by
  `factor`, shorter than original / high_freq_factor are kept, the band between is interpolated.
- `yarn` (Peng et al. 2023, arXiv:2309.00071; DeepSeek-V2/V3, Kimi K2, Qwen3 long context): NTK-by-parts
  between the beta_fast / beta_slow rotation counts, plus an attention temperature. With both `mscale`
  and `mscale_all_dim` set (DeepSeek) it is mscale(factor, mscale) / mscale(factor, mscale_all_dim),
  otherwise 0.1 ln(factor) + 1; `truncate` (default true) rounds the correction range to integers.
- `linear` (position interpolation, Chen et al. 2023): every position divided by `factor`.

A launch fact only: no parameter, FLOP or byte depends on it (the cost model never reads it), but a
launch that leaves it out trains another model.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from autoshard.specs.base import MAX_CONTEXT, FrozenSpec

__all__ = ["RopeScaling", "ROPE_SCALING_TYPES", "ROPE_SCALING_KEYS"]

ROPE_SCALING_TYPES = ("llama3", "yarn", "linear")

# the parameters each type takes (Hugging Face key names); the others are refused for that type
ROPE_SCALING_KEYS: dict[str, tuple[str, ...]] = {
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "truncate"),
    "linear": ("factor",),
}
_REQUIRED = {"llama3": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "yarn": ("original_max_position_embeddings",), "linear": ()}

Positive = Annotated[float, Field(gt=0, le=1e6)]


class RopeScaling(FrozenSpec):
    """Hugging Face `rope_scaling` (`rope_type` is `type` here); the fields a type does not take stay unset."""

    type: Literal["llama3", "yarn", "linear"]
    factor: Annotated[float, Field(ge=1, le=1e4)]
    """Context extension ratio (Llama 3.1: 8, DeepSeek-V3: 40)."""
    original_max_position_embeddings: Annotated[int, Field(gt=0, le=MAX_CONTEXT)] | None = None
    """Context of the pre-training the scaling extends (llama3, yarn)."""
    low_freq_factor: Positive | None = None
    high_freq_factor: Positive | None = None
    beta_fast: Positive | None = None
    """YaRN rotation-count bounds of the interpolation ramp (None: 32 and 1, the paper's and both
    transformers' and Megatron-LM's default)."""
    beta_slow: Positive | None = None
    mscale: Annotated[float, Field(ge=0, le=100)] | None = None
    mscale_all_dim: Annotated[float, Field(ge=0, le=100)] | None = None
    truncate: bool | None = None
    """YaRN: round the correction range to integers (None: true, the default of both)."""
    extends_context: bool | None = None
    """Whether the factor stretches `max_position_embeddings` into the context vLLM derives (None: yes, as a
    linear factor does). False where the config's length is already the scaled one: Gemma 3, whose 131,072 vLLM 0.33.0 takes
    as is (`config/model.py:2601-2603`: "Gemma3's max_model_len (128K) is already scaled by RoPE scaling")."""

    @model_validator(mode="after")
    def _fits_type(self) -> RopeScaling:
        allowed = ROPE_SCALING_KEYS[self.type]
        for key in ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor", "beta_fast",
                    "beta_slow", "mscale", "mscale_all_dim", "truncate"):
            if getattr(self, key) is not None and key not in allowed:
                raise ValueError(f"{key} is not a parameter of {self.type} RoPE scaling (it takes "
                                 f"{', '.join(allowed)}): remove it or fix type")
        for key in _REQUIRED[self.type]:
            if getattr(self, key) is None:
                raise ValueError(f"{self.type} RoPE scaling needs {key} (the Hugging Face config's "
                                 f"rope_scaling.{key})")
        if self.type == "llama3" and self.high_freq_factor <= self.low_freq_factor:  # type: ignore[operator]
            raise ValueError(f"high_freq_factor ({self.high_freq_factor:g}) must be above low_freq_factor "
                             f"({self.low_freq_factor:g}): the interpolated band would be empty")
        if self.beta_fast is not None and self.beta_slow is not None and self.beta_fast < self.beta_slow:
            raise ValueError(f"beta_fast ({self.beta_fast:g}) must not be below beta_slow ({self.beta_slow:g}) "
                             "(Kimi K2 sets both to 1)")
        return self

    @property
    def temperature_pair(self) -> bool:
        """YaRN's DeepSeek form: attention scale mscale(f, mscale) / mscale(f, mscale_all_dim), used only
        when both are set and non-zero (transformers' rule)."""
        return bool(self.mscale) and bool(self.mscale_all_dim)
