"""Your plan next to the best one: gain, memory, and the launcher flags that change."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from autoshard.emit.megatron.args import megatron_args
from autoshard.plans.train import Plan
from autoshard.report.fit import print_command
from autoshard.report.terminal import plan_summary, solver_text
from autoshard.units import GIB

__all__ = ["compare_plans", "render_comparison"]

# Flags that describe the plan (not the model or scaffolding): the ones worth listing as changes.
_PLAN_FLAGS = (
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--sequence-parallel",
    "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", "--micro-batch-size",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--use-distributed-optimizer",
    "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--overlap-grad-reduce", "--overlap-param-gather",
    "--tp-comm-overlap", "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl",
)


def _flags(plan: Plan) -> dict[str, str]:
    return {flag: ("on" if value is None else value) for flag, value in megatron_args(plan) if flag in _PLAN_FLAGS}


def compare_plans(yours: Plan, best: Plan) -> dict:
    a, b = yours.prediction, best.prediction
    mine, theirs = _flags(yours), _flags(best)
    changes = []
    for flag in _PLAN_FLAGS:
        old, new = mine.get(flag, "off"), theirs.get(flag, "off")
        if old != new:
            changes.append({"flag": flag, "yours": old, "best": new})
    return {
        "yours_tokens_per_s": a.tokens_per_s,
        "best_tokens_per_s": b.tokens_per_s,
        "gain": b.tokens_per_s / a.tokens_per_s - 1,
        "yours_peak_gib": a.peak_memory_bytes / GIB,
        "best_peak_gib": b.peak_memory_bytes / GIB,
        "yours_fits": a.fits,
        "changes": changes,
    }


def render_comparison(yours: Plan, best: Plan, comparison: dict, console: Console, *,
                      time_limit_s: float | None = None) -> None:
    c = comparison
    fit = "" if c["yours_fits"] else " (DOES NOT FIT)"
    console.print(f"[bold]yours:[/bold] {plan_summary(yours)}: {c['yours_tokens_per_s']:,.0f} tokens/s, "
                  f"{c['yours_peak_gib']:.1f} GiB peak{fit}")
    console.print(f"[bold]best:[/bold]  {plan_summary(best)}: {c['best_tokens_per_s']:,.0f} tokens/s "
                  f"({100 * c['gain']:+.1f} %), {c['best_peak_gib']:.1f} GiB peak")
    console.print(escape(solver_text(best.solver, time_limit_s=time_limit_s)), highlight=False)
    if c["changes"]:
        console.print("change: " + ", ".join(f"{ch['flag']} {ch['yours']} -> {ch['best']}" for ch in c["changes"]),
                      markup=False, highlight=False)
    else:
        console.print("your plan is already the best one found")
    console.print("\n[bold]Megatron-LM launch of the best plan:[/bold]")
    print_command(console, best.launch.get("megatron", ""))
