"""The serving report's tables add up: the memory rows sum to the GPU's capacity, the decode-step rows
to their total (the head's TPOT), and the KV cache's max concurrency is vLLM's ratio, not rounded up."""

from __future__ import annotations

import re

import pytest

from autoshard.api import serve_job_for, solve_serve
from autoshard.report.serving import render_serve_plan
from autoshard.specs import load_cluster, load_model
from autoshard.units import GIB
from report_fixtures import render, assert_fits  # noqa: F401  (pytest fixtures)


@pytest.fixture(scope="module")
def plan_70b():
    """Llama 3.1 70B on one 8 x H100 node: two TP4 engines at gpu-memory-utilization 0.90."""
    m = load_model("llama-3.1-70b")
    return solve_serve(m, load_cluster("dgx-h100").with_gpus(8), serve_job_for(m), pins={}, top_k=1,
                       time_limit_s=10, num_workers=1, seed=0)[0]


def _table(text: str, title: str) -> dict[str, float]:
    block = text.split(title, 1)[1].split("\n\n", 1)[0]
    return {k.strip(): float(v) for k, v in re.findall(r"^(\S[^\n]*?)\s+([\d.]+)\s*$", block, re.M)}


def test_memory_rows_sum_to_capacity(plan_70b, render, assert_fits) -> None:
    """The components sum to the budget (0.90 x 79.6 = 71.6 GiB) and used to be followed by the
    capacity alone, 8.0 GiB more than they add up to with no row saying where it went."""
    text = render(render_serve_plan, plan_70b, width=80)
    assert_fits(text, 80)
    rows = _table(text, "Memory per GPU")
    capacity, budget, outside = rows.pop("capacity"), rows.pop("budget (0.90 of HBM)"), rows.pop("outside the budget")
    assert capacity == pytest.approx(79.6, abs=0.05)
    assert budget == pytest.approx(0.90 * capacity, abs=0.05)
    assert outside == pytest.approx(capacity - budget, abs=0.1)
    assert sum(rows.values()) == pytest.approx(budget, abs=0.1 * len(rows) / 2)
    assert "KV cache" in rows and "weights" in rows


def test_decode_rows_sum_to_the_tpot(plan_70b, render) -> None:
    text = render(render_serve_plan, plan_70b, width=80)
    assert "Decode step (one TPOT)\n" in text, "the title fits on one line (it wrapped after 'one')"
    rows = _table(text, "Decode step (one TPOT)")
    total = rows.pop("total")
    assert total == pytest.approx(1e3 * plan_70b.prediction.tpot_s, abs=0.01)
    assert sum(rows.values()) == pytest.approx(total, abs=0.005 * len(rows) + 1e-9)


def test_max_concurrency_is_not_rounded_up(plan_70b, render) -> None:
    mem = plan_70b.prediction.memory
    text = " ".join(render(render_serve_plan, plan_70b, width=200).split())
    shown = float(re.search(r"max concurrency ([\d,.]+) at ([\d,]+) tokens", text)[1].replace(",", ""))
    assert shown == pytest.approx(mem.kv_cache_tokens / mem.context_len, abs=0.005)
    assert int(shown) * mem.context_len <= mem.kv_cache_tokens, "the whole requests shown fit the KV cache"
    assert mem.budget_bytes / GIB == pytest.approx(0.9 * mem.capacity_bytes / GIB)
