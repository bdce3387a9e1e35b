"""The result of planning: chosen degrees, layer layout, placement, predictions and solver
certificate, with its stable JSON form (schema `autoshard.plan/v1`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from autoshard.costmodel.bands import Band, band_of, sanity_for
from autoshard.costmodel.train.step import Stage, TrainConfig, TrainPrediction
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import Precision
from autoshard.specs.model import ModelSpec
from autoshard.units import GIB

__all__ = ["SCHEMA", "SolveStatus", "SolverStats", "Plan", "layer_counts", "stage_devices"]

SCHEMA = "autoshard.plan/v1"


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"  # proven best within the relative gap limit (0 by default)
    FEASIBLE = "feasible"  # best found when the time limit hit; see the gap
    EVALUATED = "evaluated"  # a user-given plan, predicted without search


@dataclass(frozen=True, slots=True)
class SolverStats:
    status: str
    """CP-SAT's status name (OPTIMAL, FEASIBLE) or "EVALUATED"."""
    wall_s: float
    objective: float
    """The solver's objective in its own unit: training, the predicted step time in seconds of the
    integer model; serving, output tokens/s per GPU (or GPUs, when sustaining a request rate)."""
    bound: float
    """Best bound on that objective proven by the solver (lower for minimization, upper for maximization)."""
    conflicts: int = 0
    branches: int = 0
    candidates: int = 0
    """Degree tuples enumerated."""
    candidates_in_model: int = 0
    """Tuples left for CP-SAT after bound-based pruning."""
    pruned: dict[str, int] = field(default_factory=dict)
    """Why candidates were discarded, with counts."""
    stop_reason: str = ""
    """Why the search stopped, from what it recorded (never from the wall time): "optimal" (the bound
    meets the objective), "time_limit" (the command's time limit ran out before the bound closed),
    "gap_limit" (CP-SAT stopped within `gap_limit`), "model_cap" (CP-SAT proved its model optimal, but
    candidates left out of the model by its size cap keep a lower bound below the plan), "evaluated"
    (no search); "" where the caller recorded none."""
    gap_limit: float = 0.0
    """The relative gap limit the solve ran with (0: prove optimality or run out of time)."""

    @property
    def gap(self) -> float:
        return abs(self.objective - self.bound) / max(1e-12, abs(self.objective))

    def to_json(self) -> dict[str, Any]:
        """The `solver` block of the plan JSON."""
        return {
            "status": self.status, "wall_s": self.wall_s, "objective": self.objective, "bound": self.bound,
            "gap": self.gap, "conflicts": self.conflicts, "branches": self.branches, "candidates": self.candidates,
            "candidates_in_model": self.candidates_in_model, "pruned": dict(self.pruned),
            "stop_reason": self.stop_reason, "gap_limit": self.gap_limit,
        }


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
class Plan:
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

    def status(self) -> SolveStatus:
        if self.solver.status == "OPTIMAL":
            return SolveStatus.OPTIMAL
        if self.solver.status == "EVALUATED":
            return SolveStatus.EVALUATED
        return SolveStatus.FEASIBLE

    def to_json(self) -> dict[str, Any]:
        cfg, dims, pred = self.config, self.config.dims, self.prediction
        t, mem = pred.time, pred.memory
        names = self.model.layer_names
        devices = stage_devices(self.cluster, cfg, self.stages)
        status = self.status()
        return {
            "schema": SCHEMA,
            "status": ("optimal" if status is SolveStatus.OPTIMAL
                       else "infeasible" if not pred.fits else "feasible"),
            "mode": self.mode,
            "model": self.model.name,
            "cluster": self.cluster.name,
            "num_gpus": self.num_gpus,
            "plan": {
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
            },
            "predicted": {
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
                    "optimizer": t.optimizer, "recompute_in_compute": t.recompute,
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
            },
            "launch": dict(self.launch),
            "solver": self.solver.to_json(),
        }
