"""Plan a training run through the Python API and compare it with a plan you already have.

    python examples/plan_training.py
"""

from __future__ import annotations

import autoshard


def main() -> None:
    model = autoshard.load_model("llama-3.1-70b")
    cluster = autoshard.load_cluster("dgx-h100").with_gpus(64)
    job = autoshard.train_job(model, seq_len=8192, global_batch_size=512)

    best = autoshard.solve(model, cluster, job, options=autoshard.SolverOptions(top_k=3))
    for rank, plan in enumerate(best, start=1):
        p = plan.prediction
        print(f"#{rank} {plan.config.dims.describe():24} step {p.step_time_s:6.2f} s  {p.tokens_per_s:9,.0f} tokens/s  "
              f"MFU {100 * p.mfu:4.1f}%  peak {p.peak_memory_bytes / 2**30:5.1f} GiB  [{plan.solver.status}]")

    mine = autoshard.evaluate(model, cluster, job, tp=8, pp=4, micro_batch_size=1,
                              recompute=autoshard.Recompute.SELECTIVE)
    gain = best[0].prediction.tokens_per_s / mine.prediction.tokens_per_s - 1
    print(f"\nTP8 PP4 selective (Megatron's even layout): {mine.prediction.tokens_per_s:,.0f} tokens/s; "
          f"the best plan is {100 * gain:+.1f} %")
    print("\nwhere the best plan's step goes (s):", {k: round(v, 3) for k, v in
          best[0].to_json()["predicted"]["time_breakdown_s"].items()})
    print("\nlaunch:\n" + best[0].launch["megatron"])


if __name__ == "__main__":
    main()
