"""Terminal rendering of plans and catalogs (rich). Reads plans; computes nothing new."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from autoshard.costmodel.bands import band_text, tie_text
from autoshard.costmodel.fp8 import quantized_peak_tflops
from autoshard.costmodel.sanity import sanity_line, useful_mfu
from autoshard.costmodel.train.step import stage_cost
from autoshard.plans.base import SolverStats
from autoshard.plans.train import Plan, layer_counts, stage_devices
from autoshard.report.fit import add_columns, print_command
from autoshard.report.fit import table as compact_table
from autoshard.report.gantt import draw_schedule
from autoshard.report.memory import memory_table
from autoshard.search.serve.messages import time_cut_text
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["render_plan", "render_models", "render_clusters", "schedule_chart", "plan_summary", "prune_table",
           "headline", "solver_text", "bubble_lines", "band_line", "schedule_text"]


def plan_summary(plan: Plan) -> str:
    cfg = plan.config
    parts = [cfg.dims.describe(), f"mbs {cfg.micro_batch_size}", f"recompute {cfg.recompute.value}"]
    if plan.recompute_num_layers:  # Megatron's block method: N layers per stage fully, the rest as `recompute`
        parts[-1] = (f"recompute full on {plan.recompute_num_layers} layers/stage"
                     + ("" if cfg.recompute.value == "none" else f", {cfg.recompute.value} on the rest"))
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
    table = compact_table("Step time breakdown")
    add_columns(table, "component|seconds:r|share:r")
    rows = [("compute", t.compute), ("  of which recompute", t.recompute), ("tensor-parallel comm", t.tp_comm),
            ("context-parallel comm", t.cp_comm), ("expert-parallel comm", t.ep_comm), ("pipeline p2p", t.pp_comm),
            ("pipeline bubble", t.bubble), ("data-parallel comm (exposed)", t.dp_comm_exposed),
            ("optimizer step", t.optimizer)]
    for name, value in rows:
        if value == 0 and name.startswith(("  of", "context", "expert")):
            continue
        table.add_row(name, f"{value:.3f}", f"{100 * value / pred.step_time_s:.1f}%")
        if name.startswith("expert") and t.ep_comm_hidden:  # informational: not part of the step
            table.add_row("  hidden by the A2A overlap", f"{t.ep_comm_hidden:.3f}", "-")
    table.add_section()
    table.add_row("step", f"{pred.step_time_s:.3f}", "100%", style="bold")
    return table


def _stage_table(plan: Plan) -> Table:
    pred = plan.prediction
    devices = stage_devices(plan.cluster, plan.config, plan.stages)
    table = compact_table("Layer layout")
    add_columns(table, "chunk:r|rank:r|layers:w|dec:r|recomp:r|ms/mb:r|GiB:r|GPUs")
    table.caption = ("dec: decoder layers; recomp: of them fully recomputed; ms/mb: forward + backward of one "
                     "micro-batch; GiB: peak of the rank")
    pp = plan.config.dims.pp
    for i, stage in enumerate(plan.stages):
        dec, _, _ = layer_counts(plan.model, stage)
        cost = stage_cost(plan.model, stage, plan.cluster.pools[stage.pool], plan.config)
        table.add_row(str(i), str(i % pp), _layer_span(plan, i), str(dec), str(stage.full_recompute_layers),
                      f"{cost.time_s * 1e3:.1f}", f"{pred.rank_memory_bytes[i % pp] / GIB:.1f}", Text(devices[i]))
    return table


def _wrap(text: str, width: int, indent: str = "") -> str:
    return "\n".join(textwrap.wrap(text, width=width, subsequent_indent=indent, break_on_hyphens=False,
                                   break_long_words=False))


def _pct(x: float) -> str:
    return f"{100 * x:.3g} %"


def bubble_lines(plan: Plan) -> list[str]:
    """The bubble the cost model charges, with its formula, beside the textbook values."""
    cfg, pred = plan.config, plan.prediction
    p, v, m = cfg.dims.pp, cfg.dims.vpp, cfg.num_microbatches
    times = pred.rank_time_s
    slowest = max(times)
    bubble_s = (sum(times) - slowest) / v
    frac = bubble_s / (m * slowest)
    even = max(times) - min(times) <= 1e-9 * slowest
    if even:
        model = f"(p-1)/(v*m) = {p - 1}/({v}*{m}) = {_pct(frac)}" if v > 1 else f"(p-1)/m = {p - 1}/{m} = {_pct(frac)}"
    else:
        model = (f"(sum T_r - max T_r)/(v*m*max T_r) = ({1e3 * sum(times):.1f} - {1e3 * slowest:.1f})/"
                 f"({v}*{m}*{1e3 * slowest:.1f}) ms = {_pct(frac)}")
    lines = [f"bubble (cost model): {model} of the busy time, {bubble_s:.3f} s per step"]
    if cfg.moe_a2a_overlap:
        lines.append(f"drawn and counted unpaired: the EP all-to-all overlap hides {pred.time.ep_comm_hidden:.3f} s of "
                     "EP traffic per step under the paired forwards and backwards (the step table), which the chart "
                     "and the idle shares leave in")
    text = f"textbook, equal stages: GPipe/1F1B (p-1)/m = {_pct((p - 1) / m)}"
    if v > 1:
        text += f"; interleaved (p-1)/(v*m) = {_pct((p - 1) / (v * m))}"
    lines.append(text)
    if not even:
        lines.append("T_r: one micro-batch through pipeline rank r (forward + backward + p2p); stages differ, so "
                     "the slowest sets the pace and the others wait")
    return lines


def schedule_chart(plan: Plan, *, width: int = 100) -> str:
    """The pipeline schedule of the plan: warm-up, one steady-state period and the cool-down (the
    repeated periods cut at `//`), each rank's idle share, and the bubble the cost model charges."""
    return schedule_text(plan, width=width).plain


_CHUNK_STYLES = ("", "cyan", "magenta", "yellow")


def schedule_text(plan: Plan, *, width: int = 100) -> Text:
    """`schedule_chart` as rich text: on a colour terminal the model chunks of an interleaved
    schedule alternate in colour (the shading of Narayanan et al.'s Fig. 4)."""
    cfg, pred = plan.config, plan.prediction
    pp, vpp, m = cfg.dims.pp, cfg.dims.vpp, cfg.num_microbatches
    if pp == 1:
        return Text("no pipeline parallelism (PP 1): every GPU runs all layers, there is no pipeline bubble")
    fwd, bwd = [], []
    for stage in plan.stages:
        cost = stage_cost(plan.model, stage, plan.cluster.pools[stage.pool], plan.config)
        fwd.append(cost.time_s / 3)
        bwd.append(2 * cost.time_s / 3)
    times = pred.rank_time_s
    step = m * max(times) + (sum(times) - max(times)) / vpp
    idle = [1 - m * t / step for t in times]
    # numbered bands while the chart stays within about 40 rows; beyond, one scaled-down band
    chart = draw_schedule(fwd, bwd, pp=pp, vpp=vpp, m=m, width=width, idle=idle, max_bands=max(1, min(6, 40 // pp)))
    kind = f"interleaved 1F1B, PP {pp} x VPP {vpp}" if vpp > 1 else f"1F1B, PP {pp}"
    head = [f"Pipeline schedule ({kind}, {m} micro-batches, numbered from 1)"]
    legend = "12 = forward of micro-batch 12, b12=== = its backward, . = idle"
    if vpp > 1:
        legend += f"; each rank runs its {vpp} model chunks in turn (in colour on a colour terminal)"
    if not chart.labelled:
        legend += "; - and = forward and backward too short to number"
    head.append(legend)
    if chart.omitted_periods:
        n, k = chart.omitted_periods, chart.period_microbatches
        what = "one micro-batch" if k == 1 else f"{k} micro-batches through each of its chunks"
        head.append(f"// = {n} identical steady-state periods left out (per period each rank runs {what}, "
                    f"forward and backward); after it, the real last micro-batches")
    head.append("right: share of the step each rank is idle")
    out = Text("\n".join(_wrap(h, width, "  ") for h in head) + "\n")
    for row, owner in zip(chart.rows, chart.chunks, strict=True):
        line = Text(row)
        for i, c in enumerate(owner):
            if c > 0:
                line.stylize(_CHUNK_STYLES[c % len(_CHUNK_STYLES)], i, i + 1)
        out.append_text(line)
        out.append("\n")
    out.append("\n".join(_wrap(b, width, "  ") for b in bubble_lines(plan)))
    return out


def prune_table(pruned: dict[str, int]) -> Table:
    """Why the search discarded candidates, most frequent reason first (`--explain`)."""
    table = compact_table("Why candidates were discarded")
    add_columns(table, "reason:w|count:r")
    for reason, count in sorted(pruned.items(), key=lambda kv: -kv[1]):
        table.add_row(reason, str(count))
    return table


def _gap(gap: float) -> str:
    return f"{100 * gap:.2g} %" if gap < 0.01 else f"{100 * gap:.1f} %"


def solver_text(stats: SolverStats, *, unit: str = "s", time_limit_s: float | None = None) -> str:
    """What the solver proved, never contradicting itself: "optimal" only when the bound meets the
    objective; otherwise the gap (never shown as 0.00 %) and why the search stopped."""
    limit = f" of a {time_limit_s:g} s limit" if time_limit_s is not None else ""
    wall = f"{stats.wall_s:.2f} s wall{limit}"
    if cut := time_cut_text(stats.pruned):  # a serving solve's tables were cut short: no bound on the rest
        limit = f"the {time_limit_s:g} s time limit" if time_limit_s is not None else "the time limit"
        return f"solver: best of what was tabulated, not proven optimal ({limit} ran out with {cut}, no bound on them), {wall}"
    if stats.gap <= 1e-12:
        how = "proven by CP-SAT" if stats.status == "OPTIMAL" else "the bound meets the objective"
        return f"solver: optimal ({how}), {wall}"
    why = _stop_text(stats, time_limit_s)
    u = f" {unit}" if unit else ""
    return (f"solver: best found, not proven optimal: objective {stats.objective:,.4g}{u}, bound "
            f"{stats.bound:,.4g}{u}, gap {_gap(stats.gap)} ({why}), {wall}")


def _stop_text(stats: SolverStats, time_limit_s: float | None) -> str:
    """Why a search stopped with the bound open, from the reason the solver recorded."""
    reason = stats.stop_reason
    if reason == "time_limit":
        limit = f"the {time_limit_s:g} s time limit" if time_limit_s is not None else "the time limit"
        return f"{limit} ran out before the bound closed"
    if reason == "gap_limit":
        return f"CP-SAT stopped within its {_gap(stats.gap_limit)} relative gap limit"
    if reason == "relaxed":
        return ("the solver's tables count the A2A overlap's traffic as hidden on every micro-batch of near-even "
                "chunks, a bound below this step")
    if reason == "model_cap":
        return "candidates left out of the CP-SAT model by its size cap keep a lower bound below this plan"
    return "the search stopped before the bound closed"


def _peak_text(plan: Plan) -> str:
    """Which dense peak the MFU is measured against."""
    pred, cfg = plan.prediction, plan.config
    gpus = [plan.cluster.pools[plan.stages[r].pool].gpu for r in range(cfg.dims.pp)]
    kinds = {cfg.precision.value.upper() if quantized_peak_tflops(g, cfg.precision) else "BF16" for g in gpus}
    peak = pred.tflops_per_gpu / pred.mfu if pred.mfu else 0.0
    mean = "mean " if len({g.name for g in gpus}) > 1 else ""
    return f"of the {peak:,.0f} TFLOP/s {mean}{'/'.join(sorted(kinds))} dense peak"


def band_line(plan: Plan) -> str:
    """`likely lo-hi tokens/s` from the plan's prediction band, or "" when it has none."""
    return "" if getattr(plan, "band", None) is None else band_text(plan)


def headline(plan: Plan, *, time_limit_s: float | None = None) -> Text:
    """The head of the report: what runs where, the speed (with the band when there is one), which
    peak the MFU is measured against, memory, and what the solver proved."""
    pred, cfg = plan.prediction, plan.config
    used = sorted({s.pool for s in plan.stages})
    per_rank = cfg.dims.tp * cfg.dims.cp * cfg.dims.dp
    gpus = " + ".join(
        f"{per_rank * sum(1 for r in range(cfg.dims.pp) if plan.stages[r].pool == q)} x {plan.cluster.pools[q].gpu.name}"
        for q in used)
    head = Text()
    head.append(f"{plan.model.name} on {gpus} ({plan.cluster.name})\n", style="bold")
    head.append(plan_summary(plan) + "\n", style="bold cyan")
    seqs, mbs = cfg.global_batch_size, cfg.num_microbatches  # "1 micro-batches" read wrong
    head.append(f"seq {cfg.seq_len}, global batch {seqs} sequence{'s' * (seqs != 1)}, {mbs} "
                f"micro-batch{'es' * (mbs != 1)}, {cfg.precision.value}\n")
    speed = f"step {pred.step_time_s:.3f} s | {pred.tokens_per_s:,.0f} tokens/s ({pred.tokens_per_s_per_gpu:,.0f} per GPU)"
    band = band_line(plan)
    if band:
        speed += f", {band}"
    head.append(speed + "\n", style="bold")
    useful = useful_mfu(plan)  # long context: Megatron's MFU counts the whole s x s attention square
    causal = f" (useful {100 * useful:.1f} %: causal attention counted once)" if useful < 0.9 * pred.mfu else ""
    head.append(f"{pred.tflops_per_gpu:,.0f} model TFLOP/s per GPU ({pred.hw_tflops_per_gpu:,.0f} with recompute) | "
                f"MFU {100 * pred.mfu:.1f} % {_peak_text(plan)}{causal}\n", style="bold")
    fit = "fits" if pred.fits else "DOES NOT FIT"
    memory = (f"memory: peak {pred.peak_memory_bytes / GIB:.1f} GiB of {pred.capacity_bytes / GIB:.1f} GiB "
              f"({fit})")
    if (band := getattr(plan, "band", None)) is not None:
        lo, hi = band.memory_gib_peak  # the JSON's predicted.band.memory_gib_peak
        memory += f", likely {lo:.1f}-{hi:.1f} GiB"
    head.append(memory, style="green" if pred.fits else "bold red")
    s = plan.solver
    if s.status != "EVALUATED":
        head.append("\n" + solver_text(s, time_limit_s=time_limit_s) +
                    f"; {s.candidates:,} candidates, {s.candidates_in_model:,} in the CP-SAT model")
    return head


def render_plan(plan: Plan, console: Console, *, runners: Sequence[Plan] = (), show_schedule: bool = False,
                explain: bool = False, notes: Sequence[str] = (), time_limit_s: float | None = None) -> None:
    pred = plan.prediction
    console.print(Panel(headline(plan, time_limit_s=time_limit_s), expand=False))
    if (warning := sanity_line(plan)) is not None:
        console.print(f"[bold yellow]warning:[/bold yellow] {escape(warning)}", highlight=False)
    console.print(_time_table(plan))
    console.print()
    console.print(memory_table(plan))
    console.print()
    console.print(_stage_table(plan))
    if runners:
        console.print()
        table = compact_table("Runner-up plans")
        add_columns(table, "#:r|plan:w|step s:r|tok/s/GPU:r|MFU:r|GiB:r|vs best:r|band:r")
        table.caption = "band: tied = its likely range overlaps the best plan's (not reliably slower)"
        for i, other in enumerate(runners, start=2):
            p = other.prediction
            table.add_row(str(i), plan_summary(other), f"{p.step_time_s:.3f}", f"{p.tokens_per_s_per_gpu:,.0f}",
                          f"{100 * p.mfu:.1f}%", f"{p.peak_memory_bytes / GIB:.1f}",
                          f"{100 * (p.step_time_s / pred.step_time_s - 1):+.1f}%", tie_text(other))
        console.print(table)
    if explain and plan.solver.pruned:
        console.print()
        console.print(prune_table(plan.solver.pruned))
    if show_schedule:
        console.print()
        console.print(schedule_text(plan, width=console.width), highlight=False, soft_wrap=True)
    for note in (*pred.notes, *notes):  # the prediction's own (borrowed efficiencies, unmeasured regimes) first
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if plan.config.fp8_attention:
        console.print("[yellow]note:[/yellow] no Megatron-LM launch: it has no flag for FP8 attention (set "
                      "fp8_dot_product_attention through NeMo or Megatron-Bridge)")
    if "megatron" in plan.launch:
        command = plan.launch["megatron"]
        console.print(f"\n[bold]Megatron-LM launch[/bold] (fill {', '.join(command_variables(command))}):")
        print_command(console, command)


def command_variables(command: str) -> list[str]:
    """The shell variables a launch command reads ("$NODE_RANK", "${DATA_PATH}"), in order of first use:
    what the user fills in (a one-node command has no MASTER_ADDR/NODE_RANK, every one has CKPT_DIR)."""
    return list(dict.fromkeys(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", command)))


def render_models(models: Sequence[tuple[str, ModelSpec]], console: Console) -> None:
    table = compact_table("Bundled models")
    add_columns(table, "name|params:r|active:r|layers:r|hidden:r|heads/kv:r|vocab:r|kind:w")
    table.caption = "params, active: billions (active: per token, for MoE); kind: MoE experts e, top-k routed"
    for name, m in models:
        kind = "MoE" if m.is_moe else "dense"
        if m.mla is not None:
            kind += " MLA"
        if m.moe is not None:
            kind += f" {m.moe.num_experts}e top{m.moe.top_k}"
        table.add_row(name, f"{m.num_params / 1e9:.1f}", f"{m.num_active_params / 1e9:.1f}", str(m.num_layers),
                      str(m.hidden_size), f"{m.num_attention_heads}/{m.kv_heads}", str(m.vocab_size), kind)
    console.print(table)


_LINK_MARK = {"pcie": "p", "infinity_fabric": "i"}
"""The `clusters` table's mark after a fast domain that is not NVLink: its GPUs share PCIe or Infinity Fabric."""


def render_clusters(clusters: Sequence[tuple[str, ClusterSpec]], console: Console) -> None:
    table = compact_table("Bundled clusters")
    add_columns(table, "name|GPUs:r|GPU|HBM:r|BF16:r|FP8:r|dom:r|intra:r|net:r|$/h:r")
    table.caption = ("HBM: GiB per GPU; BF16, FP8: dense TFLOP/s per GPU; dom: GPUs per NVLink domain (p: per "
                     "PCIe node, i: per Infinity Fabric node); intra: GB/s per GPU inside it; net: GB/s per GPU "
                     "between nodes; $/h: USD per GPU-hour")
    for name, c in clusters:
        for i, pool in enumerate(c.pools):
            g, n = pool.gpu, pool.node
            table.add_row(name if i == 0 else "", str(pool.num_gpus), g.name, f"{g.hbm_gib:.0f}", f"{g.bf16_tflops:.0f}",
                          f"{g.fp8_tflops:.0f}" if g.fp8_tflops else "-",
                          f"{n.domain_size}{_LINK_MARK.get(n.intra_node_link.value, '')}", f"{n.intra_node_gbps:.0f}",
                          f"{n.inter_node_gbps:.1f}", f"{pool.price_per_gpu_hour:.2f}" if pool.price_per_gpu_hour else "-")
    console.print(table)
