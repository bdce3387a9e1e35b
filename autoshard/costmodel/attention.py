"""Fused (flash) attention kernels in training: the efficiency a causal or an unmasked kernel reaches
at its length, and the kernels a context-parallel ring runs (priced by
`autoshard.costmodel.compute.attention_time_s`)."""

from __future__ import annotations

from autoshard.specs.cluster import EfficiencySpec

__all__ = [
    "UNMASKED_ATTENTION_SPEEDUP", "UNMASKED_ROW_SHARE", "flash_attention_efficiency", "ring_attention_blocks",
]

UNMASKED_ATTENTION_SPEEDUP = 1.086
"""An unmasked fused-attention kernel over the causal one at long sequences: FlashAttention-3 on H100
SXM5 (Shah et al. 2024, arXiv:2407.08608, Figs. 5-6, head dim 128, BF16), forward + 2.5 x backward
blended, least-squares asymptotes of A * L / (L + L0) over 1k-16k tokens: non-causal 553 TFLOP/s,
causal 509 (the causal kernel's masked-tile skipping and uneven per-block work cost it even at 16k).
Hopper-measured, used for every GPU (tests/costmodel/test_ring_attention.py recomputes it)."""

UNMASKED_ROW_SHARE = 0.39
"""k0 / s0: the per-query-row fixed work of a fused attention kernel (Q load, softmax finalisation,
O and LSE write, the backward's dQ), counted in keys of main-loop work, over the causal ramp's
half-length s0. The same FA3 figures fit L0 = k0 = 240 keys for the non-causal kernel (its only
ramp: A * L / (L + k0)) and s0 = 610 for the causal one, whose rows average L/2 keys (per-row work
2 k0 / L = 480 / L of it, half-empty diagonal tiles the other 130 / L): 240 / 610 = 0.39. An
unmasked kernel over Lk keys pays UNMASKED_ROW_SHARE * s0 / Lk, so a GPU whose s0 is fitted scales
its k0 with it."""


def flash_attention_efficiency(eff: EfficiencySpec, length: float, *, causal: bool = True) -> float:
    """Fraction of the dense BF16 peak a fused attention kernel reaches, capped at 1. causal: `length`
    queries and keys, attention * r(length) / r(4096), r(s) = s / (s + attention_half_seq). Unmasked
    (a context-parallel ring's off-diagonal kernel): `length` keys per query row, no half-empty tiles,
    attention / r(4096) * UNMASKED_ATTENTION_SPEEDUP * length / (length + UNMASKED_ROW_SHARE * s0)."""
    s0 = eff.attention_half_seq
    at_4k = 4096 / (4096 + s0)
    if causal:
        return min(1.0, eff.attention * (length / (length + s0)) / at_4k)
    row_work = length / (length + UNMASKED_ROW_SHARE * s0)
    return min(1.0, eff.attention / at_4k * UNMASKED_ATTENTION_SPEEDUP * row_work)


def ring_attention_blocks(seq_len: int, cp: int) -> list[tuple[float, float, bool]]:
    """The fused kernels that gate one rank's causal attention of one sequence under Megatron-Core's
    context parallelism (Transformer Engine `AttnFuncWithCPAndKVP2P`, the default --cp-comm-type p2p),
    as (share of the rank's attention FLOPs, the kernel's length in keys, causal).

    Each rank holds 2 of the 2CP sequence chunks, c = s/(2CP) tokens each, chunks r and 2CP-1-r (load
    balancing), and runs CP steps as the KV ring turns (TE context_parallel.py, git d0067d0d:
    1784-1795 the step x rank table, 1797-1885 the forward branches, 2578-2620 the backward's): step 0
    "diagonal", its own 2c queries against its own 2c keys, causal (the kernel at length s/CP, 711-734
    and 854-870); steps 1..rank "lower-triangle", all 2c queries against the first chunk of the
    arriving keys, c (max_seqlen_kv // 2, 736-771 / 871-885); the other steps "upper-triangle", the
    second chunk of queries, c, against all 2c keys (773-806 / 886-915). Both off-diagonal kinds run
    attn_mask_type "no_mask" over a 2c x c rectangle, 2c^2 scores, and the diagonal computes the
    causal half of (2c)^2, 2c^2 as well: each kernel does 1/CP of the rank's s^2/(2CP) scores, together
    the causal half-square the unsplit kernel prices. The backward walks the same tiles in reverse and
    waits, every step, for the dKV the previous rank accumulated (2717-2719): the chain of the first
    chunk's dKV runs through CP - 1 lower-triangle kernels (c keys, the shorter rows, the slower
    kernel), and the last rank runs exactly those in its forward too, so they gate the step."""
    if cp <= 1:
        return [(1.0, float(seq_len), True)]
    return [(1.0 / cp, seq_len / cp, True)] + [(1.0 / cp, seq_len / (2 * cp), False)] * (cp - 1)
