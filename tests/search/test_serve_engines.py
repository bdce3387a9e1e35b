"""Serving plans priced for the engine they are launched with (#13 / #10): `solve --mode serve --target
sglang` prices SGLang's kernels (Triton's fused_moe for block-FP8 experts under its default MoE runner,
NVLS off), `--target vllm` and no target keep vLLM's (DeepGEMM where vLLM v0.11.0 hands it the experts),
every plan says which, and the other engine's figures for the same deployment come with it."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from autoshard import api
from autoshard.costmodel.serve.compute import (
    BLOCK_FP8_GEMM_HOPPER,
    _grouped_experts_s,
    model_serving_gpu,
)
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.api_serve import with_engine_check
from autoshard.costmodel.serve.engines import SGLANG_UNPRICED, engine_config, sglang_deepep, sglang_priced
from autoshard.costmodel.serve.ep_buffers import SGLANG_DEEPEP_TOKENS_MAX
from autoshard.costmodel.serve.fused_moe import TRITON_BLOCK_FP8_HOPPER
from autoshard.emit.pd import place, uses_deepep
from autoshard.errors import SpecError
from autoshard.search.serve.space import enumerate_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import WeightDtype
from conftest import closed_form_experts_s

QWEN = load_model("qwen3-235b-a22b")
H100x8 = load_cluster("dgx-h100").with_gpus(8)
FP8 = WeightDtype.FP8


@functools.cache
def _solved(framework: str) -> api.ServeSolution:
    job = api.serve_job_for(QWEN, weight_dtype="fp8")
    return api.plan_serving(QWEN, H100x8, job, top_k=1, pins=None, time_limit_s=30, num_workers=1, seed=0,
                            framework=framework)


def test_sglang_tp_sharded_ep_engine_prices_triton_experts():
    """Qwen3-235B-FP8 on 8 H100 as SGLang runs TP 4 x PP 2 with experts over EP 4 (no attention DP, so
    no DeepEP: its MoE runner `auto` takes Triton): a prefill chunk's experts at Triton's block-FP8 rate
    on 64-row tiles; the same engine priced for vLLM takes DeepGEMM's 128-row segments at the block
    kernels' rate (1,536-wide experts at TP 4: vLLM v0.11.0 hands them over)."""
    job = api.serve_job_for(QWEN, weight_dtype="fp8")
    plan = with_engine_check(api.evaluate_serve(QWEN, H100x8, job, tp=4, pp=2, dp=1, expert_parallel=True,
                                                framework="sglang"))
    cfg = plan.prediction.config
    assert (cfg.engine, cfg.deep_gemm, cfg.nccl_nvls) == ("sglang", False, False)
    assert "--moe-a2a-backend" not in plan.launch["sglang"]
    gpu = model_serving_gpu(QWEN, plan.pool.gpu, FP8)
    chunk = cfg.max_num_batched_tokens
    triton = closed_form_experts_s(QWEN, gpu, ep=4, tokens=chunk, rate=TRITON_BLOCK_FP8_HOPPER, tile=64)
    assert _grouped_experts_s(QWEN, gpu, cfg, chunk) == pytest.approx(triton, rel=1e-9)
    vllm_cfg = engine_config(cfg, "vllm", gpus_per_node=8)
    deep = closed_form_experts_s(QWEN, gpu, ep=4, tokens=chunk, rate=BLOCK_FP8_GEMM_HOPPER, tile=128)
    assert _grouped_experts_s(QWEN, gpu, vllm_cfg, chunk) == pytest.approx(deep, rel=1e-9)
    assert triton > 1.4 * deep
    # so the plan states the other engine's figures for the same deployment, vLLM the faster
    other = plan.engine_other
    assert other["engine"] == "vllm" and other["differs"] is True
    assert other["tokens_per_s"] > plan.throughput_tokens_per_s * 1.02
    assert "under vLLM" in other["note"] and "--target vllm" in other["note"]


def test_sglang_target_plans_deepep_engines():
    """--target sglang plans the attention-DP + EP engines on DeepEP (#13): Qwen3-235B-FP8 on 8 H100
    gets vLLM's interactive deployment (TP 4 x attention DP 2, EP 8, 238 requests per rank: 9,520
    output tokens/s, TPOT 50.0 ms; 240 and 9,608 before the Q/K norm was priced; 5,283 on TP 8 before),
    and a throughput-optimal one kept within the 256 decode tokens per rank of the DeepEP low-latency
    buffer its line sizes (TP 2 x DP 4, 197 per rank: 11,727 tokens/s, TPOT 67.2 ms, since SGLang's own
    capture list sized its graphs; 10,121 on TP 4 x PP 2 before the DeepEP engines). Nothing is left out.
    Its mixed steps (decodes with a prompt chunk) run DeepEP's normal kernels (`--deepep-mode auto`),
    vLLM's the low-latency ones: 1.9 % more than vLLM's 9,343 for the same deployment."""
    sol = _solved("sglang")
    for plan, shape, tokens, tpot in ((sol.plans[0], (4, 1, 2, 8, 238), 9520.3, 0.0500),
                                      (sol.alternative, (2, 1, 4, 8, 197), 11727.3, 0.06719)):
        cfg = plan.prediction.config
        assert (cfg.engine, cfg.deep_gemm, cfg.nccl_nvls) == ("sglang", True, False)
        assert (plan.tp, plan.pp, plan.dp_attention, plan.ep, plan.max_num_seqs) == shape
        assert plan.max_num_seqs <= SGLANG_DEEPEP_TOKENS_MAX
        assert plan.throughput_tokens_per_s == pytest.approx(tokens, abs=0.5)
        assert plan.prediction.tpot_s == pytest.approx(tpot, abs=5e-5)
        assert not any(SGLANG_UNPRICED in w for w in plan.warnings)
        line = plan.launch["sglang"]
        assert "--moe-a2a-backend deepep --deepep-mode auto" in line
        assert line.startswith(f"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=256 python -m sglang.launch_server")
        assert f"--cuda-graph-max-bs-decode {plan.max_num_seqs}" in line


def test_vllm_target_plan_at_vllm_033_budgets():
    """The vLLM-priced plans of Qwen3-235B-FP8 on 8 H100 (golden). vLLM 0.33.0 sizes the DeepEP
    low-latency buffer at --max-num-batched-tokens per rank and runs a step's MoE in one pass, so the
    plan chooses the budget (`search.serve.budget`): TP 2 x attention DP 4 with EP 8, 112 requests per
    DP rank at 256 tokens (9,402 output tokens/s, TPOT 47.7 ms) at the interactive SLA, 203 per rank at
    512 for the throughput-optimal one (12,096 tokens/s, TPOT 67.1 ms); 119 at 512 (9,537) and 12,178
    before the Q/K norm was priced. Before the budgets, TP 4 x DP 2 at 192 / 407 per rank on a budget of
    8,192 (8,212 / 11,829 tokens/s), whose line would have asked vLLM 0.33.0 for a 32.5 GiB buffer per
    GPU. SGLang's line of the same deployment (its mixed steps on DeepEP's normal kernels, its chunked
    prefill the same budget a rank): 9,561 and 12,357 tokens/s."""
    sol = _solved("vllm")
    cases = ((sol.plans[0], (2, 1, 4, 8, 112), 9402.4, 0.04765, 9560.8, 256),
             (sol.alternative, (2, 1, 4, 8, 203), 12096.1, 0.06713, 12356.6, 512))
    for plan, shape, tokens, tpot, sglang, budget in cases:
        assert (plan.tp, plan.pp, plan.dp_attention, plan.ep, plan.max_num_seqs) == shape
        assert plan.throughput_tokens_per_s == pytest.approx(tokens, abs=0.5)
        assert plan.prediction.tpot_s == pytest.approx(tpot, abs=5e-5)
        cfg = plan.prediction.config
        assert (cfg.engine, cfg.deep_gemm, cfg.nccl_nvls, cfg.max_num_batched_tokens) == ("vllm", True, True, budget)
        assert f"--max-num-batched-tokens {budget} " in plan.launch["vllm"]
        assert plan.engine_other["differs"] is True and plan.engine_other["tokens_per_s"] == pytest.approx(sglang, abs=0.5)


def test_json_states_the_engine():
    sg, vl = _solved("sglang").plans[0], _solved("vllm").plans[0]
    for plan, engine, other in ((sg, "sglang", "vllm"), (vl, "vllm", "sglang")):
        block = plan.to_json()["engine"]
        assert block["priced_for"] == engine and block["other"]["engine"] == other
        assert set(block) >= {"priced_for", "name", "moe_deep_gemm", "nccl_nvls", "other"}
        assert block["other"]["tokens_per_s"] == pytest.approx(plan.engine_other["tokens_per_s"], rel=1e-12)
    # SGLang's plan (TP 4 x DP 2, 238 per rank at SGLang's 8,192 a rank) launched with vLLM's line: at
    # that budget vLLM 0.33.0 would hold a 32.5 GiB DeepEP buffer per GPU; its line runs the budget the
    # vLLM planner keeps for the deployment, 1,024 (tests/emit/test_engine_check_budget.py)
    assert sg.engine_other["differs"] is True and sg.engine_other["max_num_batched_tokens"] == 1024
    assert sg.engine_other["tokens_per_s"] == pytest.approx(9342.7, abs=0.5)


def test_sglang_plan_round_trips_through_its_own_command():
    """The SGLang-priced plan's own launch line, read back by evaluate --from-sglang at the same running
    requests, predicts the plan's throughput: the numbers are those of the command launched."""
    plan = _solved("sglang").plans[0]
    back = api.evaluate_serve_command(plan.launch["sglang"], "qwen3-235b-a22b", "dgx-h100", 8,
                                      input_len=plan.job.input_len, output_len=plan.job.output_len,
                                      concurrency=plan.prediction.concurrency * plan.dp, sglang=True)
    assert back.prediction.config == plan.prediction.config.__class__(
        **{**{f: getattr(plan.prediction.config, f) for f in plan.prediction.config.__dataclass_fields__},
           "gpu_memory_utilization": back.prediction.config.gpu_memory_utilization})
    assert back.prediction.config.engine == "sglang" and back.prediction.config.deep_gemm is True  # DeepEP
    assert back.throughput_tokens_per_s == pytest.approx(plan.throughput_tokens_per_s, rel=1e-9)
    assert back.prediction.tpot_s == pytest.approx(plan.prediction.tpot_s, rel=1e-9)
    assert not any("not read" in w or "DeepEP's assert" in w for w in back.warnings)


@pytest.mark.parametrize(("tp", "pp", "dpa", "ep", "split", "deepep", "priced"), [
    (8, 1, 1, False, False, False, True),  # TP MoE: Triton, priced
    (1, 1, 8, True, False, True, True),  # aggregated attention DP + EP on one node: DeepEP (#13)
    (4, 2, 4, True, False, True, True),  # ... with PP over two nodes
    (2, 1, 8, True, False, True, True),  # ... EP 16 over two nodes
    (1, 1, 8, True, True, False, False),  # a one-node split instance: no DeepEP either (emit.pd)
    (1, 1, 16, True, True, True, True),  # a two-node split instance: --moe-a2a-backend deepep
    (8, 2, 1, True, True, True, True),  # EP over two nodes (PP): DeepEP, so DeepGEMM
])
def test_sglang_settings_follow_its_launch_lines(tp, pp, dpa, ep, split, deepep, priced):
    cfg = ServeConfig(tp=tp, pp=pp, dp_attention=dpa, expert_parallel=ep)
    assert sglang_deepep(cfg, 8, split=split) is deepep
    assert sglang_priced(cfg, 8, split=split) is priced
    sg = engine_config(cfg, "sglang", gpus_per_node=8, split=split)
    assert (sg.engine, sg.deep_gemm, sg.nccl_nvls) == ("sglang", deepep, False)
    back = engine_config(sg, "vllm", gpus_per_node=8, split=split)
    assert back == dataclasses.replace(cfg, engine="vllm")  # vLLM's defaults restored


def test_split_plan_roles_priced_for_sglang():
    """--disaggregate on with --target sglang: both roles carry SGLang's settings and the JSON says so
    per role."""
    from autoshard.specs.job import ServeJob

    job = ServeJob(input_len=2000, output_len=200, weight_dtype=FP8)
    plan = api.plan_serving(QWEN, load_cluster("dgx-h100").with_gpus(32), job.model_copy(update={"tpot_target_s": 0.1}),
                            top_k=1, pins=None, time_limit_s=30, num_workers=1, seed=0, disaggregate="on",
                            framework="sglang").plans[0]
    assert plan.disaggregated
    roles = plan.to_json()["engine"]["roles"]
    assert set(roles) == {"prefill", "decode"} and {r["priced_for"] for r in roles.values()} == {"sglang"}
    for role in plan.roles:
        cfg = role.prediction.config
        assert cfg.engine == "sglang" and not cfg.nccl_nvls
        assert sglang_priced(cfg, 8, split=True)
    # DeepGEMM is priced exactly where the split deployment's SGLang lines pass --moe-a2a-backend deepep
    for inst in place(plan):
        role = plan.role(inst.role)
        assert uses_deepep(role, len(inst.nodes)) is role.prediction.config.deep_gemm
    assert plan.engine_other["engine"] == "vllm"


@pytest.mark.parametrize("bad", ["trtllm", "", "VLLM "])
def test_hostile_engine_names(bad):
    with pytest.raises(ValueError):
        ServeConfig(engine=bad)
    with pytest.raises(ValueError):
        engine_config(ServeConfig(), bad, gpus_per_node=8)
    with pytest.raises(SpecError, match="vllm, sglang"):
        enumerate_serve(QWEN, H100x8, api.serve_job_for(QWEN, weight_dtype="fp8"), framework=bad)


def test_k8s_manifests_run_the_priced_engine(tmp_path):
    """Without a framework the manifests are written for the engine the plan is priced for."""
    import yaml

    for framework, image in (("vllm", "vllm/vllm-openai"), ("sglang", "lmsysorg/sglang")):
        plan = _solved(framework).plans[0]
        out = tmp_path / framework
        assert api.write_k8s_manifests(plan, out) >= 1
        images = {c["image"].split(":")[0] for f in out.glob("*.yaml") for o in yaml.safe_load_all(f.read_text())
                  if o for c in _containers(o)}
        assert images == {image}


def _containers(obj):
    spec = obj.get("spec", {})
    templates = [spec.get("template")] + [spec.get("leaderWorkerTemplate", {}).get(k) for k in
                                          ("leaderTemplate", "workerTemplate")]
    return [c for t in templates if t for c in t.get("spec", {}).get("containers", [])]
