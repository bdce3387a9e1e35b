"""The disaggregation model against the published deployments of disagg_runs.yaml (see
validate_disagg.py): rows are cited and not from reserved sources, and where the source states no
workload the measured decode throughput lies inside the range predicted over the assumed ones."""

from __future__ import annotations

from validate_disagg import evaluate_runs, load_runs

RESERVED = ("lmsys.org", "LMSYS", "deepseek-ai/open-infra", "DeepSeek-V3 Technical Report", "deepseek.com")


def test_rows_are_cited_and_not_reserved():
    runs = load_runs()
    assert runs
    for run in runs:
        assert run["source"] and run["framework"]
        assert not any(word in run["source"] for word in RESERVED)


def test_measured_inside_the_predicted_range_when_workload_unknown():
    results = evaluate_runs()
    for run in load_runs():
        if run.get("workload_stated", True):
            continue
        mine = [r for r in results if r.id == run["id"]]
        assert len(mine) == len(run["assumed_input_lens"])
        lo, hi = min(r.predicted for r in mine), max(r.predicted for r in mine)
        assert lo <= run["measured_decode_tokens_per_s_per_gpu"] <= hi, (lo, hi)
        # longer prompts hold more KV per request: fewer running requests, less throughput
        ordered = sorted(mine, key=lambda r: r.input_len)
        assert [r.concurrency for r in ordered] == sorted((r.concurrency for r in ordered), reverse=True)
