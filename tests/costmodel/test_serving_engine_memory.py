"""Engine memory outside weights, activations and KV cache: a one-GPU engine creates no NCCL
communicator, NVSwitch Hopper/Blackwell groups of more than 2 GPUs hold NCCL's NVLS buffers
(`engine_reserved_bytes`, `nvls_bytes`), and vLLM's accounting keeps the same NVLS buffers (every
communicator that runs collectives) in the headroom outside gpu_memory_utilization, refusing engines
whose headroom cannot hold them (`startup_comm_bytes`: the product path of `solve --mode serve`,
disaggregated instances and `evaluate --from-vllm`), closed forms."""

from __future__ import annotations

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.comm_memory import (
    NCCL_COMMUNICATOR_BYTES,
    NON_TORCH_BYTES,
    NVLS_BYTES_PER_RANK,
    engine_comm_bytes,
    engine_nvls_bytes,
    engine_reserved_bytes,
    nvls_bytes,
    nvls_group_ranks,
    startup_comm_bytes,
)
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.predict import predict_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.units import GIB, MIB

H100_POOL = load_cluster("dgx-h100").primary
A100_POOL = load_cluster("dgx-a100-80gb").primary
H100 = H100_POOL.gpu
A100 = A100_POOL.gpu


def test_communicator_figure_is_the_measured_one():
    # NVIDIA/nccl issue #864: "about 1.6GB" for one communicator after an all-reduce
    assert NCCL_COMMUNICATOR_BYTES == 1.5 * GIB
    assert NCCL_COMMUNICATOR_BYTES / 1.6e9 == pytest.approx(1.0, abs=0.01)  # 1.5 GiB = 1.61 GB


def test_nvls_figure_is_nccls_logged_one():
    # NCCL on 8 H200 (vllm-project/vllm #9699): "nHeads 8 buffSize 4194304 memSize 2097152
    # nvlsPerRankSize 301989888 nvlsTotalSize 2415919104": two (buffSize + memSize) per channel,
    # 24 channels, per rank; the total is per rank x heads
    mib = 1024 * 1024
    assert NVLS_BYTES_PER_RANK == 24 * 2 * (4 * mib + 2 * mib) == 288 * mib
    assert nvls_bytes(H100_POOL, ranks=8) == 2415919104 == 2.25 * GIB


@pytest.mark.parametrize("ranks, nvls", [(1, 0.0), (2, 0.0), (3, 0.84375), (4, 1.125), (8, 2.25), (16, 2.25)])
def test_nvls_grows_with_the_ranks_inside_one_nvlink_domain(ranks, nvls):
    # more than 2 ranks; a group wider than the 8-GPU domain holds one domain's heads
    assert nvls_bytes(H100_POOL, ranks=ranks) == pytest.approx(nvls * GIB)


@pytest.mark.parametrize("cluster", ["dgx-a100-80gb", "l40s-pcie", "h100-pcie", "mi300x"])
def test_no_nvls_without_nvswitch_hopper(cluster):
    assert nvls_bytes(load_cluster(cluster).primary, ranks=8) == 0.0


@pytest.mark.parametrize("cluster", ["dgx-h200", "dgx-b200"])
def test_nvls_on_later_nvswitch_nodes(cluster):
    assert nvls_bytes(load_cluster(cluster).primary, ranks=4) == 4 * NVLS_BYTES_PER_RANK


@pytest.mark.parametrize("gpus, extra", [(2, 0.0), (4, 1.125), (8, 2.25)])
def test_multi_gpu_engines_keep_the_reserve_plus_nvls(gpus, extra):
    reserved = H100.efficiency.reserved_memory_gib
    assert reserved == 4.0
    assert engine_reserved_bytes(H100_POOL, gpus=gpus) == pytest.approx((reserved + extra) * GIB)
    assert engine_reserved_bytes(A100_POOL, gpus=gpus) == A100.efficiency.reserved_memory_gib * GIB


@pytest.mark.parametrize("pool", [H100_POOL, A100_POOL])
def test_one_gpu_engine_holds_no_communicator(pool):
    reserved = pool.gpu.efficiency.reserved_memory_gib * GIB
    assert engine_reserved_bytes(pool, gpus=1) == reserved - 1.5 * GIB
    assert engine_reserved_bytes(pool, gpus=2) - engine_reserved_bytes(pool, gpus=1) == 1.5 * GIB


def test_reserve_never_negative():
    eff = H100.efficiency.model_copy(update={"reserved_memory_gib": 1.0})
    tiny = H100_POOL.model_copy(update={"gpu": H100.model_copy(update={"efficiency": eff})})
    assert engine_reserved_bytes(tiny, gpus=1) == 0.0
    assert engine_reserved_bytes(tiny, gpus=2) == 1.0 * GIB


def test_vllm_accounting_draws_the_same_line():
    # vLLM charges its communicators ("non-torch memory") on multi-GPU engines only
    model = load_model("llama-3.1-8b")
    one = serve_memory(model, H100_POOL, ServeConfig(tp=1), context_len=2048)
    two = serve_memory(model, H100_POOL, ServeConfig(tp=2), context_len=2048)
    assert one.non_torch_bytes == 0.0
    assert two.non_torch_bytes == NON_TORCH_BYTES == 256 * MIB


H200_POOL = load_cluster("dgx-h200").primary
H100_X16 = load_cluster("dgx-h100").with_gpus(16).primary


@pytest.mark.parametrize(
    "cfg, groups",
    [
        (ServeConfig(tp=8), (8,)),
        (ServeConfig(tp=2, pp=4), (2,)),  # the PP group only sends and receives
        (ServeConfig(tp=8, expert_parallel=True), (8,)),  # EP over the TP group: one communicator
        (ServeConfig(tp=1, dp_attention=8, expert_parallel=True), (1, 8)),  # all-gather/reduce-scatter on DP
        (ServeConfig(tp=2, dp_attention=4, expert_parallel=True), (2, 4)),
    ],
)
def test_communicators_that_run_collectives(cfg, groups):
    assert nvls_group_ranks(cfg) == groups


# (pool, config, MiB per GPU of NVLS buffers): 288 MiB per rank of every communicator of more than 2
# ranks on NVSwitch Hopper and later (at most one node's ranks); the start-up floor adds one
# communicator (1.5 GiB) on any multi-GPU engine
@pytest.mark.parametrize(
    "pool, cfg, mib",
    [
        (H100_POOL, ServeConfig(tp=1), 0),
        (H100_POOL, ServeConfig(tp=2), 0),
        (H100_POOL, ServeConfig(tp=4), 4 * 288),  # 1.125 GiB
        (H100_POOL, ServeConfig(tp=8), 8 * 288),  # 2.25 GiB
        (H100_POOL, ServeConfig(tp=2, pp=4), 0),
        (H100_POOL, ServeConfig(tp=8, nccl_nvls=False), 0),  # NCCL_NVLS_ENABLE=0 (SGLang's default)
        (A100_POOL, ServeConfig(tp=8), 0),  # no NVLS before Hopper
        (load_cluster("h100-pcie").primary, ServeConfig(tp=4), 0),  # nor without NVSwitch
        (H200_POOL, ServeConfig(tp=1, dp_attention=8, expert_parallel=True), 8 * 288),
        (H200_POOL, ServeConfig(tp=2, dp_attention=4, expert_parallel=True), 4 * 288),
        (H100_X16, ServeConfig(tp=4, dp_attention=4, expert_parallel=True), 4 * 288 + 4 * 288),
        (H100_X16, ServeConfig(tp=1, dp_attention=16, expert_parallel=True), 8 * 288),  # 8 per node
    ],
)
def test_nvls_and_startup_closed_forms(pool, cfg, mib):
    assert engine_nvls_bytes(pool, cfg) == mib * MIB
    assert startup_comm_bytes(pool, cfg) == (0.0 if cfg.gpus == 1 else 1536 * MIB + mib * MIB)
    # what the profile charges does not depend on NVLS
    assert engine_comm_bytes(pool, cfg) == (0.0 if cfg.gpus == 1 else NON_TORCH_BYTES)


def test_no_node_no_nvls():
    # a bare GPU type knows no NVSwitch: one communicator only
    assert engine_nvls_bytes(None, ServeConfig(tp=8)) == 0.0
    assert startup_comm_bytes(None, ServeConfig(tp=8)) == NCCL_COMMUNICATOR_BYTES


def test_trtllm_reserve_and_vllm_startup_count_the_same_nvls():
    for gpus in (2, 4, 8):
        cfg = ServeConfig(tp=gpus)
        reserve_nvls = engine_reserved_bytes(H100_POOL, gpus=gpus) - H100.efficiency.reserved_memory_gib * GIB
        assert startup_comm_bytes(H100_POOL, cfg) - NCCL_COMMUNICATOR_BYTES == reserve_nvls
        assert reserve_nvls == nvls_bytes(H100_POOL, ranks=gpus)


def test_nvls_stays_outside_vllms_kv_budget():
    # vLLM >= 0.11 snapshots free memory after NCCL's initialization (vllm PR #25359): the NVLS buffers
    # sit in the 1 - gpu_memory_utilization headroom, so Llama-3.1-70B TP8 keeps its KV cache
    model = load_model("llama-3.1-70b")
    cfg = ServeConfig(tp=8)
    bare = serve_memory(model, H100, cfg, context_len=2000)
    placed = serve_memory(model, H100_POOL, cfg, context_len=2000)
    assert placed.kv_cache_bytes == bare.kv_cache_bytes
    assert placed.non_torch_bytes == NON_TORCH_BYTES
    assert placed.nvls_bytes == 2.25 * GIB and bare.nvls_bytes == 0.0
    assert placed.startup_bytes == 3.75 * GIB and bare.startup_bytes == 1.5 * GIB
    # 0.90 x 79.6 GiB leaves 7.96 GiB outside the budget: room for them
    assert placed.headroom_bytes == pytest.approx(0.1 * H100.hbm_gib * GIB)
    assert placed.fits and placed.problem() is None


@pytest.mark.parametrize("util, starts", [(0.90, True), (0.95, True), (0.96, False), (0.98, False)])
def test_vllm_refuses_to_start_when_the_headroom_cannot_hold_nccl(util, starts):
    # H100 TP8: 3.75 GiB of NCCL before the snapshot; (1 - util) x 79.6 GiB = 3.98 GiB at 0.95, 3.18 at 0.96
    model = load_model("llama-3.1-70b")
    mem = serve_memory(model, H100_POOL, ServeConfig(tp=8, gpu_memory_utilization=util), context_len=2000)
    assert mem.fits is starts
    if not starts:
        problem = mem.problem()
        assert "need at least 3.75 GiB" in problem and "gpu_memory_utilization <= 0.95" in problem


def test_one_gpu_engine_is_unchanged():
    model = load_model("llama-3.1-8b")
    mem = serve_memory(model, H100_POOL, ServeConfig(tp=1, gpu_memory_utilization=0.99), context_len=2000)
    assert mem == serve_memory(model, H100, ServeConfig(tp=1, gpu_memory_utilization=0.99), context_len=2000)
    assert mem.startup_bytes == 0.0 and mem.fits  # no communicator: 0.99 starts


def test_product_path_refuses_what_vllm_refuses():
    # predict_serve (solve --mode serve, evaluate --from-vllm) raises the start-up problem
    from autoshard.errors import InfeasibleError

    model = load_model("llama-3.1-70b")
    job = ServeJob(input_len=1000, output_len=1000)
    assert predict_serve(model, H100_POOL, job, ServeConfig(tp=8, gpu_memory_utilization=0.95)).memory.fits
    with pytest.raises(InfeasibleError, match="NCCL's communicators"):
        predict_serve(model, H100_POOL, job, ServeConfig(tp=8, gpu_memory_utilization=0.97))
    # with NVLS off (SGLang's default) one communicator (1.5 GiB) fits in 0.03 x 79.6 = 2.39 GiB
    assert predict_serve(model, H100_POOL, job, ServeConfig(tp=8, gpu_memory_utilization=0.97,
                                                            nccl_nvls=False)).memory.fits


def test_deepseek_decode_instance_counts_its_dp_group():
    # DeepSeek-V3 FP8, TP1 x DP8 with experts over all 8 H200: the DP communicator (all-gather
    # dispatch, reduce-scatter combine) holds 8 x 288 MiB of NVLS buffers
    model = load_model("deepseek-v3")
    cfg = ServeConfig(tp=1, dp_attention=8, expert_parallel=True, weight_dtype=WeightDtype.FP8)
    placed = serve_memory(model, H200_POOL, cfg, context_len=2000)
    assert placed.nvls_bytes == 2.25 * GIB
    assert placed.kv_cache_bytes == serve_memory(model, H200_POOL.gpu, cfg, context_len=2000).kv_cache_bytes


def test_seventy_b_on_one_h100_gains_the_communicator_in_kv_cache():
    # TensorRT-LLM sizes the KV cache as 0.95 of what is left after loading: Llama-3.1-70B FP8 on one
    # H100 (79.6 GiB) keeps 1.5 GiB more free memory than the same GPU in a TP engine would, i.e.
    # 0.95 x 1.5 = 1.425 GiB more KV cache.
    left_tp1 = H100.hbm_gib * GIB - engine_reserved_bytes(H100_POOL, gpus=1)
    left_tp2 = H100.hbm_gib * GIB - engine_reserved_bytes(H100_POOL, gpus=2)
    assert 0.95 * (left_tp1 - left_tp2) / GIB == pytest.approx(1.425)


@pytest.mark.parametrize(
    "command, nvls",
    [
        ("vllm serve meta-llama/Llama-3.1-70B -tp 8", True),  # vLLM leaves NCCL's default
        ("NCCL_NVLS_ENABLE=0 vllm serve meta-llama/Llama-3.1-70B -tp 8", False),
        ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B --tp-size 8", False),
        ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B --tp-size 8 --enable-nccl-nvls", True),
        ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B --tp-size 8 --enable-symm-mem", True),
        # SGLang overrides the variable with its own flag
        ("NCCL_NVLS_ENABLE=1 python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B --tp 8", False),
    ],
)
def test_launch_lines_say_whether_nccl_runs_nvls(command, nvls):
    from autoshard.emit.sglang.parse import parse_sglang
    from autoshard.emit.vllm.parse import parse_vllm

    parse = parse_sglang if "sglang" in command else parse_vllm
    assert parse(command).nccl_nvls is nvls


def test_evaluate_reads_nvls_from_the_launch_line():
    from autoshard.api import evaluate_vllm

    model = load_model("llama-3.1-70b")
    cluster = load_cluster("dgx-h100")
    job = ServeJob(input_len=1000, output_len=1000)
    vllm = evaluate_vllm(model, cluster, "vllm serve meta-llama/Llama-3.1-70B -tp 8", job=job)
    off = evaluate_vllm(model, cluster, "NCCL_NVLS_ENABLE=0 vllm serve meta-llama/Llama-3.1-70B -tp 8", job=job)
    sglang = evaluate_vllm(model, cluster, "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B "
                           "--tp-size 8 --mem-fraction-static 0.9", job=job, sglang=True)
    assert vllm.prediction.memory.nvls_bytes == 2.25 * GIB
    assert off.prediction.memory.nvls_bytes == sglang.prediction.memory.nvls_bytes == 0.0
    assert vllm.prediction.memory.kv_cache_bytes == off.prediction.memory.kv_cache_bytes


def test_startup_floor_is_below_the_measured_nccl_initialization():
    # vllm-project/vllm PR #25359: an 80 GB GPU saw 78.59 GiB free before NCCL's initialization and
    # 74.07 GiB after it ("NCCL buffers (~4.5 GiB for tensor parallelism)"). The start-up check is a
    # floor, so it must not exceed that for any H100 engine, NVLS included, or it would refuse engines
    # vLLM starts.
    measured = (78.59 - 74.07) * GIB
    for tp in (2, 4, 8):
        floor = startup_comm_bytes(H100_POOL, ServeConfig(tp=tp))
        assert floor <= measured
    assert measured - startup_comm_bytes(H100_POOL, ServeConfig(tp=8)) == pytest.approx(0.77 * GIB)


def test_one_communicator_floor_is_below_vllms_logged_tp2_increase():
    # vllm-project/vllm PR #10511 (vLLM 0.6.5, snapshot taken before NCCL existed), H100, Llama-3-8B:
    # "non_torch_memory 1.79GiB" at TP1 and "3.58GiB" at -tp 2, i.e. 1.79 GiB of communicators and
    # custom all-reduce buffers on a 2-GPU engine (no NVLS at 2 ranks); the floor is one communicator
    logged = (3.58 - 1.79) * GIB
    floor = startup_comm_bytes(H100_POOL, ServeConfig(tp=2))
    assert floor == NCCL_COMMUNICATOR_BYTES <= logged
    assert logged / floor == pytest.approx(1.19, abs=0.01)


def test_startup_floor_counts_one_node_of_a_multi_node_nvlink_domain():
    # GB200 NVL72: 4 GPUs per tray in a 72-GPU NVLink domain, of which the bundled cluster fills 64 in a
    # multi-rack job. NVLS over the domain is reported by `engine_nvls_bytes` (64 x 288 MiB at DP 72: at
    # most the ranks one rack holds), but the start-up floor counts only one tray's ranks (4 x 288 MiB),
    # so no engine is refused on an unmeasured figure.
    pool = load_cluster("gb200-nvl72").primary
    cfg = ServeConfig(tp=1, dp_attention=72, expert_parallel=True)
    assert engine_nvls_bytes(pool, cfg) == 64 * 288 * MIB
    assert startup_comm_bytes(pool, cfg) == 1536 * MIB + 4 * 288 * MIB
