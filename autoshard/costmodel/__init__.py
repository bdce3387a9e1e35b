"""The physics: pure functions from (model, hardware, parallel degrees) to time and memory
breakdowns. No I/O, no solver. Imports only specs, parallel, errors, units and itself.

Which file owns what (shared by both modes, then `train/` and `serve/`):
- comm.py: every collective's time formula (NCCL ring/tree, custom all-reduce, NVLink/NIC split and
  hierarchical all-to-alls) and the links process groups run on. A new collective's cost goes here.
- flops.py: GEMM shapes and FLOPs per layer and per step (model, causal useful, MTP).
- compute.py: time of a layer's work on one GPU (GEMM roofline, attention, elementwise, FP8 casts,
  recompute, MoE imbalance, TP-overlap split).
- efficiency.py: where a GPU's efficiency factors come from (fitted on its runs or borrowed).
- moe.py: MoE dispatch volumes and routing (remote domains per token, load imbalance) per dispatcher.
- band_table.py: the band statistic and the band table's construction from validation residuals.
- bands.py: prediction bands of plans (table lookup, sanity cap, ties among a --top listing).
- sanity.py: useful MFU against the best measured one of the GPU class (physical sanity).
- train/: training step (see `autoshard.costmodel.train`). serve/: serving engines (see
  `autoshard.costmodel.serve`).

Entry points re-exported here: the training step (`TrainConfig`, `Stage`, `predict_train`,
`layer_cost`, `stage_cost` and their result types) and the serving prediction (`ServeConfig`,
`predict_serve`, `ServePrediction`, `serve_memory`, `step_time`, `prefill_time`).
"""

from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import ServeMemory, serve_memory
from autoshard.costmodel.serve.predict import ServePrediction, predict_serve
from autoshard.costmodel.serve.step import StepTime, prefill_time, step_time
from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.step import predict_train, stage_cost
from autoshard.costmodel.train.types import (
    LayerCost,
    MemoryBreakdown,
    Stage,
    StageCost,
    TimeBreakdown,
    TrainConfig,
    TrainPrediction,
)

__all__ = [
    "LayerCost", "MemoryBreakdown", "Stage", "StageCost", "TimeBreakdown", "TrainConfig", "TrainPrediction",
    "layer_cost", "predict_train", "stage_cost",
    "ServeConfig", "ServeMemory", "ServePrediction", "StepTime", "predict_serve", "prefill_time", "serve_memory",
    "step_time",
]
