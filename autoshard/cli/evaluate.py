"""`autoshard evaluate`: predict a plan you already have, from its degrees or from its Megatron-LM,
vLLM or SGLang command; knobs left out are filled in by the solver."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from autoshard import api
from autoshard.cli.app import app, err, guard, out
from autoshard.cli.options import (
    A2aOverlapOpt,
    AcctEmbOpt,
    AcctLossOpt,
    command_started,
    float_option,
    given_plan_knob,
    CpOpt,
    DispatcherOpt,
    DistOptOpt,
    DpOpt,
    DpOverlapOpt,
    EpOpt,
    EtpOpt,
    FirstLayersOpt,
    Fp8AttnOpt,
    Fp8RecipeOpt,
    GbsOpt,
    GpusOpt,
    JsonOpt,
    LastLayersOpt,
    LayoutOpt,
    MbsOpt,
    PpOpt,
    PrecisionOpt,
    RecomputeLayersOpt,
    RecomputeModulesOpt,
    RecomputeOptT,
    SeqOpt,
    SpOpt,
    TpOpt,
    TpOverlapOpt,
    VppOpt,
    ZeroOpt,
    print_json,
)
from autoshard.cli.serve import evaluate_vllm
from autoshard.errors import SpecError
from autoshard.report.terminal import render_plan


@app.command()
@guard
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
    moe_dispatcher: DispatcherOpt = None, fp8_recipe: Fp8RecipeOpt = None, fp8_attention: Fp8AttnOpt = None,
    moe_a2a_overlap: A2aOverlapOpt = None,
    from_megatron: Annotated[str | None, typer.Option("--from-megatron", help="Read the plan from a Megatron-LM command or script.")] = None,
    from_vllm: Annotated[str | None, typer.Option("--from-vllm", help="Read a serving plan from a `vllm serve` command.")] = None,
    from_sglang: Annotated[str | None, typer.Option("--from-sglang", help="Read a serving plan from a `python -m sglang.launch_server` command.")] = None,
    input_len: Annotated[int | None, typer.Option("--input-len", min=1, help="Serve: prompt tokens per request (default: the model's serving: section, else 1024).")] = None,
    output_len: Annotated[int | None, typer.Option("--output-len", min=1, help="Serve: generated tokens per request (default: the model's serving: section, else 1024).")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help="Serve: requests in flight over the deployment (default: as many as max-num-seqs and the KV cache allow).")] = None,
    json_out: JsonOpt = False,
    show_schedule: Annotated[bool, typer.Option("--show-schedule", help="Draw the pipeline schedule.")] = False,
    time_limit: Annotated[float, float_option("--time-limit", lo=0.5, hi=86400, help="Solver limit when knobs are left out.")] = 30.0,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256)] = 8,
) -> None:
    """Predict speed and memory of a plan you already have. Knobs left out are filled in by the solver."""
    started = command_started()  # as in solve: --time-limit counts from the process start
    if sum(x is not None for x in (from_megatron, from_vllm, from_sglang)) > 1:
        raise SpecError("give one of --from-megatron, --from-vllm and --from-sglang", source="evaluate")
    if from_megatron is None and (input_len is not None or output_len is not None or concurrency is not None) \
            and from_vllm is None and from_sglang is None:
        raise SpecError("--input-len, --output-len and --concurrency describe a serving plan: use them with "
                        "--from-vllm or --from-sglang (or `solve --mode serve`)", source="evaluate")
    if from_megatron is not None or from_vllm is not None or from_sglang is not None:
        if (flag := given_plan_knob(locals())) is not None:
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
        evaluate_vllm(from_vllm if from_vllm is not None else from_sglang, model, cluster, gpus, json_out,
                      input_len=input_len, output_len=output_len, concurrency=concurrency,
                      sglang=from_sglang is not None)
        return
    if from_megatron is not None:
        plan, warnings = api.evaluate_megatron(from_megatron, model, cluster, gpus)
        for w in warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(w)}")
        if json_out:
            obj = plan.to_json()
            obj["warnings"] = warnings
            print_json(_with_overflow(obj, plan))
        else:
            render_plan(plan, out, show_schedule=show_schedule)
        if not plan.prediction.fits:
            explain_overflow(plan)
        raise typer.Exit(0 if plan.prediction.fits else 1)
    if model is None or cluster is None:
        raise SpecError("evaluate needs MODEL and CLUSTER (or --from-megatron/--from-vllm)", source="evaluate")
    model_spec, cluster_spec = api.load(model, cluster, gpus)
    for flag, value in (("--ep", ep), ("--etp", etp)):
        if (value or 1) > 1 and not model_spec.is_moe:  # was "parallel degrees: ... (EP/ETP > 1) ...", no fix
            raise SpecError(f"{flag} {value}: expert parallelism needs a mixture-of-experts model; {model_spec.name} "
                            f"is dense: drop {flag}", source=flag)
    job = api.train_job(model_spec, seq_len=seq_len, global_batch_size=global_batch_size, precision=precision)
    flags = api.layout_flags(layout, decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers,
                             account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split)
    modules, recompute_name = api.recompute_modules(recompute_modules, recompute.value if recompute else None)
    if distributed_optimizer is not None:
        if zero_stage is not None and (zero_stage >= 1) != distributed_optimizer:
            raise SpecError(f"--zero-stage {zero_stage} contradicts --{'' if distributed_optimizer else 'no-'}distributed-optimizer: "
                            "give one of them", source="--distributed-optimizer")
        zero_stage = zero_stage if zero_stage is not None else int(distributed_optimizer)
    if (tp is None or pp is None) and fp8_attention:
        raise SpecError("--fp8-attention describes a given plan (the solver plans BF16 attention, which Megatron-LM "
                        "can launch): give its --tp and --pp too", source="--fp8-attention")
    if (tp is None or pp is None) and (tp_comm_overlap is not None or overlap_grad_reduce is not None):
        raise SpecError("--[no-]tp-comm-overlap and --[no-]overlap-grad-reduce describe a given plan: give its "
                        "--tp and --pp too (the solver always overlaps)", source="--tp-comm-overlap")
    if pp is None and tp is not None and flags.layout is not None:
        raise SpecError("--layout needs --pp (the layout's chunks are PP x VPP)", source="--layout")
    note = None
    if tp is not None and pp is not None:
        _, _, note = api.megatron_layout(model_spec, pp=pp, vpp=vpp or 1, flags=flags)
        if note:
            err.print(f"[yellow]note:[/yellow] {escape(note)}")
        plan = api.evaluate(
            model_spec, cluster_spec, job, tp=tp, pp=pp, dp=dp, cp=cp or 1, ep=ep or 1, etp=etp, vpp=vpp or 1,
            micro_batch_size=mbs or 1, recompute=api.Recompute(recompute_name or "none"),
            recompute_num_layers=recompute_num_layers or 0,
            sequence_parallel=True if sequence_parallel is None else sequence_parallel,
            zero_stage=1 if zero_stage is None else zero_stage, layout=flags, recompute_modules=modules,
            tp_comm_overlap=tp_comm_overlap, overlap_grad_reduce=True if overlap_grad_reduce is None else overlap_grad_reduce,
            moe_dispatcher=moe_dispatcher, fp8_recipe=fp8_recipe, fp8_attention=bool(fp8_attention),
            moe_a2a_overlap=bool(moe_a2a_overlap),
        )
    elif flags.given():
        pins = api.train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute_name, recompute_num_layers, sequence_parallel,
                              zero_stage, modules, moe_a2a_overlap=moe_a2a_overlap)
        plan = api.solve_with_layout(model_spec, cluster_spec, job, flags, pins=pins,
                                     options=api.solver_options(1, time_limit, workers, 0, False, zero_stage, started))[0]
    else:
        pins = api.train_pins(tp, pp, dp, cp, ep, etp, vpp, mbs, recompute_name, recompute_num_layers, sequence_parallel,
                              zero_stage, modules, moe_dispatcher, fp8_recipe, moe_a2a_overlap)
        plan = api.solve(model_spec, cluster_spec, job, pins=pins,
                         options=api.solver_options(1, time_limit, workers, 0, False, zero_stage, started))[0]
    if json_out:
        obj = plan.to_json()
        if note:  # the layout Megatron-LM needs, as the terminal's note: line says
            obj["warnings"] = [*obj.get("warnings", []), note]
        print_json(_with_overflow(obj, plan))
    else:
        render_plan(plan, out, show_schedule=show_schedule, time_limit_s=time_limit)
    if not plan.prediction.fits:  # on stderr, so under --json too (stdout keeps the one JSON object)
        explain_overflow(plan)
    raise typer.Exit(0 if plan.prediction.fits else 1)


def explain_overflow(plan) -> None:
    """Each pipeline rank over its GPU's memory, on stderr."""
    for line in api.overflow_messages(plan):
        err.print(f"[bold red]does not fit:[/bold red] {line}")


def _with_overflow(obj: dict, plan) -> dict:  # type: ignore[no-untyped-def]
    """A plan that does not fit carries the stderr's "does not fit:" lines under "error", as a solve
    with no plan carries its message (exit 1 either way)."""
    if not plan.prediction.fits:
        obj["error"] = "\n".join(f"does not fit: {line}" for line in api.overflow_messages(plan))
    return obj
