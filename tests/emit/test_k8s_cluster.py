"""--emit k8s fixes: object names valid from any model name (`01-ai.Yi_test` gave Service
`01-ai-yi-test-0`, not a DNS-1035 label), updates that cannot wait on their own GPUs (Deployments
Recreate; LeaderWorkerSets roll with no surge), a ComputeDomain for an instance spanning GB200 trays,
IPC_LOCK and the RDMA note on pods that reach other nodes."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from autoshard.emit.k8s import k8s_manifests, k8s_yaml, workload_name
from autoshard.emit.k8s_pod import dns_label
from autoshard.search.serve.solve import solve_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _plan(model, cluster, mode="off", **pins):
    return solve_serve(load_model(model), cluster, ServeJob(input_len=1000, output_len=1000), pins=pins or None,
                       top_k=1, time_limit_s=20, num_workers=2, disaggregate=mode)[0]


@pytest.fixture(scope="module")
def h100_8b():
    return _plan("llama-3.1-8b", load_cluster("dgx-h100").with_gpus(8))


@pytest.fixture(scope="module")
def gb200_405b():  # TP8 on 4-GPU trays: two pods in one NVL72 rack
    return _plan("llama-3.1-405b", load_cluster("gb200-nvl72").with_gpus(8), tp=8)


def _objects(plan, framework="vllm"):
    files = k8s_manifests(plan, framework)
    return files, [o for objs in files.values() for o in yaml.safe_load_all(k8s_yaml(objs))]


def _names(obj):
    """Every generated name in an object: its own, a claim template's, a selector's label values."""
    yield obj["metadata"]["name"]
    spec = obj["spec"]
    if obj["kind"] == "ComputeDomain":
        yield spec["channel"]["resourceClaimTemplate"]["name"]
    yield from spec.get("selector", {}).get("matchLabels", spec.get("selector", {})).values()


HOSTILE = ["01-ai.Yi_test", "9", "Qwen3.5_235B.A22B", "Ünïcødé-模型-モデル", "模型", "x" * 300,
           "".join(chr(c) for c in range(33, 127)), "-.-_-", "A" * 39 + "-", "deepseek-v3"]


@pytest.mark.parametrize("name", HOSTILE)
def test_object_names_from_hostile_model_names(h100_8b, name):
    plan = dataclasses.replace(h100_8b, model=h100_8b.model.model_copy(update={"name": name}))
    files, objects = _objects(plan)
    for file, objs in files.items():
        assert file == objs[0]["metadata"]["name"] + ".yaml"
    for obj in objects:
        for n in _names(obj):
            assert DNS1035.match(n) and len(n) <= 63, (name, n)
    assert workload_name(plan) == workload_name(plan)  # deterministic
    assert len(workload_name(plan)) <= 28


def test_dns_label_keeps_what_it_can_and_separates_what_it_cuts():
    assert dns_label("01-ai.Yi_test") == "m-01-ai-yi-test"
    assert dns_label("Llama-3.1-70B") == "llama-3-1-70b"
    assert dns_label("Ünïcødé") == "unicde"  # NFKD folds the accents; ø has no ASCII form
    assert dns_label("模型") == "m-" + __import__("hashlib").sha1("模型".encode()).hexdigest()[:8]
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    assert len(dns_label(long_a)) == 28 and dns_label(long_a) != dns_label(long_b)
    assert dns_label(long_a).startswith("a" * 19 + "-")


def test_gpu_deployments_recreate_and_lws_never_surge(h100_8b, gb200_405b):
    dep, _ = next(iter(k8s_manifests(h100_8b, "vllm").values()))
    assert dep["kind"] == "Deployment" and dep["spec"]["strategy"] == {"type": "Recreate"}
    _, objects = _objects(gb200_405b, "sglang")
    (lws,) = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    assert lws["spec"]["rolloutStrategy"] == {
        "type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}}


def test_gb200_instance_across_trays_gets_a_compute_domain(gb200_405b):
    assert (gb200_405b.tp, gb200_405b.pp) == (8, 1)
    files, objects = _objects(gb200_405b, "sglang")
    (text,) = [k8s_yaml(objs) for objs in files.values()]
    cd, lws, svc = objects
    # shaped as NVIDIA's example (k8s-dra-driver-gpu docs/install.md, demo/specs/imex/nvbandwidth-test-job.yaml)
    assert cd == {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                  "metadata": {"name": svc["metadata"]["name"]},
                  "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": svc["metadata"]["name"]
                                                                                + "-channel"}}}}
    assert lws["metadata"]["name"] == svc["metadata"]["name"] + "-lws"
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    for role in ("leaderTemplate", "workerTemplate"):
        spec = lws["spec"]["leaderWorkerTemplate"][role]["spec"]
        (claim,) = spec["resourceClaims"]
        assert claim == {"name": "imex-channel", "resourceClaimTemplateName": svc["metadata"]["name"] + "-channel"}
        (c,) = spec["containers"]
        assert c["resources"]["claims"] == [{"name": "imex-channel"}]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 4}
        term = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"
        assert term["labelSelector"]["matchExpressions"][0]["values"] == [svc["metadata"]["name"]]
        assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert "github.com/NVIDIA/k8s-dra-driver-gpu" in text and "docs/install.md" in text
    assert "rdma/hca_shared_devices_a" in text and "resources.limits" in text
    assert text.index("ComputeDomain: ") < text.index("kind: ComputeDomain")


def test_no_compute_domain_where_nvlink_stays_in_the_node():
    plan = _plan("llama-3.1-405b", load_cluster("dgx-h100").with_gpus(16), tp=8)
    assert plan.pp * plan.tp > 8
    _, objects = _objects(plan, "vllm")
    kinds = [o["kind"] for o in objects]
    assert "LeaderWorkerSet" in kinds and "ComputeDomain" not in kinds
    lws = next(o for o in objects if o["kind"] == "LeaderWorkerSet")
    spec = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert "resourceClaims" not in spec and "affinity" not in spec
    assert spec["containers"][0]["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}


def test_one_node_aggregated_pods_ask_for_no_rdma(h100_8b):
    files, objects = _objects(h100_8b)
    assert all("securityContext" not in o["spec"]["template"]["spec"]["containers"][0]
               for o in objects if o["kind"] == "Deployment")
    assert not any("RDMA" in k8s_yaml(objs) for objs in files.values())


def test_disaggregated_pods_add_ipc_lock():
    plan = _plan("llama-3.1-70b", load_cluster("dgx-h100").with_gpus(16), mode="on")
    assert plan.disaggregated
    files, objects = _objects(plan, "sglang")
    engines = [o for o in objects if o["kind"] == "Deployment" and not o["metadata"]["name"].endswith("-router")]
    assert engines
    for o in engines:
        assert o["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    router = next(o for o in objects if o["metadata"]["name"].endswith("-router") and o["kind"] == "Deployment")
    assert "securityContext" not in router["spec"]["template"]["spec"]["containers"][0]
    assert all("Mooncake" in k8s_yaml(objs) for name, objs in files.items() if not name.endswith("-router.yaml"))


@pytest.mark.parametrize("name", ["deepseek-ai-DeepSeek-V3-0324-instruct-long-variant", "x" * 300, "9"])
def test_leaderworkerset_names_leave_room_for_their_statefulsets(gb200_405b, name):
    """LWS names a group's worker StatefulSet `<set>-<group>`, and every pod of it carries the label
    `controller-revision-hash` = `<StatefulSet>-<hash of up to 10>`, at most 63 characters: a set named
    above 51 cannot start its workers (kubernetes-sigs/lws issue #410). A 50-character model name gave a
    54-character `...-prefill-0-lws`; every set is now at most LWS_NAME_MAX (45) characters, room for
    group indices up to 999,999."""
    from autoshard.emit.k8s_pod import LWS_NAME_MAX

    plan = dataclasses.replace(gb200_405b, model=gb200_405b.model.model_copy(update={"name": name}))
    _, objects = _objects(plan)
    sets = [o["metadata"]["name"] for o in objects if o["kind"] == "LeaderWorkerSet"]
    assert sets and all(DNS1035.match(n) and len(n) <= LWS_NAME_MAX == 45 for n in sets), sets
    assert all(len(f"{n}-999999") + 1 + 10 <= 63 for n in sets)
