"""The max model length a `vllm serve` line starts with, as vLLM 0.33.0 derives it: the model's context
(--hf-overrides included) when the line gives no --max-model-len, checked where vLLM checks its start;
and the relaunch lines of a plan priced from such a line, which carry its overrides (`carry_overrides`).
"""

from __future__ import annotations

import dataclasses
import json
import re

from autoshard.emit.serve_args import ParsedServe
from autoshard.emit.shell import shell_word
from autoshard.emit.vllm.flags import VLLM_VERSION
from autoshard.errors import SpecError
from autoshard.specs.job import ServeJob
from autoshard.specs.model import ModelSpec

__all__ = ["UNSCALED_ROPE", "derived_max_model_len", "sglang_context_len", "start_context", "carry_overrides", "OVERRIDE_FLAGS"]

UNSCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
"""RoPE types whose factor vLLM 0.33.0 does not apply to max_position_embeddings (already scaled):
vllm/config/model.py:2602-2632."""


def sglang_context_len(model: ModelSpec, overrides: str) -> int:
    """The context SGLang 0.5.23 derives from the model's config updated by --json-model-override-args
    (`get_context_length`, srt/utils/hf_transformers/common.py:677-695): max_position_embeddings times the
    rope_scaling factor, unless rope_scaling has original_max_position_embeddings or is llama3 (already
    scaled). The rope_scaling counted is the override's (the model file's own context already stands
    for the checkpoint's config)."""
    ov = json.loads(overrides)
    length, rope = ov.get("max_position_embeddings", model.max_position_embeddings), ov.get("rope_scaling")
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise SpecError(f"--json-model-override-args max_position_embeddings must be a positive integer, got "
                        f"{length!r}", field="--json-model-override-args")
    factor = rope.get("factor", 1) if isinstance(rope, dict) else 1
    if not isinstance(rope, dict) or "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    return int(factor * length) if isinstance(factor, (int, float)) else length


def derived_max_model_len(model: ModelSpec, overrides: str | None = None) -> int:
    """The max model length vLLM 0.33.0 derives (`_get_and_verify_max_len`, vllm/config/model.py:2545-2683):
    the config's max_position_embeddings (transformers_utils/model_arch_config_convertor.py:374-407),
    times the RoPE scaling factor only for types outside `UNSCALED_ROPE` (of autoshard's types, linear);
    `overrides`: the line's --hf-overrides, whose max_position_embeddings and rope_scaling (or
    rope_parameters) replace the model's. A YaRN override alone therefore leaves the length as it was."""
    ov = json.loads(overrides) if overrides else {}
    length = ov.get("max_position_embeddings", model.max_position_embeddings)
    rope = ov.get("rope_scaling") or ov.get("rope_parameters")
    if isinstance(rope, dict):
        kind, factor = rope.get("rope_type") or rope.get("type") or "default", rope.get("factor")
    elif model.rope_scaling is not None and model.rope_scaling.extends_context is not False:
        kind, factor = model.rope_scaling.type, model.rope_scaling.factor
    else:
        kind, factor = "default", None
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise SpecError(f"--hf-overrides max_position_embeddings must be a positive integer, got {length!r}",
                        field="--hf-overrides")
    scale = factor if kind not in UNSCALED_ROPE and kind != "default" and isinstance(factor, (int, float)) else 1
    return int(length * scale)


def start_context(model: ModelSpec, job: ServeJob, parsed: ParsedServe, *,
                  engine: str = "vllm") -> tuple[ModelSpec, ServeJob, ParsedServe]:
    """(the model as the line loads it, `job` with the max model length a vLLM line starts with, `parsed`
    with the notes saying so). --hf-overrides that change vLLM's derived length (`derived_max_model_len`)
    give the model that context, with a note; a YaRN rope_scaling override alone does not, and a
    --max-model-len past it is refused naming the fix (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set). No
    --max-model-len: vLLM takes the model's context and refuses to start unless the KV cache holds one
    request of it (`check_enough_kv_cache_memory`, vllm/v1/core/kv_cache_planning.py:151-185), so the
    start check is made there; the requests are still priced at their shape (unchanged when the shape is
    past the context: refused as such, `search.serve.messages.check_context_len`). `engine` "sglang": an
    SGLang line's --json-model-override-args give the model the context SGLang derives
    (`sglang_context_len`), with a note; nothing else changes (its --context-length is checked against it
    downstream)."""
    if engine == "sglang":
        if not parsed.hf_overrides or (limit := sglang_context_len(model, parsed.hf_overrides)) == model.max_position_embeddings:
            return model, job, parsed
        note = (f"--json-model-override-args: SGLang's context length for {model.name} is {limit:,} "
                f"(was {model.max_position_embeddings:,}); checked against it")
        return (model.model_copy(update={"max_position_embeddings": limit}), job,
                dataclasses.replace(parsed, warnings=(*parsed.warnings, note)))
    limit, notes = derived_max_model_len(model, parsed.hf_overrides), []
    rope = (json.loads(parsed.hf_overrides) if parsed.hf_overrides else {}).get("rope_scaling") or {}
    mml = parsed.max_model_len
    if (isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in UNSCALED_ROPE and mml is not None
            and mml > limit and not parsed.allow_long_context):
        raise SpecError(f"--max-model-len {mml:,} is longer than {limit:,} (max_position_embeddings): vLLM "
                        f"{VLLM_VERSION} does not scale it by a {rope.get('rope_type', rope.get('type'))} override's "
                        f"factor (config/model.py:2602-2632) and refuses to start; add \"max_position_embeddings\": "
                        f"{mml} to --hf-overrides, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", field="--max-model-len")
    if limit != model.max_position_embeddings:
        cause = "--hf-overrides: " if parsed.hf_overrides else ""
        notes.append(f"{cause}vLLM's max model length for {model.name} is {limit:,} (max_position_embeddings "
                     f"{model.max_position_embeddings:,}, scaled by its RoPE factor); checked against it")
        model = model.model_copy(update={"max_position_embeddings": limit})
    if mml is None and job.input_len + job.output_len <= limit:
        notes.append(f"no --max-model-len: vLLM takes {model.name}'s context, {limit:,} tokens "
                     f"(max_position_embeddings), and starts only if the KV cache holds one request of that length: "
                     f"checked at {limit:,}, priced at the request shape ({job.input_len} in / {job.output_len} "
                     "out); pass --max-model-len to start with less")
        job = ServeJob.model_validate({**job.model_dump(), "max_model_len": limit})
    return model, job, dataclasses.replace(parsed, warnings=(*parsed.warnings, *notes))


OVERRIDE_FLAGS = {"vllm": ("--hf-overrides", "--max-model-len"), "sglang": ("--json-model-override-args", "--context-length")}
"""Per engine: (the flag whose JSON updates the model's Hugging Face config before the engine derives its
context, the context flag the relaunch line passes it after). vLLM 0.33.0 --hf-overrides (a dict updates
the config: config/model.py); SGLang 0.5.23 --json-model-override-args (`config.update(...)`,
srt/utils/hf_transformers/config.py:356-357)."""


def carry_overrides(launch: dict[str, str], overrides: str | None) -> dict[str, str]:
    """`launch` (a plan's relaunch lines: "vllm", "sglang", their "_nodes" variants) with the config
    overrides of the line the plan was read from passed to every engine line, `OVERRIDE_FLAGS`: the plan
    was priced at the context they give the model (`start_context`), which neither engine derives
    without them (vLLM refuses a --max-model-len past it, SGLang a --context-length). The JSON is
    re-serialized compactly (one line, the same object) and quoted as one shell word (`shell_word`).
    Unchanged when there are no overrides."""
    if not overrides:
        return dict(launch)
    word = shell_word(json.dumps(json.loads(overrides), separators=(",", ":")))
    out = {}
    for key, text in launch.items():
        flag, after = OVERRIDE_FLAGS.get(key.split("_")[0], (None, None))
        if flag is None:
            out[key] = text
            continue
        lines = []
        for line in text.split("\n"):
            if line.startswith("#") or f" {flag} " in line:
                lines.append(line)
                continue
            put, n = re.subn(rf"( {re.escape(after)} \S+)", lambda m: f"{m.group(1)} {flag} {word}", line, count=1)
            lines.append(put if n else f"{line} {flag} {word}")
        out[key] = "\n".join(lines)
    return out
