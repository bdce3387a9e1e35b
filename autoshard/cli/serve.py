"""The serving paths of `autoshard solve --mode serve` and `autoshard evaluate --from-vllm/--from-sglang`:
render what `autoshard.api` plans and write its launch script or Kubernetes manifests."""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.markup import escape

from autoshard import api
from autoshard.cli.app import err, out, report_err
from autoshard.cli.options import Target, print_json, write_script
from autoshard.errors import SolverError, SpecError
from autoshard.report.pareto import front_band, front_json, plan_line, plan_on_front, render_front, write_front_png
from autoshard.report.serving import alternative_text, render_serve_plan


def evaluate_vllm(command: str, model_ref: str | None, cluster_ref: str, gpus: int | None, json_out: bool, *,
                  input_len: int | None = None, output_len: int | None = None, concurrency: int | None = None,
                  sglang: bool = False) -> None:
    """`evaluate --from-vllm/--from-sglang`: predict the command's plan and print it."""
    plan = api.evaluate_serve_command(command, model_ref, cluster_ref, gpus, input_len=input_len, output_len=output_len,
                                       concurrency=concurrency, sglang=sglang)
    if json_out:
        print_json(plan.to_json())
    else:
        render_serve_plan(plan, out)
        print_engine(plan, out)


def serve_engine(target: Target | None, emit: Target | None) -> str:
    """The engine a serving plan is priced for: --target's, else --emit's (vllm or sglang), else vLLM
    (api.DEFAULT_ENGINE). Two different engines are bad input: a plan is priced for one."""
    engines = {t.value for t in (target, emit) if t in (Target.VLLM, Target.SGLANG)}
    if len(engines) > 1:
        raise SpecError(f"--target {target.value} and --emit {emit.value} name different engines: "  # type: ignore[union-attr]
                        "a plan is priced for the kernels of the engine it is launched with; give one (both "
                        "engines' commands are printed)", source="--emit")
    return engines.pop() if engines else api.DEFAULT_ENGINE


def print_engine(plan, console, *, chosen: bool = True) -> None:  # type: ignore[no-untyped-def]
    """Which engine's kernels the figures are for and, when the other engine's launch line prices this
    deployment differently, by how much."""
    name = api.ENGINE_NAMES[plan.prediction.config.engine]
    how = "" if chosen else " (no --target: vLLM by default; --target sglang prices SGLang's kernels)"
    console.print(f"priced for {name}'s kernels, as its launch line runs them{how}", markup=False, highlight=False)
    other = plan.engine_other
    if other is not None and other.get("differs"):
        console.print(f"[yellow]engines differ:[/yellow] {escape(other['note'])}", highlight=False)
    elif other is not None:
        console.print(other["note"], markup=False, highlight=False)


def solve_serve(model, cluster, gpus, target, top, time_limit, workers, seed, json_out, explain, pins, input_len,
                output_len, max_model_len, tpot_ms, ttft_s, request_rate, weight_dtype, kv_cache_dtype, emit, output,
                disaggregate: str = "auto", pareto: bool = False, out_dir: Path | None = None,
                started_at: float | None = None) -> None:
    """`solve --mode serve`: the best deployment (at the interactive SLA when none is given), its
    Pareto front with --pareto, and its launch script or manifests with --emit."""
    if out_dir is not None and not pareto:
        raise SpecError("--out writes the Pareto front's PNG: add --pareto", source="--out")
    if out_dir is not None:  # created with its missing parents, as -o's directory is
        api.check_output_dir(out_dir, "--out", "the directory for pareto.png")
    if emit is Target.K8S and output is None:
        raise SpecError("--emit k8s writes one manifest per instance: give a directory with -o DIR", source="--emit")
    if target is Target.MEGATRON or emit is Target.MEGATRON:
        raise SpecError("Megatron-LM is a training launcher: use --target vllm or sglang with --mode serve", source="--target")
    framework = serve_engine(target, emit)
    model_spec, cluster_spec = api.load(model, cluster, gpus)
    if (pins.get("ep") or 1) > 1 and model_spec.moe is None:  # as in train mode: bad input, not "no plan"
        raise SpecError(f"expert parallelism needs a mixture-of-experts model; {model_spec.name} is dense: drop --ep",
                        source="--ep")
    heads, kv, tp = model_spec.num_attention_heads, model_spec.kv_heads, pins.get("tp")
    gqa = model_spec.mla is None  # vLLM splits KV heads over TP or replicates them: one divides the other
    legal = [d for d in range(1, min(heads, 64) + 1) if heads % d == 0 and (not gqa or kv % d == 0 or d % kv == 0)]
    if tp and tp not in legal and (heads % tp or tp <= 64):  # as in train mode: bad input (exit 2), not "no plan"
        why = (f"must divide the {heads} attention heads" if heads % tp else
               f"and the {kv} KV heads must divide one another")
        raise SpecError(f"TP {tp} {why}: use one of {', '.join(map(str, legal))}", source="--tp")
    job = api.serve_job_for(model_spec, input_len, output_len, max_model_len, tpot_ms, ttft_s, request_rate,
                            weight_dtype, kv_cache_dtype)
    # --pareto: the plan's solve ends at (1 - FRONT_SHARE) of the limit, the front at the limit itself
    solve_limit = time_limit * (1 - api.FRONT_SHARE) if pareto else time_limit
    try:
        found = api.plan_serving(model_spec, cluster_spec, job, top_k=top, pins=pins, time_limit_s=solve_limit,
                                 num_workers=workers, seed=seed, disaggregate=disaggregate, started_at=started_at,
                                 framework=framework)
    except SolverError as exc:
        if not pareto:
            raise
        raise SolverError(f"{exc} (with --pareto the plan gets {1 - api.FRONT_SHARE:.0%} of --time-limit "
                          f"{time_limit:g} s, the front the rest)") from None
    plans, alternative, sla_note = found.plans, found.alternative, found.sla_note
    best = plans[0]
    front = band = None
    if pareto:
        front = api.serve_front(model_spec, cluster_spec, job, disaggregate=disaggregate, framework=framework,
                                time_limit_s=time_limit, started_at=started_at)
        band = front_band(model_spec, cluster_spec, best.job)
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
            obj["pareto"] = {**front_json(front, best.job.tpot_target_s, band), "plan": plan_on_front(best, front)}
        if found.interactive:
            obj["sla"] = {"tpot_ms": api.INTERACTIVE_TPOT_MS if best.job.tpot_target_s is not None else None, "default": True,
                          "note": sla_note}
        if alternative is not None:
            obj["throughput_optimal"] = alternative.to_json()
        print_json(obj)
    else:
        console = out if emit is None or output is not None else report_err
        render_serve_plan(best, console, runners=plans[1:], explain=explain, time_limit_s=time_limit)
        print_engine(best, console, chosen=target is not None or emit in (Target.VLLM, Target.SGLANG))
        if sla_note:
            console.print(f"[bold]{escape(sla_note)}[/bold]")
        if alternative is not None:
            console.print(alternative_text(alternative, best), markup=False, highlight=False)
        if front is not None:
            render_front(front, console, title=f"{model_spec.name} on {cluster_spec.num_gpus} GPUs",
                         tpot_target_s=best.job.tpot_target_s, band=band, cluster_gpus=cluster_spec.num_gpus)
            console.print(plan_line(plan_on_front(best, front)), markup=False, highlight=False)
    if emit is Target.K8S:  # the manifests run the engine the plan is priced for
        count = api.write_k8s_manifests(best, output, framework)
        # the command is pasted into a shell: quote the directory (a path with a space ran `kubectl apply -f a`)
        err.print(f"wrote {count} manifest(s) to {escape(str(output))}: kubectl apply -f {escape(shlex.quote(str(output)))}",
                  highlight=False)
    elif emit is not None:
        write_script(api.serve_launch_script(best, emit.value), output, json_out)
