"""A training prediction in the small-expert-GEMM regime says so (costmodel/train/notes.py): the two
held published runs below 2,048 rows per local expert per micro-batch took 40 % (512 rows) and 4 % (1,024 rows)
longer per step than predicted (tests/validation/residuals_train.json; 46 and 21 % before README item Z priced the
unfused loss they ran)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from autoshard.costmodel.flops import expert_rows, layer_gemms
from autoshard.costmodel.train.notes import SMALL_EXPERT_ROWS, small_expert_note
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import ParallelDims
from autoshard.specs import LayerKind, load_model

QWEN3 = load_model("qwen3-235b-a22b")  # 128 experts, top-8
VALIDATION = Path(__file__).resolve().parents[1] / "validation"
QWEN3_30B_GB200 = ("mlmrecipe-qwen3-30b-gb200-mxfp8-ep16-partial-cg", "mlmrecipe-qwen3-30b-gb200-bf16-ep16")
"""Qwen3-30B-A3B's recipes on GB200, priced faster than they ran (37 % MXFP8, 21 % BF16; 41 and 23 % at item AG)
since README item AF set GB200's GEMM levels from NeMo 25.04's dense runs; the MXFP8 run measured no faster than
BF16 (the H100 FP8 run is inside 20 % since README item AA priced its per-expert quantize launches)."""
B200_MIXTRAL = ("nemo2502-b200-fp8-mixtral-8x22b",)
"""NeMo 25.02's Mixtral 8x22B on B200, 26 % fast out of source (token dropping at capacity 1.0, unpriced); its 8x7B
twin, 21 % fast until README item AH's source-weighted fit, is 7 % fast and inside."""
EXCEPTIONS = (*QWEN3_30B_GB200, *B200_MIXTRAL)
"""The held runs at 2,048+ rows the docstring of costmodel/train/notes.py names as outside 20 %."""


def _cfg(tp: int, ep: int, *, mbs: int = 1, seq: int = 4096, cp: int = 1, etp: int = 1) -> TrainConfig:
    dims = ParallelDims(tp=tp, pp=1, dp=ep, cp=cp, ep=ep, etp=etp)
    return TrainConfig(dims=dims, micro_batch_size=mbs, global_batch_size=mbs * ep, seq_len=seq)


@pytest.mark.parametrize(("tp", "ep", "mbs", "seq", "cp", "rows", "local"), [
    (4, 8, 1, 4096, 1, 512, 16),      # ModelZoo intra-node EP 8, TP 4: 4096 / 4 x 8 / 16
    (2, 8, 1, 4096, 1, 1024, 16),     # intra-node EP 8, TP 2 / PP 32
    (2, 32, 1, 4096, 1, 4096, 4),     # cross-node EP 32
    (1, 8, 1, 4096, 1, 2048, 16),     # the GB200 BF16 run
    (1, 16, 1, 4096, 4, 1024, 8),     # CP 4 quarters the tokens of each shard
    (2, 8, 4, 4096, 1, 4096, 16),     # micro-batch 4
])
def test_rows_per_local_expert(tp, ep, mbs, seq, cp, rows, local):
    assert expert_rows(QWEN3, tokens=mbs * seq // cp, dims=_cfg(tp, ep, mbs=mbs, seq=seq, cp=cp).dims) == (rows, local)


def test_the_expert_gemms_run_those_rows():
    dims = _cfg(4, 8).dims
    up, down = layer_gemms(QWEN3, LayerKind.MOE, tokens=4096, dims=dims)[-2:]
    assert (up.m, up.count, down.m, down.count) == (512, 16, 512, 16)


def test_small_expert_gemms_carry_the_note_and_large_ones_do_not():
    note = small_expert_note(QWEN3, _cfg(4, 8))
    assert note is not None and "512 rows per local expert" in note and "16 local experts" in note
    assert small_expert_note(QWEN3, _cfg(1, 8)) is None  # 2,048 rows: measured within -5 %
    assert small_expert_note(QWEN3, _cfg(2, 8, mbs=4)) is None
    assert small_expert_note(load_model("llama-3.1-70b"), _cfg(4, 1)) is None  # dense


def test_the_threshold_splits_the_held_runs_as_the_docstring_says():
    """Every held MoE run below the threshold took longer than predicted (12 % at 512 rows, 8 % at 1,024 since
    item AH's source-weighted fit, 10 % at item AG, 8 % at item AF; 11 and 5 % since item AC's host floor under MoE
    layers, 39 and 3 % before it; both >= 20 % until item Z priced the unfused loss they ran); every one at or above it
    is within 20 % either way, except the runs the docstring names: Qwen3-30B-A3B on GB200 (MXFP8 37 %, BF16 21 % fast)
    and NeMo 25.02's B200 Mixtral 8x22B (26 % fast), errors that do not follow the expert rows. Grok-1 BF16 on 512
    H100 (15 % slow in speed since item AG, 21 % at item AF), Qwen3-235B BF16 on GB200 (11 % slow; 20 % before item
    AF), Qwen3-235B MXFP8 on 64 GB300 with the A2A overlap (19 % fast), DeepSeek-V3 on 256 B200 with DeepEP (8 % slow),
    NeMo 25.02's B200 Mixtral 8x7B (7 % fast; 21 % at item AG) and the Grok-1 GB200 runs (within 5.2 %) are inside."""
    sys.path.insert(0, str(VALIDATION))
    import validate_published

    runs = {r["id"]: r for r in yaml.safe_load((VALIDATION / "training_runs.yaml").read_text())}
    residuals = json.loads((VALIDATION / "residuals_train.json").read_text())
    below, above, exceptions = [], [], {}
    for x in residuals:
        r = runs[x["id"]]
        if not x["held"] or r.get("model_file") not in ("qwen3-235b-a22b", "deepseek-v3", "mixtral-8x7b",
                                                    "mixtral-8x22b", "qwen3-30b-a3b", "grok-1-314b"):
            continue
        if x["gpu"].startswith("MI"):  # CDNA 3: its out-of-source fold borrows H100's fit, so the residual
            continue                   # measures the generation gap, not the expert-GEMM regime
        model = validate_published._model(r)  # bundled or validation-only (NeMo's Grok-1 proxy)
        p = r["parallel"]
        dims = ParallelDims(tp=p["tp"], pp=p["pp"], dp=p["dp"], cp=p.get("cp", 1), ep=p.get("ep", 1),
                            etp=p.get("etp"), vpp=p.get("vpp", 1))
        rows, _ = expert_rows(model, tokens=r["micro_batch_size"] * r["seq_len"] // dims.cp, dims=dims)
        ratio = x["predicted_loso"] / x["measured"]
        speed = 1 / ratio if x["metric"] == "step_time_s" else ratio  # predicted speed / measured speed
        if x["id"] in EXCEPTIONS:
            exceptions[x["id"]] = speed
        else:
            (below if rows < SMALL_EXPERT_ROWS else above).append(speed)
    assert len(below) == 2 and all(s > 1.0 for s in below)
    # the note's "12 % and 8 %" (12 and 10 % at item AG, 12 and 8 % at item AF)
    assert sorted(round(s, 2) for s in below) == [1.08, 1.12]
    assert len(above) >= 10 and all(1 / 1.2 <= s <= 1.2 for s in above)
    assert round(max(above), 2) == 1.19  # the farthest fast inside: Qwen3-235B MXFP8 on 64 GB300 with the overlap
    # the farthest slow inside: Grok-1 BF16 on 512 H100 (NeMo 25.04), an exception at 0.79 until item AG
    assert round(min(above), 2) == 0.85
    # the docstring's exceptions: NeMo 25.02's B200 Mixtral 8x22B 26 % fast, Qwen3-30B-A3B on GB200 BF16 21 % and
    # MXFP8 37 % fast (at item AG the 8x7B too, 21 %; 22, 23 and 41 % the others)
    assert sorted(round(s, 2) for s in exceptions.values()) == [1.21, 1.26, 1.37]


def test_the_terminal_prints_the_prediction_notes() -> None:
    from rich.console import Console

    from autoshard.api import evaluate, train_job
    from autoshard.report.terminal import render_plan
    from autoshard.specs import load_cluster

    cluster = load_cluster("dgx-h100").with_gpus(256)
    plan = evaluate(QWEN3, cluster, train_job(QWEN3, seq_len=4096, global_batch_size=256), tp=4, pp=8, ep=8, etp=1)
    notes = plan.to_json()["predicted"]["notes"]
    # ModelZoo's TP 4 / PP 8 plan: small expert GEMMs, and 16 local experts that the host issues slower than
    # the GPU runs them (README item AC)
    assert len(notes) == 2 and "512 rows per local expert" in notes[0] and notes[1].startswith("host-bound MoE layers")
    console = Console(record=True, width=400)
    render_plan(plan, console)
    text = console.export_text()
    assert all(f"note: {n}" in text for n in notes)


def test_an_odd_gpu_count_that_forces_pp_says_so():
    """Llama-3.1-70B FP8 on the bundled GB200 NVL72 cluster (1,152 GPUs = 128 x 9, global batch 512): data
    parallelism must divide the batch, so PP takes the 9, and with 4 micro-batches per replica no interleaving
    (a multiple of PP micro-batches); the solver's plan, TP4 PP9 CP2 DP16, spends 20 % of its step in the
    bubble, and said nothing (a review helper found it: 2,694 tokens/s per GPU where a batch of 576 gives 3,561).
    The note names the factor and the ways out; a batch of 576 or a power-of-two GPU count has no note."""
    import dataclasses

    from autoshard.costmodel.train.notes import odd_pipeline_note
    from autoshard.costmodel.train.step import predict_train
    from autoshard.emit.megatron.layout import parse_layout
    from autoshard.specs import Precision, load_cluster

    model, cluster = load_model("llama-3.1-70b"), load_cluster("gb200-nvl72")
    cfg = TrainConfig(dims=ParallelDims(tp=4, pp=9, cp=2, dp=16), micro_batch_size=1, global_batch_size=512,
                      seq_len=8192, precision=Precision.FP8)
    stages = tuple(parse_layout("Et*9|(t*9|)*7t*8L", num_layers=80, pp=9)[0])
    pred = predict_train(model, cluster, cfg, stages)
    (note,) = [n for n in pred.notes if "GPUs = 128 x 9" in n]
    assert 0.15 < pred.time.bubble / pred.step_time_s < 0.25
    assert ("1,152 GPUs = 128 x 9: data parallelism must divide the global batch of 512 sequences, so the factor "
            "9 falls to PP 9 without interleaving") in note
    assert "a global batch of 9 x a power of two (e.g. 576) or 1,024 or 2,048 GPUs avoids it" in note
    assert odd_pipeline_note(dataclasses.replace(cfg, global_batch_size=576), 1.0, 4.0) is None
    assert odd_pipeline_note(dataclasses.replace(cfg, dims=ParallelDims(tp=4, pp=8, cp=2, dp=16)),
                             1.0, 4.0) is None  # 1,024 GPUs: no odd factor
    assert odd_pipeline_note(cfg, 0.04, 1.0) is None  # a bubble under 5 % of the step: not worth a note
