"""Smoke and contract tests of every `autoshard` command.

The JSON contract is the `autoshard.plan/v1` schema of ARCHITECTURE.md: fields may be added, none
renamed or removed. Solves use small models, one CP-SAT worker and a short time limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.specs import load_model

REPO = Path(__file__).resolve().parents[2]
MODEL_NAMES = sorted(p.stem for p in (REPO / "models").glob("*.yaml"))
CLUSTER_NAMES = sorted(p.stem for p in (REPO / "clusters").glob("*.yaml"))
FAST = ["--workers", "1", "--time-limit", "10"]
REL = 1e-6


# ----------------------------------------------------------------------------- helpers


@dataclass
class Run:
    args: list[str]
    code: int
    stdout: str
    stderr: str

    @property
    def flat(self) -> str:
        return " ".join((self.stdout + self.stderr).split())

    def __str__(self) -> str:
        return (f"autoshard {' '.join(self.args)}\nexit {self.code}\n"
                f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}")


def cli(*args: object) -> Run:
    argv = [str(a) for a in args]
    result = CliRunner().invoke(app, argv)
    exc = result.exception
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(*result.exc_info))
        pytest.fail(f"`autoshard {' '.join(argv)}` raised:\n{tb}")
    run = Run(argv, result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in run.stdout + run.stderr, str(run)
    return run


def script(*args: object, columns: int = 100) -> Run:
    """The installed console script, at a fixed terminal width (rich reads COLUMNS)."""
    exe = Path(sys.executable).parent / "autoshard"  # the venv's script: CI does not put it on PATH
    if not exe.is_file():
        pytest.fail(f"the autoshard console script is missing: no {exe} (install the package: pip install -e .)")
    argv = [str(a) for a in args]
    proc = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "COLUMNS": str(columns)})
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in run.stdout + run.stderr, str(run)
    return run


def one_json_object(run: Run) -> dict:
    """stdout holds exactly one JSON object and nothing else."""
    assert run.code == 0, str(run)
    text = run.stdout.strip()
    obj, end = json.JSONDecoder().raw_decode(text)
    assert text[end:].strip() == "", f"more than one JSON value on stdout\n{run}"
    assert isinstance(obj, dict), str(run)
    return obj


def close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def knobs(plan_json: dict) -> dict:
    return {k: v for k, v in plan_json["plan"].items() if k != "stages"}


def layouts(plan_json: dict) -> list[list[str]]:
    return [s["layers"] for s in plan_json["plan"]["stages"]]


# The autoshard.plan/v1 schema (ARCHITECTURE.md): every key must be present; extra keys are allowed.
SCHEMA: dict = {
    "schema": str, "status": str, "mode": str, "model": str, "cluster": str, "num_gpus": int,
    "plan": {
        "tp": int, "pp": int, "dp": int, "cp": int, "ep": int, "etp": int, "vpp": int,
        "micro_batch_size": int, "global_batch_size": int, "num_microbatches": int,
        "sequence_parallel": bool, "recompute": str, "zero_stage": int,
        "stages": [{"index": int, "layers": [str], "device": str}],
    },
    "predicted": {
        "step_time_s": float, "tokens_per_s": float, "tokens_per_s_per_gpu": float,
        "tflops_per_gpu": float, "hw_tflops_per_gpu": float, "mfu": float,
        "time_breakdown_s": {k: float for k in ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm",
                                                 "dp_comm_exposed", "bubble", "optimizer")},
        "memory_gib": {
            "peak": float, "capacity": float, "per_stage": [float],
            "breakdown": {k: float for k in ("weights", "grads", "optimizer", "activations", "kv_cache",
                                             "overhead")},
        },
    },
    "launch": {"megatron": str},
    "solver": {"status": str, "wall_s": float, "objective": float, "bound": float, "gap": float},
}


def check_schema(obj: object, schema: object, where: str = "") -> None:
    if isinstance(schema, dict):
        assert isinstance(obj, dict), f"{where or 'top level'} must be an object, got {obj!r}"
        for key, sub in schema.items():
            assert key in obj, f"missing key {where + '.' if where else ''}{key}"
            check_schema(obj[key], sub, f"{where}.{key}" if where else key)
    elif isinstance(schema, list):
        assert isinstance(obj, list) and obj, f"{where} must be a non-empty list, got {obj!r}"
        for i, item in enumerate(obj):
            check_schema(item, schema[0], f"{where}[{i}]")
    elif schema is float:
        assert isinstance(obj, int | float) and not isinstance(obj, bool), \
            f"{where} must be a number, got {obj!r}"
    elif schema is int:
        assert isinstance(obj, int) and not isinstance(obj, bool), f"{where} must be an integer, got {obj!r}"
    else:
        assert isinstance(obj, schema), f"{where} must be {schema.__name__}, got {obj!r}"


def check_train_plan(obj: dict, model: str, cluster: str, num_gpus: int) -> None:
    check_schema(obj, SCHEMA)
    assert obj["schema"] == "autoshard.plan/v1"
    assert obj["mode"] == "train"
    assert (obj["model"], obj["cluster"], obj["num_gpus"]) == (model, cluster, num_gpus)
    p, pred = obj["plan"], obj["predicted"]
    assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == num_gpus
    assert p["recompute"] in ("none", "selective", "full")
    assert p["zero_stage"] in (0, 1, 2, 3)
    assert p["num_microbatches"] * p["micro_batch_size"] * p["dp"] == p["global_batch_size"]
    # stages: pp x vpp model chunks in order, every layer exactly once and contiguous
    stages = p["stages"]
    assert [s["index"] for s in stages] == list(range(p["pp"] * p["vpp"]))
    assert all(s["device"] and s["layers"] for s in stages)
    names = [n for s in stages for n in s["layers"]]
    expected = list(load_model(model).layer_names)
    assert sorted(names) == sorted(expected), "every layer must appear exactly once across stages"
    assert names == expected, "stages must hold consecutive layers in model order"
    # predictions agree with each other
    seq_len = p.get("seq_len", load_model(model).training.seq_len)
    assert close(pred["tokens_per_s"], p["global_batch_size"] * seq_len / pred["step_time_s"])
    assert close(pred["tokens_per_s_per_gpu"] * num_gpus, pred["tokens_per_s"])
    assert pred["hw_tflops_per_gpu"] >= pred["tflops_per_gpu"] > 0
    assert 0 < pred["mfu"] < 1
    assert all(v >= 0 for v in pred["time_breakdown_s"].values())
    mem = pred["memory_gib"]
    assert len(mem["per_stage"]) == p["pp"]
    assert close(mem["peak"], max(mem["per_stage"]))
    assert 0 < mem["peak"] <= mem["capacity"]
    assert all(v >= 0 for v in mem["breakdown"].values())
    solver = obj["solver"]
    assert solver["gap"] >= 0 and solver["wall_s"] >= 0
    launch = obj["launch"]["megatron"]
    assert "pretrain_gpt.py" in launch
    assert f"--tensor-model-parallel-size {p['tp']}" in launch
    assert f"--pipeline-model-parallel-size {p['pp']}" in launch


# ----------------------------------------------------------------------------- version, help, catalogs


def test_version() -> None:
    run = cli("--version")
    assert run.code == 0, str(run)
    assert run.stdout.strip() == f"autoshard {version('autoshard')}"


def test_version_through_console_script() -> None:
    run = script("--version")
    assert run.code == 0 and run.stdout.strip() == f"autoshard {version('autoshard')}", str(run)


@pytest.mark.parametrize("command", [[], ["solve"], ["evaluate"], ["study"], ["models"], ["clusters"]],
                         ids=lambda c: " ".join(c) or "top")
def test_help(command: list[str]) -> None:
    run = cli(*command, "--help")
    assert run.code == 0, str(run)
    assert "Usage" in run.stdout


def test_models_json_lists_every_bundled_model() -> None:
    obj = one_json_object(cli("models", "--json"))
    assert sorted(m["name"] for m in obj["models"]) == MODEL_NAMES
    assert all(m["params"] > 0 and m["layers"] > 0 for m in obj["models"])


def test_clusters_json_lists_every_bundled_cluster() -> None:
    obj = one_json_object(cli("clusters", "--json"))
    assert sorted(c["name"] for c in obj["clusters"]) == CLUSTER_NAMES
    assert all(c["gpus"] == sum(p["gpus"] for p in c["pools"]) for c in obj["clusters"])


@pytest.mark.parametrize("command", ["models", "clusters"])
def test_catalog_table_lists_every_name_on_a_wide_terminal(command: str) -> None:
    run = script(command, columns=200)
    assert run.code == 0, str(run)
    for name in MODEL_NAMES if command == "models" else CLUSTER_NAMES:
        assert name in run.stdout, f"{name} missing from `autoshard {command}`\n{run}"


@pytest.mark.parametrize("command", ["models", "clusters"])
def test_catalog_table_lists_every_name_at_80_columns(command: str) -> None:
    run = script(command, columns=80)
    assert run.code == 0, str(run)
    missing = [n for n in (MODEL_NAMES if command == "models" else CLUSTER_NAMES) if n not in run.stdout]
    assert not missing, f"names cut off in `autoshard {command}`: {missing}\n{run}"


def test_clusters_table_says_which_fast_domains_are_not_nvlink() -> None:
    """The column was "NVL: GPUs per NVLink domain" and showed 8 for the PCIe boxes (h100-pcie, l40s-pcie)
    and MI300X's Infinity Fabric too; now the domain is marked by its link."""
    run = script("clusters", columns=80)
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines() if line and not line[0].isspace()}
    assert rows["h100-pcie"][6] == rows["l40s-pcie"][6] == "8p" and rows["mi300x"][6] == "8i"
    assert rows["dgx-h100"][6] == "8" and rows["gb200-nvl72"][6] == "72"
    flat = " ".join(run.stdout.split())
    assert "dom: GPUs per NVLink domain (p: per PCIe node, i: per Infinity Fabric node)" in flat


# ----------------------------------------------------------------------------- solve


@pytest.fixture(scope="module")
def solved_8b() -> dict:
    return one_json_object(cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--json", *FAST))


def test_solve_json_contract(solved_8b: dict) -> None:
    check_train_plan(solved_8b, "llama-3.1-8b", "dgx-h100", 8)
    assert solved_8b["status"] == "optimal"
    assert solved_8b["solver"]["status"] == "OPTIMAL"


def test_solve_top_k_alternatives() -> None:
    obj = one_json_object(cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--json", "--top", "3",
                              *FAST))
    check_train_plan(obj, "llama-3.1-8b", "dgx-h100", 8)
    alts = obj["alternatives"]
    assert 1 <= len(alts) <= 2
    seen = {json.dumps(knobs(obj), sort_keys=True) + json.dumps(layouts(obj))}
    for alt in alts:
        check_train_plan(alt, "llama-3.1-8b", "dgx-h100", 8)
        assert alt["predicted"]["step_time_s"] >= obj["predicted"]["step_time_s"] * (1 - REL)
        key = json.dumps(knobs(alt), sort_keys=True) + json.dumps(layouts(alt))
        assert key not in seen, "alternatives must be distinct plans"
        seen.add(key)


def test_solve_text_show_schedule_and_explain() -> None:
    run = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--show-schedule", "--explain", *FAST)
    assert run.code == 0, str(run)
    assert "1F1B" in run.stdout, str(run)
    assert "Why candidates were discarded" in " ".join(run.stdout.split()), str(run)
    assert "llama-3.1-8b" in run.flat
    # the headline names the peak, the solver line cannot contradict itself, the schedule shows the
    # bubble the cost model charges (or says there is no pipeline)
    assert "TFLOP/s BF16 dense peak" in run.flat, str(run)
    assert "solver: optimal" in run.flat or "not proven optimal" in run.flat, str(run)
    assert "gap 0.00" not in run.flat and "FEASIBLE" not in run.flat, str(run)
    assert "bubble (cost model)" in run.flat or "no pipeline bubble" in run.flat, str(run)


def test_solve_emit_megatron_to_file_round_trips_through_evaluate(tmp_path: Path) -> None:
    launch = tmp_path / "launch.sh"
    run = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--json",
              "--emit", "megatron", "-o", launch, *FAST)
    best = one_json_object(run)  # the script goes to the file, not into the JSON stream
    assert launch.is_file() and os.access(launch, os.X_OK), "launch script must be executable"
    text = launch.read_text()
    assert text.startswith("#!")
    assert "pretrain_gpt.py" in text
    assert f"--tensor-model-parallel-size {best['plan']['tp']}" in text
    assert str(launch) in " ".join(run.stderr.split()) or launch.name in run.stderr

    # reading the script back predicts exactly what solve predicted
    back = one_json_object(cli("evaluate", "llama-3.1-8b", "dgx-h100", "--from-megatron", launch, "--json"))
    assert knobs(back) == knobs(best)
    assert layouts(back) == layouts(best)
    assert close(back["predicted"]["tflops_per_gpu"], best["predicted"]["tflops_per_gpu"])
    assert close(back["predicted"]["memory_gib"]["peak"], best["predicted"]["memory_gib"]["peak"])


def test_solve_emit_megatron_to_stdout() -> None:
    run = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--emit", "megatron", *FAST)
    assert run.code == 0, str(run)
    assert run.stdout.startswith("#!"), "with --emit and no -o, stdout is the script alone (plan on stderr)"
    assert "pretrain_gpt.py" in run.stdout


# ----------------------------------------------------------------------------- evaluate vs solve


def _evaluate_and_pinned_solve(model: str, gpus: int, tp: int, pp: int) -> tuple[dict, dict]:
    ev = one_json_object(cli("evaluate", model, "dgx-h100", "--gpus", gpus, "--tp", tp, "--pp", pp, "--json"))
    p = ev["plan"]
    so = one_json_object(cli(
        "solve", model, "dgx-h100", "--gpus", gpus, "--tp", tp, "--pp", pp, "--vpp", p["vpp"],
        "--cp", p["cp"],
        "--mbs", p["micro_batch_size"], "--recompute", p["recompute"], "--zero-stage", p["zero_stage"],
        "--sequence-parallel" if p["sequence_parallel"] else "--no-sequence-parallel", "--json", *FAST))
    return ev, so


def _check_agreement(ev: dict, so: dict) -> None:
    assert ev["plan"]["tp"] == so["plan"]["tp"] and ev["plan"]["pp"] == so["plan"]["pp"]
    assert knobs(ev) == knobs(so), "solve must keep every pinned knob"
    if layouts(ev) == layouts(so):
        for key in ("step_time_s", "tflops_per_gpu", "hw_tflops_per_gpu", "mfu"):
            assert close(ev["predicted"][key], so["predicted"][key]), key
        assert close(ev["predicted"]["memory_gib"]["peak"], so["predicted"]["memory_gib"]["peak"])
    else:
        # solve may move layers between stages; it is optimal, so never slower than the even split
        assert so["predicted"]["step_time_s"] <= ev["predicted"]["step_time_s"] * (1 + REL)


def test_evaluate_agrees_with_pinned_solve_70b() -> None:
    ev, so = _evaluate_and_pinned_solve("llama-3.1-70b", 64, 8, 4)
    check_train_plan(ev, "llama-3.1-70b", "dgx-h100", 64)
    check_train_plan(so, "llama-3.1-70b", "dgx-h100", 64)
    assert so["status"] == "optimal"
    _check_agreement(ev, so)


def test_evaluate_agrees_with_pinned_solve_identical_layout() -> None:
    # PP 1: one stage, so the layouts are identical and the numbers must match exactly
    ev, so = _evaluate_and_pinned_solve("llama-3.1-8b", 16, 8, 1)
    assert layouts(ev) == layouts(so)
    _check_agreement(ev, so)


def test_evaluate_agrees_with_pinned_solve_single_node_tp8() -> None:
    ev, so = _evaluate_and_pinned_solve("llama-3.1-8b", 8, 8, 1)
    _check_agreement(ev, so)


def test_evaluate_json_contract() -> None:
    obj = one_json_object(cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "2", "--pp", "2",
                              "--json"))
    check_train_plan(obj, "llama-3.1-8b", "dgx-h100", 8)
    assert obj["solver"]["status"] == "EVALUATED"
    assert [len(s["layers"]) for s in obj["plan"]["stages"]] == [17, 17]  # embedding+16, 16+output


def test_evaluate_fills_missing_knobs_with_the_solver() -> None:
    obj = one_json_object(cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "2", "--json",
                              *FAST))
    check_train_plan(obj, "llama-3.1-8b", "dgx-h100", 8)
    assert obj["plan"]["tp"] == 2


def test_evaluate_text() -> None:
    run = cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "2", "--pp", "2",
              "--show-schedule")
    assert run.code == 0, str(run)
    assert "1F1B" in run.stdout
