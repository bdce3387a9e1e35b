"""Whole-block KV reservation at admission (`ServeConfig.kv_block_tokens`): TensorRT-LLM's
guaranteed-no-evict scheduler reserves ceil((ISL + OSL) / tokens_per_block) blocks per request (64
tokens in the validation harness), its pool holds whole blocks. Unset (None), the engine's own block
applies (`serve.engine_defaults.kv_block_tokens`): vLLM's 16 tokens for Llama (a request at its end
holds whole blocks too), SGLang's page of 1 on Hopper (the tokens themselves)."""

from __future__ import annotations

import math

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.predict import kv_limited_concurrency, predict_serve, request_kv_tokens
from autoshard.costmodel.serve.sim import simulate_burst
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token_per_gpu
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.units import GIB

LLAMA8 = load_model("llama-3.1-8b")
POOL = load_cluster("dgx-h100").with_gpus(1).primary
FP8 = WeightDtype.FP8


def _memory(block: int | None, kv_gib: float, job: ServeJob):
    cfg = ServeConfig(
        weight_dtype=FP8, kv_cache_dtype=FP8, kv_cache_memory_bytes=kv_gib * GIB, kv_block_tokens=block,
        max_num_seqs=4096,
    )
    return cfg, serve_memory(LLAMA8, POOL, cfg, context_len=job.context_len)


@pytest.mark.parametrize(
    ("tokens", "block", "reserved"),
    [
        (2500, 64, 2560),  # 500/2000: 39.06 blocks -> 40
        (2000, 64, 2048),  # 1000/1000: 31.25 -> 32
        (4096, 64, 4096),  # 2048/2048: exactly 64 blocks
        (4224, 64, 4224),  # 128/4096: exactly 66
        (723, 64, 768),  # the online table's 467/256
        (2500, None, 2512),  # vLLM: 157 blocks of 16 (FLASH_ATTN's default 16-token block)
        (2000, None, 2000),  # 125 blocks of 16
    ],
)
def test_a_request_reserves_whole_blocks(tokens, block, reserved):
    job = ServeJob(input_len=tokens // 2, output_len=tokens - tokens // 2)
    _, mem = _memory(block, 10.0, job)
    assert request_kv_tokens(mem, tokens) == reserved


def test_sglang_pages_are_single_tokens_on_hopper():
    """SGLang 0.5.23 defaults --page-size to 1 (srt/arg_groups/overrides.py:1342-1363) under fa3 on Hopper."""
    job = ServeJob(input_len=1250, output_len=1250)
    cfg = ServeConfig(weight_dtype=FP8, kv_cache_dtype=FP8, kv_cache_memory_bytes=10.0 * GIB, engine="sglang")
    mem = serve_memory(LLAMA8, POOL, cfg, context_len=job.context_len)
    assert mem.kv_block_tokens == 1 and request_kv_tokens(mem, 2500) == 2500 and mem.kv_cache_tokens == 163_840


def test_the_pool_holds_whole_blocks_and_concurrency_counts_blocks():
    """Llama 3.1 8B, FP8 cache: 32 layers x 8 KV heads x 128 x 2 x 1 B = 65,536 B a token, so 10 GiB
    hold 163,840 tokens = 2,560 blocks of 64; a 500/2000 request takes 40 of them: 64 requests,
    where vLLM's 16-token blocks give 65 (10,240 blocks // 157)."""
    job = ServeJob(input_len=500, output_len=2000, weight_dtype=FP8, kv_cache_dtype=FP8)
    assert kv_cache_bytes_per_token_per_gpu(LLAMA8, tp=1, layers=32, dtype=FP8) == 65_536
    _, blocks = _memory(64, 10.0, job)
    _, tokens = _memory(None, 10.0, job)
    assert blocks.kv_cache_tokens == 163_840 and blocks.kv_cache_tokens % 64 == 0
    assert kv_limited_concurrency(blocks, job) == 2_560 // 40 == 64
    assert kv_limited_concurrency(tokens, job) == 10_240 // 157 == 65


def test_a_pool_that_is_not_whole_blocks_rounds_down():
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8, kv_cache_dtype=FP8)
    _, mem = _memory(64, 10.0 + 100 * 65_536 / GIB, job)  # 163,940 tokens' worth: 2,561 blocks + 36 tokens
    assert mem.kv_cache_tokens == 2_561 * 64
    assert kv_limited_concurrency(mem, job) == math.floor(2_561 / 32) == 80


def test_the_replay_admits_what_the_blocks_allow():
    """The burst replay reserves the same whole blocks: a 500/2000 burst on a 64-request pool runs
    at most 64 requests at once, as `predict_serve` does."""
    job = ServeJob(input_len=500, output_len=20, weight_dtype=FP8, kv_cache_dtype=FP8)
    cfg, mem = _memory(64, 64 * 576 * 65_536 / GIB, job)  # 520 tokens -> 9 blocks = 576 tokens each
    assert mem.kv_cache_tokens == 64 * 576
    assert predict_serve(LLAMA8, POOL, job, cfg).concurrency == 64
    assert simulate_burst(LLAMA8, POOL, job, cfg, requests=200).max_running == 64
    plain = ServeConfig(
        weight_dtype=FP8, kv_cache_dtype=FP8, kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
        max_num_seqs=4096,
    )
    # vLLM's 16-token blocks: 520 tokens are 33 blocks, 2,304 blocks hold 69 such requests (70 counting tokens)
    assert simulate_burst(LLAMA8, POOL, job, plain, requests=200).max_running == 64 * 576 // 16 // 33 == 69


@pytest.mark.parametrize("bad", [0, -64, 1.5, "64"])
def test_a_block_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="kv_block_tokens"):
        ServeConfig(kv_block_tokens=bad)
