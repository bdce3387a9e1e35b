"""Physical sanity (issue #10 item 5): a predicted useful MFU (causal attention core counted once)
more than 10 % above the best measured useful MFU for its GPU class, precision and dense/MoE is
flagged, with the cited run. The reference table is generated from the held validation runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from rich.console import Console

from autoshard.costmodel import sanity
from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.flops import causal_model_flops_per_step, model_flops_per_step
from autoshard.costmodel.sanity import SANITY_MARGIN, gpu_class, load_mfu_reference, sanity_for, sanity_line
from autoshard.specs import load_model

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = ROOT / "tests" / "validation"
sys.path.insert(0, str(VALIDATION))
REFS = load_mfu_reference()

# (Megatron-Bridge is also the software MLPerf v6.0's NVIDIA reference code runs: its performance pages are reserved)
RESERVED = ("megatron-bridge performance", "megatron-bridge/latest/performance", "megatron-bridge perf", "2407.21783", "llama 3 herd", "nemotron-4", "2406.11704", "opt-175", "2205.01068",
            "bloom", "2211.05100", "deepseek-v3 technical", "2412.19437", "table 2", "long-sequence", "long_sequence",
            "tensorrt-llm 1.0", "lmsys")


# ----------------------------------------------------------------------------- useful FLOPs


def test_causal_flops_closed_form() -> None:
    # the attention core (QK^T and AV) is 4 s^2 h per layer and sequence forward (h = heads x head dim,
    # GQA or not); causal counts half of it, x3 for fwd+bwd: the difference is 6 L s^2 h per sequence
    m = load_model("llama-3.1-8b")
    for s, b in ((4096, 8), (131072, 1)):
        full = model_flops_per_step(m, seq_len=s, global_batch_size=b)
        assert full - causal_model_flops_per_step(m, seq_len=s, global_batch_size=b) == pytest.approx(
            6 * 32 * s * s * 4096 * b, rel=1e-12)
    # at 4k the core is a small part of the work; at 128k it is most of it
    ratio = causal_model_flops_per_step(m, seq_len=131072, global_batch_size=1) / model_flops_per_step(
        m, seq_len=131072, global_batch_size=1)
    assert 0.5 < ratio < 0.7


def test_long_context_runs_measure_absurd_non_causal_mfu_but_sane_useful_mfu() -> None:
    """Why useful MFU: the H100 MoE run at 131k context measures ~72 % in non-causal MFU (above any
    dense H100 run), ~39 % useful."""
    import make_bands

    runs = {r["id"]: r for r in make_bands.measured_useful_mfu()}
    run = runs["moezoo-qwen3-235b-h100-longctx-seq131072"]
    import validate_published

    raw = next(r for r in validate_published.load_runs() if r["id"] == run["id"])
    model = validate_published._model(raw)
    full = model_flops_per_step(model, seq_len=131072, global_batch_size=raw["global_batch_size"])
    useful = causal_model_flops_per_step(model, seq_len=131072, global_batch_size=raw["global_batch_size"])
    assert run["mfu"] == pytest.approx(389.0 / 989, rel=0.01)  # the source logs causal TFLOP/s: 389
    assert run["mfu"] * full / useful > 0.65


# ----------------------------------------------------------------------------- the generated table


def test_reference_table_is_generated_from_the_held_runs() -> None:
    import make_bands

    runs = make_bands.measured_useful_mfu()
    assert len(runs) >= 70
    assert json.loads(json.dumps(make_bands.mfu_reference(runs))) == json.loads(sanity.MFU_REFERENCE_PATH.read_text())


def test_reference_rows_are_consistent_and_cited() -> None:
    import validate_published

    held = {r["id"]: r for r in validate_published.load_runs() if not r.get("skip_throughput")}
    assert len(REFS) >= 8
    for r in REFS:
        assert r["precision"] in ("bf16", "fp8", "fp4") and r["family"] in ("dense", "moe")
        assert r["mfu"] == pytest.approx(r["tflops"] / r["peak_tflops"], rel=1e-3), r["run"]
        run = held[r["run_id"]]  # a held validation run, its citation copied
        assert r["citation"] == " ".join(str(run["source"]).split())
        assert run["precision"] == r["precision"] or r["precision"] == "bf16"
        text = (r["citation"] + " " + r["run"]).lower()
        assert not any(word in text for word in RESERVED), r["citation"]
    keys = [(g, r["precision"], r["family"]) for r in REFS for g in r["gpus"]]
    assert len(keys) == len(set(keys)), "one best row per GPU class x precision x family"


def _peak(cluster: str, precision: str) -> float:
    local = VALIDATION / "clusters" / f"{cluster}.yaml"
    path = local if local.is_file() else ROOT / "clusters" / f"{cluster}.yaml"
    gpu = yaml.safe_load(path.read_text())["gpu"]
    for p in ("fp8", "fp4"):  # the peak the run's quantized GEMMs ran against, where the GPU has it
        if precision == p and gpu.get(f"{p}_tflops"):
            return gpu[f"{p}_tflops"]
    return gpu["bf16_tflops"]


def test_no_measured_validation_run_would_be_flagged() -> None:
    """The flag never fires on what was really measured: every held validation run, dense or MoE,
    set up as a plan whose predicted MFU (autoshard's non-causal convention, computed here from the
    source's metric independently of the generator) is what it measured, passes sanity_for."""
    import validate_published

    checked = {"dense": 0, "moe": 0}
    for run in validate_published.load_runs():
        if run.get("skip_throughput"):
            continue
        result = validate_published.predict_run(run)
        model = validate_published._model(run)
        p = run["parallel"]
        gpus = p["tp"] * p["pp"] * p["dp"] * p["cp"]
        seq, gbs = run["seq_len"], run["global_batch_size"]
        flops = model_flops_per_step(model, seq_len=seq, global_batch_size=gbs)
        tflops = {
            "tflops_per_gpu": lambda v: v,
            "step_time_s": lambda v: flops / v / gpus / 1e12,
            "tokens_per_s_per_gpu": lambda v: flops / (seq * gbs) * v / 1e12,
        }[result.metric](result.measured)
        mfu = tflops / _peak(run["cluster"], run["precision"])
        gpu = validate_published._base_cluster(run["cluster"]).primary.gpu
        plan = SimpleNamespace(
            prediction=SimpleNamespace(mfu=mfu), stages=(SimpleNamespace(pool=0),),
            cluster=SimpleNamespace(pools=(SimpleNamespace(gpu=gpu),)), model=model,
            config=SimpleNamespace(precision=SimpleNamespace(value=run["precision"]), seq_len=seq,
                                   global_batch_size=gbs))
        s = sanity_for(plan)
        family = "moe" if model.is_moe else "dense"
        assert s.reference_mfu is not None, run["id"]
        assert not s.flagged, (run["id"], s.useful_mfu, s.reference_mfu)
        assert s.useful_mfu <= s.reference_mfu * (1 + 1e-3), run["id"]  # the reference is the best
        checked[family] += 1
    assert checked["dense"] >= 55 and checked["moe"] >= 12


@pytest.mark.parametrize(("gpu", "precision", "family", "run_id", "note"), [
    # H100 BF16 dense: mlm-h100-weak-16B before item AF, nemo2504-dgxc-h100-bf16-llama31-405b-512gpu at item AF
    ("H100-SXM5-80GB", "bf16", "dense", "dgxc2411-h100-bf16-llama31-405b-192gpu", ""),
    ("H200-SXM-141GB", "bf16", "dense", "dgxc2411-h100-bf16-llama31-405b-192gpu", ""),
    ("H100-SXM5-80GB", "fp8", "dense", "mlperf41-nvidia-h100-gpt3-175b-256gpu", ""),
    ("H100-SXM5-80GB", "bf16", "moe", "nemo2504-dgxc-h100-bf16-grok1-314b-512gpu", ""),
    ("H100-SXM5-80GB", "fp8", "moe", "nemo2504-dgxc-h100-fp8-grok1-314b-512gpu", ""),
    ("A100-SXM4-80GB", "bf16", "dense", "mpt-a100-7b-seq2048-8gpu", ""),
    ("A100-SXM4-40GB", "bf16", "moe", "mpt-a100-7b-seq2048-8gpu", "dense run"),
    ("GB200-186GB", "fp8", "moe", "nemo2504-dgxc-gb200-fp8-grok1-314b-512gpu", ""),
    ("GB200-186GB", "fp8", "dense", "nemo2504-gb200-fp8-gpt3-175b", ""),
    ("B200-SXM-180GB", "fp8", "dense", "nemo2502-b200-fp8-gpt3-175b", ""),
    ("B200-SXM-180GB", "bf16", "moe", "nemo2504-dgxc-gb200-bf16-grok1-314b-512gpu", "on GB200"),  # same generation
    ("B200-SXM-180GB", "bf16", "dense", "nemo2504-dgxc-gb200-bf16-llama31-405b-128gpu", "on GB200"),  # since item AF
    ("GB200-186GB", "bf16", "dense", "nemo2504-dgxc-gb200-bf16-llama31-405b-128gpu", ""),
    ("GB300-288GB", "fp8", "dense", "mlperf51-nvidia-gb300-llama31-8b-72gpu-cp2", ""),  # its own row (MLPerf v5.1)
    # NVFP4 (item T): its own rows, else the FP8 row (MFU against half the FP4 peak), before the BF16 one
    ("GB200-186GB", "fp4", "dense", "mlperf51-nvidia-gb200-llama31-405b-512gpu-fp4", ""),
    ("GB300-288GB", "fp4", "dense", "mlperf60-nvidia-gb300-llama31-405b-512gpu-fp4", ""),
    ("GB200-186GB", "fp4", "moe", "mlperf51-nvidia-gb200-llama31-405b-512gpu-fp4", "dense run"),
    ("B200-SXM-180GB", "fp4", "dense", "mlperf60-supermicro-b200-llama31-8b-8gpu-fp4", ""),  # FP8 attention
])
def test_reference_lookup(gpu: str, precision: str, family: str, run_id: str, note: str) -> None:
    ref, got_note = sanity._reference(gpu, precision, family, REFS)
    assert ref is not None and ref["run_id"] == run_id
    assert got_note == note


def test_an_fp4_plan_without_fp4_rows_is_bounded_by_the_fp8_row() -> None:
    """Every Blackwell class has a held FP4 row now; without them an FP4 plan falls back to its class's FP8
    row (MFU against half the FP4 peak), before any BF16 one."""
    no_fp4 = [r for r in REFS if r["precision"] != "fp4"]
    ref, note = sanity._reference("B200-SXM-180GB", "fp4", "dense", no_fp4)
    assert ref is not None and ref["run_id"] == "nemo2502-b200-fp8-gpt3-175b" and note == "fp8 run"


@pytest.mark.parametrize(("gpu", "precision", "family"), [
    ("MI300X-192GB", "bf16", "dense"), ("L40S-48GB", "bf16", "moe"), ("L40S-48GB", "bf16", "dense"),
])
def test_no_reference_means_no_flag(gpu: str, precision: str, family: str) -> None:
    # a dense plan is never bounded by a MoE row, nor an unmeasured GPU by another generation's
    assert sanity._reference(gpu, precision, family, REFS) == (None, "")


@pytest.mark.parametrize(("name", "cls"), [
    ("H200-SXM-141GB", ("H100", "H200", "H800", "GH200")), ("GH200-96GB", ("H100", "H200", "H800", "GH200")),
    ("GB200-186GB", ("GB200",)), ("B200-SXM-180GB", ("B200", "B100")), ("A800-80GB", ("A100", "A800")),
    ("Gaudi3-128GB", ("GAUDI3",)),
])
def test_gpu_class(name: str, cls: tuple[str, ...]) -> None:
    assert gpu_class(name) == cls


def _fake(mfu: float, gpu: str = "H100-SXM5-80GB", precision: str = "bf16", fp8: float | None = 1979,
          seq_len: int = 4096):
    pool = SimpleNamespace(gpu=SimpleNamespace(name=gpu, fp8_tflops=fp8))
    return SimpleNamespace(prediction=SimpleNamespace(mfu=mfu), stages=(SimpleNamespace(pool=0),),
                           cluster=SimpleNamespace(pools=(pool,)), model=load_model("llama-3.1-8b"),
                           config=SimpleNamespace(precision=SimpleNamespace(value=precision), seq_len=seq_len,
                                                  global_batch_size=8))


def _useful_share(seq_len: int) -> float:
    m = load_model("llama-3.1-8b")
    return (causal_model_flops_per_step(m, seq_len=seq_len, global_batch_size=8)
            / model_flops_per_step(m, seq_len=seq_len, global_batch_size=8))


def test_threshold_is_ten_percent_above_the_reference_in_useful_mfu() -> None:
    ref = next(r for r in REFS if r["run_id"] == "dgxc2411-h100-bf16-llama31-405b-192gpu")["mfu"]
    limit = ref * (1 + SANITY_MARGIN) / _useful_share(4096)  # the plan's (non-causal) MFU at the limit
    assert not sanity_for(_fake(limit - 1e-6)).flagged
    assert sanity_for(_fake(limit + 1e-6)).flagged
    assert sanity_line(_fake(0.30)) is None
    line = sanity_line(_fake(0.66))
    assert line is not None and f"{66 * _useful_share(4096):.1f} % useful MFU" in line
    assert f"{100 * ref:.1f} %" in line and "dgxc2411-h100-bf16-llama31-405b-192gpu" in line
    # the same plan MFU at 128k context is mostly attention the causal mask skips: no flag
    assert not sanity_for(_fake(0.66, seq_len=131072)).flagged


def test_fp8_on_a_gpu_without_fp8_is_checked_as_bf16() -> None:
    s = sanity_for(_fake(0.60, gpu="A100-SXM4-80GB", precision="fp8", fp8=None))
    assert s.reference_mfu == pytest.approx(0.6174, abs=1e-4) and not s.flagged


def test_unmeasured_gpu_reports_no_reference() -> None:
    s = sanity_for(_fake(0.95, gpu="MI300X-192GB"))
    assert s.reference_mfu is None and not s.flagged
    assert s.to_json()["message"].startswith("no measured MFU to check against")


# ----------------------------------------------------------------------------- end to end


def _absurd_cluster(tmp_path: Path) -> Path:
    """dgx-h100 whose GPUs run every kernel at 100 % of peak and every link at full speed."""
    spec = yaml.safe_load((ROOT / "clusters" / "dgx-h100.yaml").read_text())
    spec["name"] = "absurd-h100"
    spec["gpu"]["efficiency"] = {"gemm": 1.0, "gemm_fp8": 1.0, "gemm_half_dim": 0.0, "attention": 1.0, "hbm": 1.0,
                                 "intra_node_bw": 1.0, "inter_node_bw": 1.0, "kernel_overhead_us": 0.0,
                                 "train_gemm": 1.0, "train_gemm_fp8": 1.0, "train_hbm": 1.0, "train_attention": 1.0}
    path = tmp_path / "absurd-h100.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _evaluate(cluster: str | Path, precision: str = "bf16"):
    from autoshard.api import evaluate, train_job
    from autoshard.specs import load_cluster

    model = load_model("llama-3.1-8b")
    return evaluate(model, load_cluster(str(cluster)).with_gpus(8),
                    train_job(model, seq_len=4096, global_batch_size=64, precision=precision), tp=1, pp=1)


def test_absurd_efficiency_cluster_is_flagged(tmp_path: Path) -> None:
    from autoshard.report.terminal import render_plan

    plan = _evaluate(_absurd_cluster(tmp_path))
    ref = next(r for r in REFS if r["run_id"] == "dgxc2411-h100-bf16-llama31-405b-192gpu")
    s = plan.to_json()["predicted"]["sanity"]
    assert s["useful_mfu"] > ref["mfu"] * (1 + SANITY_MARGIN)
    assert s["flagged"] is True and s["reference_mfu"] == pytest.approx(ref["mfu"])
    assert s["mfu"] == pytest.approx(plan.prediction.mfu) and s["useful_mfu"] < s["mfu"]
    assert "NVIDIA/dgxc-benchmarking" in s["citation"] and s["margin"] == SANITY_MARGIN
    json.dumps(s)
    console = Console(record=True, width=200)
    render_plan(plan, console)
    assert "warning: physical sanity: predicted" in console.export_text()


def test_normal_plan_is_not_flagged() -> None:
    from autoshard.report.terminal import render_plan

    plan = _evaluate("dgx-h100", precision="fp8")  # FP8 MFU is against the FP8 peak: well under 47.9 %
    s = plan.to_json()["predicted"]["sanity"]
    assert s["flagged"] is False and s["reference_mfu"] == pytest.approx(0.4785, abs=1e-4)
    assert s["mfu"] == pytest.approx(plan.prediction.mfu)
    console = Console(record=True, width=200)
    render_plan(plan, console)
    assert "physical sanity" not in console.export_text()


def test_every_reference_gpu_generation_is_named() -> None:
    # the sanity reference and the bands share the generation map
    for r in REFS:
        assert gpu_generation(r["gpus"][0]) in {"ampere", "hopper", "blackwell", "cdna3"}


def test_a_plan_on_two_pools_is_checked_against_their_peak_weighted_references() -> None:
    """A plan's MFU on several pools is against the peak-weighted mean of their GPUs (train.step), so the
    ceiling weights each pool's best measured useful MFU the same way: 70B TP8 PP3 DP4 on
    mixed-h100-a100 (1 stage of 32 H100, 2 of 32 A100) was flagged at 52.4 % against H100's 47.1 % alone (H100's
    best measured is 52.8 % since item AF: NeMo 25.04's Llama 3.1 405B BF16 on 512 H100; 54.6 % since item AG: NeMo
    24.09's 42-layer Llama 3.1 405B proxy on 192 H100 from DGX Cloud Benchmarking v24.11)."""
    h100 = SimpleNamespace(name="H100-SXM5-80GB", bf16_tflops=989.0, fp8_tflops=1979.0)
    a100 = SimpleNamespace(name="A100-SXM4-80GB", bf16_tflops=312.0, fp8_tflops=None)
    plan = _fake(0.66)  # 0.62 until item AG: H100's reference alone now passes it
    plan.cluster = SimpleNamespace(pools=(SimpleNamespace(gpu=h100), SimpleNamespace(gpu=a100)))
    plan.stages = (SimpleNamespace(pool=0), SimpleNamespace(pool=1), SimpleNamespace(pool=1))
    ref = {r["run_id"]: r["mfu"] for r in REFS}
    h100, a100 = ref["dgxc2411-h100-bf16-llama31-405b-192gpu"], ref["mpt-a100-7b-seq2048-8gpu"]
    want = (h100 * 989 + 2 * a100 * 312) / (989 + 2 * 312)
    s = sanity_for(plan)
    # 0.5624 at item AF
    assert s.reference_mfu == pytest.approx(want, rel=1e-12) and want == pytest.approx(0.5737, abs=1e-4)
    assert not s.flagged and s.reference.startswith("peak-weighted over the pools' GPUs: 54.6 % on H100")
    assert "61.7 % on A100-SXM4-80GB (mpt-a100-7b-seq2048-8gpu" in s.reference
    # a plan on the H100 stage alone keeps the H100 reference
    plan.stages = (SimpleNamespace(pool=0),)
    assert sanity_for(plan).reference_mfu == ref["dgxc2411-h100-bf16-llama31-405b-192gpu"] and sanity_for(plan).flagged


def test_mixed_cluster_study_band_holds_its_point() -> None:
    from autoshard.study.run import run_study

    res = run_study("llama-3.1-70b", ["mixed-h100-a100"], [96], tokens=1e12, jobs=1, time_limit_s=60)
    (r,) = res.rows
    # 0.5894 at items AF-AG (H100 NVLink 0.9; 0.7 since item AH's source-weighted fit), 0.5629 before item AF
    assert r.plan == "TP8 PP3 DP4 mbs1" and r.mfu == pytest.approx(0.5828, abs=1e-4)
    assert r.sanity == ""  # "56.2% !" before
    assert r.days == pytest.approx(185.2, abs=0.05)  # 183.2 at items AF-AG, 191.8 before item AF, 192.2 before item AC
    assert r.days_low < r.days < r.days_high  # the band read 194.4-210.9 days beside 192.2
    # 163.0-212.2 at item AG, 162.8-215.1 at item AF, 173.6-218.9 before item AF
    assert (round(r.days_low, 1), round(r.days_high, 1)) == (166.8, 212.5)
    # at item AF the band's fast edge was capped at 61.9 % useful MFU (the peak-weighted best measured 56.2 % + 10 %);
    # since item AG that reference is 57.4 % (H100's 54.6 %) and the band stays under its cap
    assert "capped" not in r.band_basis and r.band_basis.startswith("no measured mixed dense bf16 training run")
