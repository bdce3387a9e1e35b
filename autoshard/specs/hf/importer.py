"""The Hugging Face importer's entry point: pick the converter of the config's ``model_type`` (one per
family module), name the model, validate the result as a ModelSpec and name the config key behind any
validation error."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoshard.errors import SpecError
from autoshard.specs.base import MAX_NAME_LEN
from autoshard.specs.hf import dense, gemma, gpt, moe
from autoshard.specs.hf.quant import checkpoint_from_quantization_config
from autoshard.specs.hf.reader import Converter, Reader
from autoshard.specs.hf.rope import rope_base_fields, rope_scaling_fields
from autoshard.specs.hf.window import layer_windows, with_windows
from autoshard.specs.layers import LayerKind, PositionKind
from autoshard.specs.model import ModelSpec
from autoshard.specs.validation import format_validation_error

__all__ = ["model_from_hf_config", "SUPPORTED_MODEL_TYPES"]

_CONVERTERS: dict[str, Converter] = {**dense.CONVERTERS, **moe.CONVERTERS, **gpt.CONVERTERS, **gemma.CONVERTERS}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_CONVERTERS))

# Architectures users bring that the schema cannot describe, with what it lacks: importing them as the
# nearest supported family would give wrong attention FLOPs and KV-cache bytes without a word.
_NOT_MODELLED: dict[str, str] = {
    "gpt_oss": "its 128-token sliding-window layers are expressible (attention_window), but not the rest: "
               "learned attention sinks (one extra logit per head and row, a kernel path of their own), the "
               "biases of the router and of every expert, and MXFP4 weights on the experts only beside BF16 "
               "attention (the schema's weight dtype is one for every linear layer)",
    "llama4": "3 of 4 layers use chunked attention (attention_chunk_size) and MoE layers interleave with "
              "dense ones (interleave_moe_layer_step) beside a shared expert; the schema has full attention "
              "only",
    "qwen3_next": "3 of 4 layers are Gated DeltaNet linear attention (linear_* keys, no KV cache) and "
                  "attention is gated; the schema has softmax attention only",
    "deepseek_v32": "DeepSeek sparse attention (index_n_heads, index_topk: a lightning indexer picks the "
                    "tokens each query attends to) changes attention FLOPs; importing it as deepseek_v3 "
                    "would price dense MLA attention",
    "mamba": "state-space layers have no attention or KV cache",
    "mamba2": "state-space layers have no attention or KV cache",
    "jamba": "Mamba layers interleave with attention layers",
    "nemotron_h": "Mamba-2 layers interleave with attention layers",
    "falcon_h1": "Mamba-2 heads run beside attention heads",
    "minimax": "7 of 8 layers use lightning (linear) attention",
    "minimax_m1": "7 of 8 layers use lightning (linear) attention",
}


def _default_name(source: str) -> str:
    path = Path(source)
    if path.name != "config.json":
        return path.stem or "model"
    parent = path.resolve().parent if path.parent in (Path(""), Path(".")) else path.parent
    # Hugging Face cache: .../models--org--name/snapshots/<commit>/config.json
    if parent.parent.name == "snapshots" and parent.parent.parent.name.startswith("models--"):
        return parent.parent.parent.name[len("models--"):].replace("--", "/")
    return parent.name or "model"


def model_from_hf_config(config: dict[str, Any], *, source: str,
                         hf_quant_config: dict[str, Any] | None = None) -> ModelSpec:
    """A ModelSpec from a parsed Hugging Face ``config.json`` (and the ``hf_quant_config.json`` found beside
    it, ModelOpt's quantization file, where there is one).

    Bad input raises SpecError naming the config key, never another exception."""
    if not isinstance(config, dict):
        raise SpecError(f"expected a JSON object of config fields, got {type(config).__name__}",
                        source=source)
    data, prefix = config, ""
    text = config.get("text_config")
    if isinstance(text, dict):
        # Multimodal wrappers (Llava, Mistral3, ...) keep the language model in text_config.
        data = {k: config[k] for k in ("_name_or_path", "tie_word_embeddings") if k in config}
        data.update(text)
        if "model_type" not in text and "model_type" in config:
            data["model_type"] = config["model_type"]
        prefix = "text_config."
    reader = Reader(data, source=source, prefix=prefix)

    model_type = data.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is None:
        raise reader.error("model_type", f"required key is missing: cannot tell the architecture (supported: "
                                         f"{supported}); add it, or write a YAML model spec instead")
    base_type = model_type.removesuffix("_text") if isinstance(model_type, str) else None
    if base_type in _NOT_MODELLED:
        raise reader.error("model_type", f"model_type {model_type!r} is not supported: {_NOT_MODELLED[base_type]}. "
                                         "autoshard does not approximate it (its numbers would be wrong). A YAML model "
                                         "spec with full attention in every layer gives an upper bound on attention "
                                         f"time and KV memory; Hugging Face configs import for {supported}")
    if not isinstance(model_type, str) or model_type not in _CONVERTERS:
        raise reader.error("model_type", f"unsupported model_type {model_type!r}: autoshard imports "
                                         f"{supported}; for other architectures write a YAML model spec "
                                         "(see models/ for examples)")

    fields = _CONVERTERS[model_type](reader, model_type)
    windows = layer_windows(reader, model_type, sum(
        g.get("count", 1) for g in fields["layers"] if g["kind"] in (LayerKind.DENSE, LayerKind.MOE)))
    if any(windows):
        fields["layers"] = with_windows(fields["layers"], windows)
    if fields.get("position_embedding", PositionKind.ROPE) is PositionKind.ROPE:
        # launch facts the Megatron-LM command carries (--rotary-base, --rotary-percent); no cost depends on them
        fields["rope_theta"], fields["rotary_percent"] = rope_base_fields(reader)
        fields["rope_scaling"] = rope_scaling_fields(reader, fields["max_position_embeddings"])
        if fields["rope_scaling"] is not None and model_type.startswith("gemma3"):
            fields["rope_scaling"]["extends_context"] = False  # its 131,072 is the scaled context already
    fields["name"] = _name(reader, source)
    fields["source"] = source
    checkpoint = checkpoint_from_quantization_config(config, source=source, name=fields["name"],
                                                     sidecar=hf_quant_config)
    if checkpoint is not None:
        checkpoint["source"] = checkpoint["source"][:2000]
        fields["checkpoints"] = [checkpoint]
        reader.origin["checkpoints"] = checkpoint["source"].rpartition(": ")[2]
    try:
        spec = ModelSpec.model_validate(fields)
    except ValidationError as exc:
        field, message = format_validation_error(exc, ModelSpec)
        raise SpecError(f"{message} (model_type {model_type})", source=source,
                        field=_config_key(reader.origin, field, message)) from None
    _note_towers(config, source)
    return spec


def _name(reader: Reader, source: str) -> str:
    """``_name_or_path``, else the folder's (or file's) name. A path longer than a model name may be
    (MAX_NAME_LEN: a deep local checkout) falls back to the folder's name with a warning, not a refusal."""
    name = reader.data.get("_name_or_path")
    if not isinstance(name, str) or not name.strip("/ "):
        return _default_name(source)
    name = name.rstrip("/")
    if len(name) > MAX_NAME_LEN:
        fallback = _default_name(source)[:MAX_NAME_LEN]
        warnings.warn(f"{source}: _name_or_path: {len(name)} characters, more than a model name holds "
                      f"({MAX_NAME_LEN}): the model is named {fallback!r} after its file instead", UserWarning,
                      stacklevel=3)
        return fallback
    reader.origin["name"] = "_name_or_path"  # a bad name is named by its config key
    return name


# other towers a multimodal wrapper carries beside text_config, none of them modelled
_TOWERS = ("vision_config", "audio_config", "speech_config", "vision_tower_config")


def _note_towers(config: dict[str, Any], source: str) -> None:
    """A multimodal config imports as its language model only (text_config, or the top level): say that
    the other towers' weights are left out (serving memory is low by that much; training FLOPs leave
    out the towers)."""
    towers = [key for key in _TOWERS if isinstance(config.get(key), dict)]
    if towers:
        warnings.warn(f"{source}: {', '.join(towers)}: only the language model is imported: the "
                      f"{' and '.join(t.removesuffix('_config').replace('_', ' ') for t in towers)} tower's "
                      "weights are not counted, so serving weight memory is low by their size and training "
                      "leaves their FLOPs out", UserWarning, stacklevel=3)


def _config_key(origin: dict[str, str], field: str, message: str) -> str:
    """The config.json key behind a ModelSpec validation error: the failing field itself, else the
    first spec field the message names (cross-field checks fail at the top level)."""
    if field in origin:
        return origin[field]
    named = [
        (m.start(), key)
        for spec_field, key in origin.items()
        if (m := re.search(rf"(?<![\w.]){re.escape(spec_field)}(?!\w)", message))
    ]
    return min(named)[1] if named else field
