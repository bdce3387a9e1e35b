"""The result of training planning: chosen degrees, layer layout, placement, predictions and solver
certificate, with its stable JSON form (schema `autoshard.plan/v1`). Status, certificate and the JSON
envelope are shared with serving plans (`autoshard.plans.base`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoshard.costmodel.bands import Band, band_of
from autoshard.costmodel.sanity import sanity_for
from autoshard.costmodel.train.types import Stage, TrainConfig, TrainPrediction
from autoshard.plans.base import PlanBase, SolverStats, SolveStatus
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import Precision
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["Plan", "layer_counts", "stage_devices"]


def layer_counts(model: ModelSpec, stage: Stage) -> tuple[int, bool, bool]:
    """(decoder layers, has embedding, has output) of a stage."""
    kinds = model.layer_names[stage.start:stage.stop]
    dec = sum(1 for n in kinds if n.startswith("decoder."))
    return dec, "embedding" in kinds, "output" in kinds


def stage_devices(cluster: ClusterSpec, config: TrainConfig, stages: tuple[Stage, ...]) -> list[str]:
    """Human-readable GPU range of each stage: pipeline rank r owns `tp*cp*dp` consecutive GPUs of
    its pool, ranks placed in order within each pool."""
    per_rank = config.dims.tp * config.dims.cp * config.dims.dp
    pp = config.dims.pp
    offsets: dict[int, int] = {}
    rank_range: dict[int, tuple[int, int, int]] = {}
    for r in range(pp):
        pool = stages[r].pool
        start = offsets.get(pool, 0)
        rank_range[r] = (pool, start, start + per_rank - 1)
        offsets[pool] = start + per_rank
    out = []
    for i, _ in enumerate(stages):
        pool, lo, hi = rank_range[i % pp]
        spec = cluster.pools[pool]
        where = f"{spec.name}:" if cluster.is_heterogeneous else ""
        out.append(f"{where}gpu{lo}-{hi}" if hi > lo else f"{where}gpu{lo}")
    return out


@dataclass(frozen=True, slots=True)
class Plan(PlanBase):
    model: ModelSpec
    cluster: ClusterSpec
    config: TrainConfig
    stages: tuple[Stage, ...]
    prediction: TrainPrediction
    solver: SolverStats
    mode: str = "train"
    launch: dict[str, str] = field(default_factory=dict)
    band: Band | None = None
    """Where the measured value is expected to fall (from out-of-source validation); None: the band
    table's band for the plan's kind (`autoshard.costmodel.bands.band_of`)."""

    @property
    def num_gpus(self) -> int:
        return self.config.dims.world_size

    @property
    def recompute_num_layers(self) -> int:
        """Decoder layers per stage that are fully recomputed on top of the base mode (uniform
        across stages when the plan is emitted for Megatron-LM)."""
        return max((s.full_recompute_layers for s in self.stages), default=0)

    def _json_status(self) -> str:
        """"optimal" when proven, "infeasible" when the plan does not fit, else "feasible"."""
        if self.status() is SolveStatus.OPTIMAL:
            return "optimal"
        return "infeasible" if not self.prediction.fits else "feasible"

    def _plan_json(self) -> dict[str, Any]:
        cfg, dims = self.config, self.config.dims
        names = self.model.layer_names
        devices = stage_devices(self.cluster, cfg, self.stages)
        return {
            "tp": dims.tp, "pp": dims.pp, "dp": dims.dp, "cp": dims.cp, "ep": dims.ep,
            "etp": dims.expert_tp, "vpp": dims.vpp,
            "micro_batch_size": cfg.micro_batch_size,
            "global_batch_size": cfg.global_batch_size,
            "num_microbatches": cfg.num_microbatches,
            "sequence_parallel": cfg.sp,
            "recompute": cfg.recompute.value,
            "recompute_num_layers": self.recompute_num_layers,
            "recompute_modules": list(cfg.recompute_modules) if cfg.recompute.value == "selective" else [],
            "zero_stage": cfg.zero_stage,
            "seq_len": cfg.seq_len,
            "precision": cfg.precision.value,
            "moe_dispatcher": cfg.moe_dispatcher.value if self.model.moe is not None else None,
            "fp8_recipe": cfg.fp8_recipe.value if cfg.precision is Precision.FP8 else None,
            "tp_comm_overlap": cfg.tp_comm_overlap and cfg.sp,
            "overlap_grad_reduce": cfg.overlap_grad_reduce,
            "cross_entropy": cfg.cross_entropy.value,
            "fp8_attention": cfg.fp8_attention,
            "moe_a2a_overlap": cfg.moe_a2a_overlap,
            "moe_a2a_delay_wgrad": cfg.moe_a2a_overlap and cfg.moe_a2a_delay_wgrad,
            "full_cuda_graph": cfg.full_cuda_graph,
            "stages": [
                {
                    "index": i,
                    "layers": list(names[s.start:s.stop]),
                    "device": devices[i],
                    "pool": self.cluster.pools[s.pool].name,
                    "full_recompute_layers": s.full_recompute_layers,
                }
                for i, s in enumerate(self.stages)
            ],
        }

    def _predicted_json(self) -> dict[str, Any]:
        pred = self.prediction
        t, mem = pred.time, pred.memory
        return {
            "step_time_s": pred.step_time_s,
            "tokens_per_s": pred.tokens_per_s,
            "tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu,
            "tflops_per_gpu": pred.tflops_per_gpu,
            "hw_tflops_per_gpu": pred.hw_tflops_per_gpu,
            "mfu": pred.mfu,
            "mfu_peak": pred.mfu_peak,
            "notes": list(pred.notes),
            "time_breakdown_s": {
                "compute": t.compute, "tp_comm": t.tp_comm, "cp_comm": t.cp_comm, "ep_comm": t.ep_comm,
                "pp_comm": t.pp_comm, "dp_comm_exposed": t.dp_comm_exposed, "bubble": t.bubble,
                "optimizer": t.optimizer, "recompute_in_compute": t.recompute, "ep_comm_hidden": t.ep_comm_hidden,
            },
            "memory_gib": {
                "peak": pred.peak_memory_bytes / GIB,
                "capacity": pred.capacity_bytes / GIB,
                "per_stage": [m / GIB for m in pred.rank_memory_bytes],
                "fits": pred.fits,
                "breakdown": {
                    "weights": mem.weights / GIB, "grads": mem.grads / GIB, "optimizer": mem.optimizer / GIB,
                    "activations": mem.activations / GIB, "kv_cache": mem.kv_cache / GIB,
                    "overhead": mem.overhead / GIB,
                },
            },
            "band": band_of(self).to_json(),
            "sanity": sanity_for(self).to_json(),
        }
