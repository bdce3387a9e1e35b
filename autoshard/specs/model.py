"""The model description: an ordered list of layer groups plus the architecture they share.

Parameter counts are derived from the weight shapes (one function per term) so that the cost model,
the catalog tests and the Hugging Face importer all agree on what a layer holds. The layer kinds and the
architecture variants a model is built from live in `autoshard.specs.layers` and are re-exported here.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from autoshard.specs.base import (
    MAX_CONTEXT, MAX_GLOBAL_BATCH, MAX_HEADS, MAX_LAYERS, MAX_NAME_LEN, MAX_SEQ_LEN, MAX_TOKENS, MAX_VOCAB,
    NAME_PATTERN, FrozenSpec,
)
from autoshard.specs.job import Precision, WeightDtype
from autoshard.specs.layers import (
    AttentionKind, Ffn, Hidden, LayerGroup, LayerKind, MLAConfig, MlpKind, MoEConfig, NormKind, PositionKind,
    RouterScore,
)
from autoshard.specs.rope import RopeScaling

__all__ = [
    "LayerKind", "MlpKind", "NormKind", "AttentionKind", "PositionKind",
    "RouterScore", "LayerGroup", "MLAConfig", "MoEConfig", "TrainingDefaults", "ServingDefaults", "Checkpoint",
    "ModelSpec",
]

Heads = Annotated[int, Field(gt=0, le=MAX_HEADS)]
Context = Annotated[int, Field(gt=0, le=MAX_CONTEXT)]


class TrainingDefaults(FrozenSpec):
    """Job defaults stored with a model; CLI flags override them."""

    seq_len: Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)] | None = None
    global_batch_size: Annotated[int, Field(gt=0, le=MAX_GLOBAL_BATCH)] | None = None
    precision: Precision | None = None
    tokens: float | None = Field(default=None, gt=0, le=MAX_TOKENS)
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8"] | None = None
    """The FP8 scaling recipe the model was trained with, used whenever it trains in FP8
    (DeepSeek-V3: blockwise, 1x128 activation and 128x128 weight tiles; Megatron --fp8-recipe)."""


class ServingDefaults(FrozenSpec):
    max_model_len: Context | None = None
    input_len: Context | None = None
    output_len: Context | None = None
    precision: WeightDtype | None = None
    """Weight storage for serving (bf16, fp8, int8, int4)."""


class Checkpoint(FrozenSpec):
    """A published checkpoint of the model with quantized weights, which serving launchers load instead of
    quantizing the BF16 weights themselves (int8/int4 need one: vLLM and SGLang cannot make them online)."""

    weights: WeightDtype
    """Storage of the checkpoint's weights (fp8, int8 or int4)."""
    repo: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", max_length=200)
    """Hugging Face repo id, e.g. Qwen/Qwen3-235B-A22B-FP8."""
    quantization: str = Field(pattern=r"^[a-z0-9_-]+$", max_length=40)
    """The --quantization method its quantization_config selects in vLLM (fp8, fbgemm_fp8, modelopt,
    gptq_marlin, awq_marlin, compressed-tensors)."""
    source: str | None = Field(default=None, max_length=2000, pattern=NAME_PATTERN)
    block_scaled: bool = False
    """FP8 weights with one scale per 128 x 128 block (quantization_config `weight_block_size`, as
    DeepSeek-V3's and Qwen3's FP8 releases), activations scaled per 1 x 128 group at run time; the
    engines run them on block-scaled GEMM kernels (`costmodel.serve.compute.BLOCK_FP8_GEMM_HOPPER`)."""

    @model_validator(mode="after")
    def _check(self) -> Checkpoint:
        if self.weights is WeightDtype.BF16:
            raise ValueError("checkpoints list quantized weights (fp8, int8, int4); the BF16 one is the model's source")
        if self.block_scaled and self.weights is not WeightDtype.FP8:
            raise ValueError("block_scaled describes FP8 weights with 128 x 128 block scales; drop it for this checkpoint")
        return self


class ModelSpec(FrozenSpec):
    """A transformer LLM. All sizes are element counts (not bytes)."""

    name: str = Field(min_length=1, max_length=MAX_NAME_LEN, pattern=NAME_PATTERN)
    source: str | None = Field(default=None, max_length=2000, pattern=NAME_PATTERN)
    """Where the numbers come from (config URL or paper)."""

    hidden_size: Hidden
    ffn_hidden_size: Ffn
    """Intermediate size of the dense MLP (used by `dense` layers)."""
    num_attention_heads: Heads
    num_kv_heads: Heads | None = None
    """Key/value heads (GQA/MQA). Defaults to num_attention_heads (MHA)."""
    head_dim: Hidden | None = None
    """Defaults to hidden_size // num_attention_heads."""
    vocab_size: Annotated[int, Field(gt=0, le=MAX_VOCAB)]
    tied_embeddings: bool = False
    mlp: MlpKind = MlpKind.SWIGLU
    norm: NormKind = NormKind.RMSNORM
    attention: AttentionKind = AttentionKind.GQA
    position_embedding: PositionKind = PositionKind.ROPE
    max_position_embeddings: Context
    rope_theta: Annotated[float, Field(gt=0, le=1e12)] | None = None
    """RoPE base (Hugging Face rope_theta; Megatron --rotary-base). A launch fact only: no parameter,
    FLOP or byte depends on it. None: the launcher's default (10,000)."""
    rotary_percent: Annotated[float, Field(gt=0, le=1)] | None = None
    """Fraction of each head's channels RoPE rotates (Hugging Face partial_rotary_factor / rotary_pct:
    GLM-4.5 and Nemotron 0.5, GPT-NeoX 0.25; Megatron --rotary-percent). None: all of them."""
    rope_scaling: RopeScaling | None = None
    """RoPE context extension (Hugging Face rope_scaling: llama3, yarn or linear; `autoshard.specs.rope`).
    A launch fact only, like rope_theta. None: unscaled RoPE."""

    @field_validator("rope_scaling")
    @classmethod
    def _rope_scaling_needs_rope(cls, value: RopeScaling | None, info: ValidationInfo) -> RopeScaling | None:
        kind = info.data.get("position_embedding")
        if value is not None and kind is not None and kind is not PositionKind.ROPE:
            raise ValueError(f"rope_scaling scales rotary embeddings, but position_embedding is {kind.value}: "
                             "remove rope_scaling or set position_embedding: rope")
        return value
    linear_bias: bool = False
    """Every linear layer has a bias (GPT-2/3, BLOOM, OPT, GPT-NeoX)."""
    qkv_bias: bool = False
    """Only the Q/K/V projections have a bias (Qwen2)."""
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys (Qwen3)."""
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    layers: tuple[LayerGroup, ...] = Field(min_length=1, max_length=MAX_LAYERS + 2)
    mtp_num_layers: Annotated[int, Field(ge=0, le=16)] = 0
    """Multi-token-prediction modules after the last decoder layer (DeepSeek-V3: 1; Hugging Face
    num_nextn_predict_layers; Megatron --mtp-num-layers). Each holds two RMSNorms, a 2h -> h projection
    and one decoder layer like the model's last one, and shares the embedding and the output head;
    Megatron places them on the last pipeline stage. Counted in parameters, FLOPs and memory."""
    training: TrainingDefaults | None = None
    serving: ServingDefaults | None = None
    checkpoints: tuple[Checkpoint, ...] = Field(default=(), max_length=32)
    """Published quantized checkpoints (serving loads the one matching the weight dtype)."""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        kv = self.kv_heads
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) does not divide hidden_size "
                f"({self.hidden_size}): set head_dim explicitly or fix the head count"
            )
        if self.num_attention_heads % kv:
            raise ValueError(
                f"num_kv_heads ({kv}) must divide num_attention_heads ({self.num_attention_heads}) "
                "for grouped-query attention"
            )
        if (self.attention is AttentionKind.MLA) != (self.mla is not None):
            raise ValueError("attention: mla needs an `mla:` section, and an `mla:` section needs attention: mla")
        kinds = [g.kind for g in self.layers]
        if kinds[0] is not LayerKind.EMBEDDING or kinds.count(LayerKind.EMBEDDING) != 1:
            raise ValueError("layers must start with one `- kind: embedding` entry (and have no other)")
        if kinds[-1] is not LayerKind.OUTPUT or kinds.count(LayerKind.OUTPUT) != 1:
            raise ValueError("layers must end with one `- kind: output` entry (and have no other)")
        if any(g.kind in (LayerKind.EMBEDDING, LayerKind.OUTPUT) and g.count != 1 for g in self.layers):
            raise ValueError("embedding and output layer groups must have count 1")
        if not any(k in (LayerKind.DENSE, LayerKind.MOE) for k in kinds):
            raise ValueError("layers needs at least one `dense` or `moe` decoder group")
        if LayerKind.MOE in kinds and self.moe is None:
            raise ValueError("layers has `moe` layers but the model has no `moe:` section")
        if self.num_layers > MAX_LAYERS:
            raise ValueError(f"{self.num_layers} decoder layers is more than autoshard plans for (at most "
                             f"{MAX_LAYERS}): lower the layer counts")
        return self

    # ----------------------------------------------------------------- derived shape facts
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def kv_channels(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def num_layers(self) -> int:
        """Decoder layers (dense + MoE), the count frameworks call num_layers."""
        return sum(g.count for g in self.layers if g.kind in (LayerKind.DENSE, LayerKind.MOE))

    @property
    def num_moe_layers(self) -> int:
        return sum(g.count for g in self.layers if g.kind is LayerKind.MOE)

    @property
    def is_moe(self) -> bool:
        return self.num_moe_layers > 0

    @cached_property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Every layer in order, embedding and output included."""
        return tuple(g.kind for g in self.layers for _ in range(g.count))

    @cached_property
    def decoder_windows(self) -> tuple[int | None, ...]:
        """Each decoder layer's attention window in order (None: full attention), `LayerGroup.attention_window`."""
        return tuple(g.attention_window for g in self.layers if g.kind in (LayerKind.DENSE, LayerKind.MOE)
                     for _ in range(g.count))

    @property
    def has_attention_window(self) -> bool:
        """Some decoder layer attends over a sliding window."""
        return any(w is not None for w in self.decoder_windows)

    def decoders_between(self, start: int, stop: int) -> int:
        """Decoder layers (dense + MoE) among layers [start, stop) of `layer_kinds` (a pipeline chunk's)."""
        return sum(k in (LayerKind.DENSE, LayerKind.MOE) for k in self.layer_kinds[start:stop])

    @cached_property
    def layer_names(self) -> tuple[str, ...]:
        """Stable names: `embedding`, `decoder.0` … `decoder.{L-1}`, `output`."""
        names: list[str] = []
        i = 0
        for kind in self.layer_kinds:
            if kind in (LayerKind.EMBEDDING, LayerKind.OUTPUT):
                names.append(kind.value)
            else:
                names.append(f"decoder.{i}")
                i += 1
        return tuple(names)

    # ----------------------------------------------------------------- parameter counts
    def _norm_params(self, dim: int) -> int:
        return 2 * dim if self.norm is NormKind.LAYERNORM else dim

    def attention_params(self) -> int:
        h, d = self.hidden_size, self.kv_channels
        nh, nkv = self.num_attention_heads, self.kv_heads
        if self.mla is not None:
            m = self.mla
            qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + self._norm_params(m.q_lora_rank) + m.q_lora_rank * nh * qk_dim
            else:
                q = h * nh * qk_dim
            kv = (
                h * (m.kv_lora_rank + m.qk_rope_head_dim)
                + self._norm_params(m.kv_lora_rank)
                + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)
            )
            return q + kv + nh * m.v_head_dim * h
        qkv = h * (nh + 2 * nkv) * d
        out = nh * d * h
        bias = 0
        if self.linear_bias:
            bias = (nh + 2 * nkv) * d + h
        elif self.qkv_bias:
            bias = (nh + 2 * nkv) * d
        qk_norm = 2 * d if self.qk_norm else 0
        return qkv + out + bias + qk_norm

    def mlp_params(self, ffn: int) -> int:
        h = self.hidden_size
        weights = self.mlp.num_matrices * h * ffn
        bias = (ffn * (self.mlp.num_matrices - 1) + h) if self.linear_bias else 0
        return weights + bias

    def dense_layer_params(self) -> int:
        return self.attention_params() + self.mlp_params(self.ffn_hidden_size) + 2 * self._norm_params(self.hidden_size)

    def router_params(self) -> int:
        assert self.moe is not None
        return self.hidden_size * self.moe.num_experts

    def expert_params(self) -> int:
        """One routed expert."""
        assert self.moe is not None
        return self.mlp_params(self.moe.expert_ffn_hidden_size)

    def shared_expert_params(self) -> int:
        assert self.moe is not None
        if not self.moe.shared_expert_ffn_hidden_size:
            return 0
        return self.mlp_params(self.moe.shared_expert_ffn_hidden_size)

    def moe_layer_params(self, *, active_only: bool = False) -> int:
        assert self.moe is not None
        experts = self.moe.top_k if active_only else self.moe.num_experts
        return (
            self.attention_params()
            + 2 * self._norm_params(self.hidden_size)
            + self.router_params()
            + experts * self.expert_params()
            + self.shared_expert_params()
        )

    def embedding_params(self) -> int:
        pos = self.max_position_embeddings * self.hidden_size if self.position_embedding is PositionKind.LEARNED else 0
        return self.vocab_size * self.hidden_size + pos

    def output_params(self) -> int:
        """Final norm plus the output projection (zero extra weights when tied to the embedding)."""
        proj = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self._norm_params(self.hidden_size) + proj

    def layer_params(self, kind: LayerKind, *, active_only: bool = False) -> int:
        match kind:
            case LayerKind.EMBEDDING:
                return self.embedding_params()
            case LayerKind.OUTPUT:
                return self.output_params()
            case LayerKind.DENSE:
                return self.dense_layer_params()
            case LayerKind.MOE:
                return self.moe_layer_params(active_only=active_only)

    @property
    def mtp_layer_kind(self) -> LayerKind:
        """The decoder kind an MTP module repeats: the model's last decoder layer."""
        return next(k for k in reversed(self.layer_kinds) if k in (LayerKind.DENSE, LayerKind.MOE))

    def mtp_module_params(self, *, active_only: bool = False) -> int:
        """One MTP module: RMSNorms on the hidden state and on the embedding, the 2h -> h projection,
        one decoder layer (embedding and output head are shared with the main model)."""
        h = self.hidden_size
        return 2 * self._norm_params(h) + 2 * h * h + self.layer_params(self.mtp_layer_kind, active_only=active_only)

    @cached_property
    def num_params(self) -> int:
        """Total parameters of the main model (tied embeddings counted once), without the MTP modules:
        the figure model cards quote (DeepSeek-V3: 671B; see `num_params_with_mtp`)."""
        return sum(self.layer_params(g.kind) * g.count for g in self.layers)

    @cached_property
    def num_params_with_mtp(self) -> int:
        """Every trained parameter, MTP modules included (DeepSeek-V3: 685B, its checkpoint size)."""
        return self.num_params + self.mtp_num_layers * self.mtp_module_params()

    @cached_property
    def num_active_params(self) -> int:
        """Parameters touched per token (top-k routed experts plus shared experts for MoE), main model."""
        return sum(self.layer_params(g.kind, active_only=True) * g.count for g in self.layers)
