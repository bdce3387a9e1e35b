"""A training job no layout fits suggests only fixes that can help.

DeepSeek-V3 (671 B params) on 128 H100s: model states are 18 bytes/param = 11,249 GiB, 87.9 GiB per GPU
even fully sharded over all 128, above the 65.3 GiB a rank has. Recompute, a shorter sequence or ZeRO-3
cannot bring that down (the message used to list all three); only GPUs can (11,249 / 65.3 -> 176 GPUs).
When the states fit fully sharded but not in the layouts tried, ZeRO-3 is the fix, not activation
savings; when the states fit and activations overflow, --recompute full is offered unless it is pinned.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autoshard.cli import app

FAST = ["--time-limit", "5", "--workers", "1"]


def _fixes(*argv: str) -> str:
    result = CliRunner().invoke(app, ["solve", *argv, *FAST])
    assert result.exit_code == 1, result.output
    flat = " ".join(result.stderr.split())
    return flat[flat.index("Nearest fixes:"):]


def test_states_past_full_sharding_suggest_only_gpus() -> None:
    fixes = _fixes("deepseek-v3", "dgx-h100", "--gpus", "128")
    assert "model states need about 11,249 GiB in total, 87.9 GiB per GPU even fully sharded over all 128" in fixes
    assert "at least ~176 GPUs (try --gpus 256)" in fixes
    for useless in ("--recompute full", "--seq-len", "--global-batch-size", "--zero-stage 3"):
        assert useless not in fixes, fixes


@pytest.mark.parametrize(("argv", "offered", "left_out"), [
    # 1,183 GiB of states over 32 GPUs is 37 GiB each: ZeRO-3 (opt-in) fits them; activations are not the issue
    (["llama-3.1-70b", "dgx-h100", "--gpus", "32", "--tp", "1", "--pp", "1"],
     ["ZeRO-3/FSDP (--zero-stage 3, needs PP 1)", "fewer pinned knobs (pinned: tp=1, pp=1)"],
     ["--recompute full", "--seq-len", "more GPUs"]),
    # the states fit (56.1 of 65.3 GiB): activations overflow, and full recompute is already pinned
    (["llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "1", "--seq-len", "65536",
      "--recompute", "full"],
     ["a shorter --seq-len or a smaller --global-batch-size (activations)", "--zero-stage 3"],
     ["try --recompute full", "; --recompute full", "more GPUs"]),
])
def test_fixes_follow_what_overflows(argv: list[str], offered: list[str], left_out: list[str]) -> None:
    fixes = _fixes(*argv)
    for text in offered:
        assert text in fixes, fixes
    for text in left_out:
        assert text not in fixes, fixes
