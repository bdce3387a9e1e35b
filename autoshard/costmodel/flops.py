"""FLOPs from GEMM shapes: the GEMMs of each layer kind (TP/EP sharded), FLOPs per layer and per
training step (model FLOPs, causal useful FLOPs, MTP modules). The time a GPU needs for them is in
`autoshard.costmodel.compute`.

Conventions (the Megatron-LM paper's, so calibration rows compare like with like):
- A GEMM of (m x k) @ (k x n) is 2*m*n*k FLOPs. Backward is twice forward (dgrad + wgrad).
- *Model* FLOPs count attention scores over the full s x s square (no causal halving) and exclude
  recomputation; *executed* work halves the causal attention core, as flash attention skips the
  masked blocks, and includes recomputation.
- A sliding-window layer (`LayerGroup.attention_window` w) attends over min(position, w) keys: s w - w^2 / 2
  query-key pairs per sequence for s > w instead of s^2 / 2 (`causal_keys`). Layer FLOPs carry the mean of
  that ratio over the model's decoder layers (`window_attention_share`), so summing them over the layers
  gives the model's total whatever the mix; both conventions scale alike (model FLOPs are twice the causal).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autoshard.parallel import ParallelDims
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = [
    "Gemm", "LayerFlops", "attention_dims", "attention_gemms", "mlp_gemms", "layer_gemms", "layer_flops",
    "model_flops_per_step", "causal_model_flops_per_step", "mtp_forward_flops", "expert_rows", "causal_keys",
    "window_attention_share",
]


@dataclass(frozen=True, slots=True)
class Gemm:
    """One forward GEMM on one GPU: (m x k) @ (k x n), run `count` times."""

    m: int
    n: int
    k: int
    count: int = 1
    fp8_capable: bool = True
    """Linear-layer GEMMs run in FP8 under an FP8 recipe; router GEMMs stay in BF16."""
    grouped: bool = False
    """One grouped kernel over `count` experts of m rows each (MoE expert GEMMs), rather than
    `count` independent GEMMs."""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True, slots=True)
class LayerFlops:
    """Forward FLOPs of one layer for one micro-batch, whole layer (not per GPU)."""

    linear: float
    attention: float
    """Score and value GEMMs over the full s x s square (model-FLOPs convention)."""

    @property
    def total(self) -> float:
        return self.linear + self.attention


def attention_dims(model: ModelSpec) -> tuple[int, int]:
    """(query-key dim, value dim) per head."""
    if model.mla is not None:
        return model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim, model.mla.v_head_dim
    return model.kv_channels, model.kv_channels


def attention_gemms(model: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    h, nh = model.hidden_size, model.num_attention_heads
    qk_dim, v_dim = attention_dims(model)
    heads = nh // tp if nh % tp == 0 else nh / tp
    if model.mla is not None:
        m = model.mla
        gemms = []
        if m.q_lora_rank:
            gemms.append(Gemm(tokens, m.q_lora_rank, h))  # down-projection, replicated across TP
            gemms.append(Gemm(tokens, int(heads * qk_dim), m.q_lora_rank))
        else:
            gemms.append(Gemm(tokens, int(heads * qk_dim), h))
        gemms.append(Gemm(tokens, m.kv_lora_rank + m.qk_rope_head_dim, h))
        gemms.append(Gemm(tokens, int(heads * (m.qk_nope_head_dim + v_dim)), m.kv_lora_rank))
        gemms.append(Gemm(tokens, h, int(heads * v_dim)))
        return gemms
    kv = max(model.kv_heads // tp, 1)  # KV heads replicate when TP exceeds them
    return [
        Gemm(tokens, int((heads + 2 * kv) * qk_dim), h),
        Gemm(tokens, h, int(heads * v_dim)),
    ]


def mlp_gemms(model: ModelSpec, tokens: int, ffn: int, shards: int, count: int = 1) -> list[Gemm]:
    h = model.hidden_size
    f = max(ffn // shards, 1)
    up = Gemm(tokens, f * (model.mlp.num_matrices - 1), h, count, grouped=count > 1)
    down = Gemm(tokens, h, f, count, grouped=count > 1)
    return [up, down]


def layer_gemms(model: ModelSpec, kind: LayerKind, *, tokens: int, dims: ParallelDims) -> list[Gemm]:
    """Forward GEMMs one GPU runs for one layer, `tokens` being the micro-batch tokens of its
    context-parallel shard (b * s / cp). Expert GEMMs assume balanced routing."""
    tp = dims.tp
    match kind:
        case LayerKind.EMBEDDING:
            return []
        case LayerKind.OUTPUT:
            # Megatron-Core's output layer is its own tensor_parallel.ColumnParallelLinear, not a
            # Transformer Engine module: fp8_autocast leaves it in BF16 under every FP8 recipe
            return [Gemm(tokens, -(-model.vocab_size // tp), model.hidden_size, fp8_capable=False)]
        case LayerKind.DENSE:
            return attention_gemms(model, tokens, tp) + mlp_gemms(model, tokens, model.ffn_hidden_size, tp)
        case LayerKind.MOE:
            assert model.moe is not None
            moe = model.moe
            gemms = attention_gemms(model, tokens, tp)
            gemms.append(Gemm(tokens, moe.num_experts, model.hidden_size, fp8_capable=False))
            if moe.shared_expert_ffn_hidden_size:
                gemms += mlp_gemms(model, tokens, moe.shared_expert_ffn_hidden_size, tp)
            # routed experts: balanced rows per local expert (expert_rows)
            per_expert, experts_local = expert_rows(model, tokens=tokens, dims=dims)
            gemms += mlp_gemms(model, per_expert, moe.expert_ffn_hidden_size, dims.expert_tp, count=experts_local)
            return gemms
    raise AssertionError(kind)


def expert_rows(model: ModelSpec, *, tokens: int, dims: ParallelDims) -> tuple[int, int]:
    """(rows per local expert, local experts) of one GPU's grouped expert GEMMs for `tokens` micro-batch
    tokens of its context-parallel shard, balanced routing: every attention group (TP x CP GPUs) routes
    its tokens to top_k experts and the same GPUs host the experts (MoE folding), so each GPU runs
    tokens * top_k / TP token-expert pairs, times ETP because an ETP group shares each pair (each
    member with 1/ETP of the expert FFN); EP only decides how many experts those pairs spread over."""
    assert model.moe is not None
    moe = model.moe
    routed = max(1, round(tokens * moe.top_k * dims.expert_tp / dims.tp))
    experts_local = max(moe.num_experts // dims.ep, 1)
    return max(1, routed // experts_local), experts_local


def causal_keys(seq_len: float, window: int | None) -> float:
    """Mean keys a causal query attends to in a sequence of `seq_len` tokens: seq_len / 2 under full attention,
    and under a window w shorter than the sequence (s w - w^2 / 2) / s, each query seeing min(position, w) keys
    (the continuous count, as s^2 / 2 is for full attention)."""
    if window is None or seq_len <= window:
        return seq_len / 2
    return window - window * window / (2.0 * seq_len)


def window_attention_share(model: ModelSpec, seq_len: float) -> float:
    """The attention core's work over what full causal attention in every layer would take: the mean over the
    decoder layers of causal_keys(s, window) / (s / 2); 1 without windows."""
    windows = model.decoder_windows
    if not any(w is not None for w in windows) or seq_len <= 0:
        return 1.0
    return sum(causal_keys(seq_len, w) for w in windows) / (len(windows) * seq_len / 2)


def layer_flops(model: ModelSpec, kind: LayerKind, *, tokens: int, seq_len: int) -> LayerFlops:
    """Forward model FLOPs of a whole layer (all ranks together) for `tokens` tokens of sequences
    of length `seq_len` (attention is quadratic within a sequence; sliding windows at the mean over the
    decoder layers, `window_attention_share`)."""
    single = ParallelDims()
    linear = sum(g.flops for g in layer_gemms(model, kind, tokens=tokens, dims=single))
    attention = 0.0
    if kind in (LayerKind.DENSE, LayerKind.MOE):
        qk_dim, v_dim = attention_dims(model)
        attention = 2.0 * tokens * seq_len * model.num_attention_heads * (qk_dim + v_dim)
        attention *= window_attention_share(model, seq_len)
    return LayerFlops(linear=linear, attention=attention)


@lru_cache(maxsize=4096)
def model_flops_per_step(model: ModelSpec, *, seq_len: int, global_batch_size: int) -> float:
    """Model FLOPs of one training step (forward + backward, no recomputation)."""
    tokens = seq_len * global_batch_size
    fwd = sum(layer_flops(model, k, tokens=tokens, seq_len=seq_len).total for k in model.layer_kinds)
    return 3.0 * (fwd + mtp_forward_flops(model, tokens=tokens, seq_len=seq_len))


def causal_model_flops_per_step(model: ModelSpec, *, seq_len: int, global_batch_size: int) -> float:
    """*Useful* FLOPs of one training step: `model_flops_per_step` with the attention core (QK^T
    scores and the AV product, 2 x 2 s^2 d per head and sequence forward) counted over the causal
    half of the s x s square, the work a causal decoder cannot skip. This is the convention of
    Megatron-Core's logged TFLOP/s since 2025 and of the physical-sanity check: non-causal model
    FLOPs grow with context by work nobody does."""
    tokens = seq_len * global_batch_size
    attn = sum(layer_flops(model, k, tokens=tokens, seq_len=seq_len).attention for k in model.layer_kinds)
    if model.mtp_num_layers:
        mtp = layer_flops(model, model.mtp_layer_kind, tokens=tokens, seq_len=seq_len)
        attn += model.mtp_num_layers * mtp.attention
    return model_flops_per_step(model, seq_len=seq_len, global_batch_size=global_batch_size) - 3.0 * 0.5 * attn


def mtp_forward_flops(model: ModelSpec, *, tokens: int, seq_len: int) -> float:
    """Forward FLOPs of the MTP modules (Megatron's num_floating_point_operations counts them too):
    per module one decoder layer like the last, the 2h -> h projection and the shared output head."""
    if not model.mtp_num_layers:
        return 0.0
    h = model.hidden_size
    per = (
        layer_flops(model, model.mtp_layer_kind, tokens=tokens, seq_len=seq_len).total
        + layer_flops(model, LayerKind.OUTPUT, tokens=tokens, seq_len=seq_len).total
        + 2.0 * tokens * 2 * h * h
    )
    return model.mtp_num_layers * per
