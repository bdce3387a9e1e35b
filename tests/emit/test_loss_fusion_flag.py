"""The loss implementation as a plan knob, end to end: the Megatron flags each choice writes (golden),
the parser reading them back (and Megatron's unfused default without them), and `evaluate
--from-megatron` pricing the difference."""

from __future__ import annotations

import dataclasses

import pytest
from test_megatron import make_plan, rule_violations, split_command

from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.parse import parse_megatron
from autoshard.emit.megatron.script import megatron_script
from autoshard.parallel import CrossEntropyImpl

BASE = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 "
        "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
        "--vocab-size 32000")


def _with(plan, **kw):
    return dataclasses.replace(plan, config=dataclasses.replace(plan.config, **kw))


def test_plans_run_the_native_fused_loss():
    plan = make_plan("llama-3.1-8b", "dgx-h100", tp=2, dp=4)
    assert plan.config.cross_entropy is CrossEntropyImpl.NATIVE
    assert plan.to_json()["plan"]["cross_entropy"] == "native"


@pytest.mark.parametrize(("impl", "golden"), [
    (CrossEntropyImpl.NATIVE, {"--cross-entropy-loss-fusion": []}),
    (CrossEntropyImpl.TE, {"--cross-entropy-loss-fusion": [], "--cross-entropy-fusion-impl": ["te"]}),
    (CrossEntropyImpl.UNFUSED, {}),
])
def test_loss_flags_are_golden_and_round_trip(impl, golden):
    plan = _with(make_plan("llama-3.1-8b", "dgx-h100", tp=2, dp=4), cross_entropy=impl)
    for text in (megatron_command(plan), megatron_script(plan)):
        flags = split_command(text)[2]
        written = {k: v for k, v in flags.items() if k.startswith("--cross-entropy")}
        assert written == golden
        assert rule_violations(text, world=plan.num_gpus, blackwell=False) == []
        parsed = parse_megatron(text)
        assert parsed.cross_entropy is impl
        assert parsed.with_world_size(plan.num_gpus).train_config().cross_entropy is impl


def test_xentropy_is_not_a_megatron_option():
    plan = _with(make_plan("llama-3.1-8b", "dgx-h100", tp=2, dp=4), cross_entropy=CrossEntropyImpl.XENTROPY)
    with pytest.raises(ValueError, match="not a Megatron-LM option"):
        megatron_command(plan)


@pytest.mark.parametrize(("extra", "impl", "warns"), [
    ("", CrossEntropyImpl.UNFUSED, False),  # Megatron-LM's default: store_true, off
    (" --cross-entropy-loss-fusion", CrossEntropyImpl.NATIVE, False),  # --cross-entropy-fusion-impl defaults to native
    (" --cross-entropy-loss-fusion --cross-entropy-fusion-impl native", CrossEntropyImpl.NATIVE, False),
    (" --cross-entropy-loss-fusion --cross-entropy-fusion-impl te", CrossEntropyImpl.TE, False),
    (" --cross-entropy-fusion-impl te", CrossEntropyImpl.UNFUSED, True),  # the impl alone does nothing
    (" --cross-entropy-loss-fusion --cross-entropy-fusion-impl triton", CrossEntropyImpl.NATIVE, True),
])
def test_parser_reads_the_loss_flags(extra, impl, warns):
    parsed = parse_megatron(BASE + extra)
    assert parsed.cross_entropy is impl
    assert any("cross-entropy" in w for w in parsed.warnings) == warns


def test_evaluate_prices_the_unfused_loss():
    """The same launch with and without --cross-entropy-loss-fusion: the step differs by exactly the
    loss bytes, (52 - 28) B per logit per token, at the GPU's training HBM bandwidth."""
    from autoshard.costmodel.efficiency import training_gpu
    from autoshard.costmodel.train.step import predict_train

    plan = make_plan("llama-3.1-8b", "dgx-h100", tp=2, dp=4)
    text = megatron_command(plan)
    on = parse_megatron(text).with_world_size(8)
    off = parse_megatron(text.replace("--cross-entropy-loss-fusion", "")).with_world_size(8)
    model, cluster = plan.model, plan.cluster
    t_on = predict_train(model, cluster, on.train_config(), on.layout()).step_time_s
    t_off = predict_train(model, cluster, off.train_config(), off.layout()).step_time_s
    gpu = training_gpu(cluster.primary.gpu)
    cfg = on.train_config()
    tokens = cfg.micro_batch_size * cfg.seq_len * cfg.num_microbatches  # per DP rank, through the last stage
    extra = tokens * (52 - 28) * model.vocab_size / cfg.dims.tp / (gpu.hbm_tbps * 1e12 * gpu.efficiency.hbm)
    assert t_off - t_on == pytest.approx(extra, rel=1e-6)


def test_comparison_names_the_loss_flag():
    """A launch that differs from the best plan only by the loss lists that flag as the change."""
    from autoshard.report.compare import compare_plans

    best = make_plan("llama-3.1-8b", "dgx-h100", tp=2, dp=4)
    yours = _with(best, cross_entropy=CrossEntropyImpl.UNFUSED)
    assert compare_plans(yours, best)["changes"] == [{"flag": "--cross-entropy-loss-fusion", "yours": "off", "best": "on"}]
    te = _with(best, cross_entropy=CrossEntropyImpl.TE)
    assert compare_plans(te, best)["changes"] == [{"flag": "--cross-entropy-fusion-impl", "yours": "te", "best": "off"}]
