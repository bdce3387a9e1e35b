"""Collective costs, priced on the links each process group actually crosses. Every collective's
time formula lives here (callers compute message sizes and pick the group; this file prices them).

NCCL conventions with bus bandwidth B per GPU per direction, message S bytes per rank, n ranks:
ring all-reduce 2(n-1)/n * S/B; all-gather, reduce-scatter and all-to-all (n-1)/n * S/B;
point-to-point S/B. Each adds a latency per algorithm step (log2 n steps, NCCL's tree/ring mix).

Placement follows Megatron's rank order (TP innermost, then CP, then DP, PP outermost; experts fold
as ETP, EP, expert-DP): a group whose ranks span at most one NVLink domain runs at NVLink speed,
otherwise it is bound by the per-GPU network bandwidth.

Beyond NCCL's ring/tree: the serving engines' custom all-reduce for small TP messages
(`tp_all_reduce_s`), MoE all-to-alls split between NVLink and the NIC (`split_all_to_all_s`,
`hierarchical_all_to_all_s`: DeepEP-style, once per remote domain then NVLink fan-out), and a
transfer striped over several GPUs' links at once (`striped_send_s`: a disaggregated KV hand-off).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from autoshard.parallel import ParallelDims
from autoshard.specs.cluster import LinkKind, NodeSpec, PoolSpec

__all__ = [
    "Collective", "Link", "collective_time_s", "group_link", "GroupLinks", "group_links", "pool_link",
    "nic_link", "tp_all_reduce_s", "split_all_to_all_s", "hierarchical_all_to_all_s", "ep_all_to_all_s",
    "striped_send_s", "deepep_normal_all_to_all_s", "domain_bounds", "domain_shares", "bounds_shares",
    "DEEPEP_NIC_FRACTION", "deepep_nic_link",
]

DEEPEP_NIC_FRACTION = 0.87
"""Share of a GPU's NIC line rate that DeepEP-style RDMA kernels (DeepEP's normal kernels, Megatron's
flex dispatcher on DeepEP or HybridEP) sustain: deepseek-ai/DeepEP docs/legacy.md (commit dd758caf),
internode normal kernels on H800 with one CX7 400 Gb/s NIC per GPU, EP 32 dispatch / combine 58 / 57
GB/s and EP 64 51 / 50 GB/s, counted over every node a token reaches, the sender's included
(tests/legacy/test_internode.py): the remote 3/4 and 7/8 of those bytes are 43.5 / 42.8 and 44.6 /
43.8 GB/s of 50, 0.855-0.89. A property of the kernels, not of NCCL's rings, so the training fit's
`inter_node_bw` (NCCL's DP and pipeline traffic) does not set it."""

CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024
"""Largest message the custom all-reduce takes (vLLM `CustomAllreduce(max_size=8192 * 1024)`)."""
CUSTOM_AR_SYNC_US = (3.0, 0.36)
"""Fixed time of one custom all-reduce on TP n ranks, `a + b * n` microseconds: launch plus the
peer-flag barriers. From SGLang PR #2904's H100 measurements of the TensorRT-LLM-derived kernel
(no CUDA graph): 3.7 / 4.8 / 5.9 us at 512 B on TP 2 / 4 / 8."""
CUSTOM_AR_LINK_FRACTION = 0.135
"""Bus bandwidth the custom all-reduce reaches at <= 1 MiB, as a fraction of the NVLink figure (it runs
on a few dozen SMs, far from NVLink's peak): same measurements, 16.2 / 26.6 / 27.9 us per extra MiB
on TP 2 / 4 / 8 = ~60 GB/s of ring-equivalent bus bandwidth on 450 GB/s NVLink 4."""


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


def _intra(node: NodeSpec, pool: PoolSpec, span: int = 1) -> Link:
    """The intra-node link of a group whose ranks span `span` consecutive GPUs: on a two-socket PCIe
    node a span beyond one socket's GPUs runs its ring through the CPU interconnect
    (`NodeSpec.cross_socket_gbps`, the slower of the two)."""
    eff = pool.gpu.efficiency
    gbps = node.intra_node_gbps
    if node.socket_gpus is not None and node.cross_socket_gbps is not None and span > node.socket_gpus:
        gbps = min(gbps, node.cross_socket_gbps)
    return Link(gbps * 1e9 * eff.intra_node_bw, eff.intra_node_latency_us * 1e-6, False)


def group_link(pool: PoolSpec, *, ranks: int, stride: int = 1) -> Link:
    """Link of a group of `ranks` ranks spaced `stride` apart in the pool's rank order.

    Inside one NVLink domain it runs at NVLink speed. Across domains NCCL runs one ring per member a
    domain holds, each through that member's own NIC, so the group gets (members per domain) x the
    per-GPU network bandwidth, never more than NVLink's."""
    node = pool.node
    domain = node.domain_size
    members = None
    if domain > node.gpus_per_node:
        # rack-scale domain: ranks fill `domain_used` GPUs of each, the last one possibly partly; an
        # aligned group stays inside one domain when it divides that count (or one domain holds all)
        used = pool.domain_fill_size
        span = ranks * stride
        if ranks <= 1 or pool.num_gpus <= used or (span <= used and used % span == 0):
            return _intra(node, pool)
        domain = used
        if span <= used:
            # groups a rack could hold but that straddle two: the ring crosses between racks on the
            # NICs of the side with fewer members (the slowest group sets the pace)
            members = min(min(split) for split in domain_shares(pool, ranks=ranks, stride=stride))
    elif ranks <= 1 or ranks * stride <= domain:
        return _intra(node, pool, span=(ranks - 1) * stride + 1)
    eff = pool.gpu.efficiency
    members = members or max(1, min(ranks, domain // stride))
    # never more than the intra-node ring of a node's members (cross-socket on a two-socket PCIe node)
    intra = _intra(node, pool, span=(members - 1) * stride + 1).bytes_per_s / 1e9
    bandwidth = min(members * node.inter_node_gbps * eff.inter_node_bw, intra)
    return Link(bandwidth * 1e9, eff.inter_node_latency_us * 1e-6, True)


def domain_bounds(pool: PoolSpec, gpus: int | None = None) -> tuple[int, ...]:
    """First rank of each NVLink domain that `gpus` ranks (default: the pool's) fill from a domain's
    start, in rank order, and the end: a rack-scale domain holds `domain_used` consecutive ranks
    (`PoolSpec.domain_fill_size`: all of one rack for a pool that fits in it; the last rack possibly partly
    filled), a node-sized one `domain_size`."""
    per = pool.domain_fill_size  # the domain's size where no partial fill is set
    full, rest = divmod(pool.num_gpus if gpus is None else gpus, per)
    return (0, *itertools.accumulate((per,) * full + ((rest,) if rest else ())))


def domain_shares(pool: PoolSpec, *, ranks: int, stride: int = 1) -> tuple[tuple[int, ...], ...]:
    """How the members of each group of `ranks` ranks `stride` apart split over NVLink domains: the
    distinct splits (members per domain touched, in rank order) over the pool's groups. Groups are
    Megatron's aligned blocks of `ranks * stride` consecutive ranks (`parallel_state.RankGenerator`,
    order tp-cp-ep-dp-pp; the expert generator tp=ETP, ep=EP, cp=1), and ranks fill the domains in order
    (`domain_bounds`). An aligned group whose span divides the domain's count has one split, (ranks,);
    EP 48 on racks of 64 has (48,) and (16, 32)."""
    return bounds_shares(domain_bounds(pool), ranks=ranks, stride=stride)


@lru_cache(maxsize=4096)
def bounds_shares(bounds: tuple[int, ...], *, ranks: int, stride: int = 1) -> tuple[tuple[int, ...], ...]:
    """`domain_shares` on ranks 0..bounds[-1] whose domains start at `bounds` (the last is the end)."""
    span = max(1, ranks * stride)
    out: set[tuple[int, ...]] = set()
    seen: set[tuple[int, ...]] = set()
    for start in range(0, max(1, bounds[-1] - span + 1), span):
        first = bisect.bisect_right(bounds, start) - 1
        last = bisect.bisect_right(bounds, start + span - 1) - 1
        sizes = (bounds[d + 1] - bounds[d] for d in range(first, min(last, len(bounds) - 2) + 1))
        key = (start - bounds[first], *sizes)
        if key in seen:  # the same offset into domains of the same sizes: the same split
            continue
        seen.add(key)
        counts: dict[int, int] = {}
        for j in range(ranks):
            d = bisect.bisect_right(bounds, start + j * stride) - 1
            counts[d] = counts.get(d, 0) + 1
        out.add(tuple(counts[d] for d in sorted(counts)))
    return tuple(sorted(out))


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


def tp_all_reduce_s(
    size_bytes: float, ranks: int, link: Link, pool: PoolSpec, *, custom: bool = True
) -> float:
    """One TP all-reduce of `size_bytes` per rank in a serving engine: the engine's custom all-reduce
    (vLLM, SGLang and TensorRT-LLM all ship one: one-shot/two-shot through peer memory) when it
    applies (NVLink-class link inside one domain, message <= CUSTOM_AR_MAX_BYTES) and is faster,
    else NCCL."""
    nccl = collective_time_s(Collective.ALL_REDUCE, size_bytes, ranks, link)
    if (
        not custom
        or ranks <= 1
        or link.crosses_nodes
        or pool.node.intra_node_link is LinkKind.PCIE
        or size_bytes > CUSTOM_AR_MAX_BYTES
    ):
        return nccl
    a, b = CUSTOM_AR_SYNC_US
    bus = pool.node.intra_node_gbps * 1e9 * CUSTOM_AR_LINK_FRACTION
    custom_s = (a + b * ranks) * 1e-6 + 2 * (ranks - 1) / ranks * size_bytes / bus
    return min(nccl, custom_s)


def nic_link(pool: PoolSpec, share: float | None = None) -> Link:
    """One GPU's own network interface (what its traffic out of the NVLink domain runs on), at `share` of
    its line rate (default: the GPU's `inter_node_bw`, NCCL's)."""
    eff = pool.gpu.efficiency
    share = eff.inter_node_bw if share is None else share
    return Link(pool.node.inter_node_gbps * 1e9 * share, eff.inter_node_latency_us * 1e-6, True)


def deepep_nic_link(pool: PoolSpec) -> Link:
    """One GPU's own network interface as DeepEP-style RDMA kernels drive it (`DEEPEP_NIC_FRACTION` of
    the line rate; the pool's network latency)."""
    return nic_link(pool, DEEPEP_NIC_FRACTION)


def split_all_to_all_s(size: float, ranks: int, per_domain: int, pool: PoolSpec) -> float:
    """One all-to-all of `size` bytes per rank over `ranks` ranks, `per_domain` of them in each NVLink
    domain: the intra-domain part over NVLink, the rest over the NIC, both at once."""
    nvl, nic = group_link(pool, ranks=1), nic_link(pool)
    local = (per_domain - 1) / ranks * size / nvl.bytes_per_s
    remote = (ranks - per_domain) / ranks * size / nic.bytes_per_s
    lat = nvl.latency_s if ranks <= per_domain else nic.latency_s
    return max(local, remote) + math.ceil(math.log2(ranks)) * lat


def hierarchical_all_to_all_s(
    pair_bytes: float, remote_bytes: float, ranks: int, per_domain: int, pool: PoolSpec
) -> float:
    """One DeepEP/HybridEP-style all-to-all: `remote_bytes` per rank cross the NIC once per remote
    domain (at `DEEPEP_NIC_FRACTION` of its line rate), while the `pair_bytes` fan out over NVLink
    inside the domain, both at once."""
    nvl_s = (per_domain - 1) / per_domain * pair_bytes / group_link(pool, ranks=1).bytes_per_s
    nic = deepep_nic_link(pool)
    return max(nvl_s, remote_bytes / nic.bytes_per_s) + math.ceil(math.log2(ranks)) * nic.latency_s


def ep_all_to_all_s(size: float, ranks: int, per_domain: int, pool: PoolSpec) -> float:
    """One serving-engine EP dispatch or combine of `size` bytes per rank (every top-k copy counted)
    over `ranks` ranks, `per_domain` of them in each NVLink domain, when the group leaves the domain:
    the kernels (DeepEP low-latency, pplx, MORI) post every peer's put at once, so the copies for ranks
    of the own domain run over NVLink while the rest leave through the GPU's own NIC (not the ring
    bandwidth of the whole domain's NICs that `group_link` gives NCCL's rings), in one round: one
    network latency, not log2(n). Checked against DeepEP's published low-latency table (H800, CX7
    400 Gb/s, 128 tokens, hidden 7168, top-8, FP8 dispatch / BF16 combine, EP 16-256: 118-194 us
    dispatch, 195-369 us combine) and MORI's MI300X EP32 low-latency kernel (157 / 280 us) in
    tests/costmodel/test_serving_moe_decode.py."""
    if ranks <= 1 or size <= 0:
        return 0.0
    nvl, nic = group_link(pool, ranks=1), nic_link(pool)
    per_domain = max(1, min(per_domain, ranks))
    local = (per_domain - 1) / ranks * size / nvl.bytes_per_s
    remote = (ranks - per_domain) / ranks * size / nic.bytes_per_s
    lat = nvl.latency_s if ranks <= per_domain else nic.latency_s
    return max(local, remote) + lat


def deepep_normal_all_to_all_s(
    rank_bytes: float, remote_bytes: float, ranks: int, per_domain: int, pool: PoolSpec, nvl_fraction: float
) -> float:
    """One dispatch or combine on DeepEP's normal (high-throughput) kernels over `ranks` ranks,
    `per_domain` of them in each NVLink domain: `rank_bytes` per rank go once to every destination rank
    (the (d-1)/d that leave the GPU over NVLink, at `nvl_fraction` of the node's NVLink figure: the
    kernels copy through a few dozen SMs), `remote_bytes` cross the GPU's own NIC (`deepep_nic_link`)
    once per remote domain; both at once, plus one latency (NVLink inside a domain, the NIC across)
    per log2(ranks)."""
    if ranks <= 1 or (rank_bytes <= 0 and remote_bytes <= 0):
        return 0.0
    local = max(1, min(per_domain, ranks))
    nvl_s = (local - 1) / local * rank_bytes / (pool.node.intra_node_gbps * 1e9 * nvl_fraction)
    nic = deepep_nic_link(pool)
    lat = nic.latency_s if remote_bytes > 0 else group_link(pool, ranks=1).latency_s
    return max(nvl_s, remote_bytes / nic.bytes_per_s) + math.ceil(math.log2(ranks)) * lat


def striped_send_s(size_bytes: float, streams: int, link: Link) -> float:
    """`size_bytes` sent point-to-point, split evenly over `streams` parallel links like `link`
    (each sending GPU through its own link), plus one link latency."""
    return size_bytes / (streams * link.bytes_per_s) + link.latency_s
