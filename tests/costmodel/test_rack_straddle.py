"""EP groups on rack-scale NVLink domains (GB200 NVL72): Megatron lays a group's ranks out as an aligned
block of EP x ETP consecutive ranks, racks fill in rank order with `domain_used` GPUs each, so a group
stays inside one rack only when its span divides that count; the others straddle two racks and their
dispatch crosses the network (the slowest group sets the step's pace)."""

from __future__ import annotations

import math

import pytest

from autoshard.costmodel.comm import (
    domain_shares,
    group_link,
    deepep_nic_link,
    hierarchical_all_to_all_s,
    nic_link,
    split_all_to_all_s,
)
from autoshard.costmodel.moe import dispatch_time_s, flex_nic_rows, ranks_per_token, remote_domains_per_token
from autoshard.costmodel.serve.comm_memory import NVLS_BYTES_PER_RANK, nvls_bytes
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.sharding import _ep_ranks_per_domain
from autoshard.parallel import MoeDispatcher
from autoshard.specs import ClusterSpec, PoolSpec, load_cluster


def _full_racks(cluster: ClusterSpec) -> ClusterSpec:
    """The bundled NVL72 cluster with every rack's 72 GPUs used (the bundled file fills 64 per rack)."""
    node = cluster.primary.node.model_copy(update={"nvlink_domain_gpus_used": None})
    return cluster.model_copy(update={"pools": (cluster.primary.model_copy(update={"node": node}),)})


GB200 = _full_racks(load_cluster("gb200-nvl72"))
E, K, H, T = 256, 8, 7168, 4096  # DeepSeek-V3's experts, top-k and hidden; 4096 tokens per GPU


def _racks(gpus: int, used: int | None = None) -> PoolSpec:
    cluster: ClusterSpec = GB200
    if used is not None:
        node = GB200.primary.node.model_copy(update={"nvlink_domain_gpus_used": used})
        cluster = GB200.model_copy(update={"pools": (GB200.primary.model_copy(update={"node": node}),)})
    return cluster.with_gpus(gpus).primary


def _reach(members: int, ep: int) -> float:
    """1 - C(E - m E/ep, k) / C(E, k): a token reaches a domain holding `members` of the ep ranks."""
    return 1 - math.comb(E - E // ep * members, K) / math.comb(E, K)


def _dispatch(pool: PoolSpec, ep: int, kind: MoeDispatcher = MoeDispatcher.FLEX) -> float:
    return dispatch_time_s(kind, tokens=T, hidden=H, top_k=K, num_experts=E, ep=ep, etp=1, pool=pool)


def test_groups_split_over_racks_as_megatron_lays_them_out() -> None:
    # EP 48 on racks of 64: groups at ranks 0, 48, 96, 144 -> 48 | 16 + 32 | 32 + 16 | 48
    assert domain_shares(_racks(192, 64), ranks=48) == ((16, 32), (32, 16), (48,))
    # EP 32 on full 72-GPU racks: 64-95 is 8 + 24, 128-159 is 16 + 16, 192-223 is 24 + 8
    assert domain_shares(_racks(256), ranks=32) == ((8, 24), (16, 16), (24, 8), (32,))
    assert domain_shares(_racks(256, 64), ranks=32) == ((32,),)
    # EP 72 on racks of 64 always straddles (0-71: 64 + 8, ..., 216-287: 40 + 32); EP 128 is two racks
    assert domain_shares(_racks(288, 64), ranks=72) == ((40, 32), (48, 24), (56, 16), (64, 8))
    assert domain_shares(_racks(256, 64), ranks=128) == ((64, 64),)
    # expert TP 2 spaces EP ranks two apart: EP 16 x ETP 2 spans 32 GPUs, 64-95 is 4 + 12 ranks
    assert (4, 12) in domain_shares(_racks(256), ranks=16, stride=2)


def test_aligned_group_inside_a_rack_is_all_nvlink() -> None:
    pool = _racks(256, 64)
    rank_bytes = T * ranks_per_token(E, K, 32) * H * 2
    nvl = group_link(pool, ranks=1)
    closed = 31 / 32 * rank_bytes / nvl.bytes_per_s + 5 * nvl.latency_s  # (n-1)/n S / B_nvl + log2(32) steps
    assert _dispatch(pool, 32) == pytest.approx(2 * closed)
    assert split_all_to_all_s(rank_bytes, 32, 32, pool) == pytest.approx(closed)


def test_aligned_group_over_whole_racks_keeps_the_remote_domain_count() -> None:
    # EP 128 on racks of 64 = two whole racks: one crossing per remote rack a token reaches
    pool = _racks(256, 64)
    rank_bytes = T * ranks_per_token(E, K, 128) * H * 2
    remote = T * remote_domains_per_token(E, K, 2) * H * 2
    assert flex_nic_rows((64, 64), E, K, 128) == pytest.approx((_reach(64, 128),) * 2)
    assert _reach(64, 128) == pytest.approx(remote_domains_per_token(E, K, 2))
    one = hierarchical_all_to_all_s(rank_bytes, remote, 128, 64, pool)
    assert _dispatch(pool, 128) == pytest.approx(2 * one)


def test_straddling_group_is_priced_on_its_smaller_side() -> None:
    pool = _racks(256)  # full 72-GPU racks: EP 32 group 64-95 holds 8 ranks in rack 0, 24 in rack 1
    nic = deepep_nic_link(pool)  # flex runs DeepEP-style RDMA kernels: 0.87 of the line rate, not NCCL's
    assert nic.bytes_per_s == pytest.approx(50e9 * 0.87)
    # the 8-side NIC receives the 24 others' tokens bound for its 64 experts, over 8 NICs
    recv = 24 * _reach(8, 32) / 8
    send = _reach(24, 32)
    far = max(_reach(8, 32), 8 * _reach(24, 32) / 24)  # the 24-side sends to and receives from the 8
    assert flex_nic_rows((8, 24), E, K, 32) == pytest.approx((max(send, recv), far))
    assert recv == pytest.approx(2.7107, abs=1e-4)
    nic_s = T * recv * H * 2 / nic.bytes_per_s  # 4096 x 2.71 x 7168 x 2 B / 43.5 GB/s = 3.66 ms
    assert nic_s == pytest.approx(3.656e-3, rel=1e-3)
    one = nic_s + 5 * nic.latency_s  # the NIC part outweighs the NVLink fan-out
    assert _dispatch(pool, 32) == pytest.approx(2 * one)
    # an all-NVLink pricing (racks of 64) is ~7x faster
    assert _dispatch(pool, 32) > 6 * _dispatch(_racks(256, 64), 32)


def test_straddling_alltoall_uses_the_fewest_members_per_rack() -> None:
    pool = _racks(256)
    pairs = T * K * H * 2
    nic = nic_link(pool)
    # the rank with 8 of 32 peers in its rack sends 24/32 of its pairs over its NIC
    closed = 24 / 32 * pairs / nic.bytes_per_s + 5 * nic.latency_s
    assert _dispatch(pool, 32, MoeDispatcher.ALLTOALL) == pytest.approx(2 * closed)


def test_straddling_ring_runs_on_the_smaller_sides_nics() -> None:
    eff = GB200.primary.gpu.efficiency
    link = group_link(_racks(256), ranks=32)  # 8 members on the near side of 64-95
    assert link.crosses_nodes
    assert link.bytes_per_s == pytest.approx(8 * 50e9 * eff.inter_node_bw)
    assert not group_link(_racks(256, 64), ranks=32).crosses_nodes


def test_serving_engine_fills_racks_in_order() -> None:
    cfg = ServeConfig(tp=1, dp_attention=96, expert_parallel=True)
    assert _ep_ranks_per_domain(_racks(256, 64), cfg) == 32  # 64 + 32: the 32-side sends the most remotely
    assert _ep_ranks_per_domain(_racks(256), cfg) == 24  # 72 + 24
    tp2 = ServeConfig(tp=2, dp_attention=32, expert_parallel=True)  # 64 GPUs: one rack of 64
    assert _ep_ranks_per_domain(_racks(256, 64), tp2) == 32


def test_nvls_counts_the_ranks_one_rack_holds() -> None:
    assert nvls_bytes(_racks(256, 64), ranks=128) == 64 * NVLS_BYTES_PER_RANK
    assert nvls_bytes(_racks(256), ranks=128) == 72 * NVLS_BYTES_PER_RANK
