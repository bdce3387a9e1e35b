"""Solver benchmark: prints the figures the planner issue asks for.

    python examples/benchmark_solver.py            # everything (a few minutes on 2 cores)
    python examples/benchmark_solver.py --quick    # the headline solves only

1. Llama 3.1 405B on 16,384 H100 (seq 8192, batch 2048) and Llama 3.1 70B on 64 H100: wall time,
   status, gap.
2. Llama 3.1 70B on the heterogeneous mixed-h100-a100 cluster vs the best plan on either pool alone.
3. Uneven layouts vs Megatron's even split for Llama 3 (128K vocabulary) models.
4. Solve time as the problem grows: decoder layers 32 -> 128, GPUs 8 -> 16,384.
"""

from __future__ import annotations

import sys
import time

from autoshard.api import resize, train_job
from autoshard.search.run import SolverOptions, solve_train
from autoshard.errors import InfeasibleError
from autoshard.search.space import Pins, SpaceOptions
from autoshard.specs import ClusterSpec, ModelSpec, TrainJob, load_cluster, load_model

WORKERS = 8


def solve(model: ModelSpec, cluster: ClusterSpec, job: TrainJob, *, even: bool = False, pins: Pins = Pins()):
    options = SolverOptions(num_workers=WORKERS, time_limit_s=60, space=SpaceOptions(even_layout_only=even))
    start = time.perf_counter()
    plan = solve_train(model, cluster, job, pins=pins, options=options)[0]
    return plan, time.perf_counter() - start


def line(label: str, plan, wall: float) -> str:
    p = plan.prediction
    return (f"{label:60} {plan.config.dims.describe():28} {p.tokens_per_s:14,.0f} tok/s  MFU {100 * p.mfu:5.1f}%  "
            f"{plan.solver.status:8} gap {100 * plan.solver.gap:5.2f}%  {wall:6.2f} s")


def headline() -> None:
    print("== Headline solves ==")
    for name, cluster, gpus, seq, gbs in (("llama-3.1-405b", "dgx-h100", 16384, 8192, 2048),
                                          ("llama-3.1-70b", "dgx-h100", 64, 8192, 512)):
        model = load_model(name)
        plan, wall = solve(model, resize(load_cluster(cluster), gpus), train_job(model, seq_len=seq, global_batch_size=gbs))
        print(line(f"{name} on {gpus} x {cluster}", plan, wall))


def heterogeneous() -> None:
    print("\n== Heterogeneous cluster: llama-3.1-70b on mixed-h100-a100 ==")
    model = load_model("llama-3.1-70b")
    mixed = load_cluster("mixed-h100-a100")
    job = train_job(model)
    plan, wall = solve(model, mixed, job)
    print(line("both pools (32 H100 + 64 A100)", plan, wall))
    best_single = None
    for pool in mixed.pools:
        alone = mixed.model_copy(update={"pools": (pool,), "name": f"{mixed.name}:{pool.name}"})
        try:
            single, wall = solve(model, alone, job)
        except Exception as exc:  # noqa: BLE001 - a pool may be too small for the model
            print(f"{pool.name + ' pool alone':48} no plan: {str(exc).splitlines()[0]}")
            continue
        print(line(f"{pool.name} pool alone ({pool.num_gpus} GPUs)", single, wall))
        if best_single is None or single.prediction.tokens_per_s > best_single.prediction.tokens_per_s:
            best_single = single
    if best_single is not None:
        gain = plan.prediction.tokens_per_s / best_single.prediction.tokens_per_s - 1
        print(f"gain of the mixed plan over the best single-pool plan: {100 * gain:+.1f} %")


def uneven() -> None:
    print("\n== Uneven layout vs best even split (Llama 3, 128K vocabulary) ==")
    cases = (
        ("llama-3.1-8b", 64, Pins()),
        ("llama-3.1-8b", 64, Pins(tp=1, pp=8, vpp=1)),
        ("llama-3.1-70b", 256, Pins()),
        ("llama-3.1-70b", 256, Pins(tp=8, pp=4, vpp=1)),
        ("llama-3.1-405b", 2048, Pins()),
    )
    for name, gpus, pins in cases:
        model = load_model(name)
        c = resize(load_cluster("dgx-h100"), gpus)
        job = train_job(model)
        tag = f"{name} on {gpus}" + (f" [{pins.describe()}]" if pins.describe() != "none" else "")
        free, wall_free = solve(model, c, job, pins=pins)
        print(line(f"{tag}: any layout", free, wall_free))
        try:
            even, wall_even = solve(model, c, job, even=True, pins=pins)
        except InfeasibleError:
            print(f"{tag}: even split only: no plan ({model.num_layers} layers do not split evenly over the "
                  "power-of-two pipelines that fit; Megatron needs an explicit layout)")
            continue
        print(line(f"{tag}: even split only", even, wall_even))
        gain = free.prediction.tokens_per_s / even.prediction.tokens_per_s - 1
        print(f"{'':60} gain of the uneven layout: {100 * gain:+.2f} %")


def scaling() -> None:
    print("\n== Solve time as the problem grows (Llama-70B-shaped layers, seq 4096, 4M-token batches) ==")
    base = load_model("llama-3.1-70b")
    cluster = load_cluster("dgx-h100")
    print(f"{'layers':>7} " + " ".join(f"{g:>8}" for g in (8, 64, 512, 4096, 16384)) + "   (seconds; * = not proven optimal)")
    for layers in (32, 64, 96, 128):
        groups = ({"kind": "embedding"}, {"kind": "dense", "count": layers}, {"kind": "output"})
        model = base.model_copy(update={"layers": tuple(base.layers[0].model_validate(g) for g in groups),
                                        "name": f"llama-{layers}L"})
        cells = []
        for gpus in (8, 64, 512, 4096, 16384):
            job = TrainJob(seq_len=4096, global_batch_size=max(1024, gpus // 8))
            try:
                plan, wall = solve(model, cluster.with_gpus(gpus), job)
                cells.append(f"{wall:7.2f}{'' if plan.solver.status == 'OPTIMAL' else '*'}")
            except Exception:  # noqa: BLE001 - e.g. the model does not fit 8 GPUs
                cells.append(f"{'no fit':>8}")
        print(f"{layers:>7} " + " ".join(f"{c:>8}" for c in cells))


def main() -> int:
    headline()
    if "--quick" in sys.argv:
        return 0
    heterogeneous()
    uneven()
    scaling()
    return 0


if __name__ == "__main__":
    sys.exit(main())
