"""A Hugging Face ``config.json``'s ``quantization_config``: the checkpoint those weights are, as a
`Checkpoint` entry of the imported model (what the serving launchers load and the cost model prices).

Read as vLLM reads it to pick its --quantization method:
* ``quant_method: fp8`` (DeepSeek-V3/R1, Qwen3-FP8): FP8 E4M3 weights; ``weight_block_size`` [128, 128]
  makes them block-scaled (one scale per 128 x 128 block, activations per 1 x 128 group), without it
  per-tensor. ``fmt`` other than e4m3 and block sizes other than 128 x 128 are noted.
* ``fbgemm_fp8``: FP8 per output channel (not block-scaled).
* ``compressed-tensors``: the first config group's weights: 8-bit floats are FP8 (``strategy: block``
  with ``block_structure`` [128, 128] block-scaled), 8/4-bit integers int8/int4.
* ``modelopt``: ``quant_algo`` FP8 or NVFP4; ``gptq`` / ``awq``: ``bits`` 4 or 8 (vLLM's Marlin
  kernels); ``mxfp4``: MXFP4 (gpt-oss). A config with ``producer.name: modelopt`` and no ``quant_method``
  (ModelOpt's own export, ``quant_algo`` at the top or under ``quantization``) is ModelOpt, as vLLM's
  ModelConfig sets it.
Where it is looked for, in vLLM's order (vllm/transformers_utils/config.py and
model_executor/model_loader/weight_utils.py ``get_quant_config``): the top-level ``quantization_config``,
else ``text_config.quantization_config`` (multimodal wrappers: Kimi-K2.5 keeps its int4 experts there),
else compressed-tensors' ``compression_config``, else a ``hf_quant_config.json`` beside config.json
(ModelOpt 0.29 and older write it there: nvidia/*-FP8, *-NVFP4).
Anything else (bitsandbytes, a method this list does not know, a field of the wrong type) is ignored
with a UserWarning naming the file and the key: the model imports as BF16 and the serving job's
``--weight-dtype`` decides. Never raises.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["checkpoint_from_quantization_config"]

REPO_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _note(source: str, key: str, message: str) -> None:
    warnings.warn(f"{source}: {key}: {message}", UserWarning, stacklevel=4)


def _repo(name: Any) -> str | None:
    """The Hugging Face repo id `_name_or_path` names, if it is one (owner/name)."""
    if not isinstance(name, str):
        return None
    parts = name.strip("/").split("/")
    if len(parts) != 2 or not all(parts) or not all(set(p) <= REPO_CHARS for p in parts):
        return None
    if not parts[0][0].isalnum() or len(name) > 200:
        return None
    return name.strip("/")


def _block_128(block: Any, source: str, key: str) -> bool:
    """Whether `block` is [128, 128]; another block shape is noted (priced as 128 x 128 kernels)."""
    if not isinstance(block, (list, tuple)) or len(block) != 2 or not all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block
    ):
        _note(source, key,
              f"expected two positive integers like [128, 128], got {block!r}; read as per-tensor FP8")
        return False
    if list(block) != [128, 128]:
        _note(source, key, f"block {list(block)} is priced as the 128 x 128 block-scaled FP8 kernels "
                           "(the only block size with a published kernel measurement)")
    return True


def _fp8(method: str, block: bool) -> tuple[str, str, bool]:
    return "fp8", method, block


def _compressed_tensors(q: dict, source: str, key: str) -> tuple[str, str, bool] | None:
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        _note(source, f"{key}.config_groups",
              "missing or empty: cannot tell the weights' format; imported as BF16")
        return None
    group = next(iter(groups.values()))
    weights = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(weights, dict):
        _note(source, f"{key}.config_groups", "no weights entry in the first group; imported as BF16")
        return None
    bits, kind = weights.get("num_bits"), weights.get("type")
    if kind == "float" and bits == 8:
        block = weights.get("strategy") == "block" and _block_128(
            weights.get("block_structure"), source, f"{key}.config_groups.weights.block_structure")
        return "fp8", "compressed-tensors", block
    if kind == "int" and bits in (4, 8):
        return f"int{bits}", "compressed-tensors", False
    _note(source, f"{key}.config_groups", f"weights of type {kind!r} with {bits!r} bits are not modelled; "
                                          "imported as BF16")
    return None


def _modelopt_algo(q: dict) -> Any:
    """ModelOpt's quant_algo: at the top of a quantization_config, or under ``quantization`` in its own
    export (hf_quant_config.json: {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": ...}})."""
    nested = q.get("quantization")
    if q.get("quant_algo") is None and isinstance(nested, dict):
        return nested.get("quant_algo")
    return q.get("quant_algo")


def _note_kv_cache(q: dict, source: str, key: str) -> None:
    """ModelOpt's kv_cache_quant_algo (FP8 KV-cache scales in the checkpoint) is not read: say so."""
    nested = q.get("quantization") if isinstance(q.get("quantization"), dict) else q
    kv = nested.get("kv_cache_quant_algo", q.get("kv_cache_quant_algo"))
    if isinstance(kv, str) and kv.strip():
        _note(source, f"{key}.kv_cache_quant_algo",
              f"the checkpoint carries {kv} KV-cache scales (vLLM may store the cache in {kv} with "
              "--kv-cache-dtype auto); autoshard prices the KV cache at the serving job's --kv-cache-dtype "
              "(bf16 unless given): give --kv-cache-dtype fp8 to price an FP8 cache")


def _is_modelopt(q: dict) -> bool:
    producer = q.get("producer")
    return isinstance(producer, dict) and producer.get("name") == "modelopt" and _modelopt_algo(q) is not None


def _read(q: dict, source: str, key: str) -> tuple[str, str, bool] | None:
    """(weight dtype, vLLM --quantization method, block-scaled) or None."""
    method = q.get("quant_method")
    if method is None and _is_modelopt(q):
        method = "modelopt"
    if not isinstance(method, str):
        _note(source, f"{key}.quant_method", f"missing or not a string ({method!r}); imported as BF16")
        return None
    method = method.lower()
    if method == "fp8":
        fmt = q.get("fmt", "e4m3")
        if fmt != "e4m3":
            _note(source, f"{key}.fmt", f"{fmt!r} FP8 is priced as E4M3 (same bytes and tensor-core rate)")
        block = "weight_block_size" in q and q["weight_block_size"] is not None and _block_128(
            q["weight_block_size"], source, f"{key}.weight_block_size")
        return _fp8("fp8", block)
    if method == "fbgemm_fp8":
        return _fp8("fbgemm_fp8", False)
    if method in ("compressed-tensors", "compressed_tensors"):
        return _compressed_tensors(q, source, key)
    if method == "modelopt":
        algo = str(_modelopt_algo(q) or "").upper()
        _note_kv_cache(q, source, key)
        if algo == "FP8":
            return _fp8("modelopt", False)
        if algo == "NVFP4":
            return "nvfp4", "modelopt_fp4", False
        _note(source, f"{key}.quant_algo",
              f"ModelOpt {_modelopt_algo(q)!r} is not modelled (FP8 and NVFP4 are); imported as BF16")
        return None
    if method in ("gptq", "awq"):
        bits = q.get("bits", q.get("w_bit"))
        if bits == 4:
            return "int4", f"{method}_marlin", False
        if bits == 8 and method == "gptq":
            return "int8", "gptq_marlin", False
        _note(source, f"{key}.bits", f"{method} with {bits!r} bits is not modelled; imported as BF16")
        return None
    if method == "mxfp4":
        return "mxfp4", "mxfp4", False
    _note(source, f"{key}.quant_method", f"{method!r} is not modelled (fp8, fbgemm_fp8, compressed-tensors, "
                                         "modelopt, gptq, awq, mxfp4 are); imported as BF16")
    return None


def _find(config: dict[str, Any], sidecar: Any) -> tuple[str, Any]:
    """(the key to name, the quantization dict) in vLLM's order of lookup; (key, None) when none. vLLM's
    get_config makes hf_quant_config.json the config's quantization_config when it has none, before
    get_quant_config looks at text_config and compression_config: the sidecar comes second."""
    text = config.get("text_config")
    for key, value in (("quantization_config", config.get("quantization_config")),
                       ("hf_quant_config.json", sidecar),
                       ("text_config.quantization_config",
                        text.get("quantization_config") if isinstance(text, dict) else None),
                       ("compression_config", config.get("compression_config"))):
        if value is not None:
            return key, value
    return "hf_quant_config.json", None


def checkpoint_from_quantization_config(config: dict[str, Any], *, source: str, name: str,
                                        sidecar: dict[str, Any] | None = None) -> dict | None:
    """The `Checkpoint` fields (weights, repo, quantization, block_scaled, source) the config's
    ``quantization_config`` describes (else `sidecar`, the hf_quant_config.json beside config.json, else
    ``text_config.quantization_config`` or compressed-tensors' older ``compression_config``), the repo
    being the imported model's `name` (``_name_or_path``, or the Hugging Face cache folder's repo id);
    None when there is none, and, with a UserWarning, when it is not modelled or `name` is no
    Hugging Face repo id."""
    key, q = _find(config, sidecar)
    if q is None:
        return None
    if not isinstance(q, dict):
        _note(source, key, f"expected an object, got {type(q).__name__}; imported as BF16")
        return None
    if key == "compression_config" and "quant_method" not in q:
        q = {**q, "quant_method": "compressed-tensors"}
    if key == "hf_quant_config.json" and "quant_method" not in q:
        q = {**q, "quant_method": "modelopt"}  # ModelOpt's own file (vLLM reads it for ModelOpt only)
    read = _read(q, source, key)
    if read is None:
        return None
    weights, method, block = read
    repo = _repo(name)
    if repo is None:
        _note(source, "_name_or_path",
              f"{weights} weights ({method}) found, but the model's name {name!r} is no Hugging Face repo "
              "id (owner/name), so the checkpoint cannot be listed; serve it with --weight-dtype and a "
              "model file whose checkpoints: name it")
        return None
    return {"weights": weights, "repo": repo, "quantization": method, "block_scaled": block,
            "source": f"{source}: {key}"}
