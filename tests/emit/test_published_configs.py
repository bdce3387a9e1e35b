"""Every published Megatron-family training configuration of the calibration set evaluates.

tests/emit/published_megatron.yaml holds each run as the Megatron-LM launch it describes (with its
citation). `autoshard evaluate CLUSTER --from-megatron CMD` must predict it: exit 0, or exit 1 with the
memory that overflows ("needs X GiB per GPU, has Y GiB"), never exit 2 (refused as bad input).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autoshard.cli import app

ROWS = yaml.safe_load((Path(__file__).parent / "published_megatron.yaml").read_text(encoding="utf-8"))


def _evaluate(row: dict) -> tuple[int, dict | None, str]:
    res = CliRunner().invoke(app, ["evaluate", row["cluster"], "--gpus", str(row["gpus"]),
                                   "--from-megatron", row["command"], "--json"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    try:
        obj = json.loads(res.stdout)
    except ValueError:
        obj = None
    return res.exit_code, obj, res.stderr


def test_the_table_covers_every_megatron_family_training_run() -> None:
    ids = {r["id"] for r in ROWS}
    assert len(ids) == len(ROWS) == 52
    families = {i.split("-")[0] for i in ids}
    assert families == {"mlm", "megatron2021", "korthikanti", "nemo2407", "moezoo", "mcore"}
    for row in ROWS:
        assert row["source"] and "pretrain_gpt.py" in row["command"]


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_published_configuration_evaluates(row: dict) -> None:
    code, obj, stderr = _evaluate(row)
    assert code in (0, 1), f"{row['id']}: exit {code}\n{stderr}"
    assert obj is not None and obj["num_gpus"] == row["gpus"]
    plan = obj["plan"]
    # the degrees are the command's
    for flag, key in (("--tensor-model-parallel-size", "tp"), ("--pipeline-model-parallel-size", "pp")):
        m = re.search(rf"{flag} (\d+)", row["command"])
        assert m and plan[key] == int(m.group(1))
    if code == 1:
        assert not obj["predicted"]["memory_gib"]["fits"]
        assert re.search(r"needs [\d.]+ GiB per GPU, has [\d.]+ GiB", stderr), stderr
    else:
        assert obj["predicted"]["memory_gib"]["fits"]


def test_uneven_layers_get_the_layout_megatron_needs() -> None:
    """Qwen3-235B: 94 layers over PP 8 x VPP 4 = 32 chunks. 94 + embedding + loss = 96 = 32 x 3, so
    Megatron-LM runs it with both --account-for-*-in-pipeline-split flags: E+2t | 3t x 30 | 2t+L."""
    row = next(r for r in ROWS if r["id"] == "moezoo-qwen3-235b-h100-crossnode-ep32")
    code, obj, stderr = _evaluate(row)
    assert code in (0, 1)
    assert "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in stderr
    sizes = [len(s["layers"]) for s in obj["plan"]["stages"]]
    assert sizes == [3] + [3] * 30 + [3]
    assert obj["plan"]["stages"][0]["layers"] == ["embedding", "decoder.0", "decoder.1"]
    launch = obj["launch"]["megatron"]
    assert "--account-for-embedding-in-pipeline-split" in launch and "--account-for-loss-in-pipeline-split" in launch


def test_deepseek_v3_layout_string_is_read() -> None:
    """'Et|(tt|)*30L' (the source's layout): the embedding and one layer, 30 chunks of two, the loss alone."""
    row = next(r for r in ROWS if r["id"] == "mcore-dsv3-gb200-256gpu-final")
    code, obj, _ = _evaluate(row)
    assert code in (0, 1)
    assert obj["plan"]["vpp"] == 4
    sizes = [len(s["layers"]) for s in obj["plan"]["stages"]]
    assert sizes == [2] + [2] * 30 + [1]
    assert obj["plan"]["stages"][-1]["layers"] == ["output"]
