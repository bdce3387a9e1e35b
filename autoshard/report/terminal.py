"""Terminal rendering of plans and catalogs (rich). Reads plans; computes nothing new."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from autoshard.costmodel.training import stage_cost
from autoshard.plan import Plan, layer_counts, stage_devices
from autoshard.report.gantt import render_gantt, simulate
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["render_plan", "render_models", "render_clusters", "schedule_chart", "plan_summary", "prune_table"]


def plan_summary(plan: Plan) -> str:
    cfg = plan.config
    parts = [cfg.dims.describe(), f"mbs {cfg.micro_batch_size}", f"recompute {cfg.recompute.value}"]
    if plan.recompute_num_layers:
        parts.append(f"+{plan.recompute_num_layers} full/stage")
    if cfg.sp:
        parts.append("SP")
    parts.append(f"ZeRO-{cfg.zero_stage}")
    return ", ".join(parts)


def _layer_span(plan: Plan, index: int) -> str:
    stage = plan.stages[index]
    names = plan.model.layer_names[stage.start:stage.stop]
    dec = [n for n in names if n.startswith("decoder.")]
    parts = []
    if "embedding" in names:
        parts.append("embedding")
    if dec:
        first, last = dec[0].split(".")[1], dec[-1].split(".")[1]
        parts.append(f"decoder {first}" if first == last else f"decoder {first}-{last}")
    if "output" in names:
        parts.append("output")
    return " + ".join(parts)


def _time_table(plan: Plan) -> Table:
    pred = plan.prediction
    t = pred.time
    table = Table(title="Step time breakdown", show_header=True, header_style="bold")
    table.add_column("component")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    rows = [("compute", t.compute), ("  of which recompute", t.recompute), ("tensor-parallel comm", t.tp_comm),
            ("context-parallel comm", t.cp_comm), ("expert-parallel comm", t.ep_comm), ("pipeline p2p", t.pp_comm),
            ("pipeline bubble", t.bubble), ("data-parallel comm (exposed)", t.dp_comm_exposed),
            ("optimizer step", t.optimizer)]
    for name, value in rows:
        if value == 0 and name.startswith(("  of", "context", "expert")):
            continue
        table.add_row(name, f"{value:.3f}", f"{100 * value / pred.step_time_s:.1f}%")
    table.add_row("[bold]step[/bold]", f"[bold]{pred.step_time_s:.3f}[/bold]", "100%")
    return table


def _memory_table(plan: Plan) -> Table:
    pred = plan.prediction
    m = pred.memory
    table = Table(title="Memory of the fullest GPU (GiB)", header_style="bold")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    for name, value in (("weights", m.weights), ("gradients", m.grads), ("optimizer state", m.optimizer),
                        ("activations", m.activations), ("KV cache", m.kv_cache), ("context, NCCL, fragmentation", m.overhead)):
        if value or name != "KV cache":
            table.add_row(name, f"{value / GIB:.1f}")
    style = "bold green" if pred.fits else "bold red"
    table.add_row(f"[{style}]peak / capacity[/{style}]",
                  f"[{style}]{pred.peak_memory_bytes / GIB:.1f} / {pred.capacity_bytes / GIB:.1f}[/{style}]")
    return table


def _stage_table(plan: Plan) -> Table:
    pred = plan.prediction
    devices = stage_devices(plan.cluster, plan.config, plan.stages)
    table = Table(title="Layer layout", header_style="bold")
    for col, just in (("chunk", "right"), ("rank", "right"), ("layers", "left"), ("dec", "right"),
                      ("recomp", "right"), ("ms/mb", "right"), ("GiB", "right"), ("GPUs", "left")):
        table.add_column(col, justify=just, no_wrap=True)
    table.caption = "dec: decoder layers; recomp: fully recomputed; ms/mb: per micro-batch; GiB: peak of the rank"
    pp = plan.config.dims.pp
    for i, stage in enumerate(plan.stages):
        dec, _, _ = layer_counts(plan.model, stage)
        cost = stage_cost(plan.model, stage, plan.cluster.pools[stage.pool], plan.config)
        table.add_row(str(i), str(i % pp), _layer_span(plan, i), str(dec), str(stage.full_recompute_layers),
                      f"{cost.time_s * 1e3:.1f}", f"{pred.rank_memory_bytes[i % pp] / GIB:.1f}", Text(devices[i]))
    return table


def schedule_chart(plan: Plan, *, width: int = 100, max_microbatches: int = 16) -> str:
    """The pipeline schedule of the plan (at most `max_microbatches` micro-batches drawn)."""
    cfg = plan.config
    pp, vpp = cfg.dims.pp, cfg.dims.vpp
    m = min(cfg.num_microbatches, max(max_microbatches, pp))
    if vpp > 1:
        m = max(pp, m - m % pp)
    fwd, bwd = [], []
    for stage in plan.stages:
        cost = stage_cost(plan.model, stage, plan.cluster.pools[stage.pool], plan.config)
        fwd.append(cost.time_s / 3)
        bwd.append(2 * cost.time_s / 3)
    ops = simulate(fwd, bwd, pp=pp, vpp=vpp, m=m)
    kind = "interleaved 1F1B" if vpp > 1 else "1F1B"
    head = (f"{kind}: PP {pp}" + (f" x VPP {vpp}" if vpp > 1 else "") +
            f", {m} of {cfg.num_microbatches} micro-batches drawn; digits = forward, letters = backward, '.' = bubble")
    return head + "\n" + render_gantt(ops, pp=pp, width=width)


def prune_table(pruned: dict[str, int]) -> Table:
    """Why the search discarded candidates, most frequent reason first (`--explain`)."""
    table = Table(title="Why candidates were discarded", header_style="bold")
    table.add_column("reason")
    table.add_column("count", justify="right")
    for reason, count in sorted(pruned.items(), key=lambda kv: -kv[1]):
        table.add_row(reason, str(count))
    return table


def render_plan(plan: Plan, console: Console, *, runners: Sequence[Plan] = (), show_schedule: bool = False,
                explain: bool = False, notes: Sequence[str] = ()) -> None:
    pred = plan.prediction
    cfg = plan.config
    used = sorted({s.pool for s in plan.stages})
    per_rank = cfg.dims.tp * cfg.dims.cp * cfg.dims.dp
    gpus = " + ".join(
        f"{per_rank * sum(1 for r in range(cfg.dims.pp) if plan.stages[r].pool == q)} x {plan.cluster.pools[q].gpu.name}"
        for q in used)
    title = f"{plan.model.name} on {gpus} ({plan.cluster.name})"
    head = Text()
    head.append(plan_summary(plan) + "\n", style="bold cyan")
    head.append(f"seq {cfg.seq_len}, global batch {cfg.global_batch_size} sequences, {cfg.num_microbatches} micro-batches, "
                f"{cfg.precision.value}\n")
    head.append(f"step {pred.step_time_s:.3f} s | {pred.tokens_per_s:,.0f} tokens/s ({pred.tokens_per_s_per_gpu:,.0f} per GPU) | "
                f"{pred.tflops_per_gpu:.0f} model TFLOP/s per GPU ({pred.hw_tflops_per_gpu:.0f} with recompute) | "
                f"MFU {100 * pred.mfu:.1f}%\n", style="bold")
    fit = "fits" if pred.fits else "DOES NOT FIT"
    head.append(f"memory: peak {pred.peak_memory_bytes / GIB:.1f} GiB of {pred.capacity_bytes / GIB:.1f} GiB ({fit})",
                style="green" if pred.fits else "bold red")
    s = plan.solver
    if s.status != "EVALUATED":
        head.append(f"\nsolver: {s.status} objective {s.objective:.4f} s, bound {s.bound:.4f} s, gap {100 * s.gap:.2f}%, "
                    f"{s.wall_s:.2f} s wall, {s.candidates} candidates, {s.candidates_in_model} in the CP-SAT model")
    console.print(Panel(head, title=Text(title), expand=False))
    console.print(Group(_time_table(plan), _memory_table(plan)))
    console.print(_stage_table(plan))
    if runners:
        table = Table(title="Runner-up plans", header_style="bold")
        for col in ("#", "plan", "step s", "tokens/s/GPU", "MFU", "peak GiB", "vs best"):
            table.add_column(col, justify="right" if col not in ("plan",) else "left")
        for i, other in enumerate(runners, start=2):
            p = other.prediction
            table.add_row(str(i), plan_summary(other), f"{p.step_time_s:.3f}", f"{p.tokens_per_s_per_gpu:,.0f}",
                          f"{100 * p.mfu:.1f}%", f"{p.peak_memory_bytes / GIB:.1f}",
                          f"{100 * (p.step_time_s / pred.step_time_s - 1):+.1f}%")
        console.print(table)
    if explain and s.pruned:
        console.print(prune_table(s.pruned))
    if show_schedule:
        width = max(40, min(120, console.width - 24))
        console.print(schedule_chart(plan, width=width), markup=False, highlight=False, soft_wrap=True)
    for note in notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if "megatron" in plan.launch:
        console.print("\n[bold]Megatron-LM launch[/bold] (fill MASTER_ADDR, NODE_RANK, DATA_PATH, TOKENIZER_MODEL):")
        console.print(plan.launch["megatron"], markup=False, highlight=False, soft_wrap=True)


def render_models(models: Sequence[tuple[str, ModelSpec]], console: Console) -> None:
    table = Table(title="Bundled models", header_style="bold")
    for col in ("name", "params", "active", "layers", "hidden", "heads/kv", "vocab", "kind"):
        table.add_column(col, justify="left" if col in ("name", "kind") else "right", no_wrap=col == "name")
    for name, m in models:
        kind = "MoE" if m.is_moe else "dense"
        if m.mla is not None:
            kind += " MLA"
        if m.moe is not None:
            kind += f" {m.moe.num_experts}e top{m.moe.top_k}"
        table.add_row(name, f"{m.num_params / 1e9:.1f} B", f"{m.num_active_params / 1e9:.1f} B", str(m.num_layers),
                      str(m.hidden_size), f"{m.num_attention_heads}/{m.kv_heads}", str(m.vocab_size), kind)
    console.print(table)


def render_clusters(clusters: Sequence[tuple[str, ClusterSpec]], console: Console) -> None:
    table = Table(title="Bundled clusters", header_style="bold")
    for col in ("name", "GPUs", "GPU", "HBM GiB", "BF16 TFLOP/s", "FP8", "NVLink domain", "intra GB/s", "net GB/s/GPU", "$/GPU-h"):
        table.add_column(col, justify="left" if col in ("name", "GPU") else "right", no_wrap=col == "name")
    for name, c in clusters:
        for i, pool in enumerate(c.pools):
            g, n = pool.gpu, pool.node
            table.add_row(name if i == 0 else "", str(pool.num_gpus), g.name, f"{g.hbm_gib:.0f}", f"{g.bf16_tflops:.0f}",
                          f"{g.fp8_tflops:.0f}" if g.fp8_tflops else "-", str(n.domain_size), f"{n.intra_node_gbps:.0f}",
                          f"{n.inter_node_gbps:.1f}", f"{pool.price_per_gpu_hour:.2f}" if pool.price_per_gpu_hour else "-")
    console.print(table)
