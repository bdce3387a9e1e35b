"""The once-per-step FP8 weight cast (costmodel.train.layer.fp8_weight_cast_s) reaches the step P times
over through the schedule's fill; the solver's tables carry it in the tail column
(tables.layer_tails), so the integer objective the CP-SAT model minimizes still equals
`predict_train`'s step for every candidate and layout of a small FP8 case, within the tables'
per-layer microsecond rounding. Without the column the two disagree on pipelined plans."""

from __future__ import annotations

from autoshard.costmodel.train.step import predict_train, stage_cost
from autoshard.search.train import tables as tables_module
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.specs import Precision, TrainJob
from conftest import layout_objectives, tiny_cluster, tiny_model

ROUNDING = 5e-3
MODEL = tiny_model(layers=8, hidden=4096, heads=32, kv=8)
CLUSTER = tiny_cluster(gpus_per_node=4, nodes=2)
# one micro-batch per DP rank and step: the per-step cast is a visible part of a short step
JOB = TrainJob(seq_len=512, global_batch_size=8, precision=Precision.FP8)


def _pairs():
    space = enumerate_train(MODEL, CLUSTER, JOB, pins=Pins(), options=SpaceOptions(max_micro_batch=1, max_vpp=2))
    for cfg in space.candidates:
        for c, stages, got in layout_objectives(MODEL, CLUSTER, cfg):
            cast = max(sum(stage_cost(MODEL, st, CLUSTER.pools[0], c).weight_cast_s for st in stages[r::c.dims.pp])
                       for r in range(c.dims.pp))
            yield cfg, got, predict_train(MODEL, CLUSTER, c, stages), cast


def test_solver_objective_equals_the_step_with_fp8_weight_casts():
    checked = cast_heavy = 0
    for cfg, got, pred, cast in _pairs():
        assert abs(got / pred.step_time_s - 1) <= ROUNDING, (cfg.dims, got, pred.step_time_s)
        checked += 1
        # the fill charges P x the slowest rank's casts: a real part of these steps
        cast_heavy += cfg.dims.pp * cast > 0.02 * pred.step_time_s
    assert checked > 100 and cast_heavy > 20


def test_tables_without_the_cast_column_disagree(monkeypatch):
    original = tables_module.layer_tails
    monkeypatch.setattr(tables_module, "layer_tails", lambda cfg, pool, dense, expert, cast=None:
                        original(cfg, pool, dense, expert))
    off = [abs(got / pred.step_time_s - 1) for cfg, got, pred, _ in _pairs() if cfg.dims.pp > 1]
    assert max(off) > 4 * ROUNDING
