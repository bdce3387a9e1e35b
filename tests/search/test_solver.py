"""Planner properties: legal degrees, complete layouts, memory fit, determinism, pins, certificates."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoshard.errors import InfeasibleError
from autoshard.parallel import Recompute, check_dims
from autoshard.search.train.options import SolverOptions
from autoshard.search.train.solve import solve_train
from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train
from autoshard.specs import TrainJob, load_cluster, load_model
from autoshard.specs.cluster import ClusterSpec
from conftest import tiny_cluster, tiny_model

REPO = Path(__file__).resolve().parents[2]
FAST = SolverOptions(num_workers=1, seed=0, time_limit_s=30, space=SpaceOptions(max_micro_batch=4, max_vpp=4))


def check_plan(plan, model, gpus):
    dims = plan.config.dims
    assert dims.tp * dims.pp * dims.dp * dims.cp == gpus
    names = [n for s in plan.stages for n in model.layer_names[s.start:s.stop]]
    assert names == list(model.layer_names)  # every layer exactly once, in order
    assert len(plan.stages) == dims.pp * dims.vpp
    assert plan.prediction.fits
    assert not check_dims(dims, model, seq_len=plan.config.seq_len)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(2, 12), nodes=st.sampled_from([1, 2, 4]), per_node=st.sampled_from([2, 4, 8]),
       heads=st.sampled_from([8, 16]), seq=st.sampled_from([1024, 2048]), batch=st.sampled_from([8, 16, 32]))
def test_every_plan_is_legal_complete_and_fits(layers, nodes, per_node, heads, seq, batch):
    model = tiny_model(layers=layers, hidden=128 * heads, heads=heads, kv=heads // 2)
    cluster = tiny_cluster(gpus_per_node=per_node, nodes=nodes)
    plan = solve_train(model, cluster, TrainJob(seq_len=seq, global_batch_size=batch), options=FAST)[0]
    check_plan(plan, model, cluster.num_gpus)
    assert plan.solver.status == "OPTIMAL"
    assert plan.solver.gap == pytest.approx(0.0, abs=1e-9)


def test_solve_is_deterministic():
    model, cluster = tiny_model(layers=8), tiny_cluster(gpus_per_node=4, nodes=2)
    job = TrainJob(seq_len=2048, global_batch_size=32)
    a = solve_train(model, cluster, job, options=FAST)[0]
    b = solve_train(model, cluster, job, options=FAST)[0]
    assert a.config == b.config
    assert a.stages == b.stages


def test_float_recheck_matches_solver_objective():
    """The plan's prediction is the cost model's float re-check of the solver's integer objective."""
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(16)
    plan = solve_train(model, cluster, TrainJob(seq_len=8192, global_batch_size=64), options=FAST)[0]
    assert plan.prediction.step_time_s == pytest.approx(plan.solver.objective, rel=1e-3)


def test_pins_are_respected():
    model, cluster = load_model("llama-3.1-70b"), load_cluster("dgx-h100").with_gpus(64)
    job = TrainJob(seq_len=4096, global_batch_size=128)
    plan = solve_train(model, cluster, job, pins=Pins(tp=8, pp=4, recompute=Recompute.SELECTIVE), options=FAST)[0]
    assert (plan.config.dims.tp, plan.config.dims.pp, plan.config.recompute) == (8, 4, Recompute.SELECTIVE)
    check_plan(plan, model, 64)


def test_top_k_returns_distinct_plans_in_order():
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(16)
    options = SolverOptions(num_workers=1, seed=0, time_limit_s=30, top_k=3,
                            space=SpaceOptions(max_micro_batch=4, max_vpp=2))
    plans = solve_train(model, cluster, TrainJob(seq_len=4096, global_batch_size=64), options=options)
    assert len(plans) == 3
    keys = {(p.config.dims, p.config.micro_batch_size, p.config.recompute, p.config.zero_stage) for p in plans}
    assert len(keys) == 3
    steps = [p.solver.objective for p in plans]
    assert steps == sorted(steps)


def test_infeasible_says_what_is_missing():
    model, cluster = load_model("llama-3.1-405b"), load_cluster("dgx-a100-40gb").with_gpus(8)
    with pytest.raises(InfeasibleError) as info:
        solve_train(model, cluster, TrainJob(seq_len=4096, global_batch_size=64), options=FAST)
    text = str(info.value)
    assert "need" in text and "GiB" in text and "--gpus 256" in text


def _states_line(text: str) -> tuple[float, float]:
    m = re.search(r"need at least ([0-9.]+) GiB per GPU in the best layout; a GPU has ([0-9.]+) GiB", text)
    assert m, text
    return float(m.group(1)), float(m.group(2))


def test_infeasible_numbers_say_what_is_missing():
    """The states floor is compared with what a rank may use (memory fraction of HBM less the runtime
    reserve), never with raw HBM: 70B on 16 H100 needs 73.9 GiB of states per GPU, less than the 79.6
    GiB of HBM but more than the ~65 GiB a rank may use, and the message says so."""
    model, cluster = load_model("llama-3.1-70b"), load_cluster("dgx-h100").with_gpus(16)
    with pytest.raises(InfeasibleError) as info:
        solve_train(model, cluster, TrainJob(seq_len=4096, global_batch_size=64), options=FAST)
    need, usable = _states_line(str(info.value))
    assert need == pytest.approx(73.9, abs=0.1)
    assert need > usable and usable < cluster.primary.gpu.hbm_gib - cluster.primary.gpu.efficiency.reserved_memory_gib


def test_infeasible_on_a_heterogeneous_cluster_names_its_pools():
    """A mixed cluster is described pool by pool, and the fix is more nodes in its YAML (--gpus cannot
    resize it), not a --gpus value."""
    spec = yaml.safe_load((REPO / "clusters" / "mixed-h100-a100.yaml").read_text())
    for pool in spec["pools"]:
        pool["num_nodes"] = 1
    cluster = ClusterSpec.model_validate(spec)
    with pytest.raises(InfeasibleError) as info:
        solve_train(load_model("llama-3.1-405b"), cluster, TrainJob(seq_len=4096, global_batch_size=64),
                    options=FAST)
    text = str(info.value)
    assert "on 8 x H100-SXM5-80GB (79.6 GiB) + 8 x A100-SXM4-80GB (80.0 GiB)." in text  # as nvidia-smi reports
    assert "num_nodes of the pools in the cluster YAML" in text and "try --gpus" not in text
    need, usable = _states_line(text)
    assert need > 400 and usable < 80


def test_prune_reasons_are_recorded():
    model, cluster = load_model("llama-3.1-70b"), load_cluster("dgx-h100").with_gpus(64)
    space = enumerate_train(model, cluster, TrainJob(seq_len=4096, global_batch_size=128))
    assert space.candidates
    assert space.pruned["more model chunks than layers"] > 0
    assert all(reason for reason in space.pruned)


def test_uneven_layout_beats_even_split_with_large_vocabulary():
    """Llama-3's 128K vocabulary makes the output stage heavy: the solver moves decoder layers off it."""
    model, cluster = load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(32)
    job = TrainJob(seq_len=8192, global_batch_size=256)
    pins = Pins(tp=1, pp=8, vpp=1, cp=1, mbs=1, recompute=Recompute.NONE, zero_stage=1)
    plan = solve_train(model, cluster, job, pins=pins, options=FAST)[0]
    decoders = [sum(1 for n in model.layer_names[s.start:s.stop] if n.startswith("decoder.")) for s in plan.stages]
    assert decoders[-1] < max(decoders)
    from autoshard.api import evaluate
    even = evaluate(model, cluster, job, tp=1, pp=8, micro_batch_size=1)
    assert plan.prediction.step_time_s < even.prediction.step_time_s


def test_memory_fraction_keeps_headroom():
    model, cluster = load_model("llama-3.1-70b"), load_cluster("dgx-h100").with_gpus(64)
    job = TrainJob(seq_len=8192, global_batch_size=512)
    tight = solve_train(model, cluster, job, options=dataclasses.replace(FAST, memory_fraction=1.0))[0]
    options = SolverOptions(num_workers=1, seed=0, time_limit_s=30, memory_fraction=0.85,
                            space=SpaceOptions(max_micro_batch=4, max_vpp=4))
    roomy = solve_train(model, cluster, job, options=options)[0]
    hbm = cluster.primary.gpu.hbm_gib * 2**30
    assert tight.prediction.peak_memory_bytes > 0.85 * hbm  # the unconstrained optimum uses the headroom
    assert roomy.prediction.peak_memory_bytes <= 0.85 * hbm
    assert roomy.prediction.step_time_s >= tight.prediction.step_time_s
