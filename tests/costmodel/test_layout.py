"""The cost model's layout rules (#15): only comm.py prices collectives, and the names other packages
import keep their module paths. (Import direction and module size: tests/test_architecture.py.)"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import autoshard.costmodel

ROOT = Path(autoshard.costmodel.__file__).parent
MODULES = sorted(ROOT.rglob("*.py"))


def test_the_package_has_the_modules_the_rules_scan() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in MODULES}
    assert {"comm.py", "moe.py", "train/step.py", "serve/step.py", "serve/predict.py", "bands.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_only_comm_builds_links_or_reads_their_latency(path: Path) -> None:
    """A link's latency is added per algorithm step of a collective: whoever reads it is writing a
    collective's formula, and that belongs in comm.py. Building a `Link` by hand likewise."""
    if path.name == "comm.py":
        return
    tree = ast.parse(path.read_text())
    latency = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "latency_s"]
    built = [n.lineno for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Link"]
    assert not latency and not built, f"{path.name}: collective arithmetic at lines {latency + built}"


# Names other packages import from the cost model, by the module that defines them (`from X import name`).
PUBLIC = {
    "autoshard.costmodel.band_table": [
        "COVERAGE", "Kind", "LATENCY_METRICS", "THROUGHPUT_METRICS", "build_table", "gpu_generation",
        "latency_ratio", "memory_ratio", "residual_kind", "throughput_ratio",
    ],
    "autoshard.costmodel.bands": [
        "Band", "TABLE_PATH", "band_for", "band_of", "band_text", "lookup", "mark_ties", "tie_text",
    ],
    "autoshard.costmodel.comm": ["Collective", "collective_time_s", "group_link", "group_links", "tp_all_reduce_s"],
    "autoshard.costmodel.flops": [
        "causal_model_flops_per_step", "layer_flops", "model_flops_per_step", "mtp_forward_flops",
    ],
    "autoshard.costmodel.moe": ["dispatch_time_s"],
    "autoshard.costmodel.sanity": [
        "MFU_REFERENCE_PATH", "SANITY_MARGIN", "_reference", "gpu_class", "sanity_for", "sanity_line",
    ],
    "autoshard.costmodel.serve.config": ["HOST_US_PER_SEQ", "ServeConfig", "pp_layer_split", "stage_layers"],
    "autoshard.costmodel.serve.latency": ["LatencyQuantiles"],
    "autoshard.costmodel.serve.memory": ["activation_peak_bytes", "default_max_num_batched_tokens", "serve_memory"],
    "autoshard.costmodel.serve.predict": [
        "ServePrediction", "concurrency_ladder", "decode_context_len", "kv_limited_concurrency", "latency_at_rate",
        "predict_serve",
    ],
    "autoshard.costmodel.serve.step": ["StepTime", "prefill_time"],
    "autoshard.costmodel.serve.weights": ["kv_cache_bytes_per_token_per_gpu", "total_weight_bytes"],
    "autoshard.costmodel.train.layer": ["layer_cost"],
    "autoshard.costmodel.train.step": [
        "_dp_time_s", "_p2p_s", "optimizer_bytes_per_param", "predict_train", "stage_cost",
    ],
    "autoshard.costmodel.train.types": ["Stage", "TrainConfig", "TrainPrediction"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_names_are_importable_where_they_are_defined(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}"
    elsewhere = [name for name in PUBLIC[module] if (inspect.isclass(obj := getattr(mod, name))
                                                     or inspect.isfunction(obj)) and obj.__module__ != module]
    assert elsewhere == [], f"{module} passes on {elsewhere}: list them under the module that defines them"
    assert [name for name in getattr(mod, "__all__", ()) if not hasattr(mod, name)] == []


def test_serve_step_forwards_no_prediction_names() -> None:
    """`serve.predict` is built on `serve.step`; the step module no longer hands its names back."""
    from autoshard.costmodel.serve import predict, step

    assert callable(predict.predict_serve)
    assert not hasattr(step, "__getattr__")
    for name in ("predict_serve", "ServePrediction", "latency_at_rate", "serve_memory", "total_weight_bytes"):
        assert not hasattr(step, name), name
