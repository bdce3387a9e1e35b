"""Context-parallel (ring) attention priced as Transformer Engine runs it: CP fused kernels per rank,
the causal diagonal one at the efficiency ramp of its own length s/CP and the CP - 1 unmasked
off-diagonal ones over s/(2CP) keys (no half-empty tiles, per-row work over shorter rows); CP = 1 is
the single causal kernel, unchanged."""

from __future__ import annotations

import pytest

from autoshard.costmodel.attention import (
    UNMASKED_ATTENTION_SPEEDUP,
    UNMASKED_ROW_SHARE,
    flash_attention_efficiency,
    ring_attention_blocks,
)
from autoshard.costmodel.compute import attention_time_s, layer_compute_time
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import EfficiencySpec, LayerKind, ModelSpec, Precision, load_cluster

H100 = load_cluster("dgx-h100").with_gpus(64)
MODEL = ModelSpec.model_validate({
    "name": "m", "hidden_size": 4096, "ffn_hidden_size": 16384, "num_attention_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 131072,
    "layers": [{"kind": "embedding"}, {"kind": "dense", "count": 1}, {"kind": "output"}],
})
QWENISH = MODEL.model_copy(update={"num_attention_heads": 64})
PEAK = 989e12


def _gpu(attention: float, s0: float):
    eff = EfficiencySpec(attention=attention, attention_half_seq=s0)
    return H100.primary.gpu.model_copy(update={"efficiency": eff})


def _ring_scores(s: int, cp: int, rank: int) -> list[tuple[int, bool]]:
    """Brute force: (scores computed, causal mask) of each kernel rank `rank` runs, from the chunk
    layout (chunks rank and 2CP-1-rank of 2CP) and the step table of TE's AttnFuncWithCPAndKVP2P."""
    c = s // (2 * cp)
    kernels = []
    for step in range(cp):
        if step == 0:  # own q (2c) x own kv (2c), causal: the unmasked pairs with key <= query
            mine = [*range(rank * c, (rank + 1) * c), *range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]
            kernels.append((sum(1 for q in mine for k in mine if k <= q), True))  # causal in global positions
        elif step <= rank:  # lower triangle: all 2c queries x first kv chunk (c), no mask
            kernels.append((2 * c * c, False))
        else:  # upper triangle: second q chunk (c) x all 2c keys, no mask
            kernels.append((c * 2 * c, False))
    return kernels


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_blocks_match_the_step_table(cp: int):
    """Every rank runs CP kernels of equal work, 1/CP of its causal share each; exactly one is causal,
    and together they make the unsplit causal FLOPs (s/CP queries x s keys, halved)."""
    s = 64 * cp
    blocks = ring_attention_blocks(s, cp)
    assert [(b[1], b[2]) for b in blocks] == [(s / cp, True)] + [(s / (2 * cp), False)] * (cp - 1)
    assert sum(b[0] for b in blocks) == pytest.approx(1.0)
    for rank in range(cp):
        kernels = _ring_scores(s, cp, rank)
        assert [causal for _, causal in kernels] == [True] + [False] * (cp - 1)
        unmasked = [n for n, causal in kernels if not causal]
        assert unmasked == [2 * (s // (2 * cp)) ** 2] * (cp - 1)  # full rectangles: 2c x c
        # the causal diagonal kernel of 2c positions keeps 2c(2c+1)/2 pairs: 2c^2 plus the diagonal
        c = s // (2 * cp)
        assert kernels[0][0] == 2 * c * c + c
        total = sum(n for n, _ in kernels)
        assert total == pytest.approx((s / cp) * s / 2, rel=1 / (2 * c))  # the causal half of s/CP x s


def test_cp1_is_the_single_causal_kernel_bit_for_bit():
    gpu = training_gpu(H100.primary.gpu)
    eff = gpu.efficiency
    for s in (2048, 4096, 8192, 131072):
        flops = 2.0 * s * s * 32 * 256 * 0.5
        s0 = eff.attention_half_seq
        ramp = min(1.0, eff.attention * (s / (s + s0)) / (4096 / (4096 + s0)))
        old = flops / (gpu.bf16_tflops * 1e12 * ramp)
        assert attention_time_s(MODEL, tokens=s, seq_len=s, dims=ParallelDims(), gpu=gpu) == old
        assert ring_attention_blocks(s, 1) == [(1.0, float(s), True)]


@pytest.mark.parametrize(("s", "cp"), [(8192, 2), (32768, 2), (65536, 4), (131072, 8)])
def test_ring_attention_closed_form(s: int, cp: int):
    """attention 0.25 at 4,096 tokens, s0 = 4,096 (r(4096) = 1/2): the diagonal kernel (1/CP of the
    FLOPs) at 0.25 * r(s/CP) / (1/2); the other CP - 1 over c = s/(2CP) keys at
    0.5 * 1.086 * c / (c + 0.39 * 4096)."""
    assert (UNMASKED_ATTENTION_SPEEDUP, UNMASKED_ROW_SHARE) == (1.086, 0.39)
    gpu = _gpu(0.25, 4096)
    tokens = s // cp
    flops = 2.0 * tokens * s * 32 * (128 + 128) * 0.5
    block, c = s / cp, s / (2 * cp)
    diag_eff = 0.25 * (block / (block + 4096)) / 0.5
    off_eff = 0.5 * 1.086 * c / (c + 0.39 * 4096)
    expected = flops / cp / (PEAK * diag_eff) + flops * (cp - 1) / cp / (PEAK * off_eff)
    got = attention_time_s(MODEL, tokens=tokens, seq_len=s, dims=ParallelDims(cp=cp), gpu=gpu)
    assert got == pytest.approx(expected, rel=1e-12)
    # the ramp's argument is the kernel's length, not the full sequence
    assert flash_attention_efficiency(gpu.efficiency, block) == pytest.approx(diag_eff, rel=1e-12)
    assert flash_attention_efficiency(gpu.efficiency, c, causal=False) == pytest.approx(off_eff, rel=1e-12)
    at_full_s = flops / (PEAK * 0.25 * (s / (s + 4096)) / 0.5)
    assert abs(got / at_full_s - 1) > 0.01


def test_ring_attention_h100_numbers():
    """The shipped H100 knobs (0.45 at 4,096, s0 = 630): 131,072 tokens on CP 8. The diagonal kernel
    is 16,384 long: 0.45 * (16384/17014) / (4096/4726) = 0.5000 of peak; the seven unmasked ones over
    8,192 keys: 0.45 / (4096/4726) * 1.086 * 8192 / (8192 + 245.7) = 0.5474. The full-length ramp
    priced all of it at 0.45 * (131072/131702) / (4096/4726) = 0.5167."""
    eff = training_gpu(H100.primary.gpu).efficiency
    assert flash_attention_efficiency(eff, 16384) == pytest.approx(0.5000, abs=5e-5)
    assert flash_attention_efficiency(eff, 8192, causal=False) == pytest.approx(0.5474, abs=5e-5)
    assert flash_attention_efficiency(eff, 131072) == pytest.approx(0.5167, abs=5e-5)
    got = attention_time_s(QWENISH, tokens=16384, seq_len=131072, dims=ParallelDims(cp=8), gpu=training_gpu(
        H100.primary.gpu))
    flops = 2.0 * 16384 * 131072 * 64 * (64 + 64) * 0.5  # head dim 4096 / 64
    assert flops / (got * PEAK) == pytest.approx(1 / (1 / 8 / 0.5000 + 7 / 8 / 0.5474), abs=1e-4)


def test_unmasked_kernel_constants_from_fa3():
    """UNMASKED_ATTENTION_SPEEDUP and UNMASKED_ROW_SHARE recomputed from the FlashAttention-3 paper
    (Shah et al. 2024, arXiv:2407.08608, Figs. 5-6, H100 SXM5, head dim 128, BF16): causal forward,
    non-causal forward and non-causal backward TFLOP/s at 1k-16k tokens; the causal backward at the
    forward's causal/non-causal ratio; forward + 2.5 x backward blended. Least-squares (log) fits of
    A * L / (L + L0): non-causal A = 553, L0 = 240; causal A = 509, L0 = s0 = 610. Speed-up
    553/509 = 1.086; per-row share of s0: 240/610 = 0.39."""
    import math

    seq = [1024, 2048, 4096, 8192, 16384]
    causal_fwd = [410, 484, 518, 529, 539]
    full_fwd = [574, 617, 609, 600, 595]
    full_bwd = [408, 465, 499, 518, 516]
    unmasked = [3.5 / (1 / f + 2.5 / b) for f, b in zip(full_fwd, full_bwd, strict=True)]
    causal = [3.5 / (1 / f + 2.5 / (b * f / n))
              for f, n, b in zip(causal_fwd, full_fwd, full_bwd, strict=True)]

    def fit(speeds: list[float]) -> tuple[float, int]:
        best = None
        for l0 in range(0, 2000, 5):
            logs = [math.log(v * (L + l0) / L) for v, L in zip(speeds, seq, strict=True)]
            mean = sum(logs) / len(logs)
            misfit = sum((x - mean) ** 2 for x in logs)
            if best is None or misfit < best[0]:
                best = (misfit, math.exp(mean), l0)
        return best[1], best[2]

    a_u, l0_u = fit(unmasked)
    a_c, l0_c = fit(causal)
    assert (l0_u, l0_c) == (240, 610)
    assert a_u / a_c == pytest.approx(UNMASKED_ATTENTION_SPEEDUP, abs=0.001)
    assert l0_u / l0_c == pytest.approx(UNMASKED_ROW_SHARE, abs=0.005)


def test_backward_and_recompute_price_the_ring(monkeypatch):
    """The backward (2.5x the forward kernel time: the same ring tiles in reverse) and the selective
    recompute (the forward once more) read the ring-priced attention_time_s: a layer's total is
    linear in it with slope 3.5 (no recompute) / 4.5 (selective), and at the ring's own value it is
    the real layer_compute_time."""
    import autoshard.costmodel.compute as compute

    gpu = H100.primary.gpu
    s, cp = 32768, 4
    dims = ParallelDims(cp=cp)
    kw = dict(gpu=gpu, dims=dims, micro_batch_size=1, seq_len=s, precision=Precision.BF16,
              sequence_parallel=True)
    ring = attention_time_s(MODEL, tokens=s // cp, seq_len=s, dims=dims, gpu=training_gpu(gpu))
    for rec, slope in ((Recompute.NONE, 3.5), (Recompute.SELECTIVE, 4.5)):
        real = layer_compute_time(MODEL, LayerKind.DENSE, recompute=rec, **kw).total_s
        with monkeypatch.context() as m:
            m.setattr(compute, "attention_time_s", lambda *a, **k: 0.0)
            base = layer_compute_time(MODEL, LayerKind.DENSE, recompute=rec, **kw).total_s
            m.setattr(compute, "attention_time_s", lambda *a, **k: 1e-3)
            one_ms = layer_compute_time(MODEL, LayerKind.DENSE, recompute=rec, **kw).total_s
        assert (one_ms - base) / 1e-3 == pytest.approx(slope, rel=1e-9)
        assert real == pytest.approx(base + slope * ring, rel=1e-12)


def test_solver_tables_price_the_ring_as_the_cost_model():
    """search/train/tables.py reads layer_cost: its per-layer time is the cost model's to the microsecond."""
    from autoshard.search.train.tables import build_tables

    from autoshard.specs import load_model

    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100").with_gpus(16)
    for cp in (1, 2, 4):
        cfg = TrainConfig(dims=ParallelDims(tp=2, cp=cp, dp=8 // cp), micro_batch_size=1,
                          global_batch_size=64, seq_len=32768, precision=Precision.BF16,
                          recompute=Recompute.SELECTIVE)
        tables = build_tables(model, cluster, cfg)
        layer = layer_cost(model, LayerKind.DENSE, cluster.pools[0], cfg, cfg.recompute)
        time_us = tables.pools[0].time_us
        i = model.layer_kinds.index(LayerKind.DENSE)
        assert time_us[i + 1] - time_us[i] == round(layer.time_s * 1e6)
