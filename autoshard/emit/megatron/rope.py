"""The RoPE facts of a Megatron-LM launch: `--rotary-base` (Hugging Face rope_theta; Megatron's default
is 10,000, which Llama 3's 500,000 or Qwen's 1,000,000 are not), `--rotary-percent` (partial rotary
embeddings: GLM-4.5, Nemotron, GPT-NeoX) and RoPE scaling (`ModelSpec.rope_scaling`). Written only when
the model states them; no cost depends on them, but the command would otherwise train another model.

RoPE scaling, as Megatron-LM reads it (arguments.py, argument_utils.py, gpt_builders.py at
`flags.SOURCE_COMMIT`):
- llama3 -> `--use-rope-scaling`. RotaryEmbedding._apply_scaling fixes low_freq_factor 1, high_freq_factor
  4 and original context 8192, and neither model builder passes `--rope-scaling-factor` to the model
  (GPTModel's default 8 applies): the flag is written when the factor is not 8, with a note.
- yarn, standard attention -> `--position-embedding-type yarn --rotary-scaling-factor F
  --yarn-original-max-position-embeddings N` (+ `--yarn-beta-fast/-slow`, `--mscale/--mscale-all-dim`
  when the config sets them, `--no-yarn-correction-range-round-to-int` for truncate: false);
  argument_utils._apply_yarn_config_from_args copies them into the yarn_* config fields.
- yarn, multi-latent attention -> `--rotary-scaling-factor F --mscale M --mscale-all-dim D`: MLA applies
  YaRN itself (MLATransformerConfig.rope_type defaults to yarn); its original context (4096) and betas
  (32, 1) have no flag, so other values get a note.
- linear -> `--rotary-seq-len-interpolation-factor N` (an integer flag), with a note: only the config
  builder (argument_utils.gpt_config_from_args) passes it, pretrain_gpt.py's gpt_builders.py does not.
"""

from __future__ import annotations

from autoshard.emit.megatron.flags import SOURCE_COMMIT
from autoshard.specs.layers import AttentionKind, PositionKind
from autoshard.specs.model import ModelSpec
from autoshard.specs.rope import RopeScaling

__all__ = ["rope_args", "rope_notes", "rope_differences", "position_embedding_type", "LLAMA3_FIXED", "MLA_YARN_FIXED"]

# Megatron-LM's hard-coded llama3 parameters (low_freq_factor, high_freq_factor, original context) and
# the factor GPTModel applies
LLAMA3_FIXED = (1.0, 4.0, 8192)
LLAMA3_FACTOR = 8.0
# MLATransformerConfig's YaRN fields no flag reaches: original context, beta_fast, beta_slow
MLA_YARN_FIXED = (4096, 32.0, 1.0)


def _scaling(model: ModelSpec) -> RopeScaling | None:
    return model.rope_scaling if model.position_embedding is PositionKind.ROPE else None


def _mla(model: ModelSpec) -> bool:
    return model.attention is AttentionKind.MLA and model.mla is not None


def position_embedding_type(model: ModelSpec) -> str:
    """`--position-embedding-type`: learned_absolute, rope, or yarn (YaRN outside multi-latent attention)."""
    if model.position_embedding is PositionKind.LEARNED:
        return "learned_absolute"
    scaling = _scaling(model)
    return "yarn" if scaling is not None and scaling.type == "yarn" and not _mla(model) else "rope"


def rope_args(model: ModelSpec) -> list[tuple[str, str | None]]:
    """`--rotary-base` (an integer flag in Megatron-LM), `--rotary-percent` and the scaling flags, each
    only when the model sets it."""
    if model.position_embedding is not PositionKind.ROPE:
        return []
    args: list[tuple[str, str | None]] = []
    if model.rope_theta is not None:
        args.append(("--rotary-base", str(round(model.rope_theta))))
    if model.rotary_percent is not None and model.rotary_percent != 1:
        args.append(("--rotary-percent", f"{model.rotary_percent:g}"))
    scaling = _scaling(model)
    if scaling is None:
        return args
    if scaling.type == "llama3":
        args.append(("--use-rope-scaling", None))
        if scaling.factor != LLAMA3_FACTOR:
            args.append(("--rope-scaling-factor", f"{scaling.factor:g}"))
    elif scaling.type == "linear":
        if scaling.factor.is_integer():
            args.append(("--rotary-seq-len-interpolation-factor", str(int(scaling.factor))))
    elif _mla(model):
        args.append(("--rotary-scaling-factor", f"{scaling.factor:g}"))
        if scaling.mscale is not None:
            args.append(("--mscale", f"{scaling.mscale:g}"))
        if scaling.mscale_all_dim is not None:
            args.append(("--mscale-all-dim", f"{scaling.mscale_all_dim:g}"))
    else:
        args += [("--rotary-scaling-factor", f"{scaling.factor:g}"),
                 ("--yarn-original-max-position-embeddings", str(scaling.original_max_position_embeddings))]
        if scaling.beta_fast is not None:
            args.append(("--yarn-beta-fast", f"{scaling.beta_fast:g}"))
        if scaling.beta_slow is not None:
            args.append(("--yarn-beta-slow", f"{scaling.beta_slow:g}"))
        if scaling.temperature_pair:
            # transformers uses the mscale pair only when both are set; else 0.1 ln(factor) + 1, which is
            # Megatron-LM's default pair (1, 0)
            args += [("--mscale", f"{scaling.mscale:g}"), ("--mscale-all-dim", f"{scaling.mscale_all_dim:g}")]
        if scaling.truncate is False:
            args.append(("--no-yarn-correction-range-round-to-int", None))
    return args


def rope_notes(model: ModelSpec) -> list[str]:
    """The model's RoPE scaling that the Megatron-LM launch cannot apply as stated."""
    scaling = _scaling(model)
    if scaling is None:
        return []
    at = f"Megatron-LM at {SOURCE_COMMIT[:12]}"
    notes: list[str] = []
    if scaling.type == "llama3":
        stated = (scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_position_embeddings)
        if stated != LLAMA3_FIXED:
            notes.append(f"llama3 RoPE scaling with low_freq_factor {stated[0]:g}, high_freq_factor {stated[1]:g}, "
                         f"original context {stated[2]}: {at} fixes them at 1, 4 and 8192 (--use-rope-scaling); "
                         "the launch trains those")
        if scaling.factor != LLAMA3_FACTOR:
            notes.append(f"llama3 RoPE scaling factor {scaling.factor:g}: {at} writes --rope-scaling-factor into "
                         "its arguments but neither model builder passes it to GPTModel, which applies 8; "
                         "patch gpt_builders.py (rope_scaling_factor=args.rope_scaling_factor) before launching")
    elif scaling.type == "linear":
        if scaling.factor.is_integer():
            notes.append(f"linear RoPE scaling (factor {scaling.factor:g}): {at} passes "
                         "--rotary-seq-len-interpolation-factor to the model only through its config builder "
                         "(argument_utils.gpt_config_from_args), not pretrain_gpt.py's gpt_builders.py; check "
                         "that your entry point applies it")
        else:
            notes.append(f"linear RoPE scaling factor {scaling.factor:g} is not a whole number: Megatron-LM's "
                         "--rotary-seq-len-interpolation-factor takes an integer, so the launch leaves it out "
                         "(unscaled positions)")
    elif _mla(model):
        stated_mla = (scaling.original_max_position_embeddings, scaling.beta_fast or 32.0, scaling.beta_slow or 1.0)
        if stated_mla != MLA_YARN_FIXED:
            notes.append(f"YaRN with original context {stated_mla[0]}, beta_fast {stated_mla[1]:g}, beta_slow "
                         f"{stated_mla[2]:g}: multi-latent attention in {at} takes them from MLATransformerConfig "
                         "(4096, 32, 1), which no flag sets; the launch trains those")
        if scaling.truncate is False:
            notes.append(f"YaRN truncate: false: multi-latent attention in {at} always rounds the correction "
                         "range to integers")
    return notes


def rope_differences(expected: ModelSpec, got: ModelSpec) -> list[str]:
    """The RoPE facts a Megatron-LM command states differently from the model it is said to train (each
    as the launch applies it: no --rotary-base is Megatron-LM's 10,000, no scaling flag unscaled RoPE).
    Kept apart from the shape differences: no cost depends on them, but the run trains another model."""
    if expected.position_embedding is not PositionKind.ROPE or got.position_embedding is not PositionKind.ROPE:
        return []
    out: list[str] = []
    theta = (expected.rope_theta or 10000.0, got.rope_theta or 10000.0)
    if theta[0] != theta[1]:
        out.append(f"rope_theta: {theta[0]:g} vs {theta[1]:g} (--rotary-base)")
    percent = (expected.rotary_percent or 1.0, got.rotary_percent or 1.0)
    if percent[0] != percent[1]:
        out.append(f"rotary_percent: {percent[0]:g} vs {percent[1]:g} (--rotary-percent)")
    a, b = _applied(expected), _applied(got)
    if a != b:
        detail = f"{_say(a)} vs {_say(b)}" if _say(a) != _say(b) else f"{a} vs {b}"
        out.append(f"rope_scaling: {detail} (the launch's RoPE scaling flags)")
    return out


def _applied(model: ModelSpec) -> dict[str, object] | None:
    """The scaling as the launch applies it: unset YaRN betas and truncate are the defaults 32, 1, true."""
    scaling = _scaling(model)
    if scaling is None:
        return None
    facts = scaling.model_dump(exclude_none=True)
    return {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True} | facts if scaling.type == "yarn" else facts


def _say(facts: dict[str, object] | None) -> str:
    return "none" if facts is None else f"{facts['type']} factor {facts['factor']:g}"
