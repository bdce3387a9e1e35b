"""Issue #14: `--show-schedule` draws the real schedule, numbered plainly, with the cost model's bubble.

Golden snapshots: the small cases of Narayanan et al. 2021 (Fig. 4: p = 4, m = 8, a backward twice
a forward), 1F1B and interleaved with v = 2, in Megatron-LM's operation order. The snapshots were
checked by hand against the figure's slots; the tests below also check them against closed forms
(the idle time of every rank is (p-1)(f+b)/v), so a snapshot regenerated from a broken renderer
still fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autoshard.report.gantt import draw_schedule
from autoshard.report.terminal import bubble_lines, schedule_chart
from report_fixtures import plan_70b, plan_7b_one_gpu  # noqa: F401  (pytest fixtures)

GOLDEN = Path(__file__).parent / "golden"


def _bodies(rows):
    return [r[r.index("|") + 1:] for r in rows if r]


def test_1f1b_textbook_chart_golden():
    chart = draw_schedule([1.0] * 4, [2.0] * 4, pp=4, vpp=1, m=8, width=80)
    assert "\n".join(chart.rows) + "\n" == (GOLDEN / "1f1b_p4_m8.txt").read_text()
    assert chart.omitted_periods == 0 and chart.labelled


def test_interleaved_textbook_chart_golden():
    chart = draw_schedule([0.5] * 8, [1.0] * 8, pp=4, vpp=2, m=8, width=160)
    assert "\n".join(chart.rows) + "\n" == (GOLDEN / "interleaved_p4_v2_m8.txt").read_text()


@pytest.mark.parametrize(("v", "width"), [(1, 80), (2, 160)])
def test_textbook_idle_is_the_closed_form(v, width):
    """Every rank idles (p-1)(f+b)/v; at the natural scale a forward of a chunk is 2 characters."""
    p, m, f, b = 4, 8, 1.0, 2.0
    chart = draw_schedule([f / v] * (p * v), [b / v] * (p * v), pp=p, vpp=v, m=m, width=width)
    chars_per_s = 2 / (f / v)
    for row in chart.rows:
        body = row[row.index("|") + 1:row.rindex("|")]
        assert body.count(".") == pytest.approx((p - 1) * (f + b) / v * chars_per_s)
        idle = float(row.rsplit(" ", 1)[1].rstrip("%"))
        assert idle == pytest.approx(100 * (p - 1) / v / (m + (p - 1) / v), abs=0.05)


def test_1f1b_rows_start_at_micro_batch_one_and_run_in_order():
    chart = draw_schedule([1.0] * 4, [2.0] * 4, pp=4, vpp=1, m=8, width=80)
    for r, row in enumerate(chart.rows):
        body = row[row.index("|") + 1:]
        assert body.lstrip(".").startswith("1 ")
        forwards = [int(x) for x in re.findall(r"(?<![b\d])(\d+) ", body)]
        backwards = [int(x) for x in re.findall(r"b(\d+)=", body)]
        assert forwards == list(range(1, 9)) and backwards == list(range(1, 9)), r


def test_interleaved_at_80_columns_wraps_into_bands_of_the_same_chart():
    wide = draw_schedule([0.5] * 8, [1.0] * 8, pp=4, vpp=2, m=8, width=160)
    narrow = draw_schedule([0.5] * 8, [1.0] * 8, pp=4, vpp=2, m=8, width=80)
    assert all(len(r) <= 80 for r in narrow.rows)
    bands = "\n".join(narrow.rows).split("\n\n")
    assert len(bands) == 2
    joined = ["".join(b.splitlines()[r][b.splitlines()[r].index("|") + 1:].rstrip(">") for b in bands)
              for r in range(4)]
    assert joined == _bodies(wide.rows)


def test_long_schedule_is_compressed_with_real_numbers():
    """p = 4, m = 64: warm-up, one steady period, `//`, the real cool-down; nothing mod 10."""
    chart = draw_schedule([1.0] * 4, [2.0] * 4, pp=4, vpp=1, m=64, width=80, max_bands=3)
    text = "\n".join(chart.rows)
    assert chart.labelled and chart.period_microbatches == 1
    assert all(len(r) <= 80 for r in chart.rows)
    bands = text.split("\n\n")
    rank0 = "".join(b.splitlines()[0][b.splitlines()[0].index("|") + 1:].rstrip(">") for b in bands)
    assert rank0.count("//") == 1
    backwards = [int(x) for x in re.findall(r"b(\d+)=", rank0)]
    # the backwards drawn on rank 0 plus one per omitted period are all 64, in order, ending at 64
    assert backwards == sorted(backwards) and backwards[-1] == 64
    assert len(backwards) + chart.omitted_periods == 64
    assert "b64" in text and "64 " in text


def test_huge_schedule_scales_down_into_one_band():
    chart = draw_schedule([1.0] * 64, [2.0] * 64, pp=16, vpp=4, m=512, width=80)
    assert not chart.labelled and len(chart.rows) == 16 and all(len(r) <= 80 for r in chart.rows)
    assert chart.omitted_periods > 0 and chart.period_microbatches == 16


def test_plan_schedule_prints_the_cost_model_bubble(plan_70b):
    pred, cfg = plan_70b.prediction, plan_70b.config
    text = schedule_chart(plan_70b, width=80)
    assert all(len(line) <= 80 for line in text.splitlines())
    flat = " ".join(text.split())
    p, v, m = cfg.dims.pp, cfg.dims.vpp, cfg.num_microbatches
    # the seconds printed are the bubble in the step-time breakdown
    assert f"{pred.time.bubble:.3f} s per step" in flat
    times = pred.rank_time_s
    frac = (sum(times) - max(times)) / v / (m * max(times))
    assert f"= {100 * frac:.3g} % of the busy time" in flat
    assert f"GPipe/1F1B (p-1)/m = {100 * (p - 1) / m:.3g} %" in flat
    assert f"interleaved (p-1)/(v*m) = {100 * (p - 1) / (v * m):.3g} %" in flat


def test_equal_stages_print_the_textbook_formula(plan_70b):
    import dataclasses

    pred = plan_70b.prediction
    even = dataclasses.replace(plan_70b, prediction=dataclasses.replace(pred, rank_time_s=(0.2,) * 4))
    line = bubble_lines(even)[0]
    m = plan_70b.config.num_microbatches
    assert f"(p-1)/(v*m) = 3/(2*{m}) = {300 / (2 * m):.3g} %" in line


def test_no_pipeline_says_so(plan_7b_one_gpu):
    assert "no pipeline bubble" in schedule_chart(plan_7b_one_gpu, width=80)


def test_interleaved_chunks_carry_their_chunk_index(plan_70b):
    """The second chunk's operations are styled (a colour terminal shades them like the textbook
    figure); styles fall on operations only, never on idle dots or the frame."""
    from autoshard.report.terminal import schedule_text

    chart = draw_schedule([0.5] * 8, [1.0] * 8, pp=4, vpp=2, m=8, width=160)
    for row, owner in zip(chart.rows, chart.chunks, strict=True):
        assert len(row) == len(owner)
        body = [(ch, c) for ch, c in zip(row, owner, strict=True)]
        assert all(ch not in ".|" for ch, c in body if c >= 0)
        assert {c for _, c in body if c >= 0} == {0, 1}
    text = schedule_text(plan_70b, width=80)
    styled = [span for span in text.spans if span.style == "cyan"]
    assert styled and all(text.plain[s.start:s.end] not in (".", "|") for s in styled)
