"""Plan a vLLM deployment through the Python API: Llama 3.1 70B on one 8 x H100 node with a
50 ms time-per-output-token target, and the fleet that sustains 20 requests/s.

    python examples/serving_plan.py
"""

from __future__ import annotations

from autoshard import load_cluster, load_model
from autoshard.api import solve_serve
from autoshard.api import serve_job_for


def main() -> None:
    model = load_model("llama-3.1-70b")
    node = load_cluster("dgx-h100").with_gpus(8)
    job = serve_job_for(model, input_len=1000, output_len=1000, tpot_ms=50)
    plan = solve_serve(model, node, job, pins=None, top_k=1, time_limit_s=10)[0]
    p = plan.prediction
    print(f"{plan.describe()}: {plan.throughput_tokens_per_s:,.0f} output tokens/s, TPOT {1e3 * p.tpot_s:.1f} ms, "
          f"TTFT {p.ttft_s:.2f} s")
    print(plan.launch["vllm"])

    fleet = load_cluster("dgx-h100").with_gpus(256)
    rate = serve_job_for(model, input_len=1000, output_len=1000, tpot_ms=50, request_rate=20)
    sized = solve_serve(model, fleet, rate, pins=None, top_k=1, time_limit_s=10)[0]
    print(f"\n20 requests/s within 50 ms TPOT: {sized.num_gpus} GPUs ({sized.describe()})")


if __name__ == "__main__":
    main()
