"""Every emitted launch command says what its plan says: each command is parsed back (Megatron-LM with
autoshard.emit.megatron.parse, vLLM with autoshard.emit.vllm.parse, SGLang with the reader below, which
follows SGLang 0.5's GPU accounting: tp_size x pp_size x dp_size per server, attention DP and EP carved
out of TP) and compared with the plan field by field, for every bundled model, training and serving.

Plans come from `evaluate` at a legal layout found per model (fast, no solver), plus solver plans (uneven
layouts, recompute blocks) for the models that solve in a second.
"""

from __future__ import annotations

import shlex
from functools import cache

import pytest

from autoshard.api import evaluate, solve, train_job
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.script import megatron_script
from autoshard.emit.megatron.parse import model_shape_differences, parse_megatron
from autoshard.emit.vllm.parse import parse_vllm
from autoshard.emit.sglang import (
    SGLANG_KV_CACHE_DTYPE,
    mem_fraction_static,
    runs_deepep,
    sglang_deepep_seqs,
    sglang_node_commands,
)
from autoshard.emit.vllm import vllm_node_commands
from autoshard.errors import InfeasibleError, SpecError
from autoshard.parallel import Recompute
from autoshard.search.train.options import SolverOptions
from autoshard.api import evaluate_serve
from autoshard.search.train.space import SpaceOptions
from autoshard.specs import bundled_models, load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

MODELS = sorted(bundled_models())
H100 = load_cluster("dgx-h100")


@cache
def train_plan(name: str):
    """A plan for `name` that fits some H100 size, pipelined (and expert-parallel for MoE) where it can be:
    the first (GPUs, PP, TP, EP) that evaluate accepts and predicts to fit."""
    model = load_model(name)
    job = train_job(model)  # the model's own training seq_len and batch
    recompute = Recompute.SELECTIVE if model.is_moe else Recompute.FULL
    legal = None
    for gpus in (16, 64, 256, 1024):
        for pp in (4, 2, 8, 16, 6, 7, 9, 14, 1):
            for tp in (2, 4, 8):
                for ep in ((64, 32, 16, 8, 4, 2, 1) if model.is_moe else (1,)):
                    try:
                        plan = evaluate(model, H100.with_gpus(gpus), job, tp=tp, pp=pp, ep=ep, micro_batch_size=1,
                                        recompute=recompute, sequence_parallel=True, zero_stage=1,
                                        vpp=2 if pp > 1 and model.num_layers % (2 * pp) == 0 else 1)
                    except (SpecError, ValueError):
                        continue
                    if plan.prediction.fits:
                        return plan
                    legal = legal or plan
    assert legal is not None, f"no legal layout of {name} on up to 1024 H100s"
    return legal  # none fits: the command is still emitted (and must say what the plan says)


SOLVED = {  # small enough to solve in about a second: uneven layouts and recompute blocks come from here
    "llama-3.1-8b": 8, "llama-3.1-70b": 64, "mixtral-8x7b": 16, "qwen3-30b-a3b": 16,
}


@cache
def solved_plan(name: str):
    model = load_model(name)
    options = SolverOptions(num_workers=1, seed=0, time_limit_s=10, space=SpaceOptions(max_micro_batch=2, max_vpp=2))
    return solve(model, H100.with_gpus(SOLVED[name]), train_job(model), options=options)[0]


def assert_megatron_round_trip(plan) -> None:
    for text in (megatron_command(plan), megatron_script(plan)):
        parsed = parse_megatron(text, vocab_size=plan.model.vocab_size)
        cfg, dims = plan.config, plan.config.dims
        assert parsed.world_size == dims.world_size
        got = (parsed.tp, parsed.pp, parsed.cp, parsed.ep, parsed.etp or parsed.tp, parsed.vpp, parsed.micro_batch_size,
               parsed.global_batch_size, parsed.seq_len, parsed.precision, parsed.sequence_parallel, parsed.zero_stage)
        want = (dims.tp, dims.pp, dims.cp, dims.ep, dims.expert_tp, dims.vpp, cfg.micro_batch_size,
                cfg.global_batch_size, cfg.seq_len, cfg.precision, cfg.sp, cfg.zero_stage)
        assert got == want
        assert parsed.recompute is cfg.recompute or (cfg.recompute is Recompute.NONE and parsed.recompute_num_layers)
        assert model_shape_differences(plan.model, parsed.model) == []
        stages = parsed.layout()
        assert [(s.start, s.stop) for s in stages] == [(s.start, s.stop) for s in plan.stages]
        assert [s.full_recompute_layers for s in stages] == [s.full_recompute_layers for s in plan.stages]


@pytest.mark.parametrize("name", MODELS)
def test_megatron_command_says_what_the_plan_says(name: str) -> None:
    assert_megatron_round_trip(train_plan(name))


@pytest.mark.parametrize("name", sorted(SOLVED))
def test_megatron_command_of_solver_plans(name: str) -> None:
    plan = solved_plan(name)
    assert plan.prediction.fits and plan.launch["megatron"] == megatron_command(plan)
    assert_megatron_round_trip(plan)


# ----------------------------------------------------------------------------- serving


def serve_plans(name: str):
    """A single-node and a multi-node deployment of `name` (each where one fits), BF16 and FP8 weights."""
    model = load_model(name)
    plans = []
    for weights in (WeightDtype.BF16, WeightDtype.FP8):
        job = ServeJob(input_len=1000, output_len=1000, weight_dtype=weights)
        for gpus, shapes in ((8, ((8, 1, 1), (4, 1, 2), (2, 1, 4), (1, 1, 8))),
                             (16, ((2, 4, 2), (8, 2, 1), (8, 1, 2), (4, 1, 4))),
                             (32, ((8, 4, 1), (8, 2, 2), (8, 1, 4)))):
            for tp, pp, dp in shapes:
                try:
                    plans.append(evaluate_serve(model, H100.with_gpus(gpus), job, tp=tp, pp=pp, dp=dp,
                                                expert_parallel=model.is_moe and dp > 1))
                    break
                except (InfeasibleError, SpecError):
                    continue
    assert plans, f"no deployment of {name} fits 32 H100s"
    return plans


def _sglang_flags(command: str) -> dict[str, str | bool]:
    words = shlex.split(command)
    if words[0].startswith("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK="):  # DeepEP lines (#13)
        words = words[1:]
    assert words[:3] == ["python", "-m", "sglang.launch_server"]
    flags: dict[str, str | bool] = {}
    i = 3
    while i < len(words):
        name = words[i]
        assert name.startswith("--"), words
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            flags[name] = words[i + 1]
            i += 2
        else:
            flags[name] = True
            i += 1
    return flags


@pytest.mark.parametrize("name", MODELS)
def test_vllm_commands_say_what_the_plan_says(name: str) -> None:
    for plan in serve_plans(name):
        commands = vllm_node_commands(plan)
        assert len(commands) == max(1, plan.nodes) if plan.num_gpus > plan.pool.node.gpus_per_node else 1
        gpus = 0
        for rank, command in enumerate(commands):
            p = parse_vllm(command)
            assert (p.model, p.tp, p.pp, p.dp, p.ep) == (plan.model_path, plan.tp, plan.pp, plan.dp, plan.ep)
            assert (p.max_model_len, p.max_num_seqs, p.max_num_batched_tokens) == (
                plan.max_model_len, plan.max_num_seqs, plan.max_num_batched_tokens)
            assert p.gpu_memory_utilization == pytest.approx(plan.gpu_memory_utilization, abs=0.005)
            assert (p.weight_dtype, p.kv_dtype) == (plan.job.weight_dtype, plan.job.kv_cache_dtype)
            assert p.headless == (rank > 0)
            gpus += p.tp * p.pp * (p.dp_local if p.dp_local is not None else p.dp) // p.nnodes
        assert gpus == plan.num_gpus  # the commands together use every GPU of the plan, no more
        if plan.checkpoint is not None:
            assert plan.model_path == plan.checkpoint.repo


@pytest.mark.parametrize("name", MODELS)
def test_sglang_commands_say_what_the_plan_says(name: str) -> None:
    for plan in serve_plans(name):
        gpus = 0
        for command in sglang_node_commands(plan):
            f = _sglang_flags(command)
            tp, pp, dp = int(f["--tp-size"]), int(f["--pp-size"]), int(f.get("--dp-size", 1))
            nnodes = int(f.get("--nnodes", 1))
            assert f["--model-path"] == plan.model_path
            assert tp == plan.tp * plan.dp_attention and pp == plan.pp
            assert int(f.get("--attn-dp-size", 1)) == plan.dp_attention
            assert int(f.get("--ep-size", 1)) == plan.ep
            assert not (dp > 1 and nnodes > 1)  # SGLang refuses --dp-size with --nnodes > 1
            assert int(f["--context-length"]) == plan.max_model_len
            assert float(f["--mem-fraction-static"]) == pytest.approx(mem_fraction_static(plan))
            seqs = sglang_deepep_seqs(plan) if runs_deepep(plan) else plan.max_num_seqs  # DeepEP's buffer
            assert seqs == plan.max_num_seqs or seqs * (1 + plan.prediction.config.speculative_tokens) <= 256
            assert int(f["--max-running-requests"]) == seqs * plan.dp_attention
            assert (f.get("--moe-a2a-backend"), f.get("--cuda-graph-max-bs-decode")) == (
                ("deepep", str(seqs)) if runs_deepep(plan) else (None, None))
            # per engine: SGLang gives each attention-DP rank chunked_prefill_size // attn_dp_size
            assert int(f["--chunked-prefill-size"]) == plan.max_num_batched_tokens * plan.dp_attention
            assert f["--kv-cache-dtype"] == SGLANG_KV_CACHE_DTYPE[plan.job.kv_cache_dtype]
            assert ("--quantization" in f) == (plan.job.weight_dtype is not WeightDtype.BF16)
            gpus += tp * pp * dp // nnodes
        assert gpus == plan.num_gpus  # every GPU of the plan has a server on it


def test_sglang_16_gpu_tp2_pp4_dp2_uses_all_gpus() -> None:
    """The issue's case: two 8-GPU replicas on two nodes. SGLang refuses --dp-size across nodes, so it is
    one server per node, and the JSON carries every node's command."""
    model = load_model("llama-3.1-70b")
    plan = evaluate_serve(model, H100.with_gpus(16), ServeJob(input_len=1000, output_len=1000), tp=2, pp=4, dp=2)
    commands = sglang_node_commands(plan)
    assert len(commands) == 2
    assert plan.launch["sglang_nodes"].splitlines() == commands
    assert plan.launch["vllm_nodes"].splitlines() == vllm_node_commands(plan)
    assert sum(int(_sglang_flags(c)["--tp-size"]) * int(_sglang_flags(c)["--pp-size"]) for c in commands) == 16
