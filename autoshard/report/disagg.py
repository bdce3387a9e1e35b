"""Terminal rendering of a disaggregated (xPyD) serving plan: its roles, the KV hand-off, and why the
planner chose this kind of deployment."""

from __future__ import annotations

from rich.console import Console

from autoshard.report.fit import table as fit_table

from autoshard.plans.serve import ServePlan
from autoshard.units import GIB

__all__ = ["render_roles", "render_choice"]


def render_roles(plan: ServePlan, console: Console) -> None:
    """The prefill and decode roles, one row each, and the KV transfer line."""
    if not plan.roles or plan.disaggregation is None:
        return
    table = fit_table("Prefill / decode roles (n instances; req/s and batch per instance)")
    pools = plan.cluster.is_heterogeneous
    # n: instances, aDP: attention DP ranks, req/s: what one instance sustains, GiB: memory per GPU
    cols = ("role", "n", "TP", "PP", "EP", "aDP", "GPUs", "batch", "req/s", "load", "GiB") + (
        ("pool",) if pools else ()
    )
    for col in cols:
        table.add_column(
            col,
            justify="left" if col in ("role", "pool") else "right",
            min_width=7 if col == "role" else None,
            no_wrap=True,  # numbers and pool names whole; the compact table fits 12 columns in 80
        )
    for r in plan.roles:
        where = (plan.cluster.pools[r.pool_index].name,) if pools else ()
        table.add_row(
            r.role,
            str(r.instances),
            str(r.tp),
            str(r.pp),
            str(r.ep),
            str(r.attention_dp),
            str(r.gpus),
            str(r.max_batch),
            f"{r.requests_per_s:,.2f}",
            f"{100 * r.utilization:.0f}%",
            f"{r.prediction.memory.used_bytes / GIB:.1f}",
            *where,
        )
    console.print(table)
    t = plan.disaggregation.transfer
    console.print(
        f"KV hand-off: {t.bytes_per_request / GIB * 1024:,.0f} MiB per request over "
        f"{'the inter-pool network' if len({r.pool_index for r in plan.roles}) > 1 else t.link} "
        f"({t.streams} link(s) in parallel), {1e3 * t.seconds:.2f} ms; TTFT {plan.ttft_s:.2f} s = prefill "
        f"queue + prompt + transfer + first decode step",
        highlight=False,
    )


def render_choice(plan: ServePlan, console: Console) -> None:
    """Why aggregated or disaggregated (set by `--disaggregate auto`)."""
    if plan.choice:
        console.print(f"[bold]deployment kind:[/bold] {plan.choice}", highlight=False)
