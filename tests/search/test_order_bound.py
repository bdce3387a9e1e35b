"""The order-aware test of the count-aware bounds (search/train/bounds_order.py): without interleaving
each rank holds one run of the layer sequence, so the minority layers' positions decide which ranks
can hold them. `ordered_fit` equals a brute force over every split of the sequence; the bounds built
on it never pass the best layout a brute force finds (every contiguous layout and recompute count)
and are higher than the order-free bound on many candidates of dense-first, dense-last and
interleaved models."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import autoshard.search.train.bounds_mixed as bounds_mixed
from autoshard.search.train.bounds import bounds
from autoshard.search.train.bounds_order import ordered_fit, segments
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.search.train.tables import Layout, build_tables, int_objective
from autoshard.specs import ModelSpec, TrainJob
from conftest import tiny_cluster, tiny_model

MOE = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096}


def _split_fits(caps: np.ndarray, is_major: np.ndarray, fewest: np.ndarray) -> bool:
    """Brute force: some split of the sequence into pp consecutive runs (empty runs allowed) gives
    rank r at least fewest[r] layers and at most caps[r, j] majority layers next to its j minority."""
    n, pp = len(is_major), caps.shape[0]
    for cuts in itertools.combinations_with_replacement(range(n + 1), pp - 1):
        b = (0, *cuts, n)
        if all(b[r + 1] - b[r] >= fewest[r]
               and caps[r, int((~is_major[b[r]:b[r + 1]]).sum())] >= int(is_major[b[r]:b[r + 1]].sum())
               for r in range(pp)):
            return True
    return False


def test_ordered_fit_equals_every_split():
    """Random sequences, capacities (-inf: a count the rank cannot hold) and fewest layers: with
    capacities non-increasing in the minority count the test is exact; otherwise it is exact for
    their running maximum from the right, never stricter than the raw capacities."""
    rng = np.random.default_rng(7)
    relaxed = exact_cases = 0
    for _ in range(600):
        n, pp = int(rng.integers(1, 8)), int(rng.integers(1, 5))
        is_major = rng.random(n) < 0.6
        caps = rng.integers(-1, 5, size=(pp, int((~is_major).sum()) + 1)).astype(np.float64)
        caps[caps < 0] = -np.inf
        monotone = bool(rng.random() < 0.5)
        if monotone:
            caps = np.minimum.accumulate(caps, axis=1)
        fewest = rng.integers(0, 3, size=pp)
        got = bool(ordered_fit(caps[None], segments(is_major), fewest)[0])
        raised = np.maximum.accumulate(caps[:, ::-1], axis=1)[:, ::-1]
        assert got == _split_fits(raised, is_major, fewest)
        raw = _split_fits(caps, is_major, fewest)
        assert got or not raw  # a relaxation: never rejects a split that fits
        if monotone:
            assert got == raw
            exact_cases += 1
        relaxed += got and not raw
    assert exact_cases > 200 and relaxed > 0


def _model(groups: list[dict]) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "tiny", "hidden_size": 2048, "ffn_hidden_size": 8192, "num_attention_heads": 16, "num_kv_heads": 4,
        "vocab_size": 32000, "tied_embeddings": False, "max_position_embeddings": 8192, "moe": MOE,
        "layers": [{"kind": "embedding"}, *groups, {"kind": "output"}],
    })


TIGHT = tiny_cluster(gpus_per_node=4, nodes=2, hbm=16.0)
JOB = TrainJob(seq_len=2048, global_batch_size=16)
CASES = {
    # (model, cluster, job, fewest candidates with a higher bound than the order-free one; 23-55 of
    # the 56 measured)
    "dense-first-2": (tiny_model(layers=7, hidden=2048, heads=16, kv=4, moe=MOE, dense_first=2), TIGHT, JOB, 15),
    "dense-last": (_model([{"kind": "moe", "count": 5}, {"kind": "dense", "count": 2}]), TIGHT, JOB, 35),
    "dense-between": (_model([{"kind": "moe", "count": 3}, {"kind": "dense", "count": 2}, {"kind": "moe", "count": 2}]),
                      TIGHT, JOB, 30),
    "dense-first-dp": (tiny_model(layers=6, moe=MOE, dense_first=2), tiny_cluster(gpus_per_node=4, nodes=2),
                       TrainJob(seq_len=1024, global_batch_size=16), 25),
}


def _best(tab, uniform: bool) -> int | None:
    """Brute force over every contiguous layout and recompute counts (per chunk, or one count for
    every chunk with `uniform`)."""
    s, n = tab.num_chunks, tab.num_layers
    best = None
    for inner in itertools.combinations(range(1, n), s - 1):
        bnds = (0, *inner, n)
        sizes = [int(tab.decoders[bnds[k + 1]] - tab.decoders[bnds[k]]) for k in range(s)]
        if tab.base_full or tab.config.recompute.value == "selective":
            counts = [(0,) * s]
        elif uniform:
            counts = [(k,) * s for k in range(min(sizes) + 1)]
        else:
            counts = itertools.product(*(range(z + 1) for z in sizes))
        for rc in counts:
            obj, fits = int_objective(tab, Layout(bounds=bnds, recompute=rc, pools=(0,) * s))
            if fits and (best is None or obj < best):
                best = obj
    return best


@pytest.mark.parametrize("name", sorted(CASES))
def test_order_aware_bounds_never_exceed_the_brute_force_optimum(name, monkeypatch):
    model, cluster, job, higher_at_least = CASES[name]
    space = enumerate_train(model, cluster, job, pins=Pins(), options=SpaceOptions(max_micro_batch=1, max_vpp=1))
    plain_init = bounds_mixed.MixedCapacity.__init__

    def order_free(self, *args, **kwargs):
        plain_init(self, *args, **kwargs)
        self.order = None

    checked = higher = 0
    for cfg in space.candidates:
        if cfg.dims.pp == 1 or cfg.zero_stage or cfg.recompute.value == "selective":  # a third of them: the suite stays fast
            continue
        tab = build_tables(model, cluster, cfg, scale=math.lcm(1))
        assert bounds_mixed.MixedCapacity(tab).order is not None
        for uniform in (False, True):
            best = _best(tab, uniform)
            found = bounds(tab, uniform_recompute=uniform)
            if best is None:
                continue
            assert found is not None and found[0] <= best, (cfg.dims.describe(), cfg.recompute.value, uniform, found, best)
            checked += 1
            if uniform:
                continue
            with monkeypatch.context() as m:
                m.setattr(bounds_mixed.MixedCapacity, "__init__", order_free)
                before = bounds(tab)
            assert before is not None and found[0] >= before[0]
            higher += found[0] > before[0]
    assert checked >= 100
    assert higher >= higher_at_least
