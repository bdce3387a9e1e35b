"""Megatron-LM flags -> ModelSpec, with Megatron-LM's defaults for whatever the command leaves out
(argparse defaults at the commit in `flags.SOURCE_COMMIT`, `emit/megatron/flags.py`)."""

from __future__ import annotations

import ast
import math

from pydantic import ValidationError

from autoshard.errors import SpecError
from autoshard.specs.layers import (
    AttentionKind,
    LayerGroup,
    LayerKind,
    MLAConfig,
    MlpKind,
    MoEConfig,
    NormKind,
    PositionKind,
    RouterScore,
)
from autoshard.specs.model import ModelSpec
from autoshard.specs.rope import RopeScaling
from autoshard.specs.validation import format_validation_error

__all__ = ["FlagReader", "build_model", "moe_pattern", "eval_moe_layer_freq"]

# Tokenizers whose vocabulary is fixed by the tokenizer type itself.
_FIXED_VOCAB = {"GPT2BPETokenizer": 50257}
# Tokenizers that honour --vocab-size (the others read the vocabulary from their files).
_VOCAB_SIZE_TOKENIZERS = {"NullTokenizer", "NullMultimodalTokenizer", "TikTokenizer"}
# Sizes and degrees Megatron-LM itself rejects at 0 (a 0 here would divide by zero downstream).
_POSITIVE = {
    "--micro-batch-size", "--global-batch-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--seq-length",
    "--encoder-seq-length", "--max-position-embeddings", "--num-layers", "--hidden-size", "--num-attention-heads",
    "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
}
_MAX_FLAG_INT = 1 << 40  # beyond every size the specs accept: refused before anything is allocated


class FlagReader:
    """Typed access to parsed flags (primary spelling -> values; [] for a switch)."""

    def __init__(self, flags: dict[str, list[str]], source: str, warnings: list[str]) -> None:
        self.flags, self.source, self.warnings = flags, source, warnings

    def on(self, name: str) -> bool:
        return name in self.flags

    def text(self, name: str, default: str | None = None) -> str | None:
        values = self.flags.get(name)
        return values[-1] if values else default

    def int(self, name: str, default: int | None = None, *, required: str | None = None) -> int | None:
        value = self.text(name)
        if value is None:
            if required is not None:
                raise SpecError(f"the command has no {name}: add {name} <{required}>", source=self.source)
            return default
        try:
            number = int(value)
        except ValueError:  # Megatron-LM's argparse refuses it too ("invalid int value"): the run would not start
            msg = f"{name} '{value}' is not a whole number"
            hint = "write the number itself (autoshard does not run the shell)" if value.startswith("$") else \
                "Megatron-LM's argparse would refuse it: fix the value"
            raise SpecError(f"{msg}: {hint}", source=self.source) from None
        if number < 0 or (number == 0 and (required is not None or name in _POSITIVE)):
            raise SpecError(f"{name} must be positive, got {number}", source=self.source)
        if number > _MAX_FLAG_INT:
            raise SpecError(f"{name} {number} is beyond any real run (at most {_MAX_FLAG_INT}): fix the value",
                            source=self.source)
        return number


def eval_moe_layer_freq(text: str, num_layers: int, *, flag: str = "--moe-layer-freq",
                        meaning: str = "0 (dense) and 1 (MoE)") -> list[int]:
    """`--moe-layer-freq`: an integer N (every N-th layer is MoE, starting with the first) or a
    Python list expression such as "([0]*3+[1]*58)". Evaluated without eval(): only lists of 0/1,
    `+` and `*` with integers. `--window-attn-skip-freq` takes the same type (`flag`, `meaning`): its
    integer N means one full-attention layer after each N - 1 sliding ones (1 is sliding)."""
    text = text.strip()
    if "[" not in text:
        try:
            n = int(text)
        except ValueError:
            raise SpecError(
                f"{flag} '{text}' is neither an integer nor a list expression such as \"([0]*3+[1]*58)\""
            ) from None
        if n < 1:
            raise SpecError(f"{flag} must be >= 1, got {n}")
        if flag == "--window-attn-skip-freq":
            return [0 if (i + 1) % n == 0 else 1 for i in range(num_layers)]
        return [1 if i % n == 0 else 0 for i in range(num_layers)]

    def value(node: ast.AST) -> list[int] | int:
        if isinstance(node, ast.List):
            items = [value(e) for e in node.elts]
            if not all(isinstance(x, int) for x in items):
                raise ValueError("nested list")
            return [int(x) for x in items]  # type: ignore[arg-type]
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                if len(left) + len(right) > 100_000:
                    raise ValueError("too long")
                return left + right
            if isinstance(node.op, ast.Mult) and isinstance(left, list) != isinstance(right, list):
                times = right if isinstance(left, list) else left
                seq = left if isinstance(left, list) else right
                if isinstance(times, int) and isinstance(seq, list) and 0 <= times and len(seq) * times <= 100_000:
                    return seq * times  # bounded by the product: ([0]*1e5)*1e5 would be 1e10 items
            if isinstance(left, int) and isinstance(right, int):
                return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(type(node).__name__)

    try:
        pattern = value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        raise SpecError(
            f"{flag} '{text}' is not a list expression of 0s and 1s such as \"([0]*3+[1]*58)\""
        ) from None
    if not isinstance(pattern, list) or any(b not in (0, 1) for b in pattern):
        raise SpecError(f"{flag} '{text}' must give a list of {meaning} per layer")
    if len(pattern) != num_layers:
        raise SpecError(
            f"{flag} '{text}' gives {len(pattern)} layers but --num-layers is {num_layers}: "
            "write one 0/1 per decoder layer"
        )
    return pattern


def moe_pattern(model: ModelSpec) -> tuple[int, ...]:
    """1 per MoE decoder layer, 0 per dense one, in order."""
    return tuple(
        1 if k is LayerKind.MOE else 0 for k in model.layer_kinds if k in (LayerKind.DENSE, LayerKind.MOE)
    )


def _groups(bits: list[int], windows: list[int | None] | None = None) -> tuple[LayerGroup, ...]:
    groups = [LayerGroup(kind=LayerKind.EMBEDDING)]
    for b, w in zip(bits, windows or [None] * len(bits), strict=True):
        kind = LayerKind.MOE if b else LayerKind.DENSE
        if groups[-1].kind is kind and groups[-1].attention_window == w:
            groups[-1] = LayerGroup(kind=kind, count=groups[-1].count + 1, attention_window=w)
        else:
            groups.append(LayerGroup(kind=kind, attention_window=w))
    groups.append(LayerGroup(kind=LayerKind.OUTPUT))
    return tuple(groups)


def _vocab(r: FlagReader, hint: int | None, default: int) -> tuple[int, bool]:
    tokenizer = r.text("--tokenizer-type")
    if tokenizer is None and r.on("--vocab-file") and r.on("--merge-file"):
        tokenizer = "GPT2BPETokenizer"  # a GPT-2 vocab + merges pair: the GPT-2 BPE vocabulary
    padded = r.int("--padded-vocab-size")
    if padded:
        return padded, True
    given = r.int("--vocab-size")
    if given and tokenizer in _VOCAB_SIZE_TOKENIZERS:
        return given, True
    if tokenizer in _FIXED_VOCAB:
        return _FIXED_VOCAB[tokenizer], True
    if given:
        r.warnings.append(
            f"--vocab-size {given}: Megatron-LM ignores it with --tokenizer-type {tokenizer} "
            "(the tokenizer decides); read as the vocabulary size"
        )
        return given, True
    if hint is not None:
        return hint, False
    source = "no --tokenizer-type"
    if tokenizer:
        source = f"--tokenizer-type {tokenizer} reads it from the tokenizer files"
    r.warnings.append(
        f"the vocabulary size is not in the command ({source}): assumed {default}; "
        "give the model to use its real size"
    )
    return default, False


def _position(r: FlagReader) -> PositionKind:
    kind = r.text("--position-embedding-type")
    if kind is None:
        if r.on("--use-rotary-position-embeddings"):
            return PositionKind.ROPE
        if r.on("--no-position-embedding"):
            r.warnings.append("--no-position-embedding: no position parameters, predicted like rope")
            return PositionKind.ROPE
        return PositionKind.LEARNED  # Megatron-LM's default: learned_absolute
    if kind == "learned_absolute":
        return PositionKind.LEARNED
    if kind not in ("rope", "yarn", "mrope"):
        r.warnings.append(f"--position-embedding-type {kind}: no position parameters, predicted like rope")
    return PositionKind.ROPE


def _positive(r: FlagReader, name: str, maximum: float, *, zero: bool = False) -> float | None:
    """A RoPE fact (--rotary-base, --rotary-percent, ...) as the model states it, or None when absent;
    `zero`: 0 is allowed too."""
    text = r.text(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 <= value if zero else 0 < value) or not value <= maximum:  # NaN fails too
        raise SpecError(f"{name} {text!r}: expected a {'non-negative' if zero else 'positive'} number of at most "
                        f"{maximum:g}", source=r.source, field=name)
    return value


def _rope_scaling(r: FlagReader, mla: bool) -> RopeScaling | None:
    """RoPE scaling as the command states it (emit/megatron/rope.py has the mapping), or None."""
    got: dict[str, float | int | bool | None] = {}
    yarn = r.text("--position-embedding-type") == "yarn" and not mla
    if yarn:
        if r.on("--use-rope-scaling"):
            r.warnings.append("--use-rope-scaling has no effect with --position-embedding-type yarn; read YaRN")
        got = {"type": "yarn", "factor": _positive(r, "--rotary-scaling-factor", 1e4) or 1.0,
               "original_max_position_embeddings": r.int("--yarn-original-max-position-embeddings", 4096),
               "beta_fast": _positive(r, "--yarn-beta-fast", 1e6), "beta_slow": _positive(r, "--yarn-beta-slow", 1e6),
               "truncate": False if r.flags.get("--no-yarn-correction-range-round-to-int") is not None else None}
    elif r.on("--use-rope-scaling"):
        got = {"type": "llama3", "factor": _positive(r, "--rope-scaling-factor", 1e4) or 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    elif mla and r.text("--rope-type") != "rope" and (_positive(r, "--rotary-scaling-factor", 1e4) or 1.0) != 1:
        # MLATransformerConfig applies YaRN with original context 4096 and betas 32, 1 (no flag sets them)
        got = {"type": "yarn", "factor": _positive(r, "--rotary-scaling-factor", 1e4),
               "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
    elif (linear := r.int("--rotary-seq-len-interpolation-factor")) is not None and linear > 1:
        got = {"type": "linear", "factor": float(linear)}
    if got.get("type") == "yarn" and (r.on("--mscale") or r.on("--mscale-all-dim")):
        got["mscale"] = _positive(r, "--mscale", 100, zero=True) if r.on("--mscale") else 1.0
        got["mscale_all_dim"] = _positive(r, "--mscale-all-dim", 100, zero=True) if r.on("--mscale-all-dim") else 0.0
    if not got:
        return None
    try:
        return RopeScaling.model_validate({k: v for k, v in got.items() if v is not None})
    except ValidationError as exc:
        field, message = format_validation_error(exc, RopeScaling)
        flag = {"factor": {"llama3": "--rope-scaling-factor", "linear": "--rotary-seq-len-interpolation-factor"}
                .get(str(got["type"]), "--rotary-scaling-factor")}.get(field, "--yarn-beta-fast")
        raise SpecError(f"{flag}: {message} ({got['type']} RoPE scaling)", source=r.source, field=flag) from None


def _windows(r: FlagReader, num_layers: int) -> list[int | None] | None:
    """Each decoder layer's attention window from `--window-size LEFT,RIGHT` (a W-token causal window is
    LEFT = W - 1) and `--window-attn-skip-freq` (1: sliding; absent: every layer slides); None without
    a window."""
    text = r.text("--window-size")
    if text is None:
        if r.on("--window-attn-skip-freq"):
            r.warnings.append("--window-attn-skip-freq without --window-size has no effect")
        return None
    parts = text.strip("()[] ").split(",")
    try:
        left, right = (int(p) for p in parts)
    except ValueError:
        raise SpecError(f"--window-size '{text}' is not two integers LEFT,RIGHT such as 4095,0",
                        source=r.source, field="--window-size") from None
    if left < 0:  # Transformer Engine's -1: no limit on that side
        r.warnings.append(f"--window-size {text}: an unlimited left window is full attention")
        return None
    if right != 0:
        r.warnings.append(f"--window-size {text}: a right window is not causal; read as {left},0")
    sliding = [1] * num_layers
    if r.on("--window-attn-skip-freq"):
        sliding = eval_moe_layer_freq(r.text("--window-attn-skip-freq", "") or "", num_layers,
                                      flag="--window-attn-skip-freq", meaning="0 (full) and 1 (sliding)")
    return [left + 1 if b else None for b in sliding]


def _mlp(r: FlagReader) -> MlpKind:
    if r.on("--swiglu") and r.on("--squared-relu"):
        r.warnings.append("--swiglu and --squared-relu both given; read --swiglu")
    if r.on("--swiglu"):
        return MlpKind.SWIGLU
    if r.on("--quick-geglu"):
        return MlpKind.GEGLU
    return MlpKind.SQUARED_RELU if r.on("--squared-relu") else MlpKind.GELU


def build_model(
    r: FlagReader, *, num_layers: int, seq_len: int, vocab_size: int | None, default_vocab: int
) -> tuple[ModelSpec, bool]:
    """The model a pretrain_gpt.py command trains, and whether its vocabulary came from the command.
    Raises pydantic's ValidationError for impossible shapes (the caller turns it into a SpecError)."""
    h = r.int("--hidden-size", required="hidden size")
    heads = r.int("--num-attention-heads", required="attention heads")
    assert h is not None and heads is not None
    mlp = _mlp(r)
    default_ffn = int(4 * h * 2 / 3 / 64) * 64 if mlp is MlpKind.SWIGLU else 4 * h
    ffn = r.int("--ffn-hidden-size") or default_ffn
    if r.on("--hybrid-layer-pattern"):
        r.warnings.append("--hybrid-layer-pattern (Mamba hybrid) is not modeled: read as a transformer")

    kv_heads = heads
    if r.on("--group-query-attention"):
        kv_heads = r.int("--num-query-groups", 1) or 1
    elif r.on("--num-query-groups"):
        r.warnings.append("--num-query-groups has no effect without --group-query-attention")
    kv_channels = r.int("--kv-channels")
    head_dim = kv_channels if kv_channels and (h % heads or kv_channels != h // heads) else None

    mla = None
    if r.on("--multi-latent-attention"):
        if r.on("--group-query-attention"):
            r.warnings.append(
                "--multi-latent-attention and --group-query-attention exclude each other; read MLA"
            )
            kv_heads = heads
        mla = MLAConfig(
            q_lora_rank=r.int("--q-lora-rank"),
            kv_lora_rank=r.int("--kv-lora-rank", 32) or 32,
            qk_nope_head_dim=r.int("--qk-head-dim", 128) or 128,
            qk_rope_head_dim=r.int("--qk-pos-emb-head-dim", 64) or 64,
            v_head_dim=r.int("--v-head-dim", 128) or 128,
        )

    moe = None
    bits = [0] * num_layers
    experts = r.int("--num-experts")
    if experts:
        shared = r.int("--moe-shared-expert-intermediate-size") or 0
        score = r.text("--moe-router-score-function", "softmax")
        if score not in ("softmax", "sigmoid"):
            r.warnings.append(f"--moe-router-score-function {score} is not softmax or sigmoid; read as softmax")
            score = "softmax"
        scaling = r.text("--moe-router-topk-scaling-factor")
        try:
            scaling_value = float(scaling) if scaling is not None else None
        except ValueError:
            r.warnings.append(f"--moe-router-topk-scaling-factor '{scaling}' is not a number; ignored")
            scaling_value = None
        moe = MoEConfig(
            num_experts=experts,
            top_k=r.int("--moe-router-topk", 2) or 2,
            expert_ffn_hidden_size=r.int("--moe-ffn-hidden-size") or ffn,
            num_shared_experts=1 if shared else 0,
            shared_expert_ffn_hidden_size=shared,
            score_function=RouterScore(score),
            num_groups=r.int("--moe-router-num-groups"),
            topk_groups=r.int("--moe-router-group-topk"),
            expert_bias=r.on("--moe-router-enable-expert-bias"),
            topk_scaling_factor=scaling_value,
        )
        bits = eval_moe_layer_freq(r.text("--moe-layer-freq", "1") or "1", num_layers)
    elif r.on("--moe-layer-freq") or r.on("--moe-ffn-hidden-size"):
        r.warnings.append("MoE flags without --num-experts have no effect; read as a dense model")

    max_pos = r.int("--max-position-embeddings")
    if max_pos is None:
        r.warnings.append("no --max-position-embeddings (Megatron-LM requires it); read as --seq-length")
        max_pos = seq_len
    norm = r.text("--normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        r.warnings.append(f"--normalization {norm} is not LayerNorm or RMSNorm; read as LayerNorm")
    linear_bias = not r.on("--disable-bias-linear")
    vocab, vocab_known = _vocab(r, vocab_size, default_vocab)
    model = ModelSpec(
        name="from-megatron",
        source=r.source,
        hidden_size=h,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_kv_heads=kv_heads if kv_heads != heads else None,
        head_dim=head_dim,
        vocab_size=vocab,
        tied_embeddings=not r.on("--untie-embeddings-and-output-weights"),
        mlp=mlp,
        norm=NormKind.RMSNORM if norm == "RMSNorm" else NormKind.LAYERNORM,
        attention=AttentionKind.MLA if mla is not None else AttentionKind.GQA,
        position_embedding=_position(r),
        max_position_embeddings=max_pos,
        rope_theta=_positive(r, "--rotary-base", 1e12),
        rotary_percent=_positive(r, "--rotary-percent", 1),
        rope_scaling=_rope_scaling(r, mla is not None),
        linear_bias=linear_bias,
        qkv_bias=r.on("--add-qkv-bias") and not linear_bias,
        qk_norm=r.on("--qk-layernorm"),
        mla=mla,
        moe=moe,
        layers=_groups(bits, _windows(r, num_layers)),
        mtp_num_layers=r.int("--mtp-num-layers", 0) or 0,
    )
    return model, vocab_known
