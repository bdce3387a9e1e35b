"""The pods of `autoshard.emit.k8s`: object names, the engine pod template, and what a cluster with
rack-scale NVLink or RDMA needs in it (a ComputeDomain, IPC_LOCK), with the comments the YAML carries."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

__all__ = ["IMAGES", "POOL_LABEL", "Unit", "compute_domain", "dns_label", "manifest_comments", "pod"]

IMAGES = {"vllm": "vllm/vllm-openai:latest", "sglang": "lmsysorg/sglang:latest"}
_NAME = re.compile(r"[^a-z0-9-]+")


BASE_MAX = 28
"""Longest base name. Every object is named base + a suffix (`-prefill-131071` + `-channel` at most),
within the 63 of a DNS-1035 label, and a LeaderWorkerSet (base + `-prefill-N-lws`) stays at or under
LWS_NAME_MAX: LWS names each group's worker StatefulSet `<set>-<group>`, whose pods carry the label
`controller-revision-hash` = `<StatefulSet>-<hash of up to 10>`, a label value of at most 63 (lws 060ab4da
`pod_controller.go`; kubernetes-sigs/lws issue #410: a set named above 51 characters cannot start)."""
LWS_NAME_MAX = 45
"""Longest LeaderWorkerSet name written: 52 - 1 - 6, room for group indices up to 999,999."""


def dns_label(text: str, limit: int = BASE_MAX) -> str:
    """A DNS-1035 label (a letter first, then [a-z0-9-], an alphanumeric last; also a DNS-1123 label and
    a label value) from any text, deterministically: ASCII-folded (NFKD), lowercased, every run of other
    characters one `-`, `m-` before a leading digit; text that is cut at `limit` or has no ASCII letter
    or digit ends in 8 hex digits of its SHA-1, so names that differ past the cut stay apart."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    label = _NAME.sub("-", folded).strip("-")
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    if not label:
        return f"m-{digest}"
    if not label[0].isalpha():
        label = "m-" + label
    if len(label) > limit:
        label = label[: limit - 9].rstrip("-") + "-" + digest
    return label


@dataclass(frozen=True, slots=True)
class Unit:
    name: str
    role: str
    gpus_per_pod: int
    pods: int
    lines: list[str]
    port: int
    pool: str
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables of the engine container."""
    pod_ip_env: tuple[str, ...] = ()
    """Environment variables set to the pod's own IP (the downward API's status.podIP)."""
    domain_nodes: int = 1
    """Nodes one NVLink domain spans (18 trays of a GB200 NVL72; 1 where NVLink stays in the node)."""

    @property
    def rdma(self) -> bool:
        """Traffic between nodes: NCCL across the pods of a multi-node instance, the KV cache between
        prefill and decode instances (NIXL, Mooncake), both over RDMA where the pod may use it."""
        return self.pods > 1 or self.role in ("prefill", "decode")

    @property
    def compute_domain(self) -> bool:
        """A multi-node instance inside one rack-scale NVLink domain: its NVLink across trays needs a
        ComputeDomain (IMEX channels) and its pods in one NVLink clique."""
        return 1 < self.pods <= self.domain_nodes


POOL_LABEL = "autoshard/pool"
"""Node label that pins pods to a pool's GPU type in a heterogeneous cluster: label the nodes of
each pool `kubectl label node NODE autoshard/pool=<value>`, the value the manifests' nodeSelector
writes (the pool's name as a label value, `dns_label`)."""

CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""The node label GPU Feature Discovery sets on multi-node NVLink nodes, `<cluster UUID>.<clique ID>`
(NVIDIA k8s-dra-driver-gpu docs/install.md, "Run a sample ComputeDomain workload")."""
CD_API = "resource.nvidia.com/v1beta1"
"""The ComputeDomain's API (NVIDIA k8s-dra-driver-gpu 22407113: api/nvidia.com/resource/v1beta1,
docs/install.md, demo/specs/imex/nvbandwidth-test-job.yaml)."""


def _channel(unit: Unit) -> str:
    """The ResourceClaimTemplate the ComputeDomain's controller creates for its IMEX channel."""
    return f"{unit.name}-channel"


def compute_domain(unit: Unit) -> dict[str, Any]:
    """One ComputeDomain per instance, shaped as NVIDIA's published example (numNodes: the instance's
    nodes; a count the driver needs with IMEXDaemonsWithDNSNames off and uses for status only with it on)."""
    return {
        "apiVersion": CD_API,
        "kind": "ComputeDomain",
        "metadata": {"name": unit.name},
        "spec": {"numNodes": unit.pods, "channel": {"resourceClaimTemplate": {"name": _channel(unit)}}},
    }


def pod(
    unit: Unit, framework: str, command: str, labels: dict[str, str], pinned: bool = False
) -> dict[str, Any]:
    spec_extra: dict[str, Any] = {"nodeSelector": {POOL_LABEL: dns_label(unit.pool, 63)}} if pinned else {}
    container_extra: dict[str, Any] = {}
    limits: dict[str, Any] = {"nvidia.com/gpu": unit.gpus_per_pod}
    resources: dict[str, Any] = {"limits": limits}
    if unit.rdma:  # RDMA verbs pin memory (as Mellanox k8s-rdma-shared-dev-plugin example/test-hca-pod.yaml)
        container_extra["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    if unit.compute_domain:  # the IMEX channel and one NVLink clique (NVIDIA's ComputeDomain examples)
        resources["claims"] = [{"name": "imex-channel"}]
        spec_extra["resourceClaims"] = [{"name": "imex-channel", "resourceClaimTemplateName": _channel(unit)}]
        spec_extra["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": CLIQUE_LABEL, "operator": "Exists"}]}]}},
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": [unit.name]}]},
                "topologyKey": CLIQUE_LABEL}]},
        }
    return {
        "metadata": {"labels": dict(labels)},
        "spec": {
            **spec_extra,
            "containers": [
                {
                    "name": "engine",
                    "image": IMAGES[framework],
                    "command": ["/bin/sh", "-c", command],
                    "ports": [{"containerPort": unit.port, "name": "http"}],
                    "resources": resources,
                    **container_extra,
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                    **({"env": [{"name": k, "value": v} for k, v in unit.env]
                               + [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                                  for k in unit.pod_ip_env]}
                       if unit.env or unit.pod_ip_env else {}),
                }
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }


CD_SOURCE = (
    "NVIDIA DRA Driver for GPUs (github.com/NVIDIA/k8s-dra-driver-gpu 22407113, docs/install.md \"Run a "
    "sample ComputeDomain workload\" and demo/specs/imex/nvbandwidth-test-job.yaml; "
    "docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/dra-cds.html)"
)
RDMA_NOTE = (
    "RDMA: these pods reach other nodes (NCCL between the pods of an instance, the KV cache between prefill "
    "and decode instances: NIXL, SGLang's Mooncake, which uses RDMA by default and fails without RDMA "
    "devices; NCCL falls back to TCP). The engine container adds IPC_LOCK (RDMA pins memory) but requests "
    "no RDMA device: add your cluster's RDMA device resource to its resources.limits. Its name is the one "
    "your cluster's RDMA device plugin advertises, e.g. rdma/hca_shared_devices_a in "
    "Mellanox/k8s-rdma-shared-dev-plugin example/test-hca-pod.yaml (410b0f32), whose resourceName and "
    "resourcePrefix the cluster sets."
)


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    templates = [spec.get("template")] if "template" in spec else []
    lwt = spec.get("leaderWorkerTemplate", {})
    templates += [lwt.get("leaderTemplate"), lwt.get("workerTemplate")]
    return [c for t in templates if t for c in t["spec"]["containers"]]


def manifest_comments(obj: dict[str, Any], domain_nodes: int = 1) -> list[str]:
    """The comment lines a manifest carries above `obj`, read from the object itself."""
    lines: list[str] = []
    if obj.get("kind") == "ComputeDomain":
        lines += [
            "ComputeDomain: the IMEX channel that NVLink across trays (multi-node NVLink, GB200/GB300 NVL72)",
            "needs; every pod of the instance claims it and runs in one NVLink clique (nvidia.com/gpu.clique).",
            "Needs the NVIDIA DRA Driver for GPUs with ComputeDomains enabled. As published by the " + CD_SOURCE + ".",
        ]
    containers = _containers(obj)
    if any("IPC_LOCK" in c.get("securityContext", {}).get("capabilities", {}).get("add", []) for c in containers):
        lines.append(RDMA_NOTE)
    return lines
