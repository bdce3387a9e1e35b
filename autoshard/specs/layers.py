"""What a model is built from: the kind of each layer, the attention, MLP, norm, position and router
variants, and the multi-head-latent-attention and mixture-of-experts sub-configs. `autoshard.specs.model`
assembles them into a ModelSpec (and re-exports every name here)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from autoshard.specs.base import MAX_CONTEXT, MAX_COUNT, MAX_EXPERTS, MAX_FFN, MAX_HIDDEN, MAX_LAYERS, FrozenSpec

__all__ = [
    "LayerKind", "MlpKind", "NormKind", "AttentionKind", "PositionKind", "RouterScore", "LayerGroup",
    "MLAConfig", "MoEConfig", "Hidden", "Ffn", "Experts",
]

PosInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
# size caps (autoshard.specs.base): beyond them no model exists and the planner would not finish
Hidden = Annotated[int, Field(gt=0, le=MAX_HIDDEN)]
Ffn = Annotated[int, Field(gt=0, le=MAX_FFN)]
Experts = Annotated[int, Field(gt=0, le=MAX_EXPERTS)]


class LayerKind(StrEnum):
    """What one entry of `layers:` is. Embedding and output are layers in their own right: they own
    parameters and memory and a pipeline stage must host them."""

    EMBEDDING = "embedding"  # token (and learned position) embedding
    DENSE = "dense"  # attention + dense MLP decoder layer
    MOE = "moe"  # attention + mixture-of-experts MLP decoder layer
    OUTPUT = "output"  # final norm + output projection (logits) + loss


class MlpKind(StrEnum):
    GELU = "gelu"  # two matrices h->f->h (GPT-2/3, BLOOM, OPT uses relu with the same shape)
    RELU = "relu"  # two matrices, as gelu
    SWIGLU = "swiglu"  # three matrices: gate, up (h->f) and down (f->h)
    SQUARED_RELU = "squared_relu"  # two matrices (Nemotron-4)
    GEGLU = "geglu"  # three matrices as swiglu, gated by tanh-approximated GELU (Gemma 2/3: gelu_pytorch_tanh)

    @property
    def num_matrices(self) -> int:
        return 3 if self in (MlpKind.SWIGLU, MlpKind.GEGLU) else 2


class NormKind(StrEnum):
    LAYERNORM = "layernorm"  # weight + bias
    RMSNORM = "rmsnorm"  # weight only


class AttentionKind(StrEnum):
    GQA = "gqa"  # multi-head, grouped-query or multi-query attention (num_kv_heads decides)
    MLA = "mla"  # DeepSeek multi-head latent attention


class PositionKind(StrEnum):
    ROPE = "rope"
    LEARNED = "learned"  # a max_position_embeddings x hidden table beside the token embedding
    ALIBI = "alibi"


class RouterScore(StrEnum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class LayerGroup(FrozenSpec):
    kind: LayerKind
    count: Annotated[int, Field(gt=0, le=MAX_LAYERS)] = 1
    """Number of consecutive identical layers in this group."""
    attention_window: Annotated[int, Field(gt=0, le=MAX_CONTEXT)] | None = None
    """Sliding-window attention: each query attends to the last `attention_window` positions, itself
    included (Hugging Face `sliding_window` on the layers `layer_types` marks "sliding_attention";
    Mistral-7B-v0.1: every layer 4,096; Gemma 3: 5 of 6 layers 1,024). None: full causal attention.
    Decoder groups only. Prices attention over min(position, window) keys and the KV cache an engine
    keeps for such a layer (`costmodel.serve.kv_window`); no parameter depends on it."""

    @field_validator("attention_window")
    @classmethod
    def _window_on_decoders(cls, value: int | None, info: ValidationInfo) -> int | None:
        kind = info.data.get("kind")
        if value is not None and kind in (LayerKind.EMBEDDING, LayerKind.OUTPUT):
            raise ValueError(f"attention_window applies to decoder layers (dense, moe), not to the "
                             f"{kind.value} layer: remove it there")
        return value


class MLAConfig(FrozenSpec):
    """DeepSeek-V2/V3 multi-head latent attention dimensions (Hugging Face names)."""

    q_lora_rank: Hidden | None = None
    """Rank of the query down-projection; None means queries are projected directly (V2-Lite)."""
    kv_lora_rank: Hidden
    qk_nope_head_dim: Hidden
    qk_rope_head_dim: Hidden
    v_head_dim: Hidden


class MoEConfig(FrozenSpec):
    num_experts: Experts
    top_k: Experts
    expert_ffn_hidden_size: Ffn
    """Intermediate size of one routed expert."""
    num_shared_experts: Annotated[int, Field(ge=0, le=MAX_EXPERTS)] = 0
    shared_expert_ffn_hidden_size: Annotated[int, Field(ge=0, le=MAX_FFN)] = 0
    """Total intermediate size of the shared experts (all of them together, as Megatron's
    --moe-shared-expert-intermediate-size)."""
    score_function: RouterScore = RouterScore.SOFTMAX
    """How router logits become expert scores: softmax (Mixtral, Qwen) or sigmoid (DeepSeek-V3,
    Hugging Face scoring_func; Megatron --moe-router-score-function)."""
    num_groups: PosInt | None = None
    """Group-limited (node-limited) routing: experts fall into this many groups (DeepSeek-V3: 8,
    Hugging Face n_group; Megatron --moe-router-num-groups). None: plain top-k."""
    topk_groups: PosInt | None = None
    """Groups a token may pick its experts from (DeepSeek-V3: 4, Hugging Face topk_group; Megatron
    --moe-router-group-topk)."""
    expert_bias: bool = False
    """Auxiliary-loss-free load balancing: a per-expert bias added to the scores for selection only
    (DeepSeek-V3 noaux_tc; Megatron --moe-router-enable-expert-bias)."""
    topk_scaling_factor: Annotated[float, Field(gt=0, le=1000)] | None = None
    """Factor on the routed experts' weights (DeepSeek-V3 routed_scaling_factor 2.5; Megatron
    --moe-router-topk-scaling-factor)."""

    @model_validator(mode="after")
    def _check(self) -> MoEConfig:
        if (self.num_groups is None) != (self.topk_groups is None):
            raise ValueError(
                "moe.num_groups and moe.topk_groups go together (group-limited routing): set both or neither"
            )
        if self.num_groups is not None and self.topk_groups is not None:
            if self.num_experts % self.num_groups:
                raise ValueError(
                    f"moe.num_groups ({self.num_groups}) must divide moe.num_experts ({self.num_experts})"
                )
            if self.topk_groups > self.num_groups:
                raise ValueError(
                    f"moe.topk_groups ({self.topk_groups}) is larger than moe.num_groups ({self.num_groups})"
                )
            per_group = self.num_experts // self.num_groups
            if self.top_k > self.topk_groups * per_group:
                raise ValueError(
                    f"moe.top_k ({self.top_k}) experts cannot come from {self.topk_groups} groups of "
                    f"{per_group} experts: raise moe.topk_groups"
                )
        if self.top_k > self.num_experts:
            raise ValueError(
                f"moe.top_k ({self.top_k}) is larger than moe.num_experts ({self.num_experts}); "
                "a token cannot be routed to more experts than exist: lower top_k"
            )
        if (self.num_shared_experts == 0) != (self.shared_expert_ffn_hidden_size == 0):
            raise ValueError(
                "moe.num_shared_experts and moe.shared_expert_ffn_hidden_size must be both zero or both "
                "positive: set the total shared-expert intermediate size, or remove the shared experts"
            )
        return self
