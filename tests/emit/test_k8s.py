"""Kubernetes manifests: every object passes a schema check of the published APIs (apps/v1
Deployment, v1 Service, leaderworkerset.x-k8s.io/v1 LeaderWorkerSet: required keys and their types,
DNS-1035 names, selectors that match their pod labels), services and the router address the
workloads that exist, and GPU requests add up to the plan."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from autoshard.emit.k8s import k8s_manifests, k8s_yaml
from autoshard.search.serve.solve import solve_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # Service names: a letter first
LABEL_KEY = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
H100 = load_cluster("dgx-h100")


def plan_for(model, gpus, mode, **job):
    j = ServeJob(input_len=1000, output_len=1000, **job)
    return solve_serve(
        load_model(model),
        H100.with_gpus(gpus),
        j,
        pins=None,
        top_k=1,
        time_limit_s=20,
        num_workers=2,
        disaggregate=mode,
    )[0]


def check_type(obj, key, kind):
    assert key in obj, f"missing required key {key!r} in {obj}"
    assert isinstance(obj[key], kind), f"{key!r} must be {kind}, got {type(obj[key])}"
    return obj[key]


def check_labels(labels):
    assert isinstance(labels, dict) and labels
    for k, v in labels.items():
        assert LABEL_KEY.match(k) and len(k.split("/")[-1]) <= 63, k
        assert (
            isinstance(v, str) and len(v) <= 63 and re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", v)
        ), v


def check_pod_template(tpl, gpus=None):
    labels = check_type(check_type(tpl, "metadata", dict), "labels", dict)
    check_labels(labels)
    spec = check_type(tpl, "spec", dict)
    containers = check_type(spec, "containers", list)
    assert containers
    total = 0
    for c in containers:
        assert DNS1123.match(check_type(c, "name", str))
        check_type(c, "image", str)
        cmd = check_type(c, "command", list)
        assert all(isinstance(w, str) for w in cmd)
        assert cmd[:2] == ["/bin/sh", "-c"] and len(cmd) == 3
        shlex.split(cmd[2])  # the shell line parses: every word quoted
        for port in c.get("ports", []):
            assert (
                isinstance(check_type(port, "containerPort", int), int) and 0 < port["containerPort"] < 65536
            )
        limits = c.get("resources", {}).get("limits", {})
        if "nvidia.com/gpu" in limits:
            assert isinstance(limits["nvidia.com/gpu"], int)
            total += limits["nvidia.com/gpu"]
        for m in c.get("volumeMounts", []):
            assert m["name"] in {v["name"] for v in spec["volumes"]}
    if gpus is not None:
        assert total == gpus
    return labels, total


def check_object(obj):
    """Schema check by kind; returns (kind, name, selector labels matched, GPUs it requests)."""
    kind = check_type(obj, "kind", str)
    api = check_type(obj, "apiVersion", str)
    name = check_type(check_type(obj, "metadata", dict), "name", str)
    assert DNS1035.match(name) and len(name) <= 63, name
    spec = check_type(obj, "spec", dict)
    if kind == "Deployment":
        assert api == "apps/v1"
        replicas = check_type(spec, "replicas", int)
        if not name.endswith("-router"):  # GPUs freed before the new pod needs them
            assert spec["strategy"] == {"type": "Recreate"}
        match = check_type(check_type(spec, "selector", dict), "matchLabels", dict)
        labels, gpus = check_pod_template(check_type(spec, "template", dict))
        assert match.items() <= labels.items(), "selector must match the pod template's labels"
        return kind, name, labels, replicas * gpus
    if kind == "LeaderWorkerSet":
        assert api == "leaderworkerset.x-k8s.io/v1"
        replicas = check_type(spec, "replicas", int)
        rollout = check_type(spec, "rolloutStrategy", dict)  # LWS v1: RollingUpdate only; no surge
        assert rollout["type"] == "RollingUpdate" and rollout["rollingUpdateConfiguration"]["maxSurge"] == 0
        assert rollout["rollingUpdateConfiguration"]["maxUnavailable"] == 1
        lwt = check_type(spec, "leaderWorkerTemplate", dict)
        size = check_type(lwt, "size", int)
        assert size >= 2
        leader, g1 = check_pod_template(check_type(lwt, "leaderTemplate", dict))
        worker, g2 = check_pod_template(check_type(lwt, "workerTemplate", dict))
        assert "LWS_WORKER_INDEX" in lwt["workerTemplate"]["spec"]["containers"][0]["command"][2]
        return kind, name, leader, replicas * (g1 + (size - 1) * g2)
    if kind == "Service":
        assert api == "v1"
        check_labels(check_type(spec, "selector", dict))
        ports = check_type(spec, "ports", list)
        names = [check_type(p, "name", str) for p in ports]
        assert len(set(names)) == len(names)
        for p in ports:
            assert isinstance(check_type(p, "port", int), int) and isinstance(
                check_type(p, "targetPort", int), int
            )
        return kind, name, spec["selector"], 0
    if kind == "ComputeDomain":  # NVIDIA k8s-dra-driver-gpu docs/install.md, demo/specs/imex
        assert api == "resource.nvidia.com/v1beta1"
        assert set(spec) == {"numNodes", "channel"} and isinstance(spec["numNodes"], int)
        assert DNS1123.match(spec["channel"]["resourceClaimTemplate"]["name"])
        return kind, name, {}, 0
    raise AssertionError(f"unexpected kind {kind}")


CASES = [
    ("llama-3.1-70b", 16, "on", {}),
    ("llama-3.1-70b", 32, "off", {}),
    ("deepseek-v3", 96, "on", {"weight_dtype": WeightDtype.FP8}),
]


@pytest.mark.parametrize(("model", "gpus", "mode", "job"), CASES)
@pytest.mark.parametrize("framework", ["vllm", "sglang"])
def test_manifests_pass_the_schema(model, gpus, mode, job, framework):
    plan = plan_for(model, gpus, mode, **job)
    files = k8s_manifests(plan, framework)
    objects = [o for text in (k8s_yaml(objs) for objs in files.values()) for o in yaml.safe_load_all(text)]
    seen = [check_object(o) for o in objects]
    assert len(set((k, n) for k, n, _, _ in seen)) == len(seen)
    workloads = {n: labels for k, n, labels, _ in seen if k == "Deployment"}
    # a LeaderWorkerSet's own headless Service takes the set's name (LWS_LEADER_ADDRESS resolves through
    # it): the instance's Service is named for the instance, the set `<instance>-lws`
    workloads |= {n.removesuffix("-lws"): labels for k, n, labels, _ in seen if k == "LeaderWorkerSet"}
    assert all(n.endswith("-lws") for k, n, _, _ in seen if k == "LeaderWorkerSet")
    for kind, name, selector, _ in seen:
        if kind == "Service":  # every Service selects the pods of one instance's workload
            assert name in workloads and selector.items() <= workloads[name].items()
            assert ("LeaderWorkerSet", name) not in {(k, n) for k, n, _, _ in seen}
    engine_gpus = sum(g for k, n, _, g in seen if k != "Service" and not n.endswith("-router"))
    assert engine_gpus == plan.num_gpus
    if plan.disaggregated:
        router = next(
            o for o in objects if o["metadata"]["name"].endswith("-router") and o["kind"] == "Deployment"
        )
        line = router["spec"]["template"]["spec"]["containers"][0]["command"][2]
        services = [n for k, n, _, _ in seen if k == "Service" and ("-prefill-" in n or "-decode-" in n)]
        assert len(services) == sum(r.instances for r in plan.roles)
        for inst in services:  # the router addresses every instance's Service
            assert f"http://{inst}:" in line
        kinds = {k for k, *_ in seen}
        if any(r.gpus_per_instance > 8 for r in plan.roles):
            assert "LeaderWorkerSet" in kinds
    for o in objects:  # every engine pod listens where its container port and Service point
        if o["kind"] == "Service" or o["metadata"]["name"].endswith("-router"):
            continue
        spec = o["spec"]
        tpl = spec["leaderWorkerTemplate"]["leaderTemplate"] if o["kind"] == "LeaderWorkerSet" else spec["template"]
        container = tpl["spec"]["containers"][0]
        words = shlex.split(container["command"][2])
        (port,) = [p["containerPort"] for p in container["ports"]]
        assert words[words.index("--port") + 1] == str(port)
        assert words[words.index("--host") + 1] == "0.0.0.0"


def test_lws_workers_run_their_own_node_line():
    import subprocess

    plan = plan_for("llama-3.1-405b", 32, "off")
    (objs,) = k8s_manifests(plan, "vllm").values()
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet")
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"][2]
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["command"][2]
    for script in (leader, worker):  # POSIX shell syntax
        assert subprocess.run(["/bin/sh", "-n", "-c", script], capture_output=True).returncode == 0
    assert "--node-rank 0" in leader and "--headless" not in leader
    branches = [line for line in worker.splitlines() if ") exec " in line]
    assert len(branches) == size - 1
    for k, line in enumerate(branches, start=1):
        words = shlex.split(line.split(") exec ", 1)[1].rsplit(" ;;", 1)[0])
        assert line.strip().startswith(f"{k})")
        assert words[words.index("--node-rank") + 1] == str(k)
        assert words[words.index("--nnodes") + 1] == str(size)
        assert words[words.index("--master-addr") + 1] == "$LWS_LEADER_ADDRESS"
        assert "--headless" in words


def test_heterogeneous_pods_are_pinned_to_their_pool():
    mixed = load_cluster("mixed-h100-a100")
    plan = solve_serve(
        load_model("llama-3.1-70b"),
        mixed,
        ServeJob(input_len=1000, output_len=1000, tpot_target_s=0.1),
        pins=None,
        top_k=1,
        time_limit_s=20,
        num_workers=2,
        disaggregate="on",
    )[0]
    pools = {f"{r.role}": mixed.pools[r.pool_index].name for r in plan.roles}
    files = k8s_manifests(plan, "sglang")
    seen = 0
    for objs in files.values():
        for o in objs:
            check_object(o)
            if o["kind"] == "Deployment" and not o["metadata"]["name"].endswith("-router"):
                role = o["metadata"]["labels"]["autoshard/role"]
                assert o["spec"]["template"]["spec"]["nodeSelector"] == {"autoshard/pool": pools[role]}
                seen += 1
    assert seen == sum(r.instances for r in plan.roles if r.gpus_per_instance <= 8)
