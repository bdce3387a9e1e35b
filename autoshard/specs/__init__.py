"""Input specifications: models, clusters, jobs, and how they are loaded and checked.

Which file owns what:
- model.py: `ModelSpec` (layer groups, shared architecture, parameter counts); layers.py: the layer
  kinds and architecture variants it is built from (attention, MLP, norm, position, MLA, MoE).
- cluster.py: `ClusterSpec` (GPU types, nodes, links, pools, prices, efficiency knobs).
- job.py: `TrainJob` / `ServeJob`; prepare.py: a job from a model's defaults, the cluster resized,
  the precision checked.
- loader.py: a path or bundled name -> a validated spec; validation.py: pydantic errors phrased with
  the field and the fix; base.py: the strict frozen base and the size caps.
- hf/: the Hugging Face `config.json` importer (a new model family goes there, see its __init__).
"""

from autoshard.specs.cluster import ClusterSpec, EfficiencySpec, GpuSpec, LinkKind, NodeSpec, PoolSpec
from autoshard.specs.job import Optimizer, Precision, ServeJob, TrainJob, WeightDtype
from autoshard.specs.layers import (
    AttentionKind,
    LayerGroup,
    LayerKind,
    MLAConfig,
    MlpKind,
    MoEConfig,
    NormKind,
    PositionKind,
)
from autoshard.specs.loader import bundled_clusters, bundled_models, load_cluster, load_model
from autoshard.specs.model import ModelSpec

__all__ = [
    "AttentionKind", "ClusterSpec", "EfficiencySpec", "GpuSpec", "LayerGroup", "LayerKind", "LinkKind",
    "MLAConfig", "MlpKind", "MoEConfig", "ModelSpec", "NodeSpec", "NormKind", "Optimizer", "PoolSpec",
    "PositionKind", "Precision", "ServeJob", "TrainJob", "WeightDtype",
    "bundled_clusters", "bundled_models", "load_cluster", "load_model",
]
