"""`--time-limit` covers the whole command: under the console entry point the clock starts when the
process started, so the interpreter start-up and the imports count too (cli.options.mark_process_start)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoshard.cli import options

ROOT = Path(__file__).resolve().parents[2]


def test_the_clock_starts_with_the_process_not_with_the_command() -> None:
    # the child sleeps 1.5 s before the entry point marks the start: that time must count
    code = ("import time; time.sleep(1.5)\n"
            "from autoshard.cli.options import command_started, mark_process_start\n"
            "mark_process_start(); print(time.monotonic() - command_started())")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    elapsed = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                   check=True).stdout)
    assert 1.5 <= elapsed < 30.0


def test_in_process_the_clock_starts_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options, "_ENTRY", {})
    assert abs(options.command_started() - time.monotonic()) < 0.5
    options.mark_process_start()
    assert options.command_started() <= time.monotonic()


MEGATRON = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
            "--seq-length 4096 --max-position-embeddings 4096 --global-batch-size 64 --micro-batch-size 1 --bf16")


@pytest.mark.parametrize("argv", [
    ["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "2"],  # PP left out: the solver fills it in
    ["solve", "llama-3.1-8b", "dgx-h100", "--from-megatron", MEGATRON],  # compared with the best plan
])
def test_evaluate_and_compare_count_from_the_process_start(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    """evaluate's solver and solve --from-megatron's used to start their clock when the solve started, not at
    the process start like solve: a process that started 100 s ago has no time left of a 5 s limit."""
    from typer.testing import CliRunner

    from autoshard.cli import app

    monkeypatch.setitem(options._ENTRY, "started", time.monotonic() - 100.0)
    result = CliRunner().invoke(app, [*argv, "--time-limit", "5", "--workers", "1"])
    assert result.exit_code == 1, result.output
    assert "time limit" in " ".join(result.stderr.split())
