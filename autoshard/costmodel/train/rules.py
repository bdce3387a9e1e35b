"""Start-up rules of Megatron-LM / Megatron-Core that a training configuration must keep beyond its parallel
degrees (`autoshard.parallel.check_dims`): a plan that breaks one is a command Megatron stops at start-up
or on its first step, so the search prunes it, `evaluate` and `--from-megatron` refuse it (exit 2) and
`solve` refuses such pins. Each rule cites where Megatron-Core raises (megatron/core at d98e8a64, the
commit autoshard's flag table is copied from); each problem names the fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoshard.costmodel.train.types import TrainConfig
from autoshard.parallel import Fp8Recipe
from autoshard.specs import ClusterSpec, LinkKind, ModelSpec, Precision
from autoshard.specs.layers import AttentionKind

__all__ = ["recompute_module_problems", "config_problems", "check_config", "flex_dispatcher_problem", "FLEX_LINKS",
           "fp8_recipe_problem"]

FLEX_LINKS = (LinkKind.NVLINK, LinkKind.NVLINK_SWITCH)
"""Where the flex dispatcher runs: its backends (DeepEP, HybridEP) are NVIDIA libraries that move tokens
over NVLink inside the node (DeepEP needs NVLink for its intranode kernels; Megatron imports `deep_ep`
and raises "DeepEP is not installed" without it: moe/fused_a2a.py, token_dispatcher.py). ROCm has its
own forks, not what upstream Megatron-LM loads, and PCIe nodes have no NVLink."""

_NO_BLOCK_SCALING = ("ada", "ampere", "volta")
"""GPU generations whose FP8 GEMMs cannot take Transformer Engine's blockwise recipe (it needs compute
capability 9.0 and up and raises on older GPUs at the first FP8 step). A GPU whose name gives no known
generation (a cluster file naming it as nvidia-smi does) is not refused on a guess."""


def flex_dispatcher_problem(cluster: ClusterSpec) -> str | None:
    """Why the flex (DeepEP/HybridEP) dispatcher cannot run on this cluster, or None."""
    off = sorted({f"{p.gpu.name} ({p.node.intra_node_link.value})" for p in cluster.pools
                  if p.node.intra_node_link not in FLEX_LINKS})
    if not off:
        return None
    return (f"the flex dispatcher (DeepEP/HybridEP) needs NVIDIA GPUs on NVLink, the cluster has {', '.join(off)}: "
            "use alltoall or allgather")


def fp8_recipe_problem(cluster: ClusterSpec, recipe: Fp8Recipe) -> str | None:
    """Why this FP8 recipe cannot run on the cluster's GPUs, or None (mxfp8 is checked with the search's
    default recipe: Blackwell only)."""
    from autoshard.costmodel.band_table import gpu_generation

    if recipe is not Fp8Recipe.BLOCKWISE:
        return None
    off = sorted({p.gpu.name for p in cluster.pools if gpu_generation(p.gpu.name) in _NO_BLOCK_SCALING})
    if not off:
        return None
    return (f"--fp8-recipe blockwise needs compute capability 9.0 or newer (Hopper, Blackwell), the cluster has "
            f"{', '.join(off)}: use delayed or tensorwise")


def recompute_module_problems(model: ModelSpec, modules: Sequence[str], precision: Precision,
                              recipe: Fp8Recipe) -> list[str]:
    """What TransformerConfig.__post_init__ refuses of these --recompute-modules for this model."""
    problems = []
    if "moe_act" in modules and model.moe is None:
        # the emitter writes --moe-grouped-gemm for MoE models only (transformer_config.py: "moe_act in
        # recompute_modules is only supported with moe_grouped_gemm")
        problems.append(f"--recompute-modules moe_act needs experts (grouped GEMM); {model.name} is dense: drop it")
    if "mla_up_proj" in modules and model.attention is not AttentionKind.MLA:
        problems.append(f"--recompute-modules mla_up_proj needs multi-latent attention, which {model.name} does not "
                        "have: drop it")
    if precision is Precision.FP8 and recipe is Fp8Recipe.DELAYED and {"moe_act", "layernorm"} & set(modules):
        problems.append("FP8's delayed-scaling recipe does not support moe_act or layernorm recompute (Megatron-Core "
                        "refuses it): use --fp8-recipe tensorwise or blockwise, or drop those modules")
    return problems


def config_problems(model: ModelSpec, cfg: TrainConfig) -> list[tuple[str, str]]:
    """The rules a whole training configuration breaks, as (reason, message): the reason is the search's
    prune reason, the message names the numbers and the fix. Empty: Megatron starts it."""
    problems = [("recompute modules Megatron-Core refuses", m)
                for m in recompute_module_problems(model, cfg.recompute_modules, cfg.precision, cfg.fp8_recipe)]
    tp, cp = cfg.dims.tp, cfg.dims.cp
    if model.moe is not None and tp > 1 and not cfg.sp:
        # moe_layer.py: raises in training when MoE and tensor parallelism run without sequence parallelism
        problems.append(("MoE with TP > 1 needs sequence parallelism",
                         f"an MoE model with TP {tp} needs sequence parallelism (Megatron-Core's MoE layer raises "
                         "without it in training): keep sequence parallelism on, or TP 1"))
    if cfg.sp and (cfg.seq_len // cp) % tp:
        # the sequence-parallel scatter splits each CP rank's tokens over TP (tensor_parallel/mappings.py)
        problems.append(("sequence length not divisible by CP x TP",
                         f"sequence parallelism splits the {cfg.seq_len // cp} tokens of a CP rank over TP {tp}: "
                         f"needs a sequence length divisible by CP x TP = {cp * tp}"))
    if cfg.tp_comm_overlap and not cfg.sp:
        # arguments.py asserts sequence parallelism with --tp-comm-overlap (and turns it off at TP 1)
        problems.append(("TP communication overlap needs sequence parallelism",
                         "--tp-comm-overlap needs sequence parallelism, which Megatron-LM turns off at TP 1: add "
                         "--sequence-parallel with TP > 1, or drop the overlap"))
    if cfg.optimizer_moments_bf16 and cfg.zero_stage == 0:
        # megatron/core/optimizer: "--use-precision-aware-optimizer only supported with distributed optimizer"
        problems.append(("BF16 Adam moments need the distributed optimizer",
                         "BF16 Adam moments (--use-precision-aware-optimizer) need the distributed optimizer: "
                         "ZeRO-1 or more"))
    return problems


def check_config(model: ModelSpec, cfg: TrainConfig, *, source: str, cluster: ClusterSpec | None = None) -> None:
    """SpecError (exit 2) naming every rule of `check_dims` and `config_problems` the configuration breaks, and
    with `cluster` the dispatcher and FP8 recipe its GPUs cannot run."""
    from autoshard.errors import SpecError
    from autoshard.parallel import MoeDispatcher, check_dims

    problems = check_dims(cfg.dims, model, seq_len=cfg.seq_len, precision=cfg.precision)
    problems += [message for _, message in config_problems(model, cfg)]
    if cluster is not None and model.moe is not None and cfg.moe_dispatcher is MoeDispatcher.FLEX:
        problems += [p for p in (flex_dispatcher_problem(cluster),) if p]
    if cluster is not None and cfg.precision is Precision.FP8:
        problems += [p for p in (fp8_recipe_problem(cluster, cfg.fp8_recipe),) if p]
    if problems:
        raise SpecError(f"Megatron-LM would refuse it at start-up: {'; '.join(problems)}", source=source)
