"""The max model length a launch line starts with, as the engines decide it.

- No --max-model-len on a vLLM line: vLLM 0.33.0 takes the model's context (`_get_and_verify_max_len`,
  vllm/config/model.py:2545-2683: max_position_embeddings, the RoPE factor applied only to types other
  than llama3/YaRN) and refuses to start unless the KV cache holds one request of it
  (`check_enough_kv_cache_memory`, vllm/v1/core/kv_cache_planning.py:151-185). The reader checked the
  start at the request shape: Llama 3.1 70B at TP 2 on H100 (a KV cache of 26,720 tokens) was priced;
  vLLM refuses it. The requests are still priced at their shape.
- VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vllm/envs.py:1115-1118: "1" or "true") or
  SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (SGLang 0.5.23 srt/environ.py:143-150, 320) on the line:
  the engine starts past the model's context with a warning, so the reader prices it with a note
  instead of refusing it (exit 2)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.api_serve import evaluate_vllm
from autoshard.cli import app
from autoshard.emit.sglang.parse import parse_sglang
from autoshard.emit.vllm.context import derived_max_model_len
from autoshard.emit.vllm.parse import parse_vllm
from autoshard.errors import InfeasibleError, SpecError
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob
from autoshard.specs.rope import RopeScaling

L70, L8, DSV3 = load_model("llama-3.1-70b"), load_model("llama-3.1-8b"), load_model("deepseek-v3")
H100 = load_cluster("dgx-h100")
JOB = ServeJob(input_len=1000, output_len=1000)
LLAMA70 = "vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size {tp}"
LONG8 = "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 200000"


def test_derived_max_model_len_is_vllms():
    assert derived_max_model_len(L70) == 131072  # llama3 scaling: max_position_embeddings already scaled
    assert derived_max_model_len(DSV3) == 163840  # YaRN: likewise
    linear = L8.model_copy(update={"rope_scaling": RopeScaling(type="linear", factor=2.0)})
    assert derived_max_model_len(linear) == 262144  # any other type: times its factor


def test_gemma3_context_is_not_scaled_again():
    """vLLM 0.33.0 skips the RoPE factor for Gemma 3 (config/model.py:2601-2603: its 131,072 is already the
    scaled context): the import marks its linear factor 8 `extends_context: false`, so the line is checked
    at 131,072, not 1,048,576, and a longer --max-model-len is refused."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the vision tower is left out: said on import
        gemma = load_model(Path(__file__).parents[1] / "fixtures" / "hf" / "gemma-3-27b.json")
    scaling = gemma.rope_scaling
    assert (scaling.type, scaling.factor, scaling.extends_context) == ("linear", 8.0, False)
    assert derived_max_model_len(gemma) == 131072
    with pytest.raises(SpecError, match="131,072"):
        evaluate_vllm(gemma, H100.with_gpus(8), "vllm serve google/gemma-3-27b-it --tensor-parallel-size 8 "
                      "--max-model-len 262144", job=JOB)


def test_no_max_model_len_checks_the_start_at_the_models_context():
    with pytest.raises(InfeasibleError, match=r"the KV cache holds 26720 tokens, less than one request of "
                                              r"max_model_len 131072.*\nas read from the command: no --max-model-len"):
        evaluate_vllm(L70, H100.with_gpus(2), LLAMA70.format(tp=2), job=JOB)
    given = evaluate_vllm(L70, H100.with_gpus(2), LLAMA70.format(tp=2) + " --max-model-len 2000", job=JOB)
    assert given.max_model_len == 2000 and given.prediction.memory.kv_cache_tokens == 26720
    # TP 4 holds 488,624 tokens: it starts at 131,072 and is priced at the request shape, as with a short one
    plan = evaluate_vllm(L70, H100.with_gpus(4), LLAMA70.format(tp=4), job=JOB)
    short = evaluate_vllm(L70, H100.with_gpus(4), LLAMA70.format(tp=4) + " --max-model-len 2000", job=JOB)
    assert plan.max_model_len == 131072 and "--max-model-len 131072" in plan.launch["vllm"]
    assert plan.prediction.concurrency == short.prediction.concurrency == 244
    assert plan.throughput_tokens_per_s == pytest.approx(short.throughput_tokens_per_s, rel=1e-12)
    assert plan.throughput_tokens_per_s == pytest.approx(3813.6, rel=2e-3)
    assert any(w.startswith("no --max-model-len: vLLM takes llama-3.1-70b's context, 131,072 tokens") for w in plan.warnings)
    assert not any("no --max-model-len" in w for w in short.warnings)


def test_sglang_line_keeps_the_request_shape():
    # SGLang caps a request at its KV pool (a warning, srt/managers/tp_worker.py:555-571), not a refusal
    plan = evaluate_vllm(L70, H100.with_gpus(2), "python -m sglang.launch_server --model-path "
                         "meta-llama/Llama-3.1-70B-Instruct --tp-size 2", job=JOB, sglang=True)
    assert plan.max_model_len == 2000


@pytest.mark.parametrize("value", ["1", "true", "TRUE"])
def test_vllm_allow_long_max_model_len_is_priced_with_a_note(value):
    assert parse_vllm(f"VLLM_ALLOW_LONG_MAX_MODEL_LEN={value} {LONG8}").allow_long_context
    plan = evaluate_vllm(L8, H100.with_gpus(1), f"VLLM_ALLOW_LONG_MAX_MODEL_LEN={value} {LONG8}", job=JOB)
    assert plan.max_model_len == 200000 and plan.prediction.concurrency == 227
    assert plan.throughput_tokens_per_s == pytest.approx(6682.8, rel=2e-3)
    note = next(w for w in plan.warnings if "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in w)
    assert note.startswith("--max-model-len 200,000 is longer than llama-3.1-8b's 131,072-token context")
    assert "not the planner's to promise" in note


def test_without_the_variable_the_line_is_still_refused():
    for env in ("", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=0 ", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 "):
        assert not parse_vllm(env + LONG8).allow_long_context
        with pytest.raises(SpecError, match="unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set"):
            evaluate_vllm(L8, H100.with_gpus(1), env + LONG8, job=JOB)
    result = CliRunner().invoke(app, ["evaluate", "dgx-h100", "--gpus", "1", "--from-vllm", LONG8])
    assert result.exit_code == 2
    ok = CliRunner().invoke(app, ["evaluate", "dgx-h100", "--gpus", "1", "--from-vllm",
                                  "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 " + LONG8])
    assert ok.exit_code == 0 and "not the planner's to promise" in " ".join(ok.output.split())


def test_sglang_allow_overwrite_longer_context_len():
    line = "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --context-length 200000"
    assert parse_sglang("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=yes " + line).allow_long_context
    plan = evaluate_vllm(L8, H100.with_gpus(1), "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 " + line, job=JOB,
                         sglang=True)
    assert plan.max_model_len == 200000
    assert any(w.startswith("--context-length 200,000 is longer") and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in w
               for w in plan.warnings)
    with pytest.raises(SpecError, match="unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is set"):
        evaluate_vllm(L8, H100.with_gpus(1), line, job=JOB, sglang=True)


def test_relaunch_lines_keep_the_variable():
    plan = evaluate_vllm(L8, H100.with_gpus(1), "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 " + LONG8, job=JOB)
    assert plan.launch["vllm"].startswith("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vllm serve ")
    assert plan.launch["sglang"].startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m sglang")
    again = evaluate_vllm(L8, H100.with_gpus(1), plan.launch["vllm"], job=JOB)
    assert again.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-12)
    short = evaluate_vllm(L8, H100.with_gpus(1), LONG8.replace("200000", "2000"), job=JOB)
    assert "ALLOW" not in short.launch["vllm"] + short.launch["sglang"]


QWEN = load_model("qwen3-235b-a22b")
QLINE = "vllm serve Qwen/Qwen3-235B-A22B-FP8 --tensor-parallel-size 8 "
YARN = '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}'


def _qwen(line: str):
    return evaluate_vllm(QWEN, H100.with_gpus(8), line, job=ServeJob(input_len=1000, output_len=1000,
                                                                     weight_dtype="fp8"))


def test_hf_overrides_set_the_context_as_vllm_derives_it():
    """vLLM 0.33.0 leaves max_position_embeddings unscaled for YaRN (config/model.py:2602-2632): Qwen's
    YaRN override alone keeps Qwen3's 40,960 and vLLM refuses --max-model-len 131072 (so does the reader,
    naming both fixes); with "max_position_embeddings": 131072 in the override it starts there. A linear
    override scales it by its factor."""
    with pytest.raises(SpecError, match=r'does not scale it by a yarn override\'s factor .* add '
                                        r'"max_position_embeddings": 131072 to --hf-overrides'):
        _qwen(QLINE + f"--hf-overrides '{YARN}}}' --max-model-len 131072")
    plan = _qwen(QLINE + f"--hf-overrides '{YARN}, \"max_position_embeddings\": 131072}}' --max-model-len 131072")
    assert plan.max_model_len == 131072 and plan.prediction.concurrency == 464
    assert plan.throughput_tokens_per_s == pytest.approx(6787.9, rel=2e-3)
    assert any(w.startswith("--hf-overrides: vLLM's max model length for qwen3-235b-a22b is 131,072 (max_position_embeddings 40,960")
               for w in plan.warnings)
    allowed = _qwen(f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 {QLINE}--hf-overrides '{YARN}}}' --max-model-len 131072")
    assert allowed.max_model_len == 131072 and any("not the planner's to promise" in w for w in allowed.warnings)
    linear = _qwen(QLINE + "--hf-overrides '{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}'")
    assert linear.max_model_len == 81920  # no --max-model-len: the derived 2 x 40,960
    assert derived_max_model_len(QWEN, '{"rope_parameters": {"rope_type": "dynamic", "factor": 4}}') == 163840
    with pytest.raises(SpecError, match="--hf-overrides expects a JSON object"):
        parse_vllm(QLINE + "--hf-overrides not-json")


def test_sglang_starts_with_a_pool_smaller_than_its_context_length():
    """SGLang 0.5.23 starts when the KV pool holds fewer tokens than --context-length (it warns and caps a
    request at the pool: srt/managers/tp_worker.py:555-571); vLLM refuses. The reader refused both."""
    line = "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B-Instruct --tp-size 2 "
    plan = evaluate_vllm(L70, H100.with_gpus(2), line + "--context-length 131072", job=JOB, sglang=True)
    held = plan.prediction.memory.kv_cache_tokens  # SGLang's pool over its own memory baseline (84badab)
    assert held == 27437 and plan.prediction.concurrency == 13
    assert plan.throughput_tokens_per_s == pytest.approx(394.0, rel=2e-3)
    assert any(w.startswith(f"--context-length 131,072: the KV pool holds {held:,} tokens, fewer than one request")
               for w in plan.warnings)
    short = evaluate_vllm(L70, H100.with_gpus(2), line + "--context-length 2000", job=JOB, sglang=True)
    assert short.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-12)
    assert not any("KV pool" in w for w in short.warnings)
    with pytest.raises(InfeasibleError, match="less than one request of max_model_len 131072"):
        evaluate_vllm(L70, H100.with_gpus(2), LLAMA70.format(tp=2) + " --max-model-len 131072", job=JOB)
