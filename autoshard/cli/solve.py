"""`autoshard solve`: the best plan for a model on a cluster, in either mode (serving: `cli.serve`),
with its predictions and launch command; `--from-megatron` compares an existing command with it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from autoshard import api
from autoshard.api import MAX_CONTEXT
from autoshard.cli.app import app, err, guard, out, report_err
from autoshard.cli.options import (
    A2aOverlapOpt,
    AcctEmbOpt,
    command_started,
    float_option,
    given_plan_knob,
    AcctLossOpt,
    CpOpt,
    Disaggregate,
    DispatcherOpt,
    DpOpt,
    EpOpt,
    EtpOpt,
    FirstLayersOpt,
    Fp8RecipeOpt,
    GbsOpt,
    GpusOpt,
    JsonOpt,
    LastLayersOpt,
    LayoutOpt,
    MbsOpt,
    Mode,
    PpOpt,
    PrecisionOpt,
    RecomputeLayersOpt,
    RecomputeModulesOpt,
    RecomputeOptT,
    SeqOpt,
    SpOpt,
    Target,
    TargetOpt,
    TpOpt,
    VppOpt,
    ZeroOpt,
    check_mode_flags,
    check_output,
    plans_json,
    print_json,
    write_script,
)
from autoshard.cli.serve import solve_serve
from autoshard.errors import SpecError
from autoshard.report.compare import render_comparison
from autoshard.report.terminal import render_plan


@app.command(short_help="Find the best plan for MODEL on CLUSTER: speed, memory, launch command.")
@guard
def solve(
    model: Annotated[str, typer.Argument(help="Model: bundled name, YAML path, or Hugging Face config.json.")],
    cluster: Annotated[str, typer.Argument(help="Cluster: bundled name or YAML path.")],
    gpus: GpusOpt = None,
    mode: Annotated[Mode, typer.Option("--mode", help="train or serve.")] = Mode.TRAIN,
    seq_len: SeqOpt = None,
    global_batch_size: GbsOpt = None,
    precision: PrecisionOpt = None,
    target: TargetOpt = None,
    top: Annotated[int, typer.Option("--top", min=1, max=20, help="Return the K best distinct plans.")] = 1,
    time_limit: Annotated[float, float_option("--time-limit", lo=0.5, hi=86400, help="Solver time limit in seconds.")] = 30.0,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256, help="CP-SAT worker threads.")] = 8,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**31 - 1, help="CP-SAT random seed.")] = 0,
    json_out: JsonOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show how many candidates each rule discarded.")] = False,
    show_schedule: Annotated[bool, typer.Option("--show-schedule", help="Draw the pipeline schedule of the plan.")] = False,
    emit: Annotated[Target | None, typer.Option("--emit", help="Write the launch script for this launcher, or (k8s) Kubernetes manifests into -o DIR.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="File for --emit (default: stdout).")] = None,
    from_megatron: Annotated[str | None, typer.Option("--from-megatron", help="Start from an existing Megatron-LM command or script: compare it with the best plan.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Log CP-SAT search progress to stderr.")] = False,
    memory_fraction: Annotated[float | None, float_option("--memory-fraction", lo=0.3, hi=1.0, help="Train: keep each GPU's predicted peak under this fraction of HBM (default 0.87: headroom for the memory model's measured error).")] = None,
    tp: TpOpt = None, pp: PpOpt = None, dp: DpOpt = None, cp: CpOpt = None, ep: EpOpt = None, etp: EtpOpt = None,
    vpp: VppOpt = None, mbs: MbsOpt = None, recompute: RecomputeOptT = None,
    recompute_num_layers: RecomputeLayersOpt = None, sequence_parallel: SpOpt = None, zero_stage: ZeroOpt = None,
    layout: LayoutOpt = None, decoder_first_pipeline_num_layers: FirstLayersOpt = None,
    decoder_last_pipeline_num_layers: LastLayersOpt = None, account_for_embedding_in_pipeline_split: AcctEmbOpt = False,
    account_for_loss_in_pipeline_split: AcctLossOpt = False, recompute_modules: RecomputeModulesOpt = None,
    moe_dispatcher: DispatcherOpt = None, fp8_recipe: Fp8RecipeOpt = None, moe_a2a_overlap: A2aOverlapOpt = None,
    input_len: Annotated[int | None, typer.Option("--input-len", min=1, max=MAX_CONTEXT, help="Serve: prompt tokens per request.")] = None,
    output_len: Annotated[int | None, typer.Option("--output-len", min=1, max=MAX_CONTEXT, help="Serve: generated tokens per request.")] = None,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", min=1, max=MAX_CONTEXT, help="Serve: longest context.")] = None,
    tpot_ms: Annotated[float | None, float_option("--tpot-ms", lo=0.001, hi=3.6e6, help="Serve: time per output token target (ms).")] = None,
    ttft_s: Annotated[float | None, float_option("--ttft-s", lo=0.001, hi=86400, help="Serve: time to first token target (s).")] = None,
    request_rate: Annotated[float | None, float_option("--request-rate", lo=0.0001, hi=1e6, help="Serve: requests/s to sustain (minimizes GPUs).")] = None,
    weight_dtype: Annotated[str | None, typer.Option("--weight-dtype", help="Serve: bf16, fp8, int8, int4, nvfp4 or mxfp4 weights (FP4 runs on FP4 tensor cores on Blackwell).")] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option("--kv-cache-dtype", help="Serve: bf16 or fp8 KV cache.")] = None,
    pareto: Annotated[bool, typer.Option("--pareto", help="Serve: print the Pareto front of output tokens/s per GPU against tokens/s per user over every deployment, and where each TPOT SLA cuts it.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Serve --pareto: write pareto.png here.")] = None,
    disaggregate: Annotated[Disaggregate, typer.Option("--disaggregate", help="Serve: prefill/decode disaggregation: auto (the solver chooses), on (xPyD only) or off (aggregated replicas only).")] = Disaggregate.AUTO,
) -> None:
    """Find the best plan for MODEL on CLUSTER, with its predictions and launch command."""
    started = command_started()  # --time-limit covers the whole command: start-up, loading and checks included
    check_output(output, emit, (model, cluster))
    given = {k: v for k, v in locals().items() if v is not None and v is not False}
    check_mode_flags(mode, given)
    if mode is Mode.SERVE:
        solve_serve(model, cluster, gpus, target, top, time_limit, workers, seed, json_out, explain,
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
    if from_megatron is not None:
        if (flag := given_plan_knob(given)) is not None:  # the comparison solves over every knob
            raise SpecError("it would be ignored: solve --from-megatron compares the command's plan with the best "
                            f"plan over every knob; drop {flag} (or pin it in a solve without --from-megatron)",
                            source=flag)
        best = _compare_megatron(from_megatron, model, cluster, gpus, top, time_limit, workers, seed, json_out,
                                 verbose, console=report_err if emit is not None and output is None else out, started=started)
        write_emit(best, emit, output, json_out)
        return
    model_spec, cluster_spec = api.load(model, cluster, gpus)
    job = api.train_job(model_spec, seq_len=seq_len, global_batch_size=global_batch_size, precision=precision)
    modules, recompute_name = api.recompute_modules(recompute_modules, recompute.value if recompute else None)
    pins = api.train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute_name, recompute_num_layers, sequence_parallel,
                          zero_stage, modules, moe_dispatcher, fp8_recipe, moe_a2a_overlap)
    options = api.solver_options(top, time_limit, workers, seed, verbose, zero_stage, started,
                                 memory_fraction=memory_fraction)
    flags = api.layout_flags(layout, decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers,
                             account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split)
    if flags.given():
        plans = api.solve_with_layout(model_spec, cluster_spec, job, flags, pins=pins, options=options)
    else:
        plans = api.solve(model_spec, cluster_spec, job, pins=pins, options=options)
    best = plans[0]
    headroom = api.memory_headroom(best, options.memory_fraction)
    if json_out:
        obj = plans_json(plans)
        obj["memory_headroom"] = headroom
        print_json(obj)
    else:
        render_console = report_err if emit is not None and output is None else out
        render_plan(best, render_console, runners=plans[1:], show_schedule=show_schedule, explain=explain,
                    notes=[*api.megatron_notes(best), headroom["note"]], time_limit_s=time_limit)
    write_emit(best, emit, output, json_out)


def write_emit(plan, emit: Target | None, output: Path | None, json_out: bool = False) -> None:
    """The Megatron-LM launch script of a training plan for --emit megatron."""
    if emit is None:
        return
    if emit is not Target.MEGATRON:
        raise SpecError(f"--emit {emit.value} is for serving plans: use --mode serve", source="--emit")
    write_script(api.megatron_script(plan), output, json_out)


def _compare_megatron(command, model_ref, cluster_ref, gpus, top, time_limit, workers, seed, json_out, verbose,
                      console: Console = out, started: float | None = None):
    """Compare an existing Megatron-LM command with the best plan; returns the best plan."""
    found = api.compare_megatron(command, model_ref, cluster_ref, gpus,
                                 options=api.solver_options(top, time_limit, workers, seed, verbose, None, started))
    yours, best = found.yours, found.best
    if json_out:
        obj = best.to_json()
        obj["memory_headroom"] = found.headroom
        obj["yours"] = yours.to_json()
        obj["comparison"] = found.comparison
        obj["warnings"] = found.warnings
        print_json(obj)
        return best
    for w in found.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(w)}")
    render_comparison(yours, best, found.comparison, console, time_limit_s=time_limit)
    console.print(f"note: the best plan was {found.headroom['note']}", markup=False, highlight=False)
    return best
