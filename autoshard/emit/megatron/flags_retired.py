"""Megatron-LM flags that changed (at the commit in `flags.SOURCE_COMMIT`): still parsed but deprecated
or rejected by validate_args (DEPRECATED), or gone from the parser (REMOVED), each with what to write
instead. The command parser turns them into warnings that name the fix; the emitter never writes them.
"""

from __future__ import annotations

__all__ = ["DEPRECATED", "REMOVED"]


# Still parsed, but deprecated or rejected by validate_args: what to write instead.
DEPRECATED: dict[str, str] = {
    "--batch-size": "hard error: use --micro-batch-size",
    "--checkpoint-activations": (
        "exits: use --recompute-activations or --recompute-granularity/--recompute-method"
    ),
    "--ckpt-fully-parallel-save": (
        "no-op: parallel save is default, use --no-ckpt-fully-parallel-save to disable"
    ),
    "--cuda-graph-scope": "use --cuda-graph-modules",
    "--disable-msc": "no-op: MSC is off by default (--enable-msc to opt in)",
    "--dist-ckpt-format": "no-op: use --ckpt-format",
    "--enable-cuda-graph": "use --cuda-graph-impl local",
    "--external-cuda-graph": "use --cuda-graph-impl transformer_engine",
    "--fp8-interval": "ignored since TE 1.8",
    "--hybrid-override-pattern": "use --hybrid-layer-pattern",
    "--model-parallel-size": "hard error: use --tensor-model-parallel-size",
    "--moe-deepep-num-sms": "use --moe-flex-dispatcher-num-sms",
    "--moe-hybridep-num-sms": "use --moe-flex-dispatcher-num-sms",
    "--mtp-hybrid-override-pattern": "legacy; use --hybrid-layer-pattern with / separators",
    "--no-position-embedding": "use --position-embedding-type",
    "--no-tp-comm-split-ag": "deprecated since TransformerEngine 1.6",
    "--no-tp-comm-split-rs": "deprecated since TransformerEngine 1.6",
    "--no-weight-decay-cond-type": "use --apply-wd-to-qk-layernorm",
    "--rampup-batch-size": (
        "deprecated in help text: use --step-batch-size-schedule (mutually exclusive with "
        "--global-batch-size)"
    ),
    "--recompute-activations": "still accepted; equivalent to --recompute-granularity selective",
    "--use-dist-ckpt": "no-op: use --ckpt-format",
    "--use-mcore-models": "no-op (mcore models are the only models now)",
    "--use-rotary-position-embeddings": "use --position-embedding-type rope",
    "--warmup": "hard error: use --lr-warmup-fraction",
}


# Not flags any more (argparse rejects them): what replaced them.
REMOVED: dict[str, str] = {
    "--async-tensor-model-parallel-allreduce": "not in current parser",
    "--check-for-nan-in-loss-and-grad": (
        "positive spelling does not exist (it is on by default); use --no-check-for-nan-in-loss-and-grad "
        "to disable"
    ),
    "--encoder-pipeline-model-parallel-size": (
        "removed 2025-07 (encoder PP support dropped, commit b600e38d7b)"
    ),
    "--encoder-tensor-model-parallel-size": "removed 2025-07 (commit b600e38d7b)",
    "--fp4": "no such flag: use --fp4-format e2m1 (dest is args.fp4)",
    "--fp8": "no such flag: use --fp8-format {e4m3,hybrid} (dest is args.fp8)",
    "--moe-extended-tp": "not in current parser; use --expert-tensor-parallel-size",
    "--moe-router-topk-limited-devices": "removed; use --moe-router-num-groups / --moe-router-group-topk",
    "--no-async-tensor-model-parallel-allreduce": "not in current parser",
    "--overlap-p2p-communication": (
        "positive spelling does not exist (on by default with VPP); --no-overlap-p2p-communication disables"
    ),
    "--pipeline-model-parallel-split-rank": (
        "removed 2025-07 (commit b600e38d7b); use --pipeline-model-parallel-layout / "
        "--decoder-first/last-pipeline-num-layers"
    ),
    "--standalone-embedding-stage": (
        "removed 2025-02; use --account-for-embedding-in-pipeline-split or --pipeline-model-parallel-layout"
    ),
    "--use-legacy-models": "removed 2026-05 (legacy models gone)",
}

