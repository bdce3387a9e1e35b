"""The KV cache of sliding-window layers as vLLM 0.33.0 and SGLang 0.5.23 allocate it (`serve.kv_window`), in
closed form: Gemma-3-27B (10 full + 52 sliding layers of window 1,024; 16 KV heads x 128) and Mistral-7B-v0.1
(32 layers of window 4,096; 8 KV heads x 128), at 32k and 4k tokens, on one H100 (TP1, 16-token blocks,
max_num_batched_tokens 8,192, async scheduling: 2 x 8,192 tokens in flight)."""

from __future__ import annotations


import pytest

from autoshard.costmodel.serve.attention import _decode_attention_s
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.kv_window import (KVLayout, engine_stage_layouts, stage_windows, vllm_global_groups,
                                                 vllm_kv_groups)
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.predict import kv_limited_concurrency
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token_per_gpu
from autoshard.specs import load_cluster
from conftest import hf_fixture
from autoshard.specs.job import ServeJob, WeightDtype

H100 = load_cluster("dgx-h100").with_gpus(8).primary


def _hf(name: str):
    return hf_fixture(name)


GEMMA = _hf("gemma-3-27b")
MISTRAL = _hf("mistral-7b-v0.1")
FULL_MISTRAL = MISTRAL.model_copy(update={"layers": tuple(
    g.model_copy(update={"attention_window": None}) for g in MISTRAL.layers)})
IN_FLIGHT = 2 * 8192  # (PP + 1) x max_num_batched_tokens


def test_gemma3_groups_as_vllm_builds_them() -> None:
    # 52 sliding : 10 full -> groups of 10 layers: 1 full, ceil(52 / 10) = 6 sliding (8 padding layers)
    assert GEMMA.decoder_windows.count(None) == 10 and GEMMA.decoder_windows.count(1024) == 52
    assert vllm_kv_groups(GEMMA.decoder_windows) == ((None,) + (1024,) * 6, 10)
    # near-equal buckets take the larger as the group size (gpt-oss-20b + eagle: 12 sw + 13 full -> 13)
    assert vllm_kv_groups([128] * 12 + [None] * 13) == ((None, 128), 13)
    assert vllm_kv_groups([4096] * 32) == ((4096,), 32)


@pytest.mark.parametrize(("model", "tokens", "blocks_startup", "blocks_admit"), [
    # Gemma-3-27B: full group cdiv(L, 16); sliding cap cdiv(min(1023 + 16384, L), 16) + 1
    (GEMMA, 32768, 2048 + 6 * 1089, 2048 + 6 * 1089),
    (GEMMA, 4096, 256 + 6 * 257, 7 * 256),  # at 4k the cap exceeds the request: no saving, 8 padding layers cost
    # Mistral-7B-v0.1: cdiv(min(4095 + 16384, L), 16) + 1
    (MISTRAL, 32768, 1281, 1281),
    (MISTRAL, 4096, 257, 256),
])
def test_blocks_per_request(model, tokens, blocks_startup, blocks_admit) -> None:
    (layout,) = engine_stage_layouts([model.decoder_windows], engine="vllm", block=16, in_flight=IN_FLIGHT,
                                     max_model_len=tokens)
    assert sum(layout.group_blocks(w, tokens, startup=True) for w in layout.groups) == blocks_startup
    assert sum(layout.group_blocks(w, tokens) for w in layout.groups) == blocks_admit


def test_kv_bytes_per_request_at_32k_against_full_attention() -> None:
    page = 16 * 2 * 16 * 128 * 2  # Gemma-3-27B, TP1: 16 tokens x K and V x 16 heads x 128 x BF16 = 128 KiB
    (layout,) = engine_stage_layouts([GEMMA.decoder_windows], engine="vllm", block=16, in_flight=IN_FLIGHT,
                                     max_model_len=32768)
    held = sum(layout.group_blocks(w, 32768) for w in layout.groups) * layout.group_layers * page
    assert held == 8582 * 10 * 131072 == 11_248_599_040  # 10.5 GiB
    full = 62 * 32768 * kv_cache_bytes_per_token_per_gpu(GEMMA, tp=1, layers=1, dtype=WeightDtype.BF16)
    assert full == 16_642_998_272  # 15.5 GiB: what every layer holding every token would take
    assert held / full == pytest.approx(0.6759, abs=1e-4)
    # the window alone (10 x 32,768 + 52 x 1,024 tokens) would be 2.9 GiB, 0.1875 of full: vLLM keeps the
    # 16,384 in-flight tokens of every sliding layer besides its window
    assert (10 * 32768 + 52 * 1024) / (62 * 32768) == pytest.approx(0.1875)


@pytest.mark.parametrize(("engine", "ratio"), [("vllm", 2048 / 1281), ("sglang", 1.0)])
def test_mistral_concurrency_at_32k(engine: str, ratio: float) -> None:
    cfg = ServeConfig(tp=1, engine=engine)
    mem, full = (serve_memory(m, H100, cfg, context_len=32768) for m in (MISTRAL, FULL_MISTRAL))
    assert mem.kv_cache_bytes == full.kv_cache_bytes  # one group of all 32 layers: the same pool
    assert mem.max_concurrency / full.max_concurrency == pytest.approx(ratio, rel=1e-4)
    # the pool's tokens as vLLM logs them: max concurrency x max_model_len, a 32k request 32,768 of them
    assert mem.kv_cache_tokens == pytest.approx(mem.max_concurrency * 32768, abs=16)
    job = ServeJob(input_len=30720, output_len=2048, max_model_len=32768)
    assert kv_limited_concurrency(mem, job) == int(mem.max_concurrency)


def test_gemma_pool_counts_padding_and_every_group() -> None:
    mem = serve_memory(GEMMA, H100, ServeConfig(tp=2), context_len=32768)
    layout = mem.kv_layout
    assert isinstance(layout, KVLayout) and layout.paged_layers == 70
    # pool blocks of 10 layers' pages; a 32k request holds 8,582 of them (2,048 + 6 x 1,089)
    page = 16 * 2 * 8 * 128 * 2  # TP2: 8 KV heads per GPU
    pool_blocks = mem.kv_cache_bytes / (10 * page)
    assert mem.max_concurrency == pytest.approx(pool_blocks / 8582, rel=1e-3)
    assert mem.kv_cache_tokens == pytest.approx(pool_blocks / 8582 * 32768, abs=16)  # vLLM's logged size
    assert mem.request_tokens(32768, startup=True) == mem.request_tokens(32768) == 32768
    assert mem.request_tokens(4096) == -(-(7 * 256) * 32768 // 8582)  # a 4k request: 256 blocks in every group
    sglang = serve_memory(GEMMA, H100, ServeConfig(tp=2, engine="sglang"), context_len=32768)
    assert sglang.kv_layout is None  # SGLang 0.5.23 runs Gemma 3 with hybrid SWA memory off
    assert sglang.max_concurrency == pytest.approx(sglang.kv_cache_bytes / (62 * 32768 * 16 * 128 * 2), rel=1e-3)
    assert mem.max_concurrency / sglang.max_concurrency == pytest.approx(62 / 70 * 2048 * 7 / 8582, rel=5e-3)


def test_pinned_blocks_store_windows_whole() -> None:
    # TensorRT-LLM's rows (kv_block_tokens set) keep the full-attention accounting
    cfg = ServeConfig(tp=1, kv_block_tokens=32)
    assert serve_memory(MISTRAL, H100, cfg, context_len=32768).max_concurrency == pytest.approx(
        serve_memory(FULL_MISTRAL, H100, cfg, context_len=32768).max_concurrency)


def test_decode_reads_only_the_window() -> None:
    cfg = ServeConfig(tp=1)
    gpu = H100.gpu
    windowed = _decode_attention_s(MISTRAL, gpu, cfg, seqs=64, context_len=32768)
    assert windowed == _decode_attention_s(FULL_MISTRAL, gpu, cfg, seqs=64, context_len=4096)
    assert _decode_attention_s(MISTRAL, gpu, cfg, seqs=64, context_len=2000) == _decode_attention_s(
        FULL_MISTRAL, gpu, cfg, seqs=64, context_len=2000)


def test_global_groups_take_every_kth_layer() -> None:
    # vLLM 0.33.0 splits each bucket of n layers into k = ceil(n / G) groups, group i its layers [i::k]
    groups = vllm_global_groups(GEMMA.decoder_windows)
    assert [(w, len(layers)) for w, layers in groups] == [(1024, 9)] * 4 + [(1024, 8)] * 2 + [(None, 10)]
    assert groups[0][1][:3] == (0, 7, 14) and groups[-1][1] == tuple(range(5, 62, 6))


@pytest.mark.parametrize(("model", "pp", "stage_layers", "per_block", "blocks"), [
    # Gemma-3-27B PP 4: stages of 15/16/16/15 layers hold <= 3 layers of any of the 7 global groups; a 32k request:
    # 2,048 full blocks + 6 x (cdiv(min(1,023 + 5 x 8,192, 32,768), 16) + 1) = 2,048 + 6 x 2,049
    (GEMMA, 4, [15, 16, 16, 15], 3, 2048 + 6 * 2049),
    # PP 2: 31 + 31 layers, <= 5 of a group; cdiv(1,023 + 3 x 8,192, 16) + 1 = 1,601 per sliding group
    (GEMMA, 2, [31, 31], 5, 2048 + 6 * 1601),
    # Mistral-7B-v0.1 PP 2: one group of 32 sliding layers, 16 a stage; cdiv(4,095 + 3 x 8,192, 16) + 1
    (MISTRAL, 2, [16, 16], 16, 1793),
])
def test_pp_stages_project_the_global_groups(model, pp, stage_layers, per_block, blocks) -> None:
    stages = stage_windows(model, pp)
    assert [len(s) for s in stages] == stage_layers
    layouts = engine_stage_layouts(stages, engine="vllm", block=16, in_flight=(pp + 1) * 8192, max_model_len=32768)
    assert {(lay.group_layers, lay.startup_blocks) for lay in layouts} == {(per_block, blocks)}
    # the pool: bytes per block from the largest projected group, the fewest blocks over the stages
    mem = serve_memory(model, H100, ServeConfig(tp=2, pp=pp), context_len=32768)
    page = 16 * 2 * model.kv_heads // 2 * 128 * 2  # TP2: 16-token blocks x K and V x heads per GPU x 128 x BF16
    assert mem.max_concurrency == pytest.approx(int(mem.kv_cache_bytes // (per_block * page)) / blocks, rel=1e-3)


def test_gemma3_pp4_concurrency_as_vllm_logs_it() -> None:
    # the review's hand count: 340,735 blocks of 3 layers on the smallest stage / 14,342 = 23.76 (was 28.13, each
    # stage grouped alone: 16,391 blocks of 2 layers)
    mem = serve_memory(GEMMA, H100, ServeConfig(tp=2, pp=4), context_len=32768)
    assert mem.max_concurrency == pytest.approx(23.76, abs=0.01)
    assert mem.kv_layout is not None and mem.kv_layout.startup_blocks == 14342


@pytest.mark.parametrize("model", [GEMMA, MISTRAL])
def test_pp1_layout_unchanged(model) -> None:
    # one stage: the global groups are the stage's, as before
    (lay,) = engine_stage_layouts([model.decoder_windows], engine="vllm", block=16, in_flight=IN_FLIGHT,
                                  max_model_len=32768)
    groups, size = vllm_kv_groups(model.decoder_windows)  # the grouping of the model's layers on one worker
    assert sorted(lay.groups, key=str) == sorted(groups, key=str) and lay.group_layers == size
    assert serve_memory(GEMMA, H100, ServeConfig(tp=2), context_len=32768).max_concurrency == pytest.approx(
        8.4326, abs=1e-3)  # as before the global grouping
