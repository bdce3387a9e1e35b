"""A pre-provisioning cost study through the Python API: Llama-3.1-405B on 15 T tokens across
H100, H200, B200 and GB200 NVL72, the same study as examples/cost_study_405b.md.

    python examples/cost_study.py                      # prints the answers, writes ./cost_study_405b/
    python examples/cost_study.py --jobs 8 --out /tmp/study

The command-line equivalent:

    autoshard study llama-3.1-405b --cluster dgx-h100 --cluster dgx-h200 --cluster dgx-b200 \\
        --cluster gb200-nvl72 --gpus 1024,1152,2048,2304,4096,4608,8192,9216,16384,18432 \\
        --tokens 15e12 --deadline-days 90 --budget-usd 100e6 --time-limit 60 --out cost_study_405b
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoshard.study.report import write_outputs
from autoshard.study.run import run_study

CLUSTERS = ["dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72"]
# powers of two for the 8-GPU DGX nodes, multiples of 72 (whole NVL72 racks) for GB200; every size is
# offered to every cluster, and those that do not fill whole nodes or racks are listed with the reason
SIZES = [1024, 1152, 2048, 2304, 4096, 4608, 8192, 9216, 16384, 18432]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("cost_study_405b"), help="directory for the report files")
    parser.add_argument("--jobs", type=int, default=0, help="solver processes (0: one per CPU)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="limit for the whole study (its sizes share it), seconds")
    args = parser.parse_args()

    result = run_study(
        "llama-3.1-405b", CLUSTERS, SIZES,
        tokens=15e12,
        deadline_days=90,
        budget_usd=100e6,
        # prices={"dgx-h100": 2.49},  # override a cluster's list price (USD per GPU-hour)
        time_limit_s=args.time_limit,
        jobs=args.jobs,
        progress=lambda done, total, last: print(f"\r{done}/{total} solved (last: {last})", end="", flush=True),
    )
    print()
    for answer in result.answers:
        print(answer.text)
    print("Pareto front (days, dollars):")
    for r in result.pareto:
        print(f"  {r.num_gpus:>6,} x {r.gpu:<16} {r.days:6.1f} days  ${r.total_usd / 1e6:6.2f}M  {r.plan}")
    best = result.answers[0].row
    if best is not None:
        print(f"cheapest within the deadline runs at {best.mfu:.1%} MFU, {best.tokens_per_s / 1e6:.2f} M tokens/s")
    for path in write_outputs(result, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
