"""--moe-a2a-overlap end to end: evaluate prices it and says so, solve plans with it and launches it as
Megatron-MoE-ModelZoo's A2A_OVERLAP=1 does, a Megatron command that runs it is read back, and every plan
Megatron would refuse it for is refused with the fix."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.emit.megatron.parse import parse_megatron

FAST = ["--workers", "1", "--time-limit", "20"]
QWEN = ["evaluate", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--seq-len", "4096", "--global-batch-size", "2048",
        "--tp", "2", "--pp", "8", "--vpp", "4", "--ep", "32", "--etp", "1", "--moe-dispatcher", "flex"]


def run(*args: str):
    res = CliRunner().invoke(app, list(args))
    obj = json.loads(res.stdout) if "--json" in args and res.exit_code in (0, 1) and res.stdout.strip() else None
    return res.exit_code, obj, res.stdout, res.stderr


def test_evaluate_prices_the_overlap_and_launches_it() -> None:
    """The ModelZoo plan of Qwen3-235B on 256 H100 (the measured pair: 19.7 s without, 17.6 s with): the
    overlap shortens the predicted step by the EP traffic it hides, the JSON carries the knob and the hidden
    seconds, and the launch sets both flags and A2A_OVERLAP=1's environment."""
    code, off, _, _ = run(*QWEN, "--json")
    code_on, on, _, _ = run(*QWEN, "--moe-a2a-overlap", "--json")
    assert (code, code_on) == (0, 0)
    assert on["plan"]["moe_a2a_overlap"] is True and off["plan"]["moe_a2a_overlap"] is False
    t_on, t_off = on["predicted"]["time_breakdown_s"], off["predicted"]["time_breakdown_s"]
    saved = off["predicted"]["step_time_s"] - on["predicted"]["step_time_s"]
    assert saved == pytest.approx(t_on["ep_comm_hidden"], rel=1e-6)
    assert t_off["ep_comm_hidden"] == 0.0 and 0 < t_on["ep_comm"] < t_off["ep_comm"]
    launch = on["launch"]["megatron"]
    assert "--overlap-moe-expert-parallel-comm" in launch and "--delay-wgrad-compute" in launch
    assert launch.startswith("CUDA_DEVICE_MAX_CONNECTIONS=32 NVTE_FWD_LAYERNORM_SM_MARGIN=24 "
                             "NVTE_BWD_LAYERNORM_SM_MARGIN=24 torchrun")
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in launch  # TP 2 on Hopper: Megatron only warns in this mode
    assert any("EP all-to-all overlap" in n for n in on["predicted"]["notes"])


def test_terminal_shows_the_hidden_traffic() -> None:
    code, _, stdout, _ = run(*QWEN, "--moe-a2a-overlap")
    assert code == 0
    assert "hidden by the A2A overlap" in stdout and "EP all-to-all overlap" in stdout


def test_megatron_command_round_trips() -> None:
    """The launch autoshard writes reads back as the same plan with the overlap on."""
    _, on, _, _ = run(*QWEN, "--moe-a2a-overlap", "--json")
    parsed = parse_megatron(on["launch"]["megatron"])
    assert parsed.moe_a2a_overlap
    assert not [w for w in parsed.warnings if "delay-wgrad" in w]
    code, back, _, _ = run("evaluate", "dgx-h100", "--from-megatron", on["launch"]["megatron"], "--json")
    assert code == 0 and back["plan"]["moe_a2a_overlap"] is True
    assert back["predicted"]["step_time_s"] == pytest.approx(on["predicted"]["step_time_s"], rel=1e-9)
    assert back["predicted"]["time_breakdown_s"]["ep_comm_hidden"] == pytest.approx(
        on["predicted"]["time_breakdown_s"]["ep_comm_hidden"], rel=1e-9)


def test_delay_wgrad_without_the_overlap_is_refused() -> None:
    cmd = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
           "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --delay-wgrad-compute")
    code, _, _, err = run("evaluate", "dgx-h100", "--from-megatron", cmd)
    assert code == 2 and "--delay-wgrad-compute: it needs --overlap-moe-expert-parallel-comm" in err


@pytest.mark.parametrize("edit, fragment", [
    (lambda c: c.rstrip() + " --moe-shared-expert-overlap", "--moe-shared-expert-overlap"),
    (lambda c: c.replace("--bf16", ""), "--bf16 or --fp16"),
    (lambda c: c.rstrip() + " --recompute-granularity selective --recompute-method uniform", "--recompute-method"),
])
def test_from_megatron_refuses_what_megatron_asserts(edit, fragment) -> None:
    _, on, _, _ = run(*QWEN, "--moe-a2a-overlap", "--json")
    code, _, _, err = run("evaluate", "dgx-h100", "--from-megatron", edit(on["launch"]["megatron"]))
    assert code == 2 and "--overlap-moe-expert-parallel-comm" in err and fragment in err


def test_overlap_without_delayed_wgrad_is_priced_so() -> None:
    """A command with the overlap but no --delay-wgrad-compute runs the expert wgrad inside the backward, so the
    dispatch backward waits for it: read back with moe_a2a_delay_wgrad off, it hides no more (this plan's
    layers are compute-bound, so the same: the closed form where it differs is in
    tests/costmodel/test_a2a_overlap.py), and its plan launches the overlap flag alone."""
    _, on, _, _ = run(*QWEN, "--moe-a2a-overlap", "--json")
    cmd = on["launch"]["megatron"].replace("--delay-wgrad-compute", "")
    parsed = parse_megatron(cmd)
    assert parsed.moe_a2a_overlap and not parsed.moe_a2a_delay_wgrad
    code, back, _, _ = run("evaluate", "dgx-h100", "--from-megatron", cmd, "--json")
    assert code == 0 and back["plan"]["moe_a2a_overlap"] and not back["plan"]["moe_a2a_delay_wgrad"]
    hidden, hidden_delayed = (p["predicted"]["time_breakdown_s"]["ep_comm_hidden"] for p in (back, on))
    assert 0 < hidden <= hidden_delayed * (1 + 1e-9)
    assert back["predicted"]["step_time_s"] >= on["predicted"]["step_time_s"] * (1 - 1e-9)
    words = shlex.split(back["launch"]["megatron"])
    assert "--overlap-moe-expert-parallel-comm" in words and "--delay-wgrad-compute" not in words


@pytest.mark.parametrize("args, fragment", [
    (["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "1", "--pp", "1", "--moe-a2a-overlap"],
     "no experts"),
    ([*QWEN[:-2], "--moe-dispatcher", "allgather", "--moe-a2a-overlap"], "alltoall or flex"),
    (["evaluate", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--tp", "2", "--pp", "8", "--ep", "32", "--etp", "1",
      "--moe-a2a-overlap"], "VPP > 1"),
    ([*QWEN, "--recompute", "full", "--moe-a2a-overlap"], "no full recompute"),
    ([*QWEN, "--recompute-modules", "moe", "--moe-a2a-overlap"], "moe module"),
    (["solve", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--ep", "1", "--moe-a2a-overlap", *FAST], "--ep 1"),
    (["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--moe-a2a-overlap", *FAST], "dense"),
    (["solve", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--recompute", "full", "--moe-a2a-overlap", *FAST],
     "full recompute"),
    (["solve", "qwen3-235b-a22b", "dgx-h100", "--gpus", "256", "--pp", "8", "--vpp", "1", "--moe-a2a-overlap", *FAST],
     "interleaved schedule"),
])
def test_plans_megatron_refuses_are_refused_with_the_fix(args, fragment) -> None:
    code, _, _, err = run(*args)
    assert code == 2, err
    assert "--moe-a2a-overlap" in err and fragment in err


def test_serving_refuses_the_training_flag() -> None:
    code, _, _, err = run("solve", "qwen3-235b-a22b", "dgx-h100", "--gpus", "8", "--mode", "serve", "--moe-a2a-overlap")
    assert code == 2 and "--moe-a2a-overlap" in err


def test_solve_plans_with_the_overlap_on_every_candidate() -> None:
    """Pinned: the best plan runs it, its dispatcher is alltoall or flex, no layer is block-recomputed, its
    chunks are near-even, it is reported FEASIBLE at its own step above the relaxed bound, and the launch
    carries both flags."""
    code, plan, _, _ = run("solve", "qwen3-30b-a3b", "dgx-h100", "--gpus", "32", "--moe-a2a-overlap", "--json", *FAST)
    assert code == 0
    p = plan["plan"]
    assert p["moe_a2a_overlap"] is True and p["ep"] > 1 and p["moe_dispatcher"] in ("alltoall", "flex")
    assert p["recompute"] != "full" and all(s["full_recompute_layers"] == 0 for s in p["stages"])
    assert p["pp"] == 1 or p["vpp"] > 1
    counts = [sum(name.startswith("decoder") for name in st["layers"]) for st in p["stages"]]
    assert max(counts) - min(counts) <= 2  # near-even chunks, where the relaxed tables stay tight
    assert plan["solver"]["status"] == "FEASIBLE" and plan["solver"]["stop_reason"] in ("relaxed", "time_limit")
    assert plan["solver"]["bound"] <= plan["predicted"]["step_time_s"] == plan["solver"]["objective"]
    words = shlex.split(plan["launch"]["megatron"])
    assert "--overlap-moe-expert-parallel-comm" in words and "--delay-wgrad-compute" in words
