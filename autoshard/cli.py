"""The `autoshard` command line. Parses, calls the API, renders, sets exit codes; computes nothing.

Exit codes: 0 success, 1 no feasible plan (or the solver gave none), 2 bad input.
"""

from __future__ import annotations

import dataclasses
import json
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
            return fn(*args, **kwargs)
        except AutoshardError as exc:
            _fail(exc)

    return wrapper


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

GpusOpt = Annotated[int | None, typer.Option("--gpus", min=1, help="Use this many GPUs (resizes a homogeneous cluster).")]
SeqOpt = Annotated[int | None, typer.Option("--seq-len", min=1, help="Training sequence length (default: the model's training: section, else 4096).")]
GbsOpt = Annotated[int | None, typer.Option("--global-batch-size", min=1, help="Sequences per optimizer step.")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="bf16 or fp8.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (schema autoshard.plan/v1) on stdout.")]
TpOpt = Annotated[int | None, typer.Option("--tp", min=1, help="Tensor parallel size.")]
PpOpt = Annotated[int | None, typer.Option("--pp", min=1, help="Pipeline parallel size.")]
DpOpt = Annotated[int | None, typer.Option("--dp", min=1, help="Data parallel size.")]
CpOpt = Annotated[int | None, typer.Option("--cp", min=1, help="Context parallel size.")]
EpOpt = Annotated[int | None, typer.Option("--ep", min=1, help="Expert parallel size.")]
EtpOpt = Annotated[int | None, typer.Option("--etp", min=1, help="Expert tensor parallel size (default: TP).")]
VppOpt = Annotated[int | None, typer.Option("--vpp", min=1, help="Virtual pipeline stages per rank (interleaving).")]
MbsOpt = Annotated[int | None, typer.Option("--mbs", min=1, help="Micro-batch size.")]
RecomputeOptT = Annotated[RecomputeOpt | None, typer.Option("--recompute", help="Activation recomputation.")]
RecomputeLayersOpt = Annotated[int | None, typer.Option("--recompute-num-layers", min=0, help="Decoder layers per stage fully recomputed on top of --recompute.")]
SpOpt = Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Sequence parallelism (with TP > 1).")]
ZeroOpt = Annotated[int | None, typer.Option("--zero-stage", min=0, max=3, help="0: none, 1: distributed optimizer, 2/3: Megatron FSDP.")]


def _load(model_ref: str, cluster_ref: str, gpus: int | None):
    from autoshard.api import resize
    from autoshard.specs import load_cluster, load_model

    return load_model(model_ref), resize(load_cluster(cluster_ref), gpus)


def _print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _print_plans_json(plans: list) -> None:
    """The best plan's JSON object, with the runner-ups (--top) under "alternatives"."""
    obj = plans[0].to_json()
    if len(plans) > 1:
        obj["alternatives"] = [p.to_json() for p in plans[1:]]
    _print_json(obj)


def _train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute, recompute_num_layers, sp, zero_stage):
    from autoshard.parallel import Recompute
    from autoshard.search.space import Pins

    return Pins(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs,
                recompute=Recompute(recompute.value) if recompute else None, zero_stage=zero_stage,
                sequence_parallel=sp, recompute_num_layers=recompute_num_layers)


def _solver_options(top: int, time_limit: float, workers: int, seed: int, verbose: bool, zero_stage: int | None,
                    started_at: float | None = None):
    from autoshard.search.run import SolverOptions
    from autoshard.search.space import SpaceOptions

    zeros = (0, 1, 2, 3) if zero_stage is not None else (0, 1)
    return SolverOptions(top_k=top, time_limit_s=time_limit, num_workers=workers, seed=seed, log=verbose,
                         space=SpaceOptions(zero_stages=zeros), started_at=started_at)


def _write_emit(plan, emit: Target | None, output: Path | None) -> None:
    if emit is None:
        return
    if emit is not Target.MEGATRON:
        raise SpecError(f"--emit {emit.value} is for serving plans: use --mode serve", source="--emit")
    from autoshard.emit.megatron import megatron_script

    script = megatron_script(plan)
    if output is None:
        sys.stdout.write(script)
        return
    output.write_text(script)
    output.chmod(0o755)
    err.print(f"wrote {output}")


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
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.5, help="Solver time limit in seconds.")] = 30.0,
    workers: Annotated[int, typer.Option("--workers", min=1, help="CP-SAT worker threads.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="CP-SAT random seed.")] = 0,
    json_out: JsonOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show how many candidates each rule discarded.")] = False,
    show_schedule: Annotated[bool, typer.Option("--show-schedule", help="Draw the pipeline schedule of the plan.")] = False,
    emit: Annotated[Target | None, typer.Option("--emit", help="Write the launch script for this launcher.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="File for --emit (default: stdout).")] = None,
    from_megatron: Annotated[str | None, typer.Option("--from-megatron", help="Start from an existing Megatron-LM command or script: compare it with the best plan.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Log CP-SAT search progress to stderr.")] = False,
    memory_fraction: Annotated[float, typer.Option("--memory-fraction", min=0.3, max=1.0, help="Train: keep each GPU's predicted peak under this fraction of HBM (headroom).")] = 1.0,
    tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None, etp: EtpOpt = None,
    vpp: VppOpt = None, mbs: MbsOpt = None, recompute: RecomputeOptT = None,
    recompute_num_layers: RecomputeLayersOpt = None, sequence_parallel: SpOpt = None, zero_stage: ZeroOpt = None,
    input_len: Annotated[int | None, typer.Option("--input-len", min=1, help="Serve: prompt tokens per request.")] = None,
    output_len: Annotated[int | None, typer.Option("--output-len", min=1, help="Serve: generated tokens per request.")] = None,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", min=1, help="Serve: longest context.")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", min=0.001, help="Serve: time per output token target (ms).")] = None,
    ttft_s: Annotated[float | None, typer.Option("--ttft-s", min=0.001, help="Serve: time to first token target (s).")] = None,
    request_rate: Annotated[float | None, typer.Option("--request-rate", min=0.0001, help="Serve: requests/s to sustain (minimizes GPUs).")] = None,
    weight_dtype: Annotated[str | None, typer.Option("--weight-dtype", help="Serve: bf16, fp8, int8 or int4 weights.")] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option("--kv-cache-dtype", help="Serve: bf16 or fp8 KV cache.")] = None,
) -> None:
    """Find the best plan for MODEL on CLUSTER, with its predictions and launch command."""
    started = time.monotonic()  # --time-limit covers the whole command, loading and checks included
    if mode is Mode.SERVE:
        _solve_serve(model, cluster, gpus, target, top, time_limit, workers, seed, json_out, explain,
                     dict(tp=tp, pp=pp, dp=dp, ep=ep), input_len, output_len, max_model_len, tpot_ms, ttft_s,
                     request_rate, weight_dtype, kv_cache_dtype, emit, output, started_at=started)
        return
    if target not in (None, Target.MEGATRON):
        raise SpecError(f"--target {target.value} is a serving launcher: add --mode serve", source="--target")
    if emit not in (None, Target.MEGATRON):
        raise SpecError(f"--emit {emit.value} is for serving plans: add --mode serve", source="--emit")
    from autoshard.api import solve as api_solve
    from autoshard.api import train_job
    from autoshard.emit.megatron import megatron_notes

    if from_megatron is not None:
        _compare_megatron(from_megatron, model, cluster, gpus, top, time_limit, workers, seed, json_out, verbose)
        return
    model_spec, cluster_spec = _load(model, cluster, gpus)
    job = train_job(model_spec, seq_len=seq_len, global_batch_size=global_batch_size, precision=precision)
    pins = _train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute, recompute_num_layers, sequence_parallel, zero_stage)
    options = dataclasses.replace(_solver_options(top, time_limit, workers, seed, verbose, zero_stage, started),
                                  memory_fraction=memory_fraction)
    plans = api_solve(model_spec, cluster_spec, job, pins=pins, options=options)
    best = plans[0]
    if json_out:
        _print_plans_json(plans)
    else:
        render_console = err if emit is not None and output is None else out
        from autoshard.report.terminal import render_plan

        render_plan(best, render_console, runners=plans[1:], show_schedule=show_schedule, explain=explain,
                    notes=megatron_notes(best))
    _write_emit(best, emit, output)


def _compare_megatron(command, model_ref, cluster_ref, gpus, top, time_limit, workers, seed, json_out, verbose) -> None:
    from autoshard.api import solve as api_solve
    from autoshard.api import train_job
    from autoshard.report.compare import compare_plans, render_comparison

    yours, warnings = _evaluate_megatron(command, model_ref, cluster_ref, gpus)
    job = train_job(yours.model, seq_len=yours.config.seq_len, global_batch_size=yours.config.global_batch_size,
                    precision=yours.config.precision)
    best = api_solve(yours.model, yours.cluster, job, options=_solver_options(top, time_limit, workers, seed, verbose, None))
    comparison = compare_plans(yours, best[0])
    if json_out:
        obj = best[0].to_json()
        obj["yours"] = yours.to_json()
        obj["comparison"] = comparison
        obj["warnings"] = warnings
        _print_json(obj)
        return
    for w in warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(w)}")
    render_comparison(yours, best[0], comparison, out)


def _evaluate_megatron(command: str, model_ref: str | None, cluster_ref: str, gpus: int | None):
    """(plan, warnings) for an existing Megatron-LM command."""
    import dataclasses

    from autoshard.api import resize, with_launch
    from autoshard.costmodel.training import predict_train
    from autoshard.emit.megatron_parse import model_shape_differences, parse_megatron
    from autoshard.plan import Plan, SolverStats
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
    from_megatron: Annotated[str | None, typer.Option("--from-megatron", help="Read the plan from a Megatron-LM command or script.")] = None,
    from_vllm: Annotated[str | None, typer.Option("--from-vllm", help="Read a serving plan from a `vllm serve` command.")] = None,
    json_out: JsonOpt = False,
    show_schedule: Annotated[bool, typer.Option("--show-schedule", help="Draw the pipeline schedule.")] = False,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.5, help="Solver limit when knobs are left out.")] = 30.0,
    workers: Annotated[int, typer.Option("--workers", min=1)] = 8,
) -> None:
    """Predict speed and memory of a plan you already have. Knobs left out are filled in by the solver."""
    from autoshard.report.terminal import render_plan

    if from_megatron is not None or from_vllm is not None:
        if cluster is None:
            # one positional argument means the cluster when the model comes from the command
            cluster, model = model, None
        if cluster is None:
            raise SpecError("give the CLUSTER to evaluate on (bundled name or YAML path)", source="evaluate")
    if from_vllm is not None:
        _evaluate_vllm_cli(from_vllm, model, cluster, gpus, json_out)
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
        raise typer.Exit(0 if plan.prediction.fits else 1)
    if model is None or cluster is None:
        raise SpecError("evaluate needs MODEL and CLUSTER (or --from-megatron/--from-vllm)", source="evaluate")
    from autoshard.api import evaluate as api_evaluate
    from autoshard.api import solve as api_solve
    from autoshard.api import train_job
    from autoshard.parallel import Recompute

    model_spec, cluster_spec = _load(model, cluster, gpus)
    job = train_job(model_spec, seq_len=seq_len, global_batch_size=global_batch_size, precision=precision)
    if tp is not None and pp is not None:
        plan = api_evaluate(
            model_spec, cluster_spec, job, tp=tp, pp=pp, dp=dp, cp=cp or 1, ep=ep or 1, etp=etp, vpp=vpp or 1,
            micro_batch_size=mbs or 1, recompute=Recompute(recompute.value) if recompute else Recompute.NONE,
            recompute_num_layers=recompute_num_layers or 0,
            sequence_parallel=True if sequence_parallel is None else sequence_parallel,
            zero_stage=1 if zero_stage is None else zero_stage,
        )
    else:
        pins = _train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute, recompute_num_layers, sequence_parallel, zero_stage)
        plan = api_solve(model_spec, cluster_spec, job, pins=pins,
                         options=_solver_options(1, time_limit, workers, 0, False, zero_stage))[0]
    if json_out:
        _print_json(plan.to_json())
    else:
        render_plan(plan, out, show_schedule=show_schedule)
        if not plan.prediction.fits:
            _explain_overflow(plan)
    raise typer.Exit(0 if plan.prediction.fits else 1)


def _explain_overflow(plan) -> None:
    from autoshard.units import GIB

    pred = plan.prediction
    over = [(r, m, c) for r, (m, c) in enumerate(zip(pred.rank_memory_bytes, pred.rank_capacity_bytes, strict=True)) if m > c]
    for r, m, c in over:
        err.print(f"[bold red]does not fit:[/bold red] pipeline rank {r} needs {m / GIB:.1f} GiB per GPU, has {c / GIB:.1f} GiB "
                  f"(over by {(m - c) / GIB:.1f} GiB); try --recompute full, more PP, or ZeRO (--zero-stage 1)")


def _evaluate_vllm_cli(command: str, model_ref: str | None, cluster_ref: str, gpus: int | None, json_out: bool) -> None:
    from autoshard.api import resize
    from autoshard.report.serving import render_serve_plan
    from autoshard.search.serve import evaluate_vllm
    from autoshard.serve_api import serve_job_for
    from autoshard.specs import load_cluster, load_model

    model_spec = load_model(model_ref) if model_ref else None
    cluster_spec = resize(load_cluster(cluster_ref), gpus)
    plan = evaluate_vllm(model_spec, cluster_spec, command, job=serve_job_for(model_spec))
    if json_out:
        _print_json(plan.to_json())
    else:
        render_serve_plan(plan, out)


def _solve_serve(model, cluster, gpus, target, top, time_limit, workers, seed, json_out, explain, pins, input_len,
                 output_len, max_model_len, tpot_ms, ttft_s, request_rate, weight_dtype, kv_cache_dtype, emit, output,
                 started_at: float | None = None) -> None:
    from autoshard.report.serving import render_serve_plan
    from autoshard.search.serve import solve_serve
    from autoshard.serve_api import serve_job_for

    if target is Target.MEGATRON or emit is Target.MEGATRON:
        raise SpecError("Megatron-LM is a training launcher: use --target vllm or sglang with --mode serve", source="--target")
    model_spec, cluster_spec = _load(model, cluster, gpus)
    job = serve_job_for(model_spec, input_len, output_len, max_model_len, tpot_ms, ttft_s, request_rate, weight_dtype,
                        kv_cache_dtype)
    plans = solve_serve(model_spec, cluster_spec, job, pins={k: v for k, v in pins.items() if v is not None},
                        top_k=top, time_limit_s=time_limit, num_workers=workers, seed=seed, started_at=started_at)
    best = plans[0]
    if json_out:
        _print_plans_json(plans)
    else:
        render_serve_plan(best, out if emit is None or output is not None else err, runners=plans[1:], explain=explain)
    if emit is not None:
        from autoshard.emit.sglang import sglang_node_commands
        from autoshard.emit.vllm import vllm_node_commands

        commands = vllm_node_commands(best) if emit is Target.VLLM else sglang_node_commands(best)
        if len(commands) == 1:
            body = commands[0] + "\n"
        else:
            body = "".join(f'if [ "${{NODE_RANK:?set NODE_RANK}}" = {i} ]; then\n  {cmd}\nfi\n'
                           for i, cmd in enumerate(commands))
        text = (f"#!/usr/bin/env bash\n# {emit.value} deployment of {best.model.name} on {best.num_gpus} GPUs "
                f"({best.describe()}), written by autoshard.\nset -euo pipefail\n" + body)
        if output is None:
            sys.stdout.write(text)
        else:
            output.write_text(text)
            output.chmod(0o755)
            err.print(f"wrote {output}")


# ----------------------------------------------------------------------------- study


@app.command()
@_guard
def study(
    model: Annotated[str, typer.Argument(help="Model: bundled name, YAML path, or config.json.")],
    cluster: Annotated[list[str], typer.Option("--cluster", help="Cluster kind to compare (repeat).")],
    gpus: Annotated[str, typer.Option("--gpus", help="Comma-separated GPU counts, e.g. 64,128,256.")],
    tokens: Annotated[float | None, typer.Option("--tokens", min=1, help="Training tokens (default: the model's training: tokens).")] = None,
    deadline_days: Annotated[float | None, typer.Option("--deadline-days", min=0.001, help="Finish within this many days.")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", min=1, help="Spend at most this many dollars.")] = None,
    price: Annotated[list[str] | None, typer.Option("--price", help="Override a price: CLUSTER=USD_PER_GPU_HOUR (repeat).")] = None,
    mode: Annotated[Mode, typer.Option("--mode", help="train or serve.")] = Mode.TRAIN,
    seq_len: SeqOpt = None,
    global_batch_size: GbsOpt = None,
    precision: PrecisionOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write study.csv, study.json, study.md and pareto.png here.")] = None,
    json_out: JsonOpt = False,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.5, help="Solver limit per size.")] = 20.0,
    jobs: Annotated[int, typer.Option("--jobs", min=0, help="Parallel solver processes (0: one per CPU).")] = 0,
    request_rate: Annotated[float | None, typer.Option("--request-rate", min=0.0001, help="Serve: requests/s to sustain.")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", min=0.001, help="Serve: time per output token target (ms).")] = None,
    ttft_s: Annotated[float | None, typer.Option("--ttft-s", min=0.001, help="Serve: time to first token target (s).")] = None,
) -> None:
    """Pre-provisioning cost study: the best plan per cluster kind and size, time and dollars."""
    sizes = _parse_sizes(gpus)
    prices = _parse_prices(price or [])
    from autoshard.study import run_study_cli

    run_study_cli(model=model, clusters=cluster, sizes=sizes, tokens=tokens, deadline_days=deadline_days,
                  budget_usd=budget_usd, prices=prices, mode=mode.value, seq_len=seq_len,
                  global_batch_size=global_batch_size, precision=precision, out_dir=out_dir, json_out=json_out,
                  time_limit=time_limit, jobs=jobs, request_rate=request_rate, console=out, err=err,
                  tpot_ms=tpot_ms, ttft_s=ttft_s)


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
