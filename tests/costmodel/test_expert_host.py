"""The host time of a dropless MoE layer's routed experts (EfficiencySpec.expert_host_us): per local
expert, per MoE layer and micro-batch, a floor under the layer's time in Megatron-Core and NeMo steps
whose routed experts run outside CUDA graphs; none for dense layers, torchtitan, or full-iteration CUDA
graphs. Read from a Megatron launch by the parser (--cuda-graph-impl full_iteration)."""

from __future__ import annotations

import pytest

from autoshard.costmodel.train.layer import expert_host_s, layer_cost
from autoshard.costmodel.train.memory import TrainFramework
from autoshard.costmodel.train.types import TrainConfig
from autoshard.emit.megatron.parse import parse_megatron
from autoshard.errors import SpecError
from autoshard.parallel import MoeDispatcher, ParallelDims, Recompute
from autoshard.specs import load_cluster, load_model
from autoshard.specs.layers import LayerKind

QWEN = load_model("qwen3-30b-a3b")  # 128 experts, top-8


def _pool(us: float):
    pool = load_cluster("dgx-h100").pools[0]
    eff = pool.gpu.efficiency.model_copy(update={"train_expert_host_us": us})
    return pool.model_copy(update={"gpu": pool.gpu.model_copy(update={"efficiency": eff})})


def _cfg(ep: int = 8, **kw) -> TrainConfig:
    return TrainConfig(dims=ParallelDims(tp=1, pp=1, dp=16, ep=ep), micro_batch_size=1, global_batch_size=16,
                       seq_len=4096, **kw)


@pytest.mark.parametrize(("ep", "us", "expected_ms"), [(8, 100.0, 1.6), (16, 100.0, 0.8), (8, 0.0, 0.0), (4, 250.0, 8.0)])
def test_host_time_is_local_experts_times_the_knob(ep, us, expected_ms):
    # 128 experts over EP ranks: 16, 8, 16, 32 local experts
    assert expert_host_s(QWEN, LayerKind.MOE, _pool(us), _cfg(ep)) == pytest.approx(expected_ms * 1e-3)


def test_no_host_time_for_dense_layers_torchtitan_or_full_graphs():
    pool = _pool(100.0)
    assert expert_host_s(QWEN, LayerKind.DENSE, pool, _cfg()) == 0.0
    assert expert_host_s(QWEN, LayerKind.MOE, pool, _cfg(full_cuda_graph=True)) == 0.0
    assert expert_host_s(QWEN, LayerKind.MOE, pool, _cfg(framework=TrainFramework.TORCHTITAN)) == 0.0
    assert expert_host_s(QWEN, LayerKind.MOE, pool, _cfg(framework=TrainFramework.NEMO)) == pytest.approx(1.6e-3)


def _gpu_s(cost):
    return cost.compute_s + cost.recompute_s + cost.tp_comm_s + cost.cp_comm_s + cost.ep_comm_s - cost.ep_overlap_s


@pytest.mark.parametrize(("recompute", "modules", "forwards"), [
    (Recompute.NONE, (), 1), (Recompute.FULL, (), 2), (Recompute.SELECTIVE, ("moe",), 2),
    (Recompute.SELECTIVE, ("core_attn",), 1)])
def test_a_layer_lasts_at_least_the_host_time(recompute, modules, forwards):
    """The layer's time is max(GPU, host), the host issuing a third of the work per forward run."""
    cfg = _cfg(recompute=recompute, recompute_modules=modules)
    gpu = _gpu_s(layer_cost(QWEN, LayerKind.MOE, _pool(0.0), cfg, recompute))
    for us in (0.5 * gpu / 16 * 1e6, 2.0 * gpu / 16 * 1e6):  # host below, then above the GPU's time
        host = us * 1e-6 * 16 * (forwards + 2) / 3
        cost = layer_cost(QWEN, LayerKind.MOE, _pool(us), cfg, recompute)
        assert _gpu_s(cost) == pytest.approx(max(gpu, host), rel=1e-12)


def test_the_host_wait_is_idle_compute_not_traffic():
    cfg = _cfg()
    base = layer_cost(QWEN, LayerKind.MOE, _pool(0.0), cfg, Recompute.NONE)
    slow = layer_cost(QWEN, LayerKind.MOE, _pool(5000.0), cfg, Recompute.NONE)  # 80 ms of host per layer
    wait = 0.080 - _gpu_s(base)
    assert slow.compute_s - base.compute_s == pytest.approx(wait)
    assert slow.fwd_bwd_compute_s - base.fwd_bwd_compute_s == pytest.approx(wait)
    assert (slow.ep_comm_s, slow.tp_comm_s, slow.recompute_s) == (base.ep_comm_s, base.tp_comm_s, base.recompute_s)
    dense = layer_cost(load_model("llama-3.1-8b"), LayerKind.DENSE, _pool(5000.0), cfg, Recompute.NONE)
    assert dense == layer_cost(load_model("llama-3.1-8b"), LayerKind.DENSE, _pool(0.0), cfg, Recompute.NONE)


BASE = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 "
        "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
        "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8")


@pytest.mark.parametrize(("flags", "full"), [
    ("", False),
    (" --cuda-graph-impl full_iteration", True),  # Megatron-LM d98e8a64
    (" --cuda-graph-impl local --cuda-graph-scope full_iteration", True),  # the MoE recipes' spelling (7b9593be8e)
    (" --cuda-graph-impl local --cuda-graph-modules full_iteration", True),
    (" --cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router moe_preprocess", False),
    (" --cuda-graph-impl local", False),
    # the deprecated scope spelling, which Megatron-Core migrates to --cuda-graph-impl full_iteration
    (" --cuda-graph-impl none --cuda-graph-scope full_iteration", True),
    (" --cuda-graph-scope full_iteration", True),
])
def test_parser_reads_full_iteration_graphs(flags, full):
    parsed = parse_megatron(BASE + flags)
    assert parsed.full_cuda_graph is full
    assert parsed.train_config().full_cuda_graph is full
    # a MoE launch is told what the launch written back leaves out
    assert any("static expert buffers" in w for w in parsed.warnings) is full


def _cluster(us: float):
    cluster = load_cluster("dgx-h100")
    return cluster.model_copy(update={"pools": [_pool(us), *cluster.pools[1:]]})


def test_a_host_bound_plan_says_so_with_its_numbers():
    from autoshard.costmodel.train.step import predict_train
    from autoshard.emit.megatron.layout import default_stages

    cfg, stages = _cfg(), default_stages(QWEN, pp=1, vpp=1)
    quiet = predict_train(QWEN, _cluster(0.0), cfg, stages)
    assert not any(n.startswith("host-bound") for n in quiet.notes)
    gpu = _gpu_s(layer_cost(QWEN, LayerKind.MOE, _pool(0.0), cfg, Recompute.NONE))
    us = 2.0 * gpu / 16 * 1e6  # host twice the GPU's work
    loud = predict_train(QWEN, _cluster(us), cfg, stages)
    [note] = [n for n in loud.notes if n.startswith("host-bound")]
    assert f"{16} local experts takes {2 * gpu * 1e3:.1f} ms" in note and f"wait {gpu * 1e3:.1f} ms" in note
    # every MoE layer waits the GPU's time again: 48 layers x 1 micro-batch
    assert loud.time.compute - quiet.time.compute == pytest.approx(48 * gpu, rel=1e-9)


def test_evaluate_reads_a_full_graph_launch_prices_it_and_launches_it_again():
    """A Megatron launch with a full-iteration CUDA graph is priced without the host floor, says so in its plan
    JSON, and the launch autoshard writes back keeps the graph (and the NaN check off, which Megatron asserts)."""
    import json
    import shlex

    from typer.testing import CliRunner

    from autoshard.cli import app

    cmd = ("torchrun --nproc-per-node 8 --nnodes 4 pretrain_gpt.py --num-layers 48 --hidden-size 2048 "
           "--ffn-hidden-size 6144 --num-attention-heads 32 --group-query-attention --num-query-groups 4 "
           "--kv-channels 128 --qk-layernorm --normalization RMSNorm --swiglu --position-embedding-type rope "
           "--untie-embeddings-and-output-weights --disable-bias-linear --seq-length 4096 "
           "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 256 --bf16 --num-experts 128 "
           "--moe-router-topk 8 --moe-ffn-hidden-size 768 --moe-grouped-gemm --expert-model-parallel-size 8 "
           "--moe-token-dispatcher-type alltoall --use-distributed-optimizer --vocab-size 151936")

    def evaluate(text):
        res = CliRunner().invoke(app, ["evaluate", "dgx-h100", "--from-megatron", text, "--json"])
        assert res.exit_code == 0, res.stderr
        return json.loads(res.stdout)

    eager, graphed = evaluate(cmd), evaluate(cmd + " --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad")
    assert eager["plan"]["full_cuda_graph"] is False and graphed["plan"]["full_cuda_graph"] is True
    # Qwen3-30B-A3B at EP 8 (16 local experts, 1 sequence per micro-batch) on H100 is host-bound: the graph saves
    assert graphed["predicted"]["step_time_s"] < eager["predicted"]["step_time_s"]
    assert any(n.startswith("host-bound") for n in eager["predicted"]["notes"]) and not any(
        n.startswith("host-bound") for n in graphed["predicted"]["notes"])
    words = shlex.split(graphed["launch"]["megatron"])
    assert words[words.index("--cuda-graph-impl") + 1] == "full_iteration" and "--no-check-for-nan-in-loss-and-grad" in words
    assert "--cuda-graph-impl" not in shlex.split(eager["launch"]["megatron"])
    assert parse_megatron(graphed["launch"]["megatron"]).full_cuda_graph


def test_a_host_bound_layer_has_no_traffic_left_to_hide():
    """With the EP all-to-all overlap the step takes ep_overlap_s off a paired micro-batch's layer: the floor
    keeps that layer at max(GPU - hidden, host) and the unpaired one at max(GPU, host)."""
    cfg = _cfg(moe_dispatcher=MoeDispatcher.FLEX, moe_a2a_overlap=True)
    free = layer_cost(QWEN, LayerKind.MOE, _pool(0.0), cfg, Recompute.NONE)
    t, hidden = free.time_s, free.ep_overlap_s
    assert 0 < hidden < t
    for host in (0.5 * (t - hidden), t - hidden / 2, 2 * t):  # below both, between, above both
        cost = layer_cost(QWEN, LayerKind.MOE, _pool(host / 16 * 1e6), cfg, Recompute.NONE)
        assert cost.time_s == pytest.approx(max(t, host), rel=1e-12)
        assert cost.time_s - cost.ep_overlap_s == pytest.approx(max(t - hidden, host), rel=1e-12)


def test_a_full_graph_scope_beside_transformer_engine_is_refused():
    """Megatron-Core asserts full_iteration is not combined with the transformer_engine implementation."""
    with pytest.raises(SpecError, match="--cuda-graph-impl full_iteration"):
        parse_megatron(BASE + " --cuda-graph-impl transformer_engine --cuda-graph-scope full_iteration")


@pytest.mark.parametrize(("recompute", "modules"), [
    (Recompute.FULL, ()), (Recompute.SELECTIVE, ("moe",)), (Recompute.SELECTIVE, ("core_attn",))])
def test_the_dp_window_does_not_move_with_recompute(recompute, modules):
    """fwd_bwd_compute_s (the window that hides DP traffic) holds the wait of the layer without recompute in
    every recompute mode, as the solver's tables read it (one window per layer kind): only the step time
    takes the recompute's extra host time."""
    for us in (0.0, 1000.0, 5000.0):
        plain = layer_cost(QWEN, LayerKind.MOE, _pool(us), _cfg(), Recompute.NONE)
        other = layer_cost(QWEN, LayerKind.MOE, _pool(us), _cfg(recompute=recompute, recompute_modules=modules),
                           recompute)
        assert other.fwd_bwd_compute_s == pytest.approx(plain.fwd_bwd_compute_s, rel=1e-12)


def test_an_mtp_module_waits_as_long_as_a_moe_layer_for_the_host():
    """DeepSeek-V3's MTP module runs one MoE decoder layer (plus its 2h -> h projection, so its GPU work is the
    layer's x its active-parameter ratio) with the same local experts: the host takes as long to issue it as any
    MoE layer, so its wait is the host time less the scaled GPU work (it was the layer's wait x the ratio)."""
    from autoshard.costmodel.train.layer import _gpu_layer_cost

    dsv3 = load_model("deepseek-v3")  # 256 experts: 32 local at EP 8, one MTP module
    cfg = _cfg(ep=8)
    active = (dsv3.mtp_module_params(active_only=True)
              / dsv3.layer_params(dsv3.mtp_layer_kind, active_only=True))
    assert 1.05 < active < 1.3
    gpu = _gpu_layer_cost(dsv3, LayerKind.MOE, _pool(0.0), cfg, Recompute.NONE)
    scaled = gpu.time_s + (active - 1) * gpu.compute_s
    us = 1.5 * scaled / 32 * 1e6  # the host 1.5x the MTP layer's GPU work
    base = layer_cost(dsv3, LayerKind.OUTPUT, _pool(0.0), cfg, Recompute.NONE)
    floored = layer_cost(dsv3, LayerKind.OUTPUT, _pool(us), cfg, Recompute.NONE)
    assert floored.compute_s - base.compute_s == pytest.approx(us * 1e-6 * 32 - scaled, rel=1e-9)
    assert floored.tp_comm_s == base.tp_comm_s and floored.ep_comm_s == base.ep_comm_s


def test_the_host_bound_note_reads_every_pool_the_stages_run_on():
    """On a cluster of two GPU types the note gives the pool whose MoE layers wait longest, named; a plan on
    one pool keeps the unnamed note (its stage 0's pool was the only one read before)."""
    from autoshard.costmodel.train.notes import host_bound_note

    a100 = load_cluster("dgx-a100-80gb").pools[0]
    eff = a100.gpu.efficiency.model_copy(update={"train_expert_host_us": 2000.0})
    a100 = a100.model_copy(update={"gpu": a100.gpu.model_copy(update={"efficiency": eff})})
    cfg = _cfg(ep=8)
    assert host_bound_note(QWEN, [_pool(0.0)], cfg) is None
    note = host_bound_note(QWEN, [_pool(0.0), a100], cfg)
    assert note is not None
    assert note.startswith("host-bound MoE layers on A100-SXM4-80GB: issuing a layer's 16 local")
    assert "(2000 us each" in note
    single = host_bound_note(QWEN, [_pool(2000.0)], cfg)
    assert single is not None and single.startswith("host-bound MoE layers: issuing")


def test_only_stages_that_run_routed_experts_count_for_the_note():
    """DeepSeek-V3's embedding and three dense layers run no routed experts; a stage with a MoE layer does, and
    so does the output stage, whose MTP module is a MoE layer; a dense model's stages never do."""
    from autoshard.costmodel.train.notes import moe_stage
    from autoshard.costmodel.train.types import Stage

    dsv3 = load_model("deepseek-v3")  # embedding, 3 dense, 58 MoE, output (+ 1 MTP module)
    n = len(dsv3.layer_kinds)
    assert dsv3.layer_kinds[:5] == (LayerKind.EMBEDDING, LayerKind.DENSE, LayerKind.DENSE, LayerKind.DENSE,
                                    LayerKind.MOE)
    assert not moe_stage(dsv3, Stage(0, 4))
    assert moe_stage(dsv3, Stage(0, 5)) and moe_stage(dsv3, Stage(n - 1, n))
    llama = load_model("llama-3.1-70b")
    assert not moe_stage(llama, Stage(0, len(llama.layer_kinds)))


@pytest.mark.parametrize("recompute", [Recompute.FULL, Recompute.SELECTIVE])
def test_an_mtp_modules_dp_window_does_not_move_with_recompute(recompute):
    """The window that hides DP traffic takes the wait of the layer without recompute, an MTP module's at its
    scaled GPU work too (a review found them a quarter apart under full recompute before)."""
    dsv3 = load_model("deepseek-v3")
    cfg, plain_cfg = _cfg(ep=8, recompute=recompute), _cfg(ep=8)
    us = 3000.0  # 96 ms of host time a layer (the MTP module's GPU work ~50 ms): binds with and without recompute
    window = {}
    for c, r in ((plain_cfg, Recompute.NONE), (cfg, recompute)):
        base = layer_cost(dsv3, LayerKind.OUTPUT, _pool(0.0), c, r)
        floored = layer_cost(dsv3, LayerKind.OUTPUT, _pool(us), c, r)
        window[r] = floored.fwd_bwd_compute_s - base.fwd_bwd_compute_s
    assert window[Recompute.NONE] > 0.01
    assert window[recompute] == pytest.approx(window[Recompute.NONE], rel=1e-9)
