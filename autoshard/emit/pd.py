"""Disaggregated ServePlan -> launch lines for vLLM and SGLang prefill/decode instances and a router.

Placement: prefill instances first, then decode instances, packed onto nodes 0, 1, ... in order. An
instance smaller than a node gets a slice of the node's GPUs (CUDA_VISIBLE_DEVICES) and its own
ports; an instance of one node or more gets whole nodes. Node k's address is `$NODE<k>_IP`: export
NODE0_IP, NODE1_IP, ... on every node before running the lines (and NODE_RANK in the script form).

- vLLM (vLLM 0.33.0 docs/features/nixl_connector_usage.md): prefill instances run
  `--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'`, decode instances
  `kv_role` `kv_consumer` (`kv_both` is deprecated for NixlConnector: nixl/connector.py:97-104), each
  with its own VLLM_NIXL_SIDE_CHANNEL_PORT and, on every node, VLLM_NIXL_SIDE_CHANNEL_HOST set to that
  node's address: the prefill side's handshake listener binds to it and hands it to the decode side as
  `remote_host` (nixl/base_scheduler.py:76 and 325-335, pull_scheduler.py:284; vllm/envs.py default
  "localhost", which a decode instance on another node cannot reach); the front end is the vLLM Router (github.com/vllm-project/router,
  `pip install vllm-router`; vLLM blog 2025-12-13): `vllm-router --vllm-pd-disaggregation --prefill URL
  ... --decode URL ... --kv-connector nixl`. Decode instances on DeepEP's low-latency kernels pass the
  plan's `--max-num-batched-tokens`, the buffer their memory holds (`vllm_deepep_decode`).
- SGLang (docs.sglang.io "PD Disaggregation"): `--disaggregation-mode prefill|decode` with
  `--disaggregation-transfer-backend` (mooncake over RDMA, nixl also documented), a bootstrap port per
  prefill instance, and the router `python -m sglang_router.launch_router --pd-disaggregation
  --prefill URL BOOTSTRAP_PORT ... --decode URL ...`. MoE instances with expert parallelism over
  more than one node use DeepEP (`--moe-a2a-backend deepep`), as SGLang's large-EP deployments do.
  Its default `--deepep-mode auto` runs decode batches on DeepEP's low-latency kernels, whose buffers
  hold SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK tokens per rank (default 128), and a batch or a
  captured CUDA graph with more tokens on a rank fails its assert (`x.size(0) <=
  num_max_dispatch_tokens_per_rank`). The plan's memory holds DeepEP's buffers at vLLM's 256 tokens per
  rank (`costmodel.serve.ep_buffers`; the buffers grow with the cap: 3.6 GiB for DeepSeek-V3 at 256),
  so decode instances set the variable to the planned tokens per rank (requests x (1 + MTP drafts),
  rounded up to 128) up to that 256, and cap the captured graphs at the planned requests
  (`--cuda-graph-max-bs-decode`); a plan with more tokens per rank than 256 runs fewer requests under
  SGLang (its line says so: SGLang does not split a batch into passes; vLLM does and runs the plan).
  Prefill instances on DeepEP set the variable the same way from their own running requests: SGLang's
  `--deepep-mode auto` allocates the low-latency buffer on them too, and the plan's memory counts it
  at that size (`costmodel.serve.ep_buffers.deepep_sglang_engine_bytes`).

Instance commands come from the aggregated builders (`vllm_node_commands`, `sglang_node_commands`)
applied to a one-instance plan; this module only appends the disaggregation words. Every word this
module adds is shell-quoted; node addresses stay expandable inside double quotes.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass

from autoshard.costmodel.serve.ep_buffers import VLLM_MOE_DP_CHUNK_SIZE, sglang_deepep_tokens, vllm_deepep_ll_budget
from autoshard.emit.sglang import sglang_node_commands
from autoshard.emit.vllm import HEAD_ADDRESS, vllm_node_commands
from autoshard.emit.vllm.command import all2all_backend
from autoshard.plans.disagg import Role
from autoshard.plans.serve import ServePlan

__all__ = [
    "Instance",
    "place",
    "role_plan",
    "vllm_role_plan",
    "pd_commands",
    "pd_launch",
    "pd_script",
    "VLLM_KV_TRANSFER_CONFIG",
    "VLLM_KV_ROLES",
    "VLLM_NIXL_HOST_ENV",
    "vllm_kv_transfer_config",
    "SGLANG_TRANSFER_BACKEND",
    "ROUTER_PORT",
    "listen_words",
    "sglang_deepep_decode",
    "sglang_deepep_prefill",
    "vllm_deepep_decode",
]

VLLM_KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
"""A prefill instance's --kv-transfer-config (`vllm_kv_transfer_config` gives each role's)."""
VLLM_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
"""vLLM's KVTransferConfig.kv_role of each role (vllm/config/kv_transfer.py: kv_producer, kv_consumer,
kv_both; NixlConnector warns that kv_both is deprecated, nixl/connector.py:97-104)."""
VLLM_NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SGLANG_TRANSFER_BACKEND = "mooncake"
VLLM_PORT = 8100
NIXL_SIDE_CHANNEL_PORT = 5600
SGLANG_PORT = 30000
BOOTSTRAP_PORT = 8998
ROUTER_PORT = 8000
SGLANG_DEEPEP_LL_ENV = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
SGLANG_DEEPEP_LL_DEFAULT = 128
SGLANG_DEEPEP_LL_MAX = VLLM_MOE_DP_CHUNK_SIZE
"""Tokens per rank the plan's memory holds DeepEP's low-latency buffers for (SGLang itself allows 1,024)."""


@dataclass(frozen=True, slots=True)
class Instance:
    role: str
    index: int
    nodes: tuple[int, ...]
    """Nodes it occupies (the first is its head)."""
    devices: tuple[int, ...] | None
    """GPU indices on its node when it uses part of one; None for whole nodes."""
    slot: int
    """Its position among the instances sharing its head node (offsets its ports)."""
    pool: str = ""
    """The pool (GPU type) its nodes belong to."""


def listen_words(port: int) -> list[str]:
    """The words that make an engine or a router serve on every interface at `port` (vLLM's default
    port is 8000, SGLang binds 127.0.0.1 unless --host is given)."""
    return ["--host", "0.0.0.0", "--port", str(port)]


def role_plan(plan: ServePlan, role: Role) -> ServePlan:
    """One instance of a role as an aggregated one-engine plan (for the aggregated builders)."""
    cfg = role.prediction.config
    return dataclasses.replace(
        plan,
        tp=role.tp,
        pp=role.pp,
        dp=role.attention_dp,
        ep=role.ep,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        prediction=role.prediction,
        launch={},
        roles=(),
        disaggregation=None,
        pool_index=getattr(role, "pool_index", plan.pool_index),
    )


def vllm_kv_transfer_config(role: str) -> str:
    """The --kv-transfer-config JSON of a vLLM "prefill" or "decode" instance."""
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": VLLM_KV_ROLES[role]}, separators=(",", ":"))


def uses_deepep(role: Role, nodes: int) -> bool:
    """SGLang instances with expert parallelism over more than one node dispatch with DeepEP."""
    return role.ep > 1 and nodes > 1


def sglang_deepep_decode(role: Role) -> tuple[int, int]:
    """(requests per attention-DP rank, SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK) for an SGLang
    decode instance on DeepEP's low-latency kernels: each request sends 1 + MTP-draft tokens per step;
    the buffer is rounded up to 128 tokens and at most the 256 the plan's memory holds, which caps the
    requests."""
    per_request = 1 + role.speculative_tokens
    seqs = max(1, min(role.max_num_seqs, SGLANG_DEEPEP_LL_MAX // per_request))
    return seqs, sglang_deepep_tokens(seqs, role.speculative_tokens)


def vllm_role_plan(plan: ServePlan, role: Role) -> ServePlan:
    """One instance of a role as vLLM's line runs it: `role_plan`, except that a decode instance of a
    plan priced for another engine (an SGLang plan's) on DeepEP's low-latency kernels takes the budget
    a vLLM plan gives it, `vllm_deepep_ll_budget` of its decode tokens (`search.serve.budget.
    ll_budgeted`), not the other engine's, whose buffer vLLM would size at that budget."""
    one = role_plan(plan, role)
    cfg = role.prediction.config
    if role.role != "decode" or cfg.engine == "vllm" or all2all_backend(one) != "deepep_low_latency":
        return one
    return dataclasses.replace(one, max_num_batched_tokens=vllm_deepep_ll_budget(cfg.max_num_seqs,
                                                                                 cfg.speculative_tokens))


def vllm_deepep_decode(one: ServePlan, role: Role) -> ServePlan | None:
    """A vLLM decode instance on DeepEP's low-latency kernels (`one`: its `role_plan`) as its line runs
    it, or None where the line runs the plan as it is. vLLM 0.33 sizes that buffer for
    `--max-num-batched-tokens` tokens per rank and runs a step's tokens through it in one pass
    (FusedMoEConfig.max_num_tokens = scheduler max_num_batched_tokens, model_executor/layers/fused_moe/
    layer.py:286,373; DeepEPLLAll2AllManager._make_all2all_kwargs, distributed/device_communicators/
    all2all.py:327-352): the plan chose that budget for its decode tokens and its memory holds the buffer
    at it (`costmodel.serve.ep_buffers.vllm_deepep_ll_cap`, `search.serve.budget`), so the line passes
    the plan's budget and requests (None). Only a plan whose budget is below its decode tokens per rank
    (requests x (1 + MTP drafts)) runs fewer requests: as many as the budget holds (its line's comment
    says so)."""
    if all2all_backend(one) != "deepep_low_latency":
        return None
    per_request = 1 + role.speculative_tokens
    if role.max_num_seqs * per_request <= one.max_num_batched_tokens:
        return None
    seqs = max(1, one.max_num_batched_tokens // per_request)
    return dataclasses.replace(one, max_num_seqs=seqs)


def sglang_deepep_prefill(role: Role) -> int:
    """SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK of an SGLang prefill instance on DeepEP: its
    running requests' tokens per rank, as its memory counts the buffer."""
    cfg = role.prediction.config
    return sglang_deepep_tokens(cfg.max_num_seqs, cfg.speculative_tokens)


def place(plan: ServePlan) -> list[Instance]:
    """Instances on nodes: prefill then decode, packed in order (a role on another pool starts on a
    fresh node: nodes of different GPU types are numbered one after the other)."""
    out: list[Instance] = []
    node, used, slot = 0, 0, 0
    last_pool = None
    for role in plan.roles:
        per_node = plan.cluster.pools[role.pool_index].node.gpus_per_node
        pool_name = plan.cluster.pools[role.pool_index].name
        if last_pool is not None and role.pool_index != last_pool and used:
            node, used, slot = node + 1, 0, 0
        last_pool = role.pool_index
        g = role.gpus_per_instance
        for i in range(role.instances):
            if g >= per_node:
                if used:
                    node, used, slot = node + 1, 0, 0
                span = -(-g // per_node)
                out.append(Instance(role.role, i, tuple(range(node, node + span)), None, 0, pool_name))
                node += span
                continue
            if used + g > per_node:
                node, used, slot = node + 1, 0, 0
            out.append(Instance(role.role, i, (node,), tuple(range(used, used + g)), slot, pool_name))
            used += g
            slot += 1
            if used == per_node:
                node, used, slot = node + 1, 0, 0
    return out


def _addr(node: int) -> str:
    return f"$NODE{node}_IP"


def _q(word: str) -> str:
    return shlex.quote(word)


def _instance_lines(framework: str, plan: ServePlan, inst: Instance) -> list[str]:
    role = plan.role(inst.role)
    one = vllm_role_plan(plan, role) if framework == "vllm" else role_plan(plan, role)
    low_latency = framework == "sglang" and inst.role == "decode" and uses_deepep(role, len(inst.nodes))
    if low_latency:
        seqs, cap = sglang_deepep_decode(role)
        one = dataclasses.replace(one, max_num_seqs=seqs)
    if framework == "vllm" and inst.role == "decode":
        one = vllm_deepep_decode(one, role) or one
    base = vllm_node_commands(one) if framework == "vllm" else sglang_node_commands(one, deepep=False)
    if framework == "vllm" and inst.role == "prefill":  # DeepEP's throughput kernels take prefill whole
        base = [line.replace("--all2all-backend deepep_low_latency", "--all2all-backend deepep_high_throughput")
                for line in base]
    head = _addr(inst.nodes[0])
    lines = []
    for node, line in zip(inst.nodes, base, strict=True):
        line = line.replace(HEAD_ADDRESS, head)
        env = ""
        if inst.devices is not None:
            env = "CUDA_VISIBLE_DEVICES=" + _q(",".join(map(str, inst.devices))) + " "
        if framework == "vllm":
            # NIXL's side channel listens on this port plus the DP rank: instances sharing a node get
            # port ranges a node's worth of ranks apart; its host is the node's own address (the
            # schedulers of a multi-node DP instance's ranks run on their own nodes)
            stride = one.pool.node.gpus_per_node
            env += f'{VLLM_NIXL_HOST_ENV}="{_addr(node)}" '
            env += f"VLLM_NIXL_SIDE_CHANNEL_PORT={NIXL_SIDE_CHANNEL_PORT + stride * inst.slot} "
            words = [
                *listen_words(VLLM_PORT + inst.slot),
                "--kv-transfer-config",
                vllm_kv_transfer_config(inst.role),
            ]
        else:
            words = [
                *listen_words(SGLANG_PORT + inst.slot),
                "--disaggregation-mode",
                inst.role,
                "--disaggregation-transfer-backend",
                SGLANG_TRANSFER_BACKEND,
            ]
            if inst.role == "prefill":
                words += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT + inst.slot)]
            if uses_deepep(role, len(inst.nodes)):
                words += ["--moe-a2a-backend", "deepep"]
            if low_latency:
                env += f"{SGLANG_DEEPEP_LL_ENV}={cap} "
                words += ["--cuda-graph-max-bs-decode", str(seqs)]
            elif uses_deepep(role, len(inst.nodes)):
                env += f"{SGLANG_DEEPEP_LL_ENV}={sglang_deepep_prefill(role)} "
        lines.append(env + line + " " + " ".join(_q(w) for w in words))
    return lines


def _url(node: int, port: int) -> str:
    return f'"http://${{NODE{node}_IP}}:{port}"'


def _router(framework: str, instances: list[Instance]) -> str:
    pre = [i for i in instances if i.role == "prefill"]
    dec = [i for i in instances if i.role == "decode"]
    if framework == "sglang":
        words = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for i in pre:
            words += ["--prefill", _url(i.nodes[0], SGLANG_PORT + i.slot), str(BOOTSTRAP_PORT + i.slot)]
        for i in dec:
            words += ["--decode", _url(i.nodes[0], SGLANG_PORT + i.slot)]
        words += listen_words(ROUTER_PORT)
        return " ".join(words)
    words = ["vllm-router", "--policy", "round_robin", "--vllm-pd-disaggregation"]
    for i in pre:
        words += ["--prefill", _url(i.nodes[0], VLLM_PORT + i.slot)]
    for i in dec:
        words += ["--decode", _url(i.nodes[0], VLLM_PORT + i.slot)]
    words += ["--kv-connector", "nixl", *listen_words(ROUTER_PORT)]
    return " ".join(words)


def pd_commands(plan: ServePlan, framework: str) -> list[tuple[int, str, str]]:
    """(node, what, command) for every line of the deployment, prefill first, the router last (on
    node 0). `what` is e.g. "prefill 0" or "router"."""
    if framework not in ("vllm", "sglang"):
        raise ValueError(f"framework must be vllm or sglang, got {framework!r}")
    instances = place(plan)
    out: list[tuple[int, str, str]] = []
    pools = plan.cluster.is_heterogeneous
    for inst in instances:
        what = f"{inst.role} {inst.index}" + (f" ({inst.pool} node)" if pools else "")
        role = plan.role(inst.role)
        if framework == "sglang" and inst.role == "decode" and uses_deepep(role, len(inst.nodes)):
            seqs, _ = sglang_deepep_decode(role)
            if seqs < role.max_num_seqs:
                what += (
                    f" (the plan's memory holds SGLang's DeepEP low-latency buffers for {SGLANG_DEEPEP_LL_MAX}"
                    f" tokens per rank: {seqs} requests per rank instead of the planned {role.max_num_seqs})"
                )
        vllm_ll = vllm_deepep_decode(vllm_role_plan(plan, role), role) if framework == "vllm" and inst.role == "decode" else None
        if vllm_ll is not None and vllm_ll.max_num_seqs < role.max_num_seqs:
            what += (f" (vLLM's DeepEP low-latency buffer holds its --max-num-batched-tokens {vllm_ll.max_num_batched_tokens} "
                     f"tokens per rank: {vllm_ll.max_num_seqs} requests per rank instead of the planned "
                     f"{role.max_num_seqs})")
        for node, line in zip(inst.nodes, _instance_lines(framework, plan, inst), strict=True):
            out.append((node, what, line))
    out.append((0, "router", _router(framework, instances)))
    return out


def pd_launch(plan: ServePlan) -> dict[str, str]:
    """The plan's `launch` block: per framework all lines (commented with node and role), and one
    key per role, instance and node ("vllm:prefill0:node0")."""
    launch: dict[str, str] = {}
    for fw in ("vllm", "sglang"):
        lines = pd_commands(plan, fw)
        launch[fw] = "\n".join(f"# node {n}: {what}\n{cmd}" for n, what, cmd in lines)
        for n, what, cmd in lines:
            launch[f"{fw}:{what.split(' (')[0].replace(' ', '')}:node{n}"] = cmd
    return launch


def pd_script(plan: ServePlan, framework: str) -> str:
    """A bash script for every node: run it with NODE_RANK and NODE0_IP, NODE1_IP, ... exported."""
    lines = pd_commands(plan, framework)
    nodes = max(n for n, _, _ in lines) + 1
    body = [
        "#!/usr/bin/env bash",
        f"# {framework} prefill/decode deployment of {plan.model.name} on {plan.num_gpus} GPUs "
        f"({plan.describe()}), written by autoshard.",
        f"# Run on each of the {nodes} nodes with NODE_RANK set and NODE0_IP..NODE{nodes - 1}_IP exported.",
        "set -euo pipefail",
    ]
    for k in range(nodes):
        mine = [(what, cmd) for n, what, cmd in lines if n == k]
        body.append(f'if [ "${{NODE_RANK:?set NODE_RANK}}" = {k} ]; then')
        for what, cmd in mine:
            body.append(f"  # {what}")
            body.append(f"  {cmd} &")
        body.append("  wait")
        body.append("fi")
    return "\n".join(body) + "\n"
