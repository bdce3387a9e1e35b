"""Sliding-window models in the Megatron-LM launch: `--window-size LEFT,0` (a W-token causal window is
W - 1 keys before the query, as vLLM passes FlashAttention `sliding_window - 1`), `--window-attn-skip-freq`
as a 0/1 list expression where some layers attend fully (1: sliding), and Gemma's gated tanh-GELU MLP as
`--quick-geglu` (Megatron-LM has no tanh-GELU gate: the same shapes, with a note). The command reads back
(`parse_megatron`) as the model it was written for."""

from __future__ import annotations

import dataclasses
import shlex
import warnings
from pathlib import Path

import pytest

from autoshard.api import evaluate, train_job
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.model_args import eval_moe_layer_freq
from autoshard.emit.megatron.parse import model_shape_differences, parse_megatron
from autoshard.emit.megatron.script import megatron_notes, megatron_script
from autoshard.errors import SpecError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.layers import MlpKind

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
H100 = load_cluster("dgx-h100")


def _plan(name: str, gpus: int, tp: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Gemma 3's vision tower is left out: said on import
        model = load_model(FIXTURES / f"{name}.json")
    return evaluate(model, H100.with_gpus(gpus), train_job(model), tp=tp, pp=1)


def _flags(command: str) -> dict[str, str | None]:
    words = shlex.split(command.replace("\\\n", " "))
    out: dict[str, str | None] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            out[w] = None if nxt is None or nxt.startswith("--") else nxt
    return out


@pytest.mark.parametrize(("name", "gpus", "tp", "window", "skip", "mlp"), [
    # Gemma 3 27B: 62 layers, every 6th attends fully (sliding_window 1024, sliding_window_pattern 6)
    ("gemma-3-27b", 16, 8, "1023,0", "(([1]*5+[0]*1)*10+[1]*2)", "--quick-geglu"),
    # Gemma 2 9B: 42 layers alternating sliding (4096) and full
    ("gemma-2-9b", 8, 8, "4095,0", "(([1]*1+[0]*1)*21)", "--quick-geglu"),
    # Mistral 7B v0.1: every layer slides over 4096 tokens: no skip pattern
    ("mistral-7b-v0.1", 8, 8, "4095,0", None, "--swiglu"),
])
def test_window_flags_and_round_trip(name, gpus, tp, window, skip, mlp) -> None:
    plan = _plan(name, gpus, tp)
    flags = _flags(megatron_command(plan))
    assert flags["--window-size"] == window
    assert flags.get("--window-attn-skip-freq") == skip
    assert mlp in flags
    for text in (megatron_command(plan), megatron_script(plan)):
        parsed = parse_megatron(text, vocab_size=plan.model.vocab_size)
        assert parsed.model.decoder_windows == plan.model.decoder_windows
        assert model_shape_differences(plan.model, parsed.model) == []
    geglu = plan.model.mlp is MlpKind.GEGLU
    assert any("--quick-geglu" in n for n in megatron_notes(plan)) == geglu


def test_skip_freq_integer_reads_as_megatron_defines_it() -> None:
    """An integer N is one full-attention layer after each N - 1 sliding ones: N = 6 on 12 layers slides
    in layers 0-4 and 6-10; `--moe-layer-freq`'s N (MoE from the first layer on) is a different rule."""
    assert eval_moe_layer_freq("6", 12, flag="--window-attn-skip-freq") == [1] * 5 + [0] + [1] * 5 + [0]
    assert eval_moe_layer_freq("6", 12) == [1] + [0] * 5 + [1] + [0] * 5
    with pytest.raises(SpecError, match="0 \\(full\\) and 1 \\(sliding\\)"):
        eval_moe_layer_freq("[2]*12", 12, flag="--window-attn-skip-freq", meaning="0 (full) and 1 (sliding)")


def test_a_bad_window_size_names_the_flag() -> None:
    plan = _plan("mistral-7b-v0.1", 8, 8)
    text = megatron_command(plan).replace("--window-size 4095,0", "--window-size wide")
    with pytest.raises(SpecError, match="--window-size 'wide' is not two integers"):
        parse_megatron(text, vocab_size=plan.model.vocab_size)


def test_several_window_sizes_launch_at_the_largest_and_say_so() -> None:
    """Megatron-LM has one --window-size: a model with 1,024- and 4,096-token windows launches both at 4,096
    (4095,0), and the note names the windows the plan priced."""
    plan = _plan("mistral-7b-v0.1", 8, 8)
    groups = list(plan.model.layers)
    decoder = next(i for i, g in enumerate(groups) if g.attention_window)
    first = groups[decoder].model_copy(update={"count": 16, "attention_window": 1024})
    rest = groups[decoder].model_copy(update={"count": groups[decoder].count - 16})
    model = plan.model.model_copy(update={"layers": (*groups[:decoder], first, rest, *groups[decoder + 1:])})
    mixed = dataclasses.replace(plan, model=model)
    assert sorted({w for w in model.decoder_windows if w}) == [1024, 4096]
    assert _flags(megatron_command(mixed))["--window-size"] == "4095,0"
    assert any("at the largest, 4,096 tokens, where the plan priced each at its own (1,024)" in n
               for n in megatron_notes(mixed))
