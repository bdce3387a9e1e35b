"""Input specifications: models, clusters, jobs, and how they are loaded."""

from autoshard.specs.cluster import ClusterSpec, EfficiencySpec, GpuSpec, LinkKind, NodeSpec, PoolSpec
from autoshard.specs.job import Optimizer, Precision, ServeJob, TrainJob, WeightDtype
from autoshard.specs.loader import bundled_clusters, bundled_models, load_cluster, load_model
from autoshard.specs.model import (
    AttentionKind,
    LayerGroup,
    LayerKind,
    MLAConfig,
    MlpKind,
    MoEConfig,
    ModelSpec,
    NormKind,
    PositionKind,
)

__all__ = [
    "AttentionKind", "ClusterSpec", "EfficiencySpec", "GpuSpec", "LayerGroup", "LayerKind", "LinkKind",
    "MLAConfig", "MlpKind", "MoEConfig", "ModelSpec", "NodeSpec", "NormKind", "Optimizer", "PoolSpec",
    "PositionKind", "Precision", "ServeJob", "TrainJob", "WeightDtype",
    "bundled_clusters", "bundled_models", "load_cluster", "load_model",
]
