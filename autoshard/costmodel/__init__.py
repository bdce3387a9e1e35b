"""The physics: pure functions from (model, hardware, parallel degrees) to time and memory
breakdowns. No I/O, no solver."""

from autoshard.costmodel.train.step import (
    LayerCost,
    MemoryBreakdown,
    Stage,
    StageCost,
    TimeBreakdown,
    TrainConfig,
    TrainPrediction,
    layer_cost,
    predict_train,
    stage_cost,
)

__all__ = [
    "LayerCost", "MemoryBreakdown", "Stage", "StageCost", "TimeBreakdown", "TrainConfig", "TrainPrediction",
    "layer_cost", "predict_train", "stage_cost",
]
