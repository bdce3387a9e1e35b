"""The best serving plan does not depend on --top: ties on the objective break the way a user expects.

Qwen3-30B-A3B on 16 H100s is decode-bound: 3 decode instances of 4 GPUs (TP1 EP4, attention DP4) set
109,695 output tokens/s whatever prefill feeds them, so 1P3D (prefill TP1 PP4, 16 GPUs), 2P3D (2 x TP1
PP2, 16 GPUs) and 3P3D (3 x TP1, 15 GPUs, 1 idle) all reach 6,856 tokens/s per cluster GPU. CP-SAT used
to return any of them (1P3D with --top 1, 3P3D with --top 3). Among equal throughput the plan now puts
the most GPUs to work (the cluster is paid for: spare GPUs become prefill capacity), then the shortest
TTFT: 1P3D, TTFT 0.10 s (3P3D's is longer).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autoshard.cli import app


def _best(*extra: str) -> dict:
    result = CliRunner().invoke(app, ["solve", "qwen3-30b-a3b", "dgx-h100", "--gpus", "16", "--mode", "serve",
                                      "--json", "--time-limit", "20", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("workers", ["1", "8"])
def test_the_best_plan_is_the_same_with_any_top(workers: str) -> None:
    plans = [_best("--top", top, "--workers", workers) for top in ("1", "3")]
    for obj in plans:
        roles = {r["role"]: r for r in obj["plan"]["roles"]}
        assert obj["plan"]["unused_gpus"] == 0 and obj["num_gpus"] == 16
        assert roles["prefill"]["instances"] == 1 and roles["prefill"]["pp"] == 4
        assert roles["decode"]["instances"] == 3 and roles["decode"]["ep"] == 4
        assert obj["predicted"]["serve"]["ttft_s"] == pytest.approx(0.098, abs=0.005)
    assert plans[0]["plan"] == plans[1]["plan"]
    assert plans[0]["predicted"]["tokens_per_s"] == plans[1]["predicted"]["tokens_per_s"]
    assert plans[0]["predicted"]["tokens_per_s"] == pytest.approx(109_365, rel=1e-4)
