"""The serving memory table names DeepEP's buffer by the kernels the engine's line runs (#13): a vLLM
`deepep_high_throughput` line (a prefill instance's) holds the normal kernels' fixed buffer, a
`deepep_low_latency` line the low-latency one at its budget, an SGLang `--deepep-mode auto` engine both."""

from __future__ import annotations

import re

from autoshard.api_serve import evaluate_vllm
from autoshard.costmodel.serve.ep_buffers import (
    VLLM_DEEPEP_NVL_BYTES, deepep_buffer_label, deepep_ll_buffer_bytes, deepep_sglang_engine_bytes,
)
from autoshard.report.serving import render_serve_plan
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.units import GIB
from report_fixtures import render  # noqa: F401  (pytest fixture)

DSV3 = load_model("deepseek-v3")
H100x16 = load_cluster("dgx-h100").with_gpus(16)
JOB = ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)
LINE = ("vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 --data-parallel-size 16 "
        "--enable-expert-parallel --all2all-backend {backend} --max-model-len 2000 --max-num-seqs 128 "
        "--max-num-batched-tokens 256")


def _memory_rows(text: str) -> dict[str, float]:
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\s*(DeepEP [a-z +-]+buffers)\s+([0-9.]+)\s*$", line)
        if m:
            rows[m.group(1)] = float(m.group(2))
    return rows


def test_vllm_high_throughput_line_is_labelled_by_its_kernels(render):
    plan = evaluate_vllm(DSV3, H100x16, LINE.format(backend="deepep_high_throughput"), job=JOB)
    assert plan.prediction.config.role == "prefill"
    # 1 GiB NVLink + 1 GiB RDMA buffer across the two nodes (vllm_deepep_ht_bytes)
    assert _memory_rows(render(render_serve_plan, plan, width=160)) == {"DeepEP high-throughput buffers": 2.0}


def test_vllm_low_latency_line_is_labelled_low_latency(render):
    plan = evaluate_vllm(DSV3, H100x16, LINE.format(backend="deepep_low_latency"), job=JOB)
    want = round((deepep_ll_buffer_bytes(DSV3, 256, 16) + VLLM_DEEPEP_NVL_BYTES) / GIB, 1)
    assert want == 4.6  # DeepSeek-V3's 4.55 GiB at 256 tokens a rank, as the README states
    assert _memory_rows(render(render_serve_plan, plan, width=160)) == {"DeepEP low-latency buffers": want}


def test_sglang_auto_mode_holds_both_layouts(render):
    line = ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp-size 16 --attn-dp-size 16 "
            "--ep-size 16 --context-length 2000 --max-running-requests 2048 --moe-a2a-backend deepep "
            "--deepep-mode auto")
    plan = evaluate_vllm(DSV3, H100x16, line, job=JOB, sglang=True)
    cfg = plan.prediction.config
    assert cfg.engine == "sglang" and deepep_buffer_label(cfg) == "DeepEP normal + low-latency buffers"
    want = round(deepep_sglang_engine_bytes(DSV3, H100x16.primary.gpu, cfg) / GIB, 1)
    assert want > 0 and _memory_rows(render(render_serve_plan, plan, width=160)) == {
        "DeepEP normal + low-latency buffers": want}


def test_engines_without_deepep_show_no_row(render):
    line = "vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 8 --pipeline-parallel-size 2 --max-model-len 2000"
    plan = evaluate_vllm(DSV3, H100x16, line, job=JOB)
    assert _memory_rows(render(render_serve_plan, plan, width=160)) == {}
