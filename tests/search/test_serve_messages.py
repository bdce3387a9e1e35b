"""The serving infeasible message's "nearest fix" only suggests what the launchers can run: int4 only
where a published int4 checkpoint is listed (vLLM and SGLang quantize online only to fp8), and a GPU
count an engine can use (a power of two below a node, whole 8-GPU nodes past one)."""

from __future__ import annotations

import pytest

from autoshard.api import solve_serve
from autoshard.errors import InfeasibleError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

H100 = load_cluster("dgx-h100")


def _message(model: str, gpus: int) -> str:
    with pytest.raises(InfeasibleError) as err:
        solve_serve(load_model(model), H100.with_gpus(gpus), ServeJob(), pins=None, top_k=1, time_limit_s=10,
                    num_workers=1, seed=0)
    return str(err.value)


def test_int4_is_suggested_only_with_a_published_int4_checkpoint() -> None:
    qwen = _message("qwen3-235b-a22b", 2)  # Qwen/Qwen3-235B-A22B-GPTQ-Int4 is listed
    assert "quantize the weights to int4 (115 GiB, Qwen/Qwen3-235B-A22B-GPTQ-Int4)" in qwen
    llama = _message("llama-3.1-70b", 1)  # only an FP8 checkpoint is listed: no int4 to load
    assert "int4" not in llama


def test_fp8_names_the_listed_checkpoint() -> None:
    assert "quantize the weights to fp8 (382 GiB, nvidia/Llama-3.1-405B-Instruct-FP8)" in _message("llama-3.1-405b", 8)


@pytest.mark.parametrize(("model", "gpus", "count"), [
    ("llama-3.1-405b", 1, 16),  # 13 GPUs of weights: two nodes, not "--gpus 13" on a one-GPU node
    ("llama-3.1-405b", 2, 16),  # not 14
    ("llama-3.1-70b", 1, 4),    # not 3
    ("llama-3.1-405b", 8, 16),
])
def test_the_gpu_count_is_one_an_engine_can_use(model: str, gpus: int, count: int) -> None:
    assert f"use at least {count} GPUs (--gpus {count})" in _message(model, gpus)
