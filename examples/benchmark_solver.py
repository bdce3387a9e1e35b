"""Solver benchmark: prints the figures the planner issues ask for.

    python examples/benchmark_solver.py            # the sections below (a few minutes on 2 cores)
    python examples/benchmark_solver.py --quick    # the headline solves only
    python examples/benchmark_solver.py --sweep    # every bundled model x cluster x size (long: run it
                                                   # once, niced, in the background)
    python examples/benchmark_solver.py --sweep --models deepseek-v3,qwen3-235b-a22b \
        --clusters dgx-h100 --sizes 64,1024 --time-limit 30 --workers 8
    python examples/benchmark_solver.py --serve-limits 2,5   # whole `solve --mode serve` commands

The sweep prints, per solve, the status, wall time, CPU time (all threads; comparable on a loaded
machine) and gap, then a summary: statuses, median and worst wall times, and every solve that was not
proven optimal within 10 s or overshot its time limit by more than 2 s. Heterogeneous clusters are
solved at their own size; a size a cluster cannot take (e.g. not a multiple of a 72-GPU NVLink
domain) is rounded down to a power-of-two count of such domains and printed as used.

On a machine shared with other jobs the wall clock says more about the neighbours than about the
solver, and the solver's own deadline (wall clock) cuts the work short. `--cpu-clock` measures
instead what one dedicated core would do: every deadline of the solve counts this process's CPU time
(CP-SAT is stopped by a watchdog thread once its share is used up), so a solve does the work it
would do alone and its CPU time stands for its wall time on an idle machine. Use it with
`--workers 1`.

1. Llama 3.1 405B on 16,384 H100 (seq 8192, batch 2048) and Llama 3.1 70B on 64 H100: wall time,
   status, gap.
2. Llama 3.1 70B on the heterogeneous mixed-h100-a100 cluster vs the best plan on either pool alone.
3. Uneven layouts vs Megatron's even split for Llama 3 (128K vocabulary) models.
4. Solve time as the problem grows: decoder layers 32 -> 128, GPUs 8 -> 16,384.

`--serve-limits L1,L2` runs the large serving commands (a split deployment for Qwen3-235B on 576 GB200,
and --pareto fronts for Qwen3-235B on 64 H100, DeepSeek-V3 on 1,024 H100, Qwen3-235B on 576 GB200) as
a user does, process start-up included, at each --time-limit: wall and CPU seconds, the exit status,
the plan's solver status and why it stopped, its output tokens/s per GPU used, and whether the front is
complete.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import statistics
import sys
import time

from autoshard.api import resize, train_job
from autoshard.search.train.solve import SolverOptions, solve_train
from autoshard.errors import InfeasibleError, SolverError
from autoshard.search.train.space import Pins, SpaceOptions
from autoshard.specs import ClusterSpec, ModelSpec, TrainJob, load_cluster, load_model

WORKERS = 8


class _CpuClock:
    """Stands in for the `time` module of autoshard.search.deadline under --cpu-clock."""

    @staticmethod
    def monotonic() -> float:
        return time.process_time()


def use_cpu_clock() -> None:
    """Make every solver deadline count this process's CPU time; CP-SAT is stopped by a watchdog once
    it has used the CPU time its wall-clock limit would have given it."""
    import threading

    import autoshard.search.deadline as deadline_module
    from ortools.sat.python import cp_model

    deadline_module.time = _CpuClock  # type: ignore[assignment]
    plain = cp_model.CpSolver.solve

    def solve(self, model, *args, **kwargs):
        params = self.parameters
        budget = params.max_time_in_seconds
        params.max_time_in_seconds = max(600.0, 50 * budget)  # a backstop only
        end = time.process_time() + budget
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.02):
                if time.process_time() >= end:
                    self.stop_search()
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            return plain(self, model, *args, **kwargs)
        finally:
            done.set()
            watcher.join()

    cp_model.CpSolver.solve = solve


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


SWEEP_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def bundled(kind: str) -> list[str]:
    return sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, kind)) if f.endswith(".yaml"))


def sized(cluster: ClusterSpec, gpus: int) -> ClusterSpec | None:
    """`cluster` at `gpus` GPUs, or at the largest size below it that the cluster can take."""
    if cluster.is_heterogeneous:
        return cluster
    try:
        return cluster.with_gpus(gpus)
    except ValueError:
        unit = max(cluster.primary.node.gpus_per_node, cluster.primary.node.domain_size)
        if gpus < unit:
            return None
        size = unit
        while size * 2 <= gpus:
            size *= 2  # a power-of-two count of domains keeps batch sizes divisible
        try:
            return cluster.with_gpus(size)
        except ValueError:
            return None


def sweep(models: list[str], clusters: list[str], sizes: list[int], limit: float, workers: int,
          latin: bool = False) -> None:
    """Every model x cluster x size; with `latin`, every model x cluster at one size, rotating so that
    every model and every cluster meets every size (a stratified part of the sweep)."""
    clock = "CPU" if isinstance(sys.modules["autoshard.search.deadline"].time, type) else "wall"
    print(f"== Sweep: {len(models)} models x {len(clusters)} clusters x sizes {sizes} "
          f"(time limit {limit:g} s of {clock} time, {workers} workers, {os.cpu_count()} CPUs) ==")
    print(f"{'model':18} {'cluster':16} {'GPUs':>6} {'status':10} {'wall s':>7} {'cpu s':>7} {'gap %':>6}  plan")
    rows = []
    for name in models:
        model = load_model(name)
        job = train_job(model)
        for cname in clusters:
            base = load_cluster(cname)
            done: set[int] = set()
            rank = (bundled("models").index(name) if name in bundled("models") else 0) + (
                bundled("clusters").index(cname) if cname in bundled("clusters") else 0)
            for gpus in ([sizes[rank % len(sizes)]] if latin else sizes):
                cluster = sized(base, gpus)
                if cluster is None or cluster.num_gpus in done:
                    continue
                done.add(cluster.num_gpus)
                options = SolverOptions(num_workers=workers, time_limit_s=limit)
                start, cpu = time.monotonic(), time.process_time()
                try:
                    plan = solve_train(model, cluster, job, options=options)[0]
                    status, gap, desc = plan.solver.status, 100 * plan.solver.gap, plan.config.dims.describe()
                except InfeasibleError as exc:
                    status, gap, desc = "INFEASIBLE", 0.0, str(exc).splitlines()[0][:60]
                except SolverError as exc:  # no plan within the time limit
                    status, gap, desc = "NO-PLAN", math.nan, str(exc).splitlines()[0][:60]
                except Exception as exc:  # noqa: BLE001 - a benchmark reports every failure and goes on
                    status, gap, desc = "ERROR", math.nan, f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
                wall, used = time.monotonic() - start, time.process_time() - cpu
                rows.append((name, cname, cluster.num_gpus, status, wall, used, gap))
                print(f"{name:18} {cname:16} {cluster.num_gpus:>6} {status:10} {wall:7.2f} {used:7.2f} {gap:6.2f}  {desc}",
                      flush=True)
    summarize(rows, limit, clock)


def summarize(rows: list[tuple], limit: float, clock: str = "wall") -> None:
    """Statuses, median and worst times, and every solve not proven optimal within 10 s or over the
    limit + 2 s, judged on `clock` ("wall", or "CPU" under --cpu-clock)."""
    at = 5 if clock == "CPU" else 4
    print(f"\n== Sweep summary (times judged on {clock} time) ==")
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[3]] = counts.get(row[3], 0) + 1
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    planned = [r for r in rows if r[3] in ("OPTIMAL", "FEASIBLE")]
    if planned:
        walls = [r[4] for r in planned]
        cpus = [r[5] for r in planned]
        print(f"solves with a plan: {len(planned)}; wall median {statistics.median(walls):.2f} s, max {max(walls):.2f} s; "
              f"CPU median {statistics.median(cpus):.2f} s, max {max(cpus):.2f} s")
        print(f"OPTIMAL within 10 s {clock}: {sum(1 for r in planned if r[3] == 'OPTIMAL' and r[at] <= 10)} of {len(planned)}")
    every = [r[at] for r in rows]
    if every:
        print(f"all solves (infeasible included): {clock} median {statistics.median(every):.2f} s")
    print(f"worst 10 by {clock} time:")
    for r in sorted(rows, key=lambda r: -r[at])[:10]:
        print(f"  {r[0]:18} {r[1]:16} {r[2]:>6} {r[3]:10} wall {r[4]:6.2f} s  cpu {r[5]:6.2f} s  gap {r[6]:5.2f} %")
    bad = [r for r in rows if r[3] not in ("OPTIMAL", "INFEASIBLE") or r[at] > 10]
    print(f"not proven optimal (or infeasible) within 10 s: {len(bad)}")
    for r in bad:
        print(f"  {r[0]:18} {r[1]:16} {r[2]:>6} {r[3]:10} wall {r[4]:6.2f} s  cpu {r[5]:6.2f} s  gap {r[6]:5.2f} %")
    over = [r for r in rows if r[at] > limit + 2]
    print(f"{clock} time over the limit + 2 s: {len(over)}"
          + "".join(f"\n  {r[0]} {r[1]} {r[2]}: {r[at]:.2f} s" for r in over))


def read_rows(paths: list[str]) -> list[tuple]:
    """Rows of earlier sweep outputs (e.g. shards run side by side), for one summary."""
    rows = []
    for path in paths:
        with open(path) as f:
            for text in f:
                parts = text.split()
                if not text[:1].isspace() and len(parts) >= 7 and parts[2].isdigit() and parts[3] in ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "ERROR",
                                                                            "NO-PLAN"):
                    rows.append((parts[0], parts[1], int(parts[2]), parts[3], float(parts[4]), float(parts[5]),
                                 float(parts[6])))
    return rows


SERVE_COMMANDS = (
    "qwen3-235b-a22b gb200-nvl72 --gpus 576",
    "qwen3-235b-a22b dgx-h100 --gpus 64 --pareto",
    "deepseek-v3 dgx-h100 --gpus 1024 --pareto",
    "qwen3-235b-a22b gb200-nvl72 --gpus 576 --pareto",
)


def serve_limits(limits: list[float]) -> None:
    """Wall time of whole `autoshard solve ... --mode serve --time-limit L --json` commands."""
    exe = os.path.join(os.path.dirname(sys.executable), "autoshard")
    print(f"{'limit':>5} {'wall s':>7} {'CPU s':>6} {'over s':>6} rc  solver / front  :: command")
    for limit in limits:
        for cmd in SERVE_COMMANDS:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            run = subprocess.run([exe, "solve", *cmd.split(), "--mode", "serve", "--time-limit", f"{limit:g}",
                                  "--json"], capture_output=True, text=True, check=False)
            wall = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            what = run.stderr.strip().splitlines()[-1][:60] if run.returncode else ""
            if run.returncode == 0:
                obj = json.loads(run.stdout)
                what = (f"{obj['solver']['status']} {obj['solver']['stop_reason']} "
                        f"{obj['predicted']['tokens_per_s_per_gpu']:,.1f} tok/s/GPU")
                if "pareto" in obj:
                    front = obj["pareto"]
                    what += (" / front complete" if front["complete"] else
                             f" / front {front['engines_evaluated']} of {front['engines']}")
            print(f"{limit:>5g} {wall:>7.2f} {cpu:>6.2f} {wall - limit:>+6.2f} {run.returncode:>2}  {what}  :: {cmd}",
                  flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="headline solves only")
    parser.add_argument("--sweep", action="store_true", help="every bundled model x cluster x size")
    parser.add_argument("--models", help="comma-separated subset of the bundled models (sweep)")
    parser.add_argument("--clusters", help="comma-separated subset of the bundled clusters (sweep)")
    parser.add_argument("--sizes", help="comma-separated GPU counts (sweep; default 8 ... 16384)")
    parser.add_argument("--time-limit", type=float, default=30.0, help="per solve (sweep)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="CP-SAT workers (sweep)")
    parser.add_argument("--latin", action="store_true",
                        help="each model x cluster at one of --sizes, rotating (a stratified part of the sweep)")
    parser.add_argument("--summarize", nargs="+", metavar="FILE", help="one summary of earlier sweep outputs")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="deadlines count this process's CPU time (a loaded machine; use --workers 1)")
    parser.add_argument("--serve-limits", metavar="L1,L2", help="whole serving commands at these --time-limit values")
    args = parser.parse_args()
    if args.serve_limits:
        serve_limits([float(x) for x in args.serve_limits.split(",")])
        return 0
    if args.summarize:
        summarize(read_rows(args.summarize), args.time_limit, "CPU" if args.cpu_clock else "wall")
        return 0
    if args.cpu_clock:
        use_cpu_clock()
    if args.sweep:
        models = args.models.split(",") if args.models else bundled("models")
        clusters = args.clusters.split(",") if args.clusters else bundled("clusters")
        sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else list(SWEEP_SIZES)
        sweep(models, clusters, sizes, args.time_limit, args.workers, args.latin)
        return 0
    headline()
    if args.quick:
        return 0
    heterogeneous()
    uneven()
    scaling()
    return 0


if __name__ == "__main__":
    sys.exit(main())
