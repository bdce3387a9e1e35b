"""The checkpoint a serving launch line loads when MODEL is a config.json.

A config.json without `_name_or_path` is named after its folder ("x" for x/config.json): the launch lines
said `vllm serve x`, which vLLM would look up as a Hugging Face repository and fail to find. They now name
the folder itself (vLLM and SGLang load a local directory holding config.json and the weights), quoted as
the shell needs; a config naming its repository (`_name_or_path`) still launches that repository.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.cli import app

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "phi-4.json"  # names microsoft/phi-4
FAST = ["--time-limit", "5", "--workers", "1"]


def _launch(config: Path) -> dict[str, str]:
    result = CliRunner().invoke(app, ["solve", str(config), "dgx-h100", "--gpus", "8", "--mode", "serve",
                                      "--disaggregate", "off", "--json", *FAST])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["launch"]


def _model_word(line: str) -> str:
    words = shlex.split(line)
    return words[words.index("serve") + 1] if "serve" in words else words[words.index("--model-path") + 1]


@pytest.mark.parametrize("folder", ["x", "my checkpoint"])
def test_an_unnamed_config_launches_its_folder(tmp_path: Path, folder: str) -> None:
    config = json.loads(FIXTURE.read_text())
    assert config.pop("_name_or_path") == "microsoft/phi-4"
    path = tmp_path / folder / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    launch = _launch(path)
    assert _model_word(launch["vllm"]) == str(path.parent)  # was "x": no such Hugging Face repository
    assert _model_word(launch["sglang"]) == str(path.parent)  # the SGLang line agrees


def test_a_named_config_launches_its_repository(tmp_path: Path) -> None:
    path = tmp_path / "x" / "config.json"
    path.parent.mkdir()
    path.write_text(FIXTURE.read_text())
    launch = _launch(path)
    assert _model_word(launch["vllm"]) == "microsoft/phi-4"
    assert _model_word(launch["sglang"]) == "microsoft/phi-4"


def test_cli_emit_prints_the_folder(tmp_path: Path) -> None:
    config = json.loads(FIXTURE.read_text())
    assert config.pop("_name_or_path") == "microsoft/phi-4"
    path = tmp_path / "x" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    for engine, prefix in (("vllm", "vllm serve "), ("sglang", "python -m sglang.launch_server --model-path ")):
        result = CliRunner().invoke(app, ["solve", str(path), "dgx-h100", "--gpus", "8", "--mode", "serve",
                                          "--disaggregate", "off", "--emit", engine, *FAST])
        assert result.exit_code == 0, result.output
        assert f"{prefix}{shlex.quote(str(path.parent))} " in result.stdout
