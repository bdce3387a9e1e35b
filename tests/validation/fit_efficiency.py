"""Fit the per-GPU-type efficiency knobs on the published runs (coordinate descent on a grid).

    python tests/validation/fit_efficiency.py

prints the fitted EfficiencySpec fields for each GPU type, to be copied into the `efficiency:` block of
every bundled cluster with that GPU (with `fitted_runs:` set to the number of runs). One fit per GPU
type, shared by all its runs: no per-run factors. Objective: mean squared log error plus a penalty on
errors beyond 15 %, each run weighted by its source's run count ^ -1/2 (source_weights). Every fit
starts from the same neutral point (the EfficiencySpec defaults) so that a leave-one-source-out fit
(validate_published.py) sees nothing of the source it leaves out. A GPU type with fewer than MIN_RUNS
held runs is not fitted on its own: it borrows one fit made on the pooled runs of every GPU type of its
generation (Blackwell B200/GB200/GB300, Hopper, Ampere: autoshard.costmodel.bands.gpu_generation), each
run at its own datasheet peaks, when that pool holds at least MIN_RUNS runs; otherwise the H100 fit of
the same fold, with the knobs its own generation measures at kernel level (KERNEL_TRAIN_KNOBS) in place
of H100's, and, where its generation has MIN_LEVEL_RUNS runs or more in a precision, the level of its
GEMM speed in that precision refitted on them (level_fit: one number per precision, the shapes of the
curves lent). A GPU shares its kernels' operating point (tensor-core generation, SM count per clock, HBM
technology, NVLink generation) with its siblings, not with the generation before it: Blackwell runs
reach a smaller fraction of their FP8 peak than Hopper runs do (NeMo 25.02/25.04 against 24.07).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_published import evaluate_runs, load_runs, run_gpu, source_key  # noqa: E402

from autoshard.costmodel.band_table import gpu_generation  # noqa: E402
from autoshard.costmodel.efficiency import KERNEL_TRAIN_KNOBS  # noqa: E402
from autoshard.specs import EfficiencySpec  # noqa: E402
from autoshard.specs.cluster import TRAIN_KNOBS  # noqa: E402

GRID = {
    "gemm": [0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90],
    "gemm_fp8": [0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70],
    "gemm_half_dim": [0, 64, 128, 256],
    "attention": [0.20, 0.25, 0.30, 0.35, 0.40, 0.50],
    "attention_half_seq": [0, 2048, 8192],
    "hbm": [0.60, 0.80, 0.90],
    "tp_overlap": [0.0, 0.4, 0.8],
    "intra_node_bw": [0.7, 0.9],
    "inter_node_bw": [0.7, 0.9],
    "expert_host_us": [0.0, 250.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0],
}
# Knob pairs that set one curve together: the attention speed at 4,096 tokens and its rise with
# length (s/(s+s0)); a GEMM knob's asymptote and its fall-off with the smallest dimension. Moving one
# coordinate at a time cannot follow the valley between two such knobs (a Blackwell pool fit stopped
# at attention 0.20 / 4,096 where 0.25 / 2,048 fits it better), so every round also tries each pair's
# values jointly.
COUPLED = (("attention", "attention_half_seq"), ("gemm", "gemm_half_dim"), ("gemm_fp8", "gemm_half_dim"))
# Neutral start: the shared defaults with no training-only override (the shipped train_* values are
# this script's output and must not leak into a leave-one-source-out fold).
START = EfficiencySpec(**{"train_" + k: None for k in TRAIN_KNOBS}, gemm_shape_measured=True)
# (gemm_shape_measured: the fit prices GEMM shapes as the training step does, from the measured table
# of the GPU's generation where one exists -- autoshard/costmodel/gemm_shape.py)
MIN_RUNS = 5
MIN_LEVEL_RUNS = 2
"""A GPU generation with at least this many held runs in a precision, but fewer than MIN_RUNS in all,
keeps the knobs it borrows across generations except the level of that precision's GEMM speed,
fitted on its own runs (level_fit)."""
REFERENCE_GPU = "H100-SXM5-80GB"


def source_weights(runs: list[dict]) -> list[float]:
    """Each run's weight in the fit: its source's run count among `runs` to the power -1/2. A release
    that publishes one plan at 14 scales is one measurement of its software 14 times over, not 14
    independent ones: counted run by run, the 88 H100 runs of one benchmark release outvoted the 66 of
    twelve other sources and the fit follows that release's recipes (NeMo 24.09's generic FP8 set H100's
    FP8 level against MLPerf's tuned GPT-3, 29 % apart a sequence). Weighted by 1/n, each source counts
    once however much it measured; by n^-1/2 a source's weight still grows with its runs, as the
    variance of its mean shrinks, but a large one no longer drowns the rest."""
    counts = Counter(source_key(r) for r in runs)
    return [counts[source_key(r)] ** -0.5 for r in runs]


def loss(gpu: str | tuple[str, ...], eff: EfficiencySpec, runs: list[dict]) -> float:
    """Fit objective of `eff` used by `gpu` (one GPU type, or a generation's pool of types): the
    source-weighted mean (source_weights) of each run's squared log error plus a penalty beyond 15 %."""
    gpus = (gpu,) if isinstance(gpu, str) else gpu
    results = evaluate_runs(dict.fromkeys(gpus, eff), runs)
    weights = source_weights(runs)
    total = 0.0
    for r, w in zip(results, weights, strict=True):
        e = math.log(r.predicted / r.measured)
        total += w * (e * e + 4 * max(0.0, abs(e) - 0.15) ** 2)
    return total / max(sum(weights), 1e-12)


def kernel_knobs(gpu: str | tuple[str, ...]) -> dict[str, float]:
    """The knobs `gpu`'s generation takes from kernel benchmarks (autoshard.costmodel.efficiency.
    KERNEL_TRAIN_KNOBS): held at those values, not fitted."""
    first = gpu if isinstance(gpu, str) else gpu[0]
    return KERNEL_TRAIN_KNOBS.get(gpu_generation(first), {})


def _gemm_precision(run: dict) -> str:
    """The GEMM knob family a run exercises: NVFP4 GEMMs run at `gemm_fp8`'s fraction of the FP4 peak
    (autoshard.costmodel.fp8.gemm_peak), so FP4 runs count as FP8 ones here."""
    return "fp8" if run["precision"] == "fp4" else run["precision"]


def unexercised_knobs(runs: list[dict], reference: EfficiencySpec | None) -> dict[str, float]:
    """The GEMM knob of a precision none of `runs` trains in, at the reference GPU's value: FP8 runs
    touch the BF16 knob only through their few BF16 GEMMs (the output layer, the router), too little
    to pin it, so a fit on FP8 runs alone would set it by chance (the way a GPU with too few runs
    borrows every knob, this borrows one)."""
    if reference is None:
        return {}
    return {knob: getattr(reference, knob) for knob, precision in (("gemm", "bf16"), ("gemm_fp8", "fp8"))
            if not any(_gemm_precision(r) == precision for r in held(runs))}


LENT_KNOBS = ("expert_host_us",)
"""Knobs fitted on the reference GPU's runs only and lent to every other fit: the host's time per local
routed expert (EfficiencySpec.expert_host_us) is the software's (Megatron-Core's dropless MoE and Transformer
Engine's eager expert path on a server CPU), not the GPU's, and only the H100 runs hold layers light enough
for it to bind in both of two sources (Megatron-LM's Qwen3-30B-A3B recipes, ModelZoo's Qwen3-235B at TP 4):
fitted per GPU type, one source's runs set it against another's (GB200: Qwen3-30B-A3B's MXFP8 and BF16 rows
asked for 1.5 ms per expert, which took ModelZoo's Qwen3-235B BF16 row 290 % slow out of source)."""


def lent_knobs(reference: EfficiencySpec | None) -> dict[str, float]:
    """The LENT_KNOBS at the reference fit's values (none for the reference fit itself)."""
    return {} if reference is None else {k: getattr(reference, k) for k in LENT_KNOBS}


def fit(gpu: str | tuple[str, ...], runs: list[dict], start: EfficiencySpec = START, rounds: int = 2,
        reference: EfficiencySpec | None = None) -> EfficiencySpec:
    """Coordinate descent over GRID on `runs` (held runs of `gpu`, or of a pool of GPU types), with
    the COUPLED pairs also searched jointly; the generation's kernel-measured knobs (kernel_knobs)
    stay fixed, and so do the knobs the runs do not exercise and the LENT_KNOBS, at the `reference`
    fit's values (unexercised_knobs, lent_knobs)."""
    pinned = {**unexercised_knobs(runs, reference), **kernel_knobs(gpu), **lent_knobs(reference)}
    return _descend(gpu, runs, start.model_copy(update=pinned), set(pinned), rounds)


def _descend(gpu: str | tuple[str, ...], runs: list[dict], start: EfficiencySpec, fixed: set[str],
             rounds: int = 2) -> EfficiencySpec:
    """The coordinate descent of `fit` from `start`, every knob in `fixed` held at its start value."""
    best, best_loss = start, loss(gpu, start, runs)
    for _ in range(rounds):
        improved = False
        for knob, values in GRID.items():
            if knob in fixed:
                continue
            for v in values:
                if v == getattr(best, knob):
                    continue
                trial = best.model_copy(update={knob: v})
                trial_loss = loss(gpu, trial, runs)
                if trial_loss < best_loss - 1e-9:
                    best, best_loss, improved = trial, trial_loss, True
        for a, b in COUPLED:
            if a in fixed or b in fixed:
                continue
            for va, vb in itertools.product(GRID[a], GRID[b]):
                if va == getattr(best, a) or vb == getattr(best, b):
                    continue  # a move along one axis alone: the loop above tried it
                trial = best.model_copy(update={a: va, b: vb})
                trial_loss = loss(gpu, trial, runs)
                if trial_loss < best_loss - 1e-9:
                    best, best_loss, improved = trial, trial_loss, True
        if not improved:
            break
    return best


_FITS: dict[tuple, EfficiencySpec] = {}


def _fit_cached(gpu: str | tuple[str, ...], key: tuple[str, ...], runs: list[dict],
                reference: EfficiencySpec | None = None) -> EfficiencySpec:
    """A fold that leaves out a source without runs of `gpu` reuses that GPU's fit on the same runs."""
    cache = (gpu, key, tuple(sorted({**unexercised_knobs(runs, reference), **lent_knobs(reference)}.items())))
    if cache not in _FITS:
        _FITS[cache] = fit(gpu, runs, reference=reference)
    return _FITS[cache]


def level_fit(gpu: str | tuple[str, ...], lent: EfficiencySpec, runs: list[dict]) -> EfficiencySpec:
    """`lent` (another generation's fit, with `gpu`'s kernel-measured knobs) with only the GEMM level of
    each precision at least MIN_LEVEL_RUNS of `runs` train in refitted on `runs`: too few runs to learn the shape of any curve
    (MIN_RUNS) still pin one number per precision, which a lender of another generation gets wrong by
    its tensor cores' achievable fraction of peak."""
    knobs = {k for k, p in (("gemm", "bf16"), ("gemm_fp8", "fp8"))
             if sum(_gemm_precision(r) == p for r in runs) >= MIN_LEVEL_RUNS}
    return _descend(gpu, runs, lent, set(GRID) - knobs)


_LEVELS: dict[tuple, EfficiencySpec] = {}


def _level_cached(gpu: str | tuple[str, ...], key: tuple[str, ...], lent: EfficiencySpec,
                  runs: list[dict]) -> EfficiencySpec:
    """A fold that leaves out a source without runs of `gpu`'s generation reuses its level fit."""
    cache = (gpu, key, lent)
    if cache not in _LEVELS:
        _LEVELS[cache] = level_fit(gpu, lent, runs)
    return _LEVELS[cache]


def held(runs: list[dict]) -> list[dict]:
    return [r for r in runs if not r.get("skip_throughput")]


def fit_all(runs: list[dict], also: tuple[str, ...] = ()) -> tuple[dict[str, EfficiencySpec], dict[str, int]]:
    """One fit per GPU type with at least MIN_RUNS held runs among `runs`; every other GPU type that
    has runs (or is named in `also`) borrows its generation's pooled fit (`generation_fit`), else the
    reference (H100) fit, with the knobs its own generation takes from kernel benchmarks (kernel_knobs)
    in place of the lender's. Returns the efficiencies and, per GPU type, how many runs its fit used
    (0: borrowed)."""
    by_gpu: dict[str, list[dict]] = {}
    for r in held(runs):
        by_gpu.setdefault(run_gpu(r), []).append(r)
    out: dict[str, EfficiencySpec] = {}
    counts: dict[str, int] = {}
    ref_runs = by_gpu.get(REFERENCE_GPU, [])
    ref_fit = _fit_cached(REFERENCE_GPU, tuple(sorted(r["id"] for r in ref_runs)), ref_runs) \
        if len(ref_runs) >= MIN_RUNS else None
    for gpu, rs in by_gpu.items():
        if len(rs) >= MIN_RUNS:
            out[gpu] = ref_fit if gpu == REFERENCE_GPU else \
                _fit_cached(gpu, tuple(sorted(r["id"] for r in rs)), rs, ref_fit)
            counts[gpu] = len(rs)
    reference = out.get(REFERENCE_GPU, START)
    for gpu in sorted({run_gpu(r) for r in runs} | set(also)):
        if gpu not in out:
            pooled = generation_fit(gpu, by_gpu, ref_fit)
            # a borrowed fit keeps the borrower's own kernel-measured knobs: a CDNA 3 GPU borrowing
            # H100's fit runs CDNA 3's attention kernels, not Hopper's
            borrowed = reference if pooled is None else pooled[0]
            out[gpu], counts[gpu] = borrowed.model_copy(update=kernel_knobs(gpu)), 0
            types, pool = generation_pool(gpu, by_gpu)
            if pooled is None and len(pool) >= MIN_LEVEL_RUNS:  # lent by another generation
                key = types[0] if len(types) == 1 else types
                out[gpu] = _level_cached(key, tuple(sorted(r["id"] for r in pool)), out[gpu], pool)
    return out, counts


def generation_pool(gpu: str, by_gpu: dict[str, list[dict]]) -> tuple[tuple[str, ...], list[dict]]:
    """The GPU types of `gpu`'s generation that have held runs in `by_gpu`, and those runs."""
    gen = gpu_generation(gpu)
    types = tuple(sorted(g for g in by_gpu if gpu_generation(g) == gen))
    return types, [r for g in types for r in by_gpu[g]]


def generation_fit(gpu: str, by_gpu: dict[str, list[dict]], reference: EfficiencySpec | None = None
                   ) -> tuple[EfficiencySpec, tuple[str, ...], int] | None:
    """One fit on the pooled held runs of `gpu`'s generation (None with fewer than MIN_RUNS): the
    efficiency, the GPU types it was fitted on and the number of runs."""
    types, pool = generation_pool(gpu, by_gpu)
    if len(pool) < MIN_RUNS:
        return None
    # a pool of one GPU type is that type's own fit (same runs, same start)
    key: str | tuple[str, ...] = types[0] if len(types) == 1 else types
    return _fit_cached(key, tuple(sorted(r["id"] for r in pool)), pool, reference), types, len(pool)


def main() -> int:
    runs = load_runs()
    fitted, counts = fit_all(runs)
    by_gpu: dict[str, list[dict]] = {}
    for r in held(runs):
        by_gpu.setdefault(run_gpu(r), []).append(r)
    for gpu, eff in fitted.items():
        pooled = None if counts[gpu] else generation_fit(gpu, by_gpu, fitted.get(REFERENCE_GPU))
        if counts[gpu]:
            how = f"fitted on {counts[gpu]} runs"
        elif pooled is not None:
            how = f"borrowed from the {gpu_generation(gpu)} pool ({', '.join(pooled[1])}: {pooled[2]} runs)"
        else:
            how = f"borrowed from {REFERENCE_GPU}"
            if kernel_knobs(gpu) and gpu_generation(gpu) != gpu_generation(REFERENCE_GPU):
                how += f", with {gpu_generation(gpu)}'s kernel-measured {', '.join(kernel_knobs(gpu))}"
            pool = generation_pool(gpu, by_gpu)[1]
            if len(pool) >= MIN_LEVEL_RUNS:
                how += f", GEMM level fitted on its generation's {len(pool)} runs"
        print(f"{gpu} ({how}):")
        print("  efficiency:", {k: getattr(eff, k) for k in GRID})
    return 0


if __name__ == "__main__":
    sys.exit(main())
