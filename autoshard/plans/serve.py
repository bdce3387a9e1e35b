"""The result of serving planning: degrees and engine settings, predictions, the solver certificate
and launch commands, with the `autoshard.plan/v1` JSON form in mode "serve".

Degrees follow vLLM: an engine is TP x PP GPUs; `dp` counts data-parallel ranks. Without expert
parallelism every DP rank is an independent replica of the engine. With it (vLLM
`--enable-expert-parallel`) the MoE layers are sharded over all TP x DP ranks, EP = TP x DP, and the
DP ranks form one engine that steps in lock-step (attention data parallelism).

Status, certificate and the JSON envelope are shared with training plans (`autoshard.plans.base`); the
prefill/decode roles of a disaggregated plan are in `autoshard.plans.disagg`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoshard.costmodel.bands import Band, band_of
from autoshard.costmodel.flops import layer_flops
from autoshard.costmodel.serve.config import pp_layer_split
from autoshard.costmodel.serve.engines import engine_json
from autoshard.costmodel.serve.latency import LatencyQuantiles
from autoshard.costmodel.serve.predict import ServePrediction, decode_context_len, latency_at_rate
from autoshard.plans.base import PlanBase, SolverStats
from autoshard.plans.disagg import Disaggregation, Role
from autoshard.specs.cluster import ClusterSpec, PoolSpec
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import Checkpoint, ModelSpec
from autoshard.units import GIB

__all__ = ["ServePlan", "model_path"]

_HF = re.compile(r"^https?://huggingface\.co/([^/]+/[^/]+?)(?:/|$)")


def model_path(model: ModelSpec) -> str:
    """The Hugging Face repo id the spec cites, else a config.json's folder if unnamed, else its name."""
    match, config = _HF.match(model.source or ""), Path(model.source or "")
    if not match and config.name == "config.json" and "/" not in model.name:
        return str(config.absolute().parent)
    return match.group(1) if match else model.name


@dataclass(frozen=True, slots=True)
class ServePlan(PlanBase):
    model: ModelSpec
    cluster: ClusterSpec
    job: ServeJob
    tp: int
    pp: int
    dp: int
    """Data-parallel ranks in the deployment (replicas, or attention-DP ranks with expert parallelism)."""
    ep: int
    """Expert-parallel size: 1, or TP x DP with expert parallelism."""
    gpu_memory_utilization: float
    max_num_seqs: int
    """Running requests per DP rank (vLLM --max-num-seqs)."""
    max_num_batched_tokens: int
    prediction: ServePrediction
    """One engine (TP x PP GPUs, or the whole deployment with expert parallelism)."""
    solver: SolverStats
    launch: dict[str, str] = field(default_factory=dict)
    pool_index: int = 0
    warnings: tuple[str, ...] = ()
    mode: str = "serve"
    band: Band | None = None
    """Where the measured throughput is expected to fall; None: the band table's band for the plan's
    kind (`autoshard.costmodel.bands.band_of`)."""
    roles: tuple[Role, ...] = ()
    """Prefill and decode roles of a disaggregated plan; empty for aggregated replicas. The plan's
    tp/pp/dp/ep and `prediction` then describe one decode instance."""
    disaggregation: Disaggregation | None = None
    choice: str = ""
    """Why this kind of deployment (aggregated or xPyD) won, against the best of the other kind."""
    engine_other: dict[str, Any] | None = None
    """The same deployment priced for the other engine (`api_serve.with_engine_check`); None: not done."""

    def __post_init__(self) -> None:
        if self.ep not in (1, self.tp * self.dp):
            raise ValueError(
                f"ep must be 1 or TP x DP = {self.tp * self.dp} (vLLM's expert parallelism), got {self.ep}"
            )

    # ------------------------------------------------------------------ derived facts
    @property
    def expert_parallel(self) -> bool:
        return self.ep > 1

    @property
    def dp_attention(self) -> int:
        return self.dp if self.expert_parallel or self.prediction.config.dp_attention > 1 else 1

    @property
    def disaggregated(self) -> bool:
        return bool(self.roles)

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.role == name)

    @property
    def replicas(self) -> int:
        """Independent engines (decode instances of a disaggregated plan)."""
        if self.roles:
            return self.role("decode").instances
        return 1 if self.expert_parallel or self.dp_attention > 1 else self.dp

    @property
    def engine_gpus(self) -> int:
        return self.tp * self.pp * self.dp_attention

    @property
    def num_gpus(self) -> int:
        if self.roles:
            return sum(r.gpus for r in self.roles)
        return self.tp * self.pp * self.dp

    @property
    def pool(self) -> PoolSpec:
        return self.cluster.pools[self.pool_index]

    @property
    def max_model_len(self) -> int:
        return self.job.context_len

    @property
    def throughput_tokens_per_s(self) -> float:
        if self.disaggregation is not None:
            return self.disaggregation.throughput_tokens_per_s
        return self.prediction.throughput_tokens_per_s * self.replicas

    @property
    def running_requests(self) -> int:
        """Requests decoding at once over the deployment."""
        if self.roles:
            d = self.role("decode")
            return d.prediction.concurrency * d.attention_dp * d.instances
        return self.prediction.concurrency * self.dp

    @property
    def ttft_s(self) -> float:
        """Mean TTFT of the deployment."""
        if self.disaggregation is not None:
            return self.disaggregation.ttft_s
        return self.prediction.ttft_s

    @property
    def ttft_p90_s(self) -> float:
        """p90 TTFT of the deployment: the prefill/decode split's own estimate, else the engine's
        (its mean where the engine has no tail estimate)."""
        d = self.disaggregation
        if d is not None:
            return d.ttft_p90_s if d.ttft_p90_s is not None else d.ttft_s
        return self.prediction.ttft_p90_s or self.prediction.ttft_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.throughput_tokens_per_s / self.num_gpus

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The published checkpoint whose weights match the job's weight dtype (from the model's
        `checkpoints:`), which the launchers load instead of the BF16 one."""
        if self.job.weight_dtype is WeightDtype.BF16:
            return None
        return next((c for c in self.model.checkpoints if c.weights is self.job.weight_dtype), None)

    @property
    def model_path(self) -> str:
        ckpt = self.checkpoint
        return ckpt.repo if ckpt is not None else model_path(self.model)

    @property
    def nodes(self) -> int:
        """Nodes the deployment occupies (whole nodes once it outgrows one)."""
        per_node = self.pool.node.gpus_per_node
        return max(1, -(-self.num_gpus // per_node))

    @property
    def objective_unit(self) -> str:
        """What `solver.objective` and `solver.bound` measure."""
        if self.solver.status == "EVALUATED":
            return "output tokens/s per GPU"
        if self.job.request_rate is not None:
            return "GPUs"
        return "output tokens/s per GPU of the cluster"

    def with_launch(self, launch: dict[str, str]) -> ServePlan:
        return dataclasses.replace(self, launch=dict(launch))

    def describe(self) -> str:
        if self.roles:
            p, d = self.role("prefill"), self.role("decode")
            return f"{p.instances}P{d.instances}D: " + " + ".join(r.label() for r in self.roles)
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"DP{self.dp}"]
        if self.expert_parallel or self.dp_attention > 1:  # else: SGLang attention DP, TP experts
            parts.append(f"EP{self.ep}" if self.expert_parallel else f"MoE TP{self.tp * self.dp}")
        return " ".join(parts)

    def meets_targets(self) -> bool:
        p, j = self.prediction, self.job
        ok = j.tpot_target_s is None or p.tpot_s <= j.tpot_target_s
        ok = ok and (j.ttft_target_s is None or self.ttft_s <= j.ttft_target_s)
        if j.request_rate is not None:
            ok = ok and self.throughput_tokens_per_s / j.output_len >= j.request_rate
        return ok

    # ------------------------------------------------------------------ JSON
    def _disagg_json(self) -> dict[str, Any]:
        d = self.disaggregation
        return {} if d is None else d.to_json(self.roles, self.prediction.tpot_s)

    def _stages(self) -> list[dict[str, Any]]:
        names = self.model.layer_names
        pool = self.pool
        where = f"{pool.name}:" if self.cluster.is_heterogeneous else ""
        out, start = [], 1
        for r, n in enumerate(pp_layer_split(self.model.num_layers, self.pp)):
            lo = 0 if r == 0 else start
            hi = start + n + (1 if r == self.pp - 1 else 0)
            start += n
            first = r * self.tp  # DP rank 0; DP rank d adds d * TP * PP (vLLM rank order)
            last = first + self.tp - 1
            out.append(
                {
                    "index": r,
                    "layers": list(names[lo:hi]),
                    "device": f"{where}gpu{first}-{last}" if last > first else f"{where}gpu{first}",
                    "pool": pool.name,
                }
            )
        return out

    def _model_flops_per_output_token(self) -> float:
        """Model FLOPs (full attention square, Megatron convention) of one request's prefill and
        decode, per output token."""
        j = self.job
        ctx = decode_context_len(j)
        total = 0.0
        for kind in self.model.layer_kinds:
            if kind is LayerKind.EMBEDDING:
                continue
            total += layer_flops(self.model, kind, tokens=j.input_len, seq_len=j.input_len).total
            total += layer_flops(self.model, kind, tokens=j.output_len, seq_len=round(ctx)).total
        return total / j.output_len

    def _peak_tflops(self) -> float:
        gpu = self.pool.gpu
        if self.job.weight_dtype is WeightDtype.FP8 and gpu.fp8_tflops:
            return gpu.fp8_tflops
        if self.job.weight_dtype.is_fp4 and gpu.fp4_tflops:
            return gpu.fp4_tflops
        return gpu.bf16_tflops

    def latency_at_request_rate(self) -> LatencyQuantiles | None:
        """TTFT/TPOT p50/p90 when the job's request rate (Poisson) is spread over the engines; None
        without a request rate."""
        if self.job.request_rate is None:
            return None
        return latency_at_rate(
            self.model,
            self.pool,
            self.job,
            self.prediction.config,
            concurrency=self.prediction.concurrency,
            arrival_rate=self.job.request_rate / self.replicas,
            prefill=self.prediction.prefill,
        )

    def _at_request_rate(self) -> dict[str, Any]:
        lat = self.latency_at_request_rate()
        if lat is None:
            return {}

        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "at_request_rate": {
                "requests_per_s_per_engine": self.job.request_rate / self.replicas,
                "running_per_dp_rank": lat.running,
                "utilization": lat.utilization,
                "ttft_p50_s": finite(lat.ttft_p50_s),
                "ttft_p90_s": finite(lat.ttft_p90_s),
                "tpot_p50_s": lat.tpot_p50_s,
                "tpot_p90_s": lat.tpot_p90_s,
            }
        }

    def _plan_json(self) -> dict[str, Any]:
        p = self.prediction
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "cp": 1,
            "ep": self.ep,
            "etp": 1 if self.expert_parallel else self.tp * self.dp_attention,
            "vpp": 1,
            "micro_batch_size": -(-p.concurrency // self.pp),
            "global_batch_size": p.concurrency * self.dp,
            "num_microbatches": self.pp,
            "sequence_parallel": False,
            "recompute": "none",
            "recompute_num_layers": 0,
            "zero_stage": 0,
            "seq_len": self.max_model_len,
            "precision": self.job.weight_dtype.value,
            "stages": self._stages(),
            "replicas": self.replicas,
            "expert_parallel": self.expert_parallel,
            "attention_dp": self.dp_attention,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "weight_dtype": self.job.weight_dtype.value,
            "kv_cache_dtype": self.job.kv_cache_dtype.value,
            "concurrency_per_dp_rank": p.concurrency,
            "pool": self.pool.name,
            "unused_gpus": self.cluster.num_gpus - self.num_gpus,
            "disaggregated": self.disaggregated,
            "deployment_choice": self.choice,
            **({"roles": [{**r.to_json(), "pool": self.cluster.pools[r.pool_index].name} for r in self.roles]}
               if self.roles else {}),
        }

    def _predicted_json(self) -> dict[str, Any]:
        p, mem, step = self.prediction, self.prediction.memory, self.prediction.decode
        tflops = self._model_flops_per_output_token() * self.tokens_per_s_per_gpu / 1e12
        per_stage = [
            (w + mem.activation_bytes + mem.overhead_bytes + max(mem.kv_cache_bytes, 0.0)) / GIB
            for w in mem.stage_weights_bytes
        ]
        return {
            "step_time_s": p.tpot_s,
            "tokens_per_s": self.throughput_tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": tflops,
            "hw_tflops_per_gpu": tflops,
            "mfu": tflops / self._peak_tflops(),
            "time_breakdown_s": {  # the training keys first (zero where serving has no such term)
                "compute": step.compute_s, "tp_comm": step.tp_comm_s, "cp_comm": 0.0,
                "ep_comm": step.ep_comm_s, "pp_comm": step.pp_comm_s, "dp_comm_exposed": 0.0, "bubble": 0.0,
                "optimizer": 0.0,
                "gemm": step.gemm_s, "attention": step.attention_s, "elementwise": step.elementwise_s,
                "logits": step.logits_s, "host": step.host_s,
            },
            "memory_gib": {
                "peak": mem.used_bytes / GIB,
                "capacity": mem.capacity_bytes / GIB,
                "per_stage": per_stage,
                "fits": mem.fits,
                "breakdown": {
                    "weights": mem.weights_bytes / GIB,
                    "grads": 0.0,
                    "optimizer": 0.0,
                    "activations": mem.activation_bytes / GIB,
                    "kv_cache": max(mem.kv_cache_bytes, 0.0) / GIB,
                    "overhead": mem.overhead_bytes / GIB,
                },
            },
            "band": band_of(self).to_json(),
            "serve": {
                "throughput_tokens_per_s": self.throughput_tokens_per_s,
                "ttft_s": self.ttft_s,
                "tpot_s": p.tpot_s,
                "max_concurrency": mem.max_concurrency,
                "kv_cache_gib": max(mem.kv_cache_bytes, 0.0) / GIB,
                "max_model_len": self.max_model_len,
                "kv_cache_tokens": mem.kv_cache_tokens,
                "concurrency": self.running_requests,
                "requests_per_s": self.throughput_tokens_per_s / self.job.output_len,
                "throughput_per_engine_tokens_per_s": p.throughput_tokens_per_s,
                "prefill_s": p.prefill.total_s,
                "input_len": self.job.input_len,
                "output_len": self.job.output_len,
                "ttft_target_s": self.job.ttft_target_s,
                "tpot_target_s": self.job.tpot_target_s,
                "request_rate": self.job.request_rate,
                "meets_targets": self.meets_targets(),
                "ttft_p90_s": p.ttft_p90_s,
                "tpot_p90_s": p.tpot_p90_s,
                **self._at_request_rate(),
                **self._disagg_json(),
            },
        }

    def _extra_json(self) -> dict[str, Any]:
        roles = {r.role: engine_json(r.prediction.config) for r in self.roles}
        engine = {**engine_json(self.prediction.config), **({"roles": roles} if roles else {}),
                  "other": self.engine_other}
        return {"warnings": list(self.warnings), "engine": engine}  # the engine the figures are priced for

    def _solver_json(self) -> dict[str, Any]:
        return {**self.solver.to_json(), "objective_unit": self.objective_unit}
