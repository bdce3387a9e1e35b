"""Terminal rendering of serving plans."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from autoshard.report.terminal import prune_table
from autoshard.serve_plan import ServePlan
from autoshard.units import GIB

__all__ = ["render_serve_plan"]


def render_serve_plan(plan: ServePlan, console: Console, *, runners: Sequence[ServePlan] = (), explain: bool = False) -> None:
    p, j = plan.prediction, plan.job
    mem = p.memory
    head = Text()
    head.append(f"{plan.describe()} ({plan.replicas} engine(s) of {plan.engine_gpus} GPUs), max-num-seqs "
                f"{plan.max_num_seqs}, gpu-memory-utilization {plan.gpu_memory_utilization:.2f}\n", style="bold cyan")
    head.append(f"requests: {j.input_len} in / {j.output_len} out tokens, max model length {plan.max_model_len}, "
                f"weights {j.weight_dtype.value}, KV cache {j.kv_cache_dtype.value}\n")
    head.append(f"{plan.throughput_tokens_per_s:,.0f} output tokens/s ({plan.tokens_per_s_per_gpu:,.0f} per GPU) | "
                f"TPOT {1e3 * p.tpot_s:.1f} ms | TTFT {p.ttft_s:.2f} s | {p.concurrency} running requests per DP rank\n",
                style="bold")
    head.append(f"KV cache {mem.kv_cache_bytes / GIB:.1f} GiB per GPU = {mem.kv_cache_tokens:,} tokens "
                f"(max concurrency {mem.max_concurrency:.0f} at {mem.context_len} tokens)")
    if not plan.meets_targets():
        head.append("\nDOES NOT MEET THE TARGETS", style="bold red")
    s = plan.solver
    if s.status != "EVALUATED":
        head.append(f"\nsolver: {s.status}, objective {s.objective:,.1f} ({plan.objective_unit}), bound {s.bound:,.1f}, "
                    f"gap {100 * s.gap:.2f}%, {s.wall_s:.2f} s wall")
    title = f"{plan.model.name} serving on {plan.num_gpus} x {plan.pool.gpu.name} ({plan.cluster.name})"
    console.print(Panel(head, title=Text(title), expand=False))
    table = Table(title="Memory per GPU (GiB)", header_style="bold")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    for name, value in (("weights", mem.weights_bytes), ("activations (profiled peak)", mem.activation_bytes),
                        ("CUDA graphs", mem.cuda_graph_bytes), ("non-torch (context, NCCL)", mem.non_torch_bytes),
                        ("KV cache", mem.kv_cache_bytes)):
        table.add_row(name, f"{value / GIB:.1f}")
    table.add_row("capacity", f"{mem.capacity_bytes / GIB:.1f}")
    console.print(table)
    step = p.decode
    t = Table(title="Decode step (one TPOT)", header_style="bold")
    t.add_column("component")
    t.add_column("ms", justify="right")
    for name in ("gemm_s", "attention_s", "elementwise_s", "logits_s", "tp_comm_s", "ep_comm_s", "pp_comm_s"):
        value = getattr(step, name, 0.0)
        if value:
            t.add_row(name.removesuffix("_s").replace("_", " "), f"{1e3 * value:.2f}")
    console.print(t)
    if runners:
        table = Table(title="Runner-up deployments", header_style="bold")
        for col in ("#", "plan", "tokens/s/GPU", "TPOT ms", "TTFT s"):
            table.add_column(col, justify="left" if col == "plan" else "right")
        for i, other in enumerate(runners, start=2):
            table.add_row(str(i), other.describe(), f"{other.tokens_per_s_per_gpu:,.0f}",
                          f"{1e3 * other.prediction.tpot_s:.1f}", f"{other.prediction.ttft_s:.2f}")
        console.print(table)
    if explain and s.pruned:
        console.print(prune_table(s.pruned))
    for w in plan.warnings:
        console.print(f"[yellow]note:[/yellow] {escape(w)}", highlight=False)
    for name in ("vllm", "sglang"):
        if name in plan.launch:
            console.print(f"\n[bold]{name} launch:[/bold]")
            console.print(plan.launch[name], markup=False, highlight=False, soft_wrap=True)
