"""Prefill/decode disaggregation: closed forms of the KV hand-off and the prefill queue, CP-SAT's xPyD
choice against brute force over the same tables, the balance and GPU budget of the chosen plan, the
plan JSON's roles, and the prefill/decode launch lines."""

from __future__ import annotations

import json
import shlex

import pytest

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.disagg import (
    MAX_PREFILL_UTILIZATION,
    disagg_ttft_s,
    kv_link,
    kv_transfer,
    kv_transfer_bytes,
    max_utilization_for_ttft,
    md1_wait_s,
)
from autoshard.emit.pd import pd_commands, pd_script, place
from autoshard.errors import InfeasibleError, SpecError
from autoshard.search.serve.solve import solve_serve
from autoshard.search.serve.disagg import tabulate_disagg
from autoshard.search.serve.space import enumerate_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

LLAMA8 = load_model("llama-3.1-8b")
LLAMA70 = load_model("llama-3.1-70b")
DSV3 = load_model("deepseek-v3")
H100 = load_cluster("dgx-h100")
JOB = ServeJob(input_len=1000, output_len=1000)
MTP_JOB = ServeJob(input_len=2000, output_len=1000, weight_dtype=WeightDtype.FP8)


def solve(model, cluster, job=JOB, mode="on", top_k=1):
    return solve_serve(
        model, cluster, job, pins=None, top_k=top_k, time_limit_s=20, num_workers=2, disaggregate=mode
    )


# --------------------------------------------------------------------------- closed forms


def test_kv_transfer_bytes_llama70b():
    # 80 layers x 8 KV heads x 128 dims x (K and V) x 2 bytes = 327,680 bytes per token
    assert kv_transfer_bytes(LLAMA70, JOB) == pytest.approx(1000 * 80 * 8 * 128 * 2 * 2)
    fp8 = JOB.model_copy(update={"kv_cache_dtype": WeightDtype.FP8})
    assert kv_transfer_bytes(LLAMA70, fp8) == pytest.approx(kv_transfer_bytes(LLAMA70, JOB) / 2)


def test_kv_transfer_bytes_mla():
    # MLA caches the 512-dim latent + 64-dim rope key per layer: 576 x 2 bytes x 61 layers
    assert kv_transfer_bytes(DSV3, JOB) == pytest.approx(1000 * 576 * 2 * 61)


def test_kv_transfer_time_rdma_and_nvlink():
    pool = H100.pools[0]
    eff = pool.gpu.efficiency
    tp4 = ServeConfig(tp=4)
    tp2 = ServeConfig(tp=2)
    rdma = kv_transfer(LLAMA70, JOB, tp4, tp2, kv_link(pool, same_domain=False))
    size = 1000 * 327_680
    # two streams (the narrower side), 50 GB/s NIC each at the pool's achieved fraction, plus latency
    expect = size / (2 * 50e9 * eff.inter_node_bw) + eff.inter_node_latency_us * 1e-6
    assert rdma.link == "rdma" and rdma.streams == 2
    assert rdma.seconds == pytest.approx(expect)
    nvl = kv_transfer(LLAMA70, JOB, tp4, tp2, kv_link(pool, same_domain=True))
    assert nvl.link == "nvlink"
    assert nvl.seconds == pytest.approx(
        size / (2 * 450e9 * eff.intra_node_bw) + eff.intra_node_latency_us * 1e-6
    )
    assert nvl.seconds < rdma.seconds / 5


def test_md1_wait_closed_form():
    assert md1_wait_s(1.0, 0.5) == pytest.approx(0.5)
    assert md1_wait_s(2.0, 0.8) == pytest.approx(0.8 * 2.0 / (2 * 0.2))
    assert md1_wait_s(1.0, 0.0) == 0.0
    assert md1_wait_s(1.0, 1.0) == float("inf")


def test_max_utilization_inverts_the_ttft():
    space = enumerate_serve(LLAMA70, H100.with_gpus(8), JOB)
    tables = tabulate_disagg(LLAMA70, H100.with_gpus(8), JOB, space)
    row = tables.prefill[0]
    link = kv_link(H100.pools[0], same_domain=False)
    tr = kv_transfer(LLAMA70, JOB, row.instance.config, row.instance.config, link)
    idle = disagg_ttft_s(row.instance, tr, 0.02, 0.0)
    for target in (idle * 1.05, idle * 1.5, idle * 3):
        u = max_utilization_for_ttft(row.instance, tr, 0.02, target, cap=0.999)
        assert disagg_ttft_s(row.instance, tr, 0.02, u) == pytest.approx(target, rel=1e-9)
    assert max_utilization_for_ttft(row.instance, tr, 0.02, idle * 0.9) == 0.0
    assert max_utilization_for_ttft(row.instance, tr, 0.02, None) == MAX_PREFILL_UTILIZATION


# --------------------------------------------------------------------------- CP-SAT against brute force


def brute_force(model, cluster, job):
    """Every (prefill row, decode row, x, y) of the same tables, each role within its pool's GPUs, the
    TTFT target checked with the link the deployment implies (NVLink inside one domain, RDMA inside a
    pool, the inter-pool network across pools)."""
    space = enumerate_serve(model, cluster, job)
    t = tabulate_disagg(model, cluster, job, space)
    n = cluster.num_gpus
    target = None if job.ttft_target_s is None else round(job.ttft_target_s * 1e6)
    best = 0
    for p in t.prefill:
        for d in t.decode:
            a, b = cluster.pools[p.engine.pool], cluster.pools[d.engine.pool]
            same = a is b
            for y in range(1, b.num_gpus // d.engine.gpus + 1):
                room = (b.num_gpus - y * d.engine.gpus) if same else a.num_gpus
                for x in range(1, room // p.engine.gpus + 1):
                    used = x * p.engine.gpus + y * d.engine.gpus
                    k = 2 if not same else (0 if used <= a.node.domain_size else 1)
                    ttft = p.ttft_us + max(p.send_us[k], d.recv_us[k]) + t.latency_us[k] + d.first_us
                    if target is not None and ttft > target:
                        continue
                    served = min(x * p.rate_milli, y * d.rate_milli)
                    best = max(best, served * job.output_len // n)
    return best / 1000


@pytest.mark.parametrize(("model", "gpus"), [(LLAMA8, 8), (LLAMA70, 16)])
def test_cp_sat_matches_brute_force(model, gpus):
    cluster = H100.with_gpus(gpus)
    plan = solve(model, cluster)[0]
    assert plan.disaggregated and plan.solver.status == "OPTIMAL"
    assert plan.solver.objective == pytest.approx(brute_force(model, cluster, JOB), rel=1e-9)


@pytest.mark.parametrize("ttft", [None, 1.0])
def test_cp_sat_matches_brute_force_across_pools(ttft):
    mixed = load_cluster("mixed-h100-a100")
    job = JOB.model_copy(update={"ttft_target_s": ttft})
    plan = solve(LLAMA70, mixed, job)[0]
    assert plan.solver.status == "OPTIMAL"
    assert plan.solver.objective == pytest.approx(brute_force(LLAMA70, mixed, job), rel=1e-9)
    for role in plan.roles:  # each role within its own pool
        assert role.gpus <= mixed.pools[role.pool_index].num_gpus
    if len({r.pool_index for r in plan.roles}) == 2:
        assert plan.to_json()["predicted"]["serve"]["kv_transfer_link"] == "inter-pool"


@pytest.mark.parametrize("ttft", [0.8, 0.5, 0.4, 0.2])
def test_cp_sat_matches_brute_force_with_a_ttft_target(ttft):
    cluster = H100.with_gpus(8)
    job = JOB.model_copy(update={"ttft_target_s": ttft})
    want = brute_force(LLAMA70, cluster, job)
    if want == 0:
        with pytest.raises(InfeasibleError):
            solve(LLAMA70, cluster, job)
        return
    plan = solve(LLAMA70, cluster, job)[0]
    assert plan.solver.objective == pytest.approx(want, rel=1e-9)
    assert plan.ttft_s <= ttft


def test_chosen_deployment_balances_and_fits():
    cluster = H100.with_gpus(16)
    plan = solve(LLAMA70, cluster)[0]
    pre, dec = plan.role("prefill"), plan.role("decode")
    assert pre.gpus + dec.gpus == plan.num_gpus <= 16
    # the served rate is within what prefill takes at <= 80 % utilization and what decode sustains
    served = plan.throughput_tokens_per_s / JOB.output_len
    assert served <= pre.instances * pre.requests_per_s * MAX_PREFILL_UTILIZATION * 1.001
    assert served <= dec.instances * dec.requests_per_s * 1.001
    assert 0 < pre.utilization <= MAX_PREFILL_UTILIZATION + 1e-9
    assert 0 < dec.utilization <= 1 + 1e-9
    # TTFT: the wait for the running prefill step + its own step + the transfer + 1.5 decode steps
    d = plan.disaggregation
    assert d.ttft_s > pre.prediction.prefill.total_s + d.transfer.seconds + plan.prediction.tpot_s


def test_auto_is_never_worse_than_either_kind():
    cluster = H100.with_gpus(16)
    job = JOB.model_copy(update={"tpot_target_s": 0.03})
    on = solve(LLAMA70, cluster, job, "on")[0].solver.objective
    off = solve(LLAMA70, cluster, job, "off")[0].solver.objective
    auto = solve(LLAMA70, cluster, job, "auto")[0]
    assert auto.solver.status == "OPTIMAL"
    assert auto.solver.objective == pytest.approx(max(on, off))


def test_auto_with_a_request_rate_takes_the_fewest_gpus():
    cluster = H100.with_gpus(64)
    job = JOB.model_copy(update={"request_rate": 20.0})
    gpus = {mode: solve(LLAMA70, cluster, job, mode)[0].num_gpus for mode in ("on", "off", "auto")}
    assert gpus["auto"] == min(gpus["on"], gpus["off"])


def test_ttft_target_is_met_with_the_transfer():
    cluster = H100.with_gpus(16)
    free = solve(LLAMA70, cluster)[0]
    target = free.ttft_s * 0.8
    plan = solve(LLAMA70, cluster, JOB.model_copy(update={"ttft_target_s": target}))[0]
    assert plan.ttft_s <= target and plan.meets_targets()
    assert plan.solver.status == "OPTIMAL"
    assert plan.solver.objective <= free.solver.objective


def test_request_rate_minimizes_gpus():
    cluster = H100.with_gpus(32)
    job = JOB.model_copy(update={"request_rate": 5.0})
    plan = solve(LLAMA70, cluster, job)[0]
    assert plan.throughput_tokens_per_s / job.output_len >= 5.0 * 0.999
    assert plan.solver.objective == plan.num_gpus


def test_deepseek_v3_decode_uses_attention_dp_and_ep():
    cluster = H100.with_gpus(96)
    job = JOB.model_copy(update={"weight_dtype": WeightDtype.FP8})
    plan = solve(DSV3, cluster, job)[0]
    assert plan.solver.status == "OPTIMAL"
    dec = plan.role("decode")
    assert dec.ep > 1 and dec.attention_dp > 1 and dec.ep == dec.tp * dec.attention_dp
    assert plan.num_gpus <= 96


def test_bad_mode_is_a_spec_error():
    with pytest.raises(SpecError, match="disaggregate"):
        solve(LLAMA8, H100.with_gpus(8), JOB, "maybe")


# --------------------------------------------------------------------------- JSON and launch lines


def test_plan_json_roles():
    plan = solve(LLAMA70, H100.with_gpus(16))[0]
    obj = json.loads(json.dumps(plan.to_json()))
    roles = obj["plan"]["roles"]
    assert [r["role"] for r in roles] == ["prefill", "decode"]
    for r in roles:
        for key in ("instances", "tp", "pp", "ep", "attention_dp", "gpus", "max_batch"):
            assert isinstance(r[key], int)
    assert sum(r["gpus"] for r in roles) == obj["num_gpus"]
    serve = obj["predicted"]["serve"]
    assert serve["kv_transfer_link"] in ("nvlink", "rdma")
    assert serve["ttft_s"] == pytest.approx(plan.ttft_s)
    assert obj["plan"]["disaggregated"] is True


def test_placement_packs_nodes_without_overlap():
    plan = solve(LLAMA70, H100.with_gpus(16))[0]
    seen = set()
    for inst in place(plan):
        gpus = inst.devices or tuple(range(8))
        for node in inst.nodes:
            for g in gpus:
                assert (node, g) not in seen
                seen.add((node, g))
    assert len(seen) == plan.num_gpus


@pytest.mark.parametrize("framework", ["vllm", "sglang"])
def test_pd_commands(framework):
    plan = solve(LLAMA70, H100.with_gpus(16))[0]
    lines = pd_commands(plan, framework)
    pre, dec = plan.role("prefill"), plan.role("decode")
    router = [c for _, what, c in lines if what == "router"]
    assert len(router) == 1
    words = shlex.split(router[0])
    if framework == "sglang":
        assert words[:4] == ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        assert words.count("--prefill") == pre.instances and words.count("--decode") == dec.instances
    else:
        assert words[:4] == ["vllm-router", "--policy", "round_robin", "--vllm-pd-disaggregation"]
        assert words.count("--prefill") == pre.instances and words.count("--decode") == dec.instances
        assert words[words.index("--kv-connector") + 1] == "nixl"
    for _, what, cmd in lines:
        if what == "router":
            continue
        words = shlex.split(cmd)
        if framework == "sglang":
            assert words[words.index("--disaggregation-mode") + 1] == what.split()[0]
            assert words[words.index("--disaggregation-transfer-backend") + 1] == "mooncake"
        else:
            cfg = json.loads(words[words.index("--kv-transfer-config") + 1])
            role = {"prefill": "kv_producer", "decode": "kv_consumer"}[what.split()[0]]
            assert cfg == {"kv_connector": "NixlConnector", "kv_role": role}
    script = pd_script(plan, framework)
    assert script.startswith("#!/usr/bin/env bash") and "NODE_RANK" in script


def test_md1_wait_quantile():
    from autoshard.costmodel.serve.disagg import md1_wait_quantile_s

    # P(W > t) = rho exp(-t rho / E[W]): no wait at the 90th percentile when rho <= 0.1
    assert md1_wait_quantile_s(1.0, 0.1, 0.9) == 0.0
    # rho 0.5, S 1: E[W] = 0.5, t90 = 0.5 / 0.5 x ln(0.5 / 0.1) = ln 5
    assert md1_wait_quantile_s(1.0, 0.5, 0.9) == pytest.approx(1.6094379124341003)
    # the median wait at rho 0.8: E[W] = 2, t50 = 2 / 0.8 x ln(1.6)
    assert md1_wait_quantile_s(1.0, 0.8, 0.5) == pytest.approx(2 / 0.8 * 0.47000362924573563)


def test_plan_reports_p90():
    plan = solve(LLAMA70, H100.with_gpus(16))[0]
    serve = plan.to_json()["predicted"]["serve"]
    assert serve["ttft_p90_s"] >= serve["ttft_s"] * 0.999
    assert serve["tpot_p90_s"] == pytest.approx(serve["tpot_s"])


def test_multi_node_instances_get_one_line_per_node():
    plan = solve(DSV3, H100.with_gpus(96), JOB.model_copy(update={"weight_dtype": WeightDtype.FP8}))[0]
    for framework in ("vllm", "sglang"):
        lines = [(n, what) for n, what, _ in pd_commands(plan, framework) if what != "router"]
        nodes = sorted({n for n, _ in lines})
        # every GPU node of the deployment runs exactly one engine line (instances here fill whole nodes)
        assert nodes == list(range(plan.num_gpus // 8)) and len(lines) == len(nodes)
        per_instance = {}
        for n, what in lines:
            per_instance.setdefault(what.split(" (")[0], []).append(n)  # less a note on the requests run
        for role in plan.roles:
            for i in range(role.instances):
                assert len(per_instance[f"{role.role} {i}"]) == role.gpus_per_instance // 8


def test_instances_sharing_a_node_never_share_a_port():
    plan = solve(LLAMA70, H100.with_gpus(16))[0]
    for framework in ("vllm", "sglang"):
        taken: dict[int, set[int]] = {}
        for node, what, cmd in pd_commands(plan, framework):
            if what == "router":
                continue
            words = shlex.split(cmd)
            env = dict(w.split("=", 1) for w in words if "=" in w and w.split("=", 1)[0].isupper())
            ports = {int(words[words.index("--port") + 1])}
            if "VLLM_NIXL_SIDE_CHANNEL_PORT" in env:  # NIXL adds the DP rank (< 8 per node) to it
                base = int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
                ports |= set(range(base, base + 8))
            if "--disaggregation-bootstrap-port" in words:
                ports.add(int(words[words.index("--disaggregation-bootstrap-port") + 1]))
            assert not ports & taken.get(node, set()), (node, what)
            taken.setdefault(node, set()).update(ports)


def test_deepseek_decode_instances_may_draft_with_mtp_and_say_so():
    """DeepSeek-V3 on 12 nodes of H100 (2000/1000, FP8): the optimal split's decode instances run MTP
    (one draft token, 1.9 kept per step: faster than the same instance without it); the roles JSON
    says so and the decode lines carry the engines' MTP flags, the prefill lines none (golden).
    (At 1000/1000 the DP32 decode instances run ~220 requests per rank, which MTP's two tokens each
    would split into two 256-token MoE passes: there the plan decodes without MTP.)"""
    plan = solve(DSV3, H100.with_gpus(96), MTP_JOB)[0]
    decode = next(r for r in plan.roles if r.role == "decode")
    prefill = next(r for r in plan.roles if r.role == "prefill")
    assert decode.speculative_tokens == 1 and prefill.speculative_tokens == 0
    assert decode.pp == 1 and "MTP1" in decode.label()
    assert [r["speculative_tokens"] for r in plan.to_json()["plan"]["roles"]] == [0, 1]
    vllm_mtp = "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'"
    sglang_mtp = ("--speculative-algorithm EAGLE --speculative-num-steps 1 --speculative-eagle-topk 1 "
                  "--speculative-num-draft-tokens 2")
    for framework, flags in (("vllm", vllm_mtp), ("sglang", sglang_mtp)):
        for _, what, line in pd_commands(plan, framework):
            if what.startswith("decode"):
                assert flags in line, line
            else:
                assert "speculative" not in line, line


def test_mtp_decode_breakdown_sums_to_the_tpot():
    """With MTP a decode step keeps 1.9 tokens: the JSON time breakdown is per output token, so its
    parts add up to step_time_s (the TPOT), as they do without MTP."""
    plan = solve(DSV3, H100.with_gpus(96), MTP_JOB)[0]
    assert next(r for r in plan.roles if r.role == "decode").speculative_tokens == 1
    pred = plan.to_json()["predicted"]
    parts = pred["time_breakdown_s"]
    keys = ("gemm", "attention", "elementwise", "logits", "tp_comm", "ep_comm", "pp_comm", "host")
    total = sum(parts[k] for k in keys)
    assert total == pytest.approx(pred["step_time_s"], rel=1e-9)
