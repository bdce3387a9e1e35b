"""MTP speculative decoding (#13): DeepSeek-V3/R1's multi-token-prediction module drafts one token per
decode step, the main model verifies two tokens per sequence, 1.9 are kept on average (SGLang PR #3582).
Closed forms for the new terms, and the published speedup of the engine that measured it."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.costmodel.serve.attention import FLASH_MLA_HOPPER, _decode_attention_s
from autoshard.costmodel.serve.compute import serving_gpu
from autoshard.costmodel.serve.config import ServeConfig, StageLayers
from autoshard.costmodel.serve.disagg import decode_instance
from autoshard.costmodel.serve.memory import serve_memory
from autoshard.costmodel.serve.mtp import accepted_tokens, mtp_decode_step, mtp_draft_options, mtp_draft_time
from autoshard.costmodel.serve.step import step_time
from autoshard.costmodel.serve.weights import kv_cache_bytes_per_token_per_gpu, stage_weight_bytes
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob, WeightDtype

DSV3 = load_model("deepseek-v3")
FP8 = WeightDtype.FP8
H200 = load_cluster("dgx-h200").with_gpus(8).pools[0]
SGLANG_MTP_SPEEDUP = {1: 1.8, 32: 1.5}
"""sgl-project/sglang docs/basic_usage/deepseek.md, "Multi-token Prediction" (DeepSeek-V3 with
`--speculative-algorithm EAGLE --speculative-num-steps 1 --speculative-eagle-topk 1
--speculative-num-draft-tokens 2`): "the decoding speed can be improved by 1.8x for batch size 1 and
1.5x for batch size 32 respectively on H200 TP8 setting". PR #3582, which the acceptance comes from,
measured 1.76x at batch size 1."""


def _tp8(**kw) -> ServeConfig:
    return ServeConfig(tp=8, weight_dtype=FP8, max_num_seqs=64, **kw)


def test_accepted_tokens_and_options():
    assert accepted_tokens(DSV3, 0) == 1.0 and accepted_tokens(DSV3, 1) == 1.9
    assert mtp_draft_options(DSV3) == (0, 1)
    llama = load_model("llama-3.1-70b")
    assert mtp_draft_options(llama) == (0,)
    with pytest.raises(ValueError, match="no published MTP acceptance"):
        accepted_tokens(llama, 1)
    with pytest.raises(ValueError, match="no published MTP acceptance"):
        accepted_tokens(DSV3, 2)  # one MTP module: no chain of two
    with pytest.raises(ValueError, match="speculative_tokens"):
        ServeConfig(speculative_tokens=-1)


@pytest.mark.parametrize("batch", sorted(SGLANG_MTP_SPEEDUP))
def test_decode_speedup_matches_sglangs_published_figure(batch):
    """Decode-only speed with and without MTP on 8 H200 (TP 8, FP8), ~1,500-token contexts: within 10 %
    of the published 1.8x (batch 1) and 1.5x (batch 32). Nothing is fitted: the acceptance comes from
    another measurement, the step times from the kernels."""
    base, one = mtp_decode_step(DSV3, H200, _tp8(), decode_seqs=batch, context_len=1500)
    spec, kept = mtp_decode_step(DSV3, H200, _tp8(speculative_tokens=1), decode_seqs=batch, context_len=1500)
    assert one == 1.0 and kept == 1.9
    speedup = kept * base.total_s / spec.total_s
    assert speedup == pytest.approx(SGLANG_MTP_SPEEDUP[batch], rel=0.10)
    assert speedup < SGLANG_MTP_SPEEDUP[batch]  # (1.69x and 1.44x: the draft pass and verify rows cost a bit more)


def test_verification_runs_two_tokens_per_sequence():
    """A k = 1 step = the main model over 2 query tokens per sequence + one MTP pass; the 2-token pass
    has the GEMM rows of twice the sequences but reads each sequence's KV cache once."""
    cfg = _tp8(speculative_tokens=1)
    step, _ = mtp_decode_step(DSV3, H200, cfg, decode_seqs=32, context_len=1500)
    verify = step_time(DSV3, H200, cfg, decode_seqs=32, prefill_tokens=0, prefills=0, prefill_len=1,
                       context_len=1500, decode_query_len=2)
    draft = mtp_draft_time(DSV3, H200, cfg, seqs=32, context_len=1500)
    assert step.total_s == pytest.approx(verify.total_s + draft.total_s - draft.host_s, rel=1e-12)
    doubled = step_time(DSV3, H200, cfg, decode_seqs=64, prefill_tokens=0, prefills=0, prefill_len=1,
                        context_len=1500)
    assert verify.gemm_s == pytest.approx(doubled.gemm_s, rel=1e-12)
    assert verify.ep_comm_s == pytest.approx(doubled.ep_comm_s, rel=1e-12)
    assert verify.attention_s < doubled.attention_s  # the cache read once, not twice
    assert verify.host_s == pytest.approx(32 * cfg.host_us_per_seq * 1e-6)  # per request, not per token


def test_mla_verification_folds_query_tokens_into_the_head_tile():
    """FlashMLA: 16 heads x 2 query tokens = 32 rows still fit one 64-row tile (the same time at TP 8);
    128 heads x 2 at attention DP double the compute-bound math."""
    gpu = serving_gpu(H200.gpu)
    tp8 = ServeConfig(tp=8, kv_cache_dtype=FP8)
    one = _decode_attention_s(DSV3, gpu, tp8, seqs=256, context_len=4096)
    two = _decode_attention_s(DSV3, gpu, tp8, seqs=256, context_len=4096, query_len=2)
    assert two == pytest.approx(one, rel=1e-12)
    tp1 = ServeConfig(tp=1, kv_cache_dtype=FP8)
    overhead = FLASH_MLA_HOPPER[3] * gpu.efficiency.kernel_overhead_us * 1e-6
    one = _decode_attention_s(DSV3, gpu, tp1, seqs=256, context_len=4096) - overhead
    two = _decode_attention_s(DSV3, gpu, tp1, seqs=256, context_len=4096, query_len=2) - overhead
    assert two == pytest.approx(2 * one, rel=1e-12)


def test_decode_instance_tpot_is_the_step_over_the_kept_tokens():
    job = ServeJob(input_len=1000, output_len=1000, weight_dtype=FP8)
    cfg = ServeConfig(tp=1, dp_attention=16, expert_parallel=True, weight_dtype=FP8, max_num_seqs=128,
                      speculative_tokens=1, max_num_batched_tokens=256)
    pool = load_cluster("dgx-h100").with_gpus(16).pools[0]
    inst = decode_instance(DSV3, pool, job, cfg, serve_memory(DSV3, pool.gpu, cfg, context_len=2000),
                           concurrency=128)
    assert inst.tpot_s == pytest.approx(inst.step.total_s / 1.9, rel=1e-12)
    assert inst.throughput_tokens_per_s == pytest.approx(128 * 16 / inst.tpot_s, rel=1e-12)


def test_memory_holds_the_mtp_module_and_its_kv_cache():
    """The last stage loads one more MoE layer, its 2h -> h projection, and caches one more layer's latent."""
    cfg = ServeConfig(tp=1, dp_attention=32, expert_parallel=True, weight_dtype=FP8, max_num_seqs=64,
                      max_num_batched_tokens=256)  # vLLM's DeepEP low-latency budget (the buffer grows with it)
    spec = dataclasses.replace(cfg, speculative_tokens=1)
    a = serve_memory(DSV3, H200.gpu, cfg, context_len=2000)
    b = serve_memory(DSV3, H200.gpu, spec, context_len=2000)
    layer = stage_weight_bytes(DSV3, StageLayers(dense=0, moe=1, embedding=False, output=False), tp=1, ep=32,
                               weight_dtype=FP8).total
    proj = 2 * 7168 * 7168 * 1.0
    assert b.weights_bytes - a.weights_bytes == pytest.approx(layer + proj, rel=1e-9)
    per_token = kv_cache_bytes_per_token_per_gpu(DSV3, tp=1, layers=62, dtype=WeightDtype.BF16)
    assert b.kv_cache_tokens == pytest.approx(int(b.kv_cache_bytes / per_token) // 16 * 16, abs=16)


def test_an_evaluated_vllm_command_with_mtp_says_it_is_priced_without():
    from autoshard.emit.vllm import parse_vllm

    cmd = "vllm serve deepseek-ai/DeepSeek-V3 -tp 8 --speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":1}'"
    (note,) = [w for w in parse_vllm(cmd).warnings if "speculative" in w]
    assert note.startswith("--speculative-config: speculative decoding is priced only in the decode instances")
    assert not [w for w in parse_vllm("vllm serve deepseek-ai/DeepSeek-V3 -tp 8").warnings if "speculative" in w]
