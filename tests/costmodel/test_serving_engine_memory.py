"""Engine memory outside weights, activations and KV cache: a one-GPU engine creates no NCCL
communicator, NVSwitch Hopper/Blackwell groups of more than 2 GPUs hold NCCL's NVLS buffers
(`engine_reserved_bytes`, `nvls_bytes`), closed forms."""

from __future__ import annotations

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import (
    NCCL_COMMUNICATOR_BYTES,
    NON_TORCH_BYTES,
    NVLS_BYTES_PER_RANK,
    engine_reserved_bytes,
    nvls_bytes,
    serve_memory,
)
from autoshard.specs import load_cluster, load_model
from autoshard.units import GIB

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
    one = serve_memory(model, H100, ServeConfig(tp=1), context_len=2048)
    two = serve_memory(model, H100, ServeConfig(tp=2), context_len=2048)
    assert one.non_torch_bytes == 0.0
    assert two.non_torch_bytes == NON_TORCH_BYTES


def test_seventy_b_on_one_h100_gains_the_communicator_in_kv_cache():
    # TensorRT-LLM sizes the KV cache as 0.95 of what is left after loading: Llama-3.1-70B FP8 on one
    # H100 (79.6 GiB) keeps 1.5 GiB more free memory than the same GPU in a TP engine would, i.e.
    # 0.95 x 1.5 = 1.425 GiB more KV cache.
    left_tp1 = H100.hbm_gib * GIB - engine_reserved_bytes(H100_POOL, gpus=1)
    left_tp2 = H100.hbm_gib * GIB - engine_reserved_bytes(H100_POOL, gpus=2)
    assert 0.95 * (left_tp1 - left_tp2) / GIB == pytest.approx(1.425)
