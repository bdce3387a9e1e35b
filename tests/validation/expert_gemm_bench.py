"""Measure one MoE layer's routed-expert GEMMs the two ways Megatron-Core runs them, on one GPU:
Transformer Engine's GroupedLinear (one cuBLAS GEMM per local expert, issued round-robin on 4 CUDA
streams: `nvte_multi_stream_cublas_gemm`) and a single grouped kernel (`torch._grouped_mm`, what
Megatron's legacy GroupedMLP and TE's newer grouped path run), forward and backward, at a given
number of local experts and rows per expert -- with the host launching every kernel (eager) and with
the launches captured in a CUDA graph (GPU time alone). The difference is the host-launch cost the
cost model does not price (README, "Accuracy against published runs", the Qwen3-235B H100 rows).

Needs PyTorch and a CUDA GPU. On the GPU:

    python tests/validation/expert_gemm_bench.py --out expert_gemm_h100.json

Defaults: Qwen3-235B-A22B's expert (hidden 4,096, intermediate 1,536, SwiGLU: fc1 4,096 -> 3,072,
fc2 1,536 -> 4,096), 16 local experts (128 experts over EP 8), 256-4,096 rows per expert."""

from __future__ import annotations

import argparse
import json
import time

ROWS = (256, 512, 1024, 2048, 4096)
STREAMS = 4


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--experts", type=int, default=16)
    args = ap.parse_args()
    dev, bf16 = "cuda", torch.bfloat16
    h, f, e = args.hidden, args.ffn, args.experts
    w1 = [torch.randn(2 * f, h, device=dev, dtype=bf16) for _ in range(e)]  # fc1 (n x k)
    w2 = [torch.randn(h, f, device=dev, dtype=bf16) for _ in range(e)]      # fc2
    w1g, w2g = torch.stack(w1), torch.stack(w2)
    streams = [torch.cuda.Stream() for _ in range(STREAMS)]
    result = {"device": torch.cuda.get_device_properties(0).name, "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "hidden": h, "ffn": f, "experts": e, "streams": STREAMS, "rows": []}

    for rows in ROWS:
        x = [torch.randn(rows, h, device=dev, dtype=bf16) for _ in range(e)]
        a = [torch.randn(rows, f, device=dev, dtype=bf16) for _ in range(e)]   # fc2 input (post-activation)
        dy = [torch.randn(rows, h, device=dev, dtype=bf16) for _ in range(e)]  # fc2 output grad
        dz = [torch.randn(rows, 2 * f, device=dev, dtype=bf16) for _ in range(e)]  # fc1 output grad
        xg, ag, dyg, dzg = (torch.cat(t) for t in (x, a, dy, dz))
        offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * rows
        def multistream(fwd: bool, bwd: bool):
            main = torch.cuda.current_stream()  # the capture stream inside a graph
            for s in streams:
                s.wait_stream(main)
            for i in range(e):
                with torch.cuda.stream(streams[i % STREAMS]):
                    if fwd:
                        torch.matmul(x[i], w1[i].t())
                        torch.matmul(a[i], w2[i].t())
                    if bwd:
                        torch.matmul(dy[i], w2[i])        # fc2 dgrad
                        torch.matmul(dy[i].t(), a[i])     # fc2 wgrad
                        torch.matmul(dz[i], w1[i])        # fc1 dgrad
                        torch.matmul(dz[i].t(), x[i])     # fc1 wgrad
            for s in streams:
                main.wait_stream(s)

        def grouped(fwd: bool, bwd: bool):
            if fwd:
                torch._grouped_mm(xg, w1g.transpose(-2, -1), offs=offs)
                torch._grouped_mm(ag, w2g.transpose(-2, -1), offs=offs)
            if bwd:
                torch._grouped_mm(dyg, w2g, offs=offs)
                torch._grouped_mm(dyg.t(), ag, offs=offs)
                torch._grouped_mm(dzg, w1g, offs=offs)
                torch._grouped_mm(dzg.t(), xg, offs=offs)

        row = {"rows_per_expert": rows}
        for name, fn in (("multistream", multistream), ("grouped", grouped)):
            for phase, fwd, bwd in (("fwd", True, False), ("bwd", False, True)):
                try:
                    row[f"{name}_{phase}_eager_us"] = _eager_us(torch, lambda: fn(fwd, bwd))
                    row[f"{name}_{phase}_graph_us"] = _graph_us(torch, lambda: fn(fwd, bwd))
                except RuntimeError as err:
                    row[f"{name}_{phase}_error"] = str(err)[:200]
        flops_fwd = 2.0 * e * rows * (h * 2 * f + f * h)
        row["tflops_fwd_graph_multistream"] = flops_fwd / row.get("multistream_fwd_graph_us", 1e30) / 1e6
        result["rows"].append(row)
        print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


def _eager_us(torch, fn) -> float:
    """Microseconds per call with the host launching every kernel: many calls back to back, so a
    host slower than the GPU shows as the wall time between the first and last launch."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / 20 * 1e6)
    return best


def _graph_us(torch, fn) -> float:
    """Microseconds per call on the GPU alone: 20 calls captured in one CUDA graph, replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / 20)
    return best


if __name__ == "__main__":
    main()
