"""ServePlan -> Kubernetes manifests a user can `kubectl apply -f DIR`.

One workload per engine instance, so every instance has a stable Service name the router can address:
- an instance that fits one node: a Deployment (replicas 1, strategy Recreate: an update frees the
  GPUs before the new pod needs them) and a Service;
- an instance spanning nodes: a LeaderWorkerSet `<instance>-lws` (leaderworkerset.x-k8s.io/v1, group
  size = its nodes; its rollout replaces the group, never adds one beside it) and a Service on its
  leader pod. Workers read the leader's address and their index from the LWS_LEADER_ADDRESS and
  LWS_WORKER_INDEX variables LWS sets in every pod. Where one NVLink domain spans trays (GB200/GB300
  NVL72) and holds the instance, a ComputeDomain too (`k8s_pod.compute_domain`).
Every object name is a DNS-1035 label built from the model name (`k8s_pod.dns_label`). Pods that
reach other nodes add IPC_LOCK; the RDMA device resource is the cluster's to add (the YAML says so).
A disaggregated plan adds the router (SGLang's sglang_router with --pd-disaggregation, or the vLLM
Router with --vllm-pd-disaggregation, pip-installed at start since vLLM's image lacks it) as a
Deployment and a Service named `<name>-router`, the deployment's entry point.

Commands are the launch lines of `autoshard.emit.vllm` / `autoshard.emit.sglang` (and the
disaggregation words of `autoshard.emit.pd`) run through `/bin/sh -c` with every word shell-quoted;
only the leader's address is left for the shell to expand. LWS has one worker template, so workers
pick their node's literal line with `case "$LWS_WORKER_INDEX"`. GPUs come from
`resources.limits["nvidia.com/gpu"]` (the NVIDIA device plugin), /dev/shm is a memory-backed volume
(NCCL needs more than the container default). In a heterogeneous cluster every pod carries a
nodeSelector `autoshard/pool: <pool>` (the pool's name as a label value): label each pool's nodes with it. Image tags are the projects'
published images; pin the version you test.
"""

from __future__ import annotations

import dataclasses
import shlex
import textwrap
from typing import Any

import yaml

from autoshard.emit.pd import (
    BOOTSTRAP_PORT,
    ROUTER_PORT,
    SGLANG_PORT,
    SGLANG_TRANSFER_BACKEND,
    VLLM_NIXL_HOST_ENV,
    VLLM_PORT,
    SGLANG_DEEPEP_LL_ENV,
    listen_words,
    role_plan,
    sglang_deepep_decode,
    sglang_deepep_prefill,
    uses_deepep,
    vllm_deepep_decode,
    vllm_kv_transfer_config,
)
from autoshard.emit.k8s_pod import IMAGES, LWS_NAME_MAX, compute_domain, dns_label, manifest_comments
from autoshard.emit.k8s_pod import Unit as _Unit
from autoshard.emit.k8s_pod import pod as _pod
from autoshard.emit.sglang import sglang_env, sglang_node_commands
from autoshard.emit.vllm import HEAD_ADDRESS, vllm_node_commands
from autoshard.plans.serve import ServePlan

__all__ = ["k8s_manifests", "k8s_yaml", "IMAGES", "lws_name", "workload_name"]


def workload_name(plan: ServePlan) -> str:
    """The base of every object name, from the model name (`01-ai.Yi_test` -> `m-01-ai-yi-test`: a
    Service name must start with a letter)."""
    return dns_label(plan.model.name)


def _sh(words: list[str]) -> str:
    """Quote every word; words holding LWS variables go in double quotes so the shell expands them."""
    out = []
    for w in words:
        if "$" in w:
            out.append('"' + w.replace('"', '\\"') + '"')
        else:
            out.append(shlex.quote(w))
    return " ".join(out)


def _dynamic(line: str) -> list[str]:
    """A builder's line as words, the head address replaced by the leader's (LWS sets it)."""
    return [w.replace(HEAD_ADDRESS, "$LWS_LEADER_ADDRESS") for w in shlex.split(line)]


def _by_worker_index(lines: list[str]) -> str:
    """The workers' shell script: each worker runs its own node's line (node rank, DP start rank),
    chosen by the LWS_WORKER_INDEX LeaderWorkerSet sets; every line stays a literal command."""
    cases = [f"  {k}) exec {_sh(_dynamic(line))} ;;" for k, line in enumerate(lines, start=1)]
    return "\n".join(
        [
            'case "$LWS_WORKER_INDEX" in',
            *cases,
            '  *) echo "unexpected LWS_WORKER_INDEX=$LWS_WORKER_INDEX" >&2; exit 1 ;;',
            "esac",
        ]
    )


def _units(plan: ServePlan, framework: str) -> list[_Unit]:
    base = workload_name(plan)
    roles = plan.roles or ()
    units: list[_Unit] = []
    sglang = framework == "sglang"
    port = VLLM_PORT if framework == "vllm" else SGLANG_PORT
    if not roles:
        one = role_plan(plan, _AggRole(plan))  # type: ignore[arg-type]
        per_node = plan.pool.node.gpus_per_node
        env = sglang_env(one) if sglang else ()  # DeepEP's buffer size, as container env
        listen = " ".join(listen_words(port))  # where the Service and the container port point
        for i in range(plan.replicas):
            lines = sglang_node_commands(one, env=False) if sglang else vllm_node_commands(one)
            lines = [f"{line} {listen}" for line in lines]
            units.append(
                _Unit(
                    f"{base}-{i}",
                    "serve",
                    min(one.engine_gpus, per_node),
                    len(lines),
                    lines,
                    port,
                    plan.pool.name,
                    env,
                    domain_nodes=_domain_nodes(plan.pool.node),
                )
            )
        return units
    for role in roles:
        one = role_plan(plan, role)
        per_node = one.pool.node.gpus_per_node
        nodes = -(-role.gpus_per_instance // per_node)
        env: tuple[tuple[str, str], ...] = ()
        graphs: list[str] = []
        if framework == "sglang" and role.role == "decode" and uses_deepep(role, nodes):
            seqs, cap = sglang_deepep_decode(role)
            one = dataclasses.replace(one, max_num_seqs=seqs)
            env = ((SGLANG_DEEPEP_LL_ENV, str(cap)),)
            graphs = ["--cuda-graph-max-bs-decode", str(seqs)]
        elif framework == "sglang" and uses_deepep(role, nodes):
            env = ((SGLANG_DEEPEP_LL_ENV, str(sglang_deepep_prefill(role))),)
        elif framework == "vllm" and role.role == "decode":  # as in emit/pd.py
            one = vllm_deepep_decode(one, role) or one
        for i in range(role.instances):
            lines = sglang_node_commands(one, deepep=False) if sglang else vllm_node_commands(one)
            if framework == "vllm" and role.role == "prefill":  # as in emit/pd.py
                lines = [line.replace("--all2all-backend deepep_low_latency",
                                      "--all2all-backend deepep_high_throughput") for line in lines]
            extra = listen_words(port)
            if framework == "vllm":
                extra += ["--kv-transfer-config", vllm_kv_transfer_config(role.role)]
            else:
                extra += [
                    "--disaggregation-mode",
                    role.role,
                    "--disaggregation-transfer-backend",
                    SGLANG_TRANSFER_BACKEND,
                ]
                if role.role == "prefill":
                    extra += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
                if uses_deepep(role, len(lines)):
                    extra += ["--moe-a2a-backend", "deepep"]
                extra += graphs
            lines = [line + " " + " ".join(shlex.quote(w) for w in extra) for line in lines]
            gpus = min(role.gpus_per_instance, per_node)
            # NIXL's side channel: the prefill pod's listener binds to and advertises this address
            # (`emit.pd`); a pod's own IP, which the decode pods reach
            pod_ip = (VLLM_NIXL_HOST_ENV,) if framework == "vllm" else ()
            units.append(
                _Unit(f"{base}-{role.role}-{i}", role.role, gpus, len(lines), lines, port, one.pool.name, env,
                      pod_ip, _domain_nodes(one.pool.node))
            )
    return units


def _domain_nodes(node) -> int:  # type: ignore[no-untyped-def]
    return max(1, node.domain_size // node.gpus_per_node)


class _AggRole:
    """The one-engine view of an aggregated plan (role_plan's fields)."""

    def __init__(self, plan: ServePlan) -> None:
        self.tp, self.pp = plan.tp, plan.pp
        self.attention_dp = plan.dp_attention
        self.ep = plan.ep
        self.prediction = plan.prediction
        self.pool_index = plan.pool_index


def _service(name: str, selector: dict[str, str], port: int, extra: list[int] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    ports = [{"name": "http", "port": port, "targetPort": port}]
    ports += [{"name": f"p{p}", "port": p, "targetPort": p} for p in extra]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": dict(selector), "ports": ports},
    }


def _router_prefix(framework: str) -> str:
    """SGLang's image ships sglang_router; vLLM's does not ship the vLLM Router (a separate PyPI
    package, vllm-router), so its container installs it first (or bake it into your image)."""
    return "" if framework == "sglang" else "pip install vllm-router && exec "


def _router(plan: ServePlan, framework: str, units: list[_Unit]) -> list[dict[str, Any]]:
    base = workload_name(plan)
    pre = [u for u in units if u.role == "prefill"]
    dec = [u for u in units if u.role == "decode"]
    if framework == "sglang":
        words = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for u in pre:
            words += ["--prefill", f"http://{u.name}:{u.port}", str(BOOTSTRAP_PORT)]
        for u in dec:
            words += ["--decode", f"http://{u.name}:{u.port}"]
        words += listen_words(ROUTER_PORT)
    else:
        words = ["vllm-router", "--policy", "round_robin", "--vllm-pd-disaggregation"]
        for u in pre:
            words += ["--prefill", f"http://{u.name}:{u.port}"]
        for u in dec:
            words += ["--decode", f"http://{u.name}:{u.port}"]
        words += ["--kv-connector", "nixl", *listen_words(ROUTER_PORT)]
    labels = {"app": f"{base}-router"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{base}-router", "labels": dict(labels)},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "containers": [
                        {
                            "name": "router",
                            "image": IMAGES[framework],
                            "command": ["/bin/sh", "-c", _router_prefix(framework) + _sh(words)],
                            "ports": [{"containerPort": ROUTER_PORT, "name": "http"}],
                        }
                    ]
                },
            },
        },
    }
    return [deployment, _service(f"{base}-router", labels, ROUTER_PORT)]


def lws_name(instance: str) -> str:
    """The LeaderWorkerSet of a multi-node instance; the instance's name is its Service's. At most
    LWS_NAME_MAX characters (the instance's name cut, with its hash, where it would be longer)."""
    name = f"{instance}-lws"
    return name if len(name) <= LWS_NAME_MAX else f"{dns_label(instance, LWS_NAME_MAX - 4)}-lws"


LWS_ROLLOUT = {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}}
"""LeaderWorkerSet v1 knows one rolloutStrategy type, RollingUpdate; with maxSurge 0 no group is added
above `replicas` and maxUnavailable 1 lets the one group go before its replacement is created, so an
update never waits for GPUs the old group holds (kubernetes-sigs/lws 060ab4da,
api/leaderworkerset/v1/leaderworkerset_types.go: RolloutStrategy, RollingUpdateConfiguration; these are
its defaults, written out so that a changed default cannot deadlock an update)."""


def k8s_manifests(plan: ServePlan, framework: str = "vllm") -> dict[str, list[dict[str, Any]]]:
    """File name -> the objects it holds (one workload and its Service per instance, then the router)."""
    if framework not in IMAGES:
        raise ValueError(f"framework must be vllm or sglang, got {framework!r}")
    files: dict[str, list[dict[str, Any]]] = {}
    units = _units(plan, framework)
    pinned = plan.cluster.is_heterogeneous
    for u in units:
        labels = {"app": u.name, "autoshard/role": u.role}
        extra = [BOOTSTRAP_PORT] if u.role == "prefill" and framework == "sglang" else []
        if u.pods == 1:
            command = _sh(_dynamic(u.lines[0]))
            workload = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": u.name, "labels": dict(labels)},
                "spec": {
                    "replicas": 1,
                    # the old pod frees its GPUs before the new one starts: under RollingUpdate (the
                    # default) a new pod that needs every GPU the old one holds stays Pending
                    "strategy": {"type": "Recreate"},
                    "selector": {"matchLabels": dict(labels)},
                    "template": _pod(u, framework, command, labels, pinned),
                },
            }
            files[f"{u.name}.yaml"] = [workload, _service(u.name, labels, u.port, extra)]
            continue
        leader = "exec " + _sh(_dynamic(u.lines[0]))
        worker = _by_worker_index(u.lines[1:])
        workload = {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            # LWS names its headless Service (the pods' subdomain, LWS_LEADER_ADDRESS's domain) after
            # the set (lws 060ab4da, pkg/controllers/leaderworkerset_controller.go reconcileHeadlessServices):
            # the set takes another name than the instance's Service, which would take that one's place
            "metadata": {"name": lws_name(u.name), "labels": dict(labels)},
            "spec": {
                "replicas": 1,
                "rolloutStrategy": LWS_ROLLOUT,
                "leaderWorkerTemplate": {
                    "size": u.pods,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": _pod(
                        u, framework, leader, {**labels, "autoshard/pod": "leader"}, pinned
                    ),
                    "workerTemplate": _pod(
                        u, framework, worker, {**labels, "autoshard/pod": "worker"}, pinned
                    ),
                },
            },
        }
        selector = {"app": u.name, "autoshard/pod": "leader"}
        cd = [compute_domain(u)] if u.compute_domain else []
        files[f"{u.name}.yaml"] = [*cd, workload, _service(u.name, selector, u.port, extra)]
    if plan.roles:
        files[f"{workload_name(plan)}-router.yaml"] = _router(plan, framework, units)
    return files


def k8s_yaml(objects: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML file, each under the comments it needs (`manifest_comments`:
    where the ComputeDomain comes from, which RDMA resource to add)."""
    docs = []
    for obj in objects:
        wrapped = (textwrap.wrap(n, 98, break_long_words=False, break_on_hyphens=False) for n in manifest_comments(obj))
        notes = "".join(f"# {line}\n" for lines in wrapped for line in lines)
        docs.append(notes + yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
    return "---\n".join(docs)
