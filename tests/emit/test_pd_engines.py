"""Prefill/decode launch lines against the engines' source (#13): vLLM 0.33.0 (PyPI sdist) and SGLang
0.5.23 (PyPI wheel), the versions the emitted images (`vllm/vllm-openai:latest`,
`lmsysorg/sglang:latest`) and check_flags.py name.

- vLLM's NixlConnector: `kv_role` is `kv_producer` on prefill and `kv_consumer` on decode instances
  (`kv_both` warns "deprecated ... will be removed", vllm/distributed/kv_transfer/kv_connector/v1/nixl/
  connector.py:97-104; the roles are vllm/config/kv_transfer.py:11-13).
- The NIXL handshake listener of an instance binds to VLLM_NIXL_SIDE_CHANNEL_HOST and the prefill side
  hands that host to the decode side as `remote_host` (nixl/base_scheduler.py:76, 325-335;
  pull_scheduler.py:284); its default is "localhost" (vllm/envs.py:1721-1722), which a decode instance
  on another node cannot reach. Every vLLM line of a split sets it to its own node's address, and the
  manifests to the pod's IP.
"""

from __future__ import annotations

import dataclasses

import json
import shlex

import pytest

from autoshard.emit.k8s import k8s_manifests
from autoshard.emit.pd import pd_commands, place
from autoshard.search.serve.solve import solve_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

H100 = load_cluster("dgx-h100")


def _split(model: str, gpus: int, **job):
    return solve_serve(load_model(model), H100.with_gpus(gpus), ServeJob(input_len=1000, output_len=1000, **job),
                       pins=None, top_k=1, time_limit_s=20, num_workers=2, disaggregate="on")[0]


def _env(words: list[str]) -> dict[str, str]:
    out = {}
    for w in words:
        name, eq, value = w.partition("=")
        if not eq or not name.isupper():
            break
        out[name] = value
    return out


@pytest.fixture(scope="module")
def wide():
    """DeepSeek-V3 FP8 on 12 nodes: DP16/EP16 prefill instances over two nodes each (multi-node DP)."""
    return _split("deepseek-v3", 96, weight_dtype=WeightDtype.FP8)


@pytest.fixture(scope="module")
def llama():
    return _split("llama-3.1-70b", 16)


def test_kv_roles_and_side_channel_host_per_node(wide, llama):
    for plan in (llama, wide):
        nodes = {(i.role, i.index): i.nodes for i in place(plan)}
        seen = {"prefill": 0, "decode": 0}
        per_instance: dict[str, int] = {}
        for node, what, line in pd_commands(plan, "vllm"):
            if what == "router":
                continue
            role, index = what.split()[0], int(what.split()[1])
            words = shlex.split(line)  # the shell expands "$NODE<k>_IP"; shlex keeps the name
            cfg = json.loads(words[words.index("--kv-transfer-config") + 1])
            assert cfg == {"kv_connector": "NixlConnector",
                           "kv_role": {"prefill": "kv_producer", "decode": "kv_consumer"}[role]}
            assert _env(words)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == f"$NODE{node}_IP"
            k = per_instance.get(what, 0)
            assert node == nodes[(role, index)][k]  # the k-th line of an instance runs on its k-th node
            per_instance[what] = k + 1
            seen[role] += 1
        assert seen["prefill"] and seen["decode"]
    # the wide-EP prefill instances span two nodes: their second node's line names its own address
    pre = [i for i in place(wide) if i.role == "prefill"]
    assert len(pre[0].nodes) == 2
    lines = {n: line for n, what, line in pd_commands(wide, "vllm") if what == "prefill 0"}
    assert f'VLLM_NIXL_SIDE_CHANNEL_HOST="$NODE{pre[0].nodes[1]}_IP"' in lines[pre[0].nodes[1]]
    assert "--headless" in lines[pre[0].nodes[1]]


def test_sglang_lines_carry_no_vllm_variables(llama):
    for _, what, line in pd_commands(llama, "sglang"):
        assert "VLLM_NIXL" not in line and "kv-transfer-config" not in line


def test_manifests_give_each_vllm_pod_its_own_ip(llama):
    files = k8s_manifests(llama, "vllm")
    pods = 0
    for name, objects in files.items():
        if name.endswith("-router.yaml"):
            continue
        container = objects[0]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {
            "name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        role = objects[0]["metadata"]["labels"]["autoshard/role"]
        words = shlex.split(container["command"][2])
        cfg = json.loads(words[words.index("--kv-transfer-config") + 1])
        assert cfg["kv_role"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
        pods += 1
    assert pods == sum(r.instances for r in llama.roles)
    for objects in k8s_manifests(llama, "sglang").values():  # SGLang pods: no NIXL variable
        for obj in objects:
            containers = obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            assert all("VLLM_NIXL_SIDE_CHANNEL_HOST" not in str(c.get("env")) for c in containers)


def test_decode_instances_run_without_pipeline_parallelism():
    """vLLM 0.33.0 refuses a kv_consumer with pipeline_parallel_size > 1 (NotImplementedError,
    nixl/base_worker.py:884-890) and SGLang 0.5.23 asserts that a decode instance's PP is 1 or its
    prefill instance's (disaggregation/common/conn.py:1515-1518): the split space offers decode
    instances without PP. Llama 3.1 70B on one 8 x H100 node split into a TP1 PP2 prefill and a TP2 PP3
    decode instance before; 405B in BF16 on 32 H100 into TP1 PP16 + TP8 PP2, which no line could start
    (no PP-free decode instance holds 405B in BF16 on H100: that split is now refused)."""
    from autoshard.search.serve.disagg import tabulate_disagg
    from autoshard.search.serve.space import SPLIT_DECODE_PP, enumerate_serve

    model, cluster, job = load_model("llama-3.1-70b"), H100.with_gpus(8), ServeJob(input_len=1000, output_len=1000)
    space = enumerate_serve(model, cluster, job)
    tables = tabulate_disagg(model, cluster, job, space, keep_all=True)
    assert tables.decode and all(r.engine.pp == 1 for r in tables.decode)
    assert any(r.engine.pp > 1 for r in tables.prefill)  # prefill instances keep PP
    assert tables.dropped[SPLIT_DECODE_PP] == sum(e.pp > 1 for e in space.engines)
    plan = _split("llama-3.1-70b", 8)
    assert plan.role("decode").pp == 1
    with pytest.raises(Exception, match="no prefill/decode deployment"):
        _split("llama-3.1-405b", 32)


def _flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_vllm_deepep_decode_lines_ask_for_the_buffer_the_plan_holds(wide):
    """vLLM 0.33 sizes DeepEP's low-latency buffer for --max-num-batched-tokens tokens per rank
    (fused_moe/layer.py:286,373; all2all.py:327-352) and no longer splits an MoE layer into 256-token
    passes: a decode line with 8,192 asked for ~114 GiB per GPU for DeepSeek-V3. Decode lines pass the
    budget the plan chose for its decode tokens (requests x (1 + MTP drafts) rounded up to 256) and
    whose buffer its memory holds, and the plan's requests; prefill lines (DeepEP's high-throughput
    kernels, fixed 1 GiB buffers) keep the plan's budget."""
    from autoshard.costmodel.serve.ep_buffers import (
        VLLM_DEEPEP_NVL_BYTES, deepep_ll_buffer_bytes, vllm_deepep_ll_budget,
    )

    model = load_model("deepseek-v3")
    assert deepep_ll_buffer_bytes(model, 8192, 64) > 110 * 2**30 > 4 * 2**30 > deepep_ll_buffer_bytes(model, 256, 64)
    checked, budgets = set(), set()
    for _, what, line in pd_commands(wide, "vllm"):
        if what == "router":
            continue
        words = shlex.split(line)
        role = wide.role(what.split()[0])
        cfg = role.prediction.config
        backend = _flag(words, "--all2all-backend")
        assert _flag(words, "--max-num-batched-tokens") == str(cfg.max_num_batched_tokens)
        if role.role == "decode":
            assert backend == "deepep_low_latency" and "instead of the planned" not in what
            assert int(_flag(words, "--max-num-seqs")) == role.max_num_seqs
            assert cfg.max_num_batched_tokens == vllm_deepep_ll_budget(role.max_num_seqs, role.speculative_tokens)
            assert role.prediction.memory.ep_buffer_bytes == (
                deepep_ll_buffer_bytes(model, cfg.max_num_batched_tokens, role.ep) + VLLM_DEEPEP_NVL_BYTES)
            budgets.add(str(cfg.max_num_batched_tokens))
        else:
            assert backend == "deepep_high_throughput"
        checked.add(role.role)
    assert checked == {"prefill", "decode"}
    for name, objects in k8s_manifests(wide, "vllm").items():  # the manifests run the same lines
        if "-decode-" in name:
            spec = objects[0]["spec"]
            pod = spec["template"] if "template" in spec else spec["leaderWorkerTemplate"]["leaderTemplate"]
            words = shlex.split(pod["spec"]["containers"][0]["command"][2].replace("exec ", "", 1))
            assert _flag(words, "--max-num-batched-tokens") in budgets


def test_vllm_mtp_decode_runs_the_planned_requests():
    """A decode instance drafting one MTP token sends two tokens per request through DeepEP: the plan
    takes a budget of twice its requests (rounded up to 256) and the line runs them all; only a plan
    whose budget is below its decode tokens would run fewer (as many as the budget holds), and say so."""
    from autoshard.emit.pd import vllm_deepep_decode, role_plan

    plan = solve_serve(load_model("deepseek-v3"), H100.with_gpus(96),
                       ServeJob(input_len=2000, output_len=1000, weight_dtype=WeightDtype.FP8),
                       pins=None, top_k=1, time_limit_s=20, num_workers=2, disaggregate="on")[0]
    role = plan.role("decode")
    assert role.speculative_tokens == 1
    one = role_plan(plan, role)
    assert vllm_deepep_decode(one, role) is None
    assert one.max_num_batched_tokens >= 2 * role.max_num_seqs
    lines = [(what, line) for _, what, line in pd_commands(plan, "vllm") if what.startswith("decode")]
    assert all(f"--max-num-seqs {role.max_num_seqs} " in line for _, line in lines)
    assert not any("instead of the planned" in what for what, _ in lines)
    small = dataclasses.replace(one, max_num_batched_tokens=role.max_num_seqs)  # half the decode tokens
    cut = vllm_deepep_decode(small, role)
    assert cut is not None and cut.max_num_seqs == role.max_num_seqs // 2