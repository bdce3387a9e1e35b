"""What a serving launch line says (`ParsedServe`, in vLLM's terms), and the reading every engine's
parser shares: splitting the command line, options vs. negative numbers, integer values (`32k`, `32K`),
and the dtype a `--quantization` / `--kv-cache-dtype` name stands for. The engine parsers sit beside
their launchers: `autoshard.emit.vllm.parse`, `autoshard.emit.sglang.parse`.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from autoshard.errors import SpecError
from autoshard.specs.job import ServeJob, WeightDtype

__all__ = ["ParsedServe", "json_object_arg", "misspelling_of", "weight_dtype_of", "kv_cache_dtype_of", "is_option", "to_int", "split_command",
           "ENV_WORD", "FP8", "INT8", "INT4", "NVFP4", "MXFP4", "OTHER_QUANT", "KV_BF16", "KV_FP8"]

ENV_WORD = re.compile(r"^[A-Za-z_]\w*=")


def json_object_arg(text: str | None, flag: str) -> str | None:
    """A config-override option's value as given (None when absent), checked to be a JSON object: vLLM's
    --hf-overrides and SGLang's --json-model-override-args are json.loads'ed and update the model's config
    (vLLM 0.33.0 config/model.py; SGLang 0.5.23 srt/configs/model_config.py:612,
    srt/utils/hf_transformers/config.py:356)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise SpecError(f"{flag} expects a JSON object, got {text!r}", field=flag)
    return text
_HUMAN = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])$")
_NUMBER = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")

FP8 = {
    "fp8",
    "fbgemm_fp8",
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "modelopt",
    "modelopt_mxfp8",
    "mxfp8",
    "deepseek_v4_fp8",
    "ptpc_fp8",
}
INT8 = {"int8_per_channel_weight_only", "experts_int8", "w8a8_int8"}
INT4 = {"awq", "auto_awq", "awq_marlin", "gptq", "auto_gptq", "gptq_marlin", "moe_wna16"}
NVFP4 = {"modelopt_fp4", "nvfp4_per_token", "modelopt_nvfp4"}
MXFP4 = {"mxfp4", "gpt_oss_mxfp4", "quark_mxfp4"}
KV_BF16 = {"auto", "bfloat16", "float16", "half"}
# the rest of vLLM's QuantizationMethods (vllm/model_executor/layers/quantization/__init__.py): vLLM
# refuses any other --quantization, and so does the parser
OTHER_QUANT = {"fp_quant", "modelopt_mixed", "gguf", "humming", "compressed-tensors", "bitsandbytes", "quark",
                "torchao", "inc", "cpu_awq", "online"}
KV_FP8 = {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "fp8_per_token_head"}


def weight_dtype_of(quantization: str | None) -> tuple[WeightDtype, str | None]:
    """Weight storage a --quantization method implies, and a warning when it is an approximation."""
    if quantization is None:
        return WeightDtype.BF16, None
    q = quantization.lower()
    if q in FP8:
        return WeightDtype.FP8, None
    if q in INT8:
        note = " (only the experts are int8; modelled as int8 everywhere)" if q == "experts_int8" else ""
        return WeightDtype.INT8, (f"--quantization {q}{note}" if note else None)
    if q in INT4:
        return WeightDtype.INT4, None
    if q in NVFP4:
        return WeightDtype.NVFP4, None
    if q in MXFP4:
        return WeightDtype.MXFP4, None
    return WeightDtype.BF16, (
        f"--quantization {q}: weight width unknown to autoshard, modelled as bf16; "
        "set the weight dtype of the job if it is smaller"
    )


def kv_cache_dtype_of(value: str) -> tuple[WeightDtype, str | None]:
    v = value.lower()
    if v in KV_BF16:
        return WeightDtype.BF16, None
    if v in KV_FP8:
        return WeightDtype.FP8, None
    return (
        WeightDtype.FP8,
        f"--kv-cache-dtype {value}: modelled as fp8 (autoshard models bf16 and fp8 KV caches)",
    )


@dataclass(frozen=True, slots=True)
class ParsedServe:
    """What a `vllm serve` line says about the plan. None: not given (vLLM derives it)."""

    model: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_local: int | None = None
    enable_expert_parallel: bool = False
    attention_dp: bool = False
    """`dp` counts the attention-DP ranks of one SGLang engine whose experts are TP-sharded over all of
    them (`--attn-dp-size` without expert parallelism: `costmodel.serve.dp_tp_moe`), not replicas."""
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.92
    static_fraction: float | None = None
    """SGLang's --mem-fraction-static as given: weights + KV pool only (the activations and buffers come on
    top; the evaluation adds them back, `api_serve.evaluate_serve_command`). None: not given or vLLM."""
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    nnodes: int = 1
    node_rank: int = 0
    headless: bool = False
    nccl_nvls: bool = True
    """NCCL's NVLink SHARP on (NCCL's default, which vLLM keeps); False: NCCL_NVLS_ENABLE=0 (SGLang
    sets it unless --enable-nccl-nvls or --enable-symm-mem)."""
    all2all_backend: str | None = None
    """vLLM's --all2all-backend (its default when not given); None for SGLang commands."""
    deep_gemm: bool = True
    """Block-scaled FP8 experts of TP-sharded MoE layers may run DeepGEMM (`ServeConfig.deep_gemm`):
    vLLM's fused_moe hands them over where DeepGEMM is installed; SGLang's TP MoE path runs Triton
    unless --moe-runner-backend deep_gemm (or DeepEP/Mooncake all-to-all under auto)."""
    distributed_executor_backend: str | None = None
    """vLLM's --distributed-executor-backend as given (ray places a TP x PP group over nodes without
    --nnodes); None: not given, or SGLang."""
    hf_overrides: str | None = None
    """vLLM's --hf-overrides (SGLang's --json-model-override-args) JSON as given: its max_position_embeddings
    and rope_scaling set the max model length the engine derives (`emit.vllm.context.derived_max_model_len`,
    `sglang_context_len`), and the relaunch lines carry it (`emit.vllm.context.carry_overrides`)."""
    allow_long_context: bool = False
    """The line's environment lets the engine start with a max model length past the model's context:
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vLLM 0.33.0 vllm/envs.py:1115-1118, "1" or "true"; checked in
    config/model.py:2652-2683) or SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (SGLang 0.5.23
    srt/environ.py:320, EnvBool: true/1/yes/y; checked in srt/configs/model_config.py:1291-1316)."""
    warnings: tuple[str, ...] = ()

    @property
    def ep(self) -> int:
        """vLLM's expert-parallel size: TP x DP with --enable-expert-parallel, else 1."""
        return self.tp * self.dp if self.enable_expert_parallel else 1

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def weight_dtype(self) -> WeightDtype:
        return weight_dtype_of(self.quantization)[0]

    @property
    def kv_dtype(self) -> WeightDtype:
        return kv_cache_dtype_of(self.kv_cache_dtype)[0]

    def fit_request_shape(self, job: ServeJob, *, shape_given: bool) -> tuple[ServeJob, str | None]:
        """`job`, its request shape scaled down to the command's max model length when the shape is a
        default (not given by the user) and does not fit; and a note saying so."""
        mml = self.max_model_len
        total = job.input_len + job.output_len
        if shape_given or mml is None or mml >= total:
            return job, None
        inp = max(1, mml * job.input_len // total)
        out = max(1, mml - inp)
        note = (f"the default request shape ({job.input_len} in / {job.output_len} out) does not fit the "
                f"command's max model length {mml}: predicted at {inp} in / {out} out (give --input-len "
                "and --output-len)")
        return ServeJob.model_validate({**job.model_dump(), "input_len": inp, "output_len": out}), note

    def apply_to(self, job: ServeJob) -> ServeJob:
        """`job` with the command's context length, weight and KV-cache dtypes."""
        update: dict[str, object] = {"weight_dtype": self.weight_dtype, "kv_cache_dtype": self.kv_dtype}
        if self.max_model_len is not None:
            if self.max_model_len < job.input_len + job.output_len:
                raise SpecError(
                    f"--max-model-len {self.max_model_len} is shorter than the job's input + output "
                    f"({job.input_len} + {job.output_len}): shorten the requests or raise --max-model-len"
                )
            update["max_model_len"] = self.max_model_len
        return ServeJob.model_validate({**job.model_dump(), **update})


def is_option(tok: str) -> bool:
    return tok.startswith("-") and len(tok) > 1 and not _NUMBER.match(tok)


def to_int(flag: str, value: str, *, human: bool = False, minimum: int = 1) -> int:
    text = value.strip()
    m = _HUMAN.match(text) if human else None
    try:
        if m:
            number, suffix = m.groups()
            scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(suffix) or {
                "K": 2**10,
                "M": 2**20,
                "G": 2**30,
                "T": 2**40,
            }[suffix]
            result = int(float(number) * scale)
        else:
            result = int(text)
    except ValueError:
        raise SpecError(f"{flag} expects an integer, got {value!r}", field=flag) from None
    if result < minimum:
        raise SpecError(f"{flag} must be at least {minimum}, got {result}", field=flag)
    return result


def split_command(command: str) -> list[str]:
    if not command or not command.strip():
        raise SpecError("empty command: pass the whole `vllm serve ...` line", field="--from-vllm")
    text = command.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise SpecError(
            f"cannot split the command line ({exc}): check its quotes", field="--from-vllm"
        ) from None


def _one_edit(a: str, b: str) -> bool:
    """Whether `a` becomes `b` by one letter changed, added or dropped, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k in range(len(short)) if short[k] != long[k]), len(short))
    return short[i:] == long[i + 1:]


def misspelling_of(name: str, known: Iterable[str], cutoff: float) -> str | None:
    """The known flag `name` misspells, if any: one edit away (`--tp-sise`: difflib's ratio is only 0.89 on
    names this short) or at least `cutoff` alike by difflib's ratio (`--tensor-paralel-size`)."""
    names = sorted(known)
    edits = [k for k in names if _one_edit(name, k)]
    if edits:
        return edits[0]
    close = difflib.get_close_matches(name, names, n=1, cutoff=cutoff)
    return close[0] if close else None
