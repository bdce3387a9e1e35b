"""Sliding-window attention from a Hugging Face config.json (specs/hf/window.py) and in a YAML spec
(`LayerGroup.attention_window`): Gemma 3 (text and multimodal wrapper), Gemma 2, Mistral-7B-v0.1, Qwen with
use_sliding_window, explicit layer_types, and the refusals naming the key or field."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from autoshard.errors import SpecError
from autoshard.specs import load_model
from autoshard.specs.hf import model_from_hf_config
from autoshard.specs.model import LayerKind, MlpKind

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def _cfg(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def _import(config: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_from_hf_config(config, source="cfg.json")


def test_gemma3_text_config() -> None:
    spec = _import(_cfg("gemma-3-1b"))  # model_type gemma3_text, 26 layers, window 512, pattern 6
    assert spec.decoder_windows == tuple(None if (i + 1) % 6 == 0 else 512 for i in range(26))
    assert [(g.count, g.attention_window) for g in spec.layers[1:-1]] == [(5, 512), (1, None)] * 4 + [(2, 512)]
    assert spec.mlp is MlpKind.GEGLU and spec.mlp.num_matrices == 3
    assert spec.qk_norm and spec.tied_embeddings and spec.kv_channels == 256 and spec.kv_heads == 1
    # 262,144 x 1,152 embedding + 26 x (attention 2,949,120 + q/k norms 512 + GeGLU 3 x 1,152 x 6,912 + 2 norms)
    # + the final norm; Gemma 3 report Table 1: 302M + 698M (2 of Gemma's 4 norms a layer are left out)
    assert spec.num_params == 301_989_888 + 26 * (2_949_120 + 512 + 23_887_872 + 2_304) + 1_152 == 999_826_048


def test_gemma3_multimodal_wrapper_imports_its_text_config() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = model_from_hf_config(_cfg("gemma-3-27b"), source="cfg.json")
    assert [str(w.message) for w in caught if "sliding" in str(w.message)] == []  # priced now: no note
    assert any("vision_config" in str(w.message) for w in caught)
    assert spec.decoder_windows.count(None) == 10 and spec.decoder_windows.count(1024) == 52
    assert spec.decoder_windows[5] is None and spec.decoder_windows[59] is None and spec.decoder_windows[61] == 1024
    assert spec.vocab_size == 262208 and spec.max_position_embeddings == 131072  # transformers' defaults
    assert spec.kv_channels == 128 and spec.rope_scaling is not None and spec.rope_scaling.factor == 8.0


def test_gemma2_alternates_from_the_first_layer() -> None:
    spec = _import(_cfg("gemma-2-9b"))
    assert spec.decoder_windows == (4096, None) * 21
    assert not spec.qk_norm and spec.max_position_embeddings == 8192


def test_mistral_v01_every_layer() -> None:
    assert not _import(_cfg("mistral-7b-v0.1") | {"sliding_window": 0}).has_attention_window  # vLLM: 0 is None
    spec = _import(_cfg("mistral-7b-v0.1"))
    assert [(g.kind, g.count, g.attention_window) for g in spec.layers] == [
        (LayerKind.EMBEDDING, 1, None), (LayerKind.DENSE, 32, 4096), (LayerKind.OUTPUT, 1, None)]


def test_layer_types_take_precedence() -> None:
    cfg = _cfg("gemma-3-1b") | {"layer_types": ["full_attention"] * 2 + ["sliding_attention"] * 24}
    assert _import(cfg).decoder_windows == (None, None) + (512,) * 24
    qwen = _cfg("qwen3-8b") | {"use_sliding_window": True, "sliding_window": 8192,
                               "layer_types": ["sliding_attention", "full_attention"] * 18}
    assert _import(qwen).decoder_windows == (8192, None) * 18
    assert not _import(qwen | {"use_sliding_window": False}).has_attention_window  # transformers: window None


@pytest.mark.parametrize(("update", "words"), [
    ({"layer_types": ["chunked_attention"] * 26}, "layer 0 is 'chunked_attention'"),
    ({"layer_types": ["full_attention"] * 3}, "expected a list of 26 layer types"),
    ({"sliding_window": -4}, "must be at least 0"),
    ({"hidden_activation": "silu"}, "unsupported activation 'silu'"),
])
def test_bad_window_keys_are_refused_by_name(update: dict, words: str) -> None:
    with pytest.raises(SpecError) as info:
        _import(_cfg("gemma-3-1b") | update)
    key = next(iter(update))
    assert info.value.field == key and words in str(info.value)


YAML = """name: toy
hidden_size: 64
ffn_hidden_size: 128
num_attention_heads: 4
vocab_size: 100
max_position_embeddings: 4096
layers:
  - kind: embedding{emb}
  - kind: dense
    count: 2
    attention_window: {window}
  - kind: output
"""


@pytest.mark.parametrize(("emb", "window", "field", "words"), [
    ("", "0", "layers[1].attention_window", "greater than 0"),
    ("", "-8", "layers[1].attention_window", "greater than 0"),
    ("", "wide", "layers[1].attention_window", "integer"),
    ("\n    attention_window: 16", "8", "layers[0].attention_window", "decoder layers"),
])
def test_yaml_window_is_validated(tmp_path: Path, emb: str, window: str, field: str, words: str) -> None:
    path = tmp_path / "toy.yaml"
    path.write_text(YAML.format(emb=emb, window=window))
    with pytest.raises(SpecError) as info:
        load_model(path)
    assert info.value.field == field and words in str(info.value)


def test_yaml_window_loads(tmp_path: Path) -> None:
    path = tmp_path / "toy.yaml"
    path.write_text(YAML.format(emb="", window="1024"))
    spec = load_model(path)
    assert spec.decoder_windows == (1024, 1024) and spec.has_attention_window
    assert spec.num_params == load_model(path).model_copy(update={"layers": spec.layers[:1] + (
        spec.layers[1].model_copy(update={"attention_window": None}),) + spec.layers[2:]}).num_params
