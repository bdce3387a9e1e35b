"""Bad input never produces a traceback: it gets a message naming the file, the field and the fix,
and exit code 2. An infeasible problem says what is missing and exits 1.

Every case runs the real CLI (typer's CliRunner on `autoshard.cli:app`, in-process); a few run the
installed `autoshard` console script as a subprocess to check the real entry point end to end.
Rich wraps long messages at the terminal width, so text is compared with whitespace normalized
(phrases) or removed (file paths, which rich may fold mid-word).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autoshard.cli import app

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
CLUSTERS = REPO / "clusters"
HF_FIXTURES = REPO / "tests" / "fixtures" / "hf"
FAST = ["--workers", "1", "--time-limit", "10"]


# ----------------------------------------------------------------------------- helpers


def _squash(text: str) -> str:
    return "".join(text.split())


@dataclass
class Run:
    args: list[str]
    code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    @property
    def flat(self) -> str:
        """All output with runs of whitespace (rich's line wrapping) collapsed to one space."""
        return " ".join(self.text.split())

    @property
    def err_flat(self) -> str:
        return " ".join(self.stderr.split())

    def names_path(self, path: Path | str) -> bool:
        return _squash(str(path)) in _squash(self.text)

    def __str__(self) -> str:
        return (f"autoshard {' '.join(self.args)}\nexit {self.code}\n"
                f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}")


def cli(*args: object) -> Run:
    """Run the CLI in-process. An exception escaping the app is a failure (it would be a traceback)."""
    argv = [str(a) for a in args]
    result = CliRunner().invoke(app, argv)
    exc = result.exception
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(*result.exc_info))
        pytest.fail(f"`autoshard {' '.join(argv)}` raised instead of reporting an error:\n{tb}")
    run = Run(argv, result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in run.text, str(run)
    return run


def script(*args: object) -> Run:
    """Run the installed console script (the real entry point) as a subprocess."""
    exe = Path(sys.executable).parent / "autoshard"  # the venv's script: CI does not put it on PATH
    if not exe.is_file():
        pytest.fail(f"the autoshard console script is missing: no {exe} (install the package: pip install -e .)")
    argv = [str(a) for a in args]
    proc = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})
    run = Run(argv, proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in run.text, str(run)
    return run


def assert_bad_input(run: Run, *fragments: str, path: Path | str | None = None) -> None:
    """Exit 2, the message on stderr, each fragment in it (case-insensitive), the file named."""
    assert run.code == 2, str(run)
    assert run.stderr.strip(), f"the error message must go to stderr\n{run}"
    flat = run.flat.lower()
    for frag in fragments:
        assert frag.lower() in flat, f"expected {frag!r} in the message\n{run}"
    if path is not None:
        assert run.names_path(path), f"the message must name the file {path}\n{run}"


def assert_infeasible(run: Run, *fragments: str) -> None:
    assert run.code == 1, str(run)
    flat = run.err_flat.lower()
    for frag in fragments:
        assert frag.lower() in flat, f"expected {frag!r} in the message on stderr\n{run}"


def _load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ----------------------------------------------------------------------------- model YAML

Mutation = Callable[[dict], None]


def _set(dotted: str, value: object) -> Mutation:
    def apply(d: dict) -> None:
        *parents, last = dotted.split(".")
        for part in parents:
            d = d[int(part)] if isinstance(d, list) else d[part]
        if isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value

    return apply


def _rename(dotted: str, new: str) -> Mutation:
    def apply(d: dict) -> None:
        *parents, last = dotted.split(".")
        for part in parents:
            d = d[int(part)] if isinstance(d, list) else d[part]
        d[new] = d.pop(last)

    return apply


def _delete(key: str) -> Mutation:
    return lambda d: d.pop(key)


# (id, bundled base file, mutation, field the message must name, fix/explanation fragments)
MODEL_CASES = [
    ("unknown-field", "llama-3.1-8b", _set("hiden_dropout", 0.1), "hiden_dropout",
     ["unknown field", "allowed fields", "hidden_size"]),
    ("unknown-nested-field", "llama-3.1-8b", _set("layers.1.cnt", 3), "layers[1].cnt",
     ["unknown field", "did you mean 'count'"]),
    ("wrong-type", "llama-3.1-8b", _set("hidden_size", "lots"), "hidden_size",
     ["valid integer", "'lots'"]),
    ("wrong-type-bool", "llama-3.1-8b", _set("tied_embeddings", "sometimes"), "tied_embeddings",
     ["boolean", "'sometimes'"]),
    ("bad-enum", "llama-3.1-8b", _set("mlp", "reglu"), "mlp", ["swiglu", "geglu", "'reglu'"]),
    ("negative-size", "llama-3.1-8b", _set("hidden_size", -4096), "hidden_size",
     ["must be positive", "-4096"]),
    ("zero-size", "llama-3.1-8b", _set("ffn_hidden_size", 0), "ffn_hidden_size", ["must be positive"]),
    ("zero-vocab", "llama-3.1-8b", _set("vocab_size", 0), "vocab_size", ["must be positive"]),
    ("zero-layer-count", "llama-3.1-8b", _set("layers.1.count", 0), "layers[1].count", ["must be positive"]),
    ("negative-layer-count", "llama-3.1-8b", _set("layers.1.count", -3), "layers[1].count",
     ["must be positive"]),
    ("missing-required", "llama-3.1-8b", _delete("vocab_size"), "vocab_size", ["missing", "add it"]),
    ("heads-not-dividing-hidden", "llama-3.1-8b", _set("hidden_size", 4100), "hidden_size",
     ["num_attention_heads", "does not divide", "head_dim"]),
    ("kv-heads-not-dividing-heads", "llama-3.1-8b", _set("num_kv_heads", 5), "num_kv_heads",
     ["must divide", "num_attention_heads"]),
    ("no-embedding-layer", "llama-3.1-8b", lambda d: d["layers"].pop(0), "layers", ["embedding"]),
    ("moe-layers-without-moe-section", "mixtral-8x7b", _delete("moe"), "moe", ["moe:"]),
    ("top-k-above-experts", "mixtral-8x7b", _set("moe.top_k", 9), "moe.top_k",
     ["moe.num_experts", "lower top_k"]),
    ("zero-experts", "mixtral-8x7b", _set("moe.num_experts", 0), "moe.num_experts", ["must be positive"]),
    ("training-seq-len-zero", "llama-3.1-8b", _set("training.seq_len", 0), "training.seq_len",
     ["must be positive"]),
]


@pytest.mark.parametrize(("base", "mutate", "field", "fixes"),
                         [pytest.param(*c[1:], id=c[0]) for c in MODEL_CASES])
def test_bad_model_yaml(tmp_path: Path, base: str, mutate: Mutation, field: str, fixes: list[str]) -> None:
    data = _load_yaml(MODELS / f"{base}.yaml")
    mutate(data)
    path = _write_yaml(tmp_path / "model.yaml", data)
    run = cli("solve", path, "dgx-h100", "--gpus", "8", *FAST)
    assert_bad_input(run, field, *fixes, path=path)


@pytest.mark.parametrize(("kind", "base", "mutate", "typo", "right"), [
    pytest.param("model", MODELS / "llama-3.1-8b.yaml", _rename("vocab_size", "vocab_sise"), "vocab_sise",
                 "vocab_size", id="model-top-level"),
    pytest.param("model", MODELS / "mixtral-8x7b.yaml", _rename("moe.top_k", "moe.topk"), "topk",
                 "top_k", id="model-nested"),
    pytest.param("cluster", CLUSTERS / "dgx-h100.yaml", _rename("gpu.hbm_gib", "hbm_gb"), "hbm_gb",
                 "hbm_gib", id="cluster-nested"),
])
def test_misspelt_required_field_names_the_typo(tmp_path: Path, kind: str, base: Path, mutate: Mutation,
                                                typo: str, right: str) -> None:
    data = _load_yaml(base)
    mutate(data)
    path = _write_yaml(tmp_path / f"{kind}.yaml", data)
    args = ("solve", path, "dgx-h100") if kind == "model" else ("solve", "llama-3.1-8b", path)
    run = cli(*args, "--gpus", "8", *FAST)
    assert_bad_input(run, typo, f"did you mean '{right}'", path=path)


def test_bad_training_precision_in_yaml_names_file_and_field(tmp_path: Path) -> None:
    data = _load_yaml(MODELS / "llama-3.1-8b.yaml")
    data["training"]["precision"] = "fp16"
    path = _write_yaml(tmp_path / "model.yaml", data)
    run = cli("solve", path, "dgx-h100", "--gpus", "8", *FAST)
    assert_bad_input(run, "training.precision", "bf16", "'fp16'", path=path)


# ----------------------------------------------------------------------------- cluster YAML

CLUSTER_CASES = [
    ("zero-gpus-per-node", _set("node.gpus_per_node", 0), "gpus_per_node", ["must be positive"]),
    ("negative-hbm", _set("gpu.hbm_gib", -80), "hbm_gib", ["must be positive", "-80"]),
    ("zero-bandwidth", _set("node.inter_node_gbps", 0), "inter_node_gbps", ["greater than or equal to 0.01", "(got 0)"]),
    ("wrong-type", _set("num_nodes", "many"), "num_nodes", ["valid integer", "'many'"]),
    ("unknown-field", _set("gpu.tflops", 500), "tflops", ["unknown field", "did you mean", "bf16_tflops"]),
    ("bad-link-enum", _set("node.intra_node_link", "infiniband"), "intra_node_link",
     ["nvlink", "'infiniband'"]),
    ("efficiency-above-one", _set("gpu.efficiency", {"gemm": 1.5}), "efficiency.gemm", ["1.5"]),
    ("missing-gpu-field", lambda d: d["gpu"].pop("bf16_tflops"), "bf16_tflops", ["missing", "add it"]),
]


@pytest.mark.parametrize(("mutate", "field", "fixes"), [pytest.param(*c[1:], id=c[0]) for c in CLUSTER_CASES])
def test_bad_cluster_yaml(tmp_path: Path, mutate: Mutation, field: str, fixes: list[str]) -> None:
    data = copy.deepcopy(_load_yaml(CLUSTERS / "dgx-h100.yaml"))
    mutate(data)
    path = _write_yaml(tmp_path / "cluster.yaml", data)
    run = cli("solve", "llama-3.1-8b", path, "--gpus", "8", *FAST)
    assert_bad_input(run, field, *fixes, path=path)


# ----------------------------------------------------------------------------- unreadable files


@pytest.mark.parametrize(("name", "content", "fixes"), [
    pytest.param("model.yaml", "name: x\nhidden_size: [4096\n", ["invalid YAML", "line"], id="yaml-syntax"),
    pytest.param("model.yaml", "name: x\n  hidden_size: 4096\n", ["invalid YAML", "line 2"],
                 id="yaml-indent"),
    pytest.param("model.yaml", "", ["the file is empty"], id="empty-file"),
    pytest.param("model.yaml", "- embedding\n- dense\n", ["expected a mapping", "list"], id="top-level-list"),
    pytest.param("model.yaml", b"\xff\xfe\x00 not text", ["UTF-8"], id="not-utf8"),
    pytest.param("config.json", '{"model_type": ', ["invalid JSON", "line 1"], id="json-syntax"),
])
def test_unreadable_model_file(tmp_path: Path, name: str, content: str | bytes, fixes: list[str]) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    run = cli("solve", path, "dgx-h100", "--gpus", "8", *FAST)
    assert_bad_input(run, *fixes, path=path)


def test_unreadable_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("gpu: {name: H100\n")
    run = cli("solve", "llama-3.1-8b", path, "--gpus", "8", *FAST)
    assert_bad_input(run, "invalid YAML", path=path)


@pytest.mark.parametrize("which", ["model", "cluster"])
def test_missing_file(tmp_path: Path, which: str) -> None:
    path = tmp_path / "nope" / f"{which}.yaml"
    args = ("solve", path, "dgx-h100") if which == "model" else ("solve", "llama-3.1-8b", path)
    run = cli(*args, "--gpus", "8", *FAST)
    assert_bad_input(run, "file not found", "check the path", path=path)


def test_hf_config_with_unsupported_model_type(tmp_path: Path) -> None:
    config = json.loads((HF_FIXTURES / "llama-3.1-8b.json").read_text())
    config["model_type"] = "mamba"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    run = cli("solve", path, "dgx-h100", "--gpus", "8", *FAST)
    assert_bad_input(run, "model_type", "'mamba'", "llama", "YAML", path=path)


def test_hf_config_missing_key(tmp_path: Path) -> None:
    config = json.loads((HF_FIXTURES / "llama-3.1-8b.json").read_text())
    del config["hidden_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    run = cli("solve", path, "dgx-h100", "--gpus", "8", *FAST)
    assert_bad_input(run, "hidden_size", "missing", path=path)


@pytest.mark.parametrize("case", ["closing-tag-in-value", "brackets-in-file-name",
                                  "brackets-in-bundled-name"])
def test_brackets_in_user_text_are_printed_verbatim(tmp_path: Path, case: str) -> None:
    data = _load_yaml(MODELS / "llama-3.1-8b.yaml")
    if case == "closing-tag-in-value":
        data["hidden_size"] = "[/b]"
        path = _write_yaml(tmp_path / "model.yaml", data)
        run = cli("solve", path, "dgx-h100", "--gpus", "8", *FAST)
        assert_bad_input(run, "hidden_size", "'[/b]'", path=path)
    elif case == "brackets-in-file-name":
        data["hiden_dropout"] = 0.1
        path = _write_yaml(tmp_path / "run[v2].yaml", data)
        run = cli("solve", path, "dgx-h100", "--gpus", "8", *FAST)
        assert_bad_input(run, "hiden_dropout", path=path)
    else:
        run = cli("solve", "llama-3.1-8b", "dgx-h100[/bold]", "--gpus", "8", *FAST)
        assert_bad_input(run, "dgx-h100[/bold]")


# ----------------------------------------------------------------------------- bundled names


def test_unknown_bundled_cluster_did_you_mean() -> None:
    run = cli("solve", "llama-3.1-70b", "dgx-h1000")
    assert_bad_input(run, "unknown cluster 'dgx-h1000'", "did you mean 'dgx-h100'", "autoshard clusters")


def test_unknown_bundled_model_did_you_mean() -> None:
    run = cli("solve", "lama-3.1-8b", "dgx-h100")
    assert_bad_input(run, "unknown model 'lama-3.1-8b'", "did you mean 'llama-3.1-8b'", "autoshard models")


def test_unknown_name_without_close_match_lists_the_way_out() -> None:
    run = cli("evaluate", "llama-3.1-8b", "zzzzzzzz", "--tp", "8", "--pp", "1")
    assert_bad_input(run, "unknown cluster 'zzzzzzzz'", "autoshard clusters", "path")


def test_did_you_mean_through_console_script() -> None:
    run = script("solve", "llama-3.1-70b", "dgx-h1000")
    assert_bad_input(run, "did you mean 'dgx-h100'")


# ----------------------------------------------------------------------------- bad CLI values


@pytest.mark.parametrize(("cluster", "gpus", "fixes"), [
    pytest.param("dgx-h100", 7, ["7 GPUs", "8"], id="not-a-divisor-of-a-node"),
    pytest.param("dgx-h100", 12, ["12 GPUs", "8-GPU nodes"], id="not-whole-nodes"),
    pytest.param("gb200-nvl72", 82, ["82 GPUs", "4-GPU nodes"], id="not-whole-trays"),
    pytest.param("mixed-h100-a100", 8, ["heterogeneous", "YAML"], id="heterogeneous-cluster"),
])
def test_bad_gpus(cluster: str, gpus: int, fixes: list[str]) -> None:
    run = cli("solve", "llama-3.1-8b", cluster, "--gpus", gpus, *FAST)
    assert_bad_input(run, "--gpus", *fixes)


@pytest.mark.parametrize("gpus", [7, 12])
def test_bad_gpus_suggests_a_valid_count(gpus: int) -> None:
    run = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", gpus, *FAST)
    assert run.code == 2, str(run)
    assert re.search(r"--gpus \d+", run.flat), f"no concrete --gpus N suggested\n{run}"


def test_evaluate_tp_not_dividing_heads() -> None:
    run = cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "24", "--tp", "3", "--pp", "1")
    assert_bad_input(run, "TP 3", "32 attention heads", "must divide")


@pytest.mark.parametrize(("gpus", "degrees", "fixes"), [
    pytest.param(8, ["--tp", "4", "--pp", "4"], ["TP x CP x PP = 16", "8 GPUs", "change the degrees"],
                 id="product-exceeds-gpus"),
    pytest.param(64, ["--tp", "8", "--pp", "3"], ["TP x CP x PP = 24", "64 GPUs", "change the degrees"],
                 id="product-not-dividing"),
    pytest.param(16, ["--tp", "8", "--pp", "1", "--cp", "3"], ["= 24", "16 GPUs"], id="cp-not-dividing"),
    pytest.param(8, ["--tp", "2", "--pp", "2", "--dp", "4"], ["--dp", "use --dp 2", "--gpus 16"],
                 id="dp-inconsistent"),
])
def test_evaluate_degrees_not_dividing_gpus(gpus: int, degrees: list[str], fixes: list[str]) -> None:
    run = cli("evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", gpus, *degrees)
    assert_bad_input(run, *fixes)


def test_evaluate_layers_not_splittable_by_pp_predicts_megatrons_layout() -> None:
    """32 layers over PP 3: Megatron-LM needs a layout flag; 32 + loss = 33 = 3 x 11 is the first that works."""
    run = cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "48", "--tp", "1", "--pp", "3", "--json")
    assert run.code == 0, str(run)
    assert "32 decoder layers do not split evenly" in run.stderr
    assert "--account-for-loss-in-pipeline-split" in run.stderr
    plan = json.loads(run.stdout)
    assert [len(s["layers"]) for s in plan["plan"]["stages"]] == [12, 11, 11]  # E+11 | 11 | 10+L
    assert "--account-for-loss-in-pipeline-split" in plan["launch"]["megatron"]


def test_evaluate_batch_not_divisible() -> None:
    run = cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "8", "--pp", "1",
              "--mbs", "3", "--global-batch-size", "8")
    assert_bad_input(run, "--mbs", "global batch 8", "change --mbs or --global-batch-size")


@pytest.mark.parametrize("command", [
    ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", *FAST],
    ["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "8", "--pp", "1"],
], ids=["solve", "evaluate"])
def test_bad_precision(command: list[str]) -> None:
    run = cli(*command, "--precision", "int8")
    assert_bad_input(run, "precision", "'bf16', 'fp8' or 'fp4'", "'int8'")


@pytest.mark.parametrize(("extra", "option"), [
    pytest.param(["--gpus", "0"], "--gpus", id="gpus-zero"),
    pytest.param(["--gpus", "eight"], "--gpus", id="gpus-not-int"),
    pytest.param(["--tp", "0"], "--tp", id="tp-zero"),
    pytest.param(["--recompute", "sometimes"], "--recompute", id="recompute-enum"),
    pytest.param(["--zero-stage", "5"], "--zero-stage", id="zero-stage-range"),
    pytest.param(["--mode", "infer"], "--mode", id="mode-enum"),
    pytest.param(["--bogus-flag"], "--bogus-flag", id="unknown-option"),
])
def test_option_parse_errors(extra: list[str], option: str) -> None:
    run = cli("solve", "llama-3.1-8b", "dgx-h100", *extra)
    assert_bad_input(run, option)


def test_serving_launcher_in_train_mode() -> None:
    run = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--target", "vllm", *FAST)
    assert_bad_input(run, "--target", "--mode serve")


def test_evaluate_without_cluster() -> None:
    run = cli("evaluate", "llama-3.1-8b")
    assert_bad_input(run, "CLUSTER")


@pytest.mark.parametrize(("degrees", "fixes"), [
    pytest.param(["--tp", "3"], ["--tp", "heads"], id="tp-not-dividing-heads"),
    pytest.param(["--tp", "4", "--pp", "4"], ["--tp", "8 GPUs"], id="product-exceeds-gpus"),
    pytest.param(["--pp", "3"], ["--pp", "8 GPUs"], id="pp-not-dividing-gpus"),
])
def test_solve_pins_are_validated_like_evaluate(degrees: list[str], fixes: list[str]) -> None:
    run = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", *degrees, *FAST)
    assert_bad_input(run, *fixes)


@pytest.mark.parametrize(("extra", "fixes"), [
    pytest.param(["--gpus", "8,x"], ["--gpus", "comma-separated", "64,128"], id="gpus-not-numbers"),
    pytest.param(["--gpus", "0"], ["--gpus", "positive"], id="gpus-zero"),
    pytest.param(["--gpus", ","], ["--gpus", "positive"], id="gpus-empty"),
    pytest.param(["--gpus", "8", "--price", "dgx-h100=abc"], ["--price", "CLUSTER=USD_PER_GPU_HOUR"],
                 id="price-not-a-number"),
    pytest.param(["--gpus", "8", "--price", "dgx-h100"], ["--price", "CLUSTER=USD_PER_GPU_HOUR"],
                 id="price-without-equals"),
    pytest.param(["--gpus", "8", "--price", "dgx-h100=-2"], ["--price", "positive"], id="price-negative"),
])
def test_study_bad_lists(extra: list[str], fixes: list[str]) -> None:
    run = cli("study", "llama-3.1-8b", "--cluster", "dgx-h100", *extra, "--time-limit", "5")
    assert_bad_input(run, *fixes)


# ----------------------------------------------------------------------------- infeasible: exit 1


def test_infeasible_says_what_is_missing() -> None:
    run = cli("solve", "llama-3.1-405b", "dgx-a100-40gb", "--gpus", "8", *FAST)
    assert_infeasible(run, "needs", "GiB", "--gpus")
    assert run.stdout == "", str(run)


def test_infeasible_json_mode_keeps_stdout_clean() -> None:
    run = cli("solve", "llama-3.1-405b", "dgx-a100-40gb", "--gpus", "8", "--json", *FAST)
    assert_infeasible(run, "needs", "GiB")
    obj = json.loads(run.stdout)  # one whole object (no half plan): status, no plan, the message
    assert obj["status"] == "infeasible" and obj["plan"] is None and "needs" in obj["error"], str(run)


def test_infeasible_through_console_script() -> None:
    run = script("solve", "llama-3.1-405b", "dgx-a100-40gb", "--gpus", "8", *FAST)
    assert_infeasible(run, "needs", "GiB")


def test_evaluate_plan_that_does_not_fit() -> None:
    run = cli("evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "8", "--tp", "8", "--pp", "1")
    # 95.2 GiB over with 21.5 GiB of activations: full recompute could not fit it, more GPUs can
    assert_infeasible(run, "does not fit", "needs", "GiB", "over by 95.2 GiB); try more GPUs (--gpus)")
    assert "--recompute full" not in run.flat, str(run)


def test_infeasible_for_divisibility_does_not_report_zero_memory() -> None:
    run = cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mbs", "3", "--global-batch-size", "8",
              *FAST)
    assert run.code in (1, 2), str(run)
    assert "0 GiB each" not in run.flat, str(run)
    assert "divisible" in run.flat, str(run)


def test_fp4_launch_on_a_gpu_without_fp4_tensor_cores(tmp_path: Path) -> None:
    """A Megatron launch with --fp4-format e2m1 evaluated on H100 (no FP4 tensor cores): exit 2 naming the
    command and what to train in instead; the same launch on B200 is predicted in FP4."""
    launch = tmp_path / "launch.sh"
    made = cli("solve", "llama-3.1-8b", "dgx-b200", "--gpus", "8", "--precision", "fp4", "--emit", "megatron",
               "-o", launch, *FAST)
    assert made.code == 0 and "--fp4-format e2m1" in launch.read_text(), str(made)
    run = cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--from-megatron", launch)
    assert_bad_input(run, "--from-megatron", "FP4 (NVFP4) training needs FP4 tensor cores", "train in fp8 or bf16")
    ok = cli("evaluate", "llama-3.1-8b", "dgx-b200", "--gpus", "8", "--from-megatron", launch, "--json")
    assert ok.code == 0, str(ok)
    plan = json.loads(ok.stdout)
    assert plan["plan"]["precision"] == "fp4" and plan["predicted"]["mfu_peak"] == "fp4 dense"
