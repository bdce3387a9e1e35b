"""RoPE scaling in the model spec (`ModelSpec.rope_scaling`, autoshard/specs/rope.py) and its import from a
Hugging Face config.json (`rope_scaling`, autoshard/specs/hf/rope.py): published configs, transformers'
conventions (rope_type / type, rope_parameters, `default`, the yarn original-context fallback), unknown
types warned by name, hostile values refused naming the key, the YAML field on the CLI (exit 2)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.errors import SpecError
from autoshard.specs import load_model
from autoshard.specs.hf import model_from_hf_config

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
MODELS = Path(__file__).resolve().parents[2] / "models"

LLAMA31 = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
DSV3 = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def scaling(model: Any) -> dict[str, Any] | None:
    return None if model.rope_scaling is None else model.rope_scaling.model_dump(exclude_none=True)


def hf(name: str) -> dict[str, Any]:
    return json.loads((HF / f"{name}.json").read_text())


# the published configs (tests/fixtures/hf copies of the Hugging Face config.json files)
@pytest.mark.parametrize(("name", "want"), [
    ("llama-3.1-8b", LLAMA31),
    ("llama-3.1-405b", LLAMA31),
    ("deepseek-v3", DSV3),
    ("deepseek-v2-lite", DSV3 | {"mscale": 0.707, "mscale_all_dim": 0.707}),
    ("qwen3-8b", None),          # rope_scaling: null
    ("mixtral-8x7b-v0.1", None),  # no rope_scaling key
    ("gpt2", None),               # learned positions
])
def test_published_configs_import_their_rope_scaling(name: str, want: dict[str, Any] | None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp8 checkpoint notes of the DeepSeek configs
        assert scaling(model_from_hf_config(hf(name), source=f"{name}.json")) == want


# bundled models: the RoPE facts of each, and the same as its published config where the fixture exists
BUNDLED = {
    "llama-3.1-8b": (500000, None, LLAMA31, "llama-3.1-8b"),
    "llama-3.1-70b": (500000, None, LLAMA31, None),
    "llama-3.1-405b": (500000, None, LLAMA31, "llama-3.1-405b"),
    "deepseek-v3": (10000, None, DSV3, "deepseek-v3"),
    "llama-2-7b": (10000, None, None, None),
    "llama-2-70b": (10000, None, None, None),
    "mixtral-8x7b": (1000000, None, None, "mixtral-8x7b-v0.1"),
    "mixtral-8x22b": (1000000, None, None, "mixtral-8x22b-v0.1"),
    "qwen3-30b-a3b": (1000000, None, None, "qwen3-30b-a3b"),
    "qwen3-235b-a22b": (1000000, None, None, None),
    "nemotron-4-340b": (10000, 0.5, None, "nemotron-4-340b-base"),
    "gpt3-175b": (None, None, None, None),
}


def test_every_bundled_model_is_listed() -> None:
    assert sorted(BUNDLED) == sorted(p.stem for p in MODELS.glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_models_carry_their_published_rope(name: str) -> None:
    theta, percent, want, fixture = BUNDLED[name]
    model = load_model(name)
    assert (model.rope_theta, model.rotary_percent, scaling(model)) == (theta, percent, want)
    if fixture is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imported = model_from_hf_config(hf(fixture), source=f"{fixture}.json")
        assert (imported.rope_theta, imported.rotary_percent, scaling(imported)) == (theta, percent, want)


# transformers' conventions
def test_rope_type_default_is_unscaled_and_rope_parameters_is_read() -> None:
    cfg = hf("llama-3.1-8b")
    assert model_from_hf_config(cfg | {"rope_scaling": {"rope_type": "default"}}, source="x.json").rope_scaling is None
    v5 = {k: v for k, v in cfg.items() if k != "rope_scaling"} | {
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    assert scaling(model_from_hf_config(v5, source="x.json")) == LLAMA31 | {"factor": 32.0}


def test_yarn_without_original_context_uses_max_position_embeddings() -> None:
    # transformers: original_max_position_embeddings defaults to the config's max_position_embeddings
    cfg = hf("qwen3-8b") | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    got = scaling(model_from_hf_config(cfg, source="qwen3.json"))
    assert got == {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 40960}


@pytest.mark.parametrize("kind", ["longrope", "dynamic", "mrope"])
def test_unknown_scaling_type_is_a_warning_naming_it(kind: str) -> None:
    cfg = hf("qwen3-8b") | {"rope_scaling": {"rope_type": kind, "factor": 4.0}}
    with pytest.warns(UserWarning, match=rf"rope_scaling\.rope_type: RoPE scaling type '{kind}' is not carried"):
        model = model_from_hf_config(cfg, source="q.json")
    assert model.rope_scaling is None


def test_keys_a_type_does_not_take_are_a_warning() -> None:
    cfg = hf("qwen3-8b") | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.8,
                                             "original_max_position_embeddings": 32768}}
    with pytest.warns(UserWarning, match="attention_factor not carried for yarn"):
        model_from_hf_config(cfg, source="q.json")


LLAMA3_RAW = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}


@pytest.mark.parametrize(("raw", "field", "words"), [
    ([8.0], "rope_scaling", "expected a mapping"),
    ({"rope_type": 3, "factor": 8.0}, "rope_scaling.rope_type", "type name"),
    (LLAMA3_RAW | {"factor": 0.5}, "rope_scaling.factor", "greater than or equal to 1"),
    (LLAMA3_RAW | {"factor": "8"}, "rope_scaling.factor", "number"),
    (LLAMA3_RAW | {"factor": True}, "rope_scaling.factor", "number"),
    (LLAMA3_RAW | {"factor": float("nan")}, "rope_scaling.factor", ""),
    ({k: v for k, v in LLAMA3_RAW.items() if k != "low_freq_factor"}, "rope_scaling", "needs low_freq_factor"),
    (LLAMA3_RAW | {"high_freq_factor": 1.0}, "rope_scaling", "must be above low_freq_factor"),
    ({"type": "yarn", "factor": 4.0, "beta_fast": 1.0, "beta_slow": 32.0}, "rope_scaling", "beta_fast"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": -1}, "rope_scaling.original_max_position_embeddings",
     "greater than 0"),
])
def test_bad_rope_scaling_names_the_key(raw: Any, field: str, words: str) -> None:
    cfg = hf("llama-3.1-8b") | {"rope_scaling": raw}
    with pytest.raises(SpecError) as info:
        model_from_hf_config(cfg, source="llama.json")
    assert info.value.field == field and words in str(info.value) and info.value.exit_code == 2


# the YAML field
def write_model(tmp_path: Path, **changes: Any) -> Path:
    data = yaml.safe_load((MODELS / "llama-3.1-8b.yaml").read_text()) | changes
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"rope_scaling": {"type": "ntk", "factor": 2}}, "rope_scaling.type", "'llama3', 'yarn' or 'linear'"),
    ({"rope_scaling": {"type": "linear", "factor": 2, "beta_fast": 32}}, "rope_scaling",
     "beta_fast is not a parameter of linear RoPE scaling"),
    ({"rope_scaling": {"type": "yarn", "factor": 4}}, "rope_scaling", "needs original_max_position_embeddings"),
    ({"rope_scaling": {"type": "llama3", "factor": 8, "low_freq": 1}}, "rope_scaling.low_freq", "low_freq_factor"),
    ({"position_embedding": "learned"}, "rope_scaling", "position_embedding is learned"),
])
def test_bad_yaml_rope_scaling_is_exit_2_naming_the_field(tmp_path: Path, changes: dict[str, Any], field: str,
                                                          words: str) -> None:
    path = write_model(tmp_path, **changes)
    with pytest.raises(SpecError) as info:
        load_model(path)
    assert info.value.field == field and words in str(info.value)
    result = CliRunner().invoke(app, ["solve", str(path), "dgx-h100", "--gpus", "8"])
    assert result.exit_code == 2 and field in result.stderr and "Traceback" not in result.stderr


def test_yaml_rope_scaling_round_trips_through_the_spec(tmp_path: Path) -> None:
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "truncate": False}
    assert scaling(load_model(write_model(tmp_path, rope_scaling=yarn))) == yarn
