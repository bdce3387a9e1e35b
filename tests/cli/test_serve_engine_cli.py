"""`solve --mode serve`: which engine the figures are priced for (terminal and JSON), --target / --emit
picking it and refusing two different ones, and output paths: -o FILE, --emit k8s -o DIR and --pareto
--out DIR all create their missing directories and refuse the same bad paths (exit 2, no traceback)."""

from __future__ import annotations

import json
import traceback

import pytest
from typer.testing import CliRunner

from autoshard.cli import app

FAST = ["--workers", "1", "--time-limit", "10"]
SERVE = ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", *FAST]


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail("".join(traceback.format_exception(*result.exc_info)))
    assert "Traceback" not in result.stdout + result.stderr
    return result


@pytest.mark.parametrize(("flags", "engine"), [
    ([], "vllm"),
    (["--target", "vllm"], "vllm"),
    (["--target", "sglang"], "sglang"),
    (["--emit", "sglang"], "sglang"),
    (["--target", "sglang", "--emit", "sglang"], "sglang"),
])
def test_json_names_the_engine(flags, engine):
    r = cli(*SERVE, "--json", *flags)
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["engine"]["priced_for"] == engine
    assert obj["throughput_optimal"]["engine"]["priced_for"] == engine
    other = obj["engine"]["other"]
    assert other["engine"] == ("sglang" if engine == "vllm" else "vllm")
    assert other["differs"] is False  # a dense BF16 model: the engines' kernels are the same here


def test_terminal_names_the_engine():
    r = cli(*SERVE)
    assert r.exit_code == 0, r.stderr
    assert "priced for vLLM's kernels" in r.stdout and "--target sglang prices SGLang's kernels" in r.stdout
    r = cli(*SERVE, "--target", "sglang")
    assert r.exit_code == 0, r.stderr
    assert "priced for SGLang's kernels, as its launch line runs them" in r.stdout


def test_two_engines_are_refused():
    r = cli(*SERVE, "--target", "vllm", "--emit", "sglang")
    assert r.exit_code == 2
    assert "--target vllm and --emit sglang name different engines" in r.stderr


def test_missing_directories_are_created(tmp_path):
    script = tmp_path / "a" / "b" / "launch.sh"
    r = cli(*SERVE, "--emit", "vllm", "-o", script)
    assert r.exit_code == 0, r.stderr
    assert script.read_text().startswith("#!/usr/bin/env bash")
    out = tmp_path / "c" / "d"
    r = cli(*SERVE, "--pareto", "--out", out)
    assert r.exit_code == 0, r.stderr
    assert (out / "pareto.png").stat().st_size > 1000
    existing = tmp_path / "k8s"
    existing.mkdir()  # an existing directory is what --emit k8s -o DIR wants
    r = cli(*SERVE, "--emit", "k8s", "-o", existing)
    assert r.exit_code == 0, r.stderr
    assert list(existing.glob("*.yaml"))


@pytest.mark.parametrize("kind", ["script", "k8s", "pareto"])
def test_a_file_on_the_path_is_refused_before_solving(tmp_path, kind):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    flags = {"script": ["--emit", "vllm", "-o", blocker / "sub" / "launch.sh"],
             "k8s": ["--emit", "k8s", "-o", blocker / "sub"],
             "pareto": ["--pareto", "--out", blocker / "sub"]}[kind]
    r = cli(*SERVE, *flags)
    assert r.exit_code == 2
    assert f"{blocker} is a file, not a directory" in r.stderr


def test_study_precision_help_lists_the_serving_weights():
    r = cli("study", "--help")
    text = " ".join(r.stdout.split())
    for dtype in ("bf16", "fp8", "int8", "int4", "nvfp4", "mxfp4"):
        assert dtype in text


def test_api_k8s_writer_refuses_what_the_command_refuses(tmp_path):
    """`api.write_k8s_manifests` (the API's writer) runs the command's own output-directory check: a
    file in the way, or on the path, is a SpecError naming -o, not an OSError from mkdir."""
    from autoshard import api
    from autoshard.errors import SpecError

    plan = api.evaluate_serve_command("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2", None,
                                      "dgx-h100", None)
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    for where in (blocker, blocker / "k8s"):
        with pytest.raises(SpecError) as got:
            api.write_k8s_manifests(plan, where)
        assert got.value.source == "-o" and "is a file, not a directory" in str(got.value)
        assert "(the directory --emit k8s writes manifests to)" in str(got.value)
    assert api.write_k8s_manifests(plan, tmp_path / "new" / "k8s") == 1
