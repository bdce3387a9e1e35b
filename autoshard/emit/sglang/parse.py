"""SGLang launch line (`python -m sglang.launch_server ...` or `sglang serve ...`) -> the serving plan it
describes, in vLLM's terms (`ParsedServe`); see `parse_sglang` for how SGLang's flags map.
"""

from __future__ import annotations


import difflib

from autoshard.emit.serve_args import (
    ENV_WORD,
    ParsedServe,
    json_object_arg,
    is_option,
    kv_cache_dtype_of,
    misspelling_of,
    split_command,
    to_int,
    weight_dtype_of,
)
from autoshard.emit.sglang.command import SGLANG_QUANTIZATION
from autoshard.emit.sglang.flags import ALIASES, KNOWN, MULTI_VALUE, NEGATIONS, NO_VALUE, OPTIONAL_VALUE, \
    SGLANG_FLAGS_VERSION
from autoshard.errors import SpecError
from autoshard.specs.cluster import PoolSpec

__all__ = ["sglang_nodes", "parse_sglang", "SGLANG_VERSION"]

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
    "--moe-runner-backend": "--moe-runner-backend", "--moe-a2a-backend": "--moe-a2a-backend",
    "--deepep-mode": "--deepep-mode", "--cuda-graph-max-bs-decode": "--cuda-graph-max-bs-decode",
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
    "--json-model-override-args": "--json-model-override-args",
}
DEEPEP_ENV = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
DEEPEP_ENV_DEFAULT = 128
"""SGLang's default low-latency buffer: tokens one rank dispatches per call (sglang/srt/environ.py)."""
_SGLANG_SWITCHES = frozenset({"--enable-dp-attention", "--enable-ep-moe", "--trust-remote-code",
                              "--disable-cuda-graph", "--enable-torch-compile", "--disable-radix-cache",
                              "--enable-mixed-chunk", "--enable-metrics", "--skip-server-warmup",
                              "--enable-nccl-nvls", "--enable-symm-mem"})

_SPLIT = f"SGLang {SGLANG_FLAGS_VERSION} split it into -decode and -prefill flags and refuses the old name as ambiguous"
_LEGACY = {
    "--enable-ep-moe": f"removed before SGLang {SGLANG_FLAGS_VERSION} (which refuses it): write --ep-size <TP size>",
    "--cuda-graph-max-bs": f"{_SPLIT}: read as --cuda-graph-max-bs-decode",
    "--cuda-graph-bs": f"{_SPLIT} (--cuda-graph-bs-decode); ignored",
    "--oltp-traces-endpoint": f"the older spelling of --otlp-traces-endpoint, which SGLang {SGLANG_FLAGS_VERSION} "
                              "spells only so; ignored",
    "--max-micro-batch-size": f"renamed --pp-max-micro-batch-size by SGLang {SGLANG_FLAGS_VERSION}; ignored",
}
"""Flags of earlier SGLang 0.5 releases, with what the current one makes of them: read or skipped with a note,
never refused as misspellings."""
_LEGACY_ARITY = {"--cuda-graph-bs": "--cuda-graph-bs-decode", "--oltp-traces-endpoint": "--otlp-traces-endpoint",
                 "--max-micro-batch-size": "--pp-max-micro-batch-size"}
"""The current flag whose values an older one takes (to skip them)."""
TYPO_CUTOFF = 0.9
"""An unknown flag this close (difflib ratio) to a known one is a misspelling of it, refused as SGLang's
parser would refuse it (`--tp-sise 8` was read as TP 1 with a note); farther ones (a newer SGLang's own
flags) are ignored with a warning, as for vLLM."""

# SGLang 0.5.23's choices (srt/arg_groups/choices.py QUANTIZATION_CHOICES, arg_groups/fields/model.py kv_cache_dtype):
# it refuses any other value, and so does the parser. KV dtypes map to the names ParsedServe reads (bf16 was
# read as an FP8 cache); mxfp8 is an FP8 cache with block scales, the FP4 caches are modelled as FP8 (a note)
_QUANTIZATION_CHOICES = frozenset({
    "awq", "fp8", "mxfp8", "gptq", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt", "modelopt_fp8",
    "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "w4afp8",
    "mxfp4", "auto-round", "auto-round-int8", "compressed-tensors", "modelslim", "mxfp_w4a8", "quark",
    "quark_int4fp8_moe", "quark_mxfp4", "mlx_q4", "mlx_q8", "unquant", "humming"})
_KV_CACHE_DTYPES = {"auto": "auto", "bf16": "bfloat16", "bfloat16": "bfloat16", "fp8_e4m3": "fp8_e4m3",
                    "fp8_e5m2": "fp8_e5m2", "mxfp8": "fp8_e4m3", "nvfp4": "nvfp4", "fp4_mx_block16": "nvfp4"}
# all-to-all backends with which SGLang sets ep_size = tp_size (srt/arg_groups/overrides.py _a2a_ep_size)
_A2A_EP_SPANNING = frozenset({"megamoe", "deepep", "deepep_v2", "mooncake", "nixl", "ascend_fuseep", "flashinfer",
                              "flashinfer_megamoe", "mori", "pplx"})


def _resolve(name: str, warnings: list[str]) -> str | None:
    """The flag SGLang's parser takes `name` for: itself when known (or read by autoshard from an earlier
    0.5 release, with a warning), else the one flag it is a prefix of (argparse's allow_abbrev, with a
    warning to spell it out). SpecError for a prefix of several flags or a misspelling, both of which
    SGLang refuses; None, with a warning, for a name far from every flag (a newer SGLang's)."""
    if name in _LEGACY:
        warnings.append(f"{name}: {_LEGACY[name]}")
        return name
    if name in KNOWN or name in _SGLANG_VALUE or name in _SGLANG_SWITCHES:
        return name
    prefixed = sorted(f for f in KNOWN if f.startswith(name)) if name.startswith("--") and len(name) > 3 else []
    if len(prefixed) == 1:
        warnings.append(f"{name}: accepted by SGLang only as an abbreviation of {prefixed[0]}; spell it out")
        return prefixed[0]
    if prefixed:
        raise SpecError(f"{name} is ambiguous to SGLang {SGLANG_FLAGS_VERSION}'s parser, which refuses it: it could "
                        f"be {', '.join(prefixed[:4])}{' ...' if len(prefixed) > 4 else ''}; spell one out", field=name)
    typo = misspelling_of(name, KNOWN, TYPO_CUTOFF)
    if typo:
        raise SpecError(f"{name} is not an SGLang {SGLANG_FLAGS_VERSION} flag: did you mean {typo}? (SGLang "
                        "would refuse the command)", field=name)
    close = difflib.get_close_matches(name, sorted(KNOWN), n=2, cutoff=0.75)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    warnings.append(f"{name}: unknown SGLang {SGLANG_FLAGS_VERSION} flag{hint}; ignored")
    return None


def _values_taken(flag: str | None, args: list[str], i: int) -> int:
    """How many words after an ignored flag (at args[i:]) are its values: none for a switch, all the
    words up to the next flag for a several-value one, one (if there) otherwise; for an unknown flag one
    word that is not a flag, as argparse would take it."""
    flag = _LEGACY_ARITY.get(flag, flag) if flag else flag
    primary = NEGATIONS.get(flag, ALIASES.get(flag, flag)) if flag else None
    if primary in NO_VALUE or flag in NEGATIONS:
        return 0
    if primary in MULTI_VALUE:
        n = 0
        while i + n < len(args) and not is_option(args[i + n]):
            n += 1
        return n
    if primary in OPTIONAL_VALUE or primary is None:
        return 1 if i < len(args) and not is_option(args[i]) else 0
    return 1 if i < len(args) else 0


LONG_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
"""SGLang 0.5.23 starts with --context-length past the model's derived context when this is set (a
warning); without it, it refuses (srt/configs/model_config.py:1291-1316)."""


def parse_sglang(command: str) -> ParsedServe:
    """Read an SGLang launch (`python -m sglang.launch_server ...` or `sglang serve ...`) as the
    vLLM-semantics plan autoshard evaluates. SGLang carves expert and attention data parallelism out of
    its TP group: `--tp-size T --ep-size T [--attn-dp-size D | --enable-dp-attention --dp-size D]` is
    attention TP T/D x DP D with experts over all T GPUs (vLLM: TP T/D, DP D, --enable-expert-parallel);
    without `--ep-size` the same attention DP D runs the experts TP-sharded over all T GPUs, one engine
    (SGLang's default MoE path: `costmodel.serve.dp_tp_moe`); with neither, `--dp-size` counts engine
    replicas. `--context-length` is the max model length,
    `--max-running-requests` the concurrency cap (over all attention-DP ranks), `--chunked-prefill-size`
    the prefill token budget of the engine, which SGLang splits among its attention-DP ranks
    (`chunked_prefill_size // attn_dp_size` each: sglang 0.5.23 srt/arg_groups/parallel_hook.py:324-332). `--mem-fraction-static` (weights + KV pool) is read as the memory budget
    with a warning: SGLang keeps activations outside it, so the predicted KV pool is a little smaller.
    Flags autoshard does not read are listed in one warning."""
    warnings: list[str] = []
    tokens = split_command(command)
    k = 0
    env: dict[str, str] = {}
    while k < len(tokens) and ENV_WORD.match(tokens[k]):
        name, _, value = tokens[k].partition("=")
        env[name] = value
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
        if not is_option(tok):
            if "--model-path" not in values:
                values["--model-path"] = tok  # `sglang serve <model>`
            else:
                warnings.append(f"unexpected positional argument '{tok}' ignored")
            continue
        name, eq, inline = tok.partition("=")
        name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
        flag = _resolve(name, warnings)
        name = flag or name
        if name in _SGLANG_VALUE:
            if not eq:
                if i >= len(args) or is_option(args[i]):
                    raise SpecError(f"{name} expects a value", field=name)
                inline = args[i]
                i += 1
            values[_SGLANG_VALUE[name]] = inline
        elif name in _SGLANG_SWITCHES:
            switches.add(name)
        else:
            if flag is not None:
                ignored.append(name)
            if not eq:
                i += _values_taken(flag, args, i)
    if "--config" in ignored:  # its settings would be priced as SGLang's defaults: TP 1, BF16, ...
        raise SpecError("--config: the flags in a config file are not read; put them on the line (--tp 8 ...) and "
                        "evaluate that", field="--config")
    if ignored:
        warnings.append(f"SGLang flags not read by autoshard (no effect on the prediction): {' '.join(ignored)}")
    model = values.get("--model-path")
    if not model:
        raise SpecError("no model given: add --model-path <model>", field="--from-sglang")

    def integer(flag: str, default: int, **kw: object) -> int:
        v = values.get(flag)
        return default if v is None else to_int(flag, v, **kw)  # type: ignore[arg-type]

    tp_all, pp, dp_size = integer("--tp-size", 1), integer("--pp-size", 1), integer("--dp-size", 1)
    ep = integer("--ep-size", 1)
    if "--enable-ep-moe" in switches and "--ep-size" not in values:
        ep = tp_all  # the old switch: experts over the whole TP group
    if values.get("--moe-a2a-backend", "none") in _A2A_EP_SPANNING:  # SGLang sets ep_size = tp_size for these
        ep = tp_all
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
    nnodes = integer("--nnodes", 1)
    if (tp_all * pp) % nnodes:  # SGLang 0.5.23 check_server_args, srt/arg_groups/validation_hook.py:179-181
        raise SpecError(f"--tp-size {tp_all} x --pp-size {pp} = {tp_all * pp} GPUs do not split evenly over --nnodes "
                        f"{nnodes}: SGLang asserts tp_size x pp_size is a multiple of nnodes", field="--nnodes")
    if dp_size > 1 and nnodes > 1:  # validation_hook.py:199-202
        raise SpecError(f"--dp-size {dp_size} replicas with --nnodes {nnodes}: SGLang refuses multi-node data-parallel "
                        "replicas; use --attn-dp-size across nodes, or one replica line per node", field="--nnodes")
    tp_moe = not expert_parallel and attn_dp > 1  # attention DP, experts TP-sharded over all (serve.dp_tp_moe)
    tp = tp_all // attn_dp
    dp = attn_dp if expert_parallel or tp_moe else dp_size * attn_dp
    if (expert_parallel or tp_moe) and dp_size > 1:
        warnings.append(f"--dp-size {dp_size} replicas of an attention-DP engine: predicted as one engine")
    util = 0.92
    if "--mem-fraction-static" in values:
        try:
            util = float(values["--mem-fraction-static"])
        except ValueError:
            raise SpecError(f"--mem-fraction-static expects a number, got {values['--mem-fraction-static']!r}",
                            field="--mem-fraction-static") from None
        if not 0 < util < 1:
            raise SpecError(f"--mem-fraction-static must be in (0, 1), got {util}", field="--mem-fraction-static")
        warnings.append(f"--mem-fraction-static {util} is weights + KV pool: the activations and buffers SGLang "
                        "keeps outside it are added on top (as autoshard writes the flag)")
    running = values.get("--max-running-requests")
    seqs = None if running is None else max(1, to_int("--max-running-requests", running) // (attn_dp if expert_parallel or tp_moe else 1))
    context = values.get("--context-length")
    quant = values.get("--quantization")
    if quant is not None and quant not in _QUANTIZATION_CHOICES:
        raise SpecError(f"SGLang has no --quantization {quant}: use one of fp8, modelopt_fp8, modelopt_fp4, awq_marlin, "
                        "gptq_marlin, w8a8_int8, mxfp4, ... (or leave it out for the checkpoint's own)", field="--quantization")
    # SGLang's own names for the methods autoshard writes (modelopt_fp8 is vLLM's modelopt: FP8 weights)
    quant = {v: k for k, v in SGLANG_QUANTIZATION.items()}.get(quant, quant) if quant else quant
    kv = values.get("--kv-cache-dtype") or "auto"
    if kv not in _KV_CACHE_DTYPES:
        raise SpecError(f"SGLang has no --kv-cache-dtype {kv}: use auto, bf16, fp8_e4m3 or fp8_e5m2 (or mxfp8, nvfp4, "
                        "fp4_mx_block16)", field="--kv-cache-dtype")
    kv = _KV_CACHE_DTYPES[kv]  # in vLLM's names, which ParsedServe reads
    for note in (weight_dtype_of(quant)[1], kv_cache_dtype_of(kv)[1]):
        if note:
            warnings.append(note)
    chunk = values.get("--chunked-prefill-size")
    # SGLang's Fp8MoEMethod.create_moe_runner: "auto" takes DeepGEMM only behind DeepEP / Mooncake
    # all-to-all (is_deepgemm_moe_runner_backend_enabled), Triton's fused_moe for TP-sharded experts
    runner, a2a = values.get("--moe-runner-backend", "auto"), values.get("--moe-a2a-backend", "none")
    deep_gemm = runner == "deep_gemm" or (runner == "auto" and a2a in ("deepep", "mooncake"))
    if runner not in ("auto", "triton", "deep_gemm"):
        warnings.append(f"--moe-runner-backend {runner} is not modelled: its experts are priced as Triton's fused_moe")
    if expert_parallel and attn_dp > 1 and a2a not in ("deepep", "mooncake"):
        # costmodel.serve.engines.sglang_priced: the attention-DP + EP path is priced with DeepEP's all-to-all
        warnings.append(f"--moe-a2a-backend {a2a}: attention DP with expert parallelism is priced with DeepEP's "
                        "all-to-all (as --moe-a2a-backend deepep runs it); without it SGLang gathers every DP rank's "
                        "tokens onto each GPU, which is not modelled")
    if a2a == "deepep" and expert_parallel and attn_dp > 1:
        warnings += _deepep_notes(values, env, seqs)
    return ParsedServe(
        model=model, tp=tp, pp=pp, dp=dp, enable_expert_parallel=expert_parallel, attention_dp=tp_moe,
        max_model_len=None if context is None else to_int("--context-length", context, human=True),
        gpu_memory_utilization=util, max_num_seqs=seqs,
        static_fraction=util if "--mem-fraction-static" in values else None,
        max_num_batched_tokens=None if chunk is None or chunk.strip() == "-1" else max(
            1, to_int("--chunked-prefill-size", chunk) // attn_dp),
        quantization=quant, kv_cache_dtype=kv, nnodes=nnodes,
        node_rank=integer("--node-rank", 0, minimum=0), warnings=tuple(warnings),
        # SGLang 0.5.23 EnvBool (srt/environ.py:143-150): "true", "1", "yes", "y"
        allow_long_context=env.get(LONG_ENV, "").strip().lower() in ("true", "1", "yes", "y"),
        # SGLang overrides NCCL_NVLS_ENABLE with --enable-nccl-nvls (default off) unless symmetric memory
        # is on (`_set_envs_and_config`, sglang/srt/entrypoints/engine.py)
        nccl_nvls=bool(switches & {"--enable-nccl-nvls", "--enable-symm-mem"}),
        deep_gemm=deep_gemm,
        hf_overrides=json_object_arg(values.get("--json-model-override-args"), "--json-model-override-args"),
    )



def _deepep_notes(values: dict[str, str], env: dict[str, str], seqs: int | None) -> list[str]:
    """What a DeepEP line runs that autoshard's pricing does not: a mode other than auto (normal kernels
    for steps with prefill, low-latency ones for decode-only steps), or more requests per rank than the
    low-latency buffer (SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK) or the captured CUDA graphs take."""
    out = []
    mode = values.get("--deepep-mode", "auto")
    if mode != "auto":
        out.append(f"--deepep-mode {mode}: priced as auto (DeepEP's normal kernels for steps with prefill, its "
                   "low-latency kernels for decode-only steps)")
    raw = env.get(DEEPEP_ENV)
    cap = DEEPEP_ENV_DEFAULT if raw is None else to_int(DEEPEP_ENV, raw)
    if not 1 <= cap <= 1024:
        raise SpecError(f"{DEEPEP_ENV}={raw} must be in 1..1024 (SGLang asserts <= 1024)", field=DEEPEP_ENV)
    graphs = values.get("--cuda-graph-max-bs-decode")
    if seqs is not None and seqs > cap:
        out.append(f"{seqs} running requests per attention-DP rank exceed the {cap} tokens per rank DeepEP's "
                   f"low-latency buffer holds ({DEEPEP_ENV}): SGLang fails DeepEP's assert on such a decode batch; "
                   f"set {DEEPEP_ENV} to at least {seqs} (autoshard prices the buffer at the running requests)")
    elif graphs is not None and to_int("--cuda-graph-max-bs-decode", graphs) > cap:
        out.append(f"--cuda-graph-max-bs-decode {graphs} exceeds the {cap} tokens per rank of DeepEP's low-latency "
                   f"buffer ({DEEPEP_ENV}): capturing those graphs fails DeepEP's assert")
    return out


def sglang_nodes(parsed: ParsedServe, pool: PoolSpec) -> tuple[str, str | None]:
    """(the `ServeConfig.role` an SGLang line is priced as, "aggregated"; a note or None), after checking
    its --nnodes against the pool's nodes: SGLang runs tp_size x pp_size / nnodes GPUs of the engine on
    each node (with --nnodes 1 its --dp-size replicas too), so a line whose --nnodes asks more of a node
    than it has would not start (SpecError naming the --nnodes that fits); without --nnodes that is a
    note (the line describes a deployment it would not start as written); fewer is priced packed into
    whole nodes, with a note."""
    total, per_node = parsed.tp * parsed.pp * parsed.dp, pool.node.gpus_per_node
    on_node = total // parsed.nnodes
    if on_node > per_node:
        need = -(-total // per_node)
        problem = (f"the line runs {total} GPUs (TP x PP x DP) over --nnodes {parsed.nnodes}: {on_node} a node, and "
                   f"{pool.name}'s nodes have {per_node}: pass --nnodes {need} (one line per node, --node-rank "
                   f"0..{need - 1})")
        if parsed.nnodes > 1:
            raise SpecError(problem, field="--nnodes")
        return "aggregated", f"{problem}; priced as the {total}-GPU deployment the line describes"
    if parsed.nnodes > 1 and on_node < per_node:
        return "aggregated", (f"--nnodes {parsed.nnodes} runs {on_node} of each node's {per_node} GPUs: priced packed "
                              f"into {-(-total // per_node)} whole node(s) of {pool.name}")
    return "aggregated", None
