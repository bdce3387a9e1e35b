"""A plan priced from a launch line whose config overrides set the model's context (vLLM's --hf-overrides,
SGLang's --json-model-override-args) is relaunched with them (`emit.vllm.context.carry_overrides`):
without them neither engine derives that context, and vLLM 0.33.0 refuses a --max-model-len past
max_position_embeddings (config/model.py:2652-2683), SGLang 0.5.23 a --context-length past its derived
length (srt/configs/model_config.py:1291-1322). Before, the relaunch of Qwen3-235B at 131,072 tokens
dropped the override and read back as refused; now parse -> plan -> relaunch -> parse gives the same
context and figures, on both engines' lines."""

from __future__ import annotations

import json
import shlex

import pytest

from autoshard.api_serve import evaluate_vllm
from autoshard.emit.sglang import parse_sglang
from autoshard.emit.vllm.context import carry_overrides, sglang_context_len
from autoshard.errors import SpecError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

QWEN = load_model("qwen3-235b-a22b")
H100x8 = load_cluster("dgx-h100").with_gpus(8)
JOB = ServeJob(input_len=1000, output_len=1000, weight_dtype="fp8")
QLINE = "vllm serve Qwen/Qwen3-235B-A22B-FP8 --tensor-parallel-size 8 "
YARN = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        "max_position_embeddings": 131072}
COMPACT = json.dumps(YARN, separators=(",", ":"))


def _read(line: str, sglang: bool = False):
    return evaluate_vllm(QWEN, H100x8, line, job=JOB, sglang=sglang)


def _words(line: str) -> list[str]:
    return shlex.split(line)


def test_vllm_round_trip_keeps_the_context_and_figures():
    plan = _read(QLINE + f"--hf-overrides '{json.dumps(YARN)}' --max-model-len 131072")
    assert plan.max_model_len == 131072 and plan.prediction.concurrency == 464
    assert plan.throughput_tokens_per_s == pytest.approx(6787.9, rel=2e-3)
    words = _words(plan.launch["vllm"])
    at = words.index("--hf-overrides")
    assert words[at - 2:at] == ["--max-model-len", "131072"] and json.loads(words[at + 1]) == YARN
    assert f"--hf-overrides '{COMPACT}'" in plan.launch["vllm"]  # one shell word, single-quoted
    again = _read(plan.launch["vllm"])
    assert again.max_model_len == 131072 and again.prediction.concurrency == plan.prediction.concurrency
    assert again.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-12)
    assert again.launch["vllm"] == plan.launch["vllm"]
    # the SGLang relaunch carries the same object, and SGLang's reader takes its context from it
    assert f"--context-length 131072 --json-model-override-args '{COMPACT}'" in plan.launch["sglang"]
    sgl = _read(plan.launch["sglang"], sglang=True)
    assert sgl.max_model_len == 131072
    assert any(w.startswith("--json-model-override-args: SGLang's context length for qwen3-235b-a22b is 131,072 "
                            "(was 40,960)") for w in sgl.warnings)
    assert _read(sgl.launch["sglang"], sglang=True).throughput_tokens_per_s == pytest.approx(
        sgl.throughput_tokens_per_s, rel=1e-12)


def test_without_the_override_the_relaunch_is_refused():
    # what the relaunch line was before: the same line less --hf-overrides
    plan = _read(QLINE + f"--hf-overrides '{json.dumps(YARN)}' --max-model-len 131072")
    bare = plan.launch["vllm"].replace(f" --hf-overrides '{COMPACT}'", "")
    with pytest.raises(SpecError, match=r"--max-model-len 131,072 is longer than qwen3-235b-a22b's 40,960-token"):
        _read(bare)
    with pytest.raises(SpecError, match=r"--context-length 131,072 is longer than qwen3-235b-a22b's 40,960-token"):
        _read(plan.launch["sglang"].replace(f" --json-model-override-args '{COMPACT}'", ""), sglang=True)


def test_derived_context_without_max_model_len_round_trips():
    plan = _read(QLINE + "--hf-overrides '{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}'")
    assert plan.max_model_len == 81920  # vLLM scales a linear override's factor: 2 x 40,960
    again = _read(plan.launch["vllm"])
    assert again.max_model_len == 81920
    assert again.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-12)


def test_quoting_and_every_node_line():
    odd = '{"max_position_embeddings": 131072, "note": "it\'s $HOME; `x`"}'
    launch = {"vllm": "vllm serve m --max-model-len 131072 --max-num-seqs 8",
              "vllm_nodes": "vllm serve m --max-model-len 131072 --x 1\nvllm serve m --max-model-len 131072 --headless",
              "sglang": "python -m sglang.launch_server --model-path m --context-length 131072 --tp-size 8",
              "megatron": "torchrun pretrain_gpt.py"}
    out = carry_overrides(launch, odd)
    assert out["megatron"] == launch["megatron"]
    for key in ("vllm", "sglang"):
        words = _words(out[key])
        flag = "--hf-overrides" if key == "vllm" else "--json-model-override-args"
        assert json.loads(words[words.index(flag) + 1]) == json.loads(odd)
        assert words.index(flag) == words.index("--max-model-len" if key == "vllm" else "--context-length") + 2
    assert all(json.loads(_words(line)[6]) == json.loads(odd) for line in out["vllm_nodes"].split("\n"))
    assert carry_overrides(out, odd) == out and carry_overrides(launch, None) == launch


def test_sglang_derives_its_context_from_the_override():
    # SGLang's get_context_length: the factor unless original_max_position_embeddings is given or llama3
    assert sglang_context_len(QWEN, json.dumps(YARN)) == 131072
    assert sglang_context_len(QWEN, '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}') == 4 * 40960
    assert sglang_context_len(QWEN, '{"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}') == 40960
    assert sglang_context_len(QWEN, '{"max_position_embeddings": 65536}') == 65536
    assert parse_sglang("python -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-FP8 "
                        f"--json-model-override-args '{COMPACT}'").hf_overrides == COMPACT
    with pytest.raises(SpecError, match="--json-model-override-args expects a JSON object"):
        parse_sglang("python -m sglang.launch_server --model-path m --json-model-override-args '[1]'")
