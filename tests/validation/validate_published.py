"""Predict every published training run in training_runs.yaml and compare with what was measured.

    python tests/validation/validate_published.py [--write-residuals] [--jobs N]

prints one row per run (measured, predicted, error) and the median and max absolute error, for
throughput and for per-GPU memory where the source reports it, then the leave-one-source-out table
(per source and per family). `--write-residuals` writes residuals_train.json; `--jobs N` fits the
leave-one-source-out folds in N processes (the same figures; over the 351 rows of README item AG 2 cores take
about 21 minutes where one takes 37; 8 and 17 over the 259 before). The pytest suite imports `evaluate_runs`
and holds the errors to the targets.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import statistics
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from autoshard.costmodel.flops import causal_model_flops_per_step
from autoshard.costmodel.train.a2a_overlap import a2a_overlap_problems
from autoshard.costmodel.train.memory import TrainFramework
from autoshard.costmodel.train.memory_torchtitan import allocator_reported_bytes
from autoshard.costmodel.train.recompute import RECOMPUTE_MODULES
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import TrainConfig, TrainPrediction
from autoshard.emit.megatron.layout import default_stages, parse_layout
from autoshard.parallel import CrossEntropyImpl, Fp8Recipe, MoeDispatcher, ParallelDims, Recompute
from autoshard.specs import ClusterSpec, EfficiencySpec, ModelSpec, Precision, load_cluster, load_model
from autoshard.specs.job import Optimizer
from autoshard.specs.layers import LayerKind
from autoshard.units import GIB

HERE = Path(__file__).resolve().parent
RUNS = HERE / "training_runs.yaml"
RESIDUALS = HERE / "residuals_train.json"


@dataclass(frozen=True)
class RunResult:
    id: str
    gpu: str
    skip_throughput: str | None
    """Why this run's throughput is shown but not held to the target (None: it is)."""
    metric: str
    measured: float
    predicted: float
    measured_memory_gib: float | None
    predicted_memory_gib: float
    fits: bool = True
    """Whether the plan is predicted to fit in GPU memory (every published run did)."""
    skip_memory: str | None = None
    """Why this run may be predicted not to fit (a memory feature autoshard does not model; None: it must fit)."""
    memory_gap: str | None = None
    """Why this run's memory error is shown but not held to the memory target (None: it is)."""

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured

    @property
    def memory_error(self) -> float | None:
        if self.measured_memory_gib is None:
            return None
        return (self.predicted_memory_gib - self.measured_memory_gib) / self.measured_memory_gib


def _model(run: dict) -> ModelSpec:
    if "model_file" in run:  # a bundled model (models/<name>.yaml), e.g. the MoE and MLA models
        model = _bundled_model(run["model_file"])
        if "model_overrides" in run:  # what the run's launch changed (e.g. no MTP module), with evidence
            model = ModelSpec.model_validate({**model.model_dump(), **run["model_overrides"]})
        return model
    arch = dict(run["model"])
    n = arch.pop("num_layers")
    arch["layers"] = [{"kind": "embedding"}, {"kind": "dense", "count": n}, {"kind": "output"}]
    return ModelSpec.model_validate({"name": run["id"], **arch})


@lru_cache(maxsize=None)
def _bundled_model(name: str) -> ModelSpec:
    """A bundled model (models/<name>.yaml), or a validation-only one (tests/validation/models/<name>.yaml: a
    network as one published benchmark built it, not a model users plan with, e.g. NeMo's Grok-1 proxy)."""
    local = HERE / "models" / f"{name}.yaml"
    return load_model(local if local.is_file() else name)


@lru_cache(maxsize=None)
def _base_cluster(name: str) -> ClusterSpec:
    local = HERE / "clusters" / f"{name}.yaml"
    return load_cluster(local if local.is_file() else name)


def _cluster(name: str, gpus: int, efficiency: dict[str, EfficiencySpec] | None = None) -> ClusterSpec:
    cluster = _base_cluster(name)
    # Runs may use part of the last NVLink domain (256 GPUs of four NVL72 racks): size the cluster in
    # whole domains; the prediction only uses the plan's own world size.
    domain = cluster.primary.node.domain_size
    cluster = cluster.with_gpus(-(-gpus // domain) * domain)
    if efficiency and cluster.primary.gpu.name in efficiency:
        pool = cluster.primary
        gpu = pool.gpu.model_copy(update={"efficiency": efficiency[pool.gpu.name]})
        cluster = cluster.model_copy(update={"pools": (pool.model_copy(update={"gpu": gpu}),)})
    return cluster


def _narayanan96_flops(model: ModelSpec, run: dict) -> float:
    b, s, l, h, v = run["global_batch_size"], run["seq_len"], model.num_layers, model.hidden_size, model.vocab_size
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


MAX_ALLOCATED_FIRST_ITERATION = "max_allocated_first_iteration"
"""`memory_metric` of a run whose memory figure is Megatron's own `report_memory` line after iteration 1
("max allocated": torch.cuda.max_memory_allocated, the caching allocator's peak allocation since start)."""


def first_iteration_max_allocated_bytes(pred: TrainPrediction, cfg: TrainConfig) -> float:
    """What Megatron's "max allocated" reads after the first iteration: the predicted peak without
    what lives outside the allocator or in its unused reserve (`overhead`: context, NCCL, fragmentation)
    and without Adam's two FP32 moments, which Transformer Engine's FusedAdam (Megatron's Adam) creates
    in the first `step()` (`if len(state) == 0: self.initialize_state(p)`), after that iteration's
    forward/backward peak: 8 of the 12 optimizer bytes per locally owned parameter (FP32 master, m, v)."""
    if cfg.framework is not TrainFramework.MEGATRON or cfg.optimizer_moments_bf16 or cfg.optimizer is not Optimizer.ADAM:
        raise ValueError("first-iteration max allocated is modelled for Megatron's FP32 Adam only")
    mem = pred.memory
    return mem.total - mem.overhead - mem.optimizer * 8.0 / 12.0


def _router_flops_per_step(model, *, tokens: int) -> float:
    """Forward + backward FLOPs of the MoE layers' router GEMMs (tokens x hidden x experts each), which
    Megatron-Core's logged TFLOP/s does not count."""
    if model.moe is None:
        return 0.0
    moe_layers = sum(1 for k in model.layer_kinds if k is LayerKind.MOE)
    return 3.0 * 2.0 * tokens * model.hidden_size * model.moe.num_experts * moe_layers


def predict_run(run: dict, efficiency: dict[str, EfficiencySpec] | None = None) -> RunResult:
    if any(run.get("fp4_bf16_layers", (0, 0))):  # Megatron --first-last-layers-bf16: a per-layer precision
        raise ValueError(f"{run['id']}: decoder layers kept in BF16 under FP4 are not modelled")
    model = _model(run)
    p = run["parallel"]
    dims = ParallelDims(tp=p["tp"], pp=p["pp"], dp=p["dp"], cp=p["cp"], vpp=p["vpp"], ep=p.get("ep", 1), etp=p.get("etp"))
    cluster = _cluster(run["cluster"], dims.world_size, efficiency)
    recompute, modules = Recompute(run["recompute"]), ()
    if run.get("recompute_moe", False):  # Megatron --recompute-modules moe: selective recompute of the MoE block
        recompute, modules = Recompute.SELECTIVE, ("moe",)
    if "recompute_modules" in run:  # Megatron --recompute-granularity selective --recompute-modules ...
        unknown = [m for m in run["recompute_modules"] if m not in RECOMPUTE_MODULES]
        if unknown or recompute is not Recompute.NONE:
            raise ValueError(f"{run['id']}: recompute_modules {unknown or run['recompute_modules']}: give modules of "
                             f"{', '.join(RECOMPUTE_MODULES)} with recompute: none and no recompute_moe")
        recompute, modules = Recompute.SELECTIVE, tuple(run["recompute_modules"])
    cfg = TrainConfig(
        dims=dims, micro_batch_size=run["micro_batch_size"], global_batch_size=run["global_batch_size"],
        seq_len=run["seq_len"], precision=Precision(run["precision"]), recompute=recompute,
        sequence_parallel=run["sequence_parallel"], zero_stage=run["zero_stage"],
        tp_comm_overlap=run["tp_comm_overlap"], overlap_grad_reduce=run["overlap_grad_reduce"],
        flash_attention=run["flash_attention"], framework=TrainFramework(run.get("framework", "megatron")),
        moe_dispatcher=MoeDispatcher(run.get("moe_dispatcher", "alltoall")),
        fp8_recipe=Fp8Recipe(run.get("fp8_recipe", "delayed")),
        grad_reduce_fp32=run.get("grad_reduce_fp32", True), fp8_param_gather=run.get("fp8_param_gather", False), fp8_attention=run.get("fp8_attention", False),
        recompute_modules=modules, optimizer_moments_bf16=run.get("optimizer_moments_bf16", False),
        compiled_loss=run.get("compiled_loss", False), cross_entropy=CrossEntropyImpl(run["cross_entropy"]),
        defer_embedding_wgrad=run.get("defer_embedding_wgrad", False), wgrad_deferral_limit=run.get("wgrad_deferral_limit", 0),
        moe_a2a_overlap=run.get("moe_a2a_overlap", False),
        full_cuda_graph=run.get("cuda_graph") == "full_iteration",
    )
    if "pipeline_layout" in run:  # Megatron --pipeline-model-parallel-layout (uneven or embedding/loss-aware splits)
        stages = tuple(parse_layout(run["pipeline_layout"], num_layers=model.num_layers, pp=dims.pp)[0])
    else:
        stages = default_stages(model, pp=dims.pp, vpp=dims.vpp)
    if cfg.moe_a2a_overlap and (problems := a2a_overlap_problems(model, cfg, stages)):
        raise ValueError(f"{run['id']}: Megatron would refuse the EP all-to-all overlap: {'; '.join(problems)}")
    pred = predict_train(model, cluster, cfg, stages)
    predicted_memory = pred.peak_memory_bytes
    if cfg.framework is TrainFramework.TORCHTITAN:
        # torchtitan logs the caching allocator's peak reservation (no CUDA context, no NCCL).
        predicted_memory = allocator_reported_bytes(cluster.primary.gpu, predicted_memory)
    if run.get("memory_metric") == MAX_ALLOCATED_FIRST_ITERATION:
        predicted_memory = first_iteration_max_allocated_bytes(pred, cfg)
    m = run["measured"]
    metric, measured = m["metric"], float(m["value"])
    if metric == "tflops_per_gpu" and m.get("convention", "").startswith("narayanan96"):
        # Convert the paper's hardware TFLOP/s to the step time it implies, compare step times.
        metric = "step_time_s"
        measured = _narayanan96_flops(model, run) / (measured * 1e12 * dims.world_size)
    elif metric == "tflops_per_gpu" and m.get("convention", "").startswith("megatron-causal"):
        # Current Megatron-Core halves the causal attention core in its logged TFLOP/s and leaves the
        # router GEMM out (num_floating_point_operations at e5ad09802d, megatron/training/training.py:
        # moe_layer_flops and transformer_flops count routed and shared experts, no router): convert to
        # the step time it implies, compare step times.
        metric = "step_time_s"
        useful = causal_model_flops_per_step(model, seq_len=run["seq_len"], global_batch_size=run["global_batch_size"])
        useful -= _router_flops_per_step(model, tokens=run["seq_len"] * run["global_batch_size"])
        measured = useful / (measured * 1e12 * dims.world_size)
    predicted = {
        "tflops_per_gpu": pred.tflops_per_gpu,
        "step_time_s": pred.step_time_s,
        "tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu,
    }[metric]
    return RunResult(
        id=run["id"], gpu=cluster.primary.gpu.name, skip_throughput=run.get("skip_throughput"), metric=metric, measured=measured, predicted=predicted,
        measured_memory_gib=run.get("measured_memory_gib"), predicted_memory_gib=predicted_memory / GIB,
        fits=pred.fits, skip_memory=run.get("skip_memory"), memory_gap=run.get("memory_gap"),
    )


@lru_cache(maxsize=1)
def _runs_text_parsed() -> tuple[dict, ...]:
    return tuple(yaml.safe_load(RUNS.read_text()))


def load_runs() -> list[dict]:
    return [copy.deepcopy(r) for r in _runs_text_parsed()]


def evaluate_runs(efficiency: dict[str, EfficiencySpec] | None = None, runs: list[dict] | None = None) -> list[RunResult]:
    return [predict_run(r, efficiency) for r in (load_runs() if runs is None else runs)]


def source_key(run: dict) -> str:
    """The source a run comes from, for leave-one-source-out: the id's first dash-separated word
    (mlm = Megatron-LM README, megatron2021 = Narayanan et al. Table 1, nemo2407 = NeMo 24.07, ...)."""
    return run["id"].split("-")[0]


def run_gpu(run: dict) -> str:
    return _base_cluster(run["cluster"]).primary.gpu.name


def run_family(run: dict) -> str:
    return "moe" if _model(run).moe is not None else "dense"


def run_precision(run: dict) -> str:
    return run["precision"]


def leave_one_source_out(runs: list[dict] | None = None, jobs: int = 1) -> dict[str, tuple[RunResult, RunResult]]:
    """For every run: (prediction with its source left out of the efficiency fit, prediction with
    the all-in fit). Fits are the ones fit_efficiency.py makes (same start, grid and objective).
    `jobs` > 1 fits the folds in that many processes (the same figures: every fit is deterministic)."""
    from fit_efficiency import fit_all

    runs = load_runs() if runs is None else runs
    all_in, _ = fit_all(runs)
    gpus = tuple(sorted({run_gpu(r) for r in runs}))
    sources = sorted({source_key(r) for r in runs})
    fitted = [s for s in sources if not all(r.get("skip_throughput") for r in runs if source_key(r) == s)]
    # a source none of whose runs is fitted on needs no fold: the all-in fit already leaves it out
    folds = {s: all_in for s in sources if s not in fitted}
    # the largest sources first, so that no process is left with a long fold at the end
    tasks = [(s, runs, gpus) for s in sorted(fitted, key=lambda s: -sum(source_key(r) == s for r in runs))]
    if jobs > 1 and len(tasks) > 1:
        with multiprocessing.Pool(min(jobs, len(tasks))) as pool:
            folds.update(pool.imap_unordered(_fold_fit, tasks))
    else:
        folds.update(map(_fold_fit, tasks))
    out: dict[str, tuple[RunResult, RunResult]] = {}
    for source in sources:
        mine = [r for r in runs if source_key(r) == source]
        loso = evaluate_runs(folds[source], mine)
        fit = evaluate_runs(all_in, mine)
        for r, a, b in zip(mine, loso, fit, strict=True):
            out[r["id"]] = (a, b)
    return out


def _fold_fit(task: tuple[str, list[dict], tuple[str, ...]]) -> tuple[str, dict[str, EfficiencySpec]]:
    """The efficiencies fitted without `source`'s runs: a GPU type left with too few runs borrows the
    fold's generation fit, else its H100 fit (with its generation's GEMM level where that has 2-4
    runs: fit_efficiency.level_fit)."""
    from fit_efficiency import fit_all

    source, runs, gpus = task
    fold, _ = fit_all([r for r in runs if source_key(r) != source], also=gpus)
    return source, fold


def residual_rows(runs: list[dict], loso: dict[str, tuple[RunResult, RunResult]]) -> list[dict]:
    """One row per run and metric: the interface tests/validation/residuals_train.json holds."""
    rows = []
    for r in runs:
        a, b = loso[r["id"]]
        mem = a.measured_memory_gib is not None and not a.memory_gap  # memory_gap rows feed no memory band
        rows.append({
            "id": r["id"], "source": source_key(r), "mode": "train", "gpu": a.gpu, "family": run_family(r),
            "precision": run_precision(r), "metric": a.metric, "measured": a.measured,
            "predicted_loso": a.predicted, "predicted_fit": b.predicted,
            "mem_measured_gib": a.measured_memory_gib if mem else None,
            "mem_predicted_gib": a.predicted_memory_gib if mem else None,
            "held": not r.get("skip_throughput"),
        })
    return rows


def _summary(label: str, errs: list[float]) -> str:
    return f"{label:42} {len(errs):4} {statistics.median(errs):8.1%} {max(errs):8.1%}"


def _jobs(argv: list[str]) -> int:
    """`--jobs N` (default 1): processes fitting the leave-one-source-out folds."""
    if "--jobs" not in argv:
        return 1
    i = argv.index("--jobs")
    try:
        jobs = int(argv[i + 1])
    except (IndexError, ValueError):
        raise SystemExit("validate_published.py: --jobs takes a number of processes, e.g. --jobs 2") from None
    if jobs < 1:
        raise SystemExit(f"validate_published.py: --jobs {jobs}: give 1 or more processes")
    return jobs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    jobs = _jobs(argv)  # refused before the minutes of in-sample work
    runs = load_runs()
    results = evaluate_runs(runs=runs)
    print("In-sample (the efficiencies the bundled clusters ship):")
    print(f"{'run':45} {'metric':22} {'measured':>10} {'predicted':>10} {'error':>8}{'':21} {'mem meas':>8} {'mem pred':>8} {'error':>7}")
    for r in results:
        mem = ""
        if r.memory_error is not None:
            mem = f"{r.measured_memory_gib:8.1f} {r.predicted_memory_gib:8.1f} {r.memory_error:+7.1%}"
        flag = " (not held to target)" if r.skip_throughput else ""
        print(f"{r.id:45} {r.metric:22} {r.measured:10.2f} {r.predicted:10.2f} {r.error:+8.1%}{flag:21} {mem}")
    errs = [abs(r.error) for r in results if not r.skip_throughput]
    print(f"\nthroughput: {len(errs)} runs, median |error| {statistics.median(errs):.1%}, max |error| {max(errs):.1%}")
    for reason in sorted({r.skip_throughput for r in results if r.skip_throughput}):
        ids = [r.id for r in results if r.skip_throughput == reason]
        print(f"  not held to the throughput target ({len(ids)} runs): {reason}")
    mem_errs = [abs(r.memory_error) for r in results if r.memory_error is not None and not r.memory_gap]
    if mem_errs:
        print(f"memory:     {len(mem_errs)} runs, median |error| {statistics.median(mem_errs):.1%}, max |error| {max(mem_errs):.1%}")
    for reason in sorted({r.memory_gap for r in results if r.memory_gap}):
        ids = [r.id for r in results if r.memory_gap == reason]
        print(f"  memory not held to the target ({len(ids)} runs): {reason}")
    unfit = [r.id for r in results if not r.fits and not r.skip_memory]
    print(f"published runs predicted not to fit in memory: {len(unfit)} {unfit if unfit else ''}")
    for r in results:
        if not r.fits and r.skip_memory:
            print(f"  predicted not to fit, not held ({r.id}): {r.skip_memory}")

    loso = leave_one_source_out(runs, jobs=jobs)
    held = [r for r in runs if not r.get("skip_throughput")]
    print("\nLeave-one-source-out (fit the efficiencies on every other source, predict this one; held runs):")
    print(f"{'source':42} {'runs':>4} {'median':>8} {'max':>8}")
    for source in sorted({source_key(r) for r in held}):
        e = [abs(loso[r["id"]][0].error) for r in held if source_key(r) == source]
        print(_summary(source, e))
    print(_summary("all", [abs(loso[r["id"]][0].error) for r in held]))
    print("\nPer family (GPU x dense/MoE x precision), leave-one-source-out:")
    fams: dict[str, list[float]] = {}
    for r in held:
        a = loso[r["id"]][0]
        fams.setdefault(f"{a.gpu} {run_family(r)} {run_precision(r)}", []).append(a.error)
    print(f"{'family':42} {'runs':>4} {'median':>8} {'max':>8}   signed median")
    for fam, e in sorted(fams.items()):
        print(_summary(fam, [abs(x) for x in e]) + f"   {statistics.median(e):+.1%}")
    if "--write-residuals" in argv:
        RESIDUALS.write_text(json.dumps(residual_rows(runs, loso), indent=1) + "\n")
        print(f"\nwrote {RESIDUALS.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
