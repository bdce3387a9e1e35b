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
