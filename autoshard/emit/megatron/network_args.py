"""The network flags of a Megatron-LM launch: the model's shape (layers, widths, attention kind, positions,
norm, MLP), its MoE router and dispatcher, and multi-token prediction. Split from `args.py`, which puts
them in launch order with the parallel, memory, precision and optimizer flags."""

from __future__ import annotations

from autoshard.emit.megatron.rope import position_embedding_type, rope_args
from autoshard.parallel import MoeDispatcher
from autoshard.plans.train import Plan
from autoshard.specs.layers import AttentionKind, LayerKind, MlpKind, NormKind, RouterScore
from autoshard.specs.model import ModelSpec

__all__ = ["Arg", "network_args", "moe_args", "dispatcher_args", "mtp_args", "moe_layer_pattern"]

Arg = tuple[str, str | None]


def moe_layer_pattern(model: ModelSpec) -> str | None:
    """`--moe-layer-freq` as a Python list expression ("([0]*3+[1]*58)"), or None when every decoder
    layer is an MoE layer (Megatron's default, freq 1)."""
    bits = [
        1 if k is LayerKind.MOE else 0 for k in model.layer_kinds if k in (LayerKind.DENSE, LayerKind.MOE)
    ]
    if all(bits):
        return None
    return list_expression(bits)


def list_expression(bits: list[int]) -> str:
    """A 0/1 layer pattern as the run-length Python list expression Megatron-LM's pattern flags take, a
    repeating pattern once with its count ("([1]*5+[0]*1)*10+[1]*2" for Gemma 3's 62 layers)."""
    whole = "(" + _runs(bits) + ")"
    for period in range(2, len(bits) // 2 + 1):
        if all(bits[i] == bits[i % period] for i in range(len(bits))):
            times, rest = divmod(len(bits), period)
            short = f"(({_runs(bits[:period])})*{times}" + (f"+{_runs(bits[times * period:])}" if rest else "") + ")"
            return short if len(short) < len(whole) else whole
    return whole


def _runs(bits: list[int]) -> str:
    runs: list[tuple[int, int]] = []
    for b in bits:
        if runs and runs[-1][0] == b:
            runs[-1] = (b, runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return "+".join(f"[{b}]*{n}" for b, n in runs)


def window_args(model: ModelSpec) -> list[Arg]:
    """Sliding-window attention: `--window-size LEFT,0` (Transformer Engine's window, LEFT keys before the
    query: a W-token window is W - 1, as vLLM passes FlashAttention `sliding_window - 1`) and, where some
    layers attend fully, `--window-attn-skip-freq` as a list expression (1: sliding, 0: full). Megatron-LM
    takes one window for every sliding layer: the largest (megatron_notes says so when they differ)."""
    windows = model.decoder_windows
    sizes = sorted({w for w in windows if w is not None})
    if not sizes:
        return []
    args: list[Arg] = [("--window-size", f"{sizes[-1] - 1},0")]
    if any(w is None for w in windows):
        args.append(("--window-attn-skip-freq", list_expression([0 if w is None else 1 for w in windows])))
    return args


def network_args(model: ModelSpec, seq_len: int) -> list[Arg]:
    h, heads = model.hidden_size, model.num_attention_heads
    args: list[Arg] = [
        ("--num-layers", str(model.num_layers)),
        ("--hidden-size", str(h)),
        ("--ffn-hidden-size", str(model.ffn_hidden_size)),
        ("--num-attention-heads", str(heads)),
    ]
    if model.attention is AttentionKind.MLA and model.mla is not None:
        mla = model.mla
        args.append(("--multi-latent-attention", None))
        if mla.q_lora_rank:
            args.append(("--q-lora-rank", str(mla.q_lora_rank)))
        args += [
            ("--kv-lora-rank", str(mla.kv_lora_rank)),
            ("--qk-head-dim", str(mla.qk_nope_head_dim)),
            ("--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim)),
            ("--v-head-dim", str(mla.v_head_dim)),
        ]
        if h % heads:
            args.append(("--kv-channels", str(model.kv_channels)))
    else:
        if model.kv_heads != heads:
            args += [("--group-query-attention", None), ("--num-query-groups", str(model.kv_heads))]
        if h % heads or model.kv_channels != h // heads:
            args.append(("--kv-channels", str(model.kv_channels)))
    args += [
        ("--seq-length", str(seq_len)),
        ("--max-position-embeddings", str(max(model.max_position_embeddings, seq_len))),
        ("--position-embedding-type", position_embedding_type(model)),
        *rope_args(model),
        ("--normalization", "RMSNorm" if model.norm is NormKind.RMSNORM else "LayerNorm"),
    ]
    if model.mlp is MlpKind.SWIGLU:
        args.append(("--swiglu", None))
    elif model.mlp is MlpKind.SQUARED_RELU:
        args.append(("--squared-relu", None))
    elif model.mlp is MlpKind.GEGLU:
        args.append(("--quick-geglu", None))  # the gated shapes; quick-GELU for tanh-GELU (megatron_notes)
    args += window_args(model)
    if not model.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    if not model.linear_bias:
        args.append(("--disable-bias-linear", None))
        if model.qkv_bias:
            args.append(("--add-qkv-bias", None))
    if model.qk_norm:
        args.append(("--qk-layernorm", None))
    return args


def dispatcher_args(plan: Plan) -> list[Arg]:
    """--moe-token-dispatcher-type; flex names its backend: HybridEP where the NVLink domain spans
    several nodes (GB200/GB300 NVL72), DeepEP elsewhere."""
    dispatcher = plan.config.moe_dispatcher
    args: list[Arg] = [("--moe-token-dispatcher-type", dispatcher.value)]
    if dispatcher is MoeDispatcher.FLEX:
        multi_node_nvlink = all(plan.cluster.pools[s.pool].node.domain_size > plan.cluster.pools[s.pool].node.gpus_per_node
                                for s in plan.stages)
        args.append(("--moe-flex-dispatcher-backend", "hybridep" if multi_node_nvlink else "deepep"))
    return args


def moe_args(model: ModelSpec, plan: Plan | None = None) -> list[Arg]:
    moe = model.moe
    if moe is None:
        return []
    args: list[Arg] = [
        ("--num-experts", str(moe.num_experts)),
        ("--moe-router-topk", str(moe.top_k)),
        ("--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size)),
    ]
    if moe.shared_expert_ffn_hidden_size:
        args.append(("--moe-shared-expert-intermediate-size", str(moe.shared_expert_ffn_hidden_size)))
    pattern = moe_layer_pattern(model)
    if pattern is not None:
        args.append(("--moe-layer-freq", pattern))
    if moe.score_function is RouterScore.SIGMOID:
        args += [("--moe-router-score-function", "sigmoid"), ("--moe-router-dtype", "fp32")]
    if moe.num_groups is not None and moe.topk_groups is not None:
        args += [("--moe-router-num-groups", str(moe.num_groups)), ("--moe-router-group-topk", str(moe.topk_groups))]
    if moe.topk_scaling_factor is not None:
        args.append(("--moe-router-topk-scaling-factor", f"{moe.topk_scaling_factor:g}"))
    args += [
        ("--moe-grouped-gemm", None),
        *(dispatcher_args(plan) if plan is not None else [("--moe-token-dispatcher-type", "alltoall")]),
    ]
    if moe.expert_bias:
        # auxiliary-loss-free balancing with a small sequence-wise auxiliary loss (DeepSeek-V3 Section
        # 2.1.2: bias update speed 0.001, sequence-wise balance factor 0.0001)
        args += [
            ("--moe-router-enable-expert-bias", None),
            ("--moe-router-bias-update-rate", "1e-3"),
            ("--moe-router-load-balancing-type", "seq_aux_loss"),
            ("--moe-aux-loss-coeff", "1e-4"),
        ]
    else:
        args += [("--moe-router-load-balancing-type", "aux_loss"), ("--moe-aux-loss-coeff", "1e-2")]
    return args


def mtp_args(model: ModelSpec) -> list[Arg]:
    """Multi-token prediction (DeepSeek-V3 Section 2.2: loss weight 0.3, then 0.1 for the last 4.8T
    tokens; the later value is written)."""
    if not model.mtp_num_layers:
        return []
    return [("--mtp-num-layers", str(model.mtp_num_layers)), ("--mtp-loss-scaling-factor", "0.1")]
