"""RoPE scaling in the Megatron-LM launch (emit/megatron/rope.py) and back (`--from-megatron`): the flags
each bundled model gets, the three mappings (llama3 -> --use-rope-scaling; YaRN -> --position-embedding-type
yarn + --rotary-scaling-factor / --yarn-* outside MLA, --rotary-scaling-factor / --mscale* inside it;
linear -> --rotary-seq-len-interpolation-factor), the notes where Megatron-LM at flags.SOURCE_COMMIT
cannot apply what the model states, round trips, and hostile flags (exit 2 naming the flag)."""

from __future__ import annotations

import shlex
import warnings
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autoshard.api import evaluate, evaluate_megatron, train_job
from autoshard.cli import app
from autoshard.emit import megatron_command, megatron_notes, parse_megatron
from autoshard.emit.megatron.flags import KNOWN
from autoshard.plans.train import Plan
from autoshard.specs import load_cluster, load_model
from autoshard.specs.model import ModelSpec

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
ROPE_WORDS = ("rope", "rotary", "yarn", "mscale")


def plan_for(model: ModelSpec, gpus: int = 8, **pins: Any) -> Plan:
    cluster = load_cluster("dgx-h100").with_gpus(gpus)
    job = train_job(model, seq_len=4096, global_batch_size=64, precision=None)
    return evaluate(model, cluster, job, **pins)


def rope_flags(command: str) -> list[str]:
    """The RoPE words of a command, values included, in order."""
    words = [w for w in shlex.split(command) if w.strip()]
    out: list[str] = []
    for i, w in enumerate(words):
        if w.startswith("--") and any(k in w for k in ROPE_WORDS) and w != "--max-position-embeddings":
            nxt = words[i + 1] if i + 1 < len(words) else "--"
            out.append(w if nxt.startswith("--") else f"{w} {nxt}")
    return out


def position_type(command: str) -> str:
    words = shlex.split(command)
    return words[words.index("--position-embedding-type") + 1]


def with_rope(base: str, **update: Any) -> ModelSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_model(base)
    return ModelSpec.model_validate(model.model_dump(exclude_none=True) | update)


# the flags each bundled model launches with (8 GPUs of a DGX H100 where it fits, else 64 / 256)
BUNDLED: dict[str, tuple[dict[str, Any], int, list[str], str]] = {
    "llama-3.1-8b": ({"tp": 8, "pp": 1}, 8, ["--rotary-base 500000", "--use-rope-scaling"], "rope"),
    "llama-3.1-70b": ({"tp": 8, "pp": 4}, 64, ["--rotary-base 500000", "--use-rope-scaling"], "rope"),
    "deepseek-v3": ({"tp": 1, "pp": 16, "ep": 16, "micro_batch_size": 1}, 256,
                    ["--rotary-base 10000", "--rotary-scaling-factor 40", "--mscale 1", "--mscale-all-dim 1"], "rope"),
    "mixtral-8x7b": ({"tp": 1, "pp": 1, "ep": 8}, 8, ["--rotary-base 1000000"], "rope"),
    "qwen3-30b-a3b": ({"tp": 1, "pp": 1, "ep": 8}, 8, ["--rotary-base 1000000"], "rope"),
    "llama-2-7b": ({"tp": 8, "pp": 1}, 8, ["--rotary-base 10000"], "rope"),
}


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_models_launch_with_their_rope_scaling_and_read_back(name: str) -> None:
    pins, gpus, want, kind = BUNDLED[name]
    model = load_model(name)
    plan = plan_for(model, gpus, **pins)
    cmd = megatron_command(plan)
    assert rope_flags(cmd) == want and position_type(cmd) == kind
    assert all(f.split()[0] in KNOWN for f in want)
    assert not [n for n in megatron_notes(plan) if "RoPE" in n or "YaRN" in n]  # Megatron applies it exactly
    back = parse_megatron(cmd).model
    assert (back.rope_theta, back.rope_scaling) == (model.rope_theta, model.rope_scaling)


def test_deepseek_v2_lite_yarn_temperature_reaches_mla() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_model(HF / "deepseek-v2-lite.json")
    cmd = megatron_command(plan_for(model, 8, tp=1, pp=1, ep=8))
    assert rope_flags(cmd) == ["--rotary-base 10000", "--rotary-scaling-factor 40", "--mscale 0.707",
                               "--mscale-all-dim 0.707"]
    assert parse_megatron(cmd).model.rope_scaling == model.rope_scaling


QWEN_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


@pytest.mark.parametrize(("scaling", "want"), [
    # Qwen3's model-card YaRN (factor 4 over 32768): temperature 0.1 ln 4 + 1, Megatron's default pair (1, 0)
    (QWEN_YARN, ["--rotary-scaling-factor 4", "--yarn-original-max-position-embeddings 32768"]),
    (QWEN_YARN | {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
     ["--rotary-scaling-factor 4", "--yarn-original-max-position-embeddings 32768", "--yarn-beta-fast 32",
      "--yarn-beta-slow 1", "--no-yarn-correction-range-round-to-int"]),
    (QWEN_YARN | {"mscale": 0.8, "mscale_all_dim": 0.5},
     ["--rotary-scaling-factor 4", "--yarn-original-max-position-embeddings 32768", "--mscale 0.8",
      "--mscale-all-dim 0.5"]),
])
def test_yarn_outside_mla_is_megatron_yarn_position_embedding(scaling: dict[str, Any], want: list[str]) -> None:
    model = with_rope(str(HF / "qwen3-8b.json"), rope_scaling=scaling)
    plan = plan_for(model, 8, tp=8, pp=1)
    cmd = megatron_command(plan)
    assert position_type(cmd) == "yarn"
    assert rope_flags(cmd) == ["--rotary-base 1000000", *want]
    assert not megatron_notes(plan) or all("RoPE" not in n and "YaRN" not in n for n in megatron_notes(plan))
    assert parse_megatron(cmd).model.rope_scaling == model.rope_scaling


def test_one_mscale_alone_is_not_written() -> None:
    # transformers uses the mscale pair only when both are set; else 0.1 ln(factor) + 1 = Megatron's default
    model = with_rope(str(HF / "qwen3-8b.json"), rope_scaling=QWEN_YARN | {"mscale": 0.8})
    assert "--mscale" not in megatron_command(plan_for(model, 8, tp=8, pp=1))


@pytest.mark.parametrize(("scaling", "flags", "note"), [
    # Llama 3.2 1B / 3B: factor 32 (Megatron's GPTModel applies 8 whatever --rope-scaling-factor says)
    ({"factor": 32.0}, ["--use-rope-scaling", "--rope-scaling-factor 32"], "neither model builder passes it"),
    ({"original_max_position_embeddings": 4096}, ["--use-rope-scaling"], "fixes them at 1, 4 and 8192"),
    ({"high_freq_factor": 2.0}, ["--use-rope-scaling"], "high_freq_factor 2"),
])
def test_llama3_scaling_megatron_cannot_apply_is_a_note(scaling: dict[str, Any], flags: list[str], note: str) -> None:
    model = with_rope("llama-3.1-8b", rope_scaling={
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192} | scaling)
    plan = plan_for(model, 8, tp=8, pp=1)
    assert rope_flags(megatron_command(plan)) == ["--rotary-base 500000", *flags]
    assert [n for n in megatron_notes(plan) if note in n]


def test_mla_yarn_context_and_betas_without_a_flag_are_a_note() -> None:
    # Kimi K2's config: YaRN factor 32, beta_fast 1, beta_slow 1 (MLATransformerConfig has 32, 1 and no flag)
    model = with_rope(str(HF / "deepseek-v2-lite.json"), rope_scaling={
        "type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0})
    plan = plan_for(model, 8, tp=1, pp=1, ep=8)
    assert "--rotary-scaling-factor 32" in rope_flags(megatron_command(plan))
    assert [n for n in megatron_notes(plan) if "beta_fast 1, beta_slow 1" in n and "no flag sets" in n]


@pytest.mark.parametrize(("factor", "flags"), [(2.0, ["--rotary-seq-len-interpolation-factor 2"]), (2.5, [])])
def test_linear_scaling(factor: float, flags: list[str]) -> None:
    model = with_rope("llama-2-7b", rope_scaling={"type": "linear", "factor": factor})
    plan = plan_for(model, 8, tp=8, pp=1)
    cmd = megatron_command(plan)
    assert rope_flags(cmd) == ["--rotary-base 10000", *flags]
    assert [n for n in megatron_notes(plan) if "linear RoPE scaling" in n]
    if flags:
        assert parse_megatron(cmd).model.rope_scaling == model.rope_scaling


@pytest.mark.parametrize(("old", "new", "flag"), [
    ("--use-rope-scaling", "--use-rope-scaling --rope-scaling-factor 0.5", "--rope-scaling-factor"),
    ("--use-rope-scaling", "--use-rope-scaling --rope-scaling-factor nan", "--rope-scaling-factor"),
    ("--position-embedding-type rope", "--position-embedding-type yarn --rotary-scaling-factor 0.5",
     "--rotary-scaling-factor"),
    ("--position-embedding-type rope", "--position-embedding-type yarn --yarn-beta-fast -1", "--yarn-beta-fast"),
    ("--position-embedding-type rope", "--position-embedding-type yarn --yarn-beta-fast 1 --yarn-beta-slow 4",
     "--yarn-beta-fast"),
])
def test_from_megatron_refuses_bad_scaling_flags(old: str, new: str, flag: str) -> None:
    model = "llama-3.1-8b" if flag == "--rope-scaling-factor" else "llama-2-7b"
    cmd = megatron_command(plan_for(load_model(model), 8, tp=8, pp=1)).replace(old, new)
    result = CliRunner().invoke(app, ["evaluate", "dgx-h100", "--gpus", "8", "--from-megatron", cmd])
    assert result.exit_code == 2 and flag in result.stderr and "Traceback" not in result.stderr


def test_a_command_without_the_models_rope_is_named_in_the_warnings() -> None:
    # Llama 3.1 70B launched without --rotary-base / --use-rope-scaling trains base 10,000, unscaled
    cmd = megatron_command(plan_for(load_model("llama-3.1-8b"), 8, tp=8, pp=1))
    _, warned = evaluate_megatron(cmd, "llama-3.1-8b", "dgx-h100", None)
    assert not [w for w in warned if "rope" in w]
    bare = cmd.replace("--rotary-base 500000", "").replace("--use-rope-scaling", "")
    _, warned = evaluate_megatron(bare, "llama-3.1-8b", "dgx-h100", None)
    assert [w for w in warned if "rope" in w] == [
        "the command's model differs from llama-3.1-8b: rope_theta: 500000 vs 10000 (--rotary-base)",
        "the command's model differs from llama-3.1-8b: rope_scaling: llama3 factor 8 vs none (the launch's RoPE "
        "scaling flags)"]
