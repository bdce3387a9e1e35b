"""What tensor, expert and pipeline parallelism and attention data parallelism add to a serving step:
the process groups' links in vLLM's rank order, a layer's TP all-reduces, the logits' TP all-gather, the EP dispatch and
combine between attention-DP groups, the activation send between PP stages, and the busiest
attention-DP rank's prefill load. Volumes and groups here; the collectives' time formulas are in
`autoshard.costmodel.comm`.

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import math
from dataclasses import replace

from autoshard.costmodel.comm import (
    Collective,
    Link,
    bounds_shares,
    collective_time_s,
    domain_bounds,
    ep_all_to_all_s,
    group_link,
    tp_all_reduce_s,
)
from autoshard.costmodel.moe import busiest_rank_factor
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.ep_buffers import scattered_deepep
from autoshard.costmodel.serve.ep_dispatch import ht_dispatch_combine_s, uses_deepep_high_throughput
from autoshard.costmodel.serve.memory import BF16
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.job import WeightDtype
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = [
    "expected_max_prefill_tokens", "layer_tp_comm_s", "ep_dispatch_s", "pp_send_s", "logits_all_gather_s",
    "FP8_WITH_BLOCK_SCALES",
]


def expected_max_prefill_tokens(
    prefill_tokens: float, *, ranks: int, prompt_tokens: float
) -> float:
    """Expected largest prefill load among `ranks` DP ranks in one step when each rank carries on
    average `prefill_tokens` prefill tokens that arrive as whole chunks of `prompt_tokens`: the number
    of chunks per rank is Poisson, E[max] = sum_k>=1 P(max >= k) = sum_k (1 - F(k-1)^ranks)."""
    if ranks <= 1 or prefill_tokens <= 0 or prompt_tokens <= 0:
        return prefill_tokens
    lam = prefill_tokens / prompt_tokens
    expected, cdf, term, k = 0.0, 0.0, math.exp(-lam), 0
    while True:
        cdf += term  # F(k)
        tail = 1.0 - cdf**ranks  # P(max >= k + 1)
        expected += tail
        k += 1
        term *= lam / k
        if tail < 1e-9 or k > 10_000:
            break
    return max(expected * prompt_tokens, prefill_tokens)


def _links(pool: PoolSpec, cfg: ServeConfig) -> tuple[Link, Link, Link]:
    """TP, EP (between attention-DP groups) and PP links in vLLM's rank order (TP innermost, then PP,
    DP outermost)."""
    return (
        group_link(pool, ranks=cfg.tp),
        group_link(pool, ranks=cfg.dp_attention, stride=cfg.tp * cfg.pp),
        group_link(pool, ranks=2, stride=cfg.tp),
    )


def layer_tp_comm_s(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, link: Link, *, tokens: float) -> float:
    """The two TP all-reduces of one decoder layer (after attention and after the MLP) on `tokens` rows."""
    return 2 * tp_all_reduce_s(
        tokens * model.hidden_size * BF16, cfg.tp, link, pool, custom=cfg.custom_all_reduce
    )


def ep_dispatch_s(
    model: ModelSpec, kind: LayerKind, cfg: ServeConfig, link: Link, *, routed: float, pool: PoolSpec,
    high_throughput: bool = False,
) -> float:
    """EP dispatch and combine of one MoE layer for `routed` tokens of one DP rank: all-to-alls between
    attention-DP groups only (EP = TP alone needs none: the combine is the TP all-reduce); FP8 models
    dispatch FP8 activations with their per-128-element FP32 scales, the combine returns BF16.
    Inside one NVLink domain the all-to-all runs at the group's `link`; a group that leaves the
    domain sends each rank's remote copies through its own NIC (`comm.ep_all_to_all_s`). Every rank
    sends its own tokens' copies, but the exchange ends when the busiest EP rank has received its
    pairs (and sent their outputs back): the mean times `moe.busiest_rank_factor`.
    `high_throughput`: the step runs DeepEP's normal kernels (`serve.ep_dispatch.deepep_normal_step`:
    vLLM prefill instances, SGLang steps with prompt tokens; one copy per destination rank, across
    nodes one per remote node plus the NVLink fan-out); other steps keep the low-latency kernels'
    per-copy pricing here."""
    ep_s = 0.0
    if kind is LayerKind.MOE and cfg.expert_parallel and scattered_deepep(model, pool.gpu, cfg):
        # SGLang on DeepEP without attention DP: each TP rank dispatches its 1/TP of the tokens over
        # the TP group's GPUs (`ep_buffers.scattered_deepep`), as TP attention-DP ranks of one GPU
        # each; the reduce-scatter and all-gather around it move an all-reduce's bytes (priced as it)
        ranks = replace(cfg, tp=1, pp=1, dp_attention=cfg.tp)
        return ep_dispatch_s(
            model, kind, ranks, group_link(pool, ranks=cfg.tp), routed=routed / cfg.tp, pool=pool,
            high_throughput=high_throughput,
        )
    if kind is LayerKind.MOE and cfg.expert_parallel and cfg.dp_attention > 1:
        assert model.moe is not None
        moe = model.moe
        moved = routed * moe.top_k * model.hidden_size / cfg.tp
        pairs = routed * cfg.dp_attention * moe.top_k / cfg.ep
        imbalance = busiest_rank_factor(
            cfg.ep, pairs, moe.num_experts, moe.top_k, moe.num_groups, moe.topk_groups
        )
        moved *= imbalance
        dispatch = FP8_WITH_BLOCK_SCALES if cfg.weight_dtype is WeightDtype.FP8 else BF16
        if high_throughput and uses_deepep_high_throughput(model, pool, cfg):
            return ht_dispatch_combine_s(
                model, cfg, pool, routed=routed, per_domain=_ep_ranks_per_domain(pool, cfg),
                dispatch_bytes=dispatch, combine_bytes=BF16, imbalance=imbalance,
            )
        if link.crosses_nodes:
            per_domain = _ep_ranks_per_domain(pool, cfg)
            return sum(ep_all_to_all_s(moved * b, cfg.dp_attention, per_domain, pool) for b in (dispatch, BF16))
        ep_s = sum(
            collective_time_s(Collective.ALL_TO_ALL, moved * b, cfg.dp_attention, link)
            for b in (dispatch, BF16)
        )
    return ep_s


FP8_WITH_BLOCK_SCALES = 1.0 + 4.0 / 128
"""Bytes per dispatched element of an FP8 dispatch: the FP8 value and one FP32 scale per 128 elements
(DeepEP's low-latency dispatch and the engines' FP8 MoE inputs use per-token 1x128 block scales)."""


def _ep_ranks_per_domain(pool: PoolSpec, cfg: ServeConfig) -> int:
    """Attention-DP ranks (the EP group, `tp * pp` GPUs apart in vLLM's rank order: TP innermost, then
    PP, DP outermost) in the NVLink domain that holds the fewest of them: the engine's GPUs fill
    domains in order from a domain's start (`comm.domain_bounds`), so an engine of 96 GPUs on racks
    run with 64 has 64 and 32 there, and its ranks on the 32 send the most over the network."""
    bounds = domain_bounds(pool, cfg.gpus)
    splits = bounds_shares(bounds, ranks=cfg.dp_attention, stride=cfg.tp * cfg.pp)
    return max(1, min(min(split) for split in splits))


def pp_send_s(model: ModelSpec, link: Link, *, tokens: float) -> float:
    """One activation send of `tokens` rows across a pipeline-stage boundary."""
    return collective_time_s(Collective.P2P, tokens * model.hidden_size * BF16, 2, link)


def logits_all_gather_s(model: ModelSpec, cfg: ServeConfig, link: Link, *, rows: int) -> float:
    """The TP all-gather of `rows` rows of vocabulary-sharded logits before sampling."""
    return collective_time_s(Collective.ALL_GATHER, rows * model.vocab_size * BF16, cfg.tp, link)
