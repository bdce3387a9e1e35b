"""The training loss per implementation: HBM bytes per logit counted from each implementation's
kernels, priced on the output layer's forward and backward, and what each keeps for backward."""

from __future__ import annotations

import pytest

from autoshard.costmodel.compute import CROSS_ENTROPY_BYTES, cross_entropy_bytes_per_token, layer_compute_time
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.train.memory import layer_activation_bytes
from autoshard.parallel import CrossEntropyImpl, ParallelDims, Recompute
from autoshard.specs import LayerKind, Precision, load_cluster, load_model

LLAMA8 = load_model("llama-3.1-8b")
H100 = load_cluster("dgx-h100").primary.gpu
R, W = "read", "write"

# Each kernel's (reads, writes) in bytes per logit, BF16 logits (2 B), FP32 intermediates (4 B).
PASSES = {
    CrossEntropyImpl.UNFUSED: (  # megatron/core/tensor_parallel/cross_entropy.py
        [(2, 4), (4, 0), (4, 4), (4, 4), (4, 0), (4, 4)],  # .float(), max, sub_, exp(out=), sum, div_
        [(4, 4), (4, 2)],  # grad_input.mul_(grad_output), autograd's cast back to the BF16 logits
    ),
    CrossEntropyImpl.NATIVE: (  # megatron/core/fusions/fused_cross_entropy.py (jit_fuser)
        [(2, 4), (4, 4), (4, 4)],  # cast + max, sub + exp + sum, div
        [(4, 2)],  # scatter, scale and cast to BF16
    ),
    CrossEntropyImpl.TE: (  # transformer_engine/pytorch/triton/cross_entropy.py (2025)
        [(2, 0), (2, 2)],  # online_softmax_kernel, cross_entropy_kernel (gradient over the logits)
        [(2, 2)],  # element_mul_kernel
    ),
    CrossEntropyImpl.XENTROPY: (  # flash-attention csrc/xentropy (Apex)
        [(2, 0), (2, 0)],  # max + sum, sum of exp
        [(2, 2)],  # gradient
    ),
}


@pytest.mark.parametrize("impl", list(CrossEntropyImpl))
def test_bytes_per_logit_are_the_kernel_passes(impl):
    fwd, bwd = PASSES[impl]
    assert CROSS_ENTROPY_BYTES[impl] == (sum(r + w for r, w in fwd), sum(r + w for r, w in bwd))


def test_totals_per_logit():
    assert {i: sum(CROSS_ENTROPY_BYTES[i]) for i in CrossEntropyImpl} == {
        CrossEntropyImpl.UNFUSED: 52, CrossEntropyImpl.NATIVE: 28, CrossEntropyImpl.TE: 10, CrossEntropyImpl.XENTROPY: 8}


@pytest.mark.parametrize("tp", [1, 4])
def test_output_layer_pays_the_loss_bytes(tp):
    """Llama-3.1-8B (vocabulary 128,256), 8,192 tokens: unfused vs native differ by 16 B per logit
    forward and 8 backward over vocabulary/TP logits per token, at the training HBM bandwidth."""
    kw = dict(gpu=H100, dims=ParallelDims(tp=tp), micro_batch_size=1, seq_len=8192, precision=Precision.BF16,
              recompute=Recompute.NONE, sequence_parallel=tp > 1)
    unfused = layer_compute_time(LLAMA8, LayerKind.OUTPUT, cross_entropy=CrossEntropyImpl.UNFUSED, **kw)
    native = layer_compute_time(LLAMA8, LayerKind.OUTPUT, cross_entropy=CrossEntropyImpl.NATIVE, **kw)
    g = training_gpu(H100)
    per_byte = 8192 * 128256 / tp / (g.hbm_tbps * 1e12 * g.efficiency.hbm)
    assert unfused.forward_s - native.forward_s == pytest.approx(16 * per_byte, rel=1e-9)
    assert unfused.backward_s - native.backward_s == pytest.approx(8 * per_byte, rel=1e-9)
    assert cross_entropy_bytes_per_token(LLAMA8, CrossEntropyImpl.TE, tp=tp) == (6 * 128256 / tp, 4 * 128256 / tp)
    # decoder layers do not run the loss
    dense = {i: layer_compute_time(LLAMA8, LayerKind.DENSE, cross_entropy=i, **kw) for i in CrossEntropyImpl}
    assert len(set(dense.values())) == 1


def test_saved_logits_per_implementation():
    """Megatron-Core's unfused and native losses keep the FP32 softmax (4 B per logit) for backward;
    Transformer Engine's writes the BF16 gradient over the logits and keeps that (2 B)."""
    kw = dict(dims=ParallelDims(tp=2), micro_batch_size=1, seq_len=4096, recompute=Recompute.NONE,
              sequence_parallel=True)
    saved = {i: layer_activation_bytes(LLAMA8, LayerKind.OUTPUT, cross_entropy=i, **kw) for i in CrossEntropyImpl}
    assert saved[CrossEntropyImpl.UNFUSED] == saved[CrossEntropyImpl.NATIVE]
    assert saved[CrossEntropyImpl.NATIVE] - saved[CrossEntropyImpl.TE] == 4096 * 2 * 128256 / 2
    assert saved[CrossEntropyImpl.TE] == saved[CrossEntropyImpl.XENTROPY] == 4096 * (2 * 2 * 4096 / 2 + 2 * 128256 / 2)
