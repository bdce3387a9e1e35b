"""The cost model's layout rules (#15): only comm.py prices collectives, and the names other packages
import keep their module paths. (Import direction and module size: tests/test_architecture.py.)"""

from __future__ import annotations

import ast
import importlib
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


# Names other packages import from the cost model, by the module path they use (`from X import name`).
PUBLIC = {
    "autoshard.costmodel.bands": [
        "Band", "COVERAGE", "Kind", "LATENCY_METRICS", "MFU_REFERENCE_PATH", "SANITY_MARGIN", "TABLE_PATH",
        "THROUGHPUT_METRICS", "_reference", "band_for", "band_of", "band_text", "build_table", "gpu_class",
        "latency_ratio", "lookup", "mark_ties", "memory_ratio", "residual_kind", "sanity_for", "sanity_line",
        "throughput_ratio", "tie_text",
    ],
    "autoshard.costmodel.comm": ["Collective", "collective_time_s", "group_link", "group_links"],
    "autoshard.costmodel.compute": [
        "causal_model_flops_per_step", "layer_flops", "model_flops_per_step", "mtp_forward_flops",
    ],
    "autoshard.costmodel.moe": ["dispatch_time_s"],
    "autoshard.costmodel.serve.memory": ["HOST_US_PER_SEQ", "total_weight_bytes", "ServeConfig", "serve_memory"],
    "autoshard.costmodel.serve.step": [
        "LatencyQuantiles", "ServeConfig", "ServePrediction", "StepTime", "activation_peak_bytes",
        "concurrency_ladder", "decode_context_len", "default_max_num_batched_tokens",
        "kv_cache_bytes_per_token_per_gpu", "kv_limited_concurrency", "latency_at_rate", "pp_layer_split",
        "predict_serve", "prefill_time", "serve_memory", "stage_layers", "total_weight_bytes", "tp_all_reduce_s",
    ],
    "autoshard.costmodel.train.step": [
        "Stage", "TrainConfig", "TrainPrediction", "_dp_time_s", "_p2p_s", "layer_cost",
        "optimizer_bytes_per_param", "predict_train", "stage_cost",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_names_keep_their_import_paths(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}"
    assert [name for name in getattr(mod, "__all__", ()) if not hasattr(mod, name)] == []


def test_serve_step_re_exports_the_prediction_objects_themselves() -> None:
    from autoshard.costmodel.serve import predict, step

    assert step.predict_serve is predict.predict_serve
    assert step.ServePrediction is predict.ServePrediction
    with pytest.raises(AttributeError):
        step.no_such_name  # noqa: B018
