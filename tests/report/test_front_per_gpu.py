"""The serving front's tok/s/GPU counts the GPUs a deployment runs on; the plan printed above it divides
by every GPU of the cluster. A 1P1D mix of 6 GPUs on 8 read 874 tok/s/GPU at TPOT 44.4 ms in the front
and 655 in the plan's own comparison line, with no word why: the front now says so, with the factor."""

from __future__ import annotations

import io

from rich.console import Console

from autoshard.report.pareto import render_front
from autoshard.search.serve.front import Front, FrontPoint

AGG = FrontPoint("aggregated", "TP4 PP1 x256", 782.0, 24.4, 0.0409, 0.12, 4)
SPLIT = FrontPoint("disaggregated", "1P1D P:TP1 PP2 D:TP4 PP1 x233", 873.6, 22.5, 0.0444, 0.70, 6)


def _text(points: tuple[FrontPoint, ...], cluster_gpus: int | None) -> str:
    buf = io.StringIO()
    front = Front(points=points, front=points, evaluated=1, candidates=1)
    render_front(front, Console(file=buf, width=80, color_system=None), title="t", tpot_target_s=0.05,
                 cluster_gpus=cluster_gpus)
    return " ".join(buf.getvalue().split())


def test_a_deployment_that_leaves_gpus_idle_is_explained() -> None:
    text = _text((AGG, SPLIT), 8)
    assert "per GPU the deployment runs on" in text
    assert f"{SPLIT.label}: 6" in text and "x 6/8 (874 -> 655)" in text  # 873.6 x 6/8 = 655.2


def test_no_note_when_every_deployment_tiles_the_cluster() -> None:
    assert "per GPU the deployment runs on" not in _text((AGG,), 8)
    assert "per GPU the deployment runs on" not in _text((AGG, SPLIT), 24)  # 6 tiles 24
    assert "per GPU the deployment runs on" not in _text((AGG, SPLIT), None)
