"""Turn a path or a bundled name into a validated spec. Every failure is a SpecError that names the
file, the field and the fix."""

from __future__ import annotations

import difflib
import errno
import json
import re
import warnings
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autoshard.errors import SpecError
from autoshard.specs.cluster import ClusterSpec, PoolSpec
from autoshard.specs.hf import model_from_hf_config
from autoshard.specs.model import ModelSpec
from autoshard.specs.validation import format_validation_error
from autoshard.specs.validation import short as _short

__all__ = [
    "catalog_dir", "bundled_models", "bundled_clusters", "load_model", "load_cluster",
    "read_mapping", "validate", "StrictLoader", "MAX_FILE_BYTES", "MAX_JSON_BYTES", "MAX_DEPTH", "MAX_VALUES", "FILES_READ",
]

T = TypeVar("T", bound=BaseModel)

MAX_FILE_BYTES = 1 << 20
"""Largest YAML model/cluster file read (the bundled ones are a few KB)."""
MAX_JSON_BYTES = 32 << 20
"""Largest JSON file read: a Hugging Face config.json of a quantized checkpoint can list every layer its
quantization leaves out (nvidia/MiniMax-M3-NVFP4's is 2.9 MiB, its quantization_config.ignore list)."""
MAX_DEPTH = 32
"""Deepest nesting of mappings and lists a spec file may have (specs nest four levels)."""
MAX_VALUES = 100_000
"""Most values (scalars, lists and mappings) a spec file may expand to."""


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema scalars and no duplicate keys.

    PyYAML implements YAML 1.1, where `yes`/`no`/`on`/`off` are booleans, `64:00` is the base-60
    integer 3840, `0777` octal and `1_000` an integer, and a repeated key silently replaces the first.
    Here only `true`/`false` are booleans, integers are decimal (or 0x/0o), floats are decimal with an
    optional exponent (`1e3` included) or `.inf`/`.nan` (which the specs then refuse), and a repeated
    key is an error."""


StrictLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     "-+.0123456789"),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
):
    StrictLoader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


def _construct_yaml12_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    try:
        if text.startswith("0o"):
            return int(text[2:], 8)
        return int(text, 0) if text.startswith("0x") else int(text, 10)
    except ValueError:  # more digits than Python converts
        raise yaml.constructor.ConstructorError(None, None, f"the integer has {len(text)} digits: far beyond any "
                                                "size autoshard accepts", node.start_mark) from None


def _construct_yaml12_float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    text = str(loader.construct_scalar(node)).lower()  # type: ignore[arg-type]
    return float(text.replace(".inf", "inf").replace(".nan", "nan"))


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node)
        if not isinstance(key, str | int | float | bool) and key is not None:
            raise yaml.constructor.ConstructorError(None, None, "a mapping key must be plain text", key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}' (also at line {seen[key] + 1}): keep one of them", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return {loader.construct_object(k): loader.construct_object(v) for k, v in node.value}


StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_yaml12_int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_yaml12_float)
StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key '{key}': keep one of them")
        out[key] = value
    return out


def _check_shape(data: Any, source: str, *, count: bool = True) -> None:
    """Refuse nesting deeper than MAX_DEPTH and (with `count`: YAML, whose aliases can make a small file
    expand exponentially, the "billion laughs") more than MAX_VALUES values in all. JSON has no aliases:
    its size cap bounds its values. Iterative, and stops at the first excess."""
    stack, seen = [(data, 1)], 0
    while stack:
        item, level = stack.pop()
        seen += 1
        if count and seen > MAX_VALUES:
            raise SpecError(f"the file expands to more than {MAX_VALUES} values (YAML aliases?): a spec file holds a "
                            "few hundred", source=source)
        if isinstance(item, dict | list):
            if level > MAX_DEPTH:
                raise SpecError(f"nested more than {MAX_DEPTH} levels deep: a spec file nests at most a few levels",
                                source=source)
            stack += [(v, level + 1) for v in (item.values() if isinstance(item, dict) else item)]


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
    try:
        if path.is_file():
            return path
    except OSError as exc:  # e.g. ENAMETOOLONG, which pathlib does not swallow
        reason = "the file name is too long" if exc.errno == errno.ENAMETOOLONG else exc.strerror
        raise SpecError(f"cannot open the {kind[:-1]} file: {reason} (check the path)", source=_short(str(ref))) from None
    if path.is_dir():
        raise SpecError(f"this is a directory, not a {kind[:-1]} file: give the path of the YAML/JSON file inside it",
                        source=str(path))
    if path.exists():  # a device, a FIFO: nothing a spec is read from (a FIFO would block the read)
        raise SpecError(f"this is not a regular file: give the path of the {kind[:-1]}'s YAML/JSON file",
                        source=_short(str(ref)))
    if path.is_symlink():  # exists() is False for a dangling link or a loop
        raise SpecError(f"this symbolic link leads to no file (dangling, or a loop): give the path of the {kind[:-1]}'s "
                        f"YAML/JSON file", source=_short(str(ref)))
    looks_like_path = path.suffix in (".yaml", ".yml", ".json") or "/" in str(ref) or "\\" in str(ref)
    if looks_like_path:
        raise SpecError(f"file not found: {path} (check the path, or give a bundled {kind[:-1]} name)")
    catalog = _bundled(kind)
    if str(ref) in catalog:
        return catalog[str(ref)]
    other = "clusters" if kind == "models" else "models"
    if str(ref) in _bundled(other):
        raise SpecError(f"'{ref}' is a bundled {other[:-1]}, not a {kind[:-1]}: give the {kind[:-1]} where a "
                        f"{kind[:-1]} is expected (`autoshard solve MODEL CLUSTER`, `autoshard study MODEL "
                        f"--cluster CLUSTER`; `autoshard {kind}` lists the bundled ones)")
    close = difflib.get_close_matches(str(ref), list(catalog), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise SpecError(
        f"unknown {kind[:-1]} '{ref}': {hint}Run `autoshard {kind}` to list the bundled ones, "
        f"or pass a path to a YAML file."
    )


FILES_READ: set[Path] = set()
"""Every model or cluster file this process has read (resolved): a command's outputs must not overwrite
its own inputs (`api.write_launch_script`)."""


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file that must hold a mapping (YAML 1.2 scalars, no duplicate keys, at most
    MAX_FILE_BYTES and MAX_DEPTH levels)."""
    try:
        FILES_READ.add(path.resolve())
        size = path.stat().st_size
        json_file = path.suffix == ".json"
        cap = MAX_JSON_BYTES if json_file else MAX_FILE_BYTES
        if size > cap:
            kind = "a JSON (Hugging Face config.json) file" if json_file else "a YAML model or cluster file"
            raise SpecError(f"the file is {size / 2**20:.1f} MiB; {kind} is at most {cap >> 20} MiB: give the "
                            "right file", source=str(path))
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors) is not content
    except OSError as exc:
        raise SpecError(f"cannot read the file ({exc.strerror})", source=str(path)) from None
    except UnicodeDecodeError:
        raise SpecError("the file is not UTF-8 text", source=str(path)) from None
    if json_file and not text.strip():
        raise SpecError("the file is empty: a config.json is a JSON object of the model's fields", source=str(path))
    try:
        if json_file:
            data = json.loads(text, object_pairs_hook=_json_object)
        else:
            data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except json.JSONDecodeError as exc:
        raise SpecError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", source=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"invalid YAML{where}: {problem}", source=str(path)) from None
    except RecursionError:
        raise SpecError(f"nested too deeply (a spec file has at most {MAX_DEPTH} levels)", source=str(path)) from None
    except ValueError as exc:  # a duplicate JSON key, or a number Python cannot hold
        if "int_max_str_digits" in str(exc) or "integer string conversion" in str(exc):
            raise SpecError("a number in the file has thousands of digits, beyond any model or cluster figure: fix "
                            "it", source=str(path)) from None
        raise SpecError(f"invalid JSON: {exc}", source=str(path)) from None
    _check_shape(data, str(path), count=not json_file)
    if data is None:
        raise SpecError("the file is empty (or only comments): a model or cluster file is a mapping of fields, "
                        "e.g. `name: ...`", source=str(path))
    if not isinstance(data, dict):
        raise SpecError(
            f"expected a mapping of fields at the top level, got {type(data).__name__}", source=str(path)
        )
    return data


def validate(model: type[T], data: dict[str, Any], *, source: str) -> T:
    try:
        return model.model_validate(data)
    except RecursionError:
        raise SpecError(f"nested too deeply (a spec nests at most {MAX_DEPTH} levels)", source=source) from None
    except ValidationError as exc:
        field, msg = format_validation_error(exc, model)
        if model is ClusterSpec and "pools" not in data and field.startswith("pools[0]."):
            field = field[len("pools[0]."):]  # the file is written flat: name the field as written
        elif model is ClusterSpec and "pools" not in data and "." not in field and msg.startswith("unknown field"):
            msg = _unknown_flat_field(field)  # a flat file's top level holds the pool's fields too
        raise SpecError(msg, source=source, field=field) from None


_FLAT_CLUSTER_FIELDS = sorted((set(ClusterSpec.model_fields) - {"pools"}) | set(PoolSpec.model_fields))
"""The top-level fields of a single-pool cluster written flat (gpu/node/num_nodes at the top)."""


def _unknown_flat_field(field: str) -> str:
    close = difflib.get_close_matches(field, _FLAT_CLUSTER_FIELDS, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return (f"unknown field; {hint}allowed fields here: {', '.join(_FLAT_CLUSTER_FIELDS)} "
            "(or pools: [...] for several GPU types)")


_CLUSTER_KEYS = ("gpu", "node", "num_nodes", "pools")
_MODEL_KEYS = ("layers", "hidden_size", "num_attention_heads", "model_type")


def _check_kind(data: dict[str, Any], kind: str, source: str) -> None:
    """A cluster file given as the model (or the other way round, arguments swapped) is named as such,
    not reported as a list of unknown fields."""
    mine, other = (_MODEL_KEYS, _CLUSTER_KEYS) if kind == "model" else (_CLUSTER_KEYS, _MODEL_KEYS)
    if not any(k in data for k in mine) and any(k in data for k in other):
        found = "cluster" if kind == "model" else "model"
        raise SpecError(f"this is a {found} file ({', '.join(k for k in other if k in data)}), not a {kind} file: "
                        f"give the {kind} where a {kind} is expected (`autoshard solve MODEL CLUSTER`, "
                        "`autoshard study MODEL --cluster CLUSTER`)", source=source)


def _is_hf_config(path: Path, data: dict[str, Any]) -> bool:
    return path.suffix == ".json" or ("model_type" in data and "layers" not in data)


def _hf_quant_config(path: Path) -> dict[str, Any] | None:
    """ModelOpt's hf_quant_config.json beside a config.json (nvidia/*-FP8, *-NVFP4 checkpoints keep their
    quantization there, and vLLM reads it: vllm/transformers_utils/config.py), or None. One that cannot be
    read is a warning, as an unreadable quantization_config is (the model imports as BF16)."""
    sidecar = path.parent / "hf_quant_config.json"
    if path.name != "config.json" or not sidecar.is_file():
        return None
    try:
        return read_mapping(sidecar)
    except SpecError as exc:
        warnings.warn(f"{exc}: its quantization is not read; imported as BF16", UserWarning, stacklevel=3)
        return None


def load_model(ref: str | Path) -> ModelSpec:
    """A ModelSpec from a YAML path, a Hugging Face config.json path, or a bundled name."""
    if isinstance(ref, ModelSpec):
        return ref
    path = _resolve(ref, "models")
    data = read_mapping(path)
    _check_kind(data, "model", str(path))
    if _is_hf_config(path, data):
        return model_from_hf_config(data, source=str(path), hf_quant_config=_hf_quant_config(path))
    data.setdefault("name", path.stem)
    return validate(ModelSpec, data, source=str(path))


def load_cluster(ref: str | Path) -> ClusterSpec:
    """A ClusterSpec from a YAML path or a bundled name."""
    if isinstance(ref, ClusterSpec):
        return ref
    path = _resolve(ref, "clusters")
    data = read_mapping(path)
    _check_kind(data, "cluster", str(path))
    data.setdefault("name", path.stem)
    return validate(ClusterSpec, data, source=str(path))
