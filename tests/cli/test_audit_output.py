"""Defects a first outside user found by running the README's commands at 80 columns.

Each test runs the installed console script at a fixed terminal width, as a user's shell does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FAST = ["--workers", "1", "--time-limit", "10"]


def script(*args: object, columns: int = 80) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "autoshard"
    if not exe.is_file():
        pytest.fail(f"the autoshard console script is missing: no {exe} (install the package: pip install -e .)")
    proc = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": str(columns)})
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return proc


def _panel(text: str) -> list[str]:
    """The head panel's lines, box included, up to the solver line (its wall time varies by run)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    end = next(i for i, line in enumerate(lines) if line.startswith("│ solver:"))
    return lines[start:end]


@pytest.mark.parametrize("args", [
    ("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", *FAST),
    ("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", *FAST),
], ids=["train", "serve"])
def test_emit_to_stdout_prints_the_whole_report_on_stderr(args: tuple[str, ...]) -> None:
    """With --emit and no -o the script goes to stdout and the report to stderr. The report used to be
    printed with stderr's soft wrap, so every head-panel line longer than the panel was cut at its
    border (`likely 4,400-5,560 tokens/` and the rest of the band lost)."""
    emit = "megatron" if "serve" not in args else "vllm"
    plain = script(*args)
    emitted = script(*args, "--emit", emit)
    assert emitted.stdout.startswith("#!"), "stdout is the script alone"
    assert _panel(emitted.stderr) == _panel(plain.stdout)
    assert all(len(line) <= 80 for line in _panel(emitted.stderr))


@pytest.mark.parametrize(("sizes", "named"), [("0,8", "0 is not a GPU count"), ("8,-8,-16", "-16, -8 are not GPU counts")])
def test_study_names_the_gpu_count_that_is_not_one(sizes: str, named: str) -> None:
    """`study --gpus 0,8` said "give at least one positive GPU count" although 8 is one."""
    from typer.testing import CliRunner

    from autoshard.cli import app

    result = CliRunner().invoke(app, ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", sizes])
    assert result.exit_code == 2, result.output
    assert named in result.stderr and "--gpus" in result.stderr and "at least one positive" not in result.stderr


def test_k8s_apply_line_quotes_the_directory(tmp_path: Path) -> None:
    """`--emit k8s -o 'my dir'` printed `kubectl apply -f .../my dir`, which a shell runs on two paths."""
    from typer.testing import CliRunner

    from autoshard.cli import app

    where = tmp_path / "my manifests é"
    result = CliRunner().invoke(app, ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                      "--emit", "k8s", "-o", str(where), *FAST])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stderr.split())
    assert f"kubectl apply -f '{where}'" in flat, flat
    again = CliRunner().invoke(app, ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                     "--emit", "k8s", "-o", str(where), *FAST])
    assert again.exit_code == 2 and f"`kubectl apply -f '{where}'` would apply them too" in " ".join(again.stderr.split())


def test_a_huge_whole_number_names_the_fix(tmp_path: Path) -> None:
    """`num_nodes: 1e300` in a cluster file said only "exceeded maximum size", with no fix."""
    from autoshard.errors import SpecError
    from autoshard.specs import load_cluster

    text = (Path(__file__).resolve().parents[2] / "clusters" / "dgx-h100.yaml").read_text()
    path = tmp_path / "huge.yaml"
    path.write_text(text.replace("num_nodes: 128", "num_nodes: 1e300"))
    with pytest.raises(SpecError) as info:
        load_cluster(str(path))
    assert "num_nodes" in str(info.value) and "write a whole number" in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("command", ["solve", "evaluate", "study", "models", "clusters"])
def test_help_at_80_columns_names_every_option_whole(command: str) -> None:
    """Typer's rich help squeezed its option column at 80 columns into cut names such as
    `--global-batch-s…`, so a user could not read which flag to pass. Plain help wraps the text
    instead: every long option of the command appears whole, and nothing is elided."""
    import typer.main

    from autoshard.cli import app

    group = typer.main.get_command(app)
    names = [opt for param in group.commands[command].params for opt in param.opts if opt.startswith("--")]
    assert len(names) >= 1
    text = script(command, "--help").stdout
    assert "…" not in text
    missing = [n for n in names if n not in text.split()]
    assert not missing, f"cut or missing in `{command} --help` at 80 columns: {missing}"


def test_top_level_help_at_80_columns_shows_each_command_summary_whole() -> None:
    text = script("--help").stdout
    commands = text[text.index("Commands:"):]
    assert "..." not in commands and "…" not in commands, commands
    assert "Cost study: the best plan per cluster kind, in days and dollars." in text
