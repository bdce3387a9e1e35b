"""Megatron's EP all-to-all overlap (TrainConfig.moe_a2a_overlap): the two-stream schedule of one layer pair
(closed forms and bounds), the paired share of a rank's micro-batches (Megatron's warm-up counts), the SMs the
traffic keeps, the step and memory it changes, and the plans Megatron refuses it for."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.costmodel.train.a2a_overlap import (
    DEFAULT_SM_COUNT,
    MoeLayerParts,
    a2a_overlap_problems,
    ideal_paired_s,
    paired_chunks,
    paired_saving_s,
    rank_hidden_s,
    schedule_chunks,
    sm_count,
)
from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.memory import in_flight_microbatches
from autoshard.costmodel.train.step import predict_train, stage_cost
from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.emit.megatron.layout import default_stages
from autoshard.parallel import MoeDispatcher, ParallelDims, Recompute
from autoshard.specs import LayerKind, load_cluster, load_model
from autoshard.specs.prepare import resize

QWEN30 = load_model("qwen3-30b-a3b")
# The overlap's mechanics on layers the host does not bind: Qwen3-30B-A3B at EP 8 (16 local experts, 4,096 tokens)
# waits on the host with H100's fitted floor since README item AC, which leaves no traffic to hide
# (tests/costmodel/test_expert_host.py holds that case), so these tests take the floor out.
_DGX = load_cluster("dgx-h100")
_EFF = _DGX.primary.gpu.efficiency.model_copy(update={"train_expert_host_us": 0.0})
H100 = _DGX.model_copy(update={"pools": [_DGX.primary.model_copy(update={
    "gpu": _DGX.primary.gpu.model_copy(update={"efficiency": _EFF})})]})


def parts(af=1.0, ab=2.0, ef=1.0, ed=1.0, ew=1.0, d=0.5, c=0.5) -> MoeLayerParts:
    return MoeLayerParts(attention_fwd=af, attention_bwd=ab, expert_fwd=ef, expert_dgrad=ed, expert_wgrad=ew,
                         dispatch=d, combine=c)


def test_compute_bound_layer_hides_all_its_traffic() -> None:
    """Phases: max(0.5, 1) + [dispatch bwd ends max(0.5, 1) + 0.5 = 1.5; experts fwd end max(1 + 1, 0.5) + 1 = 3]
    + max(0.5, 2) = 1 + 3 + 2 = 6 s against 6 + 2 x 1 = 8 unpaired: the 2 s of traffic hidden, less the
    24 of 132 H100 SMs the traffic keeps."""
    p = parts()
    assert p.unpaired_s == 8.0
    assert ideal_paired_s(p) == 6.0
    assert paired_saving_s(p, 132) == pytest.approx(2.0 * (1 - 24 / 132))


def test_traffic_bound_layer_hides_its_compute() -> None:
    """Dispatch and combine 5 s each, every compute part 1 s: 5 + max(5 + 5, max(2, 5) + 1) + 5 = 20 s
    against 5 + 20 = 25: the 5 s of compute run under the traffic."""
    p = parts(af=1, ab=1, ef=1, ed=1, ew=1, d=5, c=5)
    assert ideal_paired_s(p) == 20.0
    assert paired_saving_s(p, 148) == pytest.approx(5.0 * (1 - 24 / 148))


def test_no_traffic_saves_nothing() -> None:
    assert paired_saving_s(parts(d=0.0, c=0.0), 132) == 0.0


def test_the_dispatch_backward_waits_for_the_expert_dgrad() -> None:
    """A long expert dgrad delays the dispatch backward, which then overlaps only the wgrad and the experts'
    forward: dgrad 3, wgrad 0.2, forward 0.2, dispatch 1 -> middle = max(max(1, 3) + 1, max(3.2, 1) + 0.2) = 4."""
    p = parts(af=0.0, ab=0.0, ef=0.2, ed=3.0, ew=0.2, d=1.0, c=0.0)
    assert ideal_paired_s(p) == pytest.approx(4.0)
    assert p.unpaired_s == pytest.approx(5.4)


def test_the_delayed_wgrad_lets_the_dispatch_backward_leave_early() -> None:
    """Dispatch 1.5 s, expert dgrad 1, wgrad 1, forward 0.5: with --delay-wgrad-compute the dispatch backward
    leaves after the dgrad (max(1.5, 1) + 1.5 = 3 s) while the wgrad and the experts' forward run (max(2, 1.5)
    + 0.5 = 2.5): middle 3 s. Without it the wgrad is part of the backward it waits for (max(1.5, 2) + 1.5):
    3.5 s. The layer cost applies the same rule (moe_a2a_delay_wgrad off: never more hidden)."""
    delayed = parts(af=0.0, ab=0.0, ef=0.5, ed=1.0, ew=1.0, d=1.5, c=0.0)
    inline = parts(af=0.0, ab=0.0, ef=0.5, ed=2.0, ew=0.0, d=1.5, c=0.0)
    assert (ideal_paired_s(delayed), ideal_paired_s(inline)) == (3.0, 3.5)
    cfg = _cfg(moe_a2a_overlap=True)
    on = layer_cost(QWEN30, LayerKind.MOE, H100.primary, cfg, Recompute.NONE).ep_overlap_s
    off = layer_cost(QWEN30, LayerKind.MOE, H100.primary, dataclasses.replace(cfg, moe_a2a_delay_wgrad=False),
                     Recompute.NONE).ep_overlap_s
    assert 0 < off <= on


times = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(times, times, times, times, times, times, times)
def test_pairing_never_beats_either_stream_nor_loses(af, ab, ef, ed, ew, d, c) -> None:
    """The pair takes at least the compute stream's work and at least the traffic's, never more than running
    both unpaired; the saving is at most the traffic."""
    p = MoeLayerParts(attention_fwd=af, attention_bwd=ab, expert_fwd=ef, expert_dgrad=ed, expert_wgrad=ew,
                      dispatch=d, combine=c)
    compute, comm = af + ab + ef + ed + ew, 2 * (d + c)
    ideal = ideal_paired_s(p)
    assert max(compute, comm) - 1e-9 <= ideal <= p.unpaired_s + 1e-9
    assert 0.0 <= paired_saving_s(p, 132) <= comm + 1e-9


@pytest.mark.parametrize("pp, vpp, m, rank, paired", [
    (1, 1, 8, 0, 7),  # the first forward alone, its backward's partner missing at the end
    (4, 2, 8, 0, 5),  # 16 chunks, warm-up (4 - 0 - 1) x 2 + (2 - 1) x 4 + 1 = 11
    (4, 2, 8, 3, 11),  # last rank: warm-up 0 + 4 + 1 = 5
    (8, 4, 8, 0, 0),  # warm-up 14 + 24 + 1 = 39 > 32 chunks: all in warm-up, nothing paired
])
def test_paired_chunks_follow_megatrons_warmup(pp, vpp, m, rank, paired) -> None:
    assert paired_chunks(rank=rank, pp=pp, vpp=vpp, num_microbatches=m) == paired


@pytest.mark.parametrize("name, sms", [
    ("H100-SXM5-80GB", 132), ("H200-SXM-141GB", 132), ("A100-SXM4-80GB", 108), ("B200-SXM-180GB", 148),
    ("GB200-186GB", 148), ("GB300-288GB", 160), ("B300-SXM-288GB", 160), ("MI300X", 304), ("H100-PCIe-80GB", 114),
    ("Z9000", DEFAULT_SM_COUNT),
])
def test_sm_counts(name, sms) -> None:
    assert sm_count(name) == sms


def _cfg(**kw) -> TrainConfig:
    base = dict(dims=ParallelDims(tp=1, pp=1, dp=8, ep=8), micro_batch_size=1, global_batch_size=64, seq_len=4096,
                moe_dispatcher=MoeDispatcher.FLEX)
    return TrainConfig(**{**base, **kw})


def test_layer_saving_comes_from_the_layers_own_parts() -> None:
    """An MoE layer hides part of its EP traffic, never more than it has; a dense-attention embedding or
    output layer hides nothing."""
    on = layer_cost(QWEN30, LayerKind.MOE, H100.primary, _cfg(moe_a2a_overlap=True), Recompute.NONE)
    off = layer_cost(QWEN30, LayerKind.MOE, H100.primary, _cfg(), Recompute.NONE)
    assert off.ep_overlap_s == 0.0
    assert 0.0 < on.ep_overlap_s < on.ep_comm_s
    assert (on.time_s, on.activation_bytes) == (off.time_s, off.activation_bytes)  # the step applies it
    for kind in (LayerKind.EMBEDDING, LayerKind.OUTPUT):
        assert layer_cost(QWEN30, kind, H100.primary, _cfg(moe_a2a_overlap=True), Recompute.NONE).ep_overlap_s == 0


def test_step_saves_the_paired_share_without_a_pipeline() -> None:
    """PP 1, m micro-batches: m - 1 forwards run paired, so the step is shorter by (m - 1) x the layers'
    savings; the breakdown still sums to the step and reports the hidden traffic; memory is unchanged (each
    paired forward saves a layer where the backward beside it frees one)."""
    cfg = _cfg()
    stages = default_stages(QWEN30, pp=1, vpp=1)
    off = predict_train(QWEN30, resize(H100, 64), cfg, stages)
    on = predict_train(QWEN30, resize(H100, 64), dataclasses.replace(cfg, moe_a2a_overlap=True), stages)
    m = cfg.num_microbatches
    per_mb = sum(layer_cost(QWEN30, k, H100.primary, dataclasses.replace(cfg, moe_a2a_overlap=True),
                            Recompute.NONE).ep_overlap_s for k in QWEN30.layer_kinds)
    assert off.step_time_s - on.step_time_s == pytest.approx((m - 1) * per_mb, rel=1e-9)
    assert on.time.total == pytest.approx(on.step_time_s)
    assert on.time.ep_comm_hidden == pytest.approx((m - 1) * per_mb)
    assert on.time.ep_comm == pytest.approx(off.time.ep_comm - on.time.ep_comm_hidden)
    assert on.peak_memory_bytes == off.peak_memory_bytes


def test_interleaved_overlap_warms_up_one_chunk_more() -> None:
    """PP 4 / VPP 2: rank 0 holds one more chunk micro-batch of activations (Megatron schedules one extra
    warm-up forward in this mode: test_interleaved_in_flight_adds_one_chunk), and the fill and drain stay
    unpaired."""
    cfg = _cfg(dims=ParallelDims(tp=1, pp=4, dp=8, ep=8, vpp=2), global_batch_size=128)
    stages = default_stages(QWEN30, pp=4, vpp=2)
    off = predict_train(QWEN30, resize(H100, 32), cfg, stages)
    on = predict_train(QWEN30, resize(H100, 32), dataclasses.replace(cfg, moe_a2a_overlap=True), stages)
    assert on.step_time_s < off.step_time_s
    assert on.time.bubble == pytest.approx(off.time.bubble)  # the fill and drain are priced unpaired
    assert on.rank_memory_bytes[0] > off.rank_memory_bytes[0]
    # the hidden traffic is rank_hidden_s over each rank's real chunks, taken on the slowest steady rank
    on_cfg, m = dataclasses.replace(cfg, moe_a2a_overlap=True), cfg.num_microbatches
    pool = resize(H100, 32).primary
    hidden = [rank_hidden_s([stage_cost(QWEN30, st, pool, on_cfg).layer_overlaps for i, st in enumerate(stages)
                             if i % 4 == r], rank=r, pp=4, num_microbatches=m) for r in range(4)]
    steady = [t - h / m for t, h in zip(on.rank_time_s, hidden, strict=True)]
    b = steady.index(max(steady))
    assert on.time.ep_comm_hidden == pytest.approx(hidden[b]) and hidden[b] > 0
    assert on.step_time_s == pytest.approx(m * steady[b] + (sum(on.rank_time_s) - on.rank_time_s[b]) / 2
                                           + on.time.dp_comm_exposed + on.time.optimizer, rel=1e-6)


BASE = _cfg(moe_a2a_overlap=True)


@pytest.mark.parametrize("change, fragment", [
    (dict(dims=ParallelDims(tp=1, pp=1, dp=8, ep=1)), "EP > 1"),
    (dict(moe_dispatcher=MoeDispatcher.ALLGATHER), "alltoall or flex"),
    (dict(dims=ParallelDims(tp=1, pp=2, dp=4, ep=4), global_batch_size=32), "VPP > 1"),
    (dict(recompute=Recompute.FULL), "no full recompute"),
    (dict(recompute=Recompute.SELECTIVE, recompute_modules=("moe",)), "moe module"),
])
def test_megatron_refuses_it(change, fragment) -> None:
    assert a2a_overlap_problems(QWEN30, BASE) == []
    problems = a2a_overlap_problems(QWEN30, dataclasses.replace(BASE, **change))
    assert len(problems) == 1 and fragment in problems[0]


def test_block_recompute_and_dense_models_are_refused() -> None:
    stages = (Stage(start=0, stop=len(QWEN30.layer_kinds), full_recompute_layers=2),)
    assert "no full recompute" in a2a_overlap_problems(QWEN30, BASE, stages)[0]
    dense = load_model("llama-3.1-8b")
    assert "no experts" in a2a_overlap_problems(dense, BASE)[0]


def test_schedule_table_is_megatrons() -> None:
    """get_schedule_table's example (m 5, group 3, 2 chunks): chunks 0 0 0 1 1 1 0 0 1 1."""
    assert schedule_chunks(5, 2, 3) == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_unequal_chunks_pair_only_their_common_layers() -> None:
    """PP 2 x VPP 2, 4 micro-batches, rank 0: table 0 0 1 1 0 0 1 1, warm-up (2 - 1) x 2 + 2 + 1 = 5, so
    forwards 5, 6, 7 run beside backwards 0, 1, 2: chunk pairs (0, 1), (1, 1), (1, 0). With two layers in
    chunk 0 and one in chunk 1 each pair overlaps one layer pair: 3 x the saving (not 3 + 4 x ... as
    if every layer paired)."""
    assert rank_hidden_s([[1.0, 1.0], [1.0]], rank=0, pp=2, num_microbatches=4) == 3.0
    # rank 1 warms up 2 + 1 = 3: forwards 3..7 (chunks 1 0 0 1 1) beside backwards 0..4 (chunks 1 1 0 0 1):
    # (1, 1), (0, 1), (0, 0), (1, 0), (1, 1) overlap 1 + 1 + 2 + 1 + 1 layer pairs
    assert rank_hidden_s([[1.0, 1.0], [1.0]], rank=1, pp=2, num_microbatches=4) == 6.0
    # PP 1: m - 1 pairs of the whole model with itself, forward layer i beside backward layer n - 1 - i:
    # a dense-first model pairs its dense layers with MoE layers, which hide nothing here
    assert rank_hidden_s([[0.0, 2.0, 2.0]], rank=0, pp=1, num_microbatches=4) == 3 * 2.0


def test_interleaved_in_flight_adds_one_chunk() -> None:
    for pp, vpp, extra in ((4, 2, 0.5), (8, 4, 0.25)):
        on = in_flight_microbatches(rank=0, pp=pp, vpp=vpp, num_microbatches=64, a2a_overlap=True)
        assert on - in_flight_microbatches(rank=0, pp=pp, vpp=vpp, num_microbatches=64) == extra
