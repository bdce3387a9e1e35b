"""Issue #14: the headline names the peak the MFU is measured against and shows the prediction band
when the plan has one; the solver line never contradicts itself; commands wrap and stay the same."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from autoshard.costmodel.bands import Band
from autoshard.plan import SolverStats
from autoshard.report.fit import shell_words, wrap_command
from autoshard.report.terminal import band_line, headline, solver_text
from report_fixtures import plan_70b, make_plan  # noqa: F401  (pytest fixtures)


def test_mfu_names_the_bf16_dense_peak(plan_70b):
    text = headline(plan_70b).plain
    pred = plan_70b.prediction
    assert f"MFU {100 * pred.mfu:.1f} % of the 989 TFLOP/s BF16 dense peak" in text
    assert pred.tflops_per_gpu / pred.mfu == pytest.approx(989, rel=1e-3)


def test_mfu_names_the_fp8_dense_peak(make_plan):
    plan = make_plan("llama-3.1-8b", "dgx-h100", 8, tp=1, pp=1, micro_batch_size=1, precision="fp8",
                     global_batch_size=64)
    assert "of the 1,979 TFLOP/s FP8 dense peak" in headline(plan).plain


def test_band_rendered_only_when_present(plan_70b):
    bare = dataclasses.replace(plan_70b, band=None)
    assert band_line(bare) == "" and "likely" not in headline(bare).plain
    band = Band(tokens_per_s=(61_234.4, 80_987.6), step_time_s=(50.0, 66.0), memory_gib_peak=(70.0, 80.0),
                basis="H100 dense BF16 training, 12 measured runs", runs=12)
    text = headline(dataclasses.replace(plan_70b, band=band)).plain
    # per GPU, three significant digits: 61,234.4 / 64 = 957, 80,987.6 / 64 = 1,265
    assert "likely 957-1,270 tokens/s per GPU (H100 dense BF16 training, 12 measured runs)" in text


def _stats(status, objective, bound, wall=1.0):
    return SolverStats(status=status, wall_s=wall, objective=objective, bound=bound)


def test_solver_optimal():
    assert solver_text(_stats("OPTIMAL", 2.0, 2.0), time_limit_s=30) == \
        "solver: optimal (proven by CP-SAT), 1.00 s wall of a 30 s limit"


def test_solver_feasible_with_a_closed_bound_is_optimal():
    text = solver_text(_stats("FEASIBLE", 2.0, 2.0, wall=30.1), time_limit_s=30)
    assert text.startswith("solver: optimal (the bound meets the objective)") and "FEASIBLE" not in text


@pytest.mark.parametrize(("bound", "gap"), [(1.99999, "0.0005 %"), (1.9, "5.0 %"), (1.98, "1.0 %")])
def test_solver_feasible_says_why_and_never_gap_zero(bound, gap):
    text = solver_text(_stats("FEASIBLE", 2.0, bound, wall=29.9), time_limit_s=30)
    assert "not proven optimal" in text and f"gap {gap}" in text
    assert "time limit hit before the bound closed" in text and "0.00 %" not in text
    assert "29.90 s wall of a 30 s limit" in text


# ----------------------------------------------------------------------------- command wrapping

HOSTILE = [
    "torchrun --nproc-per-node 8 pretrain_gpt.py --data-path '/data/my corpus/with spaces' --lr 3e-4 "
    "--tokenizer-model \"$TOKENIZER_MODEL\" --split 99,1,0 --save \"$CKPT_DIR\" --log-interval 10",
    "vllm serve 'org/model name' --served-model-name \"a \\\"quoted\\\" name\" --max-model-len 8192 "
    "--gpu-memory-utilization 0.90 --kv-cache-dtype auto --tensor-parallel-size 8 --enable-expert-parallel",
    "echo " + "x" * 120 + " --flag value",
]


@pytest.mark.parametrize("cmd", HOSTILE)
@pytest.mark.parametrize("width", [40, 80, 160])
def test_wrapped_command_is_the_same_command(cmd, width):
    wrapped = wrap_command(cmd, width)
    assert shlex.split(wrapped.replace("\\\n", " ")) == shlex.split(cmd)
    for line in wrapped.splitlines():
        words = shell_words(line.rstrip(" \\"))
        assert len(line) <= width or len(words) == 1, line  # only an unbreakable word overflows
    for line in wrapped.splitlines()[:-1]:
        assert line.endswith(" \\")


def test_flag_stays_with_its_value():
    for width in range(4 + len("--max-num-batched-tokens 8192") + 2, 60):  # where the pair fits on a line
        wrapped = wrap_command("vllm serve m --max-num-batched-tokens 8192 --kv-cache-dtype auto", width)
        assert any("--max-num-batched-tokens 8192" in line for line in wrapped.splitlines()), wrapped
        assert any("--kv-cache-dtype auto" in line for line in wrapped.splitlines()), wrapped


def test_a_pair_too_long_for_the_line_splits_at_the_value():
    line = "    --pipeline-model-parallel-layout 'E|(t|)*9,t*19|t*21|t*8|t*7|t*7|t*7|t*2|L' \\"
    wrapped = wrap_command(line, 80)
    assert all(len(x) <= 80 for x in wrapped.splitlines())
    assert wrapped.splitlines()[1].strip() == "'E|(t|)*9,t*19|t*21|t*8|t*7|t*7|t*7|t*2|L' \\"


def test_continuation_lines_and_comments():
    script = "# " + "long comment " * 10 + "\nA=1 cmd --one 1 \\\n    --two 2 --three 3 --four 4 --five 5 --six 6 \\\n    --x"
    wrapped = wrap_command(script, 30)
    assert all(line.startswith("#") for line in wrapped.splitlines()[:5] if "comment" in line)
    body = "\n".join(x for x in wrapped.splitlines() if not x.startswith("#"))
    assert shlex.split(body.replace("\\\n", " ")) == shlex.split("A=1 cmd --one 1 --two 2 --three 3 --four 4 "
                                                                  "--five 5 --six 6 --x")
    assert all(len(x) <= 30 for x in wrapped.splitlines())
