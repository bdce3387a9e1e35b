"""Benchmark: a cost study of Llama-3.1-70B over 5 cluster kinds x 8 sizes (40 solves), with its wall
time. The target is <= 60 s on 2 cores. Exits 1 when over the target.

    python examples/benchmark_study.py                 # 2 worker processes, 60 s for the whole study
    python examples/benchmark_study.py --jobs 4 --time-limit 30 --verbose
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

from autoshard.study.run import run_study

CLUSTERS = ["dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200", "mi300x"]
SIZES = [64, 128, 256, 512, 1024, 2048, 4096, 8192]  # all whole 8-GPU nodes
TOKENS = 15e12
TARGET_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--time-limit", type=float, default=TARGET_S, help="limit for the whole study (its sizes share it), seconds")
    parser.add_argument("--verbose", action="store_true", help="list every size with its solve time")
    args = parser.parse_args()
    start = time.perf_counter()
    result = run_study("llama-3.1-70b", CLUSTERS, SIZES, tokens=TOKENS, time_limit_s=args.time_limit, jobs=args.jobs)
    wall = time.perf_counter() - start
    cpu = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    print(f"llama-3.1-70b: {len(CLUSTERS)} cluster kinds x {len(SIZES)} sizes = {len(CLUSTERS) * len(SIZES)} solves, "
          f"{args.jobs} processes on {len(cpu)} CPUs, {args.time_limit:g} s limit for the whole study")
    statuses = Counter(r.status for r in result.rows)
    print(f"plans: {len(result.rows)} ({', '.join(f'{n} {s}' for s, n in statuses.items())}); "
          f"no plan: {len(result.skipped)}")
    times = sorted((r.solve_s, r.cluster, r.num_gpus, r.status, r.gap, r.mfu) for r in result.rows)
    if times:
        over = [t for t in times if t[0] > args.time_limit * 1.05]
        print(f"solve seconds per size: sum {sum(t[0] for t in times):.1f}, median {times[len(times) // 2][0]:.1f}, "
              f"max {times[-1][0]:.1f} ({times[-1][1]} x {times[-1][2]}); {len(over)} sizes ran past the limit; "
              f"largest optimality gap {max(t[4] for t in times):.2%}")
    if args.verbose:
        for solve_s, cluster, gpus, status, gap, mfu in sorted(times, key=lambda t: (t[1], t[2])):
            print(f"  {cluster:>14} x {gpus:<5} {solve_s:6.1f} s  {status:<8} gap {gap:6.2%}  MFU {mfu:.2%}")
    for s in result.skipped:
        print(f"  no plan for {s.cluster} x {s.num_gpus}: {s.reason.splitlines()[0]}")
    for a in result.answers:
        print(a.text)
    verdict = "within" if wall <= TARGET_S else "OVER"
    print(f"wall time: {wall:.1f} s ({verdict} the {TARGET_S:.0f} s target)")
    return 0 if wall <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
