"""The Megatron-LM launch carries the model's RoPE facts: `--rotary-base` (Hugging Face rope_theta; Megatron's
default 10,000 would train Llama 3 (500,000) or GLM-4.5 (1,000,000) as another model) and `--rotary-percent`
(partial rotary embeddings: GLM-4.5 and Nemotron 0.5, GPT-NeoX 0.25). They were never written. `--from-megatron`
reads them back; a model that states none is launched with Megatron-LM's defaults."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.api import evaluate, train_job
from autoshard.cli import app
from autoshard.emit import megatron_command, parse_megatron
from autoshard.errors import SpecError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.hf import model_from_hf_config

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def command_for(model_ref: str | Path, gpus: int = 8, **pins) -> str:
    model = load_model(model_ref)
    cluster = load_cluster("dgx-h100").with_gpus(gpus)
    job = train_job(model, seq_len=4096, global_batch_size=64, precision=None)
    return megatron_command(evaluate(model, cluster, job, **pins))


def flag(command: str, name: str) -> str | None:
    words = shlex.split(command)
    return words[words.index(name) + 1] if name in words else None


@pytest.mark.parametrize(("name", "base", "percent"), [
    ("llama-3.1-8b", "500000", None),
    ("qwen3-8b", "1000000", None),
    ("glm-4.5-air", "1000000", "0.5"),
    ("gpt-neox-20b", "10000", "0.25"),
])
def test_imported_models_launch_with_their_rope(name: str, base: str, percent: str | None) -> None:
    gpus = 64 if name == "glm-4.5-air" else 8
    pins = {"tp": 2, "pp": 4, "ep": 8, "micro_batch_size": 1} if name == "glm-4.5-air" else {"tp": 8, "pp": 1}
    cmd = command_for(HF / f"{name}.json", gpus, **pins)
    assert flag(cmd, "--rotary-base") == base
    assert flag(cmd, "--rotary-percent") == percent
    parsed = parse_megatron(cmd).model  # and back
    model = load_model(HF / f"{name}.json")
    assert (parsed.rope_theta, parsed.rotary_percent) == (model.rope_theta, model.rotary_percent)


def test_bundled_models_launch_with_their_published_rope() -> None:
    # the bundled YAMLs state their config.json rope_theta (tests/specs/test_spec_rope_scaling.py); GPT-3 has
    # learned positions and launches with no RoPE flag
    assert flag(command_for("llama-3.1-8b", tp=8, pp=1), "--rotary-base") == "500000"
    cmd = (Path(__file__).parent / "golden" / "gpt3-175b_dgx-a100-80gb_tp8-pp16-full.command.sh").read_text()
    assert "--position-embedding-type learned_absolute" in cmd
    assert "--rotary-base" not in cmd and "--rotary-percent" not in cmd and "--use-rope-scaling" not in cmd


def test_learned_positions_carry_no_rope() -> None:
    gpt2 = load_model(HF / "gpt2.json")
    assert gpt2.rope_theta is None and gpt2.rotary_percent is None


@pytest.mark.parametrize(("key", "value"), [("rope_theta", "1e6"), ("rope_theta", -1.0), ("rope_theta", True),
                                            ("partial_rotary_factor", 1.5), ("partial_rotary_factor", 0)])
def test_bad_rope_keys_name_the_key(key: str, value: object) -> None:
    cfg = json.loads((HF / "glm-4.5-air.json").read_text()) | {key: value}
    with pytest.raises(SpecError) as info:
        model_from_hf_config(cfg, source="glm.json")
    assert info.value.field == key and "positive number" in str(info.value)


@pytest.mark.parametrize("bad", ["--rotary-percent 2", "--rotary-base nan", "--rotary-base -5"])
def test_from_megatron_refuses_bad_rope_flags(bad: str) -> None:
    cmd = command_for(HF / "llama-3.1-8b.json", tp=8, pp=1)
    cmd = cmd.replace("--rotary-base 500000", bad)
    result = CliRunner().invoke(app, ["evaluate", "dgx-h100", "--gpus", "8", "--from-megatron", cmd])
    assert result.exit_code == 2 and bad.split()[0] in result.stderr and "positive number" in result.stderr
