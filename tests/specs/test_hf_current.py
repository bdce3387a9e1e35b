"""Current models' Hugging Face configs (tests/fixtures/hf/, tests/fixtures/hf_unsupported/): the families
added for them (Kimi K2 as DeepSeek-V3, GLM-4.5, Phi-3/Phi-4) map every shape field, KV-cache bytes per
token follow the closed forms, architectures the schema cannot describe are refused naming what is
missing, and a sliding window the importer does not model is said, never silently priced as exact.

Published parameter counts of these fixtures are checked in tests/specs/test_hf.py (PUBLISHED)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token
from autoshard.errors import SpecError
from autoshard.specs import load_model
from autoshard.specs.hf import model_from_hf_config
from autoshard.specs.job import WeightDtype
from autoshard.specs.model import AttentionKind, ModelSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HF = FIXTURES / "hf"
UNSUPPORTED = FIXTURES / "hf_unsupported"


def load(name: str) -> ModelSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # these configs import without a note
        return load_model(HF / f"{name}.json")


def groups(spec: ModelSpec) -> list[tuple[str, int]]:
    return [(g.kind.value, g.count) for g in spec.layers]


# ------------------------------------------------------------------------------------ new families
def test_kimi_k2_is_deepseek_v3_with_384_experts() -> None:
    s = load("kimi-k2-instruct")
    assert s.name == "moonshotai/Kimi-K2-Instruct"
    assert s.attention is AttentionKind.MLA and s.mla is not None
    assert (s.mla.q_lora_rank, s.mla.kv_lora_rank, s.mla.qk_rope_head_dim) == (1536, 512, 64)
    assert groups(s) == [("embedding", 1), ("dense", 1), ("moe", 60), ("output", 1)]
    assert s.moe is not None
    assert (s.moe.num_experts, s.moe.top_k, s.moe.expert_ffn_hidden_size) == (384, 8, 2048)
    assert (s.moe.num_shared_experts, s.moe.shared_expert_ffn_hidden_size) == (1, 2048)
    assert s.moe.expert_bias and s.moe.topk_scaling_factor == pytest.approx(2.827)
    assert s.moe.num_groups is None  # n_group 1: no group-limited routing
    assert s.mtp_num_layers == 0 and s.num_params_with_mtp == s.num_params
    (ckpt,) = s.checkpoints  # the hub's block-scaled FP8 weights
    assert (ckpt.weights, ckpt.repo, ckpt.block_scaled) == (
        WeightDtype.FP8, "moonshotai/Kimi-K2-Instruct", True)


def test_glm_4_5_fields() -> None:
    s = load("glm-4.5")
    assert groups(s) == [("embedding", 1), ("dense", 3), ("moe", 89), ("output", 1)]  # report: 3 + 89
    assert (s.hidden_size, s.num_attention_heads, s.kv_heads, s.kv_channels) == (5120, 96, 8, 128)
    assert s.qkv_bias and not s.linear_bias and s.qk_norm
    assert s.ffn_hidden_size == 12288 and s.moe is not None
    assert (s.moe.num_experts, s.moe.top_k, s.moe.expert_ffn_hidden_size) == (160, 8, 1536)
    assert (s.moe.num_shared_experts, s.moe.shared_expert_ffn_hidden_size) == (1, 1536)
    assert s.moe.score_function.value == "sigmoid" and s.moe.expert_bias
    assert s.moe.topk_scaling_factor == 2.5
    assert s.mtp_num_layers == 1
    # attention: q (96 x 128) and k, v (8 x 128) with biases, o without, per-head q/k RMSNorm
    h, q, kv = 5120, 96 * 128, 8 * 128
    assert s.attention_params() == h * (q + 2 * kv) + (q + 2 * kv) + q * h + 2 * 128


def test_glm_4_5_air_fields() -> None:
    s = load("glm-4.5-air")
    assert groups(s) == [("embedding", 1), ("dense", 1), ("moe", 45), ("output", 1)]
    assert not s.qk_norm and s.qkv_bias
    assert s.moe is not None and (s.moe.num_experts, s.moe.expert_ffn_hidden_size) == (128, 1408)
    assert s.moe.topk_scaling_factor is None  # routed_scaling_factor 1.0


def test_phi_4_is_llama_shaped() -> None:
    s = load("phi-4")
    assert (s.hidden_size, s.ffn_hidden_size, s.num_attention_heads, s.kv_heads, s.kv_channels) == (
        5120, 17920, 40, 10, 128)
    assert not (s.qkv_bias or s.linear_bias or s.qk_norm or s.tied_embeddings)
    assert s.max_position_embeddings == 16384 and s.vocab_size == 100352
    # fused qkv_proj (5120 -> 7680) and gate_up_proj (5120 -> 35840) hold Llama's weights
    assert s.dense_layer_params() == 5120 * 7680 + 5120 * 5120 + 5120 * 35840 + 17920 * 5120 + 2 * 5120


def test_glm_importer_names_bad_keys() -> None:
    cfg = json.loads((HF / "glm-4.5.json").read_text()) | {"n_shared_experts": -1}
    with pytest.raises(SpecError, match="n_shared_experts"):
        model_from_hf_config(cfg, source="glm.json")


# ------------------------------------------------------------------------------ KV bytes per token
# name -> BF16 KV-cache bytes per token: 2 (K and V) x layers x kv_heads x head_dim x 2 bytes, or for MLA
# layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes
KV_BYTES: dict[str, int] = {
    "kimi-k2-instruct": 61 * (512 + 64) * 2,
    "glm-4.5": 2 * 92 * 8 * 128 * 2,
    "glm-4.5-air": 2 * 46 * 8 * 128 * 2,
    "phi-4": 2 * 40 * 10 * 128 * 2,
    "qwen3-coder-480b-a35b": 2 * 62 * 8 * 128 * 2,
    "mistral-large-instruct-2407": 2 * 88 * 8 * 128 * 2,
    "mixtral-8x22b-v0.1": 2 * 56 * 8 * 128 * 2,
    "qwen2.5-72b-instruct": 2 * 80 * 8 * 128 * 2,
}


@pytest.mark.parametrize("name", sorted(KV_BYTES))
def test_kv_cache_bytes_per_token(name: str) -> None:
    spec = load(name)
    assert kv_cache_bytes_per_token(spec) == KV_BYTES[name]
    assert kv_cache_bytes_per_token(spec, WeightDtype.FP8) == KV_BYTES[name] / 2


# ------------------------------------------------------------------- architectures not modelled
# fixture -> (config key named, words of the reason)
NOT_MODELLED: dict[str, tuple[str, str]] = {
    "gpt-oss-120b": ("model_type", "learned attention sinks"),
    "llama-4-scout-17b-16e": ("text_config.model_type", "chunked attention"),
    "llama-4-maverick-17b-128e": ("text_config.model_type", "interleave_moe_layer_step"),
    "qwen3-next-80b-a3b": ("model_type", "Gated DeltaNet linear attention"),
    "deepseek-v3.2-exp": ("model_type", "DeepSeek sparse attention"),
}


def test_every_unsupported_fixture_is_listed() -> None:
    assert sorted(p.stem for p in UNSUPPORTED.glob("*.json")) == sorted(NOT_MODELLED)


@pytest.mark.parametrize("name", sorted(NOT_MODELLED))
def test_unsupported_architecture_says_what_is_missing(name: str) -> None:
    key, reason = NOT_MODELLED[name]
    with pytest.raises(SpecError) as info:
        load_model(UNSUPPORTED / f"{name}.json")
    exc = info.value
    assert exc.field == key and exc.exit_code == 2
    assert reason in str(exc) and "not supported" in str(exc) and "upper bound" in str(exc)


@pytest.mark.parametrize("name", ["gpt-oss-120b", "llama-4-scout-17b-16e"])
def test_unsupported_architecture_on_the_cli_is_exit_2(name: str) -> None:
    result = CliRunner().invoke(app, ["solve", str(UNSUPPORTED / f"{name}.json"), "dgx-h100", "--gpus", "8"])
    assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2
    assert "is not supported" in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------------------- sliding windows
def _notes(config: dict) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model_from_hf_config(config, source="cfg.json")
    return [str(w.message) for w in caught]


def test_a_sliding_window_is_imported_not_noted() -> None:
    mistral = json.loads((HF / "mistral-7b-v0.1.json").read_text())  # sliding_window 4096, context 32768
    assert _notes(mistral) == []
    spec = model_from_hf_config(mistral, source="cfg.json")
    assert spec.decoder_windows == (4096,) * 32
    assert model_from_hf_config(mistral | {"sliding_window": None}, source="c").decoder_windows == (None,) * 32


def test_qwen_sliding_window_counts_only_when_switched_on() -> None:
    qwen = json.loads((HF / "qwen2.5-72b-instruct.json").read_text())  # use_sliding_window false, 80 layers
    assert not model_from_hf_config(qwen, source="c").has_attention_window
    with pytest.warns(UserWarning, match="vLLM 0.33 refuses a Qwen2 model that mixes them"):
        on = model_from_hf_config(qwen | {"use_sliding_window": True, "sliding_window": 4096,
                                          "max_window_layers": 70}, source="c")
    assert on.decoder_windows == (None,) * 70 + (4096,) * 10  # transformers: layers i >= max_window_layers
    every = model_from_hf_config(qwen | {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0},
                                 source="c")
    assert every.decoder_windows == (4096,) * 80


def test_importer_notes_print_as_warning_lines(tmp_path: Path) -> None:
    cfg = json.loads((HF / "qwen2.5-72b-instruct.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    result = CliRunner().invoke(app, ["solve", str(path), "dgx-h100", "--gpus", "8", "--mode", "serve",
                                      "--time-limit", "5", "--workers", "1", "--json"])
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)  # stdout stays one JSON object, and carries the note
    assert any("'bitsandbytes' is not modelled" in w for w in plan["warnings"])
    assert "warning: " in result.stderr and "'bitsandbytes' is not modelled" in result.stderr
    assert "UserWarning" not in result.stderr and "checkpoint_from_quantization_config" not in result.stderr
