"""MoE token dispatch in Megatron-Core training: the volumes each dispatcher moves and where routing
sends them; the collectives themselves are priced in `autoshard.costmodel.comm`.

Per MoE layer and micro-batch, every GPU holds T tokens after attention (b*s/CP, divided by TP with
sequence parallelism), each routed to top_k of E experts spread over an EP group of n ranks
(consecutive in Megatron's rank order, `stride` = ETP apart). A GPU's NVLink domain holds d of
the group's ranks, so the group spans G = n / d domains.

- alltoall (NCCL all-to-all): each token-expert pair is one h-vector sent to the expert's rank:
  S = T * top_k * h * 2 bytes per rank. The (d-1)/n part that stays inside the domain goes over
  NVLink, the (n-d)/n part that leaves it goes through this GPU's own NIC; both run at once, so
  time = max(NVLink part, NIC part). Combine sends the same bytes back.
- allgather: every rank all-gathers the T*h tokens of the whole EP (x ETP) group and picks its
  own; combine is the matching reduce-scatter. Volume n*T*h*2, independent of top_k, ring priced.
- flex (DeepEP / HybridEP): a token crosses the network once per *remote domain* that hosts at
  least one of its experts, then fans out over NVLink inside that domain. With experts spread
  evenly over G domains (E/G each) and top_k distinct experts, the expected number of remote
  domains touched is (G-1) * (1 - C(E - E/G, k) / C(E, k)). Over NVLink it goes once per *rank*
  holding one of its experts (DeepEP's dispatch layout `is_token_in_rank`: the receiving rank
  expands it to its local experts, and combine sums a rank's expert outputs before sending one
  copy back): n * (1 - C(E - E/n, k) / C(E, k)) copies per token instead of top_k
  (`ranks_per_token`; Qwen3's 128 experts top-8 over EP 8: 5.34 instead of 8).

Load imbalance: routing the P pairs of one micro-batch over n EP ranks leaves the busiest rank with
about P/n * (1 + sqrt(2 ln n * n / P)) pairs (the expected maximum of n near-Poisson loads), which
gates the layer. This is sampling noise only; learned router skew is not modelled (the published
MoE runs in tests/validation force balanced routing).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from autoshard.costmodel.comm import (
    Collective,
    collective_time_s,
    domain_shares,
    group_link,
    hierarchical_all_to_all_s,
    split_all_to_all_s,
)
from autoshard.parallel import MoeDispatcher
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.layers import MoEConfig, RouterScore

__all__ = [
    "remote_domains_per_token", "ranks_per_token", "dispatch_time_s", "imbalance_factor",
    "expected_max_normal", "rank_load_variance", "busiest_rank_factor", "domains_touched_per_token",
    "domain_reach", "flex_nic_rows", "GroupLimit", "group_pick_counts", "domain_reaches",
]

BF16 = 2


def remote_domains_per_token(num_experts: int, top_k: int, domains: int) -> float:
    """Expected number of NVLink domains other than the sender's holding at least one of a token's
    top_k experts, experts spread evenly over `domains` domains and routing uniform."""
    if domains <= 1:
        return 0.0
    per = num_experts // domains
    k = min(top_k, num_experts)
    if num_experts - per < k:
        miss = 0.0
    else:
        miss = math.comb(num_experts - per, k) / math.comb(num_experts, k)
    return (domains - 1) * (1.0 - miss)


def ranks_per_token(num_experts: int, top_k: int, ranks: int, limit: GroupLimit | None = None) -> float:
    """Expected number of EP ranks (this one included) holding at least one of a token's top_k
    experts, experts spread evenly over `ranks` ranks and routing uniform (or group-limited as `limit`
    routes): the copies of a token a flex (DeepEP/HybridEP) dispatch sends, one per rank instead of
    one per expert."""
    if ranks <= 1:
        return 1.0
    if limit is not None:
        return domains_touched_per_token(num_experts, top_k, ranks, 1, limit)
    return remote_domains_per_token(num_experts, top_k, ranks) * ranks / (ranks - 1)


def imbalance_factor(ep: int, pairs_per_rank: float) -> float:
    """Busiest EP rank's load over the mean, for uniform routing (1 with one rank)."""
    if ep <= 1 or pairs_per_rank <= 0:
        return 1.0
    return 1.0 + math.sqrt(2.0 * math.log(ep) / pairs_per_rank)


@functools.lru_cache(maxsize=512)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for one; 0.564 for two, 1.424 for 8, 2.344 for 64),
    by the trapezoid rule on n x phi(x) Phi(x)^(n-1)."""
    if n <= 1:
        return 0.0
    step, total = 0.01, 0.0
    for i in range(-1000, 1001):
        x = i * step
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        total += x * n * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) * cdf ** (n - 1)
    return total * step


def rank_load_variance(num_experts: int, top_k: int, ep: int, groups: int = 1, topk_groups: int = 1) -> float:
    """Variance of the number of one token's top_k experts that sit on one EP rank (experts spread
    contiguously, E/ep per rank), for routing uniform over experts, within `topk_groups` of `groups`
    equal groups when routing is group-limited (DeepSeek-V3: 4 of 8). Exact: sum over the rank's
    experts of p(1 - p), p = k/E, plus the pairwise covariances, where two experts are both picked
    with probability g k(k-1) / (M(M-1)), M = E tg / G the experts of the chosen groups and g the
    chance both their groups are chosen (tg/G in one group, tg(tg-1)/(G(G-1)) in two). Grouping
    clusters a token's experts on fewer ranks: for DeepSeek-V3 over EP 8 (one group per rank) 1.71
    against 0.85 for plain top-8 of 256."""
    if ep <= 1:
        return 0.0
    e, k = num_experts, min(top_k, num_experts)
    g, tg = (groups, topk_groups) if groups > 1 else (1, 1)
    m, per_group = e // ep, e // g
    chosen = e * tg // g
    p = k / e
    both = k * (k - 1) / (chosen * (chosen - 1)) if chosen > 1 else 0.0
    same_group = tg / g * both
    two_groups = (tg * (tg - 1) / (g * (g - 1)) if g > 1 else 1.0) * both
    counts = [min(m, (j + 1) * per_group) - min(m, j * per_group) for j in range(g)]
    same = sum(c * (c - 1) for c in counts if c > 0)
    diff = m * (m - 1) - same
    return max(0.0, m * p * (1 - p) + same * (same_group - p * p) + diff * (two_groups - p * p))


def busiest_rank_factor(
    ep: int, pairs_per_rank: float, num_experts: int, top_k: int, groups: int | None = None,
    topk_groups: int | None = None,
) -> float:
    """Busiest EP rank's token-expert pairs over the mean in one serving step, routing uniform: the
    mean plus E[max of ep normals] standard deviations of a rank's load (`rank_load_variance` per
    token, tokens independent). Within 0.5 % of a brute-force draw of DeepSeek-V3's routing at 1k-4k
    pairs per rank (tests/costmodel/test_serving_moe_decode.py). Learned router skew is not priced."""
    if ep <= 1 or pairs_per_rank <= 0:
        return 1.0
    tokens = pairs_per_rank * ep / max(1, top_k)
    var = tokens * rank_load_variance(num_experts, top_k, ep, groups or 1, topk_groups or 1)
    return 1.0 + expected_max_normal(ep) * math.sqrt(var) / pairs_per_rank


def domain_reach(num_experts: int, top_k: int, ep: int, members: int) -> float:
    """Chance that a token's top_k experts (uniform routing, E/ep experts per EP rank) include one of
    the `members` EP ranks a domain holds: 1 - C(E - m E/ep, k) / C(E, k)."""
    held = num_experts // ep * members
    k = min(top_k, num_experts)
    if num_experts - held < k:
        return 1.0
    return 1.0 - math.comb(num_experts - held, k) / math.comb(num_experts, k)


@functools.lru_cache(maxsize=4096)
def flex_nic_rows(
    split: tuple[int, ...], num_experts: int, top_k: int, ep: int, limit: GroupLimit | None = None
) -> tuple[float, ...]:
    """Token rows per token of every rank that each NIC of each domain of an EP group carries in one
    flex (DeepEP/HybridEP) dispatch, the group's members split over domains as `split`: a token
    crosses once to every remote domain holding one of its experts. A NIC sends its own GPU's tokens
    (sum over remote domains j of reach(j)) and receives the other domains' tokens bound for its
    domain, spread over its domain's c NICs (sum over j != i of c_j * reach(i) / c); the busier
    direction counts. For equal shares (an aligned group over G domains) both are (G - 1) *
    reach = `remote_domains_per_token`; a straddling group's smaller side receives more: EP 64 as
    (8, 56) over 256 experts top-8 receives 7 x 0.66 = 4.6 rows per token where (32, 32) moves 1.0.
    With a group limit the domains' reaches come from `domain_reaches` (the split's blocks in rank
    order): DeepSeek-V3's EP 32 over 4 nodes sends 2.34 rows per token, not the 2.71 of plain top-8."""
    if limit is None:
        reach = [domain_reach(num_experts, top_k, ep, c) for c in split]
    else:
        reach = list(domain_reaches(num_experts, top_k, ep, tuple(split), limit))
    total, reached = sum(split), sum(reach)
    out = []
    for i, c in enumerate(split):
        send = reached - reach[i]
        recv = (total - c) * reach[i] / c
        out.append(max(send, recv))
    return tuple(out)


def _flex_group_s(
    split: tuple[int, ...], rank_bytes: float, row_bytes: float, num_experts: int, top_k: int, ep: int,
    pool: PoolSpec, limit: GroupLimit | None,
) -> float:
    """One flex dispatch (or combine) of an EP group split over domains as `split`: its slowest
    domain's NVLink fan-out or NIC part (`comm.hierarchical_all_to_all_s`)."""
    if len(split) == 1:
        return split_all_to_all_s(rank_bytes, ep, ep, pool)
    rows = flex_nic_rows(split, num_experts, top_k, ep, limit)
    return max(
        hierarchical_all_to_all_s(rank_bytes, row_bytes * r, ep, c, pool)
        for c, r in zip(split, rows, strict=True)
    )


def dispatch_time_s(
    dispatcher: MoeDispatcher, *, tokens: float, hidden: int, top_k: int, num_experts: int, ep: int, etp: int,
    pool: PoolSpec, limit: GroupLimit | None = None,
) -> float:
    """Dispatch + combine of one MoE layer's forward pass on one GPU (the backward pass moves the
    same bytes again). `tokens` are this GPU's tokens entering the layer; `limit`: the router's group
    limit (`GroupLimit.of(model.moe)`), which bounds where flex sends a token."""
    if ep * etp <= 1 or tokens <= 0:
        return 0.0
    pairs_bytes = tokens * top_k * hidden * BF16
    t = 0.0
    if dispatcher is MoeDispatcher.ALLGATHER:
        ranks = ep * etp
        link = group_link(pool, ranks=ranks)
        gathered = ranks * tokens * hidden * BF16
        t += collective_time_s(Collective.ALL_GATHER, gathered, ranks, link)
        t += collective_time_s(Collective.REDUCE_SCATTER, gathered, ranks, link)
        return t
    if ep > 1:
        splits = domain_shares(pool, ranks=ep, stride=etp)
        if dispatcher is MoeDispatcher.FLEX:
            # one copy per destination rank over NVLink, one per remote domain over the network
            rank_bytes = tokens * ranks_per_token(num_experts, top_k, ep, limit) * hidden * BF16
            row_bytes = tokens * hidden * BF16
            one = max(_flex_group_s(split, rank_bytes, row_bytes, num_experts, top_k, ep, pool, limit)
                      for split in splits)
        else:
            # every rank sends (ep - d)/ep of its pairs off its domain: the rank whose domain holds
            # the fewest of its group's members is the slowest
            one = split_all_to_all_s(pairs_bytes, ep, min(min(split) for split in splits), pool)
        t += 2 * one
    if etp > 1:
        # Expert tensor parallelism: the ETP group all-gathers its members' pairs and reduce-scatters
        # the expert outputs (Megatron's ETP all-gather / reduce-scatter around the expert MLP).
        gathered = pairs_bytes * etp
        link = group_link(pool, ranks=etp)
        t += collective_time_s(Collective.ALL_GATHER, gathered, etp, link)
        t += collective_time_s(Collective.REDUCE_SCATTER, gathered, etp, link)
    return t


@dataclass(frozen=True)
class GroupLimit:
    """Group-limited (node-limited) routing, DeepSeek-V3's (8 groups, top-4): the experts fall into
    `groups` equal contiguous groups, a token picks `topk_groups` of them by a group score, then its
    top_k experts among theirs. The group score sums the group's `score_top` best expert scores:
    Megatron-Core's `group_limited_topk` sums top_k // topk_groups (2 for DeepSeek-V3), vLLM's and
    SGLang's grouped top-k sum the top 2 with an expert-score bias and take the max (1) without;
    0 stands for the idealization of groups and experts drawn uniformly. `sigmoid`: the score
    function (the group score is not rank-invariant, so it matters: sigmoid or softmax)."""

    groups: int
    topk_groups: int
    score_top: int = 0
    sigmoid: bool = True

    @classmethod
    def of(cls, moe: MoEConfig | None, *, engine: str = "megatron") -> GroupLimit | None:
        """The limit a model's router applies (None for plain top-k), scored as `engine` scores groups
        ("megatron" for training; "vllm"/"sglang" for serving)."""
        if moe is None or moe.num_groups is None or moe.topk_groups is None:
            return None
        if moe.topk_groups >= moe.num_groups:
            return None
        top = max(1, moe.top_k // moe.topk_groups) if engine == "megatron" else (2 if moe.expert_bias else 1)
        return cls(moe.num_groups, moe.topk_groups, top, moe.score_function is RouterScore.SIGMOID)


ROUTING_SAMPLES = 1 << 15
"""Tokens drawn to learn how a scored group limit spreads a token's experts over its chosen groups
(fixed seed: the cost model stays deterministic; the chance that one of DeepSeek-V3's chosen groups
supplies none of its 8 experts, 0.87 %, is known to +-0.03 %)."""


@functools.lru_cache(maxsize=64)
def group_pick_counts(group_size: int, limit: GroupLimit, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts, probabilities): the distribution of how many of a token's top_k experts each of its
    `limit.topk_groups` chosen groups holds, chosen groups in index order (the law is exchangeable
    over them); given the counts the experts are uniform within each group, by symmetry. For
    score_top 0, exact (multivariate hypergeometric over the chosen groups' experts). Scored: routing
    on i.i.d. standard normal logits (Megatron's --moe-router-force-load-balancing draws exactly
    these; a trained, balanced router is taken to look alike), ROUTING_SAMPLES tokens. A chosen group
    is chosen for its best experts, so it nearly always supplies one: a chosen DeepSeek-V3 group goes
    empty 0.87 % of the time, not the 9.3 % of uniform picks, and a token reaches more nodes."""
    tg, size, k = limit.topk_groups, group_size, top_k
    if limit.score_top <= 0:
        total = math.comb(tg * size, k)
        vecs = [v for v in itertools.product(range(min(k, size) + 1), repeat=tg) if sum(v) == k]
        probs = [math.prod(math.comb(size, n) for n in v) / total for v in vecs]
        return np.array(vecs, dtype=np.int64).reshape(-1, tg), np.array(probs)
    rng = np.random.default_rng(20_261_124)
    n, q = ROUTING_SAMPLES, min(limit.score_top, size)
    z = rng.standard_normal((n, limit.groups, size), dtype=np.float32)
    s = 1.0 / (1.0 + np.exp(-z)) if limit.sigmoid else np.exp(z)
    group_score = np.partition(s, size - q, axis=2)[:, :, size - q:].sum(axis=2)
    chosen = np.sort(np.argpartition(-group_score, tg - 1, axis=1)[:, :tg], axis=1)
    theirs = np.take_along_axis(s, chosen[:, :, None], axis=1).reshape(n, tg * size)
    picked = np.argpartition(-theirs, k - 1, axis=1)[:, :k] // size
    rows = np.arange(n)[:, None] * tg
    counts = np.bincount((rows + picked).ravel(), minlength=n * tg).reshape(n, tg)
    vecs, hits = np.unique(counts, axis=0, return_counts=True)
    return vecs.astype(np.int64), hits / n


@functools.lru_cache(maxsize=1024)
def domain_reaches(
    num_experts: int, top_k: int, ranks: int, sizes: tuple[int, ...], limit: GroupLimit | None = None
) -> tuple[float, ...]:
    """Chance that a token's top_k experts include one held by each block of consecutive EP ranks
    (`sizes`, summing to `ranks`: NVLink domains, or the ranks themselves), routing uniform, or
    group-limited as `limit` routes. Experts sit on ranks as Megatron places them and vLLM's
    `determine_expert_map` does (E // ranks each, the first E % ranks ranks one more). Given the chosen
    groups and how many experts each supplies (`group_pick_counts`), a block misses the token with
    probability prod_j C(S - m_j, n_j) / C(S, n_j) (S a group's experts, m_j those of group j in the
    block, n_j group j's picks); averaged over the C(groups, topk_groups) equally likely choices.
    Without a limit: 1 - C(E - m, k) / C(E, k)."""
    k = min(top_k, num_experts)
    base, extra = divmod(num_experts, ranks)
    starts = [r * base + min(r, extra) for r in range(ranks + 1)]
    edges = [starts[min(ranks, sum(sizes[:i]))] for i in range(len(sizes) + 1)]
    if limit is not None and 1 <= limit.topk_groups < limit.groups and num_experts % limit.groups == 0:
        groups, size = limit.groups, num_experts // limit.groups
        subsets = np.array(list(itertools.combinations(range(groups), limit.topk_groups)), dtype=np.int64)
        counts, probs = group_pick_counts(size, limit, k)
    else:
        groups, size = 1, num_experts
        subsets, counts, probs = np.zeros((1, 1), np.int64), np.array([[k]], np.int64), np.ones(1)
    held = np.array([[max(0, min(hi, (g + 1) * size) - max(lo, g * size)) for g in range(groups)]
                     for lo, hi in itertools.pairwise(edges)], dtype=np.int64)
    top = int(counts.max())
    miss_table = np.array([[math.comb(size - m, n) / math.comb(size, n) for n in range(top + 1)]
                           for m in range(size + 1)])
    overlap = held[:, subsets]  # blocks x choices x chosen groups
    miss = miss_table[overlap[:, :, None, :], counts[None, None, :, :]].prod(axis=-1) @ probs
    return tuple(float(x) for x in 1.0 - miss.mean(axis=1))


@functools.lru_cache(maxsize=1024)
def domains_touched_per_token(
    num_experts: int, top_k: int, ranks: int, ranks_per_domain: int = 1, limit: GroupLimit | None = None
) -> float:
    """Expected number of domains (`ranks_per_domain` consecutive EP ranks each; 1: ranks themselves)
    holding at least one of a token's top_k experts (`domain_reaches` summed). The group limit bounds
    it: DeepSeek-V3 over 4 nodes of 8 ranks reaches 3.12 nodes per token as Megatron or vLLM route
    (2.93 for uniform picks within the chosen groups), not the 3.61 of plain top-8 of 256."""
    if ranks <= 1:
        return 1.0
    per = max(1, min(ranks_per_domain, ranks))
    sizes = tuple(min(per, ranks - d) for d in range(0, ranks, per))
    return sum(domain_reaches(num_experts, top_k, ranks, sizes, limit))
