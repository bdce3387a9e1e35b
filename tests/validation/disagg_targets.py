"""Issue #13 targets, printed (not asserted in the unit suite, which must not time things):

    python tests/validation/disagg_targets.py [--workers 2]

1. DeepSeek-V3 (FP8 weights, 1000 and 2000 input tokens, 1000 output) on 12 and 13 nodes of 8 x H100 with a
   prefill/decode split: planning wall time (enumeration, tables and CP-SAT), the solver status, the
   chosen xPyD layout, and output tokens/s per node.
2. Llama-3.1-70B on 8-64 H100 at the interactive SLA (TPOT <= 50 ms): aggregated or disaggregated,
   with the planner's reason.
"""

from __future__ import annotations

import argparse
import time

from autoshard.search.serve.solve import solve_serve
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    h100 = load_cluster("dgx-h100")
    dsv3 = load_model("deepseek-v3")
    print("DeepSeek-V3, FP8 weights, --disaggregate on")
    for isl, osl in ((1000, 1000), (2000, 1000)):
        for nodes in (12, 13):
            job = ServeJob(input_len=isl, output_len=osl, weight_dtype=WeightDtype.FP8)
            t0 = time.perf_counter()
            plan = solve_serve(
                dsv3,
                h100.with_gpus(8 * nodes),
                job,
                pins=None,
                top_k=1,
                time_limit_s=60,
                num_workers=args.workers,
                disaggregate="on",
            )[0]
            wall = time.perf_counter() - t0
            print(
                f"  {isl}/{osl} {nodes} nodes: {wall:.2f} s, {plan.solver.status}, {plan.describe()}, "
                f"{plan.throughput_tokens_per_s / nodes:,.0f} output tok/s per node "
                f"({plan.num_gpus} GPUs used), TPOT {1e3 * plan.prediction.tpot_s:.0f} ms, "
                f"TTFT {plan.ttft_s:.2f} s"
            )
    llama = load_model("llama-3.1-70b")
    print("\nLlama-3.1-70B, BF16, 1000/1000, TPOT <= 50 ms, --disaggregate auto")
    for gpus in (8, 16, 32, 64):
        job = ServeJob(input_len=1000, output_len=1000, tpot_target_s=0.05)
        t0 = time.perf_counter()
        plan = solve_serve(
            llama,
            h100.with_gpus(gpus),
            job,
            pins=None,
            top_k=1,
            time_limit_s=60,
            num_workers=args.workers,
            disaggregate="auto",
        )[0]
        print(f"  {gpus} GPUs ({time.perf_counter() - t0:.2f} s): {plan.choice}")


if __name__ == "__main__":
    main()
