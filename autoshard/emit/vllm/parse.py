"""`vllm serve` command line -> the serving plan it describes.

Reads vLLM 0.33's command line the way its parser does (FlexibleArgumentParser): `--flag value` and
`--flag=value`, underscores in names as dashes, short aliases (`-tp`, `-pp`, `-dp`, `-ep`, `-q`, ...),
`--no-X` / `--disable-X` negations of switches, `--cfg.key value` for JSON configs, `-O3`, human-readable
integers (`32k` = 32000, `32K` = 32768) and unique prefixes of flag names. Both entry points are read:
`vllm serve <model> ...` and `python -m vllm.entrypoints.openai.api_server --model <model> ...`, after
environment assignments such as `CUDA_VISIBLE_DEVICES=0,1`.

Unknown, removed and abbreviated flags become warnings (removed ones name their replacement); input
that is not a readable vLLM command raises SpecError. The flag vocabulary (`autoshard.emit.vllm.flags`)
is vLLM 0.33.0's (`EngineArgs.add_cli_args` and the OpenAI frontend arguments).
"""

from __future__ import annotations

import dataclasses
import difflib

from autoshard.emit.serve_args import (
    ENV_WORD,
    FP8,
    INT4,
    INT8,
    KV_BF16,
    KV_FP8,
    MXFP4,
    NVFP4,
    OTHER_QUANT,
    ParsedServe,
    json_object_arg,
    is_option,
    kv_cache_dtype_of,
    misspelling_of,
    split_command,
    to_int,
    weight_dtype_of,
)
from autoshard.emit.vllm.flags import (
    ALIASES,
    KNOWN,
    MULTI_VALUE,
    NO_VALUE,
    REMOVED,
    REMOVED_SWITCHES,
    STORE_TRUE,
    VLLM_VERSION,
)
from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.serve.ep_buffers import DEEPEP_LL_GENERATIONS
from autoshard.costmodel.serve.kv_window import without_windows
from autoshard.errors import SpecError
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.model import ModelSpec

__all__ = ["parse_vllm", "backend_role", "ParsedVllm", "window_switches"]


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


LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
"""vLLM 0.33.0 starts with --max-model-len past the model's derived length when this is "1" or "true"
(vllm/envs.py:1115-1118), with a warning; without it, it refuses (config/model.py:2652-2683)."""

TYPO_CUTOFF = 0.9
"""An unknown flag this close (difflib ratio) to a known one is a misspelling of it: refused, not ignored
(`--tensor-paralel-size 4` was priced as TP 1); farther ones (a newer vLLM's) are ignored with a warning."""


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
            if target in NO_VALUE and target not in STORE_TRUE:
                return target, False
    if name in REMOVED:
        warnings.append(f"{name}: not a vLLM {VLLM_VERSION} flag any more ({REMOVED[name]}); ignored")
        return None, True
    prefixed = [f for f in KNOWN if f.startswith(name)] if name.startswith("--") and len(name) > 3 else []
    if len(prefixed) == 1:
        warnings.append(f"{name}: accepted by vLLM only as an abbreviation of {prefixed[0]}; spell it out")
        return prefixed[0], True
    typo = misspelling_of(name, KNOWN, TYPO_CUTOFF)
    if typo:  # vLLM's argparse refuses it ("unrecognized arguments"); pricing without it prices another plan
        raise SpecError(f"{name} is not a vLLM {VLLM_VERSION} flag: did you mean {typo}? (vLLM would refuse the "
                        f"command)", field=name)
    close = difflib.get_close_matches(name, sorted(KNOWN), n=2, cutoff=0.75)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    warnings.append(f"{name}: unknown vLLM {VLLM_VERSION} flag{hint}; ignored")
    return None, True


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
        if not is_option(tok):
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
            if name in REMOVED and name in REMOVED_SWITCHES:
                continue
            if inline is None and i < len(args) and not is_option(args[i]):
                i += 1  # the word after an unknown flag is taken as its value, as argparse would
            continue
        if flag in NO_VALUE:
            if inline is not None:
                raise SpecError(f"{name} is a switch and takes no value (got '={inline}')", field=name)
            values[flag] = state
            continue
        if inline is None:
            if i >= len(args) or (
                is_option(args[i]) and flag not in ("--compilation-config", "--speculative-config")
            ):
                raise SpecError(f"{name} expects a value", field=name)
            if flag in MULTI_VALUE:
                parts = []
                while i < len(args) and not is_option(args[i]):
                    parts.append(args[i])
                    i += 1
                inline = " ".join(parts)
            else:
                inline = args[i]
                i += 1
        values[flag] = inline
    return values, positionals


_WINDOW_FLAGS = (
    ("--disable-sliding-window", "a model's sliding-window layers then attend in full and vLLM caps "
                                 "max_model_len at the window (ModelConfig.disable_sliding_window)"),
    ("--disable-hybrid-kv-cache-manager", "a model's sliding-window layers then keep every token in the KV cache "
                                          "(vLLM promotes them to full attention, unify_hybrid_kv_cache_specs)"),
)
"""Switches changing how a model with sliding-window layers runs: `ParsedVllm` reads, `window_switches` prices."""


@dataclasses.dataclass(frozen=True, slots=True)
class ParsedVllm(ParsedServe):
    """A `vllm serve` line's plan with its sliding-window switches (False: --disable-sliding-window,
    --disable-hybrid-kv-cache-manager)."""

    sliding_window: bool = True
    hybrid_kv_cache: bool = True


def window_switches(parsed: ParsedServe, model: ModelSpec) -> tuple[ModelSpec, ParsedServe]:
    """(the model as the line runs it, `parsed` with the length it starts with and notes on how its window switches
    are priced): --disable-sliding-window by `kv_window.without_windows` (SpecError past the window); without the
    hybrid manager a hybrid model's layers all cache every token (`kv_window.engine_stage_layouts`)."""
    if not isinstance(parsed, ParsedVllm) or not model.has_attention_window:
        return model, parsed
    notes = [w for w in parsed.warnings if not w.startswith(tuple(f"{f}:" for f, _ in _WINDOW_FLAGS))]
    if not parsed.sliding_window:
        model, mml = without_windows(model, parsed.max_model_len, allow_long=parsed.allow_long_context)
        notes.append(f"--disable-sliding-window: vLLM {VLLM_VERSION} runs every layer as full attention and caps "
                     f"max_model_len at the window: priced so, at {mml:,} tokens")
        return model, dataclasses.replace(parsed, max_model_len=mml, warnings=tuple(notes))
    if not parsed.hybrid_kv_cache:
        notes.append("--disable-hybrid-kv-cache-manager: " + (
            f"vLLM {VLLM_VERSION} caches every sliding-window layer as full attention (unify_hybrid_kv_cache_specs; "
            "its attention still reads the window): priced so" if len(set(model.decoder_windows)) > 1 else
            f"every layer slides, one KV-cache group, which vLLM {VLLM_VERSION} leaves as it is: priced as without it"))
    return model, dataclasses.replace(parsed, warnings=tuple(notes))


def parse_vllm(command: str) -> ParsedServe:
    """Read a `vllm serve` command line. Raises SpecError on input that is not a usable vLLM command."""
    warnings: list[str] = []
    tokens = split_command(command)
    k = 0
    while k < len(tokens) and ENV_WORD.match(tokens[k]):
        k += 1
    args, via_serve = _entry(tokens[k:])
    values, positionals = _collect(args, warnings)
    if "--config" in values:  # its settings would be priced as vLLM's defaults: TP 1, BF16, ...
        raise SpecError(f"--config {values['--config']}: the flags in a config file are not read; put them on the "
                        "line (--tensor-parallel-size 8 ...) and evaluate that", field="--config")
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
        return default if v is None else to_int(flag, v, **kw)  # type: ignore[arg-type]

    mml: int | None = None
    raw = get("--max-model-len")
    if raw is not None and raw.strip().lower() not in ("auto", "-1"):
        mml = to_int("--max-model-len", raw, human=True)
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
    if quant is not None and quant.lower() not in FP8 | INT8 | INT4 | NVFP4 | MXFP4 | OTHER_QUANT:
        raise SpecError(f"vLLM {VLLM_VERSION} has no --quantization {quant}: use one of fp8, awq_marlin, "
                        "gptq_marlin, compressed-tensors, ... (or leave it out for BF16 weights)", field="--quantization")
    if kv.lower() not in KV_BF16 | KV_FP8 | {"nvfp4"}:  # nvfp4: modelled as fp8, with a warning
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
    if get("--speculative-config") is not None:
        warnings.append("--speculative-config: speculative decoding is priced only in the decode instances "
                        "`solve --mode serve --disaggregate` plans (DeepSeek MTP); this engine is predicted "
                        "without it")
    for flag, what in _WINDOW_FLAGS:
        if values.get(flag):
            warnings.append(f"{flag}: {what}; autoshard prices the line without it (vLLM's default)")
    parsed = ParsedVllm(
        sliding_window=not values.get("--disable-sliding-window"),
        hybrid_kv_cache=not values.get("--disable-hybrid-kv-cache-manager"),
        model=model,
        tp=integer("--tensor-parallel-size", 1),
        pp=integer("--pipeline-parallel-size", 1),
        dp=integer("--data-parallel-size", 1),
        dp_local=None if dpl is None else to_int("--data-parallel-size-local", dpl),
        enable_expert_parallel=bool(values.get("--enable-expert-parallel", False)),
        max_model_len=mml,
        gpu_memory_utilization=util,
        max_num_seqs=None if seqs is None else to_int("--max-num-seqs", seqs),
        max_num_batched_tokens=None
        if batched is None
        else to_int("--max-num-batched-tokens", batched, human=True),
        quantization=quant,
        kv_cache_dtype=kv,
        nnodes=integer("--nnodes", 1),
        node_rank=integer("--node-rank", 0, minimum=0),
        headless=bool(values.get("--headless", False)),
        nccl_nvls="NCCL_NVLS_ENABLE=0" not in tokens[:k],
        all2all_backend=get("--all2all-backend") or "allgather_reducescatter",  # an environment word before the command
        hf_overrides=json_object_arg(get("--hf-overrides"), "--hf-overrides"),
        distributed_executor_backend=get("--distributed-executor-backend"),
        allow_long_context=any(t.partition("=")[0] == LONG_ENV and t.partition("=")[2].strip().lower() in ("1", "true")
                               for t in tokens[:k]),
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


def backend_role(parsed: ParsedServe, model: ModelSpec, pool: PoolSpec) -> tuple[str, str | None]:
    """How `evaluate --from-vllm` prices a line's `--all2all-backend` for an MoE engine with expert
    parallelism over DP ranks on a GPU DeepEP runs on: (the `ServeConfig.role` whose kernels and buffers
    it runs, a note or None). vLLM 0.33.0 runs one backend per engine, every step on it
    (`ParallelConfig.all2all_backend`; fused_moe/config.py `use_deepep_ht_kernels`/`use_deepep_ll_kernels`):
    `deepep_low_latency` is the aggregated engine autoshard prices; `deepep_high_throughput` runs every
    step, decode included, on DeepEP's normal kernels with their fixed buffers and no CUDA graphs, as the
    "prefill" role prices it; any other backend runs vLLM's usual step budget, not the batched-DP 256
    (`search.serve.evaluate.batched_dp_backend`): the default allgather_reducescatter (vLLM 0.33.0's
    `ParallelConfig.all2all_backend`, config/parallel.py:220; pplx and naive fall back to it) priced as it
    runs (`ServeConfig.all2all_backend`), the others on DeepEP's kernels in 256-token passes with a note
    that they are not modelled. First the line's --nnodes against the pool's
    nodes (`_nodes_problem`): refused when given and wrong, a note when absent (the line, as written,
    would not start on one node; priced as the engine it describes)."""
    window_switches(parsed, model)  # SpecError: --disable-sliding-window past the window, as vLLM refuses it
    if (problem := _nodes_problem(parsed, pool)) is not None and parsed.nnodes > 1:
        raise SpecError(problem, field="--nnodes")
    if problem is not None:  # no --nnodes: the line describes the deployment; as written vLLM would refuse it
        return "aggregated", f"{problem} (priced as the {parsed.tp * parsed.pp}-GPU engine the line describes)"
    gpu, backend = pool.gpu, parsed.all2all_backend
    if (model.moe is not None and not parsed.enable_expert_parallel and parsed.dp > 1
            and backend not in (None, "naive", "allgather_reducescatter")):
        return "aggregated", (f"--all2all-backend {backend} without --enable-expert-parallel: vLLM {VLLM_VERSION} "
                              "gathers the DP ranks' tokens through the naive prepare/finalize, which calls this "
                              "backend's dispatch, not implemented for it (device_communicators/all2all.py): the "
                              "line may fail at its first forward; priced as allgather_reducescatter "
                              "(`costmodel.serve.vllm_dp_moe`)")
    if (backend is None or model.moe is None or not parsed.enable_expert_parallel or parsed.dp < 2
            or gpu_generation(gpu.name) not in DEEPEP_LL_GENERATIONS or backend == "deepep_low_latency"):
        return "aggregated", None
    if backend == "deepep_high_throughput":
        return "prefill", ("--all2all-backend deepep_high_throughput: priced as vLLM runs it, every step (decode "
                           "included) on DeepEP's high-throughput kernels, their 1-2 GiB buffers and no CUDA graphs "
                           "(vLLM turns them off on this backend); autoshard's own lines use it for prefill "
                           "instances only")
    if backend in ("nixl_ep",):
        return "aggregated", (f"--all2all-backend {backend}: priced as deepep_low_latency (vLLM gives both its "
                              "batched-DP budget of 256 and a buffer sized at the budget); its own speed and buffers "
                              "are not modelled")
    budget = ("vLLM's batched-DP budget of 256 applies only to deepep_low_latency and nixl_ep "
              "(config/parallel.py:795-805), so the line runs vLLM's own --max-num-batched-tokens and --max-num-seqs "
              "defaults")
    if backend in ("allgather_reducescatter", "pplx", "naive"):
        default = (" (vLLM's default: the line names none)" if backend == "allgather_reducescatter" else
                   f" (removed: vLLM {VLLM_VERSION} runs allgather_reducescatter, config/parallel.py:537-543)")
        return "aggregated", (f"--all2all-backend {backend}{default}: {budget}; priced as it runs: each MoE layer "
                              "all-gathers the DP ranks' tokens and reduce-scatters the experts' outputs, one pass a "
                              "step, no DeepEP buffer, the experts' workspace on the gathered rows "
                              "(`costmodel.serve.vllm_dp_moe`)")
    return "aggregated", (f"--all2all-backend {backend}: {budget} and no DeepEP buffer grows with the budget; its "
                          "all-to-all is not modelled: priced as DeepEP's low-latency kernels in 256-token passes, "
                          "their buffer at 256 tokens charged")


def _nodes_problem(parsed: ParsedServe, pool: PoolSpec) -> str | None:
    """Why vLLM 0.33.0 would not start a line's TP x PP group (no data parallelism) on the pool's nodes:
    with --nnodes 1 and its default executor it refuses a world size past the node's GPUs
    (config/parallel.py:1055-1078, "set '--nnodes' appropriately"); with --nnodes N each node runs
    world_size / N ranks (`local_world_size`, :838-840), which must be whole and fit the node. Ray
    (--distributed-executor-backend ray) places the group itself. None when it starts."""
    per_node, ranks, nodes = pool.node.gpus_per_node, parsed.tp * parsed.pp, parsed.nnodes
    if parsed.dp > 1 or parsed.distributed_executor_backend == "ray" or (ranks % nodes == 0 and ranks // nodes <= per_node):
        return None
    need = -(-ranks // per_node)
    what = ("do not split evenly over them" if ranks % nodes else
            f"{ranks // nodes} a node, and {pool.name}'s nodes have {per_node}")
    return (f"TP {parsed.tp} x PP {parsed.pp} = {ranks} GPUs over --nnodes {nodes}: vLLM {VLLM_VERSION} runs "
            f"world_size / nnodes ranks on each node, {what}: pass --nnodes {need} (one line per node, "
            f"--node-rank 0..{need - 1}) or --distributed-executor-backend ray")
