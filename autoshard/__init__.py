"""autoshard: plan how to split LLM training and serving across GPUs.

The public API::

    import autoshard
    model = autoshard.load_model("llama-3.1-70b")          # bundled name, YAML or config.json
    cluster = autoshard.load_cluster("dgx-h100").with_gpus(64)
    job = autoshard.train_job(model, seq_len=8192, global_batch_size=512)
    best = autoshard.solve(model, cluster, job)[0]          # CP-SAT, proven optimal or with its gap
    print(best.to_json()["predicted"]["tokens_per_s"], best.launch["megatron"])
    mine = autoshard.evaluate(model, cluster, job, tp=8, pp=4, micro_batch_size=1)
"""

from autoshard.api import evaluate, solve, train_job
from autoshard.errors import AutoshardError, InfeasibleError, SolverError, SpecError
from autoshard.parallel import ParallelDims, Recompute
from autoshard.plans.train import Plan
from autoshard.search import Pins, SolverOptions
from autoshard.specs import ClusterSpec, ModelSpec, ServeJob, TrainJob, load_cluster, load_model

__version__ = "0.1.0"

__all__ = [
    "AutoshardError", "ClusterSpec", "InfeasibleError", "ModelSpec", "ParallelDims", "Pins", "Plan", "Recompute",
    "ServeJob", "SolverError", "SolverOptions", "SpecError", "TrainJob", "__version__", "evaluate", "load_cluster",
    "load_model", "solve", "train_job",
]
