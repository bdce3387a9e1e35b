"""Turn a path or a bundled name into a validated spec. Every failure is a SpecError that names the
file, the field and the fix."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autoshard.errors import SpecError
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.model import ModelSpec

__all__ = [
    "catalog_dir", "bundled_models", "bundled_clusters", "load_model", "load_cluster",
    "read_mapping", "validate", "format_validation_error",
]

T = TypeVar("T", bound=BaseModel)


def catalog_dir(kind: str) -> Path:
    """Directory of bundled `models` or `clusters`: inside the installed wheel, or the repo checkout."""
    packaged = Path(__file__).resolve().parent.parent / "_catalog" / kind
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / kind


def _bundled(kind: str) -> dict[str, Path]:
    root = catalog_dir(kind)
    if not root.is_dir():
        return {}
    return {p.stem: p for p in sorted(root.glob("*.yaml"))}


def bundled_models() -> dict[str, Path]:
    return _bundled("models")


def bundled_clusters() -> dict[str, Path]:
    return _bundled("clusters")


def _resolve(ref: str | Path, kind: str) -> Path:
    path = Path(ref)
    if path.is_file():
        return path
    looks_like_path = path.suffix in (".yaml", ".yml", ".json") or "/" in str(ref) or "\\" in str(ref)
    if looks_like_path:
        raise SpecError(f"file not found: {path} (check the path, or give a bundled {kind[:-1]} name)")
    catalog = _bundled(kind)
    if str(ref) in catalog:
        return catalog[str(ref)]
    close = difflib.get_close_matches(str(ref), list(catalog), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise SpecError(
        f"unknown {kind[:-1]} '{ref}': {hint}Run `autoshard {kind}` to list the bundled ones, "
        f"or pass a path to a YAML file."
    )


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file that must hold a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read the file ({exc.strerror})", source=str(path)) from None
    except UnicodeDecodeError:
        raise SpecError("the file is not UTF-8 text", source=str(path)) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", source=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"invalid YAML{where}: {problem}", source=str(path)) from None
    if not isinstance(data, dict):
        raise SpecError(
            f"expected a mapping of fields at the top level, got {type(data).__name__}", source=str(path)
        )
    return data


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
        msg += f" (got {err.get('input')!r}): sizes must be positive"
    elif kind in ("int_parsing", "int_type", "float_parsing", "float_type", "bool_parsing", "bool_type",
                  "int_from_float", "enum", "literal_error", "string_type", "list_type", "model_type",
                  "dict_type", "less_than_equal", "less_than"):
        msg += f" (got {err.get('input')!r})"
    if not field:
        field = "(top level)"
    return field, msg


def validate(model: type[T], data: dict[str, Any], *, source: str) -> T:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        field, msg = format_validation_error(exc, model)
        if model is ClusterSpec and "pools" not in data and field.startswith("pools[0]."):
            field = field[len("pools[0]."):]  # the file is written flat: name the field as written
        raise SpecError(msg, source=source, field=field) from None


def _is_hf_config(path: Path, data: dict[str, Any]) -> bool:
    return path.suffix == ".json" or ("model_type" in data and "layers" not in data)


def load_model(ref: str | Path) -> ModelSpec:
    """A ModelSpec from a YAML path, a Hugging Face config.json path, or a bundled name."""
    if isinstance(ref, ModelSpec):
        return ref
    path = _resolve(ref, "models")
    data = read_mapping(path)
    if _is_hf_config(path, data):
        from autoshard.specs.hf import model_from_hf_config

        return model_from_hf_config(data, source=str(path))
    data.setdefault("name", path.stem)
    return validate(ModelSpec, data, source=str(path))


def load_cluster(ref: str | Path) -> ClusterSpec:
    """A ClusterSpec from a YAML path or a bundled name."""
    if isinstance(ref, ClusterSpec):
        return ref
    path = _resolve(ref, "clusters")
    data = read_mapping(path)
    data.setdefault("name", path.stem)
    return validate(ClusterSpec, data, source=str(path))
