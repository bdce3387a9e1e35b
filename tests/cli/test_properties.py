"""Property tests over random specs and flags: whatever the input, `autoshard` exits 0, 1 or 2, never
with a traceback, within its time limit plus start-up, and under --json stdout holds exactly one JSON
object (exit 0: the plan; exit 1, no plan: the object with status infeasible/unknown and the error;
exit 2, bad input: nothing).

Specs are small valid models and clusters with one field replaced by a hostile value (zero, negative,
huge, fractional, NaN/inf spelled the YAML way, a boolean, a YAML 1.1 sexagesimal, a string, a list).
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autoshard.cli import app

TIME_LIMIT = 2.0
HOSTILE = ["0", "-1", "1e400", str(2**63), "1e-12", ".inf", "-.inf", ".nan", "true", "yes", "64:00", "'12'",
           "[1, 2]", "{a: 1}", "~", "0.5", "1_000"]


def _model_yaml(hidden: int, heads: int, layers: int, moe: bool, field: str | None, value: str) -> str:
    fields = {
        "name": "prop", "hidden_size": str(hidden), "ffn_hidden_size": str(4 * hidden),
        "num_attention_heads": str(heads), "num_kv_heads": str(heads), "vocab_size": "32000",
        "max_position_embeddings": "4096",
    }
    if field in fields:
        fields[field] = value
    lines = [f"{k}: {v}" for k, v in fields.items()]
    kind = "moe" if moe else "dense"
    count = value if field == "count" else str(layers)
    lines += ["layers:", "  - kind: embedding", f"  - kind: {kind}", f"    count: {count}", "  - kind: output"]
    if moe:
        experts = value if field == "num_experts" else "4"
        lines += ["moe:", f"  num_experts: {experts}", "  top_k: 2", f"  expert_ffn_hidden_size: {2 * hidden}"]
    seq = value if field == "seq_len" else "1024"
    lines += ["training:", f"  seq_len: {seq}", "  global_batch_size: 16"]
    return "\n".join(lines) + "\n"


def _cluster_yaml(gpus_per_node: int, nodes: int, field: str | None, value: str) -> str:
    gpu = {"name": "G", "hbm_gib": "80", "bf16_tflops": "989", "fp8_tflops": "1979", "hbm_tbps": "3.35"}
    node = {"gpus_per_node": str(gpus_per_node), "intra_node_link": "nvlink", "intra_node_gbps": "450",
            "inter_node_gbps": "50"}
    for section in (gpu, node):
        if field in section:
            section[field] = value
    top = value if field == "num_nodes" else str(nodes)
    return ("name: propc\ngpu:\n" + "".join(f"  {k}: {v}\n" for k, v in gpu.items()) + "node:\n"
            + "".join(f"  {k}: {v}\n" for k, v in node.items()) + f"num_nodes: {top}\n")


MODEL_FIELDS = ["hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size",
                "max_position_embeddings", "count", "num_experts", "seq_len"]
CLUSTER_FIELDS = ["hbm_gib", "bf16_tflops", "fp8_tflops", "hbm_tbps", "gpus_per_node", "intra_node_gbps",
                  "inter_node_gbps", "num_nodes"]
FLAG_VALUES = st.sampled_from(["0", "-3", "1", "2", "3", "8", "nan", "inf", "1e18", str(2**40), "x", "2.5"])
FLAGS = ["--gpus", "--seq-len", "--global-batch-size", "--tp", "--pp", "--mbs", "--vpp", "--ep",
         "--recompute-num-layers", "--memory-fraction", "--input-len", "--request-rate", "--tpot-ms"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    hidden=st.sampled_from([256, 512, 1024]),
    heads=st.sampled_from([4, 8]),
    layers=st.integers(1, 8),
    moe=st.booleans(),
    gpus_per_node=st.sampled_from([1, 2, 4, 8]),
    nodes=st.integers(1, 2),
    target=st.sampled_from([None, *[("model", f) for f in MODEL_FIELDS], *[("cluster", f) for f in CLUSTER_FIELDS]]),
    value=st.sampled_from(HOSTILE),
    flags=st.lists(st.tuples(st.sampled_from(FLAGS), FLAG_VALUES), max_size=2),
    mode=st.sampled_from(["train", "serve"]),
)
def test_any_input_exits_cleanly(tmp_path: Path, hidden, heads, layers, moe, gpus_per_node, nodes, target, value,
                                 flags, mode) -> None:
    kind, field = target if target else (None, None)
    model = tmp_path / "m.yaml"
    cluster = tmp_path / "c.yaml"
    model.write_text(_model_yaml(hidden, heads, layers, moe, field if kind == "model" else None, value))
    cluster.write_text(_cluster_yaml(gpus_per_node, nodes, field if kind == "cluster" else None, value))
    argv = ["solve", str(model), str(cluster), "--mode", mode, "--json", "--time-limit", str(TIME_LIMIT),
            "--workers", "1"]
    for flag, flag_value in flags:
        argv += [flag, flag_value]
    start = time.perf_counter()
    result = CliRunner().invoke(app, argv)
    elapsed = time.perf_counter() - start
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("".join(traceback.format_exception(*result.exc_info)) + f"\nargv: {argv}")
    assert result.exit_code in (0, 1, 2), (argv, result.exit_code, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    if result.exit_code == 0:
        obj = json.loads(result.stdout)  # exactly one object: anything around it fails to parse
        assert isinstance(obj, dict) and obj["schema"].startswith("autoshard.plan/")
    elif result.exit_code == 1:  # no plan: still exactly one object, saying why
        obj = json.loads(result.stdout)
        assert obj["schema"].startswith("autoshard.plan/") and obj["status"] in ("infeasible", "unknown"), obj
        assert obj["plan"] is None and obj["error"], obj
        assert result.stderr.strip(), argv
    elif "Usage:" in result.stderr:  # refused by the parser: under CliRunner (no cli._run) its message only
        assert result.stdout.strip() == "", (argv, result.stdout)
    else:  # bad input the command refused: still exactly one object, status invalid, and the message
        obj = json.loads(result.stdout)
        assert obj["status"] == "invalid" and obj["error"] and result.stderr.strip(), (argv, obj)
    # the solver's share is TIME_LIMIT; the rest (tables, bounds, re-check) must stay small for specs this size
    assert elapsed < TIME_LIMIT + 20, (argv, elapsed)
