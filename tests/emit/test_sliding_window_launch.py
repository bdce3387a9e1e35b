"""Serving a model with sliding-window layers from its config.json (Gemma-3-27B, 5 local : 1 global): the launch
lines keep the engines' windows (no --disable-sliding-window, no --disable-hybrid-kv-cache-manager), the plan's
concurrency is vLLM's hybrid pool's, SGLang (which stores Gemma 3's windows whole) is priced below it, and a
--from-vllm line that switches the windows off is read with a note."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.emit.vllm.parse import parse_vllm

GEMMA = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "gemma-3-27b.json"


@cache
def _plan() -> dict:
    result = CliRunner().invoke(app, ["solve", str(GEMMA), "dgx-h100", "--mode", "serve", "--gpus", "8",
                                      "--input-len", "30720", "--output-len", "2048", "--max-model-len", "32768",
                                      "--time-limit", "20", "--workers", "1", "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_launch_lines_keep_the_windows() -> None:
    launch = _plan()["launch"]
    assert launch["vllm"].startswith("vllm serve ") and "--max-model-len 32768" in launch["vllm"]
    assert "--context-length 32768" in launch["sglang"]
    for line in launch.values():
        assert "sliding" not in line and "hybrid" not in line


def test_sglang_stores_the_windows_whole_so_it_serves_fewer() -> None:
    plan = _plan()
    other = plan["engine"]["other"]
    assert plan["engine"]["priced_for"] == "vllm" and other["engine"] == "sglang" and other["differs"]
    assert other["tokens_per_s"] < plan["predicted"]["tokens_per_s"]
    # vLLM's pool holds more 32k requests per GPU than every layer holding every token would
    serve = plan["predicted"]["serve"]
    kv_gib = plan["predicted"]["memory_gib"]["breakdown"]["kv_cache"]
    tp = plan["plan"]["tp"]
    full = kv_gib * 2**30 / (62 * 32768 * 2 * (16 / tp) * 128 * 2)  # requests of 32,768 tokens in every layer
    assert serve["max_concurrency"] > 1.3 * full


def test_from_vllm_switches_are_noted() -> None:
    parsed = parse_vllm("vllm serve google/gemma-3-27b-it --disable-sliding-window "
                        "--disable-hybrid-kv-cache-manager")
    assert [w.split(":")[0] for w in parsed.warnings] == ["--disable-sliding-window",
                                                          "--disable-hybrid-kv-cache-manager"]
    assert all("prices the line without it" in w for w in parsed.warnings)
    assert parse_vllm("vllm serve google/gemma-3-27b-it").warnings == ()
