"""Prediction bands (issue #10 item 4): the statistic, the fallbacks, the packaged table, the JSON shape."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.costmodel import bands
from autoshard.costmodel.bands import (
    DEFAULT_MEMORY_RATIO,
    DEFAULT_RATIO,
    FALLBACK_FLOOR,
    MIN_HALF_WIDTH,
    Band,
    Kind,
    band_for,
    build_table,
    gpu_generation,
    load_table,
    lookup,
    ratio_band,
    small_sample_factor,
)

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((DATA / "bands_residuals_fixture.json").read_text())


@pytest.fixture(scope="module")
def table() -> dict:
    return build_table(FIXTURE, residuals="out-of-source", sources=["fixture"])


# ----------------------------------------------------------------------------- the statistic


@pytest.mark.parametrize(("n", "t90"), [(2, 3.078), (3, 1.886), (5, 1.533), (10, 1.383), (31, 1.310)])
def test_small_sample_factor_is_the_prediction_interval_ratio(n: int, t90: float) -> None:
    # k(n) = t(0.90, n-1) sqrt(1 + 1/n) / z(0.90), Student's t from standard tables
    assert small_sample_factor(n) == pytest.approx(t90 * math.sqrt(1 + 1 / n) / 1.2815516, rel=1e-6)


def test_small_sample_factor_beyond_the_table() -> None:
    # Cornish-Fisher expansion beyond 30 degrees of freedom: t(0.90, 40) = 1.303, t(0.90, 120) = 1.289
    assert small_sample_factor(41) == pytest.approx(1.303 * math.sqrt(1 + 1 / 41) / 1.2815516, abs=1e-3)
    assert small_sample_factor(121) == pytest.approx(1.289 * math.sqrt(1 + 1 / 121) / 1.2815516, abs=1e-3)
    assert small_sample_factor(10_000) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError):
        small_sample_factor(1)


def test_small_sample_factor_falls_with_more_runs() -> None:
    ks = [small_sample_factor(n) for n in range(2, 200)]
    assert all(a > b for a, b in zip(ks, ks[1:], strict=False))


def test_ratio_band_matches_numpy_percentiles() -> None:
    ratios = [0.82, 0.9, 0.95, 1.0, 1.02, 1.04, 1.1, 1.3]
    x = np.log(ratios)
    c = np.median(x)
    k = small_sample_factor(len(ratios))
    lo = c + k * (np.quantile(x, 0.1) - c)
    hi = c + k * (np.quantile(x, 0.9) - c)
    assert ratio_band(ratios) == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-12)


def test_ratio_band_counts_sources_not_runs() -> None:
    ratios = [0.9, 0.95, 1.0, 1.05, 1.1, 0.9, 0.95, 1.0, 1.05, 1.1]
    by_runs = ratio_band(ratios)
    by_two_sources = ratio_band(ratios, sources=2)
    assert by_two_sources[0] < by_runs[0] and by_two_sources[1] > by_runs[1]
    # k(2) / k(10) times wider in ln units around the median (0)
    ratio = math.log(by_two_sources[1]) / math.log(by_runs[1])
    assert ratio == pytest.approx(small_sample_factor(2) / small_sample_factor(10), rel=1e-9)


def test_ratio_band_minimum_width() -> None:
    lo, hi = ratio_band([1.2, 1.2, 1.2])
    assert (lo, hi) == pytest.approx((1.2 * math.exp(-MIN_HALF_WIDTH), 1.2 * math.exp(MIN_HALF_WIDTH)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.3, max_value=3.0), min_size=2, max_size=40))
def test_ratio_band_contains_the_median_and_is_at_least_the_minimum(ratios: list[float]) -> None:
    lo, hi = ratio_band(ratios)
    med = float(np.exp(np.median(np.log(ratios))))
    assert lo <= med * math.exp(-MIN_HALF_WIDTH) * (1 + 1e-9)
    assert hi >= med * math.exp(MIN_HALF_WIDTH) * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=0.5, max_value=2.0), min_size=12, max_size=12),
       st.integers(min_value=2, max_value=11))
def test_fewer_independent_runs_give_a_wider_band(ratios: list[float], sources: int) -> None:
    # the same residuals backed by fewer independent sources: never narrower
    fewer, more = ratio_band(ratios, sources=sources), ratio_band(ratios, sources=sources + 1)
    assert fewer[0] <= more[0] * (1 + 1e-12) and fewer[1] >= more[1] * (1 - 1e-12)


# ----------------------------------------------------------------------------- the table and its fallbacks


@pytest.mark.parametrize(("row", "key"), [
    ({"gpu": "GB200", "family": "MoE", "precision": "MXFP8", "mode": "train"}, "blackwell/moe/fp8/train"),
    ({"gpu": "H100", "family": "dense", "precision": "fp8-blockwise", "mode": "serving"}, "hopper/dense/fp8/serve"),
    ({"gpu": "A100", "family": "dense", "precision": "amp_bf16", "mode": "training"}, "ampere/dense/bf16/train"),
    ({"gpu": "MI300X", "family": "dense", "precision": "int4", "mode": "serve"}, "cdna3/dense/int4/serve"),
])
def test_residual_kinds_are_named_as_plans_name_them(row: dict, key: str) -> None:
    assert bands.residual_kind(row).key == key


def test_throughput_ratio_inverts_time_metrics() -> None:
    by_id = {r["id"]: r for r in FIXTURE}
    assert bands.throughput_ratio(by_id["h-bf16-a"]) == pytest.approx(0.95)  # tflops: measured / predicted
    assert bands.throughput_ratio(by_id["h-bf16-d"]) == pytest.approx(1.1)  # step time: predicted / measured
    assert bands.memory_ratio(by_id["h-bf16-a"]) == pytest.approx(60 / 62)
    assert bands.memory_ratio(by_id["h-bf16-c"]) is None


def test_exact_kind(table: dict) -> None:
    got = lookup(Kind("hopper", "dense", "bf16", "train"), table)
    assert got.level == "kind" and got.runs == 4
    assert got.basis == "hopper dense bf16 training, 4 measured runs"
    # 2 sources (srcA, srcB): the factor counts sources
    assert (got.low, got.high) == pytest.approx(ratio_band([0.95, 1.0, 1.05, 1.1], sources=2), abs=1e-4)


def test_single_run_kind_falls_back_to_its_generation(table: dict) -> None:
    got = lookup(Kind("hopper", "dense", "fp8", "train"), table)
    assert got.level == "generation" and got.runs == 1
    assert got.basis.startswith("only 1 measured hopper dense fp8 training run: widest band of hopper training runs "
                                "(5 measured)")
    exact = lookup(Kind("hopper", "dense", "bf16", "train"), table)
    assert got.low <= exact.low and got.high >= exact.high
    assert got.low <= 0.8  # the one fp8 run (560 measured / 700 predicted) lies inside


def test_unmeasured_family_falls_back_wider(table: dict) -> None:
    got = lookup(Kind("hopper", "moe", "bf16", "train"), table)
    assert got.level == "generation" and got.runs == 0
    assert got.basis.startswith("no measured hopper MoE bf16 training run: widest band of hopper training runs")
    # at least FALLBACK_FLOOR either side of the pool's median
    med = math.exp(float(np.median(np.log([0.95, 1.0, 1.05, 1.1, 0.8]))))
    assert got.low <= med * math.exp(-FALLBACK_FLOOR["generation"]) + 1e-4
    assert got.high >= med * math.exp(FALLBACK_FLOOR["generation"]) - 1e-4


def test_unmeasured_generation_falls_back_to_the_whole_mode(table: dict) -> None:
    got = lookup(Kind("blackwell", "dense", "bf16", "train"), table)
    assert got.level == "mode" and got.runs == 0
    assert got.basis == "no measured blackwell dense bf16 training run: widest band of all training runs (8 measured)"
    for key in table["throughput"]["kinds"]:
        gen, fam, prec, mode = key.split("/")
        if mode == "train":
            inner = lookup(Kind(gen, fam, prec, mode), table)
            assert got.low <= inner.low and got.high >= inner.high
    for key in ("hopper/train", "ampere/train"):
        g = table["throughput"]["generations"][key]
        assert got.low <= g["low"] and got.high >= g["high"]
    assert got.high / got.low >= math.exp(2 * FALLBACK_FLOOR["mode"]) - 1e-3


def test_widening_order_kind_generation_mode(table: dict) -> None:
    kind = lookup(Kind("ampere", "dense", "bf16", "train"), table)
    gen = table["throughput"]["generations"]["ampere/train"]
    mode = table["throughput"]["modes"]["train"]
    assert kind.high / kind.low <= gen["high"] / gen["low"] <= mode["high"] / mode["low"]


def test_runs_not_held_do_not_shape_throughput_bands(table: dict) -> None:
    ampere = lookup(Kind("ampere", "dense", "bf16", "train"), table)
    assert ampere.runs == 3 and ampere.low > 0.5  # the 0.5x run not held is left out
    with_it = build_table(FIXTURE, residuals="out-of-source", held_only=False)
    assert lookup(Kind("ampere", "dense", "bf16", "train"), with_it).runs == 4
    # but its memory figure counts
    assert table["memory"]["modes"]["train"]["runs"] == 4


def test_serving_kinds_and_default(table: dict) -> None:
    got = lookup(Kind("hopper", "dense", "bf16", "serve"), table)
    assert got.level == "generation" and got.basis.startswith("no measured hopper dense bf16 serving run")
    empty = build_table([], residuals="none")
    d = lookup(Kind("cdna3", "moe", "fp8", "serve"), empty)
    assert (d.low, d.high, d.runs, d.level) == (DEFAULT_RATIO[0], DEFAULT_RATIO[1], 0, "default")
    assert d.basis == "no measured serving run: default band 0.5-1.5x of the prediction"
    m = lookup(Kind("hopper", "dense", "bf16", "serve"), table, section="memory")
    assert (m.low, m.high, m.level) == (*DEFAULT_MEMORY_RATIO, "default")


@pytest.mark.parametrize(("name", "gen"), [
    ("H100-SXM5-80GB", "hopper"), ("H200-SXM-141GB", "hopper"), ("H100-PCIe-80GB", "hopper"), ("GH200", "hopper"),
    ("GB200-186GB", "blackwell"), ("B200-SXM-180GB", "blackwell"), ("A100-SXM4-40GB", "ampere"),
    ("NVIDIA A100 80GB", "ampere"), ("MI300X-192GB", "cdna3"), ("L40S-48GB", "ada"), ("Gaudi3", "gaudi3"),
])
def test_gpu_generation(name: str, gen: str) -> None:
    assert gpu_generation(name) == gen


def test_every_bundled_gpu_has_a_known_generation() -> None:
    known = {g for _, g in bands._GENERATIONS}
    for path in sorted((ROOT / "clusters").glob("*.yaml")):
        text = yaml.safe_load(path.read_text())
        pools = text.get("pools") or [text]
        for pool in pools:
            assert gpu_generation(pool["gpu"]["name"]) in known, path.name


# ----------------------------------------------------------------------------- the packaged table


def test_packaged_table_loads_and_is_consistent() -> None:
    t = load_table()
    assert t["schema"] == "autoshard.bands/v1" and t["residuals"] in ("out-of-source", "in-sample")
    for section in ("throughput", "memory"):
        for level in ("kinds", "generations", "modes"):
            for key, b in t[section][level].items():
                assert 0 < b["low"] < b["high"], key
                assert b["runs"] >= 2, key
    # the packaged file is what the builder writes: rebuilding it from the fixture keeps its shape
    assert set(build_table(FIXTURE, residuals="in-sample")) == set(t)


def test_packaged_table_ships_in_the_package() -> None:
    assert bands.TABLE_PATH.parent == Path(bands.__file__).parent
    assert bands.MFU_REFERENCE_PATH.is_file() and bands.TABLE_PATH.is_file()


def test_make_bands_coverage_on_the_fixture() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "validation"))
    import make_bands

    t = build_table(FIXTURE, residuals="out-of-source")
    inside, total = make_bands.coverage(FIXTURE, t)
    assert total == 11  # the run not held is not counted
    assert inside / total >= 0.8
    # leave-one-source-out: the single fp8 run, seen without its source, falls in the hopper fallback
    loso_in, loso_total = make_bands.coverage(FIXTURE, "loso")
    assert loso_total == 11 and 0 < loso_in <= loso_total
    mem_in, mem_total = make_bands.coverage(FIXTURE, t, section="memory")
    assert mem_total == 4 and mem_in == 4


# ----------------------------------------------------------------------------- bands of real plans


@pytest.fixture(scope="module")
def h100_plan():
    from autoshard.api import evaluate, train_job
    from autoshard.specs import load_cluster, load_model

    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100").with_gpus(8)
    return evaluate(model, cluster, train_job(model, seq_len=4096, global_batch_size=64), tp=1, pp=1)


def test_plan_band_is_the_table_ratio_times_the_prediction(h100_plan, table: dict, monkeypatch) -> None:
    monkeypatch.setattr(bands, "load_mfu_reference", lambda: ())  # no sanity ceiling: the plain band
    band = band_for(h100_plan, table)
    want = lookup(Kind("hopper", "dense", "bf16", "train"), table)
    pred = h100_plan.prediction
    assert band.tokens_per_s == pytest.approx((pred.tokens_per_s * want.low, pred.tokens_per_s * want.high))
    assert band.step_time_s == pytest.approx((pred.step_time_s / want.high, pred.step_time_s / want.low))
    mem = lookup(Kind("hopper", "dense", "bf16", "train"), table, section="memory")
    gib = pred.peak_memory_bytes / 2 ** 30
    assert band.memory_gib_peak == pytest.approx((gib * mem.low, gib * mem.high))
    assert band.runs == 4
    assert band.basis == ("hopper dense bf16 training, 4 measured runs; memory: hopper dense bf16 training, "
                          "3 measured runs")
    # tokens per step is the same at both ends
    tokens = 64 * 4096
    assert band.tokens_per_s[0] * band.step_time_s[1] == pytest.approx(tokens)


def test_band_is_capped_at_the_sanity_ceiling(h100_plan, table: dict) -> None:
    want = lookup(Kind("hopper", "dense", "bf16", "train"), table)
    s = bands.sanity_for(h100_plan)
    ceiling = s.reference_mfu * (1 + bands.SANITY_MARGIN) / s.mfu
    tps = h100_plan.prediction.tokens_per_s
    # a plan predicted at MFU m has its band's top at most the best published MFU + 10 %
    band = band_for(h100_plan, table)
    assert band.tokens_per_s[1] <= tps * ceiling * (1 + 1e-12)
    if want.high > ceiling > want.low:
        assert band.tokens_per_s == pytest.approx((tps * want.low, tps * ceiling))
        assert "capped at 54.4 % MFU, the best published 49.5 % + 10 %" in band.basis
    # a plan whose whole band lies above the ceiling keeps its width, moved under the ceiling
    absurd = dataclasses.replace(h100_plan, prediction=dataclasses.replace(h100_plan.prediction, mfu=0.95), band=None)
    got = band_for(absurd, table)
    top = 0.4945 * 1.1 / 0.95
    assert got.tokens_per_s == pytest.approx((tps * top * want.low / want.high, tps * top))
    assert got.step_time_s[0] == pytest.approx(h100_plan.prediction.step_time_s / top)


def test_plan_json_band_shape(h100_plan) -> None:
    obj = h100_plan.to_json()
    b = obj["predicted"]["band"]
    assert set(b) == {"tokens_per_s", "step_time_s", "memory_gib_peak", "basis", "runs"}
    for key in ("tokens_per_s", "step_time_s", "memory_gib_peak"):
        assert len(b[key]) == 2 and 0 < b[key][0] < b[key][1]
    assert isinstance(b["basis"], str) and "hopper dense bf16 training" in b["basis"]
    assert isinstance(b["runs"], int)
    json.dumps(obj)  # serializable


def test_evaluate_attaches_the_band(h100_plan) -> None:
    assert h100_plan.band is not None and h100_plan.band == band_for(h100_plan)


def test_mixed_generation_plan_falls_back_to_the_mode(h100_plan, table: dict) -> None:
    from autoshard.specs import load_cluster

    cluster = load_cluster("mixed-h100-a100")
    stage = h100_plan.stages[0]
    stages = (dataclasses.replace(stage, pool=0), dataclasses.replace(stage, pool=1))
    assert {gpu_generation(p.gpu.name) for p in cluster.pools} == {"hopper", "ampere"}
    mixed = dataclasses.replace(h100_plan, cluster=cluster, stages=stages, band=None)
    assert bands._plan_kind(mixed) == Kind("mixed", "dense", "bf16", "train")
    one_pool = dataclasses.replace(mixed, stages=(stages[1],))
    assert bands._plan_kind(one_pool) == Kind("ampere", "dense", "bf16", "train")
    got = lookup(Kind("mixed", "dense", "bf16", "train"), table)
    assert got.level == "mode" and got.basis.startswith("no measured mixed dense bf16 training run")


def test_serve_plan_band(table: dict) -> None:
    from autoshard.search.serve import evaluate_serve
    from autoshard.serve_api import serve_job_for
    from autoshard.specs import load_cluster, load_model

    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100").with_gpus(8)
    plan = evaluate_serve(model, cluster, serve_job_for(model, weight_dtype="fp8"), tp=1)
    band = band_for(plan, table)
    want = lookup(Kind("hopper", "dense", "fp8", "serve"), table)
    assert want.level == "kind"
    assert band.tokens_per_s == pytest.approx((plan.throughput_tokens_per_s * want.low,
                                               plan.throughput_tokens_per_s * want.high))
    assert band.step_time_s == pytest.approx((plan.prediction.tpot_s / want.high, plan.prediction.tpot_s / want.low))
    b = plan.to_json()["predicted"]["band"]
    assert set(b) >= {"tokens_per_s", "step_time_s", "memory_gib_peak", "basis", "runs"}
    assert "serving" in b["basis"]


# ----------------------------------------------------------------------------- ties in --top


def _with_band(plan, lo: float, hi: float):
    tps = plan.prediction.tokens_per_s
    return dataclasses.replace(plan, band=Band((tps * lo, tps * hi), (1.0, 2.0), (1.0, 2.0), "test", 3))


def test_ties_mark_overlapping_bands(h100_plan) -> None:
    # three copies of one plan: the second overlaps the best, the third's band lies wholly below it
    best = _with_band(h100_plan, 0.95, 1.05)
    close = dataclasses.replace(_with_band(h100_plan, 0.94, 1.04))
    slow = _with_band(h100_plan, 0.5, 0.9)
    marked = bands.mark_ties([best, close, slow])
    assert marked[0].band.tied_with_best is None
    assert marked[1].band.tied_with_best is True
    assert marked[2].band.tied_with_best is False
    assert [bands.tie_text(p) for p in marked] == ["", "tied", "slower"]
    assert marked[1].to_json()["predicted"]["band"]["tied_with_best"] is True
    assert "tied_with_best" not in marked[0].to_json()["predicted"]["band"]


def test_tied_compares_per_gpu() -> None:
    a = Band((800.0, 1000.0), (1, 2), (1, 2), "x", 2)
    b = Band((1700.0, 2100.0), (1, 2), (1, 2), "x", 2)  # twice the GPUs: 850-1050 per GPU
    assert bands.tied(a, b, best_gpus=8, other_gpus=16)
    assert not bands.tied(a, b, best_gpus=16, other_gpus=8)  # 50-62.5 vs 212-262 per GPU


def test_solve_top_k_marks_ties() -> None:
    from autoshard.api import solve, train_job
    from autoshard.search.run import SolverOptions
    from autoshard.specs import load_cluster, load_model

    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100").with_gpus(16)
    plans = solve(model, cluster, train_job(model, seq_len=4096, global_batch_size=128),
                  options=SolverOptions(top_k=3, num_workers=1, time_limit_s=20))
    assert len(plans) >= 2
    assert plans[0].band is not None and plans[0].band.tied_with_best is None
    for p in plans[1:]:
        expect = bands.tied(plans[0].band, p.band, best_gpus=plans[0].num_gpus, other_gpus=p.num_gpus)
        assert p.band.tied_with_best is expect


def test_terminal_shows_band_and_ties(h100_plan) -> None:
    from rich.console import Console

    from autoshard.report.terminal import render_plan

    best = _with_band(h100_plan, 0.95, 1.05)
    marked = bands.mark_ties([best, _with_band(h100_plan, 0.94, 1.04), _with_band(h100_plan, 0.5, 0.9)])
    console = Console(record=True, width=160)
    render_plan(marked[0], console, runners=marked[1:])
    text = console.export_text()
    per_gpu = h100_plan.prediction.tokens_per_s_per_gpu
    assert f"likely {bands._sig3(0.95 * per_gpu)}-{bands._sig3(1.05 * per_gpu)} tokens/s per GPU (test)" in text
    assert "tied" in text and "slower" in text


@pytest.mark.parametrize(("x", "text"), [(1146.0, "1,150"), (999.6, "1,000"), (76118.4, "76,100"), (12.34, "12.3"),
                                         (0.5, "0.500")])
def test_three_significant_digits(x: float, text: str) -> None:
    assert bands._sig3(x) == text


def test_make_bands_rejects_unusable_residual_rows(tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "validation"))
    import make_bands

    good = tmp_path / "good.json"
    good.write_text(json.dumps(FIXTURE))
    assert len(make_bands.load_residuals([good, tmp_path / "absent.json"])) == len(FIXTURE)
    for bad, message in ((dict(FIXTURE[0], predicted_loso=None), "has no predicted_loso"),
                         (dict(FIXTURE[0], measured=0.0), "must be positive")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps([bad]))
        with pytest.raises(SystemExit, match=message):
            make_bands.load_residuals([path])


def test_make_bands_writes_the_table_from_residual_files(tmp_path, monkeypatch, capsys) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "validation"))
    import make_bands

    train = tmp_path / "residuals_train.json"
    train.write_text(json.dumps([r for r in FIXTURE if r["mode"] == "train"]))
    serve = tmp_path / "residuals_serve.json"
    serve.write_text(json.dumps([r for r in FIXTURE if r["mode"] == "serve"]))
    monkeypatch.setattr(make_bands, "RESIDUALS", (train, serve))
    out = tmp_path / "table.json"
    assert make_bands.main(["--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(build_table(FIXTURE, residuals="out-of-source",
                                                        sources=sorted({r["source"] for r in FIXTURE}))))
    text = capsys.readouterr().out
    assert "throughput coverage: in-table 11/11 = 100%; leave-one-source-out 5/11 = 45%" in text
    monkeypatch.setattr(make_bands, "RESIDUALS", (tmp_path / "none.json",))
    assert make_bands.main(["--check"]) == 2


def test_make_bands_in_sample_meets_the_coverage_target(capsys) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "validation"))
    import make_bands

    assert make_bands.main(["--in-sample", "--check"]) == 0  # >= 80 % of runs inside their band
    assert "leave-one-source-out" in capsys.readouterr().out
