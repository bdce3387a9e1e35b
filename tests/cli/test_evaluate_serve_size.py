"""`evaluate --from-vllm/--from-sglang` without --gpus: the bundled cluster (dgx-h100 is 1,024 GPUs) is
sized to the command's GPUs in whole nodes, as --from-megatron runs on its world size. It used to stay
at the file's size: the terminal said "1,016 of its 1,024 GPUs idle" and "49 per GPU of all 1,024"
while the JSON said num_gpus 8 and 6,328 tokens/s per GPU."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from autoshard.cli import app

SGLANG_TP2_DP4 = "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --tp 2 --dp 4"
VLLM_TP2 = "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2"
VLLM_TP8_PP2 = "vllm serve meta-llama/Llama-3.1-70B --tensor-parallel-size 8 --pipeline-parallel-size 2"


def cli(*args: str):
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize(("flag", "command", "used", "cluster_gpus"), [
    ("--from-sglang", SGLANG_TP2_DP4, 8, 8),
    ("--from-vllm", VLLM_TP8_PP2, 16, 16),
    ("--from-vllm", VLLM_TP2, 2, 8),  # one whole node: 6 of its GPUs idle, said so
])
def test_the_cluster_is_the_commands_nodes(flag, command, used, cluster_gpus):
    text = cli("evaluate", "dgx-h100", flag, command)
    assert text.exit_code == 0, text.stderr
    flat = " ".join(text.stdout.split())
    obj = json.loads(cli("evaluate", "dgx-h100", flag, command, "--json").stdout)
    assert obj["num_gpus"] == used
    idle = cluster_gpus - used
    assert (f"; {idle} of its {cluster_gpus} GPUs idle)" in flat) == (idle > 0)
    assert "1,024" not in flat
    # the terminal's per-GPU figure is the JSON's
    per_gpu = float(re.search(r"\(([\d,]+) per GPU", flat).group(1).replace(",", ""))
    assert per_gpu == pytest.approx(obj["predicted"]["tokens_per_s_per_gpu"], abs=0.5)


def test_the_prediction_does_not_depend_on_the_idle_nodes():
    sized = json.loads(cli("evaluate", "dgx-h100", "--from-sglang", SGLANG_TP2_DP4, "--json").stdout)
    large = json.loads(cli("evaluate", "dgx-h100", "--gpus", "64", "--from-sglang", SGLANG_TP2_DP4, "--json").stdout)
    assert sized["predicted"] == large["predicted"]
    assert large["num_gpus"] == 8  # --gpus still sizes the cluster when given


@pytest.mark.parametrize(("flag", "command", "fix"), [
    ("--from-vllm", "vllm serve meta-llama/Llama-3.1-70B --tensor-parallel-size 3",
     "TP 3 does not divide the 64 attention heads; pass --tensor-parallel-size one of 1, 2, 4, 8"),
    ("--from-sglang", "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B --tp-size 6",
     "TP 6 does not divide the 64 attention heads; pass --tp-size one of 1, 2, 4, 8"),
])
def test_an_illegal_tensor_parallel_size_names_the_flag_and_its_legal_values(flag, command, fix):
    """A TP the model's heads cannot split is bad input (exit 2) and the message says which values of the
    engine's own flag would run (inside one 8-GPU NVLink domain: the divisors of the 64 heads and 8 KV heads)."""
    result = cli("evaluate", "dgx-h100", flag, command)
    assert result.exit_code == 2
    assert fix in " ".join(result.stderr.split())
