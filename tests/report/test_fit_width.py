"""Issue #14: at 80 columns every table fits and nothing the user needs is cut; at 160 the same.

Each report is rendered in-process on a console of the given width (and, for the real entry point,
through the console script with COLUMNS set): no line may be wider than the terminal, no cell may
end in `…`, and the values a user copies (names, prices, GPU ranges, flags) must appear whole.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.report.fit import wrap_command
from autoshard.report.serving import render_serve_plan
from autoshard.study.report import render_study
from autoshard.report.terminal import _layer_span, render_clusters, render_models, render_plan
from autoshard.api import solve_serve
from autoshard.api import serve_job_for
from autoshard.specs import bundled_clusters, bundled_models, load_cluster, load_model
from autoshard.study.costs import Answer, ServeRow, Skipped, StudyResult, TrainRow
from report_fixtures import plan_70b, render, assert_fits  # noqa: F401  (pytest fixtures)

WIDTHS = [80, 160]
EXE = Path(sys.executable).parent / "autoshard"


@pytest.mark.parametrize("width", WIDTHS)
def test_clusters_table(width, render, assert_fits):
    items = [(n, load_cluster(p)) for n, p in bundled_clusters().items()]
    text = render(render_clusters, items, width=width)
    assert_fits(text, width)
    for name, c in items:
        assert name in text
        for pool in c.pools:
            assert pool.gpu.name in text, f"GPU name {pool.gpu.name} cut"
            if pool.price_per_gpu_hour:
                assert f"{pool.price_per_gpu_hour:.2f}" in text
    assert "$/h: USD per GPU-hour" in " ".join(text.split())


@pytest.mark.parametrize("width", WIDTHS)
def test_models_table(width, render, assert_fits):
    items = [(n, load_model(p)) for n, p in bundled_models().items()]
    text = render(render_models, items, width=width)
    assert_fits(text, width)
    for name, m in items:
        assert name in text
        assert f"{m.num_params / 1e9:.1f}" in text and str(m.vocab_size) in text


@pytest.mark.parametrize("width", WIDTHS)
def test_training_report(width, plan_70b, render, assert_fits):
    text = render(render_plan, plan_70b, width=width, show_schedule=True, runners=[plan_70b], explain=True)
    assert_fits(text, width)
    for gpus in ("gpu0-15", "gpu16-31", "gpu32-47", "gpu48-63"):
        assert gpus in text
    for i in range(len(plan_70b.stages)):  # each stage's layers whole, on its row
        assert any(_layer_span(plan_70b, i) in line for line in text.splitlines()), _layer_span(plan_70b, i)
    # the launch command wraps with ` \` and still is the same command
    block = text[text.index("torchrun") - len("CUDA_DEVICE_MAX_CONNECTIONS=1 "):]
    assert shlex.split(block.replace("\\\n", " ")) == shlex.split(plan_70b.launch["megatron"].replace("\\\n", " "))


@pytest.mark.parametrize("width", WIDTHS)
def test_serving_report(width, render, assert_fits):
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(8)
    plans = solve_serve(model, cluster, serve_job_for(model), pins={}, top_k=2, time_limit_s=5, num_workers=1, seed=0)
    text = render(render_serve_plan, plans[0], width=width, runners=plans[1:], explain=True)
    assert_fits(text, width)
    for name in ("vllm", "sglang"):
        cmd = plans[0].launch[name]
        start = text.index("\n", text.index(f"{name} launch")) + 1
        block = text[start:].split("\n\n")[0]
        assert shlex.split(block.replace("\\\n", " ")) == shlex.split(cmd)


def _train_row(cluster: str, gpus: int, status: str, gap: float) -> TrainRow:
    return TrainRow(cluster=cluster, gpu="H100-SXM5-80GB", num_gpus=gpus, plan="TP8 PP16 VPP4 CP2 DP8 mbs1",
                    degrees={}, status=status, gap=gap, solve_s=1.0, mfu=0.412, tokens_per_s=1.234e6,
                    days=123.4, gpu_hours=1.23e6, price_per_gpu_hour=3.0, total_usd=3.69e6,
                    usd_per_million_tokens=0.123)


def _study(rows, mode="train") -> StudyResult:
    answer = Answer(key="cheapest_per_token", title="Cheapest", row=rows[0],
                    text="Cheapest option: 16,384 x A100-SXM4-80GB (dgx-a100-80gb), TP8 PP16 VPP4 CP2 DP8 mbs1: "
                         "123.4 days, $3.69M ($0.123 per million tokens).")
    skipped = [Skipped(cluster="l40s-pcie", num_gpus=128, reason="model states alone need 412.3 GiB per GPU, "
                                                                  "the L40S-48GB has 45 GiB")]
    return StudyResult(mode=mode, inputs={"model": "llama-3.1-405b", "tokens": 15e12, "job": {"request_rate": 5}},
                       rows=rows, skipped=skipped, answers=[answer], pareto=rows[:1],
                       notes=["a long note that has to wrap at eighty columns because it explains how prices were "
                              "chosen and where they came from"])


@pytest.mark.parametrize("width", WIDTHS)
def test_study_table(width, render, assert_fits):
    rows = [_train_row("dgx-a100-80gb", 16384, "optimal", 0.0), _train_row("dgx-h100", 8192, "feasible", 3e-5),
            _train_row("gb200-nvl72", 1152, "feasible", 0.042)]
    result = _study(rows)
    text = render(render_study, result, width=width)
    assert_fits(text, width)
    flat = " ".join(text.split())
    for cell in ("dgx-a100-80gb", "16,384", "TP8 PP16 VPP4 CP2 DP8 mbs1", "41.2%", "1.23M", "123.4", "$3.69M",
                 "$0.123"):
        assert cell in flat, f"{cell!r} missing at {width} columns"
    assert "optimal" in flat and "gap 0.003%" in flat and "gap 4.2%" in flat
    assert "412.3 GiB per GPU" in flat and "$0.123 per million tokens" in flat
    assert "feasible" not in flat and "gap 0.0%" not in flat


def _with_range(row: TrainRow, days: tuple[float, float], usd: tuple[float, float]) -> TrainRow:
    return dataclasses.replace(row, days_low=days[0], days_high=days[1], total_usd_low=usd[0], total_usd_high=usd[1])


@pytest.mark.parametrize("width", WIDTHS)
def test_study_table_with_likely_ranges(width, render, assert_fits):
    """The prediction-band ranges added to study rows do not widen the table past the terminal: at
    80 columns each range sits whole on its own line under its point figure."""
    rows = [_with_range(_train_row("dgx-a100-80gb", 16384, "optimal", 0.0), (1110.2, 1450.7), (3.31e6, 4.12e6)),
            _with_range(_train_row("dgx-h100", 8192, "feasible", 3e-5), (110.2, 145.7), (3.31e6, 4.12e6)),
            _train_row("gb200-nvl72", 1152, "not proven", 0.042)]
    text = render(render_study, _study(rows), width=width)
    assert_fits(text, width)
    flat = " ".join(text.split())
    for cell in ("dgx-a100-80gb", "16,384", "41.2%", "1.23M", "123.4", "$3.69M", "$0.123", "(1,110.2-1,450.7)",
                 "(110.2-145.7)", "($3.31M-$4.12M)", "TP8 PP16 VPP4 CP2 DP8 mbs1", "optimal", "gap 0.003%",
                 "gap 4.2%"):
        assert cell in flat, f"{cell!r} missing at {width} columns"
    assert flat.count("($3.31M-$4.12M)") == 2
    if width == 160:  # wide: the point and its range side by side, as in study.md
        assert "123.4 (110.2-145.7)" in text and "$3.69M ($3.31M-$4.12M)" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_serve_study_table_with_likely_ranges(width, render, assert_fits):
    row = ServeRow(cluster="dgx-b200", gpu="B200-SXM-180GB", num_gpus=128, plan="TP8 PP2 DP8", gpus_used=128,
                   status="feasible", throughput_tokens_per_s=1.25e6, served_tokens_per_s=1e6, requests_per_s=125.0,
                   ttft_s=1.25, tpot_s=0.0451, meets_targets=False, price_per_gpu_hour=6.25, usd_per_hour=800.0,
                   usd_per_million_output_tokens=0.178, usd_per_million_output_tokens_low=0.151,
                   usd_per_million_output_tokens_high=0.213, throughput_tokens_per_s_low=1.04e6,
                   throughput_tokens_per_s_high=1.47e6)
    text = render(render_study, _study([row], mode="serve"), width=width)
    assert_fits(text, width)
    flat = " ".join(text.split())
    for cell in ("dgx-b200", "128", "TP8 PP2 DP8", "1.25M", "125.00", "1250", "45.1", "misses target", "$800.00",
                 "$0.178", "($0.151-$0.213)", "not proven"):
        assert cell in flat, f"{cell!r} missing at {width} columns"


def test_study_status_says_optimal_only_for_a_proven_plan(render):
    """A row the solver stopped on at its limit with its bound at the objective is not called optimal: the
    solver did not prove it (its status, study.json's and the note's count say feasible), and the bound can
    be capped at the objective; it reads "not proven"."""
    text = render(render_study, _study([_train_row("dgx-h100", 64, "feasible", 0.0),
                                        _train_row("dgx-h200", 64, "optimal", 0.0)]), width=160)
    cut = next(x for x in text.splitlines() if x.startswith("dgx-h100"))
    proven = next(x for x in text.splitlines() if x.startswith("dgx-h200"))
    assert "not proven" in cut and "optimal" not in cut and "optimal" in proven


@pytest.mark.parametrize("width", WIDTHS)
def test_serve_study_table(width, render, assert_fits):
    row = ServeRow(cluster="dgx-h100", gpu="H100-SXM5-80GB", num_gpus=64, plan="TP8 PP1 DP8", gpus_used=64,
                   status="optimal", throughput_tokens_per_s=2.5e5, served_tokens_per_s=2e5, requests_per_s=5.0,
                   ttft_s=0.25, tpot_s=0.0301, meets_targets=False, price_per_gpu_hour=3.0, usd_per_hour=192.0,
                   usd_per_million_output_tokens=0.267)
    text = render(render_study, _study([row], mode="serve"), width=width)
    assert_fits(text, width)
    flat = " ".join(text.split())
    for cell in ("TP8 PP1 DP8", "250.00k", "5.00", "250", "30.1", "(misses target)", "$192.00", "$0.267", "optimal"):
        assert cell in flat


# ----------------------------------------------------------------------------- the real entry point


def _script(*args: str, columns: int) -> subprocess.CompletedProcess:
    assert EXE.is_file(), f"the autoshard console script is missing: no {EXE}"
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "COLUMNS": str(columns)})


def test_console_script_solve_fits(assert_fits):
    width = 80
    proc = _script("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "16", "--pp", "4", "--show-schedule", "--top", "2",
                   "--workers", "1", "--time-limit", "10", columns=width)
    assert proc.returncode == 0, proc.stderr
    assert_fits(proc.stdout, width)
    assert "Pipeline schedule" in proc.stdout and "Megatron-LM launch" in proc.stdout


def test_console_script_evaluate_one_gpu_memory_story(assert_fits):
    proc = _script("evaluate", "llama-2-7b", "dgx-h200", "--gpus", "1", "--tp", "1", "--pp", "1", "--mbs", "1",
                   "--seq-len", "4096", "--global-batch-size", "16", "--recompute", "selective", columns=80)
    assert_fits(proc.stdout, 80)
    for tenant in ("weights", "gradients", "optimizer state", "activations", "reserve", "fragmentation", "peak",
                   "capacity"):
        assert tenant in proc.stdout
    assert "2 + 4 + 12 = 18" in proc.stdout


def test_wrap_is_a_no_op_when_the_command_fits():
    cmd = "vllm serve m --tensor-parallel-size 8"
    assert wrap_command(cmd, 80) == cmd


def test_dataclass_fields_unchanged():
    """The study rows the table reads keep their fields (guards the status column)."""
    assert {"status", "gap"} <= {f.name for f in dataclasses.fields(TrainRow)}


def test_a_long_quoted_value_is_indented_less_to_fit():
    """Qwen3-235B on 72 GB200s: its 79-character --pipeline-model-parallel-layout value was indented by 8
    and printed 89 columns wide at 80. Indentation means nothing to the shell: a value that fits is
    indented less (5 spaces for 73 characters), one that cannot (79 + ` \\` = 81) starts its line; the
    command splits into the same words either way."""
    real = "'Et|(t|)*7,t*2|(t|)*8,t*2|(t|)*12,(t*2|)*5,t|(t*2|)*8,t|(t*2|)*8,t|(t*2|)*8,tL'"
    for layout, pad in ((real[:72] + "'", 5), (real, 0)):
        command = (f"torchrun --nproc-per-node 4 pretrain_gpt.py \\\n    --pipeline-model-parallel-layout {layout} "
                   f"\\\n    --bf16")
        wrapped = wrap_command(command, 80)
        assert f"\n{' ' * pad}{layout} \\\n" in wrapped, wrapped
        assert max(len(line) for line in wrapped.splitlines()) == max(80, len(layout) + 2), wrapped
        assert shlex.split(wrapped.replace("\\\n", "")) == shlex.split(command.replace("\\\n", ""))
    word = "x" * 90  # longer than the width: whole, at the start of its line
    assert wrap_command(f"cmd --flag {word}", 80) == f"cmd --flag \\\n{word}"
