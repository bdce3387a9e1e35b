"""Group-limited routing (DeepSeek-V3: 8 groups of 32 experts, a token's top-8 from its 4 best groups)
in the training dispatch: where flex sends a token is priced from the router's procedure, checked here
against a direct simulation of Megatron-Core's `group_limited_topk` (a different seed and sample than
the cost model's own draw) and against the exact uniform-pick closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoshard.costmodel.moe import (
    GroupLimit,
    dispatch_time_s,
    domain_reaches,
    domains_touched_per_token,
    flex_nic_rows,
    group_pick_counts,
    ranks_per_token,
    remote_domains_per_token,
)
from autoshard.parallel import MoeDispatcher
from autoshard.specs import load_cluster, load_model

DSV3 = load_model("deepseek-v3")
E, K, H, T = 256, 8, 7168, 4096


def _simulate(limit: GroupLimit, blocks: list[tuple[int, int]], tokens: int = 40_000, seed: int = 7) -> np.ndarray:
    """Megatron-Core's group-limited top-k on i.i.d. normal logits (--moe-router-force-load-balancing),
    sigmoid scores: each group scored by the sum of its top (k / topk_groups) scores, the best
    topk_groups kept, the top-k experts among theirs. Returns the fraction of tokens reaching each
    expert block [lo, hi)."""
    rng = np.random.default_rng(seed)
    size = E // limit.groups
    scores = 1 / (1 + np.exp(-rng.standard_normal((tokens, limit.groups, size))))
    group_score = np.sort(scores, axis=2)[:, :, -limit.score_top:].sum(axis=2)
    keep = np.argsort(-group_score, axis=1)[:, :limit.topk_groups]
    masked = np.full_like(scores, -np.inf)
    rows = np.arange(tokens)[:, None]
    masked[rows, keep] = scores[rows, keep]
    experts = np.argsort(-masked.reshape(tokens, E), axis=1)[:, :K]
    return np.array([((experts >= lo) & (experts < hi)).any(axis=1).mean() for lo, hi in blocks])


def test_megatron_scores_deepseek_groups_by_their_top_two():
    assert GroupLimit.of(DSV3.moe) == GroupLimit(8, 4, 2, True)
    plain = DSV3.moe.model_copy(update={"num_groups": None, "topk_groups": None})
    assert GroupLimit.of(plain) is None
    assert GroupLimit.of(DSV3.moe.model_copy(update={"topk_groups": 8})) is None  # every group: no limit


@pytest.mark.parametrize("top", [0, 2])
def test_pick_counts_are_a_distribution_of_k_picks(top):
    counts, probs = group_pick_counts(32, GroupLimit(8, 4, top), K)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert (counts.sum(axis=1) == K).all()
    assert (counts * probs[:, None]).sum(axis=0) == pytest.approx([2.0] * 4, abs=0.02)  # exchangeable
    empty = float((probs[:, None] * (counts == 0)).sum() / 4)
    if top == 0:  # uniform picks: C(96, 8) / C(128, 8)
        assert empty == pytest.approx(math.comb(96, 8) / math.comb(128, 8), rel=1e-12)
    else:  # chosen for its best experts, a group nearly always supplies one
        assert 0.006 <= empty <= 0.012, empty  # 0.9 %, not the 9.3 % of uniform picks


def test_node_reach_matches_a_simulation_of_megatrons_router():
    """EP 32 over 4 nodes of 8 ranks (two groups a node): the per-node reach, the remote rows flex sends
    and the ranks a token's copies reach, against a direct draw of the router."""
    limit = GroupLimit.of(DSV3.moe)
    reach = domain_reaches(E, K, 32, (8, 8, 8, 8), limit)
    simulated = _simulate(limit, [(64 * i, 64 * (i + 1)) for i in range(4)])
    assert reach == pytest.approx(simulated.tolist(), abs=0.01)
    assert flex_nic_rows((8, 8, 8, 8), E, K, 32, limit)[0] == pytest.approx(3 * simulated.mean(), abs=0.03)
    ranks = _simulate(limit, [(8 * r, 8 * (r + 1)) for r in range(32)]).sum()
    assert ranks_per_token(E, K, 32, limit) == pytest.approx(ranks, abs=0.05)
    # the group limit cuts the network rows from plain top-8's 2.71 to 2.34 a token
    assert remote_domains_per_token(E, K, 4) == pytest.approx(2.711, abs=1e-3)
    assert flex_nic_rows((8, 8, 8, 8), E, K, 32, limit)[0] == pytest.approx(2.34, abs=0.01)


def test_straddling_split_reach_follows_the_blocks():
    """An EP 32 group split (8, 24) over two domains: the small block holds 2 groups, the large 6."""
    limit = GroupLimit.of(DSV3.moe)
    reach = domain_reaches(E, K, 32, (8, 24), limit)
    assert reach == pytest.approx(_simulate(limit, [(0, 64), (64, 256)]).tolist(), abs=0.01)
    send, recv = reach[1], 24 * reach[0] / 8
    assert flex_nic_rows((8, 24), E, K, 32, limit)[0] == pytest.approx(max(send, recv), rel=1e-12)


def test_uniform_limit_reduces_to_the_closed_form_and_no_limit_to_training_counts():
    uniform = GroupLimit(8, 4)
    assert domains_touched_per_token(E, K, 32, 8, uniform) == pytest.approx(2.928, abs=1e-3)
    for ranks in (4, 8, 32, 64):
        assert sum(domain_reaches(E, K, ranks, (1,) * ranks)) == pytest.approx(ranks_per_token(E, K, ranks), rel=1e-12)


def test_deepseek_flex_dispatch_over_four_b200_nodes_moves_fewer_network_rows():
    """DeepSeek-V3's EP 32 on four DGX B200 nodes, 4096 tokens a GPU: flex is NIC-bound, so the group
    limit shortens the dispatch by about the ratio of remote rows, 2.34 / 2.71."""
    pool = load_cluster("dgx-b200").with_gpus(32).pools[0]
    kw = dict(tokens=T, hidden=H, top_k=K, num_experts=E, ep=32, etp=1, pool=pool)
    plain = dispatch_time_s(MoeDispatcher.FLEX, **kw)
    limited = dispatch_time_s(MoeDispatcher.FLEX, **kw, limit=GroupLimit.of(DSV3.moe))
    lat = 2 * 5 * pool.gpu.efficiency.inter_node_latency_us * 1e-6
    ratio = flex_nic_rows((8, 8, 8, 8), E, K, 32, GroupLimit.of(DSV3.moe))[0] / remote_domains_per_token(E, K, 4)
    assert (limited - lat) / (plain - lat) == pytest.approx(ratio, rel=0.02)
    assert limited < 0.9 * plain
