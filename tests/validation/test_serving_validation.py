"""The serving cost model against published inference runs (TensorRT-LLM numbers, a different engine
from vLLM; see validate_serving.py). Two knobs per GPU type (serve_gemm, serve_attention_hbm) are
fitted on the offline rows; the offline thresholds here hold the bundled (all-source) fit, the
leave-one-source-out figures come from the script (too slow for the suite: ~2 min) and land in
residuals_serve.json. The online and burst sources are never fitted on: out of sample here too.
The thresholds are the levels the model reaches today (regression guards), not the issue's targets
(8 % median per source, 20 % worst run), which the README reports against."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import pytest
from validate_serving import (
    HOST_US_GRID,
    RESIDUALS,
    SERVE_ATTENTION_HBM_GRID,
    SERVE_GEMM_GRID,
    RunResult,
    bundled_knobs,
    fit_loss,
    fit_serving_knobs,
    evaluate_burst,
    evaluate_online,
    evaluate_runs,
    FIXED_LENGTH_SLACK,
    finite_run_throughput,
    inf_run_stretch,
    load_burst_runs,
    load_online_runs,
    load_data,
    load_runs,
    loso_predictions,
    num_requests,
    online_engine,
    superseded,
    residuals,
    summary,
    tp_ordering,
    trtllm_engine_settings,
)

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.predict import predict_serve
from autoshard.costmodel.serve.sim import simulate_burst
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

RESULTS = evaluate_runs()
ONLINE = evaluate_online()
BURST = evaluate_burst()


def test_every_run_names_a_cited_source_and_a_bundled_model():
    data = load_data()
    runs = load_runs()
    assert len(runs) == len(RESULTS) >= 750
    sources = {r["source"] for r in runs}
    assert sources == {"trtllm-0.14-offline", "trtllm-0.15-offline", "trtllm-0.17-offline"}
    assert len({r["id"] for r in runs}) == len(runs)
    for run in runs:
        source = data["sources"][run["source"]]
        assert source["citation"] and source["engine"] and source["method"]
        assert run["input_len"] > 0 and run["output_len"] > 0 and run["measured_output_tokens_per_s"] > 0
        load_model(run["model"])


def test_reserved_sources_are_not_used():
    text = json.dumps(load_data()).lower()
    for reserved in ("v1.0", "1.0.0", "lmsys", "megatron-bridge"):
        assert reserved not in text


def test_published_row_copied_exactly():
    """Spot checks against the source table (perf-overview.md at 258c7540)."""
    by_id = {r["id"]: r["measured_output_tokens_per_s"] for r in load_runs()}
    assert by_id["trtllm-v017-llama31-70b-h100-tp1-1000-1000"] == 839.97
    assert by_id["trtllm-v017-llama31-70b-h100-tp8-1000-1000"] == 11451.16
    assert by_id["trtllm-v017-llama31-405b-h200-tp8-1000-1000"] == 3399.69
    assert by_id["trtllm-v017-mixtral-8x7b-a100-tp8-20000-2000"] == 1592.53
    assert "trtllm-v017-llama31-70b-h100-tp1-2048-2048" not in by_id  # blank in the source
    assert by_id["trtllm-v015-mixtral-8x22b-h100-tp8-20000-2000"] == 2151.07
    assert by_id["trtllm-v014-llama31-70b-h100-fp16-tp4-1000-1000"] == 3774.676
    assert by_id["trtllm-v014-llama31-8b-l40s-tp1-5000-500"] == 855.9822


@pytest.mark.parametrize(
    ("source", "median_max"),
    [("trtllm-0.17-offline", 0.07), ("trtllm-0.15-offline", 0.07), ("trtllm-0.14-offline", 0.10)],
)
def test_errors_per_source_hold(source, median_max):
    """With the bundled (all-source) knobs: median |error| per source (the script prints the
    leave-one-source-out figures, held rows: 5.8 / 5.7 / 5.2 % for 0.14 / 0.15 / 0.17)."""
    n, med, _, _ = summary([r for r in RESULTS if r.held], lambda r: r.source)[source]
    assert n >= 80 and med <= median_max


def test_most_runs_within_20_percent():
    within = sum(abs(r.error) <= 0.20 for r in RESULTS) / len(RESULTS)
    assert within >= 0.70


@pytest.mark.parametrize(("gpu", "median_max"), [("H100-SXM5-80GB fp8", 0.11), ("H200-SXM-141GB fp8", 0.11)])
def test_hopper_fp8_median_within_10_percent(gpu, median_max):
    n, med, _, _ = summary(RESULTS, lambda r: f"{r.gpu} {r.precision}")[gpu]
    assert n > 150 and med <= median_max


def test_tp_ordering_matches():
    measured, predicted = tp_ordering(RESULTS)
    assert measured == [1, 2, 4, 8]
    assert predicted == measured


def test_concurrency_is_kv_limited_and_grows_with_tp():
    llama = sorted(
        (r for r in RESULTS if r.id.startswith("trtllm-v017-llama31-70b-h100") and r.input_len == 1000),
        key=lambda r: r.tp,
    )
    batches = [r.concurrency for r in llama]
    assert batches == sorted(batches) and batches[0] < 64 < batches[-1]


def test_trtllm_engine_settings_round_like_the_tool():
    """finetune_setting: batch sizes round up to 32 below 256, 128 below 1024, 256 above (floor 64);
    token budgets to 256 below 4096 (floor 2048), 512 below 8192, 1024 above (cap 32768)."""
    model = load_model("llama-3.1-8b")
    bs, tokens = trtllm_engine_settings(
        model, hbm_gib=80, tp=1, pp=1, weight_bytes=1, kv_bytes=1, input_len=128, output_len=128
    )
    assert bs == 4096 and tokens == 8192  # 4096 requests x (1 + 128/128) tokens
    bs, tokens = trtllm_engine_settings(
        load_model("llama-3.1-70b"),
        hbm_gib=80,
        tp=1,
        pp=1,
        weight_bytes=1,
        kv_bytes=1,
        input_len=1000,
        output_len=1000,
    )
    assert bs == 64 and tokens == 2048


def _fake(source: str, gpu: str, measured: float, predicted: float, rid: str) -> RunResult:
    return RunResult(
        id=rid, source=source, model="m", family="dense", gpu=gpu, precision="fp8", tp=1, input_len=1,
        output_len=1, measured=measured, predicted=predicted, concurrency=1, tpot_s=1.0,
    )


def test_fit_picks_the_lowest_log_error_per_gpu_and_refits_without_each_source():
    """Two grid points at one host cost; GPU "X" has a row of source A that point (5, 0.5, 0.5)
    predicts exactly and two rows of source B that (5, 0.9, 0.9) predicts exactly. All sources: B's
    two rows win. Without B, A's row decides; A's row is then predicted with the knobs fitted on B
    alone (held out), not with its own."""
    rows = [("a1", "A", 100.0), ("b1", "B", 100.0), ("b2", "B", 100.0)]
    lo, hi = (5.0, 0.5, 0.5), (5.0, 0.9, 0.9)
    table = {
        lo: {i: _fake(s, "X", m, {"A": 100.0, "B": 150.0}[s], i) for i, s, m in rows},
        hi: {i: _fake(s, "X", m, {"A": 130.0, "B": 100.0}[s], i) for i, s, m in rows},
    }
    assert fit_serving_knobs(table) == {"X": hi}
    assert fit_serving_knobs(table, without="B") == {"X": lo}
    assert fit_serving_knobs(table, without="A") == {"X": hi}
    loso, folds = loso_predictions(table)
    assert folds == {"A": {"X": hi}, "B": {"X": lo}}
    assert loso["a1"].predicted == 130.0  # held out: B's knobs, 30 % off
    assert loso["b1"].predicted == loso["b2"].predicted == 150.0  # held out: A's knobs, 50 % off
    assert fit_loss([table[lo]["b1"]]) == pytest.approx(math.log(1.5))


def test_the_host_cost_is_one_value_for_every_gpu_type():
    """GPU "X" alone would pick host 0, GPU "Y" (three rows) host 5: the fit takes the host cost with
    the lowest summed loss (5: Y's three exact rows beat X's one) for both, and X's best pair there."""
    table = {
        (0.0, 0.5, 0.5): {"x": _fake("A", "X", 100.0, 100.0, "x")}
        | {f"y{k}": _fake("A", "Y", 100.0, 120.0, f"y{k}") for k in range(3)},
        (5.0, 0.5, 0.5): {"x": _fake("A", "X", 100.0, 125.0, "x")}
        | {f"y{k}": _fake("A", "Y", 100.0, 100.0, f"y{k}") for k in range(3)},
        (5.0, 0.9, 0.9): {"x": _fake("A", "X", 100.0, 110.0, "x")}
        | {f"y{k}": _fake("A", "Y", 100.0, 101.0, f"y{k}") for k in range(3)},
    }
    assert fit_serving_knobs(table) == {"X": (5.0, 0.9, 0.9), "Y": (5.0, 0.5, 0.5)}


def test_bundled_serving_knobs_lie_on_the_fit_grid():
    """Every GPU type with offline rows carries serve_gemm and serve_attention_hbm in its cluster files,
    values on the fit grid, and the host cost is on its grid (validate_serving.py prints whether they
    are the all-source fit)."""
    knobs = bundled_knobs()
    assert set(knobs) == {r.gpu for r in RESULTS}
    for host, gemm, attention_hbm in knobs.values():
        assert host in HOST_US_GRID
        assert gemm in SERVE_GEMM_GRID and attention_hbm in SERVE_ATTENTION_HBM_GRID


def test_residuals_rows_have_the_bands_interface():
    rows = residuals(RESULTS, ONLINE + BURST)
    keys = {
        "id", "source", "mode", "gpu", "family", "precision", "metric", "measured", "predicted_loso",
        "predicted_fit", "mem_measured_gib", "mem_predicted_gib", "held",
    }
    assert len(rows) == len(RESULTS) + len(ONLINE) + len(BURST)
    metrics = {"output_tokens_per_s", "ttft_mean_s", "itl_mean_s", "total_tokens_per_s", "tpot_mean_s"}
    assert {r["metric"] for r in rows} == metrics
    for row in rows:
        assert set(row) == keys and row["mode"] == "serve" and row["family"] in ("dense", "moe")
        assert row["precision"] in ("fp8", "bf16") and row["measured"] > 0 and row["predicted_loso"] > 0
        # held to the accuracy target (the bands count it) unless a later release superseded the row
        assert row["held"] is (row["id"] not in superseded())
    assert {r["family"] for r in rows} == {"dense", "moe"}


def test_rows_a_later_release_measured_much_faster_are_not_held():
    """Same engine (model, GPU, dtypes, TP x PP, ISL/OSL) measured >= 1.25x faster by a later release:
    the older row is printed but not held, and the fit never sees it. The 0.14 rows of Llama 70B on one
    H100 at 1000/1000 (410 tokens/s against 840 in 0.17) is one; the H100 FP16 column has no later
    counterpart and stays held."""
    gone = superseded()
    SAME_ENGINE = ("model", "cluster", "tp", "pp", "input_len", "output_len")  # noqa: N806
    assert gone["trtllm-v014-llama31-70b-h100-tp1-1000-1000"] == "trtllm-0.17-offline"
    assert "trtllm-v017-llama31-70b-h100-tp1-1000-1000" not in gone
    assert "trtllm-v014-llama31-70b-h100-fp16-tp2-2048-2048" not in gone
    assert all(i.startswith("trtllm-v014") for i in gone) and 15 <= len(gone) <= 30
    by_id = {r["id"]: r for r in load_runs()}
    for old, source in gone.items():
        later = [
            r for r in by_id.values()
            if r["source"] == source
            and all(r[k] == by_id[old][k] for k in SAME_ENGINE)
        ]
        faster = later[0]["measured_output_tokens_per_s"] if later else 0.0
        assert faster >= 1.25 * by_id[old]["measured_output_tokens_per_s"]
    assert {r.id for r in RESULTS if not r.held} == set(gone)


def test_the_fit_skips_rows_that_are_not_held():
    """A superseded row cannot move the knobs: it alone would pick the other grid point."""
    rows = {
        "ok": _fake("A", "X", 100.0, 100.0, "ok"),
        "old": replace(_fake("A", "X", 100.0, 300.0, "old"), superseded_by="B"),
    }
    table = {
        (5.0, 0.5, 0.5): rows,
        (5.0, 0.9, 0.9): {
            "ok": replace(rows["ok"], predicted=120.0),
            "old": replace(rows["old"], predicted=100.0),
        },
    }
    assert fit_serving_knobs(table) == {"X": (5.0, 0.5, 0.5)}
    counted = {k: {i: replace(r, superseded_by=None) for i, r in v.items()} for k, v in table.items()}
    assert fit_serving_knobs(counted) == {"X": (5.0, 0.9, 0.9)}


def test_committed_residuals_file_is_current():
    """residuals_serve.json is regenerated (`validate_serving.py --write-residuals`) when numbers change."""
    committed = json.loads(RESIDUALS.read_text())
    fresh = residuals(RESULTS, ONLINE + BURST)
    assert [r["id"] for r in committed] == [r["id"] for r in fresh]
    for old, new in zip(committed, fresh, strict=True):
        assert old["predicted_fit"] == pytest.approx(new["predicted_fit"], rel=1e-6), old["id"]
    # the held-out predictions come from refitted knobs: on some rows they differ from the fit
    assert sum(r["predicted_loso"] != r["predicted_fit"] for r in committed) >= 100


def test_online_rows_are_the_ones_the_engine_absorbed():
    """Rows offered more than the engine's measured capacity (its INF row) are a growing backlog."""
    runs = load_online_runs()
    assert len(runs) == 36 and len(ONLINE) == 2 * len(runs)
    assert all(r["qps"] <= r["measured_capacity_req_s"] for r in runs)
    ids = {r["id"] for r in runs}
    assert "trtllm-v014-online-llama31-70b-h100-tp4-467-256-qps16" in ids
    assert "trtllm-v014-online-llama31-70b-h100-tp4-467-256-qps32" not in ids
    assert not any("202-214" in i for i in ids)  # a length-varying dataset: see the next test
    varying = load_online_runs(variable_lengths=True)
    assert len(varying) == 18 and all("202-214" in r["id"] for r in varying)
    assert all(r["qps"] <= r["measured_capacity_req_s"] for r in varying)


def test_inf_runs_show_which_online_groups_have_fixed_lengths():
    """A group's INF run (500 requests at once, all in the KV cache) lasts one mean request when the
    lengths are fixed and until the longest output when they vary: the published 467-token groups
    read 0.97-1.03x, the 202/214 groups 1.99-2.08x, and only those are marked `fixed_lengths: false`."""
    groups = load_data()["online_runs"]
    assert len(groups) == 12
    h100_70b = next(g for g in groups if g["id"] == "trtllm-v014-online-llama31-70b-h100-tp4-202-214")
    # 500 / 16 req/s = 31.25 s against 4.482 s + 214 x 50 ms = 15.18 s
    assert inf_run_stretch(h100_70b) == pytest.approx(31.25 / 15.182, rel=1e-9)
    for g in groups:
        stretch = inf_run_stretch(g)
        fixed = g.get("fixed_lengths", True)
        assert fixed is (stretch <= FIXED_LENGTH_SLACK), g["id"]
        assert (0.95 <= stretch <= 1.05) if fixed else (1.9 <= stretch <= 2.1), (g["id"], stretch)
        assert g["measured_inf"][0] == g["measured_capacity_req_s"]
        # the premise: the engine's KV cache holds all 500 requests at once (at the mean lengths)
        model, pool, job, cfg = online_engine(g)
        assert predict_serve(model, pool, job, cfg).concurrency >= 500, g["id"]


@pytest.mark.parametrize(("metric", "median_max"), [("ttft_mean_s", 0.08), ("itl_mean_s", 0.08)])
def test_latency_at_a_request_rate(metric, median_max):
    """Mean TTFT and mean ITL of TensorRT-LLM 0.14 behind Triton at 2-32 QPS (out of sample)."""
    errs = [r.error for r in ONLINE if r.metric == metric]
    assert statistics.median(abs(e) for e in errs) <= median_max
    assert max(abs(e) for e in errs) <= 0.25
    # below the engine's measured capacity the steady state exists; a row offered exactly what the
    # engine absorbs (the 70B engines at 16 QPS, their INF rows' 16 req/s) may have none, which is
    # why every row is predicted by replaying its 500 requests
    capacity = {run["id"]: run["measured_capacity_req_s"] for run in load_online_runs()}
    below = [r for r in ONLINE if r.qps < capacity[r.id]]
    assert len(below) >= 60 and all(r.utilization < 1 for r in below)


def test_latency_grows_with_the_request_rate():
    """Same engine, more QPS: the predicted mean ITL and TTFT never fall (as measured)."""
    by_engine: dict[str, list] = {}
    for r in ONLINE:
        by_engine.setdefault((r.id.rsplit("-qps", 1)[0], r.metric), []).append(r)
    for rows in by_engine.values():
        rows.sort(key=lambda r: r.qps)
        predicted = [r.predicted for r in rows]
        assert predicted == sorted(predicted)


def test_burst_rows_cover_vllm_moe_and_mla():
    """vLLM v0.11.0 bursts: Qwen3-235B (BF16 TP8, FP8 TP4) on H100, DeepSeek-R1 (MLA, FP8) on H200;
    the 4-output-token rows are listed but not checked."""
    checked = load_burst_runs()
    every = load_burst_runs(checked_only=False)
    assert len(checked) == 9 and len(every) == 12
    assert {r["model"] for r in checked} == {"qwen3-235b-a22b", "deepseek-v3"}
    assert all(r["output_len"] >= 10 for r in checked)
    assert len(BURST) == 3 * len(checked)


def test_burst_throughput_and_latency():
    """Out of sample: total tokens/s median within 9 % (8.1 %), mean TTFT 8 % (7.2 %), mean TPOT 10 %
    (8.9 %), every checked row within 25 % (the worst: DeepSeek-R1 on H200 at 2K prompts, TTFT -24 %).
    Before the block-scaled FP8 GEMMs and their group-quantization kernels (DeepSeek-R1 and
    Qwen3-235B-FP8 on Hopper at the per-tensor FP8 rate) the medians were 16.2 / 14.2 / 23.5 % and
    the worst row 52 %."""
    for metric, median_max in (("total_tokens_per_s", 0.09), ("ttft_mean_s", 0.08), ("tpot_mean_s", 0.10)):
        errs = [abs(r.error) for r in BURST if r.metric == metric]
        assert statistics.median(errs) <= median_max, metric
        assert max(errs) <= 0.25, metric


@pytest.mark.parametrize(
    ("isl", "osl", "max_num_seqs", "requests"),
    [(128, 512, 64, 200), (128, 512, 64, 40), (1000, 1000, 256, 600), (2048, 256, 128, 300)],
)
def test_finite_run_waves_match_the_step_by_step_simulation(isl, osl, max_num_seqs, requests):
    """trtllm-bench's offline rows measure N requests queued at once: the wave formula
    (ceil(N / B) waves, the last one partly filled; N < B: one wave of N) agrees with
    `simulate_burst`'s step-by-step replay of the same benchmark within 3 %, where the steady state
    at B is 3-48 % faster on these cases (Llama 3.1 8B FP8, one H100)."""
    model = load_model("llama-3.1-8b")
    pool = load_cluster("dgx-h100").with_gpus(1).primary
    fp8 = WeightDtype.FP8
    job = ServeJob(input_len=isl, output_len=osl, weight_dtype=fp8, kv_cache_dtype=fp8)
    cfg = ServeConfig(weight_dtype=fp8, kv_cache_dtype=fp8, max_num_seqs=max_num_seqs, max_num_batched_tokens=8192)
    pred = predict_serve(model, pool, job, cfg)
    waves, batch = finite_run_throughput(model, pool, job, cfg, pred, requests)
    sim = simulate_burst(model, pool, job, cfg, requests=requests).output_tokens_per_s(osl)
    assert batch == min(max_num_seqs, requests)
    assert waves == pytest.approx(sim, rel=0.03)
    assert pred.throughput_tokens_per_s > 1.02 * sim  # the steady state overstates what the run measures


def test_offline_rows_run_the_published_request_counts():
    """prepare_dataset.py --num-requests per ISL/OSL (30,000 at 128/128 ... 1,000 at 20000/2000, the
    same table on the 0.14, 0.15 and 0.17 pages); the batch a row runs never exceeds them."""
    by_id = {r["id"]: r for r in load_runs()}
    assert num_requests(by_id["trtllm-v017-llama31-70b-h100-tp8-1000-1000"]) == 3000
    assert num_requests(by_id["trtllm-v014-llama31-8b-h100-tp1-128-128"]) == 30000
    assert num_requests(by_id["trtllm-v015-mixtral-8x7b-h100-tp8-128-4096"]) == 1500
    assert all(r.concurrency <= num_requests(by_id[r.id]) for r in RESULTS)
    mixtral = next(r for r in RESULTS if r.id == "trtllm-v017-mixtral-8x7b-h200-tp8-128-4096")
    assert mixtral.concurrency == 1500  # the KV cache would hold ~3,800: the dataset has 1,500
