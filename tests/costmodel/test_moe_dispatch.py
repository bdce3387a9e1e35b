"""MoE token dispatch (autoshard.costmodel.moe): closed forms and brute-force cross-checks."""

from __future__ import annotations

import itertools
import math

import pytest

from autoshard.costmodel.moe import dispatch_time_s, imbalance_factor, remote_domains_per_token
from autoshard.parallel import MoeDispatcher
from autoshard.specs import load_cluster

H100 = load_cluster("dgx-h100").with_gpus(64).primary


def _brute_remote(num_experts: int, top_k: int, domains: int) -> float:
    """Average over every top_k expert set of the number of other domains it touches (sender in domain 0)."""
    per = num_experts // domains
    total = count = 0
    for chosen in itertools.combinations(range(num_experts), top_k):
        total += len({e // per for e in chosen} - {0})
        count += 1
    return total / count


@pytest.mark.parametrize(("experts", "k", "domains"), [(8, 2, 2), (8, 2, 4), (12, 3, 3), (16, 4, 4), (16, 1, 8)])
def test_remote_domains_match_brute_force(experts, k, domains):
    assert remote_domains_per_token(experts, k, domains) == pytest.approx(_brute_remote(experts, k, domains))


def test_remote_domains_closed_form_qwen3_ep32():
    # 128 experts over 4 nodes, top-8: 3 * (1 - C(96,8)/C(128,8)) = 2.68 remote nodes, not 8 * 3/4 = 6
    expect = 3 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert remote_domains_per_token(128, 8, 4) == pytest.approx(expect)
    assert 2.6 < expect < 2.75
    assert remote_domains_per_token(128, 8, 1) == 0.0


def test_imbalance_factor():
    assert imbalance_factor(1, 100) == 1.0
    assert imbalance_factor(8, 1000) == pytest.approx(1 + math.sqrt(2 * math.log(8) / 1000))
    assert imbalance_factor(64, 1000) > imbalance_factor(8, 1000) > imbalance_factor(8, 100000) > 1.0


T, H, K, E = 2048, 4096, 8, 128
PAIRS = T * K * H * 2  # bytes of the routed token copies one GPU sends


def test_alltoall_inside_one_node_runs_on_nvlink():
    eff = H100.gpu.efficiency
    one = 7 / 8 * PAIRS / (450e9 * eff.intra_node_bw) + 3 * eff.intra_node_latency_us * 1e-6
    got = dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=T, hidden=H, top_k=K, num_experts=E, ep=8, etp=1, pool=H100)
    assert got == pytest.approx(2 * one)


def test_alltoall_across_nodes_is_bound_by_this_gpus_nic():
    eff = H100.gpu.efficiency
    nic = 50e9 * eff.inter_node_bw
    one = 24 / 32 * PAIRS / nic + 5 * eff.inter_node_latency_us * 1e-6  # 24 of 32 ranks are on other nodes
    got = dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=T, hidden=H, top_k=K, num_experts=E, ep=32, etp=1, pool=H100)
    assert got == pytest.approx(2 * one)


def test_flex_sends_each_token_once_per_remote_node():
    eff = H100.gpu.efficiency
    remote = T * remote_domains_per_token(E, K, 4) * H * 2
    one = max(7 / 8 * PAIRS / (450e9 * eff.intra_node_bw), remote / (50e9 * eff.inter_node_bw)) + 5 * eff.inter_node_latency_us * 1e-6
    flex = dispatch_time_s(MoeDispatcher.FLEX, tokens=T, hidden=H, top_k=K, num_experts=E, ep=32, etp=1, pool=H100)
    a2a = dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=T, hidden=H, top_k=K, num_experts=E, ep=32, etp=1, pool=H100)
    assert flex == pytest.approx(2 * one)
    assert flex < 0.5 * a2a
    # inside one NVLink domain there is nothing to deduplicate
    kw = dict(tokens=T, hidden=H, top_k=K, num_experts=E, ep=8, etp=1, pool=H100)
    assert dispatch_time_s(MoeDispatcher.FLEX, **kw) == dispatch_time_s(MoeDispatcher.ALLTOALL, **kw)


def test_allgather_volume_does_not_depend_on_top_k():
    kw = dict(tokens=T, hidden=H, num_experts=E, ep=8, etp=1, pool=H100)
    t2 = dispatch_time_s(MoeDispatcher.ALLGATHER, top_k=2, **kw)
    assert t2 == dispatch_time_s(MoeDispatcher.ALLGATHER, top_k=8, **kw)
    # top-2 of 8 experts: all-gather moves 8x the tokens, all-to-all 2x: all-to-all is cheaper
    assert dispatch_time_s(MoeDispatcher.ALLTOALL, top_k=2, **kw) < t2


def test_no_dispatch_without_expert_parallelism():
    assert dispatch_time_s(MoeDispatcher.ALLTOALL, tokens=T, hidden=H, top_k=K, num_experts=E, ep=1, etp=1, pool=H100) == 0.0
