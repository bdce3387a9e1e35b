"""`vllm serve` command line -> the serving plan it describes.

Reads vLLM 0.33's command line the way its parser does (FlexibleArgumentParser): `--flag value` and
`--flag=value`, underscores in names as dashes, short aliases (`-tp`, `-pp`, `-dp`, `-ep`, `-q`, ...),
`--no-X` / `--disable-X` negations of switches, `--cfg.key value` for JSON configs, `-O3`, human-readable
integers (`32k` = 32000, `32K` = 32768) and unique prefixes of flag names. Both entry points are read:
`vllm serve <model> ...` and `python -m vllm.entrypoints.openai.api_server --model <model> ...`, after
environment assignments such as `CUDA_VISIBLE_DEVICES=0,1`.

Unknown, removed and abbreviated flags become warnings (removed ones name their replacement); input
that is not a readable vLLM command raises SpecError. The flag vocabulary below is vLLM 0.33.0's
(`EngineArgs.add_cli_args` and the OpenAI frontend arguments).
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass

from autoshard.errors import SpecError
from autoshard.specs.job import ServeJob, WeightDtype

__all__ = ["ParsedServe", "parse_vllm", "parse_sglang", "VLLM_VERSION", "REMOVED", "weight_dtype_of", "kv_cache_dtype_of"]

VLLM_VERSION = "0.33.0"

# Switches (take no value).
NO_VALUE: frozenset[str] = frozenset(
    """
    --aggregate-engine-logging --allow-credentials --allow-deprecated-quantization
    --async-scheduling --cohere-is-reasoning-model --cudagraph-metrics --data-parallel-external-lb
    --data-parallel-hybrid-lb --data-parallel-multi-port-external-lb --dcp-q-replicate
    --disable-cascade-attn --disable-chunked-mm-input --disable-custom-all-reduce
    --disable-fastapi-docs --disable-hybrid-kv-cache-manager --disable-log-stats
    --disable-nccl-for-dp-synchronization --disable-sliding-window --disable-uvicorn-access-log
    --enable-auto-tool-choice --enable-batch-sharded-sampling --enable-chunked-prefill
    --enable-cumem-allocator --enable-dbo --enable-elastic-ep --enable-ep-weight-filter
    --enable-eplb --enable-expert-parallel --enable-fault-tolerance --enable-flash-late-interaction
    --enable-flashinfer-autotune --enable-force-include-usage --enable-hc-sp
    --enable-layerwise-nvtx-tracing --enable-log-deltas --enable-log-outputs --enable-log-requests
    --enable-logging-iteration-details --enable-lora --enable-mamba-cache-stochastic-rounding
    --enable-mamba-shared-prefix-checkpoint --enable-mfu-metrics --enable-mixed-moe-lora-format
    --enable-mm-embeds --enable-moe-shared-loras --enable-nccl-comm-suspend --enable-offline-docs
    --enable-per-request-metrics --enable-prefix-caching --enable-prompt-embeds
    --enable-prompt-tokens-details --enable-request-id-headers --enable-return-routed-experts
    --enable-scale-out --enable-server-load-tracking --enable-shm-tensor-arena --enable-sleep-mode
    --enable-ssl-refresh --enable-tokenizer-info-endpoint --enable-tower-connector-lora
    --enable-trace-replay --enforce-eager --exclude-tools-when-tool-choice-none
    --fail-on-environ-validation --fully-sharded-loras --grpc --headless --interleave-mm-strings
    --jit-monitor-verbose --kv-cache-metrics --kv-sharing-fast-prefill --language-model-only
    --log-error-stack --long-prefill-token-threshold-adaptive --mm-device-do-normalize
    --mm-encoder-only --monokernel --numa-bind --ray-workers-use-nsight --return-sampling-mask
    --return-tokens-as-token-ids --scheduler-reserve-full-isl --skip-mm-profiling
    --skip-tokenizer-init --sleep-mode-offload-cudagraph --specialize-active-lora
    --swa-bounded-replay --tokens-only --trust-remote-code --trust-request-chat-template
    --trust-request-mm-kwargs --use-fp64-gumbel --use-replayssm --use-tqdm-on-load
""".split()
)

# Flags that take a value.
ONE_VALUE: frozenset[str] = frozenset(
    """
    --additional-config --all2all-backend --allowed-headers --allowed-local-media-path
    --allowed-media-domains --allowed-methods --allowed-origins --anthropic-disabled-thinking-effort
    --api-key --api-server-count --attention-backend --attention-config --aux-output-config
    --block-size --chat-template --chat-template-content-format --code-revision --cohere-format
    --collect-detailed-traces --compilation-config --config --config-format --convert
    --cp-kv-cache-interleave-size --cpu-distributed-timeout-seconds --cpu-offload-gb
    --cpu-offload-params --cudagraph-capture-sizes --custom-histogram-buckets
    --data-parallel-address --data-parallel-backend --data-parallel-rank --data-parallel-rpc-port
    --data-parallel-size --data-parallel-size-local --data-parallel-start-rank
    --data-parallel-supervisor-port --dbo-decode-token-threshold --dbo-prefill-token-threshold
    --dcp-comm-backend --dcp-kv-cache-interleave-size --decode-context-parallel-size
    --default-chat-template-kwargs --default-mm-loras --device-ids --diffusion-config
    --disable-access-log-for-endpoints --distributed-executor-backend --distributed-timeout-seconds
    --download-dir --dp-supervisor-probe-failure-threshold --dp-supervisor-probe-interval-s
    --dp-supervisor-probe-timeout-s --dp-sync-interval --dtype --ec-manager-config
    --ec-transfer-config --elastic-ep-max-dp-size --engram-config --eplb-config
    --expert-placement-strategy --fault-tolerance-config --fingerprint-mode --fingerprint-value
    --gdn-prefill-backend --generation-config --gpu-memory-utilization --grpc-port
    --h11-max-header-count --h11-max-incomplete-event-size --hf-config-path --hf-overrides
    --hf-token --host --ignore-patterns --io-processor-plugin --ir-op-priority --jit-monitor-mode
    --kda-decode-backend --kda-prefill-backend --kernel-config --kv-cache-dtype
    --kv-cache-dtype-skip-layers --kv-cache-memory-bytes --kv-cache-metrics-sample
    --kv-events-config --kv-offloading-backend --kv-offloading-size --kv-transfer-config
    --limit-mm-per-prompt --linear-backend --load-format --log-config-file --log-level
    --logging-config --logits-processors --logprobs-mode --long-prefill-token-threshold --lora-dtype
    --lora-modules --lora-target-modules --mamba-backend --mamba-block-size --mamba-cache-dtype
    --mamba-cache-mode --mamba-cache-philox-rounds --mamba-ssm-cache-dtype --mamba-ssu-algorithm
    --master-addr --master-port --max-cpu-loras --max-cudagraph-capture-size --max-log-len
    --max-logprobs --max-lora-cls-labels --max-lora-rank --max-loras --max-model-len
    --max-num-active-seqs --max-num-batched-tokens --max-num-queued-reqs --max-num-queued-tokens
    --max-num-scheduled-tokens --max-num-seqs --max-parallel-loading-workers --media-io-kwargs
    --middleware --mm-encoder-attn-backend --mm-encoder-attn-dtype --mm-encoder-fp8-scale-path
    --mm-encoder-fp8-scale-save-margin --mm-encoder-fp8-scale-save-path --mm-encoder-tp-mode
    --mm-hasher-algorithm --mm-ipc-gpu-memory-gb --mm-processor-cache-gb --mm-processor-cache-type
    --mm-processor-device --mm-processor-kwargs --mm-shm-cache-max-object-size-mb --mm-tensor-ipc
    --model --model-class-overrides --model-impl --model-loader-extra-config --moe-backend --nnodes
    --node-rank --num-gpu-blocks-override --numa-bind-cpus --numa-bind-nodes --offload-backend
    --offload-group-size --offload-num-in-group --offload-params --offload-prefetch-step
    --optimization-level --otlp-traces-endpoint --override-generation-config
    --per-request-spec-decode-metrics --performance-mode --pipeline-parallel-size --pooler-config
    --port --prefill-context-parallel-size --prefill-schedule-interval
    --prefix-cache-retention-interval --prefix-caching-hash-algo --prefix-match-unit
    --profiler-config --pt-load-map-location --quantization --quantization-config --reasoning-config
    --reasoning-effort-map --reasoning-parser --reasoning-parser-plugin --renderer-num-workers
    --replayssm-buffer-len --response-role --revision --root-path --runner
    --safetensors-load-strategy --safetensors-prefetch-block-size --safetensors-prefetch-num-threads
    --scheduler-cls --scheduling-policy --seed --served-model-name --show-hidden-metrics-for-version
    --shutdown-timeout --sleep-mode-backend --sleep-preserve-parameter-names
    --sparse-indexer-topk-backend --spec-method --spec-model --spec-tokens --speculative-config
    --sse-keep-alive-interval --ssl-ca-certs --ssl-cert-reqs --ssl-certfile --ssl-ciphers
    --ssl-keyfile --stream-interval --structured-outputs-config --tensor-parallel-size --tokenizer
    --tokenizer-mode --tokenizer-revision --tool-call-parser --tool-parser-plugin --tool-server
    --tool-strict-level --ubatch-size --uds --uvicorn-log-level --video-pruning-method
    --video-pruning-rate --watchdog-config --watermark --watermark-config --weight-transfer-config
    --worker-cls --worker-extension-cls model_tag
""".split()
)

MULTI_VALUE: frozenset[str] = frozenset(
    """
    --allowed-headers --allowed-media-domains --allowed-methods --allowed-origins --api-key
    --collect-detailed-traces --cpu-offload-params --cudagraph-capture-sizes --ignore-patterns
    --kv-cache-dtype-skip-layers --logits-processors --lora-modules --lora-target-modules --middleware
    --numa-bind-cpus --numa-bind-nodes --offload-params --served-model-name --sleep-preserve-parameter-names
""".split()
)

# Switches without a --no-X form (plain store_true).
_STORE_TRUE = frozenset(
    "--aggregate-engine-logging --data-parallel-multi-port-external-lb --disable-log-stats "
    "--grpc --headless".split()
)

ALIASES: dict[str, str] = {
    "-q": "--quantization",
    "-pp": "--pipeline-parallel-size",
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-tp": "--tensor-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpn": "--data-parallel-rank",
    "-dpr": "--data-parallel-start-rank",
    "-dpl": "--data-parallel-size-local",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-dpb": "--data-parallel-backend",
    "-dph": "--data-parallel-hybrid-lb",
    "-dpe": "--data-parallel-external-lb",
    "-dpm": "--data-parallel-multi-port-external-lb",
    "-ep": "--enable-expert-parallel",
    "-sc": "--speculative-config",
    "-dc": "--diffusion-config",
    "-cc": "--compilation-config",
    "-ac": "--attention-config",
    "-asc": "--api-server-count",
    "--device-memory-utilization": "--gpu-memory-utilization",
}

REMOVED: dict[str, str] = {
    "--swap-space": "removed after v0.11; vLLM V1 does not swap the KV cache to CPU",
    "--task": "removed; use --runner {auto,generate,pooling,draft} and --convert {auto,none,embed,classify}",
    "--use-v2-block-manager": "removed (the V0 engine is gone)",
    "--num-scheduler-steps": "removed (multi-step scheduling is gone)",
    "--speculative-model": "removed; use --speculative-config JSON",
    "--num-speculative-tokens": 'removed; use --speculative-config {"num_speculative_tokens": N}',
    "--max-seq-len-to-capture": "removed; use --max-cudagraph-capture-size / --cudagraph-capture-sizes",
    "--guided-decoding-backend": "removed; use --structured-outputs-config",
    "--tokenizer-pool-size": "removed",
    "--preemption-mode": "removed",
    "--num-redundant-experts": 'removed; use --eplb-config {"num_redundant_experts": N}',
    "--eplb-window-size": "removed; use --eplb-config",
    "--eplb-step-interval": "removed; use --eplb-config",
    "--eplb-log-balancedness": "removed; use --eplb-config",
    "--cuda-graph-sizes": "removed; use --cudagraph-capture-sizes",
    "--enable-multimodal-encoder-data-parallel": "removed; use --mm-encoder-tp-mode data",
    "--disable-mm-preprocessor-cache": "removed; use --mm-processor-cache-gb 0",
    "--override-pooler-config": "removed; use --pooler-config",
    "--rope-scaling": "removed; use --hf-overrides",
    "--rope-theta": "removed; use --hf-overrides",
    "--worker-use-ray": "removed; use --distributed-executor-backend ray",
    "--engine-use-ray": "removed",
    "--disable-frontend-multiprocessing": "removed",
}
_REMOVED_SWITCHES = frozenset(
    "--use-v2-block-manager --eplb-log-balancedness --enable-multimodal-encoder-data-parallel "
    "--disable-mm-preprocessor-cache --worker-use-ray --engine-use-ray "
    "--disable-frontend-multiprocessing".split()
)

KNOWN: frozenset[str] = NO_VALUE | ONE_VALUE | MULTI_VALUE

_ENV_WORD = re.compile(r"^[A-Za-z_]\w*=")
_HUMAN = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])$")
_NUMBER = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")

_FP8 = {
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
_INT8 = {"int8_per_channel_weight_only", "experts_int8", "w8a8_int8"}
_INT4 = {"awq", "auto_awq", "awq_marlin", "gptq", "auto_gptq", "gptq_marlin", "moe_wna16"}
_NVFP4 = {"modelopt_fp4", "nvfp4_per_token", "modelopt_nvfp4"}
_MXFP4 = {"mxfp4", "gpt_oss_mxfp4", "quark_mxfp4"}
_KV_BF16 = {"auto", "bfloat16", "float16", "half"}
# the rest of vLLM's QuantizationMethods (vllm/model_executor/layers/quantization/__init__.py): vLLM
# refuses any other --quantization, and so does the parser
_OTHER_QUANT = {"fp_quant", "modelopt_mixed", "gguf", "humming", "compressed-tensors", "bitsandbytes", "quark",
                "torchao", "inc", "cpu_awq", "online"}
_KV_FP8 = {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "fp8_per_token_head"}


def weight_dtype_of(quantization: str | None) -> tuple[WeightDtype, str | None]:
    """Weight storage a --quantization method implies, and a warning when it is an approximation."""
    if quantization is None:
        return WeightDtype.BF16, None
    q = quantization.lower()
    if q in _FP8:
        return WeightDtype.FP8, None
    if q in _INT8:
        note = " (only the experts are int8; modelled as int8 everywhere)" if q == "experts_int8" else ""
        return WeightDtype.INT8, (f"--quantization {q}{note}" if note else None)
    if q in _INT4:
        return WeightDtype.INT4, None
    if q in _NVFP4:
        return WeightDtype.NVFP4, None
    if q in _MXFP4:
        return WeightDtype.MXFP4, None
    return WeightDtype.BF16, (
        f"--quantization {q}: weight width unknown to autoshard, modelled as bf16; "
        "set the weight dtype of the job if it is smaller"
    )


def kv_cache_dtype_of(value: str) -> tuple[WeightDtype, str | None]:
    v = value.lower()
    if v in _KV_BF16:
        return WeightDtype.BF16, None
    if v in _KV_FP8:
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
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.92
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    nnodes: int = 1
    node_rank: int = 0
    headless: bool = False
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


def _is_option(tok: str) -> bool:
    return tok.startswith("-") and len(tok) > 1 and not _NUMBER.match(tok)


def _entry(tokens: list[str]) -> tuple[list[str], bool]:
    """Arguments after the entry point, and whether it is `vllm serve` (positional model)."""
    for i, tok in enumerate(tokens):
        if tok == "serve" and i > 0 and tokens[i - 1].rsplit("/", 1)[-1] == "vllm":
            return tokens[i + 1 :], True
        if tok.startswith("vllm.entrypoints"):
            return tokens[i + 1 :], False
    raise SpecError(
        "not a vLLM launch line: expected `vllm serve <model> ...` or "
        "`python -m vllm.entrypoints.openai.api_server --model <model> ...`",
        field="--from-vllm",
    )


def _canonical(name: str, warnings: list[str]) -> tuple[str | None, bool]:
    """(primary flag, switch value) for an option name; None when unknown or removed."""
    if name in ALIASES:
        name = ALIASES[name]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    if name in KNOWN:
        return name, True
    for neg, pos in (("--no-", "--"), ("--disable-", "--enable-"), ("--enable-", "--disable-")):
        if name.startswith(neg):
            target = pos + name[len(neg) :]
            if target in NO_VALUE and target not in _STORE_TRUE:
                return target, False
    if name in REMOVED:
        warnings.append(f"{name}: not a vLLM {VLLM_VERSION} flag any more ({REMOVED[name]}); ignored")
        return None, True
    prefixed = [f for f in KNOWN if f.startswith(name)] if name.startswith("--") and len(name) > 3 else []
    if len(prefixed) == 1:
        warnings.append(f"{name}: accepted by vLLM only as an abbreviation of {prefixed[0]}; spell it out")
        return prefixed[0], True
    close = difflib.get_close_matches(name, sorted(KNOWN), n=2, cutoff=0.75)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    warnings.append(f"{name}: unknown vLLM {VLLM_VERSION} flag{hint}; ignored")
    return None, True


def _int(flag: str, value: str, *, human: bool = False, minimum: int = 1) -> int:
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


def _tokens(command: str) -> list[str]:
    if not command or not command.strip():
        raise SpecError("empty command: pass the whole `vllm serve ...` line", field="--from-vllm")
    text = command.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise SpecError(
            f"cannot split the command line ({exc}): check its quotes", field="--from-vllm"
        ) from None


def _collect(args: list[str], warnings: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    """Primary flag -> last value (str) or switch state (bool); and the positional words."""
    values: dict[str, str | bool] = {}
    positionals: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if tok == "--":
            positionals += args[i:]
            break
        if not _is_option(tok):
            positionals.append(tok)
            continue
        inline: str | None = None
        if tok.startswith("-O") and not tok.startswith("--"):
            name, inline = "--optimization-level", tok[2:].lstrip("=") or None
        elif "=" in tok:
            name, inline = tok.split("=", 1)
        else:
            name = tok
        name = (
            name.split(".", 1)[0] if name.startswith("--") or name in ("-cc", "-sc", "-ac", "-dc") else name
        )
        flag, state = _canonical(name, warnings)
        if flag is None:
            if name in REMOVED and name in _REMOVED_SWITCHES:
                continue
            if inline is None and i < len(args) and not _is_option(args[i]):
                i += 1  # the word after an unknown flag is taken as its value, as argparse would
            continue
        if flag in NO_VALUE:
            if inline is not None:
                raise SpecError(f"{name} is a switch and takes no value (got '={inline}')", field=name)
            values[flag] = state
            continue
        if inline is None:
            if i >= len(args) or (
                _is_option(args[i]) and flag not in ("--compilation-config", "--speculative-config")
            ):
                raise SpecError(f"{name} expects a value", field=name)
            if flag in MULTI_VALUE:
                parts = []
                while i < len(args) and not _is_option(args[i]):
                    parts.append(args[i])
                    i += 1
                inline = " ".join(parts)
            else:
                inline = args[i]
                i += 1
        values[flag] = inline
    return values, positionals


def parse_vllm(command: str) -> ParsedServe:
    """Read a `vllm serve` command line. Raises SpecError on input that is not a usable vLLM command."""
    warnings: list[str] = []
    tokens = _tokens(command)
    k = 0
    while k < len(tokens) and _ENV_WORD.match(tokens[k]):
        k += 1
    args, via_serve = _entry(tokens[k:])
    values, positionals = _collect(args, warnings)
    model = values.get("--model")
    if via_serve and positionals:
        model = positionals[0]
        if "--model" in values:
            warnings.append("both a positional model and --model given; vLLM uses the positional one")
        extra = positionals[1:]
    else:
        extra = positionals
        if via_serve and model is not None:
            warnings.append(
                "--model with `vllm serve` is deprecated: pass the model as the positional argument"
            )
    if extra:
        warnings.append(f"unexpected positional arguments ignored: {' '.join(extra)}")
    if not isinstance(model, str) or not model:
        raise SpecError("no model given: `vllm serve <model> ...` (or --model)", field="--from-vllm")

    def get(flag: str) -> str | None:
        v = values.get(flag)
        return v if isinstance(v, str) else None

    def integer(flag: str, default: int, **kw: object) -> int:
        v = get(flag)
        return default if v is None else _int(flag, v, **kw)  # type: ignore[arg-type]

    mml: int | None = None
    raw = get("--max-model-len")
    if raw is not None and raw.strip().lower() not in ("auto", "-1"):
        mml = _int("--max-model-len", raw, human=True)
    util = 0.92
    if get("--gpu-memory-utilization") is not None:
        try:
            util = float(get("--gpu-memory-utilization") or "")
        except ValueError:
            raise SpecError(
                f"--gpu-memory-utilization expects a number, got {get('--gpu-memory-utilization')!r}",
                field="--gpu-memory-utilization",
            ) from None
        if not 0 < util <= 1:
            raise SpecError(
                f"--gpu-memory-utilization must be in (0, 1], got {util}", field="--gpu-memory-utilization"
            )
    seqs = get("--max-num-seqs")
    batched = get("--max-num-batched-tokens")
    dpl = get("--data-parallel-size-local")
    quant = get("--quantization")
    kv = get("--kv-cache-dtype") or "auto"
    if quant is not None and quant.lower() not in _FP8 | _INT8 | _INT4 | _NVFP4 | _MXFP4 | _OTHER_QUANT:
        raise SpecError(f"vLLM {VLLM_VERSION} has no --quantization {quant}: use one of fp8, awq_marlin, "
                        "gptq_marlin, compressed-tensors, ... (or leave it out for BF16 weights)", field="--quantization")
    if kv.lower() not in _KV_BF16 | _KV_FP8 | {"nvfp4"}:  # nvfp4: modelled as fp8, with a warning
        raise SpecError(f"vLLM {VLLM_VERSION} has no --kv-cache-dtype {kv}: use auto, bfloat16 or fp8 "
                        "(fp8_e4m3, fp8_e5m2)", field="--kv-cache-dtype")
    for note in (weight_dtype_of(quant)[1], kv_cache_dtype_of(kv)[1]):
        if note:
            warnings.append(note)
    for flag, what in (
        ("--prefill-context-parallel-size", "prefill context parallelism"),
        ("--decode-context-parallel-size", "decode context parallelism"),
    ):
        if get(flag) not in (None, "1"):
            warnings.append(f"{flag}: {what} is not modelled; predicted as if it were 1")
    parsed = ParsedServe(
        model=model,
        tp=integer("--tensor-parallel-size", 1),
        pp=integer("--pipeline-parallel-size", 1),
        dp=integer("--data-parallel-size", 1),
        dp_local=None if dpl is None else _int("--data-parallel-size-local", dpl),
        enable_expert_parallel=bool(values.get("--enable-expert-parallel", False)),
        max_model_len=mml,
        gpu_memory_utilization=util,
        max_num_seqs=None if seqs is None else _int("--max-num-seqs", seqs),
        max_num_batched_tokens=None
        if batched is None
        else _int("--max-num-batched-tokens", batched, human=True),
        quantization=quant,
        kv_cache_dtype=kv,
        nnodes=integer("--nnodes", 1),
        node_rank=integer("--node-rank", 0, minimum=0),
        headless=bool(values.get("--headless", False)),
        warnings=tuple(warnings),
    )
    if parsed.dp_local is not None and parsed.dp_local > parsed.dp:
        raise SpecError(
            f"--data-parallel-size-local {parsed.dp_local} exceeds --data-parallel-size {parsed.dp}",
            field="--data-parallel-size-local",
        )
    if (
        parsed.max_num_seqs
        and parsed.max_num_batched_tokens
        and parsed.max_num_batched_tokens < parsed.max_num_seqs
    ):
        raise SpecError(
            f"--max-num-batched-tokens {parsed.max_num_batched_tokens} must be >= --max-num-seqs "
            f"{parsed.max_num_seqs}",
            field="--max-num-batched-tokens",
        )
    return parsed


# ----------------------------------------------------------------------------- SGLang

SGLANG_VERSION = "0.5"

# The SGLang server arguments autoshard reads (sglang/srt/server_args.py, 0.5.x), with their aliases.
_SGLANG_VALUE: dict[str, str] = {
    "--model-path": "--model-path", "--model": "--model-path",
    "--tp-size": "--tp-size", "--tp": "--tp-size", "--tensor-parallel-size": "--tp-size",
    "--pp-size": "--pp-size", "--pipeline-parallel-size": "--pp-size",
    "--dp-size": "--dp-size", "--dp": "--dp-size", "--data-parallel-size": "--dp-size",
    "--ep-size": "--ep-size", "--ep": "--ep-size", "--expert-parallel-size": "--ep-size",
    "--attn-dp-size": "--attn-dp-size",
    "--context-length": "--context-length",
    "--max-running-requests": "--max-running-requests",
    "--chunked-prefill-size": "--chunked-prefill-size",
    "--mem-fraction-static": "--mem-fraction-static",
    "--quantization": "--quantization",
    "--kv-cache-dtype": "--kv-cache-dtype",
    "--nnodes": "--nnodes", "--node-rank": "--node-rank",
}
_SGLANG_SWITCHES = frozenset({"--enable-dp-attention", "--enable-ep-moe", "--trust-remote-code",
                              "--disable-cuda-graph", "--enable-torch-compile", "--disable-radix-cache",
                              "--enable-mixed-chunk", "--enable-metrics", "--skip-server-warmup"})


def parse_sglang(command: str) -> ParsedServe:
    """Read an SGLang launch (`python -m sglang.launch_server ...` or `sglang serve ...`) as the
    vLLM-semantics plan autoshard evaluates. SGLang carves expert and attention data parallelism out of
    its TP group: `--tp-size T --ep-size T [--attn-dp-size D | --enable-dp-attention --dp-size D]` is
    attention TP T/D x DP D with experts over all T GPUs (vLLM: TP T/D, DP D, --enable-expert-parallel);
    without them `--dp-size` counts engine replicas. `--context-length` is the max model length,
    `--max-running-requests` the concurrency cap (over all attention-DP ranks), `--chunked-prefill-size`
    the prefill token budget. `--mem-fraction-static` (weights + KV pool) is read as the memory budget
    with a warning: SGLang keeps activations outside it, so the predicted KV pool is a little smaller.
    Flags autoshard does not read are listed in one warning."""
    warnings: list[str] = []
    tokens = _tokens(command)
    k = 0
    while k < len(tokens) and _ENV_WORD.match(tokens[k]):
        k += 1
    rest = tokens[k:]
    args = None
    for i, tok in enumerate(rest):
        if tok.startswith("sglang.launch_server") or (tok == "serve" and i > 0 and rest[i - 1].endswith("sglang")):
            args = rest[i + 1:]
            break
    if args is None:
        raise SpecError("not an SGLang launch line: expected `python -m sglang.launch_server --model-path <model> ...`",
                        field="--from-sglang")
    values: dict[str, str] = {}
    switches: set[str] = set()
    ignored: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not _is_option(tok):
            if "--model-path" not in values:
                values["--model-path"] = tok  # `sglang serve <model>`
            else:
                warnings.append(f"unexpected positional argument '{tok}' ignored")
            continue
        name, eq, inline = tok.partition("=")
        name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
        if name in _SGLANG_VALUE:
            if not eq:
                if i >= len(args) or _is_option(args[i]):
                    raise SpecError(f"{name} expects a value", field=name)
                inline = args[i]
                i += 1
            values[_SGLANG_VALUE[name]] = inline
        elif name in _SGLANG_SWITCHES:
            switches.add(name)
        else:
            ignored.append(name)
            if not eq and i < len(args) and not _is_option(args[i]):
                i += 1  # its value
    if ignored:
        warnings.append(f"SGLang flags not read by autoshard (no effect on the prediction): {' '.join(ignored)}")
    model = values.get("--model-path")
    if not model:
        raise SpecError("no model given: add --model-path <model>", field="--from-sglang")

    def integer(flag: str, default: int, **kw: object) -> int:
        v = values.get(flag)
        return default if v is None else _int(flag, v, **kw)  # type: ignore[arg-type]

    tp_all, pp, dp_size = integer("--tp-size", 1), integer("--pp-size", 1), integer("--dp-size", 1)
    ep = integer("--ep-size", 1)
    if "--enable-ep-moe" in switches and "--ep-size" not in values:
        ep = tp_all  # the old switch: experts over the whole TP group
    attn_dp = integer("--attn-dp-size", 1)
    if "--enable-dp-attention" in switches and "--attn-dp-size" not in values:
        attn_dp = dp_size
        dp_size = 1
    if tp_all % attn_dp:
        raise SpecError(f"--tp-size {tp_all} is not a multiple of the attention DP size {attn_dp}", field="--tp-size")
    expert_parallel = ep > 1
    if expert_parallel and ep != tp_all:
        warnings.append(f"--ep-size {ep} differs from --tp-size {tp_all}: predicted with experts over all "
                        f"{tp_all} GPUs of the TP group (vLLM's expert parallelism)")
    if not expert_parallel and attn_dp > 1:
        warnings.append("attention data parallelism without expert parallelism: predicted as replicas")
    tp = tp_all // attn_dp
    dp = attn_dp if expert_parallel else dp_size * attn_dp
    if expert_parallel and dp_size > 1:
        warnings.append(f"--dp-size {dp_size} replicas of an expert-parallel engine: predicted as one engine")
    util = 0.92
    if "--mem-fraction-static" in values:
        try:
            util = float(values["--mem-fraction-static"])
        except ValueError:
            raise SpecError(f"--mem-fraction-static expects a number, got {values['--mem-fraction-static']!r}",
                            field="--mem-fraction-static") from None
        if not 0 < util < 1:
            raise SpecError(f"--mem-fraction-static must be in (0, 1), got {util}", field="--mem-fraction-static")
        warnings.append(f"--mem-fraction-static {util} (weights + KV pool) read as the whole memory budget: "
                        "SGLang keeps activations outside it, so the predicted KV cache is a little smaller")
    running = values.get("--max-running-requests")
    seqs = None if running is None else max(1, _int("--max-running-requests", running) // (attn_dp if expert_parallel else 1))
    context = values.get("--context-length")
    quant = values.get("--quantization")
    kv = values.get("--kv-cache-dtype") or "auto"
    for note in (weight_dtype_of(quant)[1], kv_cache_dtype_of(kv)[1]):
        if note:
            warnings.append(note)
    chunk = values.get("--chunked-prefill-size")
    return ParsedServe(
        model=model, tp=tp, pp=pp, dp=dp, enable_expert_parallel=expert_parallel,
        max_model_len=None if context is None else _int("--context-length", context, human=True),
        gpu_memory_utilization=util, max_num_seqs=seqs,
        max_num_batched_tokens=None if chunk is None or chunk.strip() == "-1" else _int("--chunked-prefill-size", chunk),
        quantization=quant, kv_cache_dtype=kv, nnodes=integer("--nnodes", 1),
        node_rank=integer("--node-rank", 0, minimum=0), warnings=tuple(warnings),
    )
