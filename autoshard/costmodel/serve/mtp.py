"""Speculative decoding with the model's own multi-token-prediction (MTP) modules (DeepSeek-V3/R1's
"NextN" layer): each decode step drafts `k` tokens per sequence with the MTP module and verifies them
with the main model in one pass of k + 1 tokens per sequence; on average `accepted_tokens(k)` of them
are kept (the accepted drafts plus the main model's own next token).

Priced as the engines run it (vLLM `--speculative-config '{"method": "mtp", "num_speculative_tokens":
1}'`, SGLang `--speculative-algorithm EAGLE --speculative-num-steps 1 --speculative-eagle-topk 1
--speculative-num-draft-tokens 2`):
- verification: `step_time` with k + 1 query tokens per sequence (k + 1 times the GEMM rows, expert
  pairs and all-to-all bytes; the KV cache read once, its attention math k + 1 times);
- drafting: k passes of the MTP module, one token per sequence each: the projection of [embedding;
  hidden] (2h -> h), one decoder layer of the model's last kind with its attention over the context
  (its own KV cache), and the shared output head with sampling.

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

from dataclasses import replace

from autoshard.costmodel.compute import gemm_time_s
from autoshard.costmodel.flops import Gemm
from autoshard.costmodel.serve.compute import _gemm_s, model_serving_gpu, serving_gpu
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import FP32, SAMPLER_FP32_COPIES
from autoshard.costmodel.serve.sharding import _links, logits_all_gather_s
from autoshard.costmodel.serve.step import StepTime, _layer_time, step_time
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.job import Precision
from autoshard.specs.model import ModelSpec

__all__ = ["MTP_ACCEPTED_TOKENS", "mtp_draft_options", "accepted_tokens", "mtp_draft_time", "mtp_decode_step"]

MTP_ACCEPTED_TOKENS = {1: 1.9}
"""Mean tokens kept per decode step with k draft tokens from DeepSeek-V3/R1's one MTP module:
sgl-project/sglang PR #3582 ("Support NextN (MTP) speculative decoding for DeepSeek-V3/R1"): "~1.9
avg accept length for draft 2 tokens" (`--speculative-num-steps 1`-style chains: one draft token plus
the verified one). A property of the model and the text, taken as published; only k = 1 (DeepSeek
ships one MTP module, `num_nextn_predict_layers: 1`) has a published figure."""


def mtp_draft_options(model: ModelSpec) -> tuple[int, ...]:
    """The MTP draft counts a decode instance of `model` may run: (0, 1) for the DeepSeek-V3/R1
    family (MLA with its one MTP module: the published acceptance is theirs), else (0,)."""
    return (0, 1) if model.mtp_num_layers >= 1 and model.mla is not None else (0,)


def accepted_tokens(model: ModelSpec, k: int) -> float:
    """Mean tokens a sequence advances per decode step with `k` MTP draft tokens (1.0 without)."""
    if k == 0:
        return 1.0
    if k not in mtp_draft_options(model):
        raise ValueError(
            f"{model.name}: no published MTP acceptance for {k} draft tokens on this architecture"
        )
    if k > model.mtp_num_layers:
        raise ValueError(
            f"{model.name} has {model.mtp_num_layers} MTP module(s); {k} draft tokens need as many"
        )
    if k not in MTP_ACCEPTED_TOKENS:
        raise ValueError(
            f"no published acceptance for {k} MTP draft tokens (known: {sorted(MTP_ACCEPTED_TOKENS)})"
        )
    return MTP_ACCEPTED_TOKENS[k]


def mtp_draft_time(
    model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, *, seqs: float, context_len: float
) -> StepTime:
    """One pass of the MTP module for `seqs` sequences of one DP rank (one token each): the 2h -> h
    projection of [normed embedding; normed hidden state], one decoder layer of `model.mtp_layer_kind`
    attending over the context, and the shared head's logits and sampling."""
    links = _links(pool, cfg)
    gpu = model_serving_gpu(model, pool.gpu, cfg.weight_dtype)
    rows = max(1, round(seqs))
    h = model.hidden_size
    layer = _layer_time(
        model, model.mtp_layer_kind, pool, cfg, links, tokens=seqs, decode_seqs=seqs,
        context_len=context_len, prefills=0.0, prefill_len=1,
    )
    proj = _gemm_s(Gemm(rows, h // cfg.tp, 2 * h), gpu, cfg.weight_dtype)
    head_gpu = serving_gpu(pool.gpu)
    vocab_local = -(-model.vocab_size // cfg.tp)
    logits = gemm_time_s(Gemm(rows, vocab_local, h), head_gpu, Precision.BF16)
    logits += rows * model.vocab_size * FP32 * SAMPLER_FP32_COPIES / (
        head_gpu.hbm_tbps * 1e12 * head_gpu.efficiency.hbm
    )
    gather = logits_all_gather_s(model, cfg, links[0], rows=rows)
    return layer + StepTime(gemm_s=proj, logits_s=logits, tp_comm_s=gather)


def mtp_decode_step(
    model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, *, decode_seqs: float, context_len: float
) -> tuple[StepTime, float]:
    """(one decode-only tick with `cfg.speculative_tokens` MTP drafts per sequence, tokens each
    sequence advances per tick). The drafts run on the last pipeline stage; the tick adds them to the
    slowest stage's time (exact at PP 1, the decode instances' layout)."""
    k = cfg.speculative_tokens
    tokens = accepted_tokens(model, k)
    verify = step_time(
        model, pool, cfg, decode_seqs=decode_seqs, prefill_tokens=0, prefills=0, prefill_len=1,
        context_len=context_len, decode_query_len=k + 1,
    )
    if k == 0:
        return verify, tokens
    draft = mtp_draft_time(model, pool, cfg, seqs=decode_seqs, context_len=context_len).scaled(k)
    total = verify + replace(draft, host_s=0.0)
    return total, tokens
