"""Parallel degrees as one frozen value object, with the framework rules that bind them.

Megatron-Core layout: attention/dense layers use TP x CP x DP x PP = world size; MoE expert layers
re-fold the same ranks as ETP x EP x EDP x PP ("MoE parallel folding"), so EP is *not* part of the
dense product and expert DP = world / (ETP * EP * PP).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from autoshard.specs.job import Precision
from autoshard.specs.layers import AttentionKind
from autoshard.specs.model import ModelSpec

__all__ = ["Axis", "Recompute", "MoeDispatcher", "Fp8Recipe", "CrossEntropyImpl", "ParallelDims", "check_dims"]


class Axis(StrEnum):
    """Mesh axes, innermost (fastest-varying rank) first in Megatron's default order tp-cp-ep-dp-pp."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    DP = "dp"
    PP = "pp"


class Recompute(StrEnum):
    """Activation recomputation, cheapest memory last.

    none: keep every activation (fastest, most memory).
    selective: recompute only the attention core (Korthikanti et al. 2022), ~2-4 % extra compute.
    full: keep only each layer's input; re-run the whole forward in backward (+~33 % compute).
    """

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class MoeDispatcher(StrEnum):
    """How MoE tokens reach their experts (Megatron-Core --moe-token-dispatcher-type).

    alltoall: NCCL all-to-all over the EP group.
    allgather: all-gather of every token to every EP rank, then local selection.
    flex: fused DeepEP / HybridEP kernels (--moe-token-dispatcher-type flex, with
    --moe-flex-dispatcher-backend deepep|hybridep), NVLink/RDMA aware.
    """

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"
    FLEX = "flex"


class Fp8Recipe(StrEnum):
    """Transformer Engine FP8 scaling recipe (Megatron-Core --fp8-recipe)."""

    DELAYED = "delayed"
    TENSORWISE = "tensorwise"
    BLOCKWISE = "blockwise"
    MXFP8 = "mxfp8"


class CrossEntropyImpl(StrEnum):
    """How the training loss (cross-entropy over the vocabulary-parallel logits) runs.

    unfused: Megatron-Core's default (tensor_parallel/cross_entropy.py; Megatron-LM since 2020).
    native: --cross-entropy-loss-fusion (fusions/fused_cross_entropy.py, --cross-entropy-fusion-impl native).
    te: --cross-entropy-loss-fusion --cross-entropy-fusion-impl te (Transformer Engine's Triton kernels).
    xentropy: one fused CUDA kernel each way (Apex / flash-attention xentropy: llm-foundry's
    fused_crossentropy loss).
    """

    UNFUSED = "unfused"
    NATIVE = "native"
    TE = "te"
    XENTROPY = "xentropy"


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelDims:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    """Expert tensor parallel size; None means "same as tp" (Megatron's default)."""
    vpp: int = 1
    """Virtual pipeline stages (model chunks) per pipeline rank; 1 = no interleaving."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep", "vpp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.etp is not None and (not isinstance(self.etp, int) or self.etp < 1):
            raise ValueError(f"etp must be a positive integer, got {self.etp!r}")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError("virtual pipeline stages (vpp > 1) need pipeline parallelism (pp > 1)")
        expert_ranks = self.expert_tp * self.ep
        if self.tp * self.cp * self.dp % expert_ranks:
            raise ValueError(
                f"expert grid ETP x EP = {expert_ranks} must divide TP x CP x DP = {self.tp * self.cp * self.dp} "
                "(Megatron folds expert layers onto the same ranks)"
            )

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def model_parallel_size(self) -> int:
        """Ranks that hold one replica of the dense weights."""
        return self.tp * self.cp * self.pp

    @property
    def expert_dp(self) -> int:
        return self.world_size // (self.expert_tp * self.ep * self.pp)

    @property
    def num_stages(self) -> int:
        """Model chunks in the pipeline (pp x vpp)."""
        return self.pp * self.vpp

    def describe(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}"]
        if self.vpp > 1:
            parts.append(f"VPP{self.vpp}")
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"ETP{self.etp}")
        parts.append(f"DP{self.dp}")
        return " ".join(parts)


def check_dims(
    dims: ParallelDims,
    model: ModelSpec,
    *,
    seq_len: int,
    precision: Precision = Precision.BF16,
) -> list[str]:
    """Framework rules (Megatron-LM validate_args / TransformerConfig) that `dims` breaks for `model`.

    Returns human-readable violations, each naming the rule and the fix; empty when legal.
    Layer-to-stage divisibility depends on the layout and is checked where the layout is chosen.
    """
    problems: list[str] = []
    heads = model.num_attention_heads
    if heads % dims.tp:
        problems.append(f"TP {dims.tp} must divide the {heads} attention heads")
    if model.attention is AttentionKind.GQA:
        kv = model.kv_heads
        if kv % dims.tp and dims.tp % kv:
            problems.append(f"TP {dims.tp} and the {kv} KV heads must divide one another")
    if dims.cp > 1 and seq_len % (2 * dims.cp):
        problems.append(f"CP {dims.cp} needs seq_len divisible by 2*CP = {2 * dims.cp}; seq_len is {seq_len}")
    if dims.ep > 1 or (dims.etp is not None and dims.etp != dims.tp):
        if model.moe is None:
            problems.append("expert parallelism (EP/ETP > 1) needs a mixture-of-experts model")
        elif model.moe.num_experts % dims.ep:
            problems.append(f"EP {dims.ep} must divide the {model.moe.num_experts} experts")
    stages = dims.num_stages
    if stages > model.num_layers + 2:
        problems.append(
            f"PP x VPP = {stages} model chunks but the model has only {model.num_layers} decoder layers "
            "(plus embedding and output)"
        )
    if precision.quantized and model.hidden_size % 16:
        problems.append(f"{precision.value.upper()} GEMMs need hidden_size divisible by 16")
    return problems
