"""The disaggregation model against the published deployments of disagg_runs.yaml (see
validate_disagg.py): rows are cited and not from reserved sources; the published figures of each
row agree with each other (Little's law, a chart against its own labels); where the source states no
decode concurrency the measured throughput is compared with the range predicted over assumed ones;
and the errors stay inside the bands this file pins (they move only when the physics does)."""

from __future__ import annotations

import pytest
import validate_disagg
from validate_disagg import (
    concurrency_stated,
    decode_ranks,
    evaluate_prefills,
    evaluate_runs,
    evaluate_transfers,
    load_runs,
)

RESERVED = ("lmsys.org", "LMSYS", "deepseek-ai/open-infra", "DeepSeek-V3 Technical Report", "deepseek.com")


@pytest.fixture(scope="module")
def results():
    return evaluate_runs()


@pytest.fixture(scope="module")
def prefills():
    return evaluate_prefills()


@pytest.fixture(scope="module")
def transfers():
    return evaluate_transfers()


def test_rows_are_cited_and_not_reserved():
    runs = load_runs() + load_runs("prefill") + load_runs("kv_transfer")
    assert len(load_runs()) >= 4 and load_runs("prefill") and load_runs("kv_transfer")
    assert len({run["id"] for run in runs}) == len(runs)
    for run in runs:
        assert run["source"] and run["framework"]
        assert "https://" in run["source"]
        assert not any(word in run["source"] for word in RESERVED)


def test_published_figures_obey_littles_law():
    """Requests decoding = output tokens/s x TPOT; with a client cap they can be no more than the cap
    and, at saturation, not much fewer (the rest are in prefill): this checks the transcription and the
    per-rank concurrency the prediction uses."""
    stated = [r for r in load_runs() if "client_concurrency" in r]
    assert stated
    for run in stated:
        decoding = run["measured_output_tokens_per_s"] * run["measured_tpot_ms"] * 1e-3
        assert 0.95 * run["client_concurrency"] <= decoding <= run["client_concurrency"], run["id"]
        gpus = run["decode"]["instances"] * run["decode"]["attention_dp"] * run["decode"]["tp"]
        per_gpu = run["measured_output_tokens_per_s"] / gpus
        assert per_gpu == pytest.approx(run["measured_decode_tokens_per_s_per_gpu"], rel=1e-3)


def test_client_cap_sets_the_decode_batch(results):
    by_id = {r.id: r for r in results}
    for run in load_runs():
        if "client_concurrency" in run:
            assert by_id[run["id"]].concurrency == run["client_concurrency"] // decode_ranks(run) == 450


def test_stated_rows_error_band(results):
    """Out-of-sample errors of the stated rows (MI300X, eager decode): the model is optimistic by
    1.17-1.27x in tokens/s per decode GPU (TPOT 13-20 % short; 1.32-1.52x and 23-33 % before MI300X's
    FP8 GEMMs were priced at the measured hipBLASLt rate, 1.5-1.8x and 32-44 % before vLLM's
    256-token MoE passes at 450 requests per rank, 1.5-1.9x and 34-47 % before the MLA and
    group-quantization kernels). Pinned so a change in the physics that moves them shows up here; the
    band is the measured one plus a margin, not a target."""
    stated = [r for r in results if r.measured_tpot_s is not None]
    assert len(stated) == 3
    for r in stated:
        assert 0.10 <= r.error <= 0.40, (r.id, r.error)
        assert -0.30 <= r.tpot_error <= -0.08, (r.id, r.tpot_error)
        # the stated prefill instances keep up with the predicted decode rate: decode-bound, as measured
        assert r.prefill_load < 1.0, (r.id, r.prefill_load)


def test_stated_rows_ttft_band(results):
    """Mean TTFT at the measured request rate (40-47 % of the predicted prefill capacity, every DP rank
    of a saturated prefill instance filling its budget). The prefill
    engines batch what has arrived (prefill_cycle), so at that load a request spends 0.25-0.65 s in
    prefill, not half of a full-budget step: predicted 0.44 / 0.60 / 0.92 s (with the hand-off and
    1.5 decode steps) against the measured 1.68 / 1.80 / 2.57 s (-64..-74 %; 0.31 / 0.45 / 0.74 s
    before MI300X's FP8 GEMMs were priced at the measured hipBLASLt rate). Little's law on the published figures (the client's 10,800 in
    flight less throughput x ITL decoding) puts 1.4 / 2.5 / 4.8 s per request outside the decode
    batch, at least the measured TTFT: those seconds are real. The same eager engines decode
    1.2-1.3x slower than predicted, and a prefill ~2x slower than predicted would run at 90-100 %
    load, where this queue gives the measured seconds. Pinned, not a target."""
    stated = [r for r in results if r.ttft_s is not None]
    assert len(stated) == 3
    for r in stated:
        assert -0.80 <= r.ttft_error <= -0.55, (r.id, r.ttft_error)
        assert 0.38 <= r.ttft_utilization <= 0.50, (r.id, r.ttft_utilization)
        assert 0.20 <= r.ttft_prefill_s <= 0.75, (r.id, r.ttft_prefill_s)
    for run in load_runs():
        if "measured_ttft_ms" in run:
            outside = run["client_concurrency"] - run["measured_output_tokens_per_s"] * run["measured_tpot_ms"] * 1e-3
            rate = run["measured_output_tokens_per_s"] / run["output_len"]
            assert 0.8 <= outside / rate / (run["measured_ttft_ms"] * 1e-3) <= 2.0, run["id"]


def test_context_dependent_part_of_the_step_tracks_the_measurement(results):
    """Measured mean ITL grows 11.8 ms from 512/512 to 1000/1000 and 36.4 ms from 1000/1000 to
    2000/2000 (same engines, same 450 requests per rank): the KV reads of a longer context. The
    predicted TPOT grows by the same amounts within 6 ms; the miss is a near-constant offset."""
    moreh = sorted((r for r in results if r.id.startswith("moreh-")), key=lambda r: r.input_len)
    steps = [(b.tpot_s - a.tpot_s, b.measured_tpot_s - a.measured_tpot_s) for a, b in zip(moreh, moreh[1:])]
    assert len(steps) == 2
    for predicted, measured in steps:
        assert predicted == pytest.approx(measured, abs=0.006)
    offsets = [r.measured_tpot_s - r.tpot_s for r in moreh]
    assert max(offsets) - min(offsets) < 0.010


def test_kv_bytes_match_the_sizes_the_source_moved(transfers):
    """Qwen3-8B holds 2 x 36 layers x 8 KV heads x 128 x 2 B = 144 KiB per token. The source's sizes
    are that times the prompt plus the same few chat-template tokens (2 MiB = 14 tokens) up to 4,096
    tokens, and equal to it within the 0.01 GiB it prints above."""
    assert len(transfers) == 9
    for t in transfers:
        assert t.kv_mib == pytest.approx(t.prompt_len * 144 / 1024)
        if t.measured_kv_mib < 1024:
            assert 1.5 <= t.measured_kv_mib - t.kv_mib <= 2.5, t
        else:
            assert t.measured_kv_mib == pytest.approx(t.kv_mib, rel=0.005), t


def test_hand_off_time_band(transfers):
    """The hand-off over 8 x 25 GB/s NICs: autoshard has one link latency and no per-transfer setup, so
    it is short at every size, by less as the size grows (-77 % at 18 MiB, -15 % at 4.5 GiB); from
    1 GiB up the miss is the bandwidth alone (measured 142 GB/s at best against 180 modelled)."""
    errors = [t.transfer_error for t in sorted(transfers, key=lambda t: t.prompt_len)]
    assert all(e < 0 for e in errors)
    assert errors == sorted(errors)
    for t in transfers:
        if t.kv_mib >= 1024:
            assert -0.30 <= t.transfer_error <= -0.10, t


def test_hand_off_bandwidth_gap_is_the_connector_not_the_link(transfers):
    """From 1 GiB up the measured hand-off grows at 158 GB/s (79 % of the 8 x 25 GB/s line rate)
    against the 180 GB/s modelled (90 % per NIC, the cluster's `inter_node_bw`). The transfer engine
    itself is published at 87 GB/s over 4 x 200 Gbps RoCE, 87 % of line rate (kvcache-ai/Mooncake
    README, 40 GB moved): within 5 % of the modelled efficiency, so the remaining gap belongs to the
    vLLM connector's many per-layer ranges, and no source outside this run prices it: left unfitted."""
    big = sorted((t for t in transfers if t.kv_mib >= 1024), key=lambda t: t.prompt_len)
    marginal = (big[-1].measured_kv_mib - big[0].measured_kv_mib) * 2**20 / (
        big[-1].measured_transfer_s - big[0].measured_transfer_s
    )
    assert marginal == pytest.approx(158.6e9, rel=0.01)
    modelled = [t.kv_mib * 2**20 / t.transfer_s for t in big]
    assert all(m == pytest.approx(180e9, rel=0.01) for m in modelled)
    line = 8 * 25e9
    assert abs(180e9 / line - 87 / 100) <= 0.05
    assert marginal / line == pytest.approx(0.79, abs=0.01)


def test_idle_ttft_band(transfers):
    """Idle TTFT = prefill + hand-off + one decode step. The measured TTFT has a floor the model does
    not price (the proxy's two HTTP round trips, tokenization: 36-47 ms at <= 512 tokens); above it the
    growth with the prompt is the prefill, predicted within 25 % from 8k to 32k tokens."""
    by_len = {t.prompt_len: t for t in transfers}
    assert all(t.ttft_s < t.measured_ttft_s for t in transfers)
    for n in (128, 256, 512):
        assert 0.030 <= by_len[n].measured_ttft_s - by_len[n].ttft_s <= 0.050
    grown = by_len[32768].ttft_s - by_len[8192].ttft_s
    measured = by_len[32768].measured_ttft_s - by_len[8192].measured_ttft_s
    assert 0.75 <= grown / measured <= 1.0, (grown, measured)


def test_wide_ep_b200_row(results):
    """llm-d's DP16/EP16 decode on B200 at 1,024/995 tokens: the 256-request cap per rank binds (the
    KV cache would hold more); predicted 3.7k tokens/s per decode GPU against 3.1k measured (+20 %),
    TPOT 69 ms against the 82 ms that 4,096 requests in flight imply (Little's law). Pinned band. It
    was +23 % (TPOT 67 ms) before the busiest EP rank's extra pairs (`moe.busiest_rank_factor`),
    +28 % (TPOT 64 ms) before the MLA and group-quantization kernels, and
    +67 % (TPOT 49 ms) while the all-to-all across the two nodes ran at the 8 NICs' ring bandwidth
    (`group_link`); each rank's remote half now leaves through its own NIC in one round
    (`comm.ep_all_to_all_s`, checked against DeepEP's low-latency table): EP 16 ms -> 31 ms a step."""
    (r,) = [r for r in results if r.id == "llmd-wide-ep-b200-dsr1-1p16-1d16-1k1k"]
    assert r.concurrency == 256
    assert 0.15 <= r.error <= 0.30, r.error
    implied_tpot = 256 / r.measured  # requests per rank / tokens/s per rank (one GPU each)
    assert implied_tpot == pytest.approx(0.0823, rel=0.01)
    assert 0.77 <= r.tpot_s / implied_tpot <= 0.87


def test_decode_error_on_every_stated_wide_ep_row(results):
    """Rows whose decode concurrency is stated. The single-node MI300X DP8/EP8 rows (eager decode,
    all-to-all inside the node) stay 1.15-1.3x fast; the two-node B200 DP16/EP16 row, whose
    all-to-all crosses the NICs, is 1.15-1.3x fast once each rank's remote copies are priced on its
    own NIC (before: 1.67x, like the MI300X rows); the H200 DP32-96 rows (CUDA graphs, DBO, EPLB,
    FlashMLA) are within 5 %, two slow and one fast."""
    stated = {run["id"] for run in load_runs() if concurrency_stated(run)}
    assert len(stated) == 7
    for r in results:
        if r.id in stated and r.id.startswith("moreh-"):
            assert 0.10 <= r.error <= 0.40, (r.id, r.error)
        elif r.id in stated and r.id.startswith(H200):
            assert -0.06 <= r.error <= 0.04, (r.id, r.error)
        elif r.id in stated:
            assert 0.15 <= r.error <= 0.30, (r.id, r.error)


H200 = "vllm-wide-ep-h200-dsr1-"


def test_h200_chart_readings_agree_with_the_labels():
    """The December post's bars carry no labels: the rows read them off the PNG. Where the February
    post labels the same bar (EP 32 decode 2,200; EP 16 prefill 7,000), the reading is within 1 %,
    which bounds the error of the unlabelled readings (EP 72 / 96 decode, EP 8 / 32 prefill)."""
    runs = {r["id"]: r for r in load_runs() + load_runs("prefill") if r["id"].startswith(H200)}
    assert len(runs) == 6
    labelled = [r for r in runs.values() if not r.get("chart_read")]
    assert len(labelled) == 2
    def measured(run):
        return run.get("measured_decode_tokens_per_s_per_gpu") or run["measured_prefill_tokens_per_s_per_gpu"]

    for run in labelled:
        assert run["chart_reading"] == pytest.approx(measured(run), rel=0.01), run["id"]
    for run in runs.values():
        if run.get("chart_read"):
            assert measured(run) == run["chart_reading"], run["id"]


def test_h200_wide_ep_decode_rows(results):
    """vLLM's wide-EP DeepSeek-R1 decode on 4, 9 and 12 nodes of H200 at 2,000 / 2,000 tokens and the
    stated 256 requests per rank (the KV cache holds more, so the stated cap is the batch): predicted
    2,098 / 2,027 / 2,012 output tokens/s per GPU against 2,200 / 2,070 / 1,970 measured (-4.6 % /
    -2.1 % / +2.1 %). Both fall with the EP size, the prediction by less (its all-to-all leaves each
    rank through its own NIC whatever the group's size; only the busiest rank's spread grows). By
    Little's law the measured figures imply a TPOT of 256 / tokens per GPU = 116 / 124 / 130 ms,
    predicted 122 / 126 / 127 ms. Pinned band, out of sample."""
    mine = sorted((r for r in results if r.id.startswith(H200)), key=lambda r: r.id)
    assert [r.id.split("-")[-2] for r in mine] == ["dep32", "dep72", "dep96"]
    assert all(r.concurrency == 256 and r.input_len == r.output_len == 2000 for r in mine)
    assert [r.measured for r in mine] == sorted((r.measured for r in mine), reverse=True)
    assert [r.predicted for r in mine] == sorted((r.predicted for r in mine), reverse=True)
    assert mine[0].predicted - mine[-1].predicted < mine[0].measured - mine[-1].measured
    for r in mine:
        implied = 256 / r.measured
        assert 0.95 <= r.tpot_s / implied <= 1.06, (r.id, r.tpot_s, implied)
    # the stated 16-GPU prefill instance keeps up, as measured (16 x 7,000 prompt tokens/s = 56
    # requests/s against 35 decoded): predicted at 66 % load since its steps run DeepEP's normal
    # kernels and every rank fills its budget (130 %, prefill-bound, before: every token-expert copy
    # on the NIC and the busiest rank of randomly arriving prompts)
    (dep32,) = [r for r in mine if r.prefill_load is not None]
    assert 0.55 <= dep32.prefill_load <= 0.75
    run = next(r for r in load_runs() if r["id"] == dep32.id)
    measured_prefill = 16 * 7000 / run["input_len"]
    measured_decode = 32 * run["measured_decode_tokens_per_s_per_gpu"] / run["output_len"]
    assert measured_decode / measured_prefill == pytest.approx(0.629, abs=0.001)


def test_h200_prefill_rows(prefills):
    """vLLM's wide-EP prefill instance alone at 2,000-token prompts on 8, 16 and 32 H200: 6,933 /
    6,332 / 5,183 prompt tokens/s per GPU predicted against 6,510 / 7,000 / 5,080 measured (+6.5 % /
    -9.5 % / +2.0 %). Before: -25 % / -54 % / -48 %, from two errors at their root: the all-to-all
    priced as DeepEP's low-latency kernels move it (every token-expert copy on the NIC: 0.18 / 0.93 /
    1.39 s a step), where prefill steps run its normal kernels (`serve.ep_dispatch`: once per remote
    node plus the NVLink fan-out, DeepSeek-V3's group limit: 0.11 / 0.23 / 0.52 s, no DBO); and the
    saturated instance's step priced at its busiest DP rank of randomly arriving prompts (1.75-2.15x
    the budget through attention and the dense GEMMs), where every rank fills its 8,192-token budget
    from its backlog.
    The step is now 0.85 s of GEMMs (block FP8 at BLOCK_FP8_GEMM_HOPPER), the all-to-all and
    0.22 s of the rest, against 1.26 / 1.17 / 1.61 s measured. The EP 8 -> 16 trend is still not
    reproduced (measured EP 16 beats EP 8 by 8 %, predicted EP 16 loses 9 %; EP 8 and 32 are chart
    readings). Pinned, not a target; the step budget is not published."""
    by_gpus = {q.gpus: q for q in prefills if q.id.startswith(H200)}
    assert sorted(by_gpus) == [8, 16, 32]
    assert 0.0 <= by_gpus[8].error <= 0.12, by_gpus[8].error
    assert -0.15 <= by_gpus[16].error <= -0.04, by_gpus[16].error
    assert -0.05 <= by_gpus[32].error <= 0.08, by_gpus[32].error
    assert by_gpus[16].measured > by_gpus[8].measured > by_gpus[32].measured
    assert by_gpus[8].predicted > by_gpus[16].predicted > by_gpus[32].predicted
    assert not by_gpus[16].chart_read and by_gpus[8].chart_read and by_gpus[32].chart_read
    assert by_gpus[8].step.ep_comm_s < 0.15
    assert 0.18 <= by_gpus[16].step.ep_comm_s <= 0.30 and 0.42 <= by_gpus[32].step.ep_comm_s <= 0.62
    for q in by_gpus.values():
        assert q.step_tokens == 8192
        assert q.step.total_s == pytest.approx(q.step_tokens / q.predicted)
        assert 0.80 <= q.step.gemm_s <= 0.90, q.id
        assert 0.6 <= (q.step.total_s - q.step.ep_comm_s) / q.measured_step_s <= 0.95, q.id


AMD = "amd-rocm-mi300x-dsr1-2p2d-ep16-2000-100"


def test_amd_rows_cannot_be_one_end_to_end_run():
    """The AMD ROCm blog's 2P2D figures are per role: two prefill nodes at 32.3k prompt tokens/s feed
    32.3 requests/s of 2,000 tokens, 3,230 output tokens/s at 100 per request, an eighth of the 24.8k
    the two decode nodes report. So the decode figure was measured on the decode side alone, at a
    concurrency the blog does not publish: the row is predicted over assumed requests per rank."""
    (run,) = [r for r in load_runs() if r["id"] == AMD]
    prefill_gpus = run["prefill"]["instances"] * run["prefill"]["attention_dp"]
    decode_gpus = decode_ranks(run)
    fed = run["measured_prefill_tokens_per_s_per_gpu"] * prefill_gpus / run["input_len"] * run["output_len"]
    assert fed == pytest.approx(3230, rel=1e-3)
    assert run["measured_decode_tokens_per_s_per_gpu"] * decode_gpus == pytest.approx(24800)
    assert fed < run["measured_decode_tokens_per_s_per_gpu"] * decode_gpus / 7
    assert not concurrency_stated(run) and "client_concurrency" not in run


def test_amd_mi300x_ep16_row(results):
    """DeepSeek-R1 on 2 + 2 MI300X nodes, DP16/EP16 decode with HIP graphs, FP8 weights and KV,
    2,000 / 100 tokens. Decode: the measured 1,550 output tokens/s per decode GPU lies BELOW the range
    predicted over 128-1,024 requests per rank (1,968-2,633, +27 % to +70 %): the model is optimistic
    here unless the run held fewer than ~80 requests per rank (the prediction crosses 1,550 near 75).
    Prefill: 4,637 prompt tokens/s per prefill GPU predicted for one DP16/EP16 instance at full load
    against 4,038 measured (+15 %; -3 % while the saturated instance was priced at its busiest rank of
    randomly arriving prompts); two DP8/EP8 instances (all-to-all inside each node) would predict
    7,995 (+98 %), so the figure hinges on the layout the blog implies, not on a fit. MI300X engines
    do not run DeepEP: their all-to-all keeps every token-expert copy on the NIC. Pinned band."""
    mine = sorted((r for r in results if r.id == AMD), key=lambda r: r.concurrency)
    assert [r.concurrency for r in mine] == [128, 256, 512, 1024]
    assert [r.predicted for r in mine] == sorted(r.predicted for r in mine)
    assert all(r.measured < r.predicted for r in mine)
    assert 0.20 <= mine[0].error <= 0.35 and 0.60 <= mine[-1].error <= 0.80
    for r in mine:
        assert 0.08 <= r.prefill_error <= 0.22, r.prefill_error


# Every row's predicted figure as the script prints it today (regression guard, not a fit: a change in
# the physics moves these, and the README's validation paragraph must move with them).
PREDICTED = {
    (H200 + "decode-dep32-2k2k", 2000, 256): (2098, 122.0),
    (H200 + "decode-dep72-2k2k", 2000, 256): (2027, 126.3),
    (H200 + "decode-dep96-2k2k", 2000, 256): (2012, 127.2),
    ("moreh-mi300x-dsr1-2p8-3d8-sharegpt-512", 512, 450): (3503, 128.5),
    ("moreh-mi300x-dsr1-2p8-3d8-sharegpt-1000", 1000, 450): (3091, 145.6),
    ("moreh-mi300x-dsr1-2p8-3d8-sharegpt-2000", 2000, 450): (2491, 180.7),
    ("llmd-wide-ep-b200-dsr1-1p16-1d16-1k1k", 1024, 256): (3722, 68.8),
    (AMD, 2000, 128): (1968, 65.0),
    (AMD, 2000, 256): (2445, 104.7),
    (AMD, 2000, 512): (2568, 199.4),
    (AMD, 2000, 1024): (2633, 389.0),
}


PREDICTED_PREFILL = {
    H200 + "prefill-dep8-2k": 6874,
    H200 + "prefill-dep16-2k": 6271,
    H200 + "prefill-dep32-2k": 5016,
}


def test_every_row_predicts_what_it_does_now(results, prefills):
    got = {(r.id, r.input_len, r.concurrency): r for r in results}
    assert set(got) == set(PREDICTED)
    for key, (tokens, tpot_ms) in PREDICTED.items():
        assert got[key].predicted == pytest.approx(tokens, abs=0.5 + 1e-3 * tokens), key
        assert 1e3 * got[key].tpot_s == pytest.approx(tpot_ms, abs=0.05 + 1e-3 * tpot_ms), key
    (amd,) = {r.prefill_tokens_per_s_per_gpu for r in results if r.id == AMD}
    assert amd == pytest.approx(4637, abs=0.5 + 1e-3 * 4637)
    assert {q.id: q.predicted for q in prefills} == pytest.approx(PREDICTED_PREFILL, abs=5)


def test_script_runs_and_prints_every_row(capsys):
    assert validate_disagg.main() == 0
    out = capsys.readouterr().out
    for run in load_runs() + load_runs("prefill") + load_runs("kv_transfer"):
        assert run["id"] in out
    assert "-10.4%" in out and "(chart reading)" in out
    assert "prefill 4,637 prompt tokens/s per prefill GPU" in out and "4,038 measured (+14.9%)" in out
    assert "+27.0%" in out and "+69.9%" in out
