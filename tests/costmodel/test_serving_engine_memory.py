"""Engine memory outside weights, activations and KV cache: a one-GPU engine creates no NCCL
communicator (`engine_reserved_bytes`), closed forms."""

from __future__ import annotations

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import (
    NCCL_COMMUNICATOR_BYTES,
    NON_TORCH_BYTES,
    engine_reserved_bytes,
    serve_memory,
)
from autoshard.specs import load_cluster, load_model
from autoshard.units import GIB

H100 = load_cluster("dgx-h100").primary.gpu
A100 = load_cluster("dgx-a100-80gb").primary.gpu


def test_communicator_figure_is_the_measured_one():
    # NVIDIA/nccl issue #864: "about 1.6GB" for one communicator after an all-reduce
    assert NCCL_COMMUNICATOR_BYTES == 1.5 * GIB
    assert NCCL_COMMUNICATOR_BYTES / 1.6e9 == pytest.approx(1.0, abs=0.01)  # 1.5 GiB = 1.61 GB


@pytest.mark.parametrize("gpus", [2, 4, 8, 16])
def test_multi_gpu_engines_keep_the_gpu_types_reserve(gpus):
    assert engine_reserved_bytes(H100, gpus=gpus) == H100.efficiency.reserved_memory_gib * GIB == 4.0 * GIB


@pytest.mark.parametrize("gpu", [H100, A100])
def test_one_gpu_engine_holds_no_communicator(gpu):
    reserved = gpu.efficiency.reserved_memory_gib * GIB
    assert engine_reserved_bytes(gpu, gpus=1) == reserved - 1.5 * GIB
    assert engine_reserved_bytes(gpu, gpus=2) - engine_reserved_bytes(gpu, gpus=1) == 1.5 * GIB


def test_reserve_never_negative():
    tiny = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(update={"reserved_memory_gib": 1.0})})
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
    left_tp1 = H100.hbm_gib * GIB - engine_reserved_bytes(H100, gpus=1)
    left_tp2 = H100.hbm_gib * GIB - engine_reserved_bytes(H100, gpus=2)
    assert 0.95 * (left_tp1 - left_tp2) / GIB == pytest.approx(1.425)
