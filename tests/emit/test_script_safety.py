"""Emitted launch scripts never execute text taken from a model or cluster name.

Each script is built from a plan whose model (and cluster) name is hostile shell text, checked with
`bash -n`, then run for real with shim `torchrun`, `vllm`, `python`, `python3` and `srun` binaries
(each `exit 0`) first on PATH in a temporary directory: a hostile word that ran would create a marker
file there. Names with control characters are refused with exit 2 before any script is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.api import evaluate, train_job
from autoshard.cli import app
from autoshard.emit.megatron.script import megatron_script
from autoshard.emit.serve_script import serve_script
from autoshard.emit.shell import comment, shell_join, shell_word
from autoshard.search.serve.solve import evaluate_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

# Every payload tries to create $MARK/<something>; {m} is the marker directory.
HOSTILE = {
    "single-quote-break": "x'; touch {m}/q1; echo '",
    "command-substitution": "$(touch {m}/cs)",
    "backticks": "`touch {m}/bt`",
    "double-quote-break": 'x"; touch {m}/dq; echo "',
    "brace-close": "x}}; touch {m}/br; echo {{",
    "glob-and-semicolon": "a*;touch {m}/gl",
    "dollar-brace": "${{IFS}}touch${{IFS}}{m}/ifs",
    "leading-dash": "--trust-remote-code;touch {m}/dash",
    "newline": "x\ntouch {m}/nl\n#",  # refused by the specs; the emitters must still hold it (API callers)
    "carriage-return": "x\rtouch {m}/cr",
}
SHIMS = ("torchrun", "vllm", "python", "python3", "srun")


def _shim_dir(tmp: Path) -> Path:
    shim = tmp / "shim"
    shim.mkdir(exist_ok=True)
    for name in SHIMS:
        (shim / name).write_text("#!/bin/sh\nexit 0\n")
        (shim / name).chmod(0o755)
    return shim


def _run_script(tmp: Path, text: str, env_extra: dict[str, str] | None = None) -> None:
    """bash -n, then run the script with the shims; assert no marker appeared and the script ran
    through to the launcher (exit 0)."""
    path = tmp / "launch.sh"
    path.write_text(text)
    check = subprocess.run(["/bin/bash", "-n", str(path)], capture_output=True, text=True, timeout=20)
    assert check.returncode == 0, check.stderr + "\n" + text
    env = {"PATH": f"{_shim_dir(tmp)}:/usr/bin:/bin", "HOME": str(tmp), "DATA_PATH": "data/corpus",
           "TOKENIZER_MODEL": "tok", "MEGATRON_LM": str(tmp), "MASTER_ADDR": "localhost", "NODE_RANK": "0",
           "HEAD_IP": "10.0.0.1", **(env_extra or {})}
    run = subprocess.run(["/bin/bash", str(path)], capture_output=True, text=True, timeout=30, env=env, cwd=tmp)
    markers = sorted(p.name for p in (tmp / "mark").iterdir())
    assert markers == [], f"hostile text ran: {markers}\n{text}"
    assert run.returncode == 0, run.stderr + "\n" + text


@pytest.fixture(scope="module")
def train_plan():
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100").with_gpus(16)
    return evaluate(model, cluster, train_job(model, seq_len=4096, global_batch_size=64), tp=2, pp=2)


@pytest.fixture(scope="module")
def serve_plans():
    job = ServeJob(input_len=1000, output_len=1000)
    one = evaluate_serve(load_model("llama-3.1-8b"), load_cluster("dgx-h100").with_gpus(8), job, tp=2, dp=4)
    spanning = evaluate_serve(load_model("llama-3.1-70b"), load_cluster("dgx-h100").with_gpus(16), job, tp=8, pp=2)
    replicas = evaluate_serve(load_model("llama-3.1-70b"), load_cluster("dgx-h100").with_gpus(16), job, tp=4, dp=4)
    return {"one-node": one, "spanning": spanning, "replicas": replicas}


def _renamed(plan, name: str):
    model = plan.model.model_copy(update={"name": name, "source": f"https://huggingface.co/{name}/config.json"})
    cluster = plan.cluster.model_copy(update={"name": name})
    return dataclasses.replace(plan, model=model, cluster=cluster)


def _marked(tmp_path: Path, payload: str) -> str:
    (tmp_path / "mark").mkdir()
    return payload.format(m=tmp_path / "mark")


@pytest.mark.parametrize("payload", list(HOSTILE.values()), ids=list(HOSTILE))
def test_megatron_script_never_runs_a_hostile_name(tmp_path: Path, train_plan, payload: str) -> None:
    name = _marked(tmp_path, payload)
    text = megatron_script(_renamed(train_plan, name))
    _run_script(tmp_path, text)
    assert "CKPT_DIR=${CKPT_DIR:-checkpoints/" in text


@pytest.mark.parametrize("shape", ["one-node", "spanning", "replicas"])
@pytest.mark.parametrize("launcher", ["vllm", "sglang"])
@pytest.mark.parametrize("payload", [*list(HOSTILE.values())[:4], HOSTILE["newline"]], ids=[*list(HOSTILE)[:4], "newline"])
def test_serve_scripts_never_run_a_hostile_name(tmp_path: Path, serve_plans, launcher: str, shape: str,
                                                payload: str) -> None:
    name = _marked(tmp_path, payload)
    plan = _renamed(serve_plans[shape], name)
    text = serve_script(plan, launcher)
    _run_script(tmp_path, text)
    # the hostile repo id reaches the launcher as one intact word (a newline in it spans script lines)
    body = [line for line in text.splitlines() if line.strip().startswith(("vllm ", "python "))]
    assert body
    if "\n" not in name:
        assert all(plan.model_path in shlex.split(line) for line in body)


def test_shell_word_round_trips_through_a_posix_split() -> None:
    words = ["plain", "a b", "it's", "$(id)", "`id`", "x\ny", "$HEAD_IP", "$HEAD_IP_1:5000", "${X}/y", "$X$(id)",
             "", "*", "~", "a;b", "--flag=1"]
    assert shlex.split(shell_join(words)) == words
    assert shell_word("$HEAD_IP:5000") == '"$HEAD_IP:5000"'  # a script variable still expands
    assert shell_word("$X$(id)") == "'$X$(id)'"  # ... but nothing else does
    assert comment("a\nb\r\x1bc\u202ed") == "a b c d"


@pytest.mark.parametrize("name", ["bad\nname", "tab\there", "bell\x07", "cr\rname", "esc\x1b[31m", "nel\x85x",
                                  "ls\u2028x", "rtl\u202eexe.hs"])
@pytest.mark.parametrize("where", ["yaml", "hf"])
def test_control_characters_in_names_are_refused(tmp_path: Path, name: str, where: str) -> None:
    if where == "yaml":
        text = (Path(__file__).resolve().parents[2] / "models" / "llama-3.1-8b.yaml").read_text()
        path = tmp_path / "m.yaml"
        path.write_text(text.replace("name: llama-3.1-8b", f"name: {json.dumps(name)}", 1))
    else:
        path = tmp_path / "config.json"
        path.write_text(json.dumps({
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
            "max_position_embeddings": 8192, "_name_or_path": name}))
    result = CliRunner().invoke(app, ["solve", str(path), "dgx-h100", "--gpus", "8", "--emit", "megatron"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    flat = " ".join(result.stderr.split())
    key = "name" if where == "yaml" else "_name_or_path"
    assert f"field '{key}'" in flat and "control characters" in flat, flat


def test_cli_script_from_hostile_hf_name_is_inert(tmp_path: Path) -> None:
    """End to end, as the release check does it: a hostile `_name_or_path` through `solve --emit -o`."""
    mark = tmp_path / "mark"
    mark.mkdir()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 8192,
        "_name_or_path": f"x'; touch {mark}/P1; echo '$(touch {mark}/P2)"}))
    for mode, launcher in (("train", "megatron"), ("serve", "vllm"), ("serve", "sglang")):
        out = tmp_path / f"{launcher}.sh"
        result = CliRunner().invoke(app, ["solve", str(hf / "config.json"), "dgx-h100", "--gpus", "8", "--mode", mode,
                                          "--emit", launcher, "-o", str(out), "--time-limit", "5", "--workers", "1"])
        assert result.exit_code == 0, result.output
        assert os.access(out, os.X_OK)
        _run_script(tmp_path, out.read_text())
