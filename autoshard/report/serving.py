"""Terminal rendering of serving plans."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from autoshard.costmodel.bands import band_of, band_text, tie_text
from autoshard.costmodel.serve.ep_buffers import deepep_buffer_label
from autoshard.report.fit import add_columns, print_command
from autoshard.report.fit import table as compact_table
from autoshard.report.terminal import prune_table, solver_text
from autoshard.report.disagg import render_choice, render_roles
from autoshard.plans.serve import ServePlan
from autoshard.units import GIB

__all__ = ["render_serve_plan"]


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _where(plan: ServePlan) -> str:
    """"16 x H100-SXM5-80GB", or per role when a split plan's roles run on different GPU types."""
    gpus = {plan.cluster.pools[r.pool_index].gpu.name for r in plan.roles}
    if len(gpus) <= 1:
        return f"{plan.num_gpus:,} x {plan.pool.gpu.name}"
    return " + ".join(f"{r.gpus:,} x {plan.cluster.pools[r.pool_index].gpu.name} ({r.role})" for r in plan.roles)


def _deployment(plan: ServePlan) -> str:
    """What is deployed: the aggregated engines, or a split plan's prefill and decode instances (xPyD),
    each role with its own engine size and batch limit."""
    if not plan.roles:
        return (f"{plan.describe()} ({_n(plan.replicas, 'engine')} of {_n(plan.engine_gpus, 'GPU')}), max-num-seqs "
                f"{plan.max_num_seqs}, gpu-memory-utilization {plan.gpu_memory_utilization:.2f}")
    same = len({r.gpu_memory_utilization for r in plan.roles}) == 1
    roles = " + ".join(
        f"{_n(r.instances, r.role + ' instance')} of {_n(r.gpus_per_instance, 'GPU')} (max-num-seqs "
        f"{r.max_num_seqs}" + ("" if same else f", gpu-memory-utilization {r.gpu_memory_utilization:.2f}") + ")"
        for r in plan.roles)
    util = f", gpu-memory-utilization {plan.roles[0].gpu_memory_utilization:.2f}" if same else ""
    return f"{plan.describe()}\nprefill/decode split (xPyD): {roles} = {_n(plan.num_gpus, 'GPU')}{util}"


def render_serve_plan(plan: ServePlan, console: Console, *, runners: Sequence[ServePlan] = (), explain: bool = False,
                      time_limit_s: float | None = None) -> None:
    p, j = plan.prediction, plan.job
    mem = p.memory
    head = Text()
    idle = plan.cluster.num_gpus - plan.num_gpus  # whole engines leave the rest of the cluster unused
    head.append(f"{plan.model.name} serving on {_where(plan)} ({plan.cluster.name}"
                + (f"; {idle:,} of its {plan.cluster.num_gpus:,} GPUs idle" if idle > 0 else "") + ")\n", style="bold")
    head.append(_deployment(plan) + "\n", style="bold cyan")
    decode = "decode " if plan.roles else ""  # the figures below are the decode instances'
    head.append(f"requests: {j.input_len} in / {j.output_len} out tokens, max model length {plan.max_model_len}, "
                f"weights {j.weight_dtype.value}, KV cache {j.kv_cache_dtype.value}\n")
    per_gpu = f"{plan.tokens_per_s_per_gpu:,.0f} per GPU" + (
        f" used, {plan.throughput_tokens_per_s / plan.cluster.num_gpus:,.0f} per GPU of all {plan.cluster.num_gpus:,}"
        if idle > 0 else "")
    head.append(f"{plan.throughput_tokens_per_s:,.0f} output tokens/s ({per_gpu}) | "
                f"TPOT {1e3 * p.tpot_s:.1f} ms (p90 {1e3 * (p.tpot_p90_s or p.tpot_s):.1f}) | TTFT {plan.ttft_s:.2f} s "
                f"(p90 {plan.ttft_p90_s:.2f}) | {p.concurrency} running requests per {decode}DP rank\n",
                style="bold")
    head.append(band_text(plan) + "\n")
    # vLLM's "Maximum concurrency" is a ratio (242.98x): rounding it to 243 claimed a request more than fits
    head.append(f"KV cache {mem.kv_cache_bytes / GIB:.1f} GiB per {decode}GPU = {mem.kv_cache_tokens:,} tokens "
                f"(max concurrency {mem.max_concurrency:,.2f} at {mem.context_len:,} tokens)")
    lat = plan.latency_at_request_rate()
    if lat is not None:
        ttft = (f"TTFT p50 {lat.ttft_p50_s:.2f} s, p90 {lat.ttft_p90_s:.2f} s" if lat.utilization < 1
                else "TTFT unbounded (the request rate exceeds the engines' capacity)")
        head.append(f"\nat {j.request_rate:g} requests/s ({lat.utilization:.0%} of the slots busy): {ttft}, "
                    f"TPOT p50 {1e3 * lat.tpot_p50_s:.1f} ms, p90 {1e3 * lat.tpot_p90_s:.1f} ms")
    if not plan.meets_targets():
        head.append("\nDOES NOT MEET THE TARGETS", style="bold red")
    s = plan.solver
    if s.status != "EVALUATED":
        head.append(f"\n{solver_text(s, time_limit_s=time_limit_s)}; objective: {plan.objective_unit}")
    console.print(Panel(head, expand=False))
    render_roles(plan, console)
    render_choice(plan, console)
    table = compact_table(f"Memory per {decode}GPU")
    deepep = deepep_buffer_label(p.config)  # by the kernels the engine's line runs
    add_columns(table, "component|GiB:r")
    for name, value in (("weights", mem.weights_bytes), ("activations (profiled peak)", mem.activation_bytes),
                        ("CUDA graphs", mem.cuda_graph_bytes),
                        ("non-torch (context, NCCL)", mem.non_torch_bytes - mem.ep_buffer_bytes),
                        (deepep, mem.ep_buffer_bytes), ("KV cache", mem.kv_cache_bytes)):
        if value or name != deepep:
            table.add_row(name, f"{value / GIB:.1f}")
    table.add_section()  # the rows above fill the budget; what it leaves out makes them sum to the capacity
    util = mem.budget_bytes / mem.capacity_bytes if mem.capacity_bytes else 0.0
    table.add_row(f"budget ({util:.2f} of HBM)", f"{mem.budget_bytes / GIB:.1f}")
    table.add_row("outside the budget", f"{mem.headroom_bytes / GIB:.1f}")
    table.add_row("capacity", f"{mem.capacity_bytes / GIB:.1f}", style="bold")
    console.print(table)
    console.print()
    step = p.decode
    t = compact_table("Decode step (one TPOT)")
    add_columns(t, "component|ms:r")
    t.min_width = len(t.title)  # a title wider than the two columns wrapped ("Decode step (one" / "TPOT)")
    names = ("gemm_s", "attention_s", "elementwise_s", "logits_s")
    names += ("tp_comm_s", "ep_comm_s", "pp_comm_s", "host_s")
    for name in names:
        value = getattr(step, name, 0.0)
        if value:
            t.add_row(name.removesuffix("_s").replace("_", " "), f"{1e3 * value:.2f}")
    t.add_section()
    t.add_row("total", f"{1e3 * step.total_s:.2f}", style="bold")
    console.print(t)
    if runners:
        console.print()
        table = compact_table("Runner-up deployments")
        add_columns(table, "#:r|plan:w|tokens/s/GPU:r|TPOT ms:r|TTFT s:r|band:r")
        table.caption = "band: tied = its likely range overlaps the best deployment's (not reliably slower)"
        for i, other in enumerate(runners, start=2):
            table.add_row(str(i), other.describe(), f"{other.tokens_per_s_per_gpu:,.0f}",
                          f"{1e3 * other.prediction.tpot_s:.1f}", f"{other.prediction.ttft_s:.2f}", tie_text(other))
        console.print(table)
    if explain and s.pruned:
        console.print()
        console.print(prune_table(s.pruned))
    for w in plan.warnings:
        console.print(f"[yellow]note:[/yellow] {escape(w)}", highlight=False)
    for name in ("vllm", "sglang"):
        if name in plan.launch:
            console.print(f"\n[bold]{name} launch:[/bold]")
            print_command(console, plan.launch[name])


def alternative_text(plan: ServePlan, best: ServePlan | None = None) -> str:
    """The throughput-optimal alternative of an interactive-SLA plan in one line, with its band as the
    head line has one: "TP4 PP2 DP2, 16,064 output tokens/s (1,004 per GPU, likely 841-1,155), TPOT
    85.2 ms (likely 82.2-108.0), TTFT 0.15 s"; when it is the `best` plan itself, says so instead of
    printing it twice."""
    if best is not None and plan.describe() == best.describe() and \
            plan.throughput_tokens_per_s == best.throughput_tokens_per_s:
        return ("throughput-optimal without a TPOT target: this same deployment (the interactive SLA costs "
                "nothing here)")
    band, p = band_of(plan), plan.prediction
    lo, hi = (t / plan.num_gpus for t in band.tokens_per_s)
    tpot = f" (likely {1e3 * band.tpot_s[0]:.1f}-{1e3 * band.tpot_s[1]:.1f})" if band.tpot_s is not None else ""
    return (f"throughput-optimal alternative (no TPOT target): {plan.describe()}, {plan.throughput_tokens_per_s:,.0f} "
            f"output tokens/s ({plan.tokens_per_s_per_gpu:,.0f} per GPU, likely {lo:,.0f}-{hi:,.0f}), TPOT "
            f"{1e3 * p.tpot_s:.1f} ms{tpot}, TTFT {plan.ttft_s:.2f} s")
