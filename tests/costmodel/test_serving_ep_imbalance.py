"""The busiest EP rank of a serving step (#10, #13): with expert parallelism every rank waits, at the
combine, for the rank that received the most token-expert pairs. Routing at random spreads the pairs
unevenly; `moe.busiest_rank_factor` prices the expected maximum from the exact per-token variance of
a rank's load (group-limited routing included) and E[max of n normals]. Checked against closed forms
and a brute-force draw of DeepSeek-V3's router."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoshard.costmodel.moe import busiest_rank_factor, expected_max_normal, rank_load_variance
from autoshard.costmodel.serve.compute import _expert_routing
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.specs import load_model
from autoshard.specs.job import WeightDtype

DSV3 = load_model("deepseek-v3")


@pytest.mark.parametrize(
    "n, expected",
    [
        (1, 0.0),
        (2, 1 / math.sqrt(math.pi)),  # E[max(X1, X2)] = 1/sqrt(pi)
        (3, 3 / (2 * math.sqrt(math.pi))),
        (8, 1.4236),  # tables of normal order statistics (e.g. Harter 1961)
        (64, 2.3437),
    ],
)
def test_expected_max_of_normals_closed_forms(n, expected):
    assert expected_max_normal(n) == pytest.approx(expected, abs=2e-4)


@pytest.mark.parametrize("e, k, ep", [(256, 8, 8), (256, 8, 64), (128, 8, 16), (8, 2, 8), (64, 6, 4)])
def test_plain_top_k_variance_is_hypergeometric(e, k, ep):
    """Without groups a rank holding E/ep experts gets Hypergeometric(E, E/ep, k) of a token's experts."""
    p = 1 / ep
    assert rank_load_variance(e, k, ep) == pytest.approx(k * p * (1 - p) * (e - k) / (e - 1), rel=1e-12)


def test_group_limited_routing_doubles_deepseek_variance_over_ep8():
    """DeepSeek-V3 over EP 8: one routing group per rank, so a token sends 0 experts there (group not
    among its 4 of 8) or Hypergeometric(128, 32, 8) of them: var = (Var_h + 2^2) / 2 - 1 = 1.709,
    twice the 0.851 of plain top-8 of 256."""
    var_h = 8 * (1 / 4) * (3 / 4) * (120 / 127)
    grouped = rank_load_variance(256, 8, 8, 8, 4)
    assert grouped == pytest.approx(0.5 * (var_h + 4.0) - 1.0, rel=1e-12)
    assert grouped / rank_load_variance(256, 8, 8) == pytest.approx(2.008, abs=0.01)


def test_one_rank_and_no_load_are_balanced():
    assert busiest_rank_factor(1, 100.0, 256, 8, 8, 4) == 1.0
    assert busiest_rank_factor(16, 0.0, 256, 8, 8, 4) == 1.0


def test_excess_falls_as_one_over_root_of_the_load():
    """Four times the pairs per rank, half the relative excess of the busiest rank."""
    a = busiest_rank_factor(16, 1000.0, 256, 8, 8, 4) - 1.0
    b = busiest_rank_factor(16, 4000.0, 256, 8, 8, 4) - 1.0
    assert b == pytest.approx(a / 2, rel=1e-9)
    assert a > 0


def _draw_deepseek(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """DeepSeek-V3's router on random scores: the top 4 of 8 groups, then the top 8 of their 128 experts."""
    groups = np.argpartition(-rng.random((tokens, 8), dtype=np.float32), 4, axis=1)[:, :4]
    mask = np.zeros((tokens, 8), dtype=bool)
    np.put_along_axis(mask, groups, True, axis=1)
    scores = rng.random((tokens, 256), dtype=np.float32)
    scores = np.where(np.repeat(mask, 32, axis=1), scores, np.float32(-1))
    return np.argpartition(-scores, 8, axis=1)[:, :8]


@pytest.mark.parametrize("ep, tokens", [(8, 3600), (16, 2048), (64, 4096)])
def test_busiest_rank_matches_a_brute_force_draw_of_deepseek_routing(ep, tokens):
    """Mean over 40 draws of max/mean rank load for DeepSeek-V3's group-limited routing: the closed
    form within 0.6 % of the load (the excess it prices is 3-11 %)."""
    rng = np.random.default_rng(ep)
    ratios = []
    for _ in range(40):
        loads = np.bincount((_draw_deepseek(rng, tokens) // (256 // ep)).ravel(), minlength=ep)
        ratios.append(loads.max() / loads.mean())
    measured = float(np.mean(ratios))
    predicted = busiest_rank_factor(ep, tokens * 8 / ep, 256, 8, 8, 4)
    assert 1.02 < predicted < 1.12
    assert predicted == pytest.approx(measured, abs=0.006)


def test_grouped_experts_run_the_busiest_ranks_pairs():
    """The routed-expert GEMMs of an EP decode step see the mean pairs times the busiest-rank factor;
    without EP (experts TP-sharded) every GPU holds a slice of every expert and none is busiest."""
    ep_cfg = ServeConfig(tp=1, dp_attention=16, expert_parallel=True, weight_dtype=WeightDtype.FP8)
    hit, pairs, shards = _expert_routing(DSV3, ep_cfg, 256.0)
    mean = 256 * 16 * 8 / 16
    assert pairs == pytest.approx(mean * busiest_rank_factor(16, mean, 256, 8, 8, 4), rel=1e-12)
    assert hit == pytest.approx(16.0, rel=1e-6) and shards == 1  # all 16 local experts hit
    tp_cfg = ServeConfig(tp=8, weight_dtype=WeightDtype.FP8)
    _, tp_pairs, tp_shards = _expert_routing(DSV3, tp_cfg, 256.0)
    assert tp_pairs == 256 * 8 and tp_shards == 8
