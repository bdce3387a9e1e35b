"""`evaluate` and `solve` accept the runs people have: expert-TP apart from TP, Megatron-FSDP with EP,
EP with CP, GB200 racks partly filled, pinned layouts, and the overlap / optimizer knobs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autoshard.cli import app

FAST = ["--workers", "1", "--time-limit", "10"]


def run(*args: str):
    res = CliRunner().invoke(app, list(args))
    obj = None
    if "--json" in args and res.stdout.strip():
        obj = json.loads(res.stdout)
    return res.exit_code, obj, res.stderr


QWEN_256 = ["evaluate", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--seq-len", "4096",
            "--global-batch-size", "2048", "--json"]


def test_expert_grid_that_does_not_divide_suggests_etp_1() -> None:
    """TP 2 x PP 8 x EP 32 on 256 GPUs: ETP defaults to TP, and ETP 2 x EP 32 = 64 does not divide
    TP x DP = 32; Megatron-Core's --expert-tensor-parallel-size 1 makes it legal."""
    code, _, err = run(*QWEN_256, "--tp", "2", "--pp", "8", "--vpp", "4", "--ep", "32")
    assert code == 2 and "--etp 1 makes it legal" in err
    code, plan, _ = run(*QWEN_256, "--tp", "2", "--pp", "8", "--vpp", "4", "--ep", "32", "--etp", "1")
    assert code in (0, 1) and (plan["plan"]["ep"], plan["plan"]["etp"]) == (32, 1)


def test_solve_pins_get_the_same_hint() -> None:
    code, _, err = run("solve", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--tp", "2", "--pp", "8", "--ep", "32",
                       *FAST)
    assert code == 2 and "--etp 1" in err


def test_megatron_fsdp_with_expert_parallelism() -> None:
    code, plan, _ = run(*QWEN_256, "--tp", "2", "--pp", "1", "--ep", "8", "--etp", "1", "--zero-stage", "3",
                        "--recompute", "full", "--mbs", "4")
    assert code in (0, 1)
    assert (plan["plan"]["zero_stage"], plan["plan"]["ep"]) == (3, 8)
    assert "--use-megatron-fsdp" in plan["launch"]["megatron"]
    # weights sharded over the data-parallel ranks: far less than the 470 GB of BF16 weights / TP 2
    assert plan["predicted"]["memory_gib"]["breakdown"]["weights"] < 10


def test_expert_parallelism_with_context_parallelism() -> None:
    code, plan, _ = run("evaluate", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--seq-len", "32768",
                        "--global-batch-size", "256", "--tp", "4", "--pp", "8", "--vpp", "4", "--cp", "2", "--ep", "8",
                        "--recompute-modules", "layernorm,moe", "--json")
    assert code in (0, 1)
    assert (plan["plan"]["cp"], plan["plan"]["ep"], plan["plan"]["etp"]) == (2, 8, 4)


def test_gb200_racks_partly_filled() -> None:
    """256 GPUs = 64 trays: three full NVL72 racks and 40 GPUs of a fourth (refused before)."""
    code, plan, _ = run("evaluate", "llama-3.1-70b", "gb200-nvl72", "--gpus", "256", "--tp", "4", "--pp", "2", "--json")
    assert code in (0, 1) and plan["num_gpus"] == 256


def test_solve_with_a_pinned_layout() -> None:
    code, plan, _ = run("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "32", "--pp", "4", "--tp", "8",
                        "--layout", "Et*9|t*7|t*8|t*8L", "--json", *FAST)
    assert code == 0
    sizes = [len(s["layers"]) for s in plan["plan"]["stages"]]
    assert sizes == [10, 7, 8, 9]
    assert "--pipeline-model-parallel-layout" in plan["launch"]["megatron"]
    code, _, err = run("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "32", "--layout", "Et*16|t*16L", *FAST)
    assert code == 2 and "pin it with --pp" in err


def test_evaluate_with_first_and_last_stage_counts() -> None:
    code, plan, _ = run("evaluate", "llama-3.1-405b", "dgx-h100", "--gpus", "1024", "--tp", "8", "--pp", "16",
                        "--decoder-first-pipeline-num-layers", "7", "--decoder-last-pipeline-num-layers", "7",
                        "--recompute", "full", "--json")
    assert code in (0, 1)
    decoders = [sum(1 for n in s["layers"] if n.startswith("decoder.")) for s in plan["plan"]["stages"]]
    assert decoders == [7] + [8] * 14 + [7]


@pytest.mark.parametrize(("flag", "worse"), [
    ("--no-tp-comm-overlap", "step_time_s"),
    ("--no-overlap-grad-reduce", "step_time_s"),
])
def test_overlap_knobs_change_the_prediction(flag: str, worse: str) -> None:
    base = ["evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "2", "--json"]
    _, on, _ = run(*base)
    _, off, _ = run(*base, flag)
    assert off["predicted"][worse] > on["predicted"][worse]
    assert on["plan"]["tp_comm_overlap"] is True
    if flag == "--no-tp-comm-overlap":
        assert off["plan"]["tp_comm_overlap"] is False and "--tp-comm-overlap" not in off["launch"]["megatron"]
    else:
        assert off["plan"]["overlap_grad_reduce"] is False and "--overlap-grad-reduce" not in off["launch"]["megatron"]


def test_distributed_optimizer_knob() -> None:
    base = ["evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "2", "--json"]
    _, on, _ = run(*base, "--distributed-optimizer")
    _, off, _ = run(*base, "--no-distributed-optimizer")
    assert (on["plan"]["zero_stage"], off["plan"]["zero_stage"]) == (1, 0)
    # FP32 master weights and Adam moments (12 B/param) sharded over DP 4 vs replicated
    ratio = off["predicted"]["memory_gib"]["breakdown"]["optimizer"] / on["predicted"]["memory_gib"]["breakdown"]["optimizer"]
    assert ratio == pytest.approx(4, rel=1e-6)
    code, _, err = run(*base, "--no-distributed-optimizer", "--zero-stage", "1")
    assert code == 2 and "contradicts" in err



def test_from_megatron_takes_the_vocabulary_of_the_bundled_model_it_matches() -> None:
    """A HuggingFace-tokenizer command leaves the vocabulary to the tokenizer files; without the model,
    Llama 3.1 8B's architecture picks the bundled model's 128,256 tokens (not the 32,000 fallback), with
    the same prediction as when the model is named, and says where the number came from."""
    import pathlib

    launch = str(pathlib.Path(__file__).parents[1] / "emit" / "golden" / "llama-3.1-8b_dgx-h100_tp2-dp4.command.sh")
    code, alone, err = run("evaluate", "dgx-h100", "--from-megatron", launch, "--json")
    assert code == 0 and any("128,256 from bundled model llama-3.1-8b" in w for w in alone["warnings"])
    assert not any("assumed 32000" in w for w in alone["warnings"])
    code, named, _ = run("evaluate", "llama-3.1-8b", "dgx-h100", "--from-megatron", launch, "--json")
    assert code == 0 and named["predicted"]["step_time_s"] == pytest.approx(alone["predicted"]["step_time_s"])
    assert named["predicted"]["memory_gib"] == alone["predicted"]["memory_gib"]
    # The 32,000 fallback would have predicted a different (smaller) output layer.
    fallback = pathlib.Path(launch).read_text().replace("--tokenizer-type HuggingFaceTokenizer",
                                                        "--tokenizer-type NullTokenizer --vocab-size 32000")
    code, small, _ = run("evaluate", "dgx-h100", "--from-megatron", fallback, "--json")
    assert code == 0 and small["predicted"]["step_time_s"] < 0.97 * alone["predicted"]["step_time_s"]
    # An architecture no bundled model has keeps the fallback and its warning.
    odd = pathlib.Path(launch).read_text().replace("--num-layers 32", "--num-layers 30")
    code, plan, _ = run("evaluate", "dgx-h100", "--from-megatron", odd, "--json")
    assert code == 0 and any("assumed 32000" in w for w in plan["warnings"])


def test_from_megatron_does_not_pick_between_bundled_models_of_different_vocabularies() -> None:
    """Llama 2 70B (32,000 tokens) and Llama 3.1 70B (128,256) share every other shape: a 70B command with
    a HuggingFace tokenizer is either, so neither vocabulary is taken (Llama 3.1's was, for a Llama 2
    command too); the fallback stays and the warning names both models."""
    import pathlib

    launch = str(pathlib.Path(__file__).parents[1] / "emit" / "golden" /
                 "llama-3.1-70b_dgx-h100_tp8-pp4-vpp2-uneven.command.sh")
    code, plan, _ = run("evaluate", "dgx-h100", "--from-megatron", launch, "--json")
    assert code == 0
    assert not any("from bundled model" in w for w in plan["warnings"])
    assert any("assumed 32000" in w for w in plan["warnings"])
    assert any("llama-2-70b (32,000), llama-3.1-70b (128,256)" in w for w in plan["warnings"])


def test_from_megatron_terminal_report_names_the_model_and_shows_the_band() -> None:
    """`evaluate MODEL CLUSTER --from-megatron`: the report is titled with the given model (not the
    parser's placeholder name) and its headline carries the prediction band, as every other report does;
    the JSON band is the same range."""
    import pathlib
    import re

    launch = str(pathlib.Path(__file__).parents[1] / "emit" / "golden" / "llama-3.1-8b_dgx-h100_tp2-dp4.command.sh")
    res = CliRunner().invoke(app, ["evaluate", "llama-3.1-8b", "dgx-h100", "--from-megatron", launch],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    assert "llama-3.1-8b on 8 x H100" in text and "from-megatron on" not in text
    # the panel may wrap the headline at any width (a worker without a terminal): read it unwrapped
    flat = " ".join(text.replace("│", " ").split())
    m = re.search(r"likely ([0-9,]+)-([0-9,]+) tokens/s per GPU", flat)
    assert m, text
    code, plan, _ = run("evaluate", "llama-3.1-8b", "dgx-h100", "--from-megatron", launch, "--json")
    band = plan["predicted"]["band"]["tokens_per_s"]
    assert code == 0 and plan["model"] == "llama-3.1-8b"
    per_gpu = plan["predicted"]["tokens_per_s_per_gpu"]
    lo, hi = (int(x.replace(",", "")) for x in m.groups())
    assert lo < per_gpu < hi
    assert (lo, hi) == (pytest.approx(band[0] / 8, rel=0.005), pytest.approx(band[1] / 8, rel=0.005))  # 3 digits


def test_evaluate_json_carries_what_stderr_says() -> None:
    """`evaluate --json` printed the layout note and the "does not fit:" lines on stderr only: the JSON
    of a plan predicted not to fit (exit 1) had no message, and the layout Megatron-LM needs was not in
    its warnings."""
    no_fit = ("evaluate", "llama-2-7b", "dgx-h200", "--gpus", "1", "--tp", "1", "--pp", "1", "--mbs", "2",
              "--seq-len", "4096", "--global-batch-size", "16", "--recompute", "selective")
    code, obj, stderr = run(*no_fit, "--json")
    assert code == 1
    assert obj["status"] == "infeasible" and obj["predicted"]["memory_gib"]["fits"] is False
    assert obj["error"] == "does not fit: pipeline rank 0 needs 152.5 GiB per GPU, has 140.4 GiB (over by 12.1 GiB); " \
                           "try --recompute full or more GPUs (--gpus)"
    assert obj["error"] in " ".join(stderr.split())
    code, obj, _ = run("evaluate", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--tp", "2", "--ep", "32", "--pp",
                       "4", "--json")
    assert code == 0
    assert "error" not in obj
    assert any(w.startswith("94 decoder layers do not split evenly over PP 4 x VPP 1") and
               "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in w
               for w in obj["warnings"])


NVFP4_8B = ["evaluate", "llama-3.1-8b", "dgx-b200", "--gpus", "8", "--precision", "fp4", "--tp", "1", "--pp", "1",
            "--mbs", "2", "--global-batch-size", "16"]


def test_fp8_attention_is_evaluated_and_launches_nothing() -> None:
    """`--fp8-attention` (MLPerf's NVFP4 8B runs, through NeMo): the step is shorter than with BF16 attention,
    the JSON says so and carries no Megatron-LM command; the terminal says why; the memory table (which
    re-prices the weights in BF16) still renders."""
    code, bf16, _ = run(*NVFP4_8B, "--json")
    code8, fp8, _ = run(*NVFP4_8B, "--json", "--fp8-attention")
    assert code == code8 == 0
    assert fp8["plan"]["fp8_attention"] is True and bf16["plan"]["fp8_attention"] is False
    assert fp8["predicted"]["step_time_s"] < bf16["predicted"]["step_time_s"]
    assert "megatron" in bf16["launch"] and "megatron" not in fp8.get("launch", {})
    res = CliRunner().invoke(app, [*NVFP4_8B, "--fp8-attention"])
    assert res.exit_code == 0 and "no Megatron-LM launch: it has no flag for FP8 attention" in res.stdout
    assert "Megatron-LM launch (fill" not in res.stdout and "Traceback" not in res.output


@pytest.mark.parametrize("args, message", [
    (["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--precision", "fp8", "--tp", "1", "--pp", "1",
      "--fp8-attention"], "not H100-SXM5-80GB: keep attention in BF16"),
    (["evaluate", "llama-3.1-8b", "dgx-b200", "--gpus", "8", "--tp", "1", "--pp", "1", "--fp8-attention"],
     "runs inside an FP8 or FP4 recipe"),
    (["evaluate", "llama-3.1-8b", "dgx-b200", "--gpus", "8", "--precision", "fp8", "--fp8-attention"],
     "--fp8-attention describes a given plan"),
    (["evaluate", "dgx-b200", "--gpus", "8", "--from-megatron", "torchrun pretrain_gpt.py --tensor-model-parallel-size 1",
      "--fp8-attention"], "--fp8-attention would be ignored"),
])
def test_fp8_attention_it_cannot_price_is_refused(args: list[str], message: str) -> None:
    code, _, err = run(*args)
    assert code == 2 and message in err and "Traceback" not in err
