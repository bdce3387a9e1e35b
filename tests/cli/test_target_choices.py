"""--target offers the launchers (megatron, vllm, sglang), --emit those and k8s: `solve --help` offered
`--target k8s`, which every command refused. `--target k8s` still exits 2, pointing at --emit k8s, with
one JSON object under --json."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from autoshard.cli import _run, app


def _choices(help_text: str, flag: str) -> list[str]:
    m = re.search(rf"{flag} <([a-z0-9|]+)>", help_text)
    assert m, f"{flag} has no choices in --help"
    return m.group(1).split("|")


def test_help_lists_target_and_emit_choices_apart():
    r = CliRunner().invoke(app, ["solve", "--help"], terminal_width=200)
    assert r.exit_code == 0
    assert _choices(r.stdout, "--target") == ["megatron", "vllm", "sglang"]
    assert _choices(r.stdout, "--emit") == ["megatron", "vllm", "sglang", "k8s"]


@pytest.mark.parametrize("mode", ["train", "serve"])
def test_target_k8s_points_at_emit_k8s(mode, capsys):
    """In both modes (train mode used to answer "a serving launcher: add --mode serve")."""
    assert _run(["solve", "llama-3.1-8b", "dgx-h100", "--mode", mode, "--target", "k8s", "--json"]) == 2
    out, err = capsys.readouterr()
    obj = json.loads(out)  # exactly one object on stdout
    assert obj["schema"] == "autoshard.plan/v1" and obj["status"] == "invalid" and obj["mode"] == mode
    assert obj["plan"] is None and "use --emit k8s -o DIR" in obj["error"]
    assert "use --emit k8s -o DIR" in " ".join(err.split())
    assert _run(["solve", "llama-3.1-8b", "dgx-h100", "--mode", mode, "--target", "k8s"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--emit k8s" in err


@pytest.mark.parametrize("value", ["torchtitan", "K8S", "bogus", ""])
def test_other_targets_are_refused_with_the_choices(value, capsys):
    assert _run(["solve", "llama-3.1-8b", "dgx-h100", "--target", value]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{value!r} is not one of 'megatron', 'vllm', 'sglang'" in err


def test_target_launchers_still_parse():
    """Every launcher reaches the command: megatron in train mode plans, vllm in train mode is refused
    by the command (not the parser) as a serving launcher."""
    r = CliRunner().invoke(app, ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--target", "megatron",
                                 "--json", "--workers", "1", "--time-limit", "10"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["plan"]["tp"] >= 1
    r = CliRunner().invoke(app, ["solve", "llama-3.1-8b", "dgx-h100", "--target", "sglang"])
    assert r.exit_code == 2 and "--target sglang is a serving launcher: add --mode serve" in r.stderr
