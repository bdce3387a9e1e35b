"""Predict every published training run in training_runs.yaml and compare with what was measured.

    python tests/validation/validate_published.py

prints one row per run (measured, predicted, error) and the median and max absolute error, for
throughput and for per-GPU memory where the source reports it. The pytest suite imports
`evaluate_runs` and holds the errors to the targets.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from autoshard.costmodel.memory import TrainFramework, allocator_reported_bytes
from autoshard.costmodel.training import TrainConfig, predict_train
from autoshard.emit.megatron_parse import default_stages
from autoshard.parallel import ParallelDims, Recompute
from autoshard.specs import ClusterSpec, EfficiencySpec, ModelSpec, Precision, load_cluster
from autoshard.units import GIB

HERE = Path(__file__).resolve().parent
RUNS = HERE / "training_runs.yaml"


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

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured

    @property
    def memory_error(self) -> float | None:
        if self.measured_memory_gib is None:
            return None
        return (self.predicted_memory_gib - self.measured_memory_gib) / self.measured_memory_gib


def _model(run: dict) -> ModelSpec:
    arch = dict(run["model"])
    n = arch.pop("num_layers")
    arch["layers"] = [{"kind": "embedding"}, {"kind": "dense", "count": n}, {"kind": "output"}]
    return ModelSpec.model_validate({"name": run["id"], **arch})


def _cluster(name: str, gpus: int, efficiency: dict[str, EfficiencySpec] | None = None) -> ClusterSpec:
    local = HERE / "clusters" / f"{name}.yaml"
    cluster = load_cluster(local if local.is_file() else name).with_gpus(gpus)
    if efficiency and cluster.primary.gpu.name in efficiency:
        pool = cluster.primary
        gpu = pool.gpu.model_copy(update={"efficiency": efficiency[pool.gpu.name]})
        cluster = cluster.model_copy(update={"pools": (pool.model_copy(update={"gpu": gpu}),)})
    return cluster


def _narayanan96_flops(model: ModelSpec, run: dict) -> float:
    b, s, l, h, v = run["global_batch_size"], run["seq_len"], model.num_layers, model.hidden_size, model.vocab_size
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def predict_run(run: dict, efficiency: dict[str, EfficiencySpec] | None = None) -> RunResult:
    model = _model(run)
    p = run["parallel"]
    dims = ParallelDims(tp=p["tp"], pp=p["pp"], dp=p["dp"], cp=p["cp"], vpp=p["vpp"])
    cluster = _cluster(run["cluster"], dims.world_size, efficiency)
    cfg = TrainConfig(
        dims=dims, micro_batch_size=run["micro_batch_size"], global_batch_size=run["global_batch_size"],
        seq_len=run["seq_len"], precision=Precision(run["precision"]), recompute=Recompute(run["recompute"]),
        sequence_parallel=run["sequence_parallel"], zero_stage=run["zero_stage"],
        tp_comm_overlap=run["tp_comm_overlap"], overlap_grad_reduce=run["overlap_grad_reduce"],
        flash_attention=run["flash_attention"], framework=TrainFramework(run.get("framework", "megatron")),
    )
    pred = predict_train(model, cluster, cfg, default_stages(model, pp=dims.pp, vpp=dims.vpp))
    predicted_memory = pred.peak_memory_bytes
    if cfg.framework is TrainFramework.TORCHTITAN:
        # torchtitan logs the caching allocator's peak reservation (no CUDA context, no NCCL).
        predicted_memory = allocator_reported_bytes(cluster.primary.gpu, predicted_memory)
    m = run["measured"]
    metric, measured = m["metric"], float(m["value"])
    if metric == "tflops_per_gpu" and m.get("convention", "").startswith("narayanan96"):
        # Convert the paper's hardware TFLOP/s to the step time it implies, compare step times.
        metric = "step_time_s"
        measured = _narayanan96_flops(model, run) / (measured * 1e12 * dims.world_size)
    predicted = {
        "tflops_per_gpu": pred.tflops_per_gpu,
        "step_time_s": pred.step_time_s,
        "tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu,
    }[metric]
    return RunResult(
        id=run["id"], gpu=cluster.primary.gpu.name, skip_throughput=run.get("skip_throughput"), metric=metric, measured=measured, predicted=predicted,
        measured_memory_gib=run.get("measured_memory_gib"), predicted_memory_gib=predicted_memory / GIB,
    )


def load_runs() -> list[dict]:
    return yaml.safe_load(RUNS.read_text())


def evaluate_runs(efficiency: dict[str, EfficiencySpec] | None = None) -> list[RunResult]:
    return [predict_run(r, efficiency) for r in load_runs()]


def main() -> int:
    results = evaluate_runs()
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
    mem_errs = [abs(r.memory_error) for r in results if r.memory_error is not None]
    if mem_errs:
        print(f"memory:     {len(mem_errs)} runs, median |error| {statistics.median(mem_errs):.1%}, max |error| {max(mem_errs):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
