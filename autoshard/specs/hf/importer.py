"""The Hugging Face importer's entry point: pick the converter of the config's ``model_type`` (one per
family module), name the model, validate the result as a ModelSpec and name the config key behind any
validation error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoshard.errors import SpecError
from autoshard.specs.hf import dense, gpt, moe
from autoshard.specs.hf.quant import checkpoint_from_quantization_config
from autoshard.specs.hf.reader import Converter, Reader
from autoshard.specs.model import ModelSpec
from autoshard.specs.validation import format_validation_error

__all__ = ["model_from_hf_config", "SUPPORTED_MODEL_TYPES"]

_CONVERTERS: dict[str, Converter] = {**dense.CONVERTERS, **moe.CONVERTERS, **gpt.CONVERTERS}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_CONVERTERS))


def _default_name(source: str) -> str:
    path = Path(source)
    if path.name != "config.json":
        return path.stem or "model"
    parent = path.resolve().parent if path.parent in (Path(""), Path(".")) else path.parent
    # Hugging Face cache: .../models--org--name/snapshots/<commit>/config.json
    if parent.parent.name == "snapshots" and parent.parent.parent.name.startswith("models--"):
        return parent.parent.parent.name[len("models--"):].replace("--", "/")
    return parent.name or "model"


def model_from_hf_config(config: dict[str, Any], *, source: str) -> ModelSpec:
    """A ModelSpec from a parsed Hugging Face ``config.json``.

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
    if not isinstance(model_type, str) or model_type not in _CONVERTERS:
        raise reader.error("model_type", f"unsupported model_type {model_type!r}: autoshard imports "
                                         f"{supported}; for other architectures write a YAML model spec "
                                         "(see models/ for examples)")

    fields = _CONVERTERS[model_type](reader, model_type)
    name = data.get("_name_or_path")
    fields["name"] = name.rstrip("/") if isinstance(name, str) and name.strip("/ ") else _default_name(source)
    if isinstance(name, str) and name.strip("/ "):
        reader.origin["name"] = "_name_or_path"  # a bad name is named by its config key
    fields["source"] = source
    checkpoint = checkpoint_from_quantization_config(config, source=source, name=fields["name"])
    if checkpoint is not None:
        checkpoint["source"] = checkpoint["source"][:2000]
        fields["checkpoints"] = [checkpoint]
        reader.origin["checkpoints"] = "quantization_config"
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        field, message = format_validation_error(exc, ModelSpec)
        raise SpecError(f"{message} (model_type {model_type})", source=source,
                        field=_config_key(reader.origin, field, message)) from None


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
