"""fit_efficiency.fit searches the COUPLED knob pairs jointly: a valley that no one-knob move can
enter (every single-coordinate step from the start raises the loss) is reached in one joint step."""

from __future__ import annotations

import fit_efficiency as fe


def test_joint_move_reaches_a_valley_one_knob_moves_cannot(monkeypatch):
    start = fe.START.model_copy(update={"attention": 0.20, "attention_half_seq": 4096.0})

    def loss(gpu, eff, runs):
        pair = (eff.attention, eff.attention_half_seq)
        return {(0.25, 2048): 0.0, (0.20, 4096.0): 1.0}.get(pair, 2.0)

    monkeypatch.setattr(fe, "loss", loss)
    got = fe.fit("GB200-186GB", [], start=start)
    assert (got.attention, got.attention_half_seq) == (0.25, 2048)
    # the pairs are knobs of the grid, and no pair names a knob twice
    assert all(a in fe.GRID and b in fe.GRID and a != b for a, b in fe.COUPLED)


def test_without_the_joint_step_coordinate_descent_stays(monkeypatch):
    start = fe.START.model_copy(update={"attention": 0.20, "attention_half_seq": 4096.0})
    monkeypatch.setattr(fe, "loss", lambda gpu, eff, runs: {(0.25, 2048): 0.0, (0.20, 4096.0): 1.0}.get(
        (eff.attention, eff.attention_half_seq), 2.0))
    monkeypatch.setattr(fe, "COUPLED", ())
    got = fe.fit("GB200-186GB", [], start=start)
    assert (got.attention, got.attention_half_seq) == (0.20, 4096.0)


def test_a_borrowed_fit_keeps_the_borrowers_kernel_measured_knobs(monkeypatch):
    """A GPU type left with fewer than MIN_RUNS runs (and no generation pool of MIN_RUNS) borrows the
    fold's H100 fit, but not H100's kernel-measured attention: a CDNA 3 GPU keeps CDNA 3's
    (KERNEL_TRAIN_KNOBS['cdna3']), while a generation without kernel benchmarks (Ampere) takes the
    lender's values as they are."""
    from validate_published import load_runs, run_gpu

    from autoshard.costmodel.efficiency import KERNEL_TRAIN_KNOBS

    runs = fe.held(load_runs())
    h100 = [r for r in runs if run_gpu(r) == fe.REFERENCE_GPU][: fe.MIN_RUNS]
    mi325x = [r for r in runs if run_gpu(r) == "MI325X-256GB"][:1]
    a100 = [r for r in runs if run_gpu(r) == "A100-SXM4-80GB"][:1]
    assert len(h100) == fe.MIN_RUNS and mi325x and a100

    def fake_fit(gpu, runs, start=fe.START, rounds=2, reference=None):  # a fit is slow: mark it instead
        return start.model_copy(update={"gemm": 0.77, **fe.kernel_knobs(gpu)})

    monkeypatch.setattr(fe, "fit", fake_fit)
    monkeypatch.setattr(fe, "_FITS", {})
    out, counts = fe.fit_all(h100 + mi325x + a100, also=("MI300X-192GB",))
    hopper, cdna3 = KERNEL_TRAIN_KNOBS["hopper"], KERNEL_TRAIN_KNOBS["cdna3"]
    assert counts[fe.REFERENCE_GPU] == fe.MIN_RUNS
    assert (out[fe.REFERENCE_GPU].attention, out[fe.REFERENCE_GPU].attention_half_seq) == tuple(hopper.values())
    for gpu in ("MI325X-256GB", "MI300X-192GB"):
        assert counts[gpu] == 0 and out[gpu].gemm == 0.77  # borrowed from the H100 fit ...
        assert (out[gpu].attention, out[gpu].attention_half_seq) == tuple(cdna3.values())  # ... with CDNA 3 kernels
    assert counts["A100-SXM4-80GB"] == 0 and out["A100-SXM4-80GB"] == out[fe.REFERENCE_GPU]


def _cdna3_fold(monkeypatch, mi325x_runs: int, bf16_runs: int = 0):
    """fit_all on 5 H100 runs and `mi325x_runs` MI325X FP8 runs, with the slow fits replaced by marks:
    the H100 fit sets gemm 0.77 / gemm_fp8 0.66, and the level loss is least at gemm_fp8 0.50 and
    gemm 0.45 (a BF16 level no run of the pool can see)."""
    from validate_published import load_runs, run_gpu

    runs = fe.held(load_runs())
    h100 = [r for r in runs if run_gpu(r) == fe.REFERENCE_GPU][: fe.MIN_RUNS]
    mi325x = [r for r in runs if run_gpu(r) == "MI325X-256GB" and r["precision"] == "fp8"][:mi325x_runs]
    mi325x += [r for r in runs if run_gpu(r) == "MI325X-256GB" and r["precision"] == "bf16"][:bf16_runs]
    assert len(mi325x) == mi325x_runs + bf16_runs

    def fake_fit(gpu, runs, start=fe.START, rounds=2, reference=None):
        return start.model_copy(update={"gemm": 0.77, "gemm_fp8": 0.66, **fe.kernel_knobs(gpu)})

    def fake_loss(gpu, eff, runs):
        assert runs == mi325x  # the level is fitted on the generation's own runs only
        return (eff.gemm_fp8 - 0.50) ** 2 + (eff.gemm - 0.45) ** 2

    monkeypatch.setattr(fe, "fit", fake_fit)
    monkeypatch.setattr(fe, "loss", fake_loss)
    monkeypatch.setattr(fe, "_FITS", {})
    monkeypatch.setattr(fe, "_LEVELS", {})
    return fe.fit_all(h100 + mi325x, also=("MI300X-192GB",))


def test_a_generation_with_two_to_four_runs_fits_only_its_gemm_level(monkeypatch):
    """Lent across generations (no pool of MIN_RUNS), a GPU whose generation has MIN_LEVEL_RUNS runs
    keeps every lent knob but the GEMM level of the precision those runs train in: FP8 runs move
    gemm_fp8 to their own optimum and leave BF16's gemm at the lender's value; the generation's
    kernel-measured attention stays; a sibling without runs (MI300X) takes the same level."""
    from autoshard.costmodel.efficiency import KERNEL_TRAIN_KNOBS

    out, counts = _cdna3_fold(monkeypatch, fe.MIN_LEVEL_RUNS)
    for gpu in ("MI325X-256GB", "MI300X-192GB"):
        assert counts[gpu] == 0
        assert (out[gpu].gemm_fp8, out[gpu].gemm) == (0.50, 0.77)
        assert (out[gpu].attention, out[gpu].attention_half_seq) == tuple(KERNEL_TRAIN_KNOBS["cdna3"].values())
        assert out[gpu].model_copy(update={"gemm_fp8": 0.66}) == out[fe.REFERENCE_GPU].model_copy(
            update=KERNEL_TRAIN_KNOBS["cdna3"])


def test_one_run_is_not_enough_for_a_level(monkeypatch):
    out, _ = _cdna3_fold(monkeypatch, 1)
    assert out["MI325X-256GB"].gemm_fp8 == 0.66


def test_one_run_of_a_precision_is_not_enough_for_its_level(monkeypatch):
    """Three FP8 runs and one BF16 run (the amdperf fold's CDNA 3 runs): the FP8 level is fitted, the
    BF16 level stays the lender's, not set by its single run."""
    out, _ = _cdna3_fold(monkeypatch, 3, bf16_runs=1)
    assert (out["MI325X-256GB"].gemm_fp8, out["MI325X-256GB"].gemm) == (0.50, 0.77)
