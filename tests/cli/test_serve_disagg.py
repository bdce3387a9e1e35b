"""`solve --mode serve`: --disaggregate, the interactive default SLA with its throughput-optimal
alternative, --emit for disaggregated plans and --emit k8s, and their bad-input messages."""

from __future__ import annotations

import json
import traceback

import pytest
import yaml
from typer.testing import CliRunner

from autoshard.cli import app

FAST = ["--workers", "1", "--time-limit", "10"]


def cli(*args):
    argv = [str(a) for a in args]
    result = CliRunner().invoke(app, argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail("".join(traceback.format_exception(*result.exc_info)))
    assert "Traceback" not in result.stdout + result.stderr
    return result


def test_interactive_default_and_throughput_alternative():
    r = cli("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "16", "--mode", "serve", "--json", *FAST)
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["sla"]["default"] is True and obj["sla"]["tpot_ms"] == 50.0
    assert obj["predicted"]["serve"]["tpot_s"] <= 0.050
    assert obj["predicted"]["serve"]["tpot_target_s"] == 0.050
    alt = obj["throughput_optimal"]
    assert alt["predicted"]["serve"]["tpot_target_s"] is None
    # the unconstrained plan is at least as fast per GPU, and slower per user
    assert alt["solver"]["objective"] >= obj["solver"]["objective"]
    assert alt["predicted"]["serve"]["tpot_s"] >= obj["predicted"]["serve"]["tpot_s"]
    assert obj["plan"]["deployment_choice"].startswith(("aggregated", "disaggregated"))


def test_explicit_target_has_no_default_sla():
    r = cli(
        "solve",
        "llama-3.1-8b",
        "dgx-h100",
        "--gpus",
        "8",
        "--mode",
        "serve",
        "--tpot-ms",
        "30",
        "--json",
        *FAST,
    )
    obj = json.loads(r.stdout)
    assert "sla" not in obj and "throughput_optimal" not in obj
    assert obj["predicted"]["serve"]["tpot_s"] <= 0.030


def test_interactive_text_names_the_sla():
    r = cli("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "16", "--mode", "serve", *FAST)
    flat = " ".join(r.stdout.split())
    assert "TPOT <= 50 ms" in flat and "throughput-optimal alternative" in flat
    assert "deployment kind:" in flat


def test_interactive_alternative_carries_its_band():
    """The throughput-optimal alternative is a prediction too: its terminal line shows the band the JSON
    gives it (it had none: "TP4 PP2 DP2, 16,064 output tokens/s (1,004 per GPU), TPOT 85.2 ms")."""
    args = ("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "16", "--mode", "serve", *FAST)
    flat = " ".join(cli(*args).stdout.split())
    alt = json.loads(cli(*args, "--json").stdout)["throughput_optimal"]
    band, gpus = alt["predicted"]["band"], alt["num_gpus"]
    lo, hi = (round(t / gpus) for t in band["tokens_per_s"])
    tpot_lo, tpot_hi = (1e3 * t for t in band["tpot_s"])
    line = flat[flat.index("throughput-optimal alternative"):]
    assert f"per GPU, likely {lo:,}-{hi:,}), TPOT" in line
    assert f"ms (likely {tpot_lo:.1f}-{tpot_hi:.1f}), TTFT" in line
    assert lo <= alt["predicted"]["tokens_per_s_per_gpu"] <= hi


def test_alternative_that_is_the_plan_itself_is_not_printed_twice():
    """Llama 3.1 8B on 8 H100 meets the interactive SLA with its throughput-optimal plan: the terminal
    said "throughput-optimal alternative (no TPOT target): TP1 PP1 DP8, 53,243 output tokens/s" under
    the same plan's head; it now says it is the same deployment (the JSON keeps throughput_optimal)."""
    args = ("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", *FAST)
    obj = json.loads(cli(*args, "--json").stdout)
    assert obj["throughput_optimal"]["predicted"]["tokens_per_s"] == obj["predicted"]["tokens_per_s"]
    flat = " ".join(cli(*args).stdout.split())
    assert "throughput-optimal without a TPOT target: this same deployment" in flat
    assert "throughput-optimal alternative" not in flat


def test_disaggregate_on_json_roles():
    r = cli(
        "solve",
        "llama-3.1-70b",
        "dgx-h100",
        "--gpus",
        "16",
        "--mode",
        "serve",
        "--disaggregate",
        "on",
        "--tpot-ms",
        "60",
        "--json",
        *FAST,
    )
    obj = json.loads(r.stdout)
    roles = obj["plan"]["roles"]
    assert {x["role"] for x in roles} == {"prefill", "decode"}
    assert sum(x["gpus"] for x in roles) == obj["num_gpus"] <= 16
    assert any(k.startswith("sglang:prefill0:node") for k in obj["launch"])
    assert "--disaggregation-mode prefill" in obj["launch"]["sglang"]


def test_disaggregate_off_never_splits():
    r = cli(
        "solve",
        "llama-3.1-70b",
        "dgx-h100",
        "--gpus",
        "64",
        "--mode",
        "serve",
        "--disaggregate",
        "off",
        "--tpot-ms",
        "50",
        "--json",
        *FAST,
    )
    obj = json.loads(r.stdout)
    assert obj["plan"]["disaggregated"] is False and "roles" not in obj["plan"]


def test_emit_script_for_disaggregated_plan(tmp_path):
    out = tmp_path / "pd.sh"
    r = cli(
        "solve",
        "llama-3.1-70b",
        "dgx-h100",
        "--gpus",
        "16",
        "--mode",
        "serve",
        "--disaggregate",
        "on",
        "--tpot-ms",
        "60",
        "--emit",
        "sglang",
        "-o",
        out,
        *FAST,
    )
    assert r.exit_code == 0, r.stderr
    text = out.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "sglang_router.launch_router" in text
    assert 'if [ "${NODE_RANK:?set NODE_RANK}" = 1 ]' in text


def test_emit_k8s(tmp_path):
    r = cli(
        "solve",
        "llama-3.1-70b",
        "dgx-h100",
        "--gpus",
        "16",
        "--mode",
        "serve",
        "--disaggregate",
        "on",
        "--tpot-ms",
        "60",
        "--emit",
        "k8s",
        "-o",
        tmp_path / "k8s",
        *FAST,
    )
    assert r.exit_code == 0, r.stderr
    files = sorted((tmp_path / "k8s").glob("*.yaml"))
    assert any(f.name.endswith("-router.yaml") for f in files)
    kinds = {o["kind"] for f in files for o in yaml.safe_load_all(f.read_text())}
    assert {"Deployment", "Service"} <= kinds


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--mode", "serve", "--emit", "k8s"], "-o DIR"),
        (["--mode", "serve", "--target", "k8s"], "--emit k8s"),
        (["--disaggregate", "on"], "--mode serve"),
        (["--mode", "serve", "--disaggregate", "sometimes"], "sometimes"),
        (["--pareto"], "--mode serve"),
    ],
)
def test_bad_input(args, fragment):
    r = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", *args, *FAST)
    assert r.exit_code == 2
    assert fragment.lower() in " ".join((r.stdout + r.stderr).split()).lower()


def test_pareto_json_and_png(tmp_path):
    r = cli(
        "solve",
        "llama-3.1-70b",
        "dgx-h100",
        "--gpus",
        "16",
        "--mode",
        "serve",
        "--pareto",
        "--out",
        tmp_path,
        "--json",
        *FAST,
    )
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)
    front = obj["pareto"]["front"]
    assert front and {p["kind"] for p in front} <= {"aggregated", "disaggregated"}
    cut50 = next(c for c in obj["pareto"]["sla_cuts"] if c["tpot_ms"] == 50.0)
    assert cut50["best"]["tpot_s"] <= 0.05
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    # the chosen plan against the front, in the front's units (it did not say where the plan sat)
    mark = obj["pareto"]["plan"]
    assert mark["deployment"] and 0 < mark["gpus"] <= obj["num_gpus"]
    assert mark["tokens_per_s_per_user"] == pytest.approx(1 / obj["predicted"]["serve"]["tpot_s"])
    dominated = [p for p in front if p["tokens_per_s_per_gpu"] >= mark["tokens_per_s_per_gpu"]
                 and p["tokens_per_s_per_user"] >= mark["tokens_per_s_per_user"]
                 and (p["tokens_per_s_per_gpu"], p["tokens_per_s_per_user"])
                 != (mark["tokens_per_s_per_gpu"], mark["tokens_per_s_per_user"])]
    assert mark["on_front"] == (not dominated) and (mark["beaten_by"] is None) == mark["on_front"]


def test_pareto_front_carries_the_band_of_its_plans():
    """The front's figures are predictions like the plan's: they carry the same serving band (as
    measured/predicted ratios; the front had none). The ratios are the ones the best plan's own
    band is built from, on the terminal and in the JSON."""
    args = ("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "16", "--mode", "serve", "--pareto", *FAST)
    obj = json.loads(cli(*args, "--json").stdout)
    band, plan_band = obj["pareto"]["band"], obj["predicted"]["band"]
    lo, hi = (t / obj["predicted"]["tokens_per_s"] for t in plan_band["tokens_per_s"])
    tlo, thi = (t / obj["predicted"]["serve"]["tpot_s"] for t in plan_band["tpot_s"])
    assert band["tokens_per_s_per_gpu_ratio"] == pytest.approx([lo, hi], rel=1e-9)
    assert band["tpot_s_ratio"] == pytest.approx([tlo, thi], rel=1e-9)
    assert band["basis"] == plan_band["basis"].split(";")[0] == "hopper dense bf16 serving, 34 measured runs"
    flat = " ".join(cli(*args).stdout.split())
    assert (f"band (both tables): tok/s/GPU likely {lo:.2f}-{hi:.2f}x the figure, TPOT {tlo:.2f}-{thi:.2f}x, "
            f"tok/s/user {1 / thi:.2f}-{1 / tlo:.2f}x, $/M tokens {1 / hi:.2f}-{1 / lo:.2f}x (hopper dense bf16 "
            "serving, 34 measured runs)") in flat


def test_out_needs_pareto(tmp_path):
    r = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", "--out", tmp_path, *FAST)
    assert r.exit_code == 2 and "--pareto" in r.stdout + r.stderr


def test_study_serve_front(tmp_path):
    r = cli(
        "study",
        "llama-3.1-8b",
        "--cluster",
        "dgx-h100",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "8",
        "--mode",
        "serve",
        "--jobs",
        "1",
        "--time-limit",
        "10",
        "--out",
        tmp_path,
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    obj = json.loads(r.stdout)
    fronts = {f["cluster"]: f for f in obj["serve_front"]}
    assert set(fronts) == {"dgx-h100", "dgx-a100-80gb"}
    for f in fronts.values():
        for cut in f["sla_cuts"]:
            if cut["best"]:  # dollars per million tokens = price / (tokens/s/GPU x 3600) x 1e6 at the studied size:
                best, size = cut["best"], f["num_gpus"]  # the copies that fit, every GPU of the size paid for
                per_gpu = best["tokens_per_s_per_gpu"] * (size // best["gpus"]) * best["gpus"] / size
                want = f["price_per_gpu_hour"] / (per_gpu * 3600) * 1e6
                assert cut["usd_per_million_output_tokens"] == pytest.approx(want)
    assert (tmp_path / "serve_front.png").exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["llama-3.1-405b", "dgx-h100", "--gpus", "16"], ["needs at least 32 GPUs", "has 16", "--gpus 32"]),
        (
            ["llama-3.1-70b", "dgx-h100", "--gpus", "8", "--tpot-ms", "5"],
            ["TPOT <= 5 ms", "the fastest decode instance reaches"],
        ),
    ],
)
def test_no_split_says_what_is_missing(args, fragments):
    r = cli("solve", *args, "--mode", "serve", "--disaggregate", "on", *FAST)
    assert r.exit_code == 1
    flat = " ".join(r.stderr.split())
    for frag in fragments:
        assert frag in flat, flat


def test_out_must_be_a_directory(tmp_path):
    afile = tmp_path / "x.png"
    afile.write_text("")
    r = cli(
        "solve",
        "llama-3.1-8b",
        "dgx-h100",
        "--gpus",
        "8",
        "--mode",
        "serve",
        "--pareto",
        "--out",
        afile,
        *FAST,
    )
    assert r.exit_code == 2 and "is a file" in " ".join((r.stdout + r.stderr).split())
    r = cli(
        "solve",
        "llama-3.1-8b",
        "dgx-h100",
        "--gpus",
        "8",
        "--mode",
        "serve",
        "--disaggregate",
        "on",
        "--emit",
        "k8s",
        "-o",
        afile,
        *FAST,
    )
    assert r.exit_code == 2 and "is a file" in " ".join((r.stdout + r.stderr).split())
