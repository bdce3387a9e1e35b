"""Measure one GPU's GEMM throughput over the shapes a training or serving step runs, for the cost
model's shape curve (autoshard/costmodel/gemm_shape.py reads the table this writes).

Needs PyTorch and a CUDA GPU (the planner itself never does). Run on the GPU to measure:

    python tests/validation/gemm_bench.py --out gemm_h100.json

and, on any machine, turn that measurement into the shipped shape table:

    python tests/validation/gemm_bench.py --table gemm_h100_raw.json autoshard/costmodel/gemm_shape_hopper.json

It times, with CUDA events over back-to-back launches after a warm-up, on random data:
- dense BF16 GEMMs (torch.matmul -> cuBLAS) and FP8 E4M3 GEMMs with per-tensor scales
  (torch._scaled_mm -> cuBLASLt, the kernel Transformer Engine's delayed and current-scaling recipes
  call on Hopper) over a grid of m (tokens), n and k, in the forward's layout (X @ W^T);
- grouped BF16 and FP8 GEMMs (torch._grouped_mm, torch._scaled_grouped_mm: the grouped kernels MoE
  layers run) over experts x tokens per expert at MoE models' expert shapes;
- a device-to-device copy (HBM bandwidth, bytes read and written).
and prints each family's figures, achieved TFLOP/s and the fraction of the largest shape's speed."""

from __future__ import annotations

import argparse
import statistics
import json
import platform
import time

M_GRID = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_GRID = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
K_GRID = (256, 512, 1024, 2048, 4096, 8192, 16384)
# (hidden, expert intermediate) of MoE models: Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3, Mixtral 8x7B
EXPERT_SHAPES = ((2048, 768), (4096, 1536), (7168, 2048), (4096, 14336))
EXPERTS = (4, 8, 16, 32, 64)
# dense tensor-core peaks of the measured devices (datasheets), for the FP8 / BF16 fraction-of-peak ratio
DATASHEET_TFLOPS = {"NVIDIA H100 80GB HBM3": {"bf16": 989, "fp8": 1979}, "NVIDIA H200": {"bf16": 989, "fp8": 1979}}
TOKENS_PER_EXPERT = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _time_s(torch, fn, flops: float) -> float:
    """Seconds per call on the GPU: warm up, then time enough back-to-back calls for ~20 ms. Calls
    shorter than 200 us run from a CUDA graph, so that the host's launch cost (~10-20 us per PyTorch
    call) does not stand in for the kernel's time; a training step's stream of kernels hides it."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end) * 1e-3, 1e-6)
    reps = max(5, min(200, int(0.02 / one)))
    run = None
    if one < 2e-4:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        run = graph.replay
        run()
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start.record()
        if run is not None:
            run()
        else:
            for _ in range(reps):
                fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3 / reps)
    return best


def dense(torch, fp8: bool) -> list[dict]:
    rows = []
    dev = "cuda"
    for k in K_GRID:
        for n in N_GRID:
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            w8 = w.to(torch.float8_e4m3fn) if fp8 else None
            for m in M_GRID:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                if fp8:
                    x8 = x.to(torch.float8_e4m3fn)
                    one = torch.ones((), device=dev, dtype=torch.float32)
                    wt = w8.t()  # column-major (k x n): the TN layout cuBLASLt FP8 takes

                    def fn(x8=x8, wt=wt, one=one):
                        return torch._scaled_mm(x8, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                else:
                    def fn(x=x, w=w):
                        return torch.matmul(x, w.t())
                s = _time_s(torch, fn, 2.0 * m * n * k)
                rows.append({"m": m, "n": n, "k": k, "s": s, "tflops": 2.0 * m * n * k / s / 1e12})
                del x
            del w, w8
    return rows


def grouped(torch, fp8: bool) -> list[dict]:
    """Grouped expert GEMMs, `experts` groups of `tokens_per_expert` rows each: BF16 through
    torch._grouped_mm, FP8 E4M3 with row-wise scales through torch._scaled_grouped_mm (the grouped
    kernels MoE layers run; rows padded to the kernel's tile inside each group)."""
    rows = []
    fn_name = "_scaled_grouped_mm" if fp8 else "_grouped_mm"
    if not hasattr(torch, fn_name):
        return [{"error": f"torch.{fn_name} missing"}]
    dev = "cuda"
    for hidden, ffn in EXPERT_SHAPES:
        for experts in EXPERTS:
            # weights stored (experts, n, k) row-major and passed transposed: (experts, k, n) column-major
            w_up = torch.randn(experts, 2 * ffn, hidden, device=dev, dtype=torch.bfloat16)
            w_down = torch.randn(experts, hidden, ffn, device=dev, dtype=torch.bfloat16)
            if fp8:
                w_up, w_down = w_up.to(torch.float8_e4m3fn), w_down.to(torch.float8_e4m3fn)
            for tpe in TOKENS_PER_EXPERT:
                total = experts * tpe
                offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * tpe
                x = torch.randn(total, hidden, device=dev, dtype=torch.bfloat16)
                y = torch.randn(total, ffn, device=dev, dtype=torch.bfloat16)
                for name, a, w, n, k in (("up", x, w_up, 2 * ffn, hidden), ("down", y, w_down, hidden, ffn)):
                    b = w.transpose(-2, -1)
                    if fp8:
                        a8 = a.to(torch.float8_e4m3fn)
                        sa = torch.ones(total, device=dev, dtype=torch.float32)
                        sb = torch.ones(experts, n, device=dev, dtype=torch.float32)

                        def fn(a8=a8, b=b, sa=sa, sb=sb, offs=offs):
                            return torch._scaled_grouped_mm(a8, b, sa, sb, offs=offs, out_dtype=torch.bfloat16)
                    else:
                        def fn(a=a, b=b, offs=offs):
                            return torch._grouped_mm(a, b, offs=offs, out_dtype=torch.bfloat16)
                    flops = 2.0 * total * n * k
                    try:
                        s = _time_s(torch, fn, flops)
                    except (RuntimeError, TypeError) as err:  # kernel not built for this GPU
                        return rows + [{"error": str(err)[:300]}]
                    rows.append({"proj": name, "hidden": hidden, "ffn": ffn, "experts": experts,
                                 "tokens_per_expert": tpe, "n": n, "k": k, "s": s,
                                 "tflops": flops / s / 1e12})
            del w_up, w_down
    return rows


BLOCK_M = (1024, 4096, 16384)
BLOCK_NK = (1024, 2048, 4096, 8192)


def blockwise(torch) -> list[dict]:
    """FP8 GEMMs with DeepSeek-style block scales (activations 1 x 128, weights 128 x 128: Megatron's
    --fp8-recipe blockwise, through cuBLAS's block-scaled kernel on Hopper) against the per-tensor
    kernel at the same shapes."""
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType

    rows, dev = [], "cuda"
    for m in BLOCK_M:
        for n in BLOCK_NK:
            for k in BLOCK_NK:
                a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
                one = torch.ones((), device=dev)
                sa = torch.ones(k // 128, m, device=dev).t()          # (m, k/128), M-major
                sb = torch.ones(n // 128, k // 128, device=dev).t()   # (k/128, n/128) as cuBLAS wants
                flops = 2.0 * m * n * k
                tensor_s = _time_s(torch, lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                                                   out_dtype=torch.bfloat16), flops)
                block_s = _time_s(torch, lambda: F.scaled_mm(a, b, sa, ScalingType.BlockWise1x128, sb,
                                                             ScalingType.BlockWise128x128,
                                                             output_dtype=torch.bfloat16), flops)
                rows.append({"m": m, "n": n, "k": k, "tensorwise_tflops": flops / tensor_s / 1e12,
                             "blockwise_tflops": flops / block_s / 1e12})
    return rows


def copy_bw(torch) -> float:
    n = 1 << 30
    a = torch.empty(n, device="cuda", dtype=torch.uint8)
    b = torch.empty_like(a)
    s = _time_s(torch, lambda: b.copy_(a), 0.0)
    return 2.0 * n / s / 1e12


def _box_max(values: dict, axes: tuple) -> dict:
    """Each grid point's speed raised to the best speed at any shape no larger in every dimension: a
    bigger GEMM can always run the smaller one's kernel on more tiles, so a point below that is a
    heuristic miss of cuBLAS on this one shape (a few such points, up to 30x low, in a sweep), not
    a property of the shape."""
    out = dict(values)
    for i in range(len(axes)):
        for key in sorted(out):
            idx = axes[i].index(key[i])
            if idx:
                below = key[:i] + (axes[i][idx - 1],) + key[i + 1:]
                if below in out:
                    out[key] = max(out[key], out[below])
    return out


def _hbm_roofline_tflops(m: int, n: int, k: int, elem: int, tbps: float) -> float:
    """TFLOP/s of an (m x k) @ (k x n) GEMM that moves its operands once at `tbps` (BF16 output)."""
    return 2.0 * m * n * k / ((m * k + k * n) * elem + 2 * m * n) * tbps


def make_table(raw_path: str, out_path: str, blockwise_raw: str | None = None) -> None:
    """The cost model's shape table from one run of this script: for dense BF16 and FP8, the speed at
    each grid shape (m, n, k) relative to the median speed over shapes with every dimension >= 4096
    (box-max envelope, then renormalised); for grouped GEMMs, the fall-off with tokens per expert
    and experts relative to the same kernel at 4,096 tokens per expert."""


    with open(raw_path) as fh:
        raw = json.load(fh)
    table: dict = {"source": {**{k: raw[k] for k in ("device", "sms", "torch", "cuda", "date")},
                              "datasheet_tflops": DATASHEET_TFLOPS[raw["device"]]},
                   "script": "tests/validation/gemm_bench.py", "copy_tbps": round(raw["copy_tbps"], 3),
                   "m": list(M_GRID), "n": list(N_GRID), "k": list(K_GRID)}
    for fam in ("bf16", "fp8"):
        # a point cannot beat its HBM roofline (A and B read, C written, at the measured copy bandwidth):
        # back-to-back calls keep a small-m GEMM's weights in L2 (50 MB on H100) and would otherwise
        # report 3.4-3.7 TB/s at m = 16-64, which a step, whose other layers evict them, never sees
        elem = 1 if fam == "fp8" else 2
        speed = {(r["m"], r["n"], r["k"]): min(r["tflops"], _hbm_roofline_tflops(r["m"], r["n"], r["k"], elem,
                                                                                 raw["copy_tbps"]))
                 for r in raw[fam]}
        env = _box_max(speed, (M_GRID, N_GRID, K_GRID))
        ref = statistics.median(v for (m, n, k), v in env.items() if min(m, n, k) >= 4096)
        table[f"{fam}_reference_tflops"] = round(ref, 1)
        table[fam] = [[[round(env[(m, n, k)] / ref, 4) for m in M_GRID] for n in N_GRID] for k in K_GRID]
    table["experts"] = list(EXPERTS)
    table["tokens_per_expert"] = list(TOKENS_PER_EXPERT)
    for fam, key in (("grouped", "grouped_bf16"), ("grouped_fp8", "grouped_fp8")):
        rows = [r for r in raw.get(fam, []) if "error" not in r]
        if not rows:  # a family this run skipped (--skip)
            continue
        grid = {}
        for e in EXPERTS:
            for t in TOKENS_PER_EXPERT:
                ratios = []
                for hidden, ffn in EXPERT_SHAPES:
                    for proj in ("up", "down"):
                        sel = {r["tokens_per_expert"]: r["tflops"] for r in rows
                               if r["experts"] == e and r["hidden"] == hidden and r["proj"] == proj}
                        if t in sel and TOKENS_PER_EXPERT[-1] in sel:
                            ratios.append(sel[t] / sel[TOKENS_PER_EXPERT[-1]])
                grid[(e, t)] = statistics.median(ratios)
        env = _box_max(grid, (EXPERTS, TOKENS_PER_EXPERT))
        table[key] = [[round(min(1.0, env[(e, t)]), 4) for t in TOKENS_PER_EXPERT] for e in EXPERTS]
    if blockwise_raw:
        with open(blockwise_raw) as fh:
            rows = json.load(fh)["blockwise"]
        table["fp8_blockwise_over_tensorwise"] = round(
            statistics.median(r["blockwise_tflops"] / r["tensorwise_tflops"] for r in rows), 4)
    with open(out_path, "w") as fh:
        json.dump(table, fh, indent=None, separators=(",", ":"))
        fh.write("\n")
    print(f"wrote {out_path}: BF16 reference {table['bf16_reference_tflops']} TFLOP/s, "
          f"FP8 {table['fp8_reference_tflops']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="measure on this machine's GPU and write the raw figures here")
    ap.add_argument("--table", nargs=2, metavar=("RAW", "OUT"), help="make the shape table from a raw measurement")
    ap.add_argument("--blockwise", action="store_true",
                    help="measure block-scaled against per-tensor FP8 GEMMs only (written to --out)")
    ap.add_argument("--blockwise-raw", help="with --table: a --blockwise measurement to add to the table")
    ap.add_argument("--skip", default="", help="comma list of families to skip: bf16,fp8,grouped,grouped_fp8")
    args = ap.parse_args()
    if args.table:
        make_table(*args.table, blockwise_raw=args.blockwise_raw)
        return
    if not args.out:
        ap.error("give --out FILE (measure) or --table RAW OUT")
    import torch

    skip = set(filter(None, args.skip.split(",")))
    if args.blockwise:
        props = torch.cuda.get_device_properties(0)
        rows = blockwise(torch)
        ratios = sorted(r["blockwise_tflops"] / r["tensorwise_tflops"] for r in rows)
        print(f"{props.name}: block-scaled / per-tensor FP8 over {len(rows)} shapes: median "
              f"{statistics.median(ratios):.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}")
        with open(args.out, "w") as fh:
            json.dump({"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
                       "date": time.strftime("%Y-%m-%d"), "blockwise": rows}, fh, indent=1)
        return
    props = torch.cuda.get_device_properties(0)
    result = {
        "device": props.name, "sms": props.multi_processor_count,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d"), "host": platform.node(),
    }
    t0 = time.time()
    result["copy_tbps"] = copy_bw(torch)
    print(f"{props.name}: device-to-device copy {result['copy_tbps']:.2f} TB/s", flush=True)
    for fam, fp8 in (("bf16", False), ("fp8", True)):
        if fam in skip:
            continue
        rows = dense(torch, fp8)
        result[fam] = rows
        best = max(r["tflops"] for r in rows)
        print(f"{fam}: {len(rows)} shapes, best {best:.0f} TFLOP/s ({time.time() - t0:.0f} s)", flush=True)
        for r in rows:
            if r["m"] in (1024, 4096, 16384) and r["n"] == r["k"]:
                print(f"  m={r['m']:>6} n=k={r['n']:>6}: {r['tflops']:7.1f} TFLOP/s ({r['tflops'] / best:.2f})")
    for fam, fp8 in (("grouped", False), ("grouped_fp8", True)):
        if fam in skip:
            continue
        rows = grouped(torch, fp8)
        result[fam] = rows
        print(f"{fam}: {len(rows)} shapes ({time.time() - t0:.0f} s)", flush=True)
        for r in rows:
            if "error" in r:
                print("  grouped GEMM failed:", r["error"])
            elif r["experts"] == 16 and r["proj"] == "up" and r["hidden"] == 4096:
                print(f"  h={r['hidden']} f={r['ffn']} E=16 tpe={r['tokens_per_expert']:>5}: {r['tflops']:7.1f} TFLOP/s")
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
