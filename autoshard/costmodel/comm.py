"""Collective costs, priced on the links each process group actually crosses.

NCCL conventions with bus bandwidth B per GPU per direction, message S bytes per rank, n ranks:
ring all-reduce 2(n-1)/n * S/B; all-gather, reduce-scatter and all-to-all (n-1)/n * S/B;
point-to-point S/B. Each adds a latency per algorithm step (log2 n steps, NCCL's tree/ring mix).

Placement follows Megatron's rank order (TP innermost, then CP, then DP, PP outermost; experts fold
as ETP, EP, expert-DP): a group whose ranks span at most one NVLink domain runs at NVLink speed,
otherwise it is bound by the per-GPU network bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from autoshard.parallel import ParallelDims
from autoshard.specs.cluster import NodeSpec, PoolSpec

__all__ = ["Collective", "Link", "collective_time_s", "group_link", "GroupLinks", "group_links", "pool_link"]


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    P2P = "p2p"


@dataclass(frozen=True, slots=True)
class Link:
    """Achieved bandwidth (bytes/s per GPU per direction) and per-step latency of a group's slowest link."""

    bytes_per_s: float
    latency_s: float
    crosses_nodes: bool


def collective_time_s(kind: Collective, size_bytes: float, ranks: int, link: Link) -> float:
    """Time of one collective. `size_bytes` is the full buffer each rank holds (before scatter /
    after gather), as NCCL's tests report it."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    n = ranks
    match kind:
        case Collective.ALL_REDUCE:
            volume, steps = 2 * (n - 1) / n, 2 * math.ceil(math.log2(n))
        case Collective.ALL_GATHER | Collective.REDUCE_SCATTER | Collective.ALL_TO_ALL:
            volume, steps = (n - 1) / n, math.ceil(math.log2(n))
        case Collective.P2P:
            volume, steps = 1.0, 1
    return volume * size_bytes / link.bytes_per_s + steps * link.latency_s


def _intra(node: NodeSpec, pool: PoolSpec) -> Link:
    eff = pool.gpu.efficiency
    return Link(node.intra_node_gbps * 1e9 * eff.intra_node_bw, eff.intra_node_latency_us * 1e-6, False)


def group_link(pool: PoolSpec, *, ranks: int, stride: int = 1) -> Link:
    """Link of a group of `ranks` ranks spaced `stride` apart in the pool's rank order.

    Inside one NVLink domain it runs at NVLink speed. Across domains NCCL runs one ring per member a
    domain holds, each through that member's own NIC, so the group gets (members per domain) x the
    per-GPU network bandwidth, never more than NVLink's."""
    node = pool.node
    domain = node.domain_size
    if domain > node.gpus_per_node:
        # rack-scale domain: ranks fill `domain_used` GPUs of each, the last one possibly partly; an
        # aligned group stays inside one domain when it divides that count (or one domain holds all)
        used = node.domain_used
        span = ranks * stride
        if ranks <= 1 or pool.num_gpus <= used or (span <= used and used % span == 0):
            return _intra(node, pool)
        domain = used
    elif ranks <= 1 or ranks * stride <= domain:
        return _intra(node, pool)
    eff = pool.gpu.efficiency
    members = max(1, min(ranks, domain // stride))
    bandwidth = min(members * node.inter_node_gbps * eff.inter_node_bw, node.intra_node_gbps * eff.intra_node_bw)
    return Link(bandwidth * 1e9, eff.inter_node_latency_us * 1e-6, True)


def pool_link(a: PoolSpec, b: PoolSpec, inter_pool_gbps: float) -> Link:
    """Link between two different pools (stage boundary of a heterogeneous pipeline)."""
    eff_a, eff_b = a.gpu.efficiency, b.gpu.efficiency
    eff = min(eff_a.inter_node_bw, eff_b.inter_node_bw)
    lat = max(eff_a.inter_node_latency_us, eff_b.inter_node_latency_us) * 1e-6
    return Link(inter_pool_gbps * 1e9 * eff, lat, True)


@dataclass(frozen=True, slots=True)
class GroupLinks:
    tp: Link
    cp: Link
    dp: Link
    ep: Link
    etp: Link
    pp: Link
    edp: Link


@lru_cache(maxsize=8192)
def group_links(pool: PoolSpec, dims: ParallelDims) -> GroupLinks:
    """Links of every process group under Megatron's default rank order (tp-cp-dp-pp; experts
    etp-ep-edp-pp) on one pool."""
    tp, cp, dp = dims.tp, dims.cp, dims.dp
    etp, ep = dims.expert_tp, dims.ep
    return GroupLinks(
        tp=group_link(pool, ranks=tp),
        cp=group_link(pool, ranks=cp, stride=tp),
        dp=group_link(pool, ranks=dp * cp, stride=tp),  # gradients reduce over DP x CP
        etp=group_link(pool, ranks=etp),
        ep=group_link(pool, ranks=ep, stride=etp),
        edp=group_link(pool, ranks=dims.expert_dp, stride=etp * ep),
        pp=group_link(pool, ranks=2, stride=tp * cp * dp),
    )
