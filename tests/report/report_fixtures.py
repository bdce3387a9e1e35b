"""Plans and helpers shared by the rendering tests: every plan here is evaluated (no solver run)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from autoshard.api import evaluate, train_job
from autoshard.parallel import Recompute
from autoshard.specs import load_cluster, load_model


def _render(fn, *args, width: int, **kwargs) -> str:
    """What `fn(..., console)` prints on a terminal `width` columns wide, as plain text."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None, soft_wrap=False)
    fn(*args, console, **kwargs)
    return buf.getvalue()


def _assert_fits(text: str, width: int) -> None:
    """No line wider than the terminal and no cell cut with an ellipsis."""
    long = [(len(line), line) for line in text.splitlines() if len(line) > width]
    assert not long, f"{len(long)} lines wider than {width}: {long[:3]}"
    assert "…" not in text, f"a cell was cut:\n{text}"


def plan_for(model: str, cluster: str, gpus: int, **knobs):
    m = load_model(model)
    c = load_cluster(cluster).with_gpus(gpus)
    job = train_job(m, seq_len=knobs.pop("seq_len", None), global_batch_size=knobs.pop("global_batch_size", None),
                    precision=knobs.pop("precision", None))
    return evaluate(m, c, job, **knobs)


@pytest.fixture(scope="session")
def plan_70b():
    """Llama 3.1 70B on 64 H100: interleaved pipeline, CP, uneven stages (embedding, output)."""
    return plan_for("llama-3.1-70b", "dgx-h100", 64, tp=4, pp=4, vpp=2, cp=2, micro_batch_size=1,
                    recompute=Recompute.SELECTIVE)


@pytest.fixture(scope="session")
def plan_7b_one_gpu():
    """Llama-2-7B alone on one H200 at batch 1, sequence 4096: 18 bytes per parameter."""
    return plan_for("llama-2-7b", "dgx-h200", 1, tp=1, pp=1, micro_batch_size=1, seq_len=4096,
                    global_batch_size=16, recompute=Recompute.SELECTIVE)


@pytest.fixture(scope="session")
def render():
    return _render


@pytest.fixture(scope="session")
def assert_fits():
    return _assert_fits


@pytest.fixture(scope="session")
def make_plan():
    return plan_for
