"""Issue #13 targets, printed (not asserted in the unit suite, which must not time things):

    python tests/validation/disagg_targets.py [--workers 2]

1. DeepSeek-V3 (FP8 weights; 1000/1000, 2000/1000 and 2000/2000 input/output tokens) on 12 and 13
   nodes of 8 x H100 with a prefill/decode split: planning wall time (enumeration, tables and CP-SAT),
   the solver status, the chosen xPyD layout, and output tokens/s per node. No H100 split is published
   outside the reserved sources, so the per-node figures are predictions; beside them the nearest
   measurements, vLLM's wide-EP decode instances on 4, 9 and 12 nodes of H200 at 2000/2000
   (disagg_runs.yaml, predicted as validate_disagg.py does).
2. Llama-3.1-70B on 8-64 H100 at the interactive SLA (TPOT <= 50 ms): aggregated or disaggregated,
   with the planner's reason.
"""

from __future__ import annotations

import argparse
import time

import validate_disagg

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
    for isl, osl in ((1000, 1000), (2000, 1000), (2000, 2000)):
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
    print("  nearest measured: vLLM wide-EP decode on H200, 2000/2000, 256 requests per rank")
    for r in validate_disagg.evaluate_runs():
        if r.id.startswith("vllm-wide-ep-h200-"):
            ranks = r.id.split("-")[-2].removeprefix("dep")
            print(
                f"    DP{ranks}/EP{ranks} decode on {int(ranks) // 8} nodes: {r.predicted:,.0f} predicted, "
                f"{r.measured:,.0f} measured output tok/s per GPU ({100 * r.error:+.1f}%), "
                f"{8 * r.measured:,.0f} per decode node"
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
