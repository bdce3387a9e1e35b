"""Megatron-LM flags -> plan facts: parallel dims, precision, MoE dispatcher, FP8 recipe, recompute,
ZeRO stage, virtual pipeline size and layer layout, each with Megatron-LM's default when the flag is
absent and a warning (on the FlagReader) where autoshard reads a flag approximately.
"""

from __future__ import annotations

from autoshard.costmodel.train.types import Stage
from autoshard.emit.megatron.layout import LayoutFlags, layout_stages, parse_layout, predict_layout
from autoshard.emit.megatron.model_args import FlagReader
from autoshard.errors import SpecError
from autoshard.parallel import CrossEntropyImpl, Fp8Recipe, MoeDispatcher, ParallelDims, Recompute
from autoshard.specs.job import Precision
from autoshard.specs.model import ModelSpec

__all__ = ["dims", "precision", "dispatcher", "fp8_recipe", "cross_entropy", "recompute", "zero_stage", "vpp",
           "layout_flags", "layout"]


def dims(tp: int, pp: int, cp: int, ep: int, etp: int | None, vpp: int, world: int) -> ParallelDims:
    model_parallel = tp * pp * cp
    if world % model_parallel:
        raise SpecError(
            f"world size {world} is not a multiple of TP x PP x CP = {tp} x {pp} x {cp}: "
            "change the parallel sizes or the GPU count"
        )
    try:
        return ParallelDims(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, dp=world // model_parallel)
    except ValueError as exc:
        hint = ""
        if "expert grid" in str(exc):
            dense = world // (pp)
            ok = [e for e in (1, 2, 4, 8) if e != (etp or tp) and dense % (e * ep) == 0]
            if ok:
                hint = f"; --expert-tensor-parallel-size {ok[0]} makes it legal (expert TP is independent of TP)"
        raise SpecError(f"{exc}: fix the parallel sizes in the command{hint}") from None


def precision(r: FlagReader) -> Precision:
    if r.on("--fp8-format"):
        return Precision.FP8
    if r.on("--fp4-format"):
        if r.text("--fp4-recipe") == "custom":
            r.warnings.append("--fp4-recipe custom: a custom quantizer is not modeled; predicted as NVFP4")
        return Precision.FP4
    if r.on("--fp16"):
        r.warnings.append("--fp16 is predicted as bf16 (same speed and memory)")
    elif not r.on("--bf16"):
        r.warnings.append(
            "neither --bf16 nor --fp16: Megatron-LM trains in fp32, which is not modeled; predicted as bf16"
        )
    return Precision.BF16


def dispatcher(r: FlagReader) -> MoeDispatcher:
    if r.on("--moe-enable-deepep"):
        return MoeDispatcher.FLEX
    kind = r.text("--moe-token-dispatcher-type", "allgather")
    try:
        return MoeDispatcher(kind)
    except ValueError:
        r.warnings.append(f"--moe-token-dispatcher-type '{kind}' is not allgather, alltoall or flex; read as allgather")
        return MoeDispatcher.ALLGATHER


def fp8_recipe(r: FlagReader) -> Fp8Recipe:
    recipe = r.text("--fp8-recipe", "delayed")
    try:
        return Fp8Recipe(recipe)
    except ValueError:
        r.warnings.append(f"--fp8-recipe {recipe} is not delayed, tensorwise, blockwise or mxfp8; read as delayed")
        return Fp8Recipe.DELAYED


def cross_entropy(r: FlagReader) -> CrossEntropyImpl:
    """The loss: Megatron-LM's unfused default, or --cross-entropy-loss-fusion with
    --cross-entropy-fusion-impl native (its default) or te."""
    if not r.on("--cross-entropy-loss-fusion"):
        if r.on("--cross-entropy-fusion-impl"):
            r.warnings.append("--cross-entropy-fusion-impl has no effect without --cross-entropy-loss-fusion")
        return CrossEntropyImpl.UNFUSED
    impl = r.text("--cross-entropy-fusion-impl", "native")
    if impl not in ("native", "te"):
        r.warnings.append(f"--cross-entropy-fusion-impl {impl} is not native or te; read as native")
        return CrossEntropyImpl.NATIVE
    return CrossEntropyImpl(impl)


def recompute(r: FlagReader) -> tuple[Recompute, int, tuple[str, ...]]:
    """(base mode, block-recomputed layers per stage, selective modules)."""
    from autoshard.costmodel.train.recompute import RECOMPUTE_MODULES

    granularity = r.text("--recompute-granularity")
    if r.on("--recompute-activations"):
        granularity = "selective"
    method = r.text("--recompute-method")
    given = r.flags.get("--recompute-modules") or []
    unknown = [m for m in given if m not in RECOMPUTE_MODULES]
    if unknown:
        r.warnings.append(f"--recompute-modules {' '.join(unknown)}: not modules Megatron-Core recomputes "
                          f"({', '.join(RECOMPUTE_MODULES)}); ignored")
    modules = tuple(dict.fromkeys(m for m in given if m in RECOMPUTE_MODULES))
    if granularity == "selective":
        if method is not None or r.on("--recompute-num-layers"):
            r.warnings.append(
                "--recompute-method/--recompute-num-layers are rejected with selective recompute"
            )
        if modules == ("core_attn",):
            modules = ()  # Megatron's default
        return Recompute.SELECTIVE, 0, modules
    if modules:
        r.warnings.append("--recompute-modules applies only with --recompute-granularity selective; ignored")
    if granularity == "full":
        n = r.int("--recompute-num-layers", 1) or 1
        if method == "block":
            return Recompute.NONE, n, ()
        if method != "uniform":
            r.warnings.append(
                "--recompute-granularity full needs --recompute-method uniform|block; read as uniform"
            )
        return Recompute.FULL, 0, ()
    if granularity is not None:
        r.warnings.append(f"--recompute-granularity '{granularity}' is not full or selective; ignored")
    return Recompute.NONE, 0, ()


def zero_stage(r: FlagReader) -> int:
    if r.on("--use-megatron-fsdp"):
        strategy = r.text("--data-parallel-sharding-strategy", "optim_grads_params")
        stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages:
            r.warnings.append(
                f"--data-parallel-sharding-strategy '{strategy}' unknown; read as optim_grads_params"
            )
        return stages.get(strategy or "", 3)
    if r.on("--use-torch-fsdp2"):
        r.warnings.append("--use-torch-fsdp2 is predicted as ZeRO-3 (fully sharded parameters)")
        return 3
    return 1 if r.on("--use-distributed-optimizer") else 0


def grad_reduce_fp32(r: FlagReader) -> bool:
    """Megatron-LM reduces (and keeps) BF16-run gradients in FP32 unless --grad-reduce-in-bf16."""
    return not r.on("--grad-reduce-in-bf16")


def full_cuda_graph(r: FlagReader) -> bool:
    """The whole training step in CUDA graphs (TrainConfig.full_cuda_graph): --cuda-graph-impl full_iteration
    (Megatron-LM at d98e8a64), or the deprecated --cuda-graph-scope (or --cuda-graph-modules) full_iteration with
    --cuda-graph-impl none, local or none given, which Megatron-Core migrates to it (cuda_graph_config.py
    validate_deprecated_cuda_graph_modules_migration_inputs; the MoE recipes' spelling at 7b9593be8e) and refuses
    beside transformer_engine. Partial graphs (attn, moe_router, ...) leave the routed experts out."""
    impl = r.text("--cuda-graph-impl", "none")
    scopes = [*r.flags.get("--cuda-graph-scope", []), *r.flags.get("--cuda-graph-modules", [])]
    if "full_iteration" in scopes and impl not in ("none", "local", "full_iteration"):
        raise SpecError(f"--cuda-graph-scope full_iteration cannot be combined with --cuda-graph-impl {impl} "
                        "(Megatron-Core asserts it): use --cuda-graph-impl full_iteration", source=r.source)
    return impl == "full_iteration" or "full_iteration" in scopes


MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")
"""Megatron-LM's argparse choices for --exp-avg-dtype and --exp-avg-sq-dtype."""


def optimizer_moments_bf16(r: FlagReader) -> bool:
    """Adam's moments in 16 bits: --use-precision-aware-optimizer with --exp-avg-dtype and --exp-avg-sq-dtype
    both bf16 or fp16 (Megatron-LM ignores the dtypes without it; fp8 moments are priced as 16-bit)."""
    given = {flag: r.text(flag, "fp32") for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype")}
    for flag, value in given.items():
        if value not in MOMENT_DTYPES:
            raise SpecError(f"{flag} '{value}' is not one of Megatron-LM's choices ({', '.join(MOMENT_DTYPES)}): "
                            "fix the value", source=r.source)
    if r.text("--optimizer", "adam") != "adam":
        if any(v != "fp32" for v in given.values()):
            r.warnings.append("--exp-avg-dtype/--exp-avg-sq-dtype set Adam's moments; "
                              f"--optimizer {r.text('--optimizer')} keeps its FP32 state: read as FP32")
        return False
    if not r.on("--use-precision-aware-optimizer"):
        if any(v != "fp32" for v in given.values()):
            r.warnings.append("--exp-avg-dtype/--exp-avg-sq-dtype need --use-precision-aware-optimizer "
                              "(Megatron-LM keeps FP32 moments without it); read as FP32")
        return False
    if "fp8" in given.values():
        r.warnings.append("FP8 Adam moments are predicted as 16-bit moments (2 bytes each)")
    small = {v != "fp32" for v in given.values()}
    if small == {True, False}:
        r.warnings.append("one Adam moment in 16 bits and one in FP32: predicted as FP32 moments")
    return small == {True}


def vpp(r: FlagReader, num_layers: int, pp: int) -> int:
    given = [
        f
        for f in (
            "--pipeline-model-parallel-layout",
            "--num-virtual-stages-per-pipeline-rank",
            "--num-layers-per-virtual-pipeline-stage",
        )
        if r.on(f)
    ]
    if len(given) > 1:
        r.warnings.append(
            f"{' and '.join(given)} cannot be combined (Megatron-LM rejects it); read {given[0]}"
        )
    if r.on("--pipeline-model-parallel-layout"):
        return 0  # decided by the layout
    if r.on("--num-virtual-stages-per-pipeline-rank"):
        return r.int("--num-virtual-stages-per-pipeline-rank", 1) or 1
    per_chunk = r.int("--num-layers-per-virtual-pipeline-stage")
    if per_chunk:
        total = (
            num_layers
            + r.on("--account-for-embedding-in-pipeline-split")
            + r.on("--account-for-loss-in-pipeline-split")
        )
        if total % pp or (total // pp) % per_chunk:
            raise SpecError(
                f"--num-layers-per-virtual-pipeline-stage {per_chunk} does not divide the {total // pp} "
                f"layers per pipeline rank ({total} layers / PP {pp})"
            )
        return max(1, total // pp // per_chunk)
    return 1


def layout_flags(r: FlagReader) -> LayoutFlags:
    return LayoutFlags(
        layout=r.text("--pipeline-model-parallel-layout"),
        first=r.int("--decoder-first-pipeline-num-layers"),
        last=r.int("--decoder-last-pipeline-num-layers"),
        account_embedding=r.on("--account-for-embedding-in-pipeline-split"),
        account_loss=r.on("--account-for-loss-in-pipeline-split"),
    )


def layout(r: FlagReader, model: ModelSpec, pp: int, vpp: int) -> tuple[list[Stage] | None, int]:
    flags = layout_flags(r)
    if flags.layout is not None:
        stages, warns = parse_layout(flags.layout, num_layers=model.num_layers, pp=pp,
                                     mtp_num_layers=model.mtp_num_layers)
        r.warnings.extend(warns)
        vpp = 1
    if flags.given():
        stages_t, vpp = layout_stages(model, pp=pp, vpp=vpp, flags=flags)
        return list(stages_t), vpp
    chunks = pp * vpp
    if model.num_layers % chunks:
        predicted = predict_layout(model, pp=pp, vpp=vpp)
        r.warnings.append(
            f"--num-layers {model.num_layers} does not split evenly over PP {pp} x VPP {vpp}: Megatron-LM "
            f"refuses it without a layout flag; predicted with {predicted.describe()}"
        )
        stages_t, vpp = layout_stages(model, pp=pp, vpp=vpp, flags=predicted)
        return list(stages_t), vpp
    return None, vpp

