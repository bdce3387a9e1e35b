"""Cost studies show days and dollars as ranges from the plans' prediction bands (issue #10 item 4)."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import gpu, node, tiny_model

from autoshard.costmodel.band_table import Kind
from autoshard.costmodel.bands import lookup
from autoshard.study.report import table_rows, write_outputs
from autoshard.specs import ClusterSpec
from autoshard.specs.job import ServeJob
from autoshard.study.run import _serve_row, _train_row, run_study
from autoshard.study.costs import likely, train_ranges


def test_train_ranges_closed_form() -> None:
    tokens, gpus, price = 15e12, 1024, 2.5
    d_lo, d_hi, usd_lo, usd_hi = train_ranges(tokens=tokens, band=(1.0e6, 1.5e6), num_gpus=gpus,
                                              price_per_gpu_hour=price)
    assert d_lo == tokens / 1.5e6 / 86400 and d_hi == tokens / 1.0e6 / 86400
    assert usd_lo == pytest.approx(gpus * d_lo * 24 * price, rel=1e-12)
    assert usd_hi == pytest.approx(gpus * d_hi * 24 * price, rel=1e-12)
    assert train_ranges(tokens=tokens, band=(1.0e6, 1.5e6), num_gpus=gpus, price_per_gpu_hour=None)[2:] == (None, None)


def _figures(**extra) -> dict:
    return {"gpu": "H100", "plan": "TP1 PP1 DP8 mbs1", "degrees": {"tp": 1}, "status": "optimal", "gap": 0.0,
            "solve_s": 0.1, "mfu": 0.4, "tokens_per_s": 1.2e6, "tokens_per_s_band": (1.0e6, 1.5e6),
            "band_basis": "hopper dense bf16 training, 9 measured runs", **extra}


def test_train_row_carries_the_ranges() -> None:
    r = _train_row("dgx", 64, _figures(), 1e12, 3.0)
    assert r.days == 1e12 / 1.2e6 / 86400
    assert (r.days_low, r.days_high) == (1e12 / 1.5e6 / 86400, 1e12 / 1.0e6 / 86400)
    assert r.total_usd_low == pytest.approx(64 * r.days_low * 24 * 3.0)
    assert r.total_usd_high == pytest.approx(64 * r.days_high * 24 * 3.0)
    assert r.band_basis.startswith("hopper dense bf16 training")
    assert likely(r) == " (likely 7.7-11.6 days, $35.56k-$53.33k)"


def test_serve_row_ranges_respect_the_request_rate() -> None:
    job = ServeJob(input_len=1000, output_len=100, request_rate=50.0)  # 5,000 output tokens/s wanted
    f = {"gpu": "H100", "plan": "TP1 PP1 DP1", "gpus_used": 1, "status": "optimal", "throughput_tokens_per_s": 6000.0,
         "ttft_s": 0.1, "tpot_s": 0.02, "meets_targets": True, "throughput_band": (4000.0, 8000.0), "band_basis": "b"}
    r = _serve_row("dgx", 8, f, job, 2.0)
    per_m = lambda served: 2.0 / (served * 3600) * 1e6  # noqa: E731
    assert r.usd_per_million_output_tokens == pytest.approx(per_m(5000.0))
    assert r.usd_per_million_output_tokens_low == pytest.approx(per_m(5000.0))  # faster than needed: capped
    assert r.usd_per_million_output_tokens_high == pytest.approx(per_m(4000.0))  # slower: fewer tokens served
    assert (r.throughput_tokens_per_s_low, r.throughput_tokens_per_s_high) == (4000.0, 8000.0)
    assert likely(r) == " (likely $0.111-$0.139 per million)"


def test_serve_row_below_capacity_says_the_demand_is_met_instead_of_a_zero_width_range() -> None:
    """At 20 requests/s (2,000 output tokens/s) the whole capacity band (4,000-8,000) serves the demand:
    the dollars per million tokens do not depend on where in the band the engine lands."""
    job = ServeJob(input_len=1000, output_len=100, request_rate=20.0)
    f = {"gpu": "H100", "plan": "TP1 PP1 DP1", "gpus_used": 1, "status": "optimal", "throughput_tokens_per_s": 6000.0,
         "ttft_s": 0.1, "tpot_s": 0.02, "meets_targets": True, "throughput_band": (4000.0, 8000.0), "band_basis": "b"}
    r = _serve_row("dgx", 8, f, job, 2.0)
    assert r.usd_per_million_output_tokens_low == r.usd_per_million_output_tokens_high
    assert likely(r) == " (capacity likely 4,000-8,000 output tokens/s, above the 2,000 demanded throughout)"


def test_study_rows_files_and_table_show_ranges(tmp_path) -> None:
    cluster = ClusterSpec.model_validate({"name": "fast", "gpu": gpu(hbm=80.0), "node": node(4), "num_nodes": 2,
                                          "price_per_gpu_hour": 2.0})
    res = run_study(tiny_model(layers=4, hidden=512, heads=8, kv=8), [cluster], [8], tokens=1e9, seq_len=1024,
                    global_batch_size=16, time_limit_s=10, jobs=1)
    (r,) = res.rows
    band = lookup(Kind("hopper", "dense", "bf16", "train"))  # the GPU is named "H100"
    low, high = band.low, band.high
    ceiling = 0.4945 * 1.1 / r.mfu  # the H100 BF16 dense sanity ceiling caps the band's top
    if high > ceiling:
        low, high = (low, ceiling) if low < ceiling else (ceiling * low / high, ceiling)
    assert r.days_low == pytest.approx(r.days / high, rel=1e-9)
    assert r.days_high == pytest.approx(r.days / low, rel=1e-9)
    assert r.total_usd_low == pytest.approx(r.total_usd / high, rel=1e-9)
    assert r.total_usd_high == pytest.approx(r.total_usd / low, rel=1e-9)
    cells = table_rows(res)[0]
    assert cells[5] == f"{r.days:,.1f} ({r.days_low:,.1f}-{r.days_high:,.1f})"
    assert "(likely" in res.answers[0].text
    write_outputs(res, tmp_path)
    with (tmp_path / "study.csv").open() as fh:
        (line,) = list(csv.DictReader(fh))
    assert float(line["days_low"]) == pytest.approx(r.days_low) and float(line["total_usd_high"]) > 0
    obj = json.loads((tmp_path / "study.json").read_text())
    assert obj["rows"][0]["days_high"] == pytest.approx(r.days_high)
    assert "hopper dense bf16 training" in obj["rows"][0]["band_basis"]


def test_flagged_mfu_is_marked_in_the_table_and_ranges_are_plotted() -> None:
    from autoshard.study.report import _likely_segment
    from autoshard.study.costs import StudyResult

    flagged = _train_row("dgx", 64, _figures(sanity="predicted 60.0 % MFU is more than 10 % above ..."), 1e12, 3.0)
    plain = _train_row("dgx", 128, _figures(), 1e12, 3.0)
    res = StudyResult(mode="train", inputs={}, rows=[flagged, plain], skipped=[], answers=[], pareto=[])
    cells = table_rows(res)
    assert cells[0][3] == "40.0% !" and cells[1][3] == "40.0%"
    xs, ys = _likely_segment(plain)
    assert xs == [plain.days_low, plain.days_high] and ys == [plain.total_usd_low, plain.total_usd_high]


def test_serving_front_across_gpu_types_carries_each_clusters_band() -> None:
    """`study --mode serve` prints each cluster's front cut at the TPOT SLAs (tok/s/GPU, $/M tokens):
    predictions without a band until each cluster got the measured/predicted ratios of its kind of run,
    in the JSON (`serve_front[].band`) and under the table."""
    from typer.testing import CliRunner

    from autoshard.cli import app

    args = ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--cluster", "mi300x", "--gpus", "8", "--mode",
            "serve", "--request-rate", "5", "--time-limit", "10"]
    obj = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    text = " ".join(CliRunner().invoke(app, args, env={"COLUMNS": "80"}).stdout.split())
    for front, generation in zip(obj["serve_front"], ("hopper", "cdna3"), strict=True):
        kind = Kind(generation, "dense", "bf16", "serve")
        t, tpot = lookup(kind), lookup(kind, section="tpot")
        assert front["band"] == {"tokens_per_s_per_gpu_ratio": [t.low, t.high], "tpot_s_ratio": [tpot.low, tpot.high],
                                 "basis": t.basis}
        assert (f"band of {front['cluster']}: tok/s/GPU likely {t.low:.2f}-{t.high:.2f}x the figure, TPOT "
                f"{tpot.low:.2f}-{tpot.high:.2f}x, tok/s/user {1 / tpot.high:.2f}-{1 / tpot.low:.2f}x, $/M tokens "
                f"{1 / t.high:.2f}-{1 / t.low:.2f}x ({t.basis})") in text
    assert obj["serve_front"][1]["band"]["basis"].startswith("no measured cdna3 dense bf16 serving run")
