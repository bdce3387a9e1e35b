"""The `autoshard` command line. Parses, calls the API, renders, sets exit codes; computes nothing.

Exit codes: 0 success, 1 no feasible plan (or the solver gave none), 2 bad input.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from functools import wraps
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from autoshard.errors import AutoshardError, SpecError
from autoshard.parallel import Fp8Recipe, MoeDispatcher
from autoshard.specs.base import MAX_CONTEXT, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, MAX_TOKENS

app = typer.Typer(
    name="autoshard",
    help="Plan how to split LLM training and serving across GPUs: the best parallel layout, its "
    "predicted speed and memory, and the command that launches it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)


class Mode(StrEnum):
    TRAIN = "train"
    SERVE = "serve"


class Target(StrEnum):
    MEGATRON = "megatron"
    VLLM = "vllm"
    SGLANG = "sglang"
    K8S = "k8s"


class Disaggregate(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class RecomputeOpt(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


def _fail(exc: AutoshardError) -> None:
    kind = "bad input" if isinstance(exc, SpecError) else "no plan"
    err.print(f"[bold red]error ({kind}):[/bold red] {escape(str(exc))}", markup=True, highlight=False)
    raise typer.Exit(exc.exit_code)


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every AutoshardError into its message and exit code, never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _finite_options(kwargs)
            return fn(*args, **kwargs)
        except AutoshardError as exc:
            _fail(exc)

    return wrapper


def _finite_options(kwargs: dict[str, Any]) -> None:
    """NaN and infinities pass click's range checks (every comparison with NaN is false): refuse them."""
    for name, value in kwargs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"{value} is not a finite number: give a number", source="--" + name.replace("_", "-"))


def _version(value: bool) -> None:
    if value:
        from autoshard import __version__

        print(f"autoshard {__version__}")
        raise typer.Exit(0)


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """autoshard: parallelism planner for LLM training and serving."""


# ----------------------------------------------------------------------------- shared option types

GpusOpt = Annotated[int | None, typer.Option("--gpus", min=1, max=MAX_GPUS, help="Use this many GPUs (resizes a homogeneous cluster).")]
SeqOpt = Annotated[int | None, typer.Option("--seq-len", min=1, max=MAX_SEQ_LEN, help="Training sequence length (default: the model's training: section, else 4096).")]
GbsOpt = Annotated[int | None, typer.Option("--global-batch-size", min=1, max=MAX_GLOBAL_BATCH, help="Sequences per optimizer step.")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="bf16 or fp8.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (schema autoshard.plans.train/v1) on stdout.")]
TpOpt = Annotated[int | None, typer.Option("--tp", min=1, max=MAX_GPUS, help="Tensor parallel size.")]
PpOpt = Annotated[int | None, typer.Option("--pp", min=1, max=MAX_GPUS, help="Pipeline parallel size.")]
DpOpt = Annotated[int | None, typer.Option("--dp", min=1, max=MAX_GPUS, help="Data parallel size.")]
CpOpt = Annotated[int | None, typer.Option("--cp", min=1, max=MAX_GPUS, help="Context parallel size.")]
EpOpt = Annotated[int | None, typer.Option("--ep", min=1, max=MAX_GPUS, help="Expert parallel size.")]
EtpOpt = Annotated[int | None, typer.Option("--etp", min=1, max=MAX_GPUS, help="Expert tensor parallel size (default: TP).")]
VppOpt = Annotated[int | None, typer.Option("--vpp", min=1, max=MAX_LAYERS, help="Virtual pipeline stages per rank (interleaving).")]
MbsOpt = Annotated[int | None, typer.Option("--mbs", min=1, max=MAX_GLOBAL_BATCH, help="Micro-batch size.")]
RecomputeOptT = Annotated[RecomputeOpt | None, typer.Option("--recompute", help="Activation recomputation.")]
RecomputeLayersOpt = Annotated[int | None, typer.Option("--recompute-num-layers", min=0, max=MAX_LAYERS, help="Decoder layers per stage fully recomputed on top of --recompute.")]
SpOpt = Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Sequence parallelism (with TP > 1).")]
ZeroOpt = Annotated[int | None, typer.Option("--zero-stage", min=0, max=3, help="0: none, 1: distributed optimizer, 2/3: Megatron FSDP.")]
RecomputeModulesOpt = Annotated[str | None, typer.Option("--recompute-modules", help="Selective recompute of these Megatron modules (comma-separated): core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts. Implies --recompute selective.")]
LayoutOpt = Annotated[str | None, typer.Option("--layout", help="Megatron's --pipeline-model-parallel-layout string, e.g. 'Et*10|t*10|t*10|t*10L' (sets VPP).")]
FirstLayersOpt = Annotated[int | None, typer.Option("--decoder-first-pipeline-num-layers", min=1, help="Decoder layers on the first pipeline rank (Megatron's flag).")]
LastLayersOpt = Annotated[int | None, typer.Option("--decoder-last-pipeline-num-layers", min=1, help="Decoder layers on the last pipeline rank (Megatron's flag).")]
AcctEmbOpt = Annotated[bool, typer.Option("--account-for-embedding-in-pipeline-split", help="Count the embedding as a layer when splitting (Megatron's flag).")]
AcctLossOpt = Annotated[bool, typer.Option("--account-for-loss-in-pipeline-split", help="Count the loss as a layer when splitting (Megatron's flag).")]
TpOverlapOpt = Annotated[bool | None, typer.Option("--tp-comm-overlap/--no-tp-comm-overlap", help="Evaluate: TP communication overlap (default: on with sequence parallelism).")]
DpOverlapOpt = Annotated[bool | None, typer.Option("--overlap-grad-reduce/--no-overlap-grad-reduce", help="Evaluate: overlap DP gradient reduce / param gather with compute (default: on).")]
DistOptOpt = Annotated[bool | None, typer.Option("--distributed-optimizer/--no-distributed-optimizer", help="Evaluate: Megatron's distributed optimizer (= --zero-stage 1 / 0).")]
DispatcherOpt = Annotated[MoeDispatcher | None, typer.Option("--moe-dispatcher", help="MoE token dispatcher (default: the cheapest for the plan's expert grid; flex = DeepEP/HybridEP).")]
Fp8RecipeOpt = Annotated[Fp8Recipe | None, typer.Option("--fp8-recipe", help="FP8 scaling recipe with --precision fp8 (default: mxfp8 on Blackwell, delayed elsewhere).")]


def _load(model_ref: str, cluster_ref: str, gpus: int | None):
    from autoshard.api import resize
    from autoshard.specs import load_cluster, load_model

    return load_model(model_ref), resize(load_cluster(cluster_ref), gpus)


def _print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _plans_json(plans: list) -> dict:
    """The best plan's JSON object, with the runner-ups (--top) under "alternatives"."""
    obj = plans[0].to_json()
    if len(plans) > 1:
        obj["alternatives"] = [p.to_json() for p in plans[1:]]
    return obj


def _headroom(plan, fraction: float) -> dict:
    """How much of HBM the plan was allowed to fill, and what is left for the memory model's error."""
    from autoshard.units import GIB

    pred = plan.prediction
    hbm, peak = pred.capacity_bytes / GIB, pred.peak_memory_bytes / GIB
    note = (f"planned to {fraction:.0%} of HBM: predicted peak {peak:.1f} of {hbm:.1f} GiB, {hbm - peak:.1f} GiB "
            f"headroom for the memory model's error (--memory-fraction changes it)")
    return {"memory_fraction": fraction, "peak_gib": round(peak, 2), "hbm_gib": round(hbm, 2),
            "headroom_gib": round(hbm - peak, 2), "note": note}


_TRAIN_ONLY = ("seq_len", "global_batch_size", "precision", "from_megatron", "verbose", "memory_fraction", "cp",
               "etp", "vpp", "mbs", "recompute", "recompute_num_layers", "sequence_parallel", "zero_stage",
               "show_schedule", "layout", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
               "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "recompute_modules",
               "moe_dispatcher", "fp8_recipe")
_SERVE_ONLY = ("input_len", "output_len", "max_model_len", "tpot_ms", "ttft_s", "request_rate", "weight_dtype",
               "kv_cache_dtype")


_PLAN_KNOBS = ("seq_len", "global_batch_size", "precision", "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs",
               "recompute", "recompute_num_layers", "sequence_parallel", "zero_stage", "layout",
               "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "recompute_modules",
               "moe_dispatcher", "fp8_recipe", "tp_comm_overlap", "overlap_grad_reduce", "distributed_optimizer")


def _check_mode_flags(mode: Mode, given: dict[str, Any]) -> None:
    """A flag the other mode owns would be silently ignored: refuse it, naming the flag."""
    wrong = _TRAIN_ONLY if mode is Mode.SERVE else _SERVE_ONLY
    for name in wrong:
        if name in given:
            flag = "--" + name.replace("_", "-")
            other = "train" if mode is Mode.SERVE else "serve"
            hint = " (serving weights: --weight-dtype)" if name == "precision" else ""
            raise SpecError(f"{flag} applies to --mode {other} only; with --mode {mode.value} it would be ignored: "
                            f"drop it{hint}", source=flag)


def _train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute, recompute_num_layers, sp, zero_stage, modules=(),
                moe_dispatcher=None, fp8_recipe=None):
    from autoshard.parallel import Recompute
    from autoshard.search.train.space import Pins

    return Pins(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs,
                recompute=Recompute(recompute.value) if recompute else None, zero_stage=zero_stage,
                sequence_parallel=sp, recompute_num_layers=recompute_num_layers, recompute_modules=modules or None,
                moe_dispatcher=moe_dispatcher, fp8_recipe=fp8_recipe)


def _recompute_modules(text: str | None, recompute):
    """(modules, recompute mode) from --recompute-modules: selective recompute of those modules."""
    if text is None:
        return (), recompute
    from autoshard.costmodel.train.recompute import RECOMPUTE_MODULES

    modules = tuple(dict.fromkeys(m for m in text.replace(",", " ").split()))
    bad = [m for m in modules if m not in RECOMPUTE_MODULES]
    if bad or not modules:
        raise SpecError(f"--recompute-modules '{text}': unknown module(s) {', '.join(bad) or '(none given)'}; use "
                        f"a comma-separated list of {', '.join(RECOMPUTE_MODULES)}", source="--recompute-modules")
    if recompute is not None and recompute.value != "selective":
        raise SpecError(f"--recompute-modules is selective recompute; it contradicts --recompute {recompute.value}",
                        source="--recompute-modules")
    return (() if modules == ("core_attn",) else modules), RecomputeOpt("selective")


def _layout_flags(layout, first, last, acct_emb, acct_loss):
    from autoshard.emit.megatron.parse import LayoutFlags

    return LayoutFlags(layout=layout, first=first, last=last, account_embedding=acct_emb, account_loss=acct_loss)


def _solver_options(top: int, time_limit: float, workers: int, seed: int, verbose: bool, zero_stage: int | None,
                    started_at: float | None = None):
    from autoshard.search.train.solve import SolverOptions
    from autoshard.search.train.space import SpaceOptions

    zeros = (0, 1, 2, 3) if zero_stage is not None else (0, 1)
    return SolverOptions(top_k=top, time_limit_s=time_limit, num_workers=workers, seed=seed, log=verbose,
                         space=SpaceOptions(zero_stages=zeros), started_at=started_at)


def _check_output(output: Path | None, emit: Target | None) -> None:
    """Refuse an -o that cannot be written before any solving starts."""
    if output is None:
        return
    if emit is None:
        raise SpecError("-o/--output is the file for the launch script: add --emit megatron, vllm or sglang", source="-o")
    where = str(output)
    try:
        if output.is_dir():
            raise SpecError(f"{where} is a directory: give a file name, e.g. {output / 'launch.sh'}", source="-o")
        parent = output.parent
        if not parent.is_dir():
            raise SpecError(f"the directory {parent} does not exist: create it or write elsewhere", source="-o")
        if not os.access(parent, os.W_OK) or (output.exists() and not os.access(output, os.W_OK)):
            raise SpecError(f"{where} is not writable: choose a path you can write to", source="-o")
    except OSError as exc:
        raise SpecError(f"cannot write {where[:120]}: {exc.strerror}: choose another path", source="-o") from None


def _write_script(text: str, output: Path | None, json_out: bool) -> None:
    """The launch script to -o, else to stdout (to stderr under --json: stdout holds the JSON object only)."""
    if output is None:
        (sys.stderr if json_out else sys.stdout).write(text)
        return
    try:
        output.write_text(text)
        output.chmod(0o755)
    except OSError as exc:
        raise SpecError(f"cannot write {str(output)[:120]}: {exc.strerror}: choose another path", source="-o") from None
    err.print(f"wrote {escape(str(output))}", highlight=False)


def _write_emit(plan, emit: Target | None, output: Path | None, json_out: bool = False) -> None:
    if emit is None:
        return
    if emit is not Target.MEGATRON:
        raise SpecError(f"--emit {emit.value} is for serving plans: use --mode serve", source="--emit")
    from autoshard.emit.megatron.script import megatron_script

    _write_script(megatron_script(plan), output, json_out)


# ----------------------------------------------------------------------------- solve


@app.command()
@_guard
def solve(
    model: Annotated[str, typer.Argument(help="Model: bundled name, YAML path, or Hugging Face config.json.")],
    cluster: Annotated[str, typer.Argument(help="Cluster: bundled name or YAML path.")],
    gpus: GpusOpt = None,
    mode: Annotated[Mode, typer.Option("--mode", help="train or serve.")] = Mode.TRAIN,
    seq_len: SeqOpt = None,
    global_batch_size: GbsOpt = None,
    precision: PrecisionOpt = None,
    target: Annotated[Target | None, typer.Option("--target", help="Launcher to emit for (train: megatron; serve: vllm or sglang).")] = None,
    top: Annotated[int, typer.Option("--top", min=1, max=20, help="Return the K best distinct plans.")] = 1,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.5, max=86400, help="Solver time limit in seconds.")] = 30.0,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256, help="CP-SAT worker threads.")] = 8,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**31 - 1, help="CP-SAT random seed.")] = 0,
    json_out: JsonOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show how many candidates each rule discarded.")] = False,
    show_schedule: Annotated[bool, typer.Option("--show-schedule", help="Draw the pipeline schedule of the plan.")] = False,
    emit: Annotated[Target | None, typer.Option("--emit", help="Write the launch script for this launcher.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="File for --emit (default: stdout).")] = None,
    from_megatron: Annotated[str | None, typer.Option("--from-megatron", help="Start from an existing Megatron-LM command or script: compare it with the best plan.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Log CP-SAT search progress to stderr.")] = False,
    memory_fraction: Annotated[float | None, typer.Option("--memory-fraction", min=0.3, max=1.0, help="Train: keep each GPU's predicted peak under this fraction of HBM (default 0.87: headroom for the memory model's measured error).")] = None,
    tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None, etp: EtpOpt = None,
    vpp: VppOpt = None, mbs: MbsOpt = None, recompute: RecomputeOptT = None,
    recompute_num_layers: RecomputeLayersOpt = None, sequence_parallel: SpOpt = None, zero_stage: ZeroOpt = None,
    layout: LayoutOpt = None, decoder_first_pipeline_num_layers: FirstLayersOpt = None,
    decoder_last_pipeline_num_layers: LastLayersOpt = None, account_for_embedding_in_pipeline_split: AcctEmbOpt = False,
    account_for_loss_in_pipeline_split: AcctLossOpt = False, recompute_modules: RecomputeModulesOpt = None,
    moe_dispatcher: DispatcherOpt = None, fp8_recipe: Fp8RecipeOpt = None,
    input_len: Annotated[int | None, typer.Option("--input-len", min=1, max=MAX_CONTEXT, help="Serve: prompt tokens per request.")] = None,
    output_len: Annotated[int | None, typer.Option("--output-len", min=1, max=MAX_CONTEXT, help="Serve: generated tokens per request.")] = None,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", min=1, max=MAX_CONTEXT, help="Serve: longest context.")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", min=0.001, max=3.6e6, help="Serve: time per output token target (ms).")] = None,
    ttft_s: Annotated[float | None, typer.Option("--ttft-s", min=0.001, max=86400, help="Serve: time to first token target (s).")] = None,
    request_rate: Annotated[float | None, typer.Option("--request-rate", min=0.0001, max=1e6, help="Serve: requests/s to sustain (minimizes GPUs).")] = None,
    weight_dtype: Annotated[str | None, typer.Option("--weight-dtype", help="Serve: bf16, fp8, int8, int4, nvfp4 or mxfp4 weights (FP4 runs on FP4 tensor cores on Blackwell).")] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option("--kv-cache-dtype", help="Serve: bf16 or fp8 KV cache.")] = None,
    pareto: Annotated[bool, typer.Option("--pareto", help="Serve: print the Pareto front of output tokens/s per GPU against tokens/s per user over every deployment, and where each TPOT SLA cuts it.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Serve --pareto: write pareto.png here.")] = None,
    disaggregate: Annotated[Disaggregate, typer.Option("--disaggregate", help="Serve: prefill/decode disaggregation: auto (the solver chooses), on (xPyD only) or off (aggregated replicas only).")] = Disaggregate.AUTO,
) -> None:
    """Find the best plan for MODEL on CLUSTER, with its predictions and launch command."""
    started = time.monotonic()  # --time-limit covers the whole command, loading and checks included
    _check_output(output, emit)
    given = {k: v for k, v in locals().items() if v is not None and v is not False}
    _check_mode_flags(mode, given)
    if mode is Mode.SERVE:
        _solve_serve(model, cluster, gpus, target, top, time_limit, workers, seed, json_out, explain,
                     dict(tp=tp, pp=pp, dp=dp, ep=ep), input_len, output_len, max_model_len, tpot_ms, ttft_s,
                     request_rate, weight_dtype, kv_cache_dtype, emit, output, disaggregate.value, pareto, out_dir,
                     started_at=started)
        return
    if disaggregate is not Disaggregate.AUTO:
        raise SpecError("--disaggregate is for serving plans: add --mode serve", source="--disaggregate")
    if pareto or out_dir is not None:
        raise SpecError("--pareto and --out are for serving plans: add --mode serve", source="--pareto")
    if target not in (None, Target.MEGATRON):
        raise SpecError(f"--target {target.value} is a serving launcher: add --mode serve", source="--target")
    if emit not in (None, Target.MEGATRON):
        raise SpecError(f"--emit {emit.value} is for serving plans: add --mode serve", source="--emit")
    from autoshard.api import solve as api_solve
    from autoshard.api import train_job
    from autoshard.emit.megatron.script import megatron_notes

    if from_megatron is not None:
        best = _compare_megatron(from_megatron, model, cluster, gpus, top, time_limit, workers, seed, json_out,
                                 verbose, console=err if emit is not None and output is None else out)
        _write_emit(best, emit, output, json_out)
        return
    model_spec, cluster_spec = _load(model, cluster, gpus)
    job = train_job(model_spec, seq_len=seq_len, global_batch_size=global_batch_size, precision=precision)
    modules, recompute = _recompute_modules(recompute_modules, recompute)
    pins = _train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute, recompute_num_layers, sequence_parallel, zero_stage,
                       modules, moe_dispatcher, fp8_recipe)
    options = _solver_options(top, time_limit, workers, seed, verbose, zero_stage, started)
    if memory_fraction is not None:
        options = dataclasses.replace(options, memory_fraction=memory_fraction)
    flags = _layout_flags(layout, decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers,
                          account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split)
    if flags.given():
        from autoshard.api import solve_with_layout

        plans = solve_with_layout(model_spec, cluster_spec, job, flags, pins=pins, options=options)
    else:
        plans = api_solve(model_spec, cluster_spec, job, pins=pins, options=options)
    best = plans[0]
    headroom = _headroom(best, options.memory_fraction)
    if json_out:
        obj = _plans_json(plans)
        obj["memory_headroom"] = headroom
        _print_json(obj)
    else:
        render_console = err if emit is not None and output is None else out
        from autoshard.report.terminal import render_plan

        render_plan(best, render_console, runners=plans[1:], show_schedule=show_schedule, explain=explain,
                    notes=[*megatron_notes(best), headroom["note"]], time_limit_s=time_limit)
    _write_emit(best, emit, output, json_out)


def _compare_megatron(command, model_ref, cluster_ref, gpus, top, time_limit, workers, seed, json_out, verbose,
                      console: Console = out):
    """Compare an existing Megatron-LM command with the best plan; returns the best plan."""
    from autoshard.api import solve as api_solve
    from autoshard.api import train_job
    from autoshard.report.compare import compare_plans, render_comparison

    yours, warnings = _evaluate_megatron(command, model_ref, cluster_ref, gpus)
    job = train_job(yours.model, seq_len=yours.config.seq_len, global_batch_size=yours.config.global_batch_size,
                    precision=yours.config.precision)
    options = _solver_options(top, time_limit, workers, seed, verbose, None)
    best = api_solve(yours.model, yours.cluster, job, options=options)
    comparison = compare_plans(yours, best[0])
    headroom = _headroom(best[0], options.memory_fraction)
    if json_out:
        obj = best[0].to_json()
        obj["memory_headroom"] = headroom
        obj["yours"] = yours.to_json()
        obj["comparison"] = comparison
        obj["warnings"] = warnings
        _print_json(obj)
        return best[0]
    for w in warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(w)}")
    render_comparison(yours, best[0], comparison, console, time_limit_s=time_limit)
    console.print(f"note: the best plan was {headroom['note']}", markup=False, highlight=False)
    return best[0]


def _evaluate_megatron(command: str, model_ref: str | None, cluster_ref: str, gpus: int | None):
    """(plan, warnings) for an existing Megatron-LM command."""
    import dataclasses

    from autoshard.api import check_precision, resize, with_launch
    from autoshard.costmodel.train.step import predict_train
    from autoshard.emit.megatron.parse import model_shape_differences, parse_megatron
    from autoshard.plans.train import Plan, SolverStats
    from autoshard.specs import load_cluster, load_model

    expected = load_model(model_ref) if model_ref else None
    parsed = parse_megatron(command, vocab_size=expected.vocab_size if expected else None)
    warnings = list(parsed.warnings)
    if expected is not None:
        warnings += [f"the command's model differs from {expected.name}: {d}" for d in model_shape_differences(expected, parsed.model)]
    world = gpus or parsed.world_size
    if world is None:
        raise SpecError("the command does not say how many GPUs it runs on (no torchrun --nproc-per-node/--nnodes): "
                        "pass --gpus", source="--from-megatron")
    parsed = parsed.with_world_size(world)
    cluster_spec = resize(load_cluster(cluster_ref), world)
    cfg = parsed.train_config()
    check_precision(cluster_spec, cfg.precision, source="--from-megatron")
    stages = parsed.layout()
    prediction = predict_train(parsed.model, cluster_spec, cfg, stages)
    stats = SolverStats(status="EVALUATED", wall_s=0.0, objective=prediction.step_time_s, bound=prediction.step_time_s)
    plan = Plan(model=parsed.model, cluster=cluster_spec, config=cfg, stages=stages, prediction=prediction, solver=stats)
    if expected is not None:
        plan = dataclasses.replace(plan, model=parsed.model)
    return with_launch(plan), warnings


# ----------------------------------------------------------------------------- evaluate


@app.command()
@_guard
def evaluate(
    model: Annotated[str | None, typer.Argument(help="Model: bundled name, YAML path, or config.json (optional with --from-megatron).")] = None,
    cluster: Annotated[str | None, typer.Argument(help="Cluster: bundled name or YAML path.")] = None,
    gpus: GpusOpt = None,
    seq_len: SeqOpt = None,
    global_batch_size: GbsOpt = None,
    precision: PrecisionOpt = None,
    tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None, etp: EtpOpt = None,
    vpp: VppOpt = None, mbs: MbsOpt = None, recompute: RecomputeOptT = None,
    recompute_num_layers: RecomputeLayersOpt = None, sequence_parallel: SpOpt = None, zero_stage: ZeroOpt = None,
    layout: LayoutOpt = None, decoder_first_pipeline_num_layers: FirstLayersOpt = None,
    decoder_last_pipeline_num_layers: LastLayersOpt = None, account_for_embedding_in_pipeline_split: AcctEmbOpt = False,
    account_for_loss_in_pipeline_split: AcctLossOpt = False, tp_comm_overlap: TpOverlapOpt = None,
    overlap_grad_reduce: DpOverlapOpt = None, distributed_optimizer: DistOptOpt = None,
    recompute_modules: RecomputeModulesOpt = None,
    moe_dispatcher: DispatcherOpt = None, fp8_recipe: Fp8RecipeOpt = None,
    from_megatron: Annotated[str | None, typer.Option("--from-megatron", help="Read the plan from a Megatron-LM command or script.")] = None,
    from_vllm: Annotated[str | None, typer.Option("--from-vllm", help="Read a serving plan from a `vllm serve` command.")] = None,
    from_sglang: Annotated[str | None, typer.Option("--from-sglang", help="Read a serving plan from a `python -m sglang.launch_server` command.")] = None,
    input_len: Annotated[int | None, typer.Option("--input-len", min=1, help="Serve: prompt tokens per request (default: the model's serving: section, else 1024).")] = None,
    output_len: Annotated[int | None, typer.Option("--output-len", min=1, help="Serve: generated tokens per request (default: the model's serving: section, else 1024).")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help="Serve: requests in flight over the deployment (default: as many as max-num-seqs and the KV cache allow).")] = None,
    json_out: JsonOpt = False,
    show_schedule: Annotated[bool, typer.Option("--show-schedule", help="Draw the pipeline schedule.")] = False,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.5, max=86400, help="Solver limit when knobs are left out.")] = 30.0,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256)] = 8,
) -> None:
    """Predict speed and memory of a plan you already have. Knobs left out are filled in by the solver."""
    from autoshard.report.terminal import render_plan

    if sum(x is not None for x in (from_megatron, from_vllm, from_sglang)) > 1:
        raise SpecError("give one of --from-megatron, --from-vllm and --from-sglang", source="evaluate")
    if from_megatron is None and (input_len is not None or output_len is not None or concurrency is not None) \
            and from_vllm is None and from_sglang is None:
        raise SpecError("--input-len, --output-len and --concurrency describe a serving plan: use them with "
                        "--from-vllm or --from-sglang (or `solve --mode serve`)", source="evaluate")
    if from_megatron is not None or from_vllm is not None or from_sglang is not None:
        knobs = {k: v for k, v in locals().items() if v is not None and k in _PLAN_KNOBS}
        if knobs:
            flag = "--" + next(iter(knobs)).replace("_", "-")
            source = ("--from-megatron" if from_megatron is not None else "--from-vllm" if from_vllm is not None
                      else "--from-sglang")
            raise SpecError(f"{flag} would be ignored: the plan comes from the {source} command; change it there "
                            "(or evaluate without the command)", source=flag)
        if cluster is None:
            # one positional argument means the cluster when the model comes from the command
            cluster, model = model, None
        if cluster is None:
            raise SpecError("give the CLUSTER to evaluate on (bundled name or YAML path)", source="evaluate")
    if from_vllm is not None or from_sglang is not None:
        _evaluate_vllm_cli(from_vllm if from_vllm is not None else from_sglang, model, cluster, gpus, json_out,
                           input_len=input_len, output_len=output_len, concurrency=concurrency,
                           sglang=from_sglang is not None)
        return
    if from_megatron is not None:
        plan, warnings = _evaluate_megatron(from_megatron, model, cluster, gpus)
        for w in warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(w)}")
        if json_out:
            obj = plan.to_json()
            obj["warnings"] = warnings
            _print_json(obj)
        else:
            render_plan(plan, out, show_schedule=show_schedule)
        if not plan.prediction.fits:
            _explain_overflow(plan)
        raise typer.Exit(0 if plan.prediction.fits else 1)
    if model is None or cluster is None:
        raise SpecError("evaluate needs MODEL and CLUSTER (or --from-megatron/--from-vllm)", source="evaluate")
    from autoshard.api import evaluate as api_evaluate
    from autoshard.api import solve as api_solve
    from autoshard.api import train_job
    from autoshard.parallel import Recompute

    model_spec, cluster_spec = _load(model, cluster, gpus)
    job = train_job(model_spec, seq_len=seq_len, global_batch_size=global_batch_size, precision=precision)
    flags = _layout_flags(layout, decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers,
                          account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split)
    modules, recompute = _recompute_modules(recompute_modules, recompute)
    if distributed_optimizer is not None:
        if zero_stage is not None and (zero_stage >= 1) != distributed_optimizer:
            raise SpecError(f"--zero-stage {zero_stage} contradicts --{'' if distributed_optimizer else 'no-'}distributed-optimizer: "
                            "give one of them", source="--distributed-optimizer")
        zero_stage = zero_stage if zero_stage is not None else int(distributed_optimizer)
    if (tp is None or pp is None) and (tp_comm_overlap is not None or overlap_grad_reduce is not None):
        raise SpecError("--[no-]tp-comm-overlap and --[no-]overlap-grad-reduce describe a given plan: give its "
                        "--tp and --pp too (the solver always overlaps)", source="--tp-comm-overlap")
    if pp is None and tp is not None and flags.layout is not None:
        raise SpecError("--layout needs --pp (the layout's chunks are PP x VPP)", source="--layout")
    if tp is not None and pp is not None:
        from autoshard.api import megatron_layout

        _, _, note = megatron_layout(model_spec, pp=pp, vpp=vpp or 1, flags=flags)
        if note:
            err.print(f"[yellow]note:[/yellow] {escape(note)}")
        plan = api_evaluate(
            model_spec, cluster_spec, job, tp=tp, pp=pp, dp=dp, cp=cp or 1, ep=ep or 1, etp=etp, vpp=vpp or 1,
            micro_batch_size=mbs or 1, recompute=Recompute(recompute.value) if recompute else Recompute.NONE,
            recompute_num_layers=recompute_num_layers or 0,
            sequence_parallel=True if sequence_parallel is None else sequence_parallel,
            zero_stage=1 if zero_stage is None else zero_stage, layout=flags, recompute_modules=modules,
            tp_comm_overlap=tp_comm_overlap, overlap_grad_reduce=True if overlap_grad_reduce is None else overlap_grad_reduce,
            moe_dispatcher=moe_dispatcher, fp8_recipe=fp8_recipe,
        )
    elif flags.given():
        from autoshard.api import solve_with_layout

        pins = _train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute, recompute_num_layers, sequence_parallel, zero_stage,
                           modules)
        plan = solve_with_layout(model_spec, cluster_spec, job, flags, pins=pins,
                                 options=_solver_options(1, time_limit, workers, 0, False, zero_stage))[0]
    else:
        pins = _train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute, recompute_num_layers, sequence_parallel, zero_stage,
                           modules, moe_dispatcher, fp8_recipe)
        plan = api_solve(model_spec, cluster_spec, job, pins=pins,
                         options=_solver_options(1, time_limit, workers, 0, False, zero_stage))[0]
    if json_out:
        _print_json(plan.to_json())
    else:
        render_plan(plan, out, show_schedule=show_schedule, time_limit_s=time_limit)
    if not plan.prediction.fits:  # on stderr, so under --json too (stdout keeps the one JSON object)
        _explain_overflow(plan)
    raise typer.Exit(0 if plan.prediction.fits else 1)


def _explain_overflow(plan) -> None:
    from autoshard.units import GIB

    pred = plan.prediction
    fixes = [] if plan.config.recompute.value == "full" else ["--recompute full"]
    fixes.append("more PP")
    if plan.config.zero_stage == 0:
        fixes.append("the distributed optimizer (--zero-stage 1)")
    elif plan.config.zero_stage < 3 and plan.config.dims.pp == 1:
        fixes.append("Megatron-FSDP (--zero-stage 3)")
    tries = ", ".join(fixes[:-1]) + f" or {fixes[-1]}" if len(fixes) > 1 else fixes[0]
    over = [(r, m, c) for r, (m, c) in enumerate(zip(pred.rank_memory_bytes, pred.rank_capacity_bytes, strict=True)) if m > c]
    for r, m, c in over:
        err.print(f"[bold red]does not fit:[/bold red] pipeline rank {r} needs {m / GIB:.1f} GiB per GPU, has {c / GIB:.1f} GiB "
                  f"(over by {(m - c) / GIB:.1f} GiB); try {tries}")


def _evaluate_vllm_cli(command: str, model_ref: str | None, cluster_ref: str, gpus: int | None, json_out: bool, *,
                       input_len: int | None = None, output_len: int | None = None, concurrency: int | None = None,
                       sglang: bool = False) -> None:
    from autoshard.api import resize
    from autoshard.report.serving import render_serve_plan
    from autoshard.api import evaluate_vllm
    from autoshard.api import serve_job_for
    from autoshard.specs import load_cluster, load_model

    model_spec = load_model(model_ref) if model_ref else None
    cluster_spec = resize(load_cluster(cluster_ref), gpus)
    plan = evaluate_vllm(model_spec, cluster_spec, command, job=serve_job_for(model_spec, input_len, output_len),
                         concurrency=concurrency, shape_given=input_len is not None or output_len is not None,
                         sglang=sglang)
    if json_out:
        _print_json(plan.to_json())
    else:
        render_serve_plan(plan, out)


def _solve_serve(model, cluster, gpus, target, top, time_limit, workers, seed, json_out, explain, pins, input_len,
                 output_len, max_model_len, tpot_ms, ttft_s, request_rate, weight_dtype, kv_cache_dtype, emit, output,
                 disaggregate: str = "auto", pareto: bool = False, out_dir: Path | None = None,
                 started_at: float | None = None) -> None:
    from autoshard.errors import InfeasibleError
    from autoshard.report.serving import render_serve_plan
    from autoshard.api import solve_serve
    from autoshard.api import INTERACTIVE_TPOT_MS, interactive_job, serve_job_for

    if target is Target.K8S:
        raise SpecError("k8s is an --emit format (Kubernetes manifests), not a launcher: use --emit k8s -o DIR",
                        source="--target")
    if out_dir is not None and not pareto:
        raise SpecError("--out writes the Pareto front's PNG: add --pareto", source="--out")
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise SpecError(f"{out_dir} is a file: --out takes a directory (pareto.png is written in it)", source="--out")
    if emit is Target.K8S and output is None:
        raise SpecError("--emit k8s writes one manifest per instance: give a directory with -o DIR", source="--emit")
    if target is Target.MEGATRON or emit is Target.MEGATRON:
        raise SpecError("Megatron-LM is a training launcher: use --target vllm or sglang with --mode serve", source="--target")
    model_spec, cluster_spec = _load(model, cluster, gpus)
    job = serve_job_for(model_spec, input_len, output_len, max_model_len, tpot_ms, ttft_s, request_rate, weight_dtype,
                        kv_cache_dtype)
    run = dict(pins={k: v for k, v in pins.items() if v is not None}, time_limit_s=time_limit, num_workers=workers,
               seed=seed, disaggregate=disaggregate, started_at=started_at)
    interactive = interactive_job(job)
    alternative, sla_note = None, ""
    if interactive is None:
        plans = solve_serve(model_spec, cluster_spec, job, top_k=top, **run)
    else:
        alternative = solve_serve(model_spec, cluster_spec, job, top_k=1, **run)[0]
        try:
            plans = solve_serve(model_spec, cluster_spec, interactive, top_k=top, **run)
            sla_note = (f"SLA: TPOT <= {INTERACTIVE_TPOT_MS:g} ms (the interactive default; set --tpot-ms, --ttft-s "
                        "or --request-rate to plan for your own)")
        except InfeasibleError as exc:
            plans, alternative = [alternative], None
            sla_note = (f"no plan reaches the interactive default TPOT <= {INTERACTIVE_TPOT_MS:g} ms ({exc}); "
                        "showing the throughput-optimal plan")
    best = plans[0]
    front = None
    if pareto:
        from autoshard.report.pareto import front_json, render_front, write_front_png
        from autoshard.search.serve.front import serve_front

        front = serve_front(model_spec, cluster_spec, job, disaggregate=disaggregate)
        if out_dir is not None:
            png = write_front_png({cluster_spec.name: front}, out_dir / "pareto.png", tpot_target_s=best.job.tpot_target_s,
                                  title=f"{model_spec.name} on {cluster_spec.num_gpus} x {cluster_spec.primary.gpu.name}, "
                                        f"{job.input_len} in / {job.output_len} out")
            err.print(f"wrote {png}")
    if json_out:
        obj = best.to_json()
        if len(plans) > 1:
            obj["alternatives"] = [p.to_json() for p in plans[1:]]
        if front is not None:
            obj["pareto"] = front_json(front, best.job.tpot_target_s)
        if interactive is not None:
            obj["sla"] = {"tpot_ms": INTERACTIVE_TPOT_MS if alternative is not None else None, "default": True,
                          "note": sla_note}
        if alternative is not None:
            obj["throughput_optimal"] = alternative.to_json()
        _print_json(obj)
    else:
        console = out if emit is None or output is not None else err
        render_serve_plan(best, console, runners=plans[1:], explain=explain, time_limit_s=time_limit)
        if sla_note:
            console.print(f"[bold]{escape(sla_note)}[/bold]")
        if alternative is not None:
            console.print(
                f"throughput-optimal alternative (no TPOT target): {escape(alternative.describe())}, "
                f"{alternative.throughput_tokens_per_s:,.0f} output tokens/s ({alternative.tokens_per_s_per_gpu:,.0f} "
                f"per GPU), TPOT {1e3 * alternative.prediction.tpot_s:.1f} ms, TTFT {alternative.ttft_s:.2f} s",
                highlight=False)
        if front is not None:
            render_front(front, console, title=f"{model_spec.name} on {cluster_spec.num_gpus} GPUs",
                         tpot_target_s=best.job.tpot_target_s)
    if emit is Target.K8S:
        from autoshard.emit.k8s import k8s_manifests, k8s_yaml

        if output.exists() and not output.is_dir():
            raise SpecError(f"{output} is a file: --emit k8s writes a directory of manifests", source="-o")
        output.mkdir(parents=True, exist_ok=True)
        if target in (Target.VLLM, Target.SGLANG):
            framework = target.value
        else:  # SGLang's router ships in its image; vLLM's PD proxy is an example script
            framework = "sglang" if best.disaggregated else "vllm"
        files = k8s_manifests(best, framework)
        for name, objects in files.items():
            (output / name).write_text(k8s_yaml(objects))
        err.print(f"wrote {len(files)} manifest(s) to {escape(str(output))}: kubectl apply -f {escape(str(output))}",
                  highlight=False)
    elif emit is not None and best.disaggregated:
        from autoshard.emit.pd import pd_script

        _write_script(pd_script(best, emit.value), output, json_out)
    elif emit is not None:
        from autoshard.emit.serve_script import serve_script

        _write_script(serve_script(best, emit.value), output, json_out)


# ----------------------------------------------------------------------------- study


@app.command()
@_guard
def study(
    model: Annotated[str, typer.Argument(help="Model: bundled name, YAML path, or config.json.")],
    cluster: Annotated[list[str], typer.Option("--cluster", help="Cluster kind to compare (repeat).")],
    gpus: Annotated[str, typer.Option("--gpus", help="Comma-separated GPU counts, e.g. 64,128,256.")],
    tokens: Annotated[float | None, typer.Option("--tokens", min=1, max=MAX_TOKENS, help="Training tokens (default: the model's training: tokens).")] = None,
    deadline_days: Annotated[float | None, typer.Option("--deadline-days", min=0.001, max=1e7, help="Finish within this many days.")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", min=1, max=1e12, help="Spend at most this many dollars.")] = None,
    price: Annotated[list[str] | None, typer.Option("--price", help="Override a price: CLUSTER=USD_PER_GPU_HOUR (repeat).")] = None,
    mode: Annotated[Mode, typer.Option("--mode", help="train or serve.")] = Mode.TRAIN,
    seq_len: SeqOpt = None,
    global_batch_size: GbsOpt = None,
    precision: PrecisionOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write study.csv, study.json, study.md and pareto.png here.")] = None,
    json_out: JsonOpt = False,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.5, max=86400, help="Solver limit per size.")] = 20.0,
    jobs: Annotated[int, typer.Option("--jobs", min=0, max=256, help="Parallel solver processes (0: one per CPU).")] = 0,
    request_rate: Annotated[float | None, typer.Option("--request-rate", min=0.0001, max=1e6, help="Serve: requests/s to sustain.")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", min=0.001, max=3.6e6, help="Serve: time per output token target (ms).")] = None,
    ttft_s: Annotated[float | None, typer.Option("--ttft-s", min=0.001, max=86400, help="Serve: time to first token target (s).")] = None,
) -> None:
    """Pre-provisioning cost study: the best plan per cluster kind and size, time and dollars."""
    sizes = _parse_sizes(gpus)
    prices = _parse_prices(price or [])
    _run_study(model=model, clusters=cluster, sizes=sizes, tokens=tokens, deadline_days=deadline_days,
               budget_usd=budget_usd, prices=prices, mode=mode.value, seq_len=seq_len,
               global_batch_size=global_batch_size, precision=precision, out_dir=out_dir, json_out=json_out,
               time_limit=time_limit, jobs=jobs, request_rate=request_rate, tpot_ms=tpot_ms, ttft_s=ttft_s)


def _run_study(*, model: str, clusters: list[str], sizes: list[int], tokens: float | None,
               deadline_days: float | None, budget_usd: float | None, prices: dict[str, float], mode: str,
               seq_len: int | None, global_batch_size: int | None, precision: str | None, out_dir: Path | None,
               json_out: bool, time_limit: float, jobs: int, request_rate: float | None,
               tpot_ms: float | None = None, ttft_s: float | None = None) -> Any:
    """Solve with a progress bar on stderr, print the answers and the table on stdout (or one JSON
    object with `json_out`), and write the report files under `out_dir`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autoshard import api

    if out_dir is not None:
        api.check_out_dir(out_dir)
    bar = Progress(TextColumn("solving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=err, transient=True,
                   disable=json_out or not err.is_terminal)
    task = bar.add_task("", total=None)

    def progress(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=f"last: {label}" if label else "")
        if done == 0:
            bar.start()  # its refresh thread starts after the worker processes are forked

    try:
        result = api.study(model, clusters, sizes, mode=mode, tokens=tokens, deadline_days=deadline_days,
                           budget_usd=budget_usd, prices=prices, seq_len=seq_len, global_batch_size=global_batch_size,
                           precision=precision, request_rate=request_rate, tpot_ms=tpot_ms, ttft_s=ttft_s,
                           time_limit_s=time_limit, jobs=jobs, progress=progress)
    except KeyboardInterrupt:
        bar.stop()
        where = f"; nothing was written to {out_dir}" if out_dir is not None else ""
        err.print(f"study interrupted before it finished{where}", highlight=False, markup=False)
        raise SystemExit(130) from None
    finally:
        bar.stop()
    fronts, extra = None, []
    if mode == "serve":
        fronts, extra = api.serve_study_fronts(model, clusters, sizes, prices=prices, precision=precision,
                                               request_rate=request_rate, tpot_ms=tpot_ms, ttft_s=ttft_s)
    try:
        written = api.write_study(result, out_dir, extra=extra) if out_dir is not None else []
    except KeyboardInterrupt:
        err.print(f"study interrupted while writing; no complete set was left in {out_dir}", highlight=False,
                  markup=False)
        raise SystemExit(130) from None
    if json_out:
        out.file.write(json.dumps(api.study_json(result, fronts, tpot_ms, written), indent=2) + "\n")
        out.file.flush()
    else:
        api.render_study(result, out)
        if fronts:
            api.render_fronts(fronts, out, tpot_ms / 1e3 if tpot_ms else None)
        for path in written:
            err.print(f"wrote {path}", highlight=False, markup=False)
    return result


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SpecError(f"'{text}' is not a comma-separated list of GPU counts (e.g. 64,128,256)", source="--gpus") from None
    if not sizes or min(sizes) < 1:
        raise SpecError("give at least one positive GPU count, e.g. --gpus 64,128", source="--gpus")
    return sizes


def _parse_prices(items: list[str]) -> dict[str, float]:
    prices: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            prices[name.strip()] = float(value)
        except ValueError:
            raise SpecError(f"'{item}' is not CLUSTER=USD_PER_GPU_HOUR (e.g. dgx-h100=2.9)", source="--price") from None
        if prices[name.strip()] <= 0:
            raise SpecError(f"price must be positive in '{item}'", source="--price")
    return prices


# ----------------------------------------------------------------------------- catalogs


@app.command()
@_guard
def models(json_out: JsonOpt = False) -> None:
    """List the bundled models with their key figures."""
    from autoshard.report.terminal import render_models
    from autoshard.specs import bundled_models, load_model

    items = [(name, load_model(path)) for name, path in bundled_models().items()]
    if json_out:
        _print_json({"models": [{"name": n, "params": m.num_params, "active_params": m.num_active_params,
                                 "params_with_mtp": m.num_params_with_mtp, "mtp_layers": m.mtp_num_layers,
                                 "layers": m.num_layers, "hidden_size": m.hidden_size, "source": m.source}
                                for n, m in items]})
        return
    render_models(items, out)


@app.command()
@_guard
def clusters(json_out: JsonOpt = False) -> None:
    """List the bundled clusters with their key figures."""
    from autoshard.report.terminal import render_clusters
    from autoshard.specs import bundled_clusters, load_cluster

    items = [(name, load_cluster(path)) for name, path in bundled_clusters().items()]
    if json_out:
        _print_json({"clusters": [{"name": n, "gpus": c.num_gpus,
                                   "pools": [{"name": p.name, "gpu": p.gpu.name, "gpus": p.num_gpus,
                                              "price_per_gpu_hour": p.price_per_gpu_hour} for p in c.pools]}
                                  for n, c in items]})
        return
    render_clusters(items, out)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
