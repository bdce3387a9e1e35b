"""The cost model against published, measured training runs (targets of the cost-model issue)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
import yaml

from autoshard.api import resize
from autoshard.costmodel.train.step import predict_train
from autoshard.emit.megatron.parse import parse_megatron
from autoshard.specs import load_cluster
from autoshard.units import GIB
from validate_published import RESIDUALS, evaluate_runs, load_runs, predict_run, run_family, source_key

MEGATRON_TABLE = Path(__file__).resolve().parents[1] / "emit" / "published_megatron.yaml"
HOPPER = ("H100-SXM5-80GB", "H200-SXM-141GB")
RUNS = load_runs()
RESULTS = evaluate_runs(runs=RUNS)
FAMILY = {r["id"]: run_family(r) for r in RUNS}
FSDP_IDS = {r["id"] for r in RUNS if r["zero_stage"] == 3}
HELD = [r for r in RESULTS if not r.skip_throughput]
DENSE = [r for r in HELD if FAMILY[r.id] == "dense" and r.id not in FSDP_IDS]
FSDP = [r for r in HELD if FAMILY[r.id] == "dense" and r.id in FSDP_IDS]
MOE = [r for r in HELD if FAMILY[r.id] == "moe"]


def test_enough_runs_are_held_to_the_target():
    assert len(HELD) >= 70
    assert {r.gpu for r in HELD} >= {"H100-SXM5-80GB", "A100-SXM4-80GB", "B200-SXM-180GB", "GB200-186GB"}
    assert len(MOE) >= 12


def test_throughput_median_error_within_10_percent():
    assert statistics.median(abs(r.error) for r in HELD) <= 0.10


@pytest.mark.parametrize("run", DENSE, ids=lambda r: r.id)
def test_no_dense_run_worse_than_25_percent(run):
    assert abs(run.error) <= 0.25, f"{run.id}: measured {run.measured}, predicted {run.predicted}"


def test_fsdp_runs():
    """ZeRO-3/FSDP runs (MosaicML llm-foundry on A100 and H100 with Composer FSDP FULL_SHARD, NeMo
    Megatron-FSDP Llama-3 70B on GB200, Megatron's torch FSDP2 for Llama 70B on MI325X; 15 held):
    median |error| 3 %, worst 11 %: the 7B at 8,192 tokens on 8 H100 (+11.3 %, FSDP's gathers have little
    to hide behind) and the 30B on 32 H100 (-11.3 %, step time predicted long); the 13B with a single
    micro-batch per step is +9.5 % (+18.4 % while its eager optimizer step was priced at serving's HBM knob).
    Before the training-only refit (EfficiencySpec.train_*) every one was predicted fast (median
    +10.8 %): the serving-era H100 GEMM knob was too high for training. Item AF: NeMo 25.04's H100 BF16 runs
    (DGX Cloud Benchmarking's Llama 3.1 405B and Grok-1, 50-56 % of peak) raise H100's BF16 level 0.55 -> 0.60,
    and llm-foundry's 2023-24 runs on 8 H100 are predicted fast again: the 7B at 8,192 tokens +18.7 %, the 13B
    +17.8 % (median 2.9 %). Item AH (the source-weighted fit, H100 NVLink 0.9 -> 0.7): the 13B +16.7 %."""
    errs = [abs(r.error) for r in FSDP]
    assert len(errs) == 15
    assert statistics.median(errs) <= 0.06
    assert max(errs) <= 0.20
    worst = sorted(FSDP, key=lambda r: abs(r.error))[-2:]
    assert {r.id for r in worst} == {"mpt-h100-7b-seq8192-8gpu", "mpt-h100-13b-seq2048-8gpu"}
    assert sorted(round(r.error, 3) for r in worst) == [0.167, 0.187]


def test_moe_runs():
    """Fine-grained MoE (Qwen3-235B-A22B on H100/GB200/GB300, DeepSeek-V3 on GB200, Mixtral 8x7B and
    8x22B on B200/GB200): 16 held runs, median |error| 4.6 % with the shipped knobs. Known gaps,
    reported in README: the intra-node EP8 plans with PP32 (-21 %) or TP4 (-33 %) run slower than
    predicted; Mixtral 8x22B at 65,536 tokens on GB200 runs 23 % slower than predicted (token-drop
    padding and CP 8 at that length); Qwen3 MXFP8 at 131,072 tokens on GB200 15 % faster. Mixtral
    8x7B on B200 was predicted 24 % fast while B200 borrowed the H100 training knobs; with the B200
    fit, +14 % (NeMo 25.02 ran delayed FP8 scaling, whose casts are cheaper than current scaling's).
    Mixtral 8x7B BF16 on 64 MI325X (EP 8, all-to-all, ROCm grouped GEMM without Primus-Turbo) runs 27 %
    slower than predicted even with the MI325X fit (+37 %), the worst MoE run (README, 'CDNA 3 runs').
    Mixtral 8x22B on 128 H100 (ModelZoo, forced balance): BF16 step +14 % (predicted slow), block-scaled
    FP8 -4 %: the measured FP8/BF16 speed-up is 1.20x against 1.44x predicted. Qwen3-30B-A3B from Megatron-LM's MoE
    recipes (4 held: H100 EP 8 and GB200 EP 16, BF16 and FP8) is predicted 14-25 % fast (test_mlmrecipe_qwen3_30b_runs);
    with them the median |error| of the 23 held runs was 9.9 % (7.9 % over the other 19, whose GB200 rows moved
    with the refit on them: GB200 `train_gemm` 0.60 -> 0.65, `train_hbm` 0.80 -> 0.60). The two ModelZoo runs with
    the EP all-to-all overlap (item W) are held since it is priced, and both are predicted 12 % short: the priced
    overlap hides more than they measured (the H100 pair: 4.8 s priced, 2.1 s measured); with them 25 held runs,
    median 10.6 %; 8.9 % with item Y's refit on MLPerf v6.0's dense runs (GB200 `train_gemm` 0.65 -> 0.60,
    `train_hbm` 0.60 -> 0.80), 8.7 % over the 21 not from the MoE recipes (7.9 % before it). Item Z: ModelZoo's
    five 4k Qwen3-235B H100 rows ran Megatron-LM's unfused loss (their table is of 8017e11, before the config
    turned the fusion on): PP 32 -17.5 -> -3.8 %, TP 4 / PP 8 -31.3 -> -28.4 %, the overlap run -12.0 -> -7.2 %.
    Item AA: five more held from the MoE recipe index (DeepSeek-V3 MXFP8 on 256 B200 and 256 GB300, Qwen3-235B-A22B
    MXFP8 on 128 B200, B300 and GB200): 30 held runs, median 7.4 % (6.9 % over the 21 not from the recipes).
    Item AC: the host floor under MoE layers (16 local experts x H100's fitted 500 us = 8 ms a layer and
    micro-batch) takes the TP 4 / PP 8 row -27.9 -> -10.1 % and Qwen3-30B-A3B on H100 -10 / -14.5 -> +2.0 / +1.1 %:
    median 6.7 % (6.6 % over the 21 not from the recipes). Item AF: DGX Cloud Benchmarking's eight Grok-1 314B
    runs (NeMo 25.04's performance script; GB200 and H100, BF16 and FP8), and the refit they feed with 20 dense runs
    of the same release (GB200 `train_gemm` 0.70 -> 0.50, `train_gemm_fp8` 0.55 -> 0.50; H100 `train_gemm` 0.55 ->
    0.60): 38 held runs, median 8.8 % (the Grok BF16 runs +16-18 %, FP8 -8 to +4 %). Item AG: DGX Cloud
    Benchmarking v24.11's 18 Grok-1 314B runs on 8-2,048 H100 (NeMo 24.09; reduced-layer proxies below 512 GPUs),
    BF16 -1 to +4 %, FP8 -11 to -1 %, and the H100 refit (`train_gemm_fp8` 0.60 -> 0.55): 56 held runs, median
    4.8 % (4.1 % over the 47 not from the recipes), 49 within 15 %. Item AH, the source-weighted fit (GB200
    `train_gemm` 0.50 -> 0.55 and NVLink 0.9 -> 0.7, H100 FP8 0.55 -> 0.60 and NVLink 0.9 -> 0.7, B200 FP8
    0.50 -> 0.45): median 6.7 % (7.1 % over the 47; the Grok-1 FP8 runs on GB200 +2-4 -> +7-9 %, H100 FP8
    -3 -> -8 %), but 53 within 15 % (the recipes' Qwen3-30B MXFP8 on GB200 -20.8 -> -14.8 %)."""
    errs = sorted(abs(r.error) for r in MOE)
    assert len(errs) == 56
    by_id = {r.id: r.error for r in MOE}
    assert 0.03 < by_id["moezoo-mixtral-8x22b-h100-bf16"] < 0.10  # +14 % until item AF raised H100's BF16 level
    assert -0.10 < by_id["moezoo-mixtral-8x22b-h100-fp8-blockwise"] < 0.0
    # steps predicted short: the overlap priced optimistic (the H100 run -12 % until item Z's unfused loss, -7 % since)
    assert -0.12 < by_id["moezoo-qwen3-235b-h100-crossnode-ep32-1f1b-overlap"] < -0.05
    assert -0.15 < by_id["moezoo-qwen3-235b-gb300-mxfp8-ep64-pp1"] < -0.08
    # item Z: the five 4k H100 rows ran the unfused loss (ModelZoo 8017e11); on the last of 32 stages it sets the pace
    assert -0.10 < by_id["moezoo-qwen3-235b-h100-intranode-ep8-pp32-a2a"] < -0.06  # -3.8 % until item AF
    # its layers wait on the host since item AC (-28.4 % from item Z, -27.9 % at item AB)
    assert -0.12 < by_id["moezoo-qwen3-235b-h100-intranode-ep8-tp4-pp8"] < -0.08
    assert statistics.median(errs) <= 0.07  # 0.09 at item AF (38 runs), 0.048 at item AG
    assert statistics.median(e for r in MOE if not r.id.startswith("mlmrecipe-") for e in [abs(r.error)]) <= 0.075
    assert sum(e <= 0.15 for e in errs) >= 53


def test_published_runs_fit_in_memory():
    """Every published run ran, so each must be predicted to fit. The tightest was NeMo 24.07 GPT-3
    20B FP8 (TP 2, no recompute, Apex distributed Adam, BF16 gradient buffer): 81.7 GiB predicted on
    an 80 GB H100 (79.6 GiB) while the 7 % fragmentation allowance was charged on every allocated
    byte; charged on the dynamic allocations only (the contiguous parameter/gradient buffers, the
    optimizer shards and the FP8 weight copies are allocated once), 77.5 GiB."""
    assert [r.id for r in RESULTS if not r.fits and not r.skip_memory] == []
    # the two exceptions ran with activation (and optimizer) offloading to host memory, which autoshard does not
    # model
    assert sorted(r.id for r in RESULTS if r.skip_memory) == ["mlmrecipe-dsv3-gb200-mxfp8-ep64-offload",
                                                               "moezoo-qwen3-235b-gb200-mxfp8-ep64-offload"]
    tight = next(r for r in RESULTS if r.id == "nemo2407-h100-fp8-gpt3-20b")
    assert tight.predicted_memory_gib == pytest.approx(77.5, abs=0.1)


def test_published_megatron_commands_fit_in_memory():
    """All 52 rows of tests/emit/published_megatron.yaml, read from their Megatron-LM flags as
    `evaluate --from-megatron` does, are predicted to fit. The two that did not with fragmentation on
    every byte: NeMo 24.07 FP8 GPT-3 20B (82.3 -> 78.1 GiB) and Nemotron-4 340B (82.3 -> 78.7 GiB;
    its NeMo optimizer kept no FP32 master, which no Megatron-LM flag expresses, so it is the tighter)."""
    rows = yaml.safe_load(MEGATRON_TABLE.read_text(encoding="utf-8"))
    assert len(rows) == 52
    peaks = {}
    for row in rows:
        parsed = parse_megatron(row["command"]).with_world_size(row["gpus"])
        pred = predict_train(parsed.model, resize(load_cluster(row["cluster"]), row["gpus"]), parsed.train_config(),
                             parsed.layout())
        assert pred.fits, row["id"]
        peaks[row["id"]] = pred.peak_memory_bytes / GIB
    assert peaks["nemo2407-h100-fp8-gpt3-20b"] == pytest.approx(78.1, abs=0.1)
    assert peaks["nemo2407-h100-fp8-nemotron-340b"] == pytest.approx(78.7, abs=0.1)


def test_every_skip_has_a_reason():
    for r in RESULTS:
        assert r.skip_throughput is None or len(r.skip_throughput) > 40


def test_every_run_records_its_loss_with_evidence():
    """Each run says which cross-entropy it ran, with the config file and commit (or the framework
    default a run without a published launch takes); Megatron-LM's own default is the unfused loss."""
    for r in RUNS:
        assert r["cross_entropy"] in {"unfused", "native", "te", "xentropy"}, r["id"]
        assert len(r["cross_entropy_evidence"]) > 40, r["id"]
    loss: dict[str, set[str]] = {}
    for r in RUNS:
        if not r.get("skip_throughput"):
            loss.setdefault(source_key(r), set()).add(r["cross_entropy"])
    assert loss["mlm"] == loss["megatron2021"] == {"unfused"}
    assert loss["nemo2407"] == {"unfused", "native"}  # the 24.07 launcher's Llama-3 and Nemotron 8B/22B configs fuse it
    assert loss["mlmllama"] == loss["nemo2502"] == {"native"} and loss["mpt"] == {"xentropy"}
    # the Qwen3 configs fuse with TE, the Mixtral 8x22B config natively; the 4k H100 Qwen3 table predates the fusion
    assert loss["moezoo"] == {"te", "native", "unfused"}


def test_every_moe_run_records_its_cuda_graphs_with_evidence():
    """Whether a Megatron-Core MoE run captured CUDA graphs (`--cuda-graph-impl transformer_engine
    --cuda-graph-scope ...`) decides how much host launch time its small micro-batches pay; each MoE
    run records the scope its published command used, `none` where the command has no such flag, or
    `unstated` where the source publishes no command (the README's host-launch item reads these)."""
    moe = {r["id"]: r for r in RUNS if source_key(r) in ("moezoo", "mcore")}
    assert len(moe) == 18
    for r in moe.values():
        assert r["cuda_graph"] in {"none", "unstated", "moe_router moe_preprocess", "attn moe_router moe_preprocess"}, r["id"]
        assert len(r["cuda_graph_evidence"]) > 40, r["id"]
    # the -35 % row and its PP 32 / FSDP siblings publish no command; the long-context rows of the same
    # TP 4 / PP 8 / EP 8 plan ran eager; every Blackwell row and the H100 EP 32 plan captured graphs
    assert {i for i, r in moe.items() if r["cuda_graph"] == "unstated"} == {
        "moezoo-qwen3-235b-h100-intranode-ep8-fsdp", "moezoo-qwen3-235b-h100-intranode-ep8-pp32-a2a",
        "moezoo-qwen3-235b-h100-intranode-ep8-tp4-pp8"}
    assert all(r["cuda_graph"] == "none" for i, r in moe.items() if "longctx" in i)
    blackwell = [i for i in moe if ("gb200" in i or "gb300" in i) and not i.endswith("baseline") and "longctx" not in i]
    assert len(blackwell) == 5 and all(moe[i]["cuda_graph"] == "attn moe_router moe_preprocess" for i in blackwell)
    assert moe["mcore-dsv3-gb200-256gpu-baseline"]["cuda_graph"] == "none"
    assert moe["moezoo-qwen3-235b-h100-crossnode-ep32"]["cuda_graph"] == "moe_router moe_preprocess"
    # the Mixtral 8x22B H100 config, script and launcher set no CUDA-graph flag
    mixtral = ("moezoo-mixtral-8x22b-h100-bf16", "moezoo-mixtral-8x22b-h100-fp8-blockwise")
    assert all(moe[i]["cuda_graph"] == "none" for i in mixtral)


MEMORY = [r for r in RESULTS if r.memory_error is not None and not r.memory_gap]


def test_memory_error_within_10_percent_on_every_run():
    """Per-GPU memory where the source reports it (14 torchtitan runs, framework: torchtitan, the
    allocator's peak reservation): the Dec 2024 benchmark's Tables 1-4 (H100 96GB) and the June
    2025 H200 runs (compiled loss): median |error| 2.4 %, max 8.3 % (70B FSDP 32 x TP 8 without
    async TP, under-predicted), signed median +0.2 % (fragmentation on the dynamic bytes only; it was
    2.1 %, 8.0 %, +1.1 % with fragmentation on every byte, so the 7 % needs no refit). The eager runs
    are 2-3 % under, their compiled twins 4-6 % over: the model predicts one figure for both.
    Plus the two Megatron ZeRO-1 MI325X runs whose logs print the allocator's peak allocation after
    iteration 1 (memory_metric max_allocated_first_iteration): Llama-2 7B -4.3 %, Mixtral 8x7B -2.5 %."""
    assert len(MEMORY) >= 16
    assert statistics.median(abs(r.memory_error) for r in MEMORY) <= 0.05
    assert max(abs(r.memory_error) for r in MEMORY) <= 0.10
    assert abs(statistics.median(r.memory_error for r in MEMORY)) <= 0.02  # no bias left to refit


def test_memory_gaps_stay_visible():
    """Rows whose memory is compared but not held (memory_gap): Megatron use_torch_fsdp2 with Transformer
    Engine FP8 on MI325X, whose first-iteration peak allocation exceeds the prediction by about the FP8
    copy of the gathered weights (1 B per parameter) that the ZeRO-3 memory model does not count.
    Also torchao's torchtitan Llama-3 8B runs on 8 B200s at 750 W (local batch 1, torch 2.9 nightly, BF16 /
    float8 tensorwise / MXFP8): predicted 14-16 % over the logged peak reservation, while the same recipe
    at local batch 2 on H100/H200 is within 4 %: those ran torchtitan before its per-unit FSDP wrapping of
    the embedding and the output (83e69410), which the memory model does not price (training_runs.yaml)."""
    gaps = {r.id: r.memory_error for r in RESULTS if r.memory_gap}
    fsdp2_fp8 = {"aac-mi325x-llama2-70b-16gpu-fsdp2-fp8", "aac-mi325x-llama31-70b-64gpu-fsdp2-fp8"}
    torchao_b200 = {"torchao-b200-750w-llama3-8b-8gpu-fsdp-compile-bf16",
                    "torchao-b200-750w-llama3-8b-8gpu-fsdp-compile-fp8-tensorwise",
                    "torchao-b200-750w-llama3-8b-8gpu-fsdp-compile-mxfp8"}
    assert set(gaps) == fsdp2_fp8 | torchao_b200
    assert all(-0.45 < gaps[i] < -0.30 for i in fsdp2_fp8)
    assert all(0.10 < gaps[i] < 0.20 for i in torchao_b200)


def test_residual_file_covers_every_run():
    """tests/validation/residuals_train.json (validate_published.py --write-residuals), read by the
    prediction bands: one row per run with its leave-one-source-out and all-in predictions."""
    rows = json.loads(RESIDUALS.read_text())
    assert [row["id"] for row in rows] == [r["id"] for r in RUNS]
    keys = {"id", "source", "mode", "gpu", "family", "precision", "metric", "measured", "predicted_loso",
            "predicted_fit", "mem_measured_gib", "mem_predicted_gib", "held"}
    by_id = {r["id"]: r for r in RUNS}
    for row, res in zip(rows, RESULTS, strict=True):
        assert set(row) == keys
        assert row["mode"] == "train" and row["family"] in ("dense", "moe")
        assert row["source"] == source_key(by_id[row["id"]])
        assert row["gpu"] == res.gpu and row["metric"] == res.metric
        assert row["measured"] == pytest.approx(res.measured)
        assert row["held"] == (res.skip_throughput is None)
        assert row["predicted_loso"] > 0 and row["predicted_fit"] > 0
        assert (row["mem_measured_gib"] is None) == (res.measured_memory_gib is None or res.memory_gap is not None)


def test_the_shipped_knobs_are_the_validated_fit():
    """Every run predicted with the bundled clusters' knobs (RESULTS) equals its all-in fit prediction in the
    residual file, which the in-sample figures, the bands and fit_efficiency.py's output are made of: every
    knob the fit moves (the GEMM fall-off, TP overlap and collective bandwidth fractions too, as training-only
    overrides) ships. A knob copied wrong, or one the fit moves that does not ship, breaks this."""
    rows = {row["id"]: row for row in json.loads(RESIDUALS.read_text())}
    off = {r.id: r.predicted / rows[r.id]["predicted_fit"] - 1 for r in RESULTS}
    assert max(abs(d) for d in off.values()) < 1e-9, {i: d for i, d in off.items() if abs(d) >= 1e-9}


def test_nvfp4_rows_with_bf16_edge_layers_are_refused():
    """Megatron's --first-last-layers-bf16 keeps some decoder layers out of FP4: a per-layer precision
    autoshard does not model, so a row that says it ran so cannot be predicted as if it had not."""
    row = next(r for r in RUNS if r["id"] == "mlperf51-nvidia-gb300-llama31-405b-512gpu-fp4")
    assert row["fp4_bf16_layers"] == [0, 0] and predict_run(row).predicted > 0
    with pytest.raises(ValueError, match="decoder layers kept in BF16 under FP4 are not modelled"):
        predict_run({**row, "fp4_bf16_layers": [1, 1]})


def test_a_gpu_with_too_few_runs_borrows_its_generations_pool():
    """fit_efficiency.generation_pool: a Blackwell GPU pools the held runs of every Blackwell type (B200 26,
    B300 14, GB200 53 since item AF's DGX Cloud Benchmarking runs, GB300 23), never H100's or A100's; every Blackwell type now has MIN_RUNS or more and a
    fit of its own (B300 since MLPerf v6.0's 8B NVFP4 runs: 3 held before, pooled); H200 (4 held runs)
    still borrows the Hopper pool; a GPU of no fitted generation has no pool (it borrows H100's)."""
    from fit_efficiency import MIN_RUNS, generation_pool, held
    from validate_published import run_gpu

    by_gpu: dict[str, list[dict]] = {}
    for r in held(RUNS):
        by_gpu.setdefault(run_gpu(r), []).append(r)
    blackwell = ("B200-SXM-180GB", "B300-SXM-288GB", "GB200-186GB", "GB300-288GB")
    types, pool = generation_pool("B300-SXM-288GB", by_gpu)
    assert types == blackwell
    assert [len(by_gpu[t]) for t in types] == [28, 14, 53, 23] and len(pool) == 118
    assert all(run_gpu(r) in blackwell for r in pool)
    assert min(len(by_gpu[t]) for t in blackwell) >= MIN_RUNS  # each a fit of its own
    # the torchtitan H100 96GB runs are not held: the Hopper pool is the H100 SXM runs and MLPerf's four
    # held H200 runs (v5.0 Nebius 405B, v5.1 HPE 8B, v6.0 Cisco 8B), too few for an H200 fit of its own
    types, pool = generation_pool("H200-SXM-141GB", by_gpu)
    assert types == ("H100-SXM5-80GB", "H200-SXM-141GB") and len(by_gpu["H200-SXM-141GB"]) == 4 < MIN_RUNS
    # MI300X has no held run: the CDNA 3 pool is MI325X's (the same die with HBM3E), 6 runs
    types, pool = generation_pool("MI300X-192GB", by_gpu)
    assert types == ("MI325X-256GB",) and len(pool) == 6 >= MIN_RUNS
    assert generation_pool("MI250X-128GB", by_gpu) == ((), [])


CDNA3 = [r for r in RESULTS if r.gpu == "MI325X-256GB"]


def test_cdna3_runs_are_held_and_fitted():
    """The CDNA 3 runs (issue #10 deliver 1): no MI300X training run is published with its plan, so
    the rows are MI325X's, the MI300X die with 256 GB of HBM3E: 4 AMD Accelerator Cloud runs with
    their complete Megatron argument dumps (aac: Primus-Megatron Llama-2 70B / 7B FP8 and Mixtral 8x7B
    BF16, ROCm Megatron-LM Llama-3.1 70B FP8 FSDP2), 3 of AMD's published 8-node results (amdperf;
    the BF16 70B row shown, not held: its recompute and global batch are unknown at micro-batch 1) and
    MiTAC's MLPerf Training v6.0 Llama 3.1 8B FP8 run on one node (mitac: step time from the result
    log's training blocks; shown, not held: Primus-Turbo off and the CK v3 attention settings of the
    run unpublished, worth 13 % of the step). With the shipped MI325X knobs (every fitted knob since item U:
    the fit's GEMM fall-off and inter-node bandwidth fraction too) the five dense runs are within 6.1 %
    (median 2.7 %; median 1.3 % with the shared knobs before item U); Mixtral's +10.6 % is reported, not
    fitted away; MiTAC's run is 18 % fast."""
    ids = {r.id for r in CDNA3}
    assert len(CDNA3) == 8 and {source_key({"id": i}) for i in ids} == {"aac", "amdperf", "mitac"}
    held = [r for r in CDNA3 if not r.skip_throughput]
    assert [r.id for r in CDNA3 if r.skip_throughput] == ["amdperf-mi325x-llama31-70b-64gpu-fsdp-bf16",
                                                         "mitac-mi325x-llama31-8b-8gpu-fp8"]
    mitac = next(r for r in CDNA3 if r.id == "mitac-mi325x-llama31-8b-8gpu-fp8")
    assert mitac.metric == "step_time_s" and -0.25 <= mitac.error <= -0.10, mitac.error
    dense = [abs(r.error) for r in held if FAMILY[r.id] == "dense"]
    assert len(dense) == 5 and statistics.median(dense) <= 0.03 and max(dense) <= 0.065
    mixtral = next(r for r in held if FAMILY[r.id] == "moe")
    assert 0.10 <= mixtral.error <= 0.20, mixtral.error
    # AMD's published figure and the independent run of the same plan agree within 1 %
    aac70 = next(r for r in CDNA3 if r.id == "aac-mi325x-llama31-70b-64gpu-fsdp2-fp8")
    tokens = 256 * 8192 / aac70.measured / 64
    assert tokens == pytest.approx(1726, rel=0.01)


def test_cdna3_leave_one_source_out_fits_its_own_fp8_level():
    """Each CDNA 3 source alone leaves 2 or 4 MI325X runs in its fold: too few for a fit of its own
    (MIN_RUNS), so the fold borrows the H100 fit with CDNA 3's kernel-measured attention, but refits
    the GEMM level of each precision those runs train in (fit_efficiency.level_fit). With H100's FP8
    level every held dense FP8 run was predicted 8-22 % fast; with its own level each is within 7 %
    out of source (residuals_train.json, written by validate_published.py --write-residuals; 6 % until item Z
    moved the H100 fit the folds lend through the ModelZoo rows' loss). The
    BF16 Mixtral keeps H100's BF16 level (no other source has a CDNA 3 BF16 run) and stays 34 % fast:
    the kernel path of its software, recorded with the run; 45 % since item AF raised H100's BF16 level
    (0.55 -> 0.60, NeMo 25.04's H100 BF16 runs), which this fold borrows."""
    rows = {row["id"]: row for row in json.loads(RESIDUALS.read_text())}
    held = [r for r in CDNA3 if not r.skip_throughput]
    assert len(held) == 6
    for r in held:
        row = rows[r.id]
        assert row["gpu"] == "MI325X-256GB" and row["held"]
        faster = (row["measured"] / row["predicted_loso"] if row["metric"] == "step_time_s"
                  else row["predicted_loso"] / row["measured"])
        if row["precision"] == "fp8":
            assert 0.94 <= faster <= 1.07, (r.id, faster)
        else:
            assert r.id == "aac-mi325x-mixtral-8x7b-64gpu-ep8-bf16" and 1.40 <= faster <= 1.50, (r.id, faster)


def test_mi300x_efficiency_note_follows_the_data():
    """The MI300X cluster's training knobs come from where the data is: with fewer than MIN_RUNS held
    MI300X runs it borrows its generation's pool (the MI325X fit shipped in the validation cluster, on
    exactly the held MI325X runs), and `solve`/`evaluate` say so in a note; once MIN_RUNS MI300X runs
    are held, its own fit must replace it (fitted_gpu the MI300X's name, fitted_runs their count)."""
    from fit_efficiency import MIN_RUNS, held

    from autoshard.costmodel.efficiency import efficiency_source, is_borrowed
    from autoshard.specs.cluster import TRAIN_KNOBS
    from validate_published import _base_cluster, run_gpu

    mi300x = load_cluster("mi300x").primary.gpu
    mi325x = _base_cluster("mi325x").primary.gpu
    runs = held(RUNS)
    own = [r for r in runs if run_gpu(r) == mi300x.name]
    pool = [r for r in runs if run_gpu(r) == mi325x.name]
    assert mi325x.efficiency.fitted_gpu == mi325x.name and mi325x.efficiency.fitted_runs == len(pool) == 6
    if len(own) >= MIN_RUNS:
        assert mi300x.efficiency.fitted_gpu == mi300x.name and mi300x.efficiency.fitted_runs == len(own)
        return
    assert is_borrowed(mi300x) and mi300x.efficiency.fitted_runs == len(pool)
    assert efficiency_source(mi300x) == "borrowed from CDNA 3 pool (MI325X-256GB)"
    for knob in TRAIN_KNOBS:
        assert getattr(mi300x.efficiency, "train_" + knob) == getattr(mi325x.efficiency, "train_" + knob), knob
    from autoshard.costmodel.train.types import TrainConfig
    from autoshard.emit.megatron.layout import default_stages
    from autoshard.parallel import ParallelDims
    from autoshard.specs import load_model

    model = load_model("llama-3.1-70b")
    cfg = TrainConfig(dims=ParallelDims(tp=8, pp=1, dp=8, cp=1, vpp=1), micro_batch_size=1,
                      global_batch_size=64, seq_len=8192)
    pred = predict_train(model, resize(load_cluster("mi300x"), 64), cfg, default_stages(model, pp=1, vpp=1))
    assert any(n.startswith("MI300X-192GB: efficiency borrowed from CDNA 3 pool (MI325X-256GB)") for n in pred.notes)


def test_mlperf51_blackwell_runs():
    """MLPerf Training v5.1 FP8 Llama 3.1 submissions whose plan is published (config dump in the log or the
    committed config the results README names): 6 held B200 runs from three submitters (Oracle, University of
    Florida, Dell), one B300 (Dell), and NVIDIA's GB200/GB300 at 72 GPUs; NVIDIA's 512-GPU TP 2 x CP 4 runs
    (about 1,024 tokens per GPU per step) are shown, not held: predicted about 40 % short. With the shipped
    B200 knobs (fitted on these, the B200 NVFP4 runs of MLPerf v5.1 and v6.0 and NeMo 25.02's B200 runs together)
    the 64-GPU CP 2 runs' steps are predicted 2 % short (7 % before item AB's refit, 3 % before item AA's, 7 % before
    MLPerf v6.0's runs, item Y; 6 % since item AH's source-weighted fit, B200 FP8 0.50 -> 0.45 with attention 0.20 ->
    0.25 at 4,096) and the 16-GPU and 405B runs' 8-20 % long (9-18 % before item AH, 7-17 % before item AA), while NeMo
    25.02's B200 Mixtral and
    Nemotron-4 rows stay fast: two software lines (NeMo 25.09 with full-iteration CUDA graphs against NeMo
    25.02) that one B200 fit splits between (README item P)."""
    rows = {r.id: r for r in RESULTS if r.id.startswith("mlperf51-") and r.gpu not in HOPPER and not r.id.endswith("-fp4")}
    held = [r for r in rows.values() if not r.skip_throughput]
    assert len(rows) == 11 and len(held) == 9
    assert sum(r.gpu == "B200-SXM-180GB" for r in held) == 6
    assert {r.id for r in rows.values() if r.skip_throughput} == {
        "mlperf51-nvidia-gb200-llama31-8b-512gpu-tp2-cp4", "mlperf51-nvidia-gb300-llama31-8b-512gpu-tp2-cp4"}
    assert all(r.metric == "step_time_s" for r in rows.values())
    assert all(abs(r.error) <= 0.22 for r in held)
    b200 = {r.id: r.error for r in held if r.gpu == "B200-SXM-180GB"}
    cp2 = {i for i in b200 if i.endswith("-cp2")}
    assert len(cp2) == 2 and all(-0.065 <= b200[i] <= -0.05 for i in cp2)  # predicted short
    assert all(0.08 <= b200[i] <= 0.20 for i in b200.keys() - cp2)  # predicted long
    assert all(-0.55 < r.error < -0.35 for r in rows.values() if r.skip_throughput)


def test_mlperf60_runs():
    """MLPerf Training v6.0 DeepSeek-V3 671B MXFP8 pretraining (NVIDIA, Megatron-Bridge in NeMo 26.04, MTP 1,
    PP 4 x VPP 4 with layout Et*4|(t*4|)*14tmL, EP 32 with the HybridEP flex dispatcher, full-iteration CUDA
    graphs): GB300 TP 1 at 256/512 GPUs and GB200 TP 2 at 512-8,192 GPUs. All six are shown, not held: they
    run the paged stash with static expert buffers and the fused grouped MLP, which autoshard has no knob for
    (the rule of the Qwen3-30B-A3B paged-stash recipe); their 1F1B A2A overlap is priced (item W). With the
    shipped knobs the GB200 steps are predicted +4 % (512), +1 % (2,048) and -11 % (4,096) since item AH's
    source-weighted fit (GB200 BF16 0.50 -> 0.55, NVLink 0.9 -> 0.7; +1.5, -2, -14 % from item Z's GB200 refit, -1,
    -4, -16 % before): the four GB200
    runs (same per-GPU plan, 240/60/32/16 micro-batches) fit m x 0.132 s + 1.09 s, autoshard m x 0.135 s
    + 0.20 s; at 8,192 GPUs that unseen fixed cost is about a third of the step (28 % short). The GB300
    runs are predicted 31-32 % long (38-40 % until item AH, 44-46 % at item V, before the overlap was priced and
    GB300 refitted with its overlap run; 57-60 % before GB300's own fit, item T): NVIDIA's own count
    (MODEL_TFLOP_PER_SAMPLE 1,068) puts them at 1,600-1,630 TFLOP/s per GPU against GB200's 974 at the same
    512 GPUs, while autoshard prices GB300 at about GB200's MXFP8 rate.
    Cisco's Llama 3.1 8B FP8 (tensorwise) on 16 H200 (plan from the log's config dump, 2 micro-batches per
    step, full-iteration CUDA graph) is predicted 3.5 % short since item AH (Hopper FP8 0.55 -> 0.60; 1 % long from
    item AG's Hopper refit, element-wise `train_hbm` 0.80 -> 0.60, 3 % short before)."""
    by_id = {r["id"]: r for r in RUNS}
    assert {source_key(r) for r in RUNS if r["id"].startswith("mlperf60-")} == {"mlperf60"}
    cisco = next(r for r in RESULTS if r.id == "mlperf60-cisco-h200-llama31-8b-16gpu")
    assert cisco.gpu == "H200-SXM-141GB" and not cisco.skip_throughput and cisco.measured == 1.181
    assert (by_id[cisco.id]["fp8_recipe"], by_id[cisco.id]["global_batch_size"], by_id[cisco.id]["parallel"]["dp"]) == ("tensorwise", 32, 16)
    assert -0.045 < cisco.error < -0.025
    rows = {r.id: r for r in RESULTS if r.id.startswith("mlperf60-nvidia-") and "-dsv3-" in r.id}
    assert len(rows) == 6
    assert all(r.skip_throughput and "stash" in r.skip_throughput.lower() for r in rows.values())
    assert all(by_id[i]["moe_a2a_overlap"] for i in rows)  # priced: the run's OVERLAP_MOE_EXPERT_PARALLEL_COMM
    assert all(r.metric == "step_time_s" for r in rows.values())
    for i in rows:  # the published plan: MXFP8, PP 4 x VPP 4, EP 32, HybridEP (flex), MTP on the last chunk
        run, p = by_id[i], by_id[i]["parallel"]
        assert (run["fp8_recipe"], run["moe_dispatcher"], run["pipeline_layout"]) == ("mxfp8", "flex", "Et*4|(t*4|)*14tmL")
        assert (p["pp"], p["vpp"], p["ep"], p["cp"], run["micro_batch_size"], run["seq_len"]) == (4, 4, 32, 1, 1, 4096)
        assert run["global_batch_size"] in (15360, 16384) and run["global_batch_size"] % p["dp"] == 0
        assert run["sequence_parallel"] == (p["tp"] > 1)
    gpus = {i: by_id[i]["parallel"]["tp"] * 4 * by_id[i]["parallel"]["dp"] for i in rows}
    assert sorted(gpus.values()) == [256, 512, 512, 2048, 4096, 8192]
    measured = {i.removeprefix("mlperf60-nvidia-").removesuffix("gpu"): r.measured for i, r in rows.items()}
    assert measured == {"gb300-dsv3-671b-256": 39.28, "gb300-dsv3-671b-512": 20.03, "gb200-dsv3-671b-512": 32.91,
                        "gb200-dsv3-671b-2048": 8.653, "gb200-dsv3-671b-4096": 5.366, "gb200-dsv3-671b-8192": 3.477}
    err = {i.removeprefix("mlperf60-nvidia-").removesuffix("gpu"): r.error for i, r in rows.items()}
    assert all(0.30 < err[k] < 0.36 for k in ("gb300-dsv3-671b-256", "gb300-dsv3-671b-512"))  # predicted long (0.35-0.42 until item AF's GB300 refit)
    assert 0.03 < err["gb200-dsv3-671b-512"] < 0.055
    assert 0.0 < err["gb200-dsv3-671b-2048"] < 0.02
    assert -0.13 < err["gb200-dsv3-671b-4096"] < -0.10
    assert -0.30 < err["gb200-dsv3-671b-8192"] < -0.27  # shown: the fixed per-step cost
    # item Y: the Llama 3.1 runs of the other submitters (and NVIDIA's 8B), read from the stored mirror: 34
    # held (32 NVFP4 8B/405B, SCITIX's FP8 8B), each within 10 % in sample (B300's 13 runs -5 to +4 %, its own
    # fit since); 10.3 % since item Z took the eight short-block rows at their logs' pace (Nebius's 64-GPU B300
    # -10.2 %, the 72-GPU GB300 rows -7.8 to -9.5 %: one micro-batch per step, the fixed per-step cost), NVIDIA's strong-scaled 8B at 512 GB300 / 1,024 GB200 (TP x CP 8 / 16) shown: 38 % and 56 % short
    llama = {r.id: r for r in RESULTS if r.id.startswith("mlperf60-") and "-llama31-" in r.id}
    held = {i: r for i, r in llama.items() if not r.skip_throughput}
    assert len(llama) == 39 and len(held) == 37  # with Cisco's H200 and NVIDIA's two GB300 405B runs of items S, T
    assert all(abs(r.error) < 0.103 for r in held.values())
    assert {r.gpu for r in held.values()} == {"B200-SXM-180GB", "B300-SXM-288GB", "GB200-186GB", "GB300-288GB",
                                               "H200-SXM-141GB"}
    shown = sorted(r.error for r in llama.values() if r.skip_throughput)
    assert len(shown) == 2 and -0.63 < shown[0] < -0.50 and -0.44 < shown[1] < -0.35


def test_mlperf50_gb200_405b_runs():
    """MLPerf Training v5.0 Llama 3.1 405B FP8 on GB200 NVL72 (NeMo 25.04 container, the NeMo 25.04 summary's
    software): NVIDIA at 256/512 GPUs and CoreWeave at 512-2,496 GPUs, TP 4 PP 8 VPP 8 CP 2, all held; with the
    shipped GB200 knobs (fitted on 53 GB200 runs, these 7 among them) each step is 5-11 % long since item AH's
    source-weighted fit (GB200 BF16 0.50 -> 0.55, fall-off 64 -> 256, NVLink 0.9 -> 0.7: these 7 weigh 2.6, NeMo
    25.04's 32 GB200 runs 5.7; +0.4 to +6.4 % at item AG; +2.3 to +6.2 % from item Z's refit, GB200 `train_gemm`
    0.60 -> 0.65 with `train_hbm` 0.80 -> 0.60; +1.2 to +5.1 % at item Y; -3.5 to +0.2 % before item Y's refit,
    GB200 `train_gemm_fp8` 0.60 -> 0.55); out of source (residuals_train.json) 6-12 % long since item AA (within 4 %
    before): the fold that leaves v5.0 out fits GB200's FP8 GEMM level at 0.50 (0.55 with them), pulled down by the
    MXFP8 Qwen3-235B recipe row on 128 GB200 and NeMo 25.04's rows on racks of 64; the three NVFP4 405B runs of
    MLPerf v5.1 on GB200 (same plan family) had pinned it (9-13 % long without them, 4-9 % before the GB200 fit took
    Qwen3-30B-A3B's rows in)."""
    rows = [r for r in RESULTS if r.id.startswith("mlperf50-") and r.gpu not in HOPPER]
    assert len(rows) == 7 and all(r.gpu == "GB200-186GB" and not r.skip_throughput for r in rows)
    assert all(0.05 < r.error < 0.115 for r in rows)
    loso = {row["id"]: row for row in json.loads(RESIDUALS.read_text())}
    assert all(0.05 < loso[r.id]["predicted_loso"] / loso[r.id]["measured"] - 1 < 0.12 for r in rows)


def test_mlperf41_b200_preview_gpt3_is_shown_not_held():
    """MLPerf Training v4.1's 64-B200 GPT-3 175B (Preview: pre-release software, a Blackwell settings file
    not published) is shown, not held: autoshard predicts its step 31 % long with the shipped B200 knobs
    (28 % before item Y, 22 % at item T, 30 % with the knobs fitted on NeMo 25.02 alone)."""
    run = next(r for r in RESULTS if r.id == "mlperf41-nvidia-b200-gpt3-175b-64gpu")
    assert run.skip_throughput and run.metric == "step_time_s" and 0.17 < run.error < 0.33


MLPERF_HOPPER = {  # id: (TP, PP, DP, CP, VPP, micro-batch, global batch, measured step s), from the submissions' config files
    "mlperf31-nvidia-h100-gpt3-175b-768gpu": (4, 8, 24, 1, 12, 1, 3072, 11.0754),
    "mlperf31-nvidia-h100-gpt3-175b-4096gpu": (4, 8, 128, 1, 12, 1, 2048, 1.6084),
    "mlperf31-nvidia-h100-gpt3-175b-10752gpu": (4, 8, 336, 1, 12, 1, 2688, 0.9296),
    "mlperf41-nvidia-h100-gpt3-175b-256gpu": (4, 8, 8, 1, 6, 2, 2048, 18.374),
    "mlperf41-nvidia-h100-gpt3-175b-512gpu": (4, 8, 16, 1, 6, 2, 2048, 9.4964),
    "mlperf41-oracle-h100-gpt3-175b-1536gpu": (4, 8, 48, 1, 4, 2, 3072, 5.1705),
    "mlperf41-oracle-h100-gpt3-175b-3072gpu": (4, 8, 96, 1, 4, 2, 3072, 3.0535),
    "mlperf50-nvidia-h100-llama31-405b-512gpu": (8, 8, 4, 2, 8, 1, 1152, 55.14),
    "mlperf50-nvidia-h100-llama31-405b-2048gpu": (8, 8, 16, 2, 8, 1, 1152, 14.22),
    "mlperf50-nvidia-h100-llama31-405b-8192gpu": (8, 8, 64, 2, 8, 1, 1536, 5.18),
    "mlperf50-nebius-h200-llama31-405b-512gpu": (4, 8, 8, 2, 8, 1, 1152, 50.01),
    "mlperf50-nebius-h200-llama31-405b-1024gpu": (4, 8, 16, 2, 8, 1, 1152, 25.36),
    "mlperf51-cisco-h100-llama31-8b-64gpu": (1, 1, 64, 1, 1, 1, 64, 0.7205),
    "mlperf51-cisco-h100-llama31-8b-128gpu-tp2": (2, 1, 64, 1, 1, 1, 64, 0.4851),
    "mlperf51-hpe-h200-llama31-8b-64gpu-cp2": (1, 1, 32, 2, 1, 1, 32, 0.3532),
    "mlperf60-cisco-h200-llama31-8b-16gpu": (1, 1, 16, 1, 1, 1, 32, 1.181),
}


def test_dgxc2411_weak_scaling_runs():
    """DGX Cloud Benchmarking v24.11 (README item AG): 88 H100 runs of NeMo 24.09's launcher recipes (GPT-3 175B in
    NeMo 24.05), 14 tables of one plan each, BF16 and FP8, weak-scaled at a fixed per-GPU batch from 8-128 GPUs up
    to 128-2,304, the 405B and Grok-1 tables with reduced-layer proxies at their smaller sizes. With the shipped
    knobs (item AH's source-weighted fit, where these 88 runs weigh as about 9) BF16 is within 6.5 % (Nemotron-4 15B
    and Llama 3.1 8B predicted 3-6 % long), FP8 within 16.5 % (GPT-3 FP8 on 1,024 H100 16 % short; at item AG's
    refit, where they weighed 88, BF16 within 5.5 %, FP8 within 12 %, the GPT-3 row 11 % short: H100 FP8 0.55 ->
    0.60 since). Scaling: from the smallest full-model size of a table to its largest, every measured step grows
    (1.2-5.0 % in BF16, 1.6-10.4 % in FP8: Nemotron-4 340B FP8 3.16 -> 3.49 s from 128 to 2,048 GPUs) where
    autoshard predicts every table flat within 0.5 %: its DP traffic hides behind the micro-batches at every size
    and nothing else grows with the GPU count. What costs the large sizes (the slowest of thousands of ranks, FP8's
    per-micro-batch amax reductions over the whole DP x TP group, the network's upper tiers) is not priced."""
    runs = {r["id"]: r for r in RUNS if source_key(r) == "dgxc2411"}
    res = {r.id: r for r in RESULTS if r.id in runs}
    assert len(runs) == 88 and all(not r.get("skip_throughput") and r["cluster"] == "dgx-h100" for r in runs.values())
    assert all(x.metric == "step_time_s" and x.gpu == "H100-SXM5-80GB" for x in res.values())
    tables: dict[str, list[str]] = {}
    for rid in runs:
        tables.setdefault(re.sub(r"-\d+gpu$", "", rid), []).append(rid)
    assert len(tables) == 14 and sum(len(v) for v in tables.values()) == 88
    bf16 = [abs(x.error) for x in res.values() if runs[x.id]["precision"] == "bf16"]
    fp8 = [abs(x.error) for x in res.values() if runs[x.id]["precision"] == "fp8"]
    assert len(bf16) == len(fp8) == 44 and max(bf16) < 0.065 and max(fp8) < 0.165
    assert 0.155 < abs(res["dgxc2411-h100-fp8-gpt3-175b-1024gpu"].error) < 0.165
    growth = {}
    for key, ids in tables.items():
        full = sorted((i for i in ids if "layers" not in runs[i].get("model_overrides", {})),
                      key=lambda i: runs[i]["parallel"]["dp"])
        per_rank = {runs[i]["global_batch_size"] / (runs[i]["parallel"]["dp"] * runs[i]["micro_batch_size"])
                    for i in full}
        assert len(full) >= 3 and len(per_rank) == 1, key  # weak scaling: the micro-batches per rank fixed
        first, last = res[full[0]], res[full[-1]]
        assert abs(last.predicted / first.predicted - 1) < 0.005, key  # predicted flat
        growth[key] = last.measured / first.measured - 1
    assert min(growth.values()) > 0.01
    assert round(max(g for k, g in growth.items() if "-bf16-" in k), 3) == 0.050  # Nemotron-4 340B BF16
    assert round(growth["dgxc2411-h100-fp8-nemotron4-340b"], 3) == 0.104
    assert round(growth["dgxc2411-h100-fp8-llama31-405b"], 3) == 0.099


def test_mlperf_hopper_runs():
    """MLPerf Training FP8 pretraining on H100/H200 whose plan the submission's config files give: GPT-3 175B
    (v3.1 NVIDIA Eos at 768 / 4,096 / 10,752 H100, NeMo r1.20; v4.1 Eos at 256 / 512 and Oracle at 1,536 / 3,072,
    NeMo 24.09 code), Llama 3.1 405B (v5.0 Eos at 512 / 2,048 / 8,192 H100, Nebius at 512 / 1,024 H200, NeMo
    25.01) and Llama 3.1 8B (v5.1 Cisco at 64 / 128 H100, HPE at 64 H200; v6.0 Cisco at 16 H200). 15 held; with the
    shipped knobs (item AH's source-weighted fit: H100 FP8 0.55 -> 0.60, NVLink 0.9 -> 0.7) the 405B steps are within
    6 % (9 % at item AG, 8 % before) and the worst held run is v5.1 Cisco's 8B on 64 H100, predicted 15 % short; v4.1's
    GPT-3 on 256 H100 is 12 % long (19 % at item AG, where the H100 FP8 level, `train_gemm_fp8` 0.60 -> 0.55, followed
    NeMo's own FP8 recipes of DGX Cloud Benchmarking, 88 runs that ran the same GPT-3 29 % slower per sequence than
    MLPerf's tuned code; 12 % before item AG). The v3.1 GPT-3 rows (one code, GA 128 -> 16 -> 8) go from +1.3 % to
    -3.5 % to -7.3 % (+7.0 / +1.6 / -2.7 % at item AG, +1.0 / -3.7 / -7.5 % before): each GA step's cost is predicted
    2 % long (84.5 ms measured, 86.3 ms predicted; 91.2 ms at item AG, 86.0 ms before) and
    the measured steps carry a fixed ~0.25 s per step, predicted 0.17 s (bubble, exposed
    DP traffic, optimizer, and since item R the FP8 weight cast, P = 8 times through the fill: 0.09 s before it,
    when the 10,752-GPU step was 17 % short). Cisco's 128-GPU TP 2 step is shown, not held: predicted 33 %
    short, the missing fixed cost at one micro-batch per step."""
    by_id = {r["id"]: r for r in RUNS}
    res = {r.id: r for r in RESULTS if r.id.startswith("mlperf") and r.gpu in HOPPER}
    assert set(res) == set(MLPERF_HOPPER)
    for rid, (tp, pp, dp, cp, vpp, mbs, gbs, step) in MLPERF_HOPPER.items():
        run, p = by_id[rid], by_id[rid]["parallel"]
        assert (p["tp"], p["pp"], p["dp"], p["cp"], p["vpp"]) == (tp, pp, dp, cp, vpp), rid
        assert run["micro_batch_size"] == mbs and run["global_batch_size"] == gbs and gbs % (dp * mbs) == 0, rid
        assert run["precision"] == "fp8" and run["recompute"] == "none" and run["zero_stage"] == 1, rid
        assert res[rid].metric == "step_time_s" and res[rid].measured == step, rid
        assert ("gpt3" in rid) == (run["seq_len"] == 2048) and run.get("pipeline_layout") == (
            "Et|(tt|)*62tL" if "405b" in rid else None), rid
    held = {i: r.error for i, r in res.items() if not r.skip_throughput}
    assert set(res) - set(held) == {"mlperf51-cisco-h100-llama31-8b-128gpu-tp2"}
    assert sum(res[i].gpu == "H200-SXM-141GB" for i in held) == 4
    assert all(abs(e) <= 0.20 for e in held.values())
    assert all(abs(e) <= 0.06 for i, e in held.items() if "405b" in i)
    assert -0.40 < res["mlperf51-cisco-h100-llama31-8b-128gpu-tp2"].error < -0.28
    # v3.1 GPT-3, one code at GA 128, 16, 8: step = fixed + GA x per-GA cost; the two ends give both
    ga = (128, 16, 8)
    ids = [f"mlperf31-nvidia-h100-gpt3-175b-{n}gpu" for n in (768, 4096, 10752)]
    e = [held[i] for i in ids]
    assert 0.0 < e[0] < 0.03 and e[0] > e[1] > e[2] and -0.09 < e[2] < -0.05
    # (fixed seconds, per-GA seconds): measured, and predicted (the per-GA cost 0.089-0.093 s at item AG)
    for values, fixed, per in (([res[i].measured for i in ids], (0.22, 0.28), (0.083, 0.088)),
                               ([res[i].predicted for i in ids], (0.15, 0.19), (0.084, 0.088))):
        per_ga = (values[0] - values[2]) / (ga[0] - ga[2])
        assert fixed[0] < values[2] - ga[2] * per_ga < fixed[1]
        assert values[1] == pytest.approx(values[2] + (ga[1] - ga[2]) * per_ga, rel=0.01)  # the middle run on the line
        assert per[0] < per_ga < per[1]


def test_mlmrecipe_qwen3_30b_runs():
    """Qwen3-30B-A3B (128 experts, top-8, expert intermediate 768, hidden 2,048) from Megatron-LM's dev-branch MoE
    recipe index (examples/moe_recipes, median logged TFLOP/s/GPU of each linked recipe): TP 1 / PP 1,
    forced-balance HybridEP, EP 8 on 32 H100 (2,048 rows per local expert per micro-batch) and EP 16 on 16 GB200
    (16,384 rows). The four standard recipes are held. The measured FP8 step is no shorter than BF16 (blockwise FP8
    on H100 232.4 against 234.1 TFLOP/s, MXFP8 on GB200 514 against 528). On H100 the host floor under MoE layers
    explains it since item AC: 16 local experts x the fitted 500 us = 8 ms a layer and micro-batch, above the GPU's
    6.7-6.9 ms in either precision, so both steps are the host's and predicted within 2.0 % (slow; 10 and 14.5 %
    fast before). On GB200 (8 local experts, 4 ms, under the GPU's 12-13 ms at 16,384 tokens a micro-batch) nothing
    binds and both stay fast, BF16 11 %, MXFP8 16 % (autoshard prices MXFP8 3 % faster); since item AF's GB200 refit
    (BF16 and FP8 GEMMs both at 0.50 of their peaks, from NeMo 25.04's dense runs) BF16 10 %, MXFP8 21 %, MXFP8
    priced 10 % faster; since item AH's source-weighted fit (GB200 BF16 0.55, GEMM fall-off 256, NVLink 0.7) BF16
    5 %, MXFP8 15 %, MXFP8 priced 8 % faster. The miss does not follow the expert rows (the GB200 rows run 8x the
    H100's), so the small-expert note (notes.SMALL_EXPERT_ROWS) does not cover it. The paged-stash recipe (fused
    CuTe-DSL grouped MLP, padded static expert buffers, full-iteration CUDA graph) is shown, not held: its graph
    takes the host floor away, which does not bind on GB200 either, so it is priced as the partial-graph MXFP8 row,
    which it runs 26 % faster than."""
    rows = {r.id: r for r in RESULTS if r.id.startswith("mlmrecipe-qwen3-30b-")}
    assert len(rows) == 5 and all(r.metric == "step_time_s" for r in rows.values())
    held = {i: r for i, r in rows.items() if not r.skip_throughput}
    assert set(rows) - set(held) == {"mlmrecipe-qwen3-30b-gb200-mxfp8-ep16-paged-stash"}
    assert {r.gpu for r in held.values()} == {"H100-SXM5-80GB", "GB200-186GB"}
    bf16 = {i: r for i, r in held.items() if "-bf16-" in i}
    fp8 = {i: r for i, r in held.items() if "-bf16-" not in i}
    assert len(bf16) == len(fp8) == 2
    h100 = [r for i, r in held.items() if "-h100-" in i]
    gb200 = {i: r for i, r in held.items() if "-gb200-" in i}
    assert all(0.0 < r.error < 0.03 for r in h100)  # host-bound in both precisions
    assert -0.07 < gb200["mlmrecipe-qwen3-30b-gb200-bf16-ep16"].error < -0.03  # predicted fast
    assert -0.17 < gb200["mlmrecipe-qwen3-30b-gb200-mxfp8-ep16-partial-cg"].error < -0.13  # predicted faster still
    for gpu, priced in (("h100", (0.99, 1.01)), ("gb200", (0.88, 0.92))):
        b = next(r for i, r in bf16.items() if f"-{gpu}-" in i)
        f = next(r for i, r in fp8.items() if f"-{gpu}-" in i)
        assert f.measured / b.measured > 1.0  # FP8 ran no faster than BF16 ...
        assert priced[0] < f.predicted / b.predicted < priced[1]  # ... as the host floor prices it on H100
    stash, partial = rows["mlmrecipe-qwen3-30b-gb200-mxfp8-ep16-paged-stash"], held["mlmrecipe-qwen3-30b-gb200-mxfp8-ep16-partial-cg"]
    assert stash.predicted == pytest.approx(partial.predicted, rel=1e-9)  # no knob tells them apart
    assert partial.measured / stash.measured == pytest.approx(646.8 / 514, rel=1e-6)
    assert abs(stash.error) < 0.075  # 7 % slow since item AH (within 1 % at item AG, 6 % slow since item AB, 3 % since
    # item T's GB200 refit, 5 % fast before item Q)


def test_mlperf_nvfp4_runs():
    """MLPerf Training v5.1 and v6.0 NVFP4 (precision fp4: Transformer Engine NVFP4BlockScaling, FP4=True,
    FP4_RECIPE=nvfp4) Llama 3.1 runs whose plan is published, read from training_runs.yaml directly. NVIDIA's
    405B at 512 GB200 (TP 4), 512 GB300 (TP 2), 2,560 and 5,120 GB200 in v5.1 and at 512 / 2,048 GB300 (TP 2)
    in v6.0 (PP 8 x VPP 8, CP 2, full-iteration CUDA graph, BF16 attention, the vanilla recipe: no RHT, no
    stochastic rounding, 1D weight scaling; v6.0's common files are not in the stored copy, so its recipe is
    v5.1's). Every 8B fp4 submission (NVIDIA GB200/GB300 at 8 GPUs; Oracle, Dell, Supermicro, Nebius on
    B200; Lenovo, Nebius on B300) sources config_common_fp8attn.sh: FP8 attention under current scaling,
    priced from cuDNN's measured kernels (fp8_attention true). All sixteen are held. No run keeps decoder
    layers in BF16 (fp4_bf16_layers [0, 0]); none gathers parameters in FP4."""
    text = (Path(__file__).resolve().parent / "training_runs.yaml").read_text(encoding="utf-8")
    runs = yaml.safe_load(text)
    every = {r["id"]: r for r in runs if r["precision"] == "fp4"}
    # id -> cluster, (tp, pp, vpp, cp, dp), micro-batch, global batch, measured step (s)
    plans = {
        "mlperf51-nvidia-gb200-llama31-405b-512gpu-fp4": ("gb200-nvl72", (4, 8, 8, 2, 8), 1, 1152, 17.34),
        "mlperf51-nvidia-gb300-llama31-405b-512gpu-fp4": ("gb300-nvl72", (2, 8, 8, 2, 16), 1, 1152, 13.17),
        "mlperf51-nvidia-gb200-llama31-405b-2560gpu-fp4": ("gb200-nvl72", (4, 8, 8, 2, 40), 1, 960, 3.314),
        "mlperf51-nvidia-gb200-llama31-405b-5120gpu-fp4": ("gb200-nvl72", (4, 8, 8, 2, 80), 1, 1280, 2.450),
        "mlperf51-nvidia-gb200-llama31-8b-8gpu-fp4": ("gb200-nvl72", (1, 1, 1, 1, 8), 2, 16, 0.4060),
        "mlperf51-nvidia-gb300-llama31-8b-8gpu-fp4": ("gb300-nvl72", (1, 1, 1, 1, 8), 2, 16, 0.3469),
        "mlperf51-oracle-b200-llama31-8b-8gpu-fp4": ("dgx-b200", (1, 1, 1, 1, 8), 2, 16, 0.4535),
        "mlperf51-dell-b200-llama31-8b-8gpu-fp4": ("dgx-b200", (1, 1, 1, 1, 8), 2, 16, 0.4511),
        "mlperf51-supermicro-b200-llama31-8b-8gpu-fp4": ("dgx-b200", (1, 1, 1, 1, 8), 2, 16, 0.4501),
        "mlperf51-lenovo-b300-llama31-8b-8gpu-fp4": ("dgx-b300", (1, 1, 1, 1, 8), 2, 16, 0.4068),
        "mlperf51-nebius-b200-llama31-8b-8gpu-fp4": ("dgx-b200", (1, 1, 1, 1, 8), 2, 16, 0.4567),
        "mlperf51-nebius-b200-llama31-8b-16gpu-fp4": ("dgx-b200", (1, 1, 1, 1, 16), 1, 32, 0.4972),
        "mlperf51-nebius-b200-llama31-8b-32gpu-fp4": ("dgx-b200", (1, 1, 1, 1, 32), 1, 32, 0.2695),
        "mlperf51-nebius-b300-llama31-8b-8gpu-fp4": ("dgx-b300", (1, 1, 1, 1, 8), 2, 16, 0.3950),
        "mlperf60-nvidia-gb300-llama31-405b-512gpu-fp4": ("gb300-nvl72", (2, 8, 8, 2, 16), 1, 896, 9.593),
        "mlperf60-nvidia-gb300-llama31-405b-2048gpu-fp4": ("gb300-nvl72", (2, 8, 8, 2, 64), 1, 1024, 3.095),
    }
    # item Y's 33 NVFP4 rows of MLPerf v6.0's other submitters (and NVIDIA's 8B), from the stored mirror: held
    assert len(every) == 16 + 33 and plans.keys() <= every.keys()
    for i in every.keys() - plans.keys():
        r = every[i]
        assert i.startswith("mlperf60-") and "Richardyu114/training_results_v6.0" in r["source"], i
        assert r["fp4_bf16_layers"] == [0, 0] and r["measured"]["metric"] == "step_time_s", i
        assert not r.get("skip_throughput") and r["model_file"] in ("llama-3.1-8b", "llama-3.1-405b"), i
    rows = {i: every[i] for i in plans}
    assert all(source_key(r) == i.split("-")[0] in ("mlperf51", "mlperf60") for i, r in rows.items())
    for i, (cluster, dims, mbs, gbs, step) in plans.items():
        r, p = rows[i], rows[i]["parallel"]
        assert (r["cluster"], (p["tp"], p["pp"], p["vpp"], p["cp"], p["dp"])) == (cluster, dims), i
        assert (r["micro_batch_size"], r["global_batch_size"], r["seq_len"]) == (mbs, gbs, 8192), i
        assert r["measured"] == {"metric": "step_time_s", "value": step}, i
        assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == int(i.split("-")[-2].removesuffix("gpu")), i
        assert gbs % (p["dp"] * mbs) == 0, i
        assert "fp8_recipe" not in r and r["fp4_bf16_layers"] == [0, 0] and r["recompute"] == "none", i
        assert not r["fp8_param_gather"] and not r["tp_comm_overlap"] and not r["grad_reduce_fp32"], i
        assert "NVTE_NVFP4_DISABLE_RHT=1" in r["assumed"], i
    big = {i for i in rows if "-405b-" in i}
    assert not any(r.get("skip_throughput") for r in rows.values())
    assert {i for i, r in rows.items() if r.get("fp8_attention")} == rows.keys() - big
    for i in big:
        r = rows[i]
        assert (r["model_file"], r["pipeline_layout"], r["sequence_parallel"], r["cross_entropy"]) == (
            "llama-3.1-405b", "Et|(tt|)*62tL", True, "native")
        assert "BF16 attention" in r["assumed"] and "full-iteration CUDA graph" in r["framework_features"]
    for i in rows.keys() - big:
        r = rows[i]
        assert (r["model_file"], r["sequence_parallel"], r["cross_entropy"]) == ("llama-3.1-8b", False, "te")
        assert "FP8 attention (FP8_DPA)" in r["framework_features"]
        assert 'NVTE_DPA_FP8_RECIPE="Float8CurrentScaling"' in r["assumed"], i
    # the vanilla NVFP4 recipe (RHT, stochastic rounding, 2D quantization all off): the 405B configs, and
    # Nebius's B300 config, which sources config_common_fp4.sh after config_common_8b.sh; the other 8B
    # configs turn stochastic rounding and 2D quantization on
    vanilla = {i for i, r in rows.items() if "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING=1" in r["assumed"]}
    assert vanilla == big | {"mlperf51-nebius-b300-llama31-8b-8gpu-fp4"}
    sr_2d = rows.keys() - vanilla
    assert all("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING=0" in rows[i]["assumed"] for i in sr_2d)
    # full-iteration CUDA graphs on the 405B runs and, by their config dumps, Nebius's 16/32-GPU B200 and
    # B300 runs; the other 8B configs set FULL_CUDA_GRAPH=0 (per-layer graphs, cuda_graph_scope full)
    full_iter = {i for i, r in rows.items() if "full-iteration CUDA graph" in r["framework_features"]}
    nebius = "mlperf51-nebius-b200-llama31-8b-16gpu-fp4", "mlperf51-nebius-b200-llama31-8b-32gpu-fp4"
    assert full_iter == big | set(nebius) | {"mlperf51-nebius-b300-llama31-8b-8gpu-fp4"}


def test_nvfp4_runs_are_predicted_within_20_percent():
    """The 49 NVFP4 runs, all held, priced at the FP8 kernels' fraction of the FP4 peak with no FP4 knob
    of their own (costmodel.fp8.gemm_peak). Out of source (residuals_train.json) the eight 405B steps within
    15 % (v5.1: GB200 +14.1 / +5.5 / -1.7 %, GB300 -3.9 %; v6.0: GB300 +6.4 / +1.8 %, Azure's 8,192 GB200 +3.0 %,
    CoreWeave's 4,096 GB300 -0.3 %), median 3.5 % (3.7 % before item AB, 4.2 % before item AA, 8.0 % over the six
    before item Y's runs); the 8B runs, whose attention ran in FP8 (fp8_attention: cuDNN's measured kernel
    savings), v5.1's -6.5 to +9.5 % (-8.0 to +7.5 % before item AB's refit, +0.4 to +14.8 % before item Y's runs
    taught the B200/B300/GB300 fits their NVFP4 level) and v6.0's -10.9 to +8.8 % (-13.4 to +16.7 % before item
    AB: the fold that leaves v6.0 out set B200 from its MoE recipe rows, whose DeepSeek-V3 dispatch item AB fixed;
    the 64-72-GPU GB300 runs at one micro-batch per step about 10 % short since item Z took them at their logs'
    pace: the fixed per-step cost). With the shipped knobs, which learned from them, every one within 15 %
    (GB200's 405B at 512 GPUs +13.6 %). Item AF's refit (GB200's GEMM levels from NeMo 25.04's dense runs, 0.50 of
    both peaks) widens the out-of-source figures: GB200's 405B at 512 GPUs +19.5 % (at 2,560 +10.3 %), v5.1's 8B
    -8.5 to +6.5 %, v6.0's -12.8 to +12.3 %; in sample every one still within 14 %. Item AH's source-weighted fit
    (GB200 BF16 0.55, fall-off 256, NVLink 0.7; MLPerf v5.1's 25 runs weigh as 5) keeps the out-of-source figures
    (405B median 4.1 %, v5.1's 8B -8.5 to +6.5 %, v6.0's -11.7 to +5.9 %) and the in-sample ones within 15 % but
    GB200's 405B at 512 GPUs, +19.5 % in sample too (+14.0 % at item AG; at 2,560 +10.3 %)."""
    loso = {row["id"]: row["predicted_loso"] / row["measured"] - 1 for row in json.loads(RESIDUALS.read_text())}
    rows = {r.id: r for r in RESULTS if r.id.endswith("-fp4")}
    assert len(rows) == 49 and not any(r.skip_throughput for r in rows.values())
    assert all(r.metric == "step_time_s" for r in rows.values())
    big = {i for i in rows if "-405b-" in i}
    assert len(big) == 8 and all(abs(loso[i]) < 0.20 for i in big) and max(loso[i] for i in big) > 0.18
    assert 0.035 < statistics.median(abs(loso[i]) for i in big) < 0.045
    v51 = [loso[i] for i in rows.keys() - big if i.startswith("mlperf51-")]
    assert len(v51) == 10 and all(-0.09 < e < 0.10 for e in v51)
    v60 = [loso[i] for i in rows.keys() - big if i.startswith("mlperf60-")]
    assert len(v60) == 31 and all(-0.13 < e < 0.13 for e in v60)
    assert all(abs(r.error) < 0.15 for i, r in rows.items() if i != "mlperf51-nvidia-gb200-llama31-405b-512gpu-fp4")
    assert 0.18 < rows["mlperf51-nvidia-gb200-llama31-405b-512gpu-fp4"].error < 0.20


def test_megatron_causal_tflops_convert_by_megatrons_own_formula():
    """The Qwen3-30B-A3B BF16 recipe row (234.1 TFLOP/s per GPU on 32 H100, GBS 256 x 4,096 tokens) becomes
    the step time Megatron-Core's num_floating_point_operations (e5ad09802d, megatron/training/training.py)
    implies, written out here term by term: per token 3 x 2 x (QKV + output projections + 8 routed SwiGLU
    experts + logits) per layer, plus the causal attention core 3 x 2 x q per token x sequence length; no
    router GEMM (2 x 2,048 x 128 per token and layer forward: 0.3 % of the total)."""
    run = next(r for r in RUNS if r["id"] == "mlmrecipe-qwen3-30b-h100-bf16-ep8")
    h, layers, q, kv, ffn, topk, vocab, s, gbs = 2048, 48, 32 * 128, 4 * 128, 768, 8, 151936, 4096, 256
    tokens = s * gbs
    per_token = 3 * 2 * (layers * (h * (q + 2 * kv) + q * h + h * ffn * topk * 3) + h * vocab)
    core = s * s * gbs * 3 * 2 * q * layers
    megatron = tokens * per_token + core
    assert predict_run(run).measured == pytest.approx(megatron / (234.1e12 * 32), rel=1e-9)
