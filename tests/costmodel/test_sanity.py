"""Physical sanity (issue #10 item 5): a predicted MFU more than 10 % above the best published MFU for
its GPU, precision and dense/MoE is flagged, with the cited reference."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from rich.console import Console

from autoshard.costmodel import bands
from autoshard.costmodel.bands import SANITY_MARGIN, gpu_generation, load_mfu_reference, sanity_for, sanity_line

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = ROOT / "tests" / "validation"
REFS = load_mfu_reference()

RESERVED = ("megatron-bridge", "2407.21783", "llama 3 herd", "nemotron-4", "2406.11704", "opt-175", "2205.01068",
            "bloom", "2211.05100", "deepseek-v3 technical", "2412.19437", "table 2", "long-sequence", "long_sequence",
            "tensorrt-llm 1.0", "lmsys")


def test_reference_rows_are_consistent_and_cited() -> None:
    assert len(REFS) >= 5
    for r in REFS:
        assert r["precision"] in ("bf16", "fp8") and r["family"] in ("dense", "moe")
        # the MFU is the printed TFLOP/s over the stated dense peak (MPT prints its own MFU: within 1 %)
        assert r["mfu"] == pytest.approx(r["tflops"] / r["peak_tflops"], rel=0.01), r["run"]
        assert len(r["citation"]) > 30 and r["gpus"]
        text = (r["citation"] + " " + r["run"]).lower()
        assert not any(word in text for word in RESERVED), r["citation"]
    keys = [(g, r["precision"], r["family"]) for r in REFS for g in r["gpus"]]
    assert len(keys) == len(set(keys)), "one best row per GPU x precision x family"


def _peak(cluster: str, precision: str) -> float:
    local = VALIDATION / "clusters" / f"{cluster}.yaml"
    path = local if local.is_file() else ROOT / "clusters" / f"{cluster}.yaml"
    gpu = yaml.safe_load(path.read_text())["gpu"]
    return gpu["fp8_tflops"] if precision == "fp8" and gpu.get("fp8_tflops") else gpu["bf16_tflops"]


def test_no_measured_validation_run_would_be_flagged() -> None:
    """The flag never fires on what was really measured: the MFU every held validation run measured
    (in autoshard's model-FLOP convention) is at most the reference (+10 %) of its GPU and precision."""
    import sys

    sys.path.insert(0, str(VALIDATION))
    import validate_published

    from autoshard.costmodel.compute import model_flops_per_step

    checked = 0
    for run in validate_published.load_runs():
        if run.get("skip_throughput"):
            continue
        result = validate_published.predict_run(run)
        model = validate_published._model(run)
        p = run["parallel"]
        gpus = p["tp"] * p["pp"] * p["dp"] * p["cp"]
        flops = model_flops_per_step(model, seq_len=run["seq_len"], global_batch_size=run["global_batch_size"])
        tflops = {
            "tflops_per_gpu": lambda v: v,
            "step_time_s": lambda v: flops / v / gpus / 1e12,
            "tokens_per_s_per_gpu": lambda v: flops / (run["seq_len"] * run["global_batch_size"]) * v / 1e12,
        }[result.metric](result.measured)
        ref, _ = bands._reference(result.gpu, run["precision"], "dense", REFS)
        assert ref is not None, run["id"]
        mfu = tflops / _peak(run["cluster"], run["precision"])
        assert mfu <= ref["mfu"] * (1 + SANITY_MARGIN), (run["id"], mfu, ref["mfu"])
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize(("gpu", "precision", "family", "mfu", "note"), [
    ("H100-SXM5-80GB", "bf16", "dense", 0.4945, ""),
    ("H200-SXM-141GB", "bf16", "dense", 0.4945, ""),
    ("H100-SXM5-80GB", "fp8", "dense", 0.4487, ""),
    ("H100-SXM5-80GB", "bf16", "moe", 0.3933, ""),
    ("H100-SXM5-80GB", "fp8", "moe", 0.4487, "dense run"),  # no FP8 MoE row: the dense FP8 one bounds it
    ("A100-SXM4-80GB", "bf16", "dense", 0.6423, ""),
    ("A100-SXM4-40GB", "bf16", "moe", 0.6423, "dense run"),
    ("GB200-186GB", "fp8", "moe", 0.1940, ""),
    ("B200-SXM-180GB", "bf16", "moe", 0.30, "on GB200"),  # same generation
])
def test_reference_lookup(gpu: str, precision: str, family: str, mfu: float, note: str) -> None:
    ref, got_note = bands._reference(gpu, precision, family, REFS)
    assert ref is not None and ref["mfu"] == pytest.approx(mfu)
    assert got_note == note


@pytest.mark.parametrize(("gpu", "precision", "family"), [
    ("MI300X-192GB", "bf16", "dense"), ("B200-SXM-180GB", "bf16", "dense"), ("L40S-48GB", "bf16", "dense"),
])
def test_no_reference_means_no_flag(gpu: str, precision: str, family: str) -> None:
    # a dense plan is never bounded by a MoE row, nor an unmeasured GPU by another generation's
    assert bands._reference(gpu, precision, family, REFS) == (None, "")


def _fake(mfu: float, gpu: str = "H100-SXM5-80GB", precision: str = "bf16", moe: bool = False, fp8: float = 1979):
    pool = SimpleNamespace(gpu=SimpleNamespace(name=gpu, fp8_tflops=fp8))
    return SimpleNamespace(prediction=SimpleNamespace(mfu=mfu), stages=(SimpleNamespace(pool=0),),
                           cluster=SimpleNamespace(pools=(pool,)), config=SimpleNamespace(precision=SimpleNamespace(
                               value=precision)), model=SimpleNamespace(is_moe=moe))


def test_threshold_is_ten_percent_above_the_reference() -> None:
    limit = 0.4945 * (1 + SANITY_MARGIN)
    assert not sanity_for(_fake(limit - 1e-6)).flagged
    assert sanity_for(_fake(limit + 1e-6)).flagged
    assert sanity_line(_fake(0.30)) is None
    line = sanity_line(_fake(0.60))
    assert line is not None and "60.0 % MFU" in line and "49.5 %" in line and "Megatron-LM weak-scaling" in line


def test_fp8_on_a_gpu_without_fp8_is_checked_as_bf16() -> None:
    s = sanity_for(_fake(0.60, gpu="A100-SXM4-80GB", precision="fp8", fp8=None))
    assert s.reference_mfu == pytest.approx(0.6423) and not s.flagged


def test_unmeasured_gpu_reports_no_reference() -> None:
    s = sanity_for(_fake(0.95, gpu="MI300X-192GB"))
    assert s.reference_mfu is None and not s.flagged
    assert s.to_json()["message"].startswith("no published MFU to check against")


# ----------------------------------------------------------------------------- end to end


def _absurd_cluster(tmp_path: Path) -> Path:
    """dgx-h100 whose GPUs run every kernel at 100 % of peak and every link at full speed."""
    spec = yaml.safe_load((ROOT / "clusters" / "dgx-h100.yaml").read_text())
    spec["name"] = "absurd-h100"
    spec["gpu"]["efficiency"] = {"gemm": 1.0, "gemm_fp8": 1.0, "gemm_half_dim": 0.0, "attention": 1.0, "hbm": 1.0,
                                 "intra_node_bw": 1.0, "inter_node_bw": 1.0, "kernel_overhead_us": 0.0}
    path = tmp_path / "absurd-h100.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _evaluate(cluster: str | Path, precision: str = "bf16"):
    from autoshard.api import evaluate, train_job
    from autoshard.specs import load_cluster, load_model

    model = load_model("llama-3.1-8b")
    return evaluate(model, load_cluster(str(cluster)).with_gpus(8),
                    train_job(model, seq_len=4096, global_batch_size=64, precision=precision), tp=1, pp=1)


def test_absurd_efficiency_cluster_is_flagged(tmp_path: Path) -> None:
    from autoshard.report.terminal import render_plan

    plan = _evaluate(_absurd_cluster(tmp_path))
    assert plan.prediction.mfu > 0.4945 * (1 + SANITY_MARGIN)
    s = plan.to_json()["predicted"]["sanity"]
    assert s["flagged"] is True and s["reference_mfu"] == pytest.approx(0.4945)
    assert "NVIDIA/Megatron-LM README.md" in s["citation"] and s["margin"] == SANITY_MARGIN
    json.dumps(s)
    console = Console(record=True, width=200)
    render_plan(plan, console)
    assert "warning: physical sanity: predicted" in console.export_text()


def test_normal_plan_is_not_flagged() -> None:
    from autoshard.report.terminal import render_plan

    plan = _evaluate("dgx-h100", precision="fp8")  # FP8 MFU is against the FP8 peak: well under 44.9 %
    s = plan.to_json()["predicted"]["sanity"]
    assert s["flagged"] is False and s["reference_mfu"] == pytest.approx(0.4487)
    assert s["mfu"] == pytest.approx(plan.prediction.mfu)
    console = Console(record=True, width=200)
    render_plan(plan, console)
    assert "physical sanity" not in console.export_text()


def test_every_bundled_gpu_generation_is_named() -> None:
    # the sanity reference and the bands share the generation map
    for r in REFS:
        assert gpu_generation(r["gpus"][0]) in {"ampere", "hopper", "blackwell"}
