"""Would a per-expert host-launch floor at published per-op costs explain the Qwen3 intra-node EP 8 rows?
It prints why not.

    python tests/validation/expert_host_check.py

Since README item AC autoshard prices a host floor per MoE layer (costmodel.train.layer.expert_host_s: the
layer lasts at least local experts x a host time per expert fitted on the H100 runs, 500 us), and the gaps
below are what is left after it. This script tests the finer hypothesis from the code's op count.

The hypothesis (issue #10): Megatron's `--moe-grouped-gemm` runs Transformer Engine's GroupedLinear,
which takes the tokens per expert as a host list (`TEGroupedMLP.forward` calls
`tokens_per_expert.tolist()`, a device-to-host sync, so the CUDA queue is empty when the expert GEMMs
start) and issues one cuBLASLt GEMM per local expert; when an expert's GPU work is shorter than the
host time to issue its ops, the GPU waits: expert time = sum over experts of max(GPU, host).

What the code issues per local expert and MoE layer, forward + backward (BF16, the code of the
ModelZoo runs: Megatron-LM main 1e057005 `megatron/core/transformer/moe/experts.py` TEGroupedMLP,
Transformer Engine v2.4 (3cd6870c, June 2025) `pytorch/module/grouped_linear.py`,
`common/gemm/cublaslt_gemm.cu`, Megatron DDP `distributed_data_parallel.py` at 1e057005), for each
of fc1 and fc2:
- forward: one GEMM (`general_grouped_gemm` -> `te_general_grouped_gemm` -> `nvte_multi_stream_cublas_gemm`,
  one `nvte_cublas_gemm` per expert: cuBLASLt descriptors and `cublasLtMatmulAlgoGetHeuristic` are
  created on every call, then `cublasLtMatmul`);
- backward: a dgrad and a wgrad GEMM (the same path; wgrad accumulates into `main_grad`), the dummy
  gradient `torch.empty` of `handle_custom_ddp_from_mcore`, the weight's AccumulateGrad node and
  Megatron DDP's per-parameter backward hook (`_make_backward_post_hook`).
That is 2 host ops forward and 10 backward per expert (EXPERT_HOST_OPS). Each is priced at
HOST_OP_S = 10 us, the costliest published figure for any of them: a cuBLASLt GEMM that creates its
descriptors and queries the heuristic on every call takes about 10 us of host time from entering the
wrapper to the kernel launch (NVIDIA/raft PR #1736, measured with NVTX; 5 us memoized); a
`torch.empty` costs "a few microseconds" (Megatron-LM docs/discussions/deepseek-v3-gb200-optimization,
eb0783b6d3, section 1). The sub-microsecond Python per expert (cast_if_needed, split views) is left out.

Only the forward follows a sync; the backward is sync-free (GroupedLinear's backward reuses the
forward's m_splits, DeepEP's backward dispatch/combine use the cached handle), so the per-phase floor
below (max per phase, summed) is already generous to the hypothesis.

The gap per layer per micro-batch is the leave-one-source-out residual (residuals_train.json) over
micro-batches per pipeline x decoder layers per rank; "needs" is the host time per op that would close
it: (GPU time per expert + gap / local experts) / host ops per expert.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from validate_published import RESIDUALS, _cluster, _model, load_runs

from autoshard.costmodel.compute import gemm_time_s, wgrad_time_s
from autoshard.costmodel.efficiency import training_gpu
from autoshard.costmodel.flops import layer_gemms
from autoshard.parallel import ParallelDims
from autoshard.specs import Precision
from autoshard.specs.layers import LayerKind

EXPERT_HOST_OPS = (2, 10)
"""Host ops per local expert and MoE layer (forward, backward): see the module docstring."""

HOST_OP_S = 10e-6
"""Host seconds per op: a cuBLASLt GEMM with per-call descriptors and heuristic (NVIDIA/raft #1736)."""


@dataclass(frozen=True)
class ExpertHostRow:
    id: str
    local_experts: int
    rows_per_expert: int
    gpu_fwd_s: float
    """Balanced forward GPU seconds of one local expert (fc1 + fc2) in one layer and micro-batch."""
    gpu_bwd_s: float
    gap_s: float
    """Measured minus leave-one-source-out predicted seconds per layer per micro-batch."""
    measured_layer_s: float

    def floor_at(self, op_s: float) -> float:
        """Seconds the host floor adds per layer per micro-batch at `op_s` host seconds per op: per
        phase (forward, backward), sum over the local experts of max(0, host - GPU)."""
        fwd, bwd = (ops * op_s for ops in EXPERT_HOST_OPS)
        return self.local_experts * (max(0.0, fwd - self.gpu_fwd_s) + max(0.0, bwd - self.gpu_bwd_s))

    @property
    def floor_s(self) -> float:
        """The floor at the published HOST_OP_S."""
        return self.floor_at(HOST_OP_S)

    @property
    def needed_op_s(self) -> float | None:
        """Host seconds per op at which the floor closes the gap (None: the row is predicted slow)."""
        if self.gap_s <= 0:
            return None
        lo, hi = 0.0, 1e-3
        for _ in range(60):  # floor_at rises monotonically with op_s
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.floor_at(mid) < self.gap_s else (lo, mid)
        return hi

    def error_at(self, op_s: float) -> float:
        """Signed step-time error (+ = predicted slow) with the floor priced at `op_s`."""
        return (self.floor_at(op_s) - self.gap_s) / self.measured_layer_s


def expert_host_rows() -> list[ExpertHostRow]:
    """Every held BF16 MoE training run (the op count above is the BF16 path; FP8 adds quantizers)."""
    residuals = {r["id"]: r for r in json.loads(RESIDUALS.read_text())}
    out = []
    for run in load_runs():
        model = _model(run)
        res = residuals.get(run["id"])
        if model.moe is None or run["precision"] != "bf16" or res is None or not res["held"]:
            continue
        if res["metric"] != "step_time_s":
            continue
        p = run["parallel"]
        dims = ParallelDims(
            tp=p["tp"], pp=p["pp"], dp=p["dp"], cp=p["cp"], vpp=p["vpp"], ep=p.get("ep", 1), etp=p.get("etp"))
        gpu = training_gpu(_cluster(run["cluster"], dims.world_size).primary.gpu)
        tokens = run["micro_batch_size"] * run["seq_len"] // dims.cp
        experts = layer_gemms(model, LayerKind.MOE, tokens=tokens, dims=dims)[-2:]
        local = experts[0].count
        fwd = sum(gemm_time_s(g, gpu, Precision.BF16) for g in experts) / local
        # backward: dgrad (a forward's time) + wgrad into the FP32 main gradient (Megatron's default)
        bwd = fwd + sum(wgrad_time_s(g, gpu, Precision.BF16, 4) for g in experts) / local
        units = run["global_batch_size"] / (run["micro_batch_size"] * dims.dp) * model.num_layers / dims.pp
        out.append(ExpertHostRow(
            id=run["id"], local_experts=local, rows_per_expert=experts[0].m,
            gpu_fwd_s=fwd, gpu_bwd_s=bwd,
            gap_s=(res["measured"] - res["predicted_loso"]) / units, measured_layer_s=res["measured"] / units,
        ))
    return out


def closing_op_s(rows: list[ExpertHostRow]) -> float:
    """The smallest host cost per op that closes the gap of a row predicted more than 10 % fast."""
    return min(r.needed_op_s for r in rows if r.needed_op_s and r.gap_s > 0.1 * r.measured_layer_s)


def main() -> None:
    fwd_ops, bwd_ops = EXPERT_HOST_OPS
    print(f"host per local expert and layer: {fwd_ops} + {bwd_ops} ops x {HOST_OP_S * 1e6:.0f} us = "
          f"{fwd_ops * HOST_OP_S * 1e6:.0f} us forward, {bwd_ops * HOST_OP_S * 1e6:.0f} us backward")
    rows = expert_host_rows()
    cost = closing_op_s(rows)
    print("per layer per micro-batch (ms); GPU per expert (us), balanced; gap = measured - predicted (LOSO);")
    print(f"floor at {HOST_OP_S * 1e6:.0f} us/op; needs: us/op that closes the gap; last column: step-time")
    print(f"error (+ = slow) with every op at {cost * 1e6:.1f} us, the least that closes a row")
    print("predicted more than 10 % fast")
    print(f"{'run':46s} {'experts':>7s} {'rows':>6s} {'GPU fwd':>8s} {'GPU bwd':>8s} {'measured':>9s} "
          f"{'gap':>7s} {'floor':>7s} {'closes':>7s} {'needs us/op':>11s} {'error':>7s}")
    for r in rows:
        closes = f"{r.floor_s / r.gap_s:7.0%}" if r.gap_s > 0 else f"{'-':>7s}"
        needs = f"{r.needed_op_s * 1e6:11.1f}" if r.needed_op_s else f"{'-':>11s}"
        print(f"{r.id:46s} {r.local_experts:7d} {r.rows_per_expert:6d} {r.gpu_fwd_s * 1e6:8.1f} "
              f"{r.gpu_bwd_s * 1e6:8.1f} {r.measured_layer_s * 1e3:9.2f} {r.gap_s * 1e3:+7.2f} "
              f"{r.floor_s * 1e3:7.3f} {closes} {needs} {r.error_at(cost):+7.1%}")


if __name__ == "__main__":
    main()
