"""Where the time of each TensorRT-LLM offline row goes, as the model predicts it, next to what was
measured.

    python tests/validation/offline_breakdown.py [ID-SUBSTRING ...] [--worst N]

For the offline throughput rows of serving_runs.yaml (all, those whose id contains one of the
substrings, or the N held rows with the largest |error|) it prints one line per row: measured and
predicted output tokens/s and the error (bundled knobs, as `validate_serving.predict_run`), the
engine trtllm-bench builds (max_batch_size, max_num_tokens), the KV cache per GPU in GiB and in
64-token blocks, the blocks one request reserves at admission, the concurrency the engine holds, the
waves of the finite run, and the mean decode step (TPOT, prefill share included) split into GEMMs,
attention, memory-bound kernels, logits, TP all-reduce and host work, in ms and in % of the step.

No fit, no I/O beyond the YAML: a diagnostic for the outliers (`--worst`) against their siblings.

    python tests/validation/offline_breakdown.py --attention-by-tp

prints instead, per fitted GPU type and TP degree, the `serve_attention_hbm` that fits that TP
degree's held rows alone best (GEMMs and host work at the bundled values; the fit's |log error| loss
on ATTENTION_GRID): the split the README's "The outliers, row by row" reports (~40 s).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_serving import (  # noqa: E402
    FITTED_GPUS,
    _pool,
    fit_loss,
    load_runs,
    num_requests,
    offline_engine,
    predict_run,
)

from autoshard.costmodel.serve.config import HOST_US_PER_SEQ  # noqa: E402
from autoshard.costmodel.serve.predict import predict_serve, request_kv_tokens  # noqa: E402
from autoshard.units import GIB  # noqa: E402

KINDS = (
    ("gemm", "gemm_s"), ("attn", "attention_s"), ("elem", "elementwise_s"), ("logit", "logits_s"),
    ("tp", "tp_comm_s"), ("host", "host_s"),
)


def row_breakdown(run: dict) -> dict:
    """One offline row: its checked prediction and the engine behind it."""
    result = predict_run(run)
    model, pool, job, cfg = offline_engine(run)
    pred = predict_serve(model, pool, job, cfg)
    mem = pred.memory
    block = mem.kv_block_tokens or 1
    requests = num_requests(run)
    return dict(
        result=result,
        max_batch_size=cfg.max_num_seqs,
        max_num_tokens=cfg.max_num_batched_tokens,
        kv_gib=mem.kv_cache_bytes / GIB,
        kv_blocks=mem.kv_cache_tokens // block,
        request_blocks=request_kv_tokens(mem, job.input_len + job.output_len) // block,
        concurrency=pred.concurrency,
        waves=math.ceil(requests / pred.concurrency) if requests else None,
        tpot_s=pred.tpot_s,
        decode={name: getattr(pred.decode, attr) for name, attr in KINDS},
    )


ATTENTION_GRID = tuple(round(0.4 + 0.1 * i, 1) for i in range(9))
"""Trial values of `serve_attention_hbm` for `attention_by_tp` (0.4 .. 1.2)."""


def attention_by_tp(gpu: str, tp: int) -> tuple[float, float, int] | None:
    """(best serve_attention_hbm, its loss, rows) for the held offline rows of one GPU type and TP
    degree, the other knobs at the bundled cluster's values; None without such rows."""
    runs = [r for r in load_runs() if r["tp"] == tp and r["cluster"] in FITTED_GPUS[gpu]]
    rows = [r for r in runs if predict_run(r).held]
    if not rows:
        return None
    gemm = _pool(rows[0]["cluster"], tp).gpu.efficiency.serve_gemm
    loss, best = min(
        (fit_loss([predict_run(r, (HOST_US_PER_SEQ, gemm, a)) for r in rows]), a) for a in ATTENTION_GRID
    )
    return best, loss, len(rows)


def format_row(b: dict) -> str:
    r = b["result"]
    mark = " " if r.held else "*"
    step = sum(b["decode"].values())
    split = " ".join(f"{k} {1e3 * v:6.1f} ({100 * v / step:2.0f}%)" for k, v in b["decode"].items())
    waves = f"{b['waves']:3d}" if b["waves"] is not None else "  -"
    return (
        f"{r.id:52s}{mark} {r.measured:9.1f} {r.predicted:9.1f} {100 * r.error:+6.1f}% "
        f"bs {b['max_batch_size']:4d} tok {b['max_num_tokens']:5d} KV {b['kv_gib']:5.1f} GiB "
        f"{b['kv_blocks']:6d} blk /{b['request_blocks']:4d} = {b['concurrency']:4d} x{waves} "
        f"TPOT {1e3 * b['tpot_s']:7.1f} ms: {split}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ids", nargs="*", help="print the rows whose id contains one of these")
    parser.add_argument("--worst", type=int, default=0, help="print the N held rows with the largest |error|")
    parser.add_argument(
        "--attention-by-tp", action="store_true", help="the serve_attention_hbm each TP degree's rows fit"
    )
    args = parser.parse_args(argv)
    if args.attention_by_tp:
        print("serve_attention_hbm fitted on one TP degree's held rows (rows, loss)")
        for gpu in FITTED_GPUS:
            cells = []
            for tp in (1, 2, 4, 8):
                fit = attention_by_tp(gpu, tp)
                cells.append(f"TP{tp} " + (f"{fit[0]:.1f} ({fit[2]}, {fit[1]:.3f})" if fit else "-"))
            print(f"{gpu:16s} " + " | ".join(cells))
        return 0
    runs = [r for r in load_runs() if not args.ids or any(s in r["id"] for s in args.ids)]
    rows = [row_breakdown(r) for r in runs]
    if args.worst:
        rows = sorted((b for b in rows if b["result"].held), key=lambda b: -abs(b["result"].error))
        rows = rows[: args.worst]
    print(
        f"{'row (* not held)':53s} measured predicted  error  engine, KV cache, "
        "blocks per request = concurrency x waves, mean decode step (ms, % of step)"
    )
    for b in rows:
        print(format_row(b))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
