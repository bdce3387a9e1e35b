"""Measure one GPU's fused causal attention in training (forward and backward), to check the kernel
knobs the training step takes for its generation (autoshard/costmodel/efficiency.KERNEL_TRAIN_KNOBS).

Needs PyTorch and a CUDA GPU (the planner never does). On the GPU:

    python tests/validation/attention_bench.py --out attention_h100.json

Times torch.nn.functional.scaled_dot_product_attention, causal, BF16, head dim 128, on each backend
PyTorch has for it here (cuDNN fused attention, what Transformer Engine runs on Hopper; FlashAttention-2),
over sequence lengths 1k-16k at a fixed 16k tokens per call (batch = 16,384 / s, 16 heads), with CUDA
events after a warm-up, and prints TFLOP/s by the causal-halved count 2 x 2 x b x h x s^2 x d / 2 for
the forward and 2.5x that for the backward, and the blend 3.5 / (1/fwd + 2.5/bwd) a training step runs."""

from __future__ import annotations

import argparse
import json
import time

SEQ = (1024, 2048, 4096, 8192, 16384)
HEADS, HEAD_DIM, TOKENS = 16, 128, 16384


def _time_s(torch, fn) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(10):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3 / 10)
    return best


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    result = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
              "date": time.strftime("%Y-%m-%d"), "heads": HEADS, "head_dim": HEAD_DIM, "rows": []}
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION}
    for name, backend in backends.items():
        for s in SEQ:
            b = TOKENS // s
            q, k, v = (torch.randn(b, HEADS, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            flops_fwd = 4.0 * b * HEADS * s * s * HEAD_DIM / 2
            try:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    grad = torch.randn_like(out)
                    fwd = _time_s(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

                    def both():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        o.backward(grad)
                    total = _time_s(torch, both)
            except RuntimeError as err:
                result["rows"].append({"backend": name, "seq": s, "error": str(err)[:200]})
                print(f"{name} s={s}: {str(err)[:120]}")
                continue
            bwd = max(total - fwd, 1e-9)
            f_tf, b_tf = flops_fwd / fwd / 1e12, 2.5 * flops_fwd / bwd / 1e12
            blend = 3.5 / (1 / f_tf + 2.5 / b_tf)
            result["rows"].append({"backend": name, "seq": s, "fwd_tflops": f_tf, "bwd_tflops": b_tf,
                                   "blend_tflops": blend})
            print(f"{name:6s} s={s:>6}: forward {f_tf:6.0f}  backward {b_tf:6.0f}  blend {blend:6.0f} TFLOP/s", flush=True)
            del q, k, v
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
