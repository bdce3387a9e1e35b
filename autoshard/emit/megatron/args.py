"""Plan -> every `pretrain_gpt.py` flag of its Megatron-LM launch (`megatron_args`), in launch order.

Every number comes from the plan, every flag name from Megatron-LM's parser as it is today
(`emit/megatron/flags.py`); what Megatron-LM cannot express exactly is listed by
`autoshard.emit.megatron.script.megatron_notes` instead of being silently changed.

How plan facts map to flags (Megatron-LM at the commit in `flags.SOURCE_COMMIT`, `emit/megatron/flags.py`):

- Layer layout: Megatron's default puts the embedding on the first model chunk, the loss on the last
  and num_layers / (PP x VPP) decoder layers on every chunk. A plan with exactly that layout gets the
  plain flags (`--num-virtual-stages-per-pipeline-rank` when interleaved); any other layout is written
  as `--pipeline-model-parallel-layout` ("Et*3|t*4|t*4|t*3L": E embedding, t decoder layer, L loss,
  chunks split by `|`), which also sets VPP = chunks / PP, so no other VPP flag goes with it.
- Recompute: selective -> `--recompute-granularity selective`; full -> full/uniform/1 (every layer);
  per-stage full recompute of the first N decoder layers (`Plan.recompute_num_layers`) -> full/block/N.
  Megatron's CLI has one granularity, so selective + block-full cannot be combined: block-full wins
  and a note says so.
- ZeRO: 1 -> `--use-distributed-optimizer`; 2 and 3 -> Megatron-FSDP (`--use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads | optim_grads_params --ckpt-format fsdp_dtensor`);
  `--overlap-param-gather` only with a sharded optimizer (it requires one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import autoshard.emit.megatron.flags as megatron_flags
from autoshard.costmodel.train.types import Stage
from autoshard.emit.megatron.layout import LayoutFlags, layout_stages
from autoshard.emit.megatron.network_args import Arg, moe_args, mtp_args, network_args
from autoshard.parallel import CrossEntropyImpl, Fp8Recipe, Recompute
from autoshard.plans.train import Plan, layer_counts
from autoshard.specs.job import Optimizer, Precision
from autoshard.specs.model import ModelSpec

__all__ = ["megatron_args", "pipeline_layout", "layout_flags", "TOKENIZER_TYPE",
           "SCAFFOLDING", "LOGGING"]

# Reads the vocabulary from $TOKENIZER_MODEL; Megatron-LM ignores --vocab-size with it, so none is written.
TOKENIZER_TYPE = "HuggingFaceTokenizer"

# Training hyper-parameters the plan does not decide: sane placeholders the user edits.
SCAFFOLDING: tuple[tuple[str, str | None], ...] = (
    ("--train-iters", "100000"),
    ("--lr", "3.0e-4"),
    ("--min-lr", "3.0e-5"),
    ("--lr-decay-style", "cosine"),
    ("--lr-warmup-fraction", "0.01"),
    ("--weight-decay", "0.1"),
    ("--clip-grad", "1.0"),
    ("--attention-dropout", "0.0"),
    ("--hidden-dropout", "0.0"),
)
LOGGING: tuple[tuple[str, str | None], ...] = (
    ("--data-path", "$DATA_PATH"),
    ("--split", "99,1,0"),
    ("--save", "$CKPT_DIR"),
    ("--load", "$CKPT_DIR"),
    ("--save-interval", "1000"),
    ("--log-interval", "10"),
    ("--log-throughput", None),
    ("--eval-interval", "1000"),
    ("--eval-iters", "10"),
    ("--transformer-impl", "transformer_engine"),
    ("--attention-backend", "auto"),
)



# ----------------------------------------------------------------------------- plan facts


def pipeline_layout(model: ModelSpec, stages: Sequence[Stage]) -> str | None:
    """`--pipeline-model-parallel-layout` for `stages`, or None when they are Megatron's default split
    (embedding on the first chunk, loss on the last, the same number of decoder layers on every chunk)."""
    counts = [layer_counts(model, s) for s in stages]
    decoders = [c[0] for c in counts]
    default = (
        counts[0][1]
        and counts[-1][2]
        and not any(c[1] for c in counts[1:])
        and not any(c[2] for c in counts[:-1])
        and len(set(decoders)) == 1
    )
    if default:
        return None
    parts = []
    mtp = "m" * model.mtp_num_layers
    for dec, emb, out in counts:
        body = "t" if dec == 1 else f"t*{dec}" if dec else ""
        parts.append(("E" if emb else "") + body + (mtp + "L" if out else ""))
    return _compress_stages(parts)


def layout_flags(model: ModelSpec, stages: Sequence[Stage], pp: int) -> list[Arg]:
    """The simplest Megatron-LM flags that build exactly `stages`: none for the default even split,
    else --account-for-embedding/loss-in-pipeline-split, else --decoder-first/last-pipeline-num-layers,
    else --pipeline-model-parallel-layout (which also sets VPP)."""
    if len(stages) <= 1:
        return []
    vpp = len(stages) // pp
    want = [(s.start, s.stop) for s in stages]
    counts = [layer_counts(model, s)[0] for s in stages]
    first = sum(counts[k] for k in range(0, len(stages), pp))
    last = sum(counts[k] for k in range(pp - 1, len(stages), pp))
    tries = [LayoutFlags(), LayoutFlags(account_embedding=True, account_loss=True),
             LayoutFlags(account_loss=True), LayoutFlags(account_embedding=True)]
    if pp > 1:
        tries += [LayoutFlags(first=first, last=last), LayoutFlags(first=first), LayoutFlags(last=last)]
    for flags in tries:
        try:
            got, got_vpp = layout_stages(model, pp=pp, vpp=vpp, flags=flags)
        except Exception:  # noqa: BLE001 - this form cannot say it; try the next
            continue
        if got_vpp == vpp and [(s.start, s.stop) for s in got] == want:
            if not flags.given() and vpp > 1:
                return [("--num-virtual-stages-per-pipeline-rank", str(vpp))]
            args = flags.args()
            if flags.given() and vpp > 1:
                args.append(("--num-virtual-stages-per-pipeline-rank", str(vpp)))
            return args
    layout = pipeline_layout(model, stages)
    assert layout is not None
    return [("--pipeline-model-parallel-layout", layout)]


def _compress_stages(parts: list[str]) -> str:
    """Join chunks with `|`, writing a run of 4 or more identical chunks as `(x|)*n,` (Megatron unrolls
    parentheses first, then `x*n`; commas are cosmetic)."""
    out: list[str] = []
    i = 0
    while i < len(parts):
        j = i
        while j + 1 < len(parts) and parts[j + 1] == parts[i]:
            j += 1
        run = j - i + 1
        # A run cannot end the layout: its trailing `|` would open an extra, empty chunk.
        if run >= 4 and j + 1 < len(parts) and parts[i]:
            out.append(f"({parts[i]}|)*{run},")
            i = j + 1
            continue
        out.append(parts[i] + ("|" if i + 1 < len(parts) else ""))
        i += 1
    return "".join(out)


def _init_std(model: ModelSpec) -> str:
    """Small-init standard deviation sqrt(2 / (5 h)) (Nguyen & Salazar 2019, used by GPT-NeoX)."""
    return f"{math.sqrt(2 / (5 * model.hidden_size)):.4f}"


# ----------------------------------------------------------------------------- flags


def _parallel_args(plan: Plan) -> list[Arg]:
    cfg, dims, model = plan.config, plan.config.dims, plan.model
    args: list[Arg] = [
        ("--tensor-model-parallel-size", str(dims.tp)),
        ("--pipeline-model-parallel-size", str(dims.pp)),
        ("--context-parallel-size", str(dims.cp)),
    ]
    if model.moe is not None:
        args += [
            ("--expert-model-parallel-size", str(dims.ep)),
            ("--expert-tensor-parallel-size", str(dims.expert_tp)),
        ]
    if cfg.sp:
        args.append(("--sequence-parallel", None))
    args += layout_flags(model, plan.stages, dims.pp)
    args += [
        ("--micro-batch-size", str(cfg.micro_batch_size)),
        ("--global-batch-size", str(cfg.global_batch_size)),
    ]
    return args


def _recompute_args(plan: Plan) -> list[Arg]:
    block = plan.recompute_num_layers
    if plan.config.recompute is Recompute.FULL:
        return [
            ("--recompute-granularity", "full"),
            ("--recompute-method", "uniform"),
            ("--recompute-num-layers", "1"),
        ]
    if block > 0:
        return [
            ("--recompute-granularity", "full"),
            ("--recompute-method", "block"),
            ("--recompute-num-layers", str(block)),
        ]
    if plan.config.recompute is Recompute.SELECTIVE:
        args: list[Arg] = [("--recompute-granularity", "selective")]
        if plan.config.recompute_modules:
            args.append(("--recompute-modules", " ".join(plan.config.recompute_modules)))
        return args
    return []


def _distributed_args(plan: Plan) -> list[Arg]:
    cfg = plan.config
    args: list[Arg] = []
    if cfg.zero_stage >= 1:
        args.append(("--use-distributed-optimizer", None))
    if cfg.zero_stage >= 2:
        strategy = "optim_grads" if cfg.zero_stage == 2 else "optim_grads_params"
        args += [
            ("--use-megatron-fsdp", None),
            ("--data-parallel-sharding-strategy", strategy),
            ("--ckpt-format", "fsdp_dtensor"),
        ]
    if cfg.overlap_grad_reduce:
        args.append(("--overlap-grad-reduce", None))
        if cfg.zero_stage >= 1:
            args.append(("--overlap-param-gather", None))
    if cfg.tp_comm_overlap and cfg.sp:
        args.append(("--tp-comm-overlap", None))
    if cfg.moe_a2a_overlap:  # the EP all-to-all overlap as Megatron-MoE-ModelZoo's A2A_OVERLAP=1 runs it
        args.append(("--overlap-moe-expert-parallel-comm", None))
        if cfg.moe_a2a_delay_wgrad:
            args.append(("--delay-wgrad-compute", None))
    if not cfg.grad_reduce_fp32:
        args.append(("--grad-reduce-in-bf16", None))
    # a launch read back with a full-iteration graph (plans never choose one); Megatron asserts the NaN check off
    if cfg.full_cuda_graph:
        args += [("--cuda-graph-impl", "full_iteration"), ("--no-check-for-nan-in-loss-and-grad", None)]
    return args


def _precision_args(plan: Plan) -> list[Arg]:
    args: list[Arg] = [("--bf16", None)]
    if plan.config.precision is Precision.FP8:
        recipe = plan.config.fp8_recipe
        args += [("--fp8-format", "e4m3" if recipe is Fp8Recipe.BLOCKWISE else "hybrid"), ("--fp8-recipe", recipe.value)]
        if recipe is Fp8Recipe.DELAYED:
            args += [("--fp8-amax-history-len", "1024"), ("--fp8-amax-compute-algo", "max")]
        if plan.config.fp8_param_gather:
            args.append(("--fp8-param-gather", None))
    elif plan.config.precision is Precision.FP4:
        args += [("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")]
    return args


def _loss_args(plan: Plan) -> list[Arg]:
    """The plan's loss implementation (costmodel.compute.CROSS_ENTROPY_BYTES): native fusion by
    default; Megatron-LM's unfused loss needs no flag."""
    impl = plan.config.cross_entropy
    if impl is CrossEntropyImpl.XENTROPY:
        raise ValueError("cross_entropy 'xentropy' (llm-foundry's loss) is not a Megatron-LM option: use native, te or unfused")
    if impl is CrossEntropyImpl.UNFUSED:
        return []
    args: list[Arg] = [("--cross-entropy-loss-fusion", None)]
    if impl is CrossEntropyImpl.TE:
        args.append(("--cross-entropy-fusion-impl", "te"))
    return args


def _optimizer_args(plan: Plan) -> list[Arg]:
    if plan.config.optimizer is Optimizer.SGD:
        return [("--optimizer", "sgd"), ("--sgd-momentum", "0.9")]
    args: list[Arg] = [("--optimizer", "adam"), ("--adam-beta1", "0.9"), ("--adam-beta2", "0.95")]
    if plan.config.optimizer_moments_bf16:
        args += [("--use-precision-aware-optimizer", None), ("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    return args


def megatron_args(plan: Plan) -> list[Arg]:
    """Every `pretrain_gpt.py` flag of the plan, in launch order: (flag, value or None for a switch)."""
    cfg = plan.config
    args = network_args(plan.model, cfg.seq_len) + moe_args(plan.model, plan) + mtp_args(plan.model)
    args += [("--tokenizer-type", TOKENIZER_TYPE), ("--tokenizer-model", "$TOKENIZER_MODEL")]
    args += _parallel_args(plan) + _recompute_args(plan) + _distributed_args(plan) + _precision_args(plan)
    args += _loss_args(plan) + _optimizer_args(plan) + list(SCAFFOLDING) + [("--init-method-std", _init_std(plan.model))]
    args += list(LOGGING)
    unknown = [f for f, _ in args if f not in megatron_flags.KNOWN]
    assert not unknown, f"emitter wrote flags Megatron-LM does not have: {unknown}"
    return args


