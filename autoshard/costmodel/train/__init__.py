"""Training cost model (Megatron-LM, also torchtitan's memory): one training step of a plan.

Which file owns what:
- types.py: the inputs and outputs (TrainConfig, Stage, LayerCost, StageCost, TimeBreakdown,
  MemoryBreakdown, TrainPrediction), plain dataclasses.
- layer.py: one layer's cost per micro-batch: compute, TP/CP/EP communication, states, activations.
- step.py: the whole step: stage sums, pipeline schedule, DP traffic, optimizer, per-rank memory, MFU.
- pipeline.py: pipeline schedule time and bubble (1F1B, interleaved).
- memory.py: model states, activations and overheads per framework (Megatron, NeMo, torchtitan).
- memory_torchtitan.py: torchtitan's own activation, loss and allocator terms.
- recompute.py: selective recompute by module (Megatron --recompute-modules).

Entry points re-exported here: `predict_train`, `layer_cost`, `stage_cost`, `TrainConfig`, `Stage`,
`TrainPrediction`.
"""

from autoshard.costmodel.train.layer import layer_cost
from autoshard.costmodel.train.step import predict_train, stage_cost
from autoshard.costmodel.train.types import Stage, TrainConfig, TrainPrediction

__all__ = ["predict_train", "layer_cost", "stage_cost", "TrainConfig", "Stage", "TrainPrediction"]
