"""vLLM 0.33.0's sliding-window switches on a --from-vllm line, priced as vLLM runs them: Gemma-3-27B (10 full + 52
sliding layers of window 1,024; 16 KV heads x 128) and Mistral-7B-v0.1 (32 layers of window 4,096) on H100s.
--disable-hybrid-kv-cache-manager caches a hybrid model's sliding layers as full attention; --disable-sliding-window
caps the max model length at the window (a longer --max-model-len is refused, exit 2) and runs every layer full."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.emit.vllm.parse import ParsedVllm, backend_role, parse_vllm, window_switches
from autoshard.errors import SpecError
from autoshard.specs import load_cluster
from conftest import HF_FIXTURES as HF
from conftest import hf_fixture

POOL = load_cluster("dgx-h100").with_gpus(8).primary


def _hf(name: str):
    return hf_fixture(name)


GEMMA, MISTRAL = _hf("gemma-3-27b"), _hf("mistral-7b-v0.1")


def test_switches_are_read() -> None:
    parsed = parse_vllm("vllm serve google/gemma-3-27b-it --disable-hybrid-kv-cache-manager")
    assert isinstance(parsed, ParsedVllm) and not parsed.hybrid_kv_cache and parsed.sliding_window
    plain = parse_vllm("vllm serve google/gemma-3-27b-it")
    assert plain.hybrid_kv_cache and plain.sliding_window


def test_hybrid_manager_off_caches_gemma3_in_full() -> None:
    _, parsed = window_switches(parse_vllm("vllm serve google/gemma-3-27b-it --disable-hybrid-kv-cache-manager "
                                           "--max-model-len 32768"), GEMMA)
    (note,) = parsed.warnings
    assert note.startswith("--disable-hybrid-kv-cache-manager: vLLM") and note.endswith("priced so")
    cfg = ServeConfig(tp=2)
    hybrid = serve_memory(GEMMA, POOL, cfg, context_len=32768)
    full = serve_memory(GEMMA, POOL, dataclasses.replace(cfg, hybrid_kv_cache=False), context_len=32768)
    assert full.kv_layout is None and full.kv_cache_bytes == hybrid.kv_cache_bytes
    # every layer holds every token: 62 layers x 2,048 blocks of 16 tokens x 8 KV heads x 128 x K,V x BF16 (TP2)
    page = 16 * 2 * 8 * 128 * 2
    assert full.max_concurrency == pytest.approx(full.kv_cache_bytes / (62 * 2048 * page), rel=1e-3)
    assert full.max_concurrency == pytest.approx(5.70, abs=0.01)  # the hybrid pool: 8.43
    assert hybrid.max_concurrency == pytest.approx(8.43, abs=0.01)


def test_hybrid_manager_off_beats_it_at_pp4() -> None:
    # at PP 4 each 32k request takes 14,342 blocks of 3 layers in the hybrid pool (43,026 layer pages) against
    # 2,048 of 16 in full (32,768): the switch serves more
    cfg = ServeConfig(tp=2, pp=4)
    hybrid = serve_memory(GEMMA, POOL, cfg, context_len=32768)
    full = serve_memory(GEMMA, POOL, dataclasses.replace(cfg, hybrid_kv_cache=False), context_len=32768)
    assert hybrid.max_concurrency == pytest.approx(23.76, abs=0.01)
    assert full.max_concurrency == pytest.approx(31.66, abs=0.01)


def test_hybrid_manager_off_leaves_an_all_sliding_model() -> None:
    _, parsed = window_switches(parse_vllm("vllm serve mistralai/Mistral-7B-v0.1 --disable-hybrid-kv-cache-manager"),
                                MISTRAL)
    assert parsed.warnings[0].endswith("priced as without it")
    cfg = ServeConfig(tp=1)
    assert serve_memory(MISTRAL, POOL, ServeConfig(tp=1, hybrid_kv_cache=False), context_len=32768).max_concurrency == (
        serve_memory(MISTRAL, POOL, cfg, context_len=32768).max_concurrency)


def test_sliding_window_off_refuses_past_the_window() -> None:
    line = "vllm serve mistralai/Mistral-7B-v0.1 --disable-sliding-window --max-model-len 8192"
    with pytest.raises(SpecError, match=r"--max-model-len 8,192 is longer than 4,096.*--max-model-len 4096"):
        window_switches(parse_vllm(line), MISTRAL)
    with pytest.raises(SpecError, match="sliding_window=4096"):  # where the evaluation reads the line today
        backend_role(parse_vllm(line), MISTRAL, POOL)
    model, parsed = window_switches(parse_vllm("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 " + line), MISTRAL)
    assert parsed.max_model_len == 8192 and not model.has_attention_window  # vLLM warns and starts, all full


def test_sliding_window_off_starts_at_the_window() -> None:
    model, parsed = window_switches(parse_vllm("vllm serve mistralai/Mistral-7B-v0.1 --disable-sliding-window"),
                                    MISTRAL)
    assert parsed.max_model_len == 4096 and not model.has_attention_window
    assert parsed.warnings == ("--disable-sliding-window: vLLM 0.33.0 runs every layer as full attention and caps "
                               "max_model_len at the window: priced so, at 4,096 tokens",)
    # at 4,096 tokens full attention holds 256 blocks a request, the window's cap 257 (cdiv(4,096, 16) + 1)
    cfg = ServeConfig(tp=1)
    full, windowed = (serve_memory(m, POOL, cfg, context_len=4096) for m in (model, MISTRAL))
    assert full.max_concurrency / windowed.max_concurrency == pytest.approx(257 / 256, rel=1e-3)


def test_gemma3_line_past_the_window_exits_2() -> None:
    result = CliRunner().invoke(app, [
        "evaluate", str(HF / "gemma-3-27b.json"), "dgx-h100", "--gpus", "8", "--from-vllm",
        "vllm serve google/gemma-3-27b-it --tensor-parallel-size 2 --max-model-len 32768 --disable-sliding-window"])
    assert result.exit_code == 2
    assert "--max-model-len 32,768 is longer than 1,024" in result.stderr and "--max-model-len 1024" in result.stderr


def _evaluate(model: str, line: str) -> dict:
    result = CliRunner().invoke(app, ["evaluate", str(HF / f"{model}.json"), "dgx-h100", "--gpus", "8", "--json",
                                      "--from-vllm", line])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_from_vllm_prices_the_hybrid_manager_off() -> None:
    line = "vllm serve google/gemma-3-27b-it --tensor-parallel-size 2 --max-model-len 32768 --max-num-batched-tokens 8192"
    on, off = _evaluate("gemma-3-27b", line), _evaluate("gemma-3-27b", line + " --disable-hybrid-kv-cache-manager")
    # the same pool: blocks of 10 layers, 8,582 a 32k request (hybrid) against 62 layers x 2,048 blocks (off)
    on_c, off_c = (p["predicted"]["serve"]["max_concurrency"] for p in (on, off))
    assert off_c / on_c == pytest.approx(10 * 8582 / (62 * 2048), rel=2e-3)
    assert (on_c, off_c) == pytest.approx((8.31, 5.61), abs=0.01)  # --gpu-memory-utilization 0.92 (vLLM's default)
    assert any(w.endswith("priced so") for w in off["warnings"])


def test_from_vllm_prices_the_sliding_window_off_at_the_window() -> None:
    plan = _evaluate("mistral-7b-v0.1", "vllm serve mistralai/Mistral-7B-v0.1 --disable-sliding-window "
                                        "--max-num-batched-tokens 8192")
    assert any(w.startswith("--disable-sliding-window: ") and w.endswith("at 4,096 tokens") for w in plan["warnings"])
    assert "--max-model-len 4096" in plan["launch"]["vllm"]
