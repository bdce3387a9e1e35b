"""Hostile input: one table of inputs that used to crash, hang or be silently accepted, each with the exit
code and the message fragment it must now give (bad input: exit 2 naming the field/flag and the bound),
plus the --json stdout contract, default memory headroom and atomic study output.

Every case runs the real CLI in-process (typer's CliRunner); an exception escaping the app fails the
test (it would be a traceback). Files are written by editing the bundled YAML text line by line, so
YAML 1.1 spellings (`64:00`, `yes`, duplicate keys) reach the loader exactly as a user would type them.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.cli import app

REPO = Path(__file__).resolve().parents[2]
MODEL = (REPO / "models" / "llama-3.1-8b.yaml").read_text()
CLUSTER = (REPO / "clusters" / "dgx-h100.yaml").read_text()
FAST = ["--time-limit", "5", "--workers", "1"]
MEGATRON = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
            "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 --global-batch-size 64 --bf16")


def run_cli(*args: object) -> tuple[int, str, str]:
    argv = [str(a) for a in args]
    result = CliRunner().invoke(app, argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        tb = "".join(traceback.format_exception(*result.exc_info))
        pytest.fail(f"`autoshard {' '.join(argv)}` raised instead of reporting:\n{tb}")
    assert "Traceback" not in result.stdout + result.stderr
    return result.exit_code, result.stdout, result.stderr


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _loop(tmp: Path) -> Path:
    """A symbolic link that leads back to itself through another."""
    (tmp / "loop-a.yaml").symlink_to(tmp / "loop-b.yaml")
    (tmp / "loop-b.yaml").symlink_to(tmp / "loop-a.yaml")
    return tmp / "loop-a.yaml"


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def model_file(tmp: Path, old: str = "", new: str = "", *, extra: str = "") -> Path:
    path = tmp / "model.yaml"
    path.write_text((_replace(MODEL, old, new) if old else MODEL) + extra)
    return path


def cluster_file(tmp: Path, old: str = "", new: str = "") -> Path:
    path = tmp / "cluster.yaml"
    path.write_text(_replace(CLUSTER, old, new) if old else CLUSTER)
    return path


# (id, builder(tmp) -> argv, exit code, fragments that must all appear in stderr)
def _m(old: str, new: str):
    return lambda t: ["solve", model_file(t, old, new), "dgx-h100", "--gpus", "8", *FAST]


def _c(old: str, new: str):
    return lambda t: ["solve", "llama-3.1-8b", cluster_file(t, old, new), "--gpus", "8", *FAST]


def _nested(t: Path, suffix: str) -> list:
    path = t / f"deep{suffix}"
    path.write_text("[" * 500 + "]" * 500 if suffix == ".json" else "a: " + "[" * 500 + "]" * 500 + "\n")
    return ["solve", path, "dgx-h100", "--gpus", "8"]


def _huge(t: Path) -> list:
    path = t / "huge.yaml"
    path.write_text(MODEL + "".join(f"# padding line {i} {'x' * 80}\n" for i in range(30_000)))
    return ["solve", path, "dgx-h100", "--gpus", "8"]


CASES = [
    # --- CLI numbers: bounds and NaN/inf
    ("gpus-1e30", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", str(10**30)], 2, ["--gpus", "131072"]),
    ("seq-len-1e9", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--seq-len", str(10**9)], 2,
     ["--seq-len", "1048576"]),
    ("gbs-1e18", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--global-batch-size", str(10**18)], 2,
     ["--global-batch-size", "1048576"]),
    ("seed-2^32", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--seed", str(2**32)], 2,
     ["--seed", "2147483647"]),
    ("workers-2^31", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--workers", str(2**31)], 2,
     ["--workers", "256"]),
    # a NaN is named as such (click-style range checks called it "should be less than or equal to 86400")
    ("time-limit-nan", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--time-limit", "nan"], 2,
     ["--time-limit", "nan is not a finite number: give one from 0.5 to 86400"]),
    ("study-time-limit-nan", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                                        "--time-limit", "NaN"], 2, ["--time-limit", "NaN is not a finite number"]),
    ("evaluate-time-limit-low", lambda t: ["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--time-limit",
                                           "0.1"], 2, ["--time-limit", "0.1 is out of range: give a number from 0.5"]),
    ("tpot-nan", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", "--tpot-ms",
                            "nan"], 2, ["--tpot-ms", "nan is not a finite number: give one from 0.001 to 3.6e+06"]),
    ("memory-fraction-text", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--memory-fraction",
                                        "most"], 2, ["--memory-fraction", "'most' is not a number"]),
    ("kv-cache-nvfp4", lambda t: ["solve", "llama-3.1-8b", "dgx-b200", "--gpus", "8", "--mode", "serve",
                                  "--kv-cache-dtype", "nvfp4"], 2, ["kv_cache_dtype", "must be bf16 or fp8, got nvfp4"]),
    ("study-serve-nvfp4-no-checkpoint", lambda t: ["study", "llama-3.1-8b", "--mode", "serve", "--cluster", "dgx-h100",
                                                   "--gpus", "8", "--precision", "nvfp4"], 2,
     ["--precision", "nvfp4 weights need a published nvfp4 checkpoint"]),
    ("request-rate-inf", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                    "--request-rate", "inf"], 2, ["--request-rate", "inf is not a finite number"]),
    ("tokens-inf", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tokens", "inf"], 2,
     ["--tokens", "inf is not a finite number"]),
    ("study-gpus-1e30", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", f"8,{10**30}"], 2,
     ["--gpus", "at most 131072"]),
    # no size is whole nodes of the cluster: bad input like solve's --gpus 12 (was exit 1, "no plan")
    ("study-no-whole-node-size", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "12,20"], 2,
     ["--gpus", "dgx-h100 x 12: 12 GPUs is not a whole number of 8-GPU nodes", "dgx-h100 x 20"]),
    ("study-too-many-sizes", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus",
                                        ",".join(str(8 * k) for k in range(1, 200))], 2, ["at most", "64 sizes"]),
    ("price-nan", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                             "--price", "dgx-h100=nan"], 2, ["--price", "finite", "nan"]),
    ("price-inf", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                             "--price", "dgx-h100=inf"], 2, ["--price", "finite", "inf"]),
    # --- model file fields
    ("hidden-1e400", _m("hidden_size: 4096", "hidden_size: 1e400"), 2, ["hidden_size", "finite"]),
    ("hidden-huge-int", _m("hidden_size: 4096", f"hidden_size: {10**40}"), 2,
     ["hidden_size", "less than or equal to 131072"]),
    ("layers-1e6", _m("count: 32", "count: 1000000"), 2, ["layers[1].count", "less than or equal to 1024"]),
    ("vocab-huge", _m("vocab_size: 128256", "vocab_size: 99999999999"), 2, ["vocab_size", "4194304"]),
    ("sexagesimal", _m("ffn_hidden_size: 14336", "ffn_hidden_size: 64:00"), 2, ["ffn_hidden_size", "'64:00'"]),
    ("yes-as-number", _m("num_kv_heads: 8", "num_kv_heads: yes"), 2, ["num_kv_heads", "'yes'"]),
    ("true-as-number", _m("num_kv_heads: 8", "num_kv_heads: true"), 2, ["num_kv_heads", "boolean"]),
    ("duplicate-key", _m("hidden_size: 4096", "hidden_size: 4096\nhidden_size: 8192"), 2,
     ["duplicate key 'hidden_size'", "line"]),
    ("tokens-inf-yaml", _m("tokens: 1.5e13", "tokens: .inf"), 2, ["training.tokens", "finite"]),
    ("control-char-name", _m("name: llama-3.1-8b", 'name: "a\\nb"'), 2, ["field 'name'", "control characters"]),
    ("checkpoint-bf16", _m("weights: fp8", "weights: bf16"), 2, ["checkpoints[0]", "quantized weights"]),
    ("checkpoint-repo-with-shell", _m("repo: nvidia/Llama-3.1-8B-Instruct-FP8", "repo: 'a/b; touch x'"), 2,
     ["checkpoints[0].repo", "pattern"]),
    ("nested-yaml", lambda t: _nested(t, ".yaml"), 2, ["nested", "32"]),
    ("nested-json", lambda t: _nested(t, ".json"), 2, ["nested", "32"]),
    ("file-2mb", _huge, 2, ["MiB", "at most 1 MiB"]),
    ("billion-laughs", lambda t: ["solve", _write(t / "lol.yaml", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)) + "name: *a8\n"), "dgx-h100"], 2,
     ["expands to more than 100000 values"]),
    ("file-name-too-long", lambda t: ["solve", "x" * 5000 + ".yaml", "dgx-h100"], 2, ["too long"]),
    ("model-is-a-directory", lambda t: ["solve", str(t) + "/", "dgx-h100"], 2, ["directory"]),
    # a UTF-8 byte-order mark (as Windows editors save) is read past, in JSON as in YAML; it used to be
    # "invalid JSON ... Unexpected UTF-8 BOM (decode using utf-8-sig)"
    ("json-with-bom", lambda t: ["solve", _write_bytes(t / "config.json", b"\xef\xbb\xbf" + (
        REPO / "tests" / "fixtures" / "hf" / "llama-3.1-8b.json").read_bytes()), "dgx-h100", "--gpus", "8", *FAST],
     0, []),
    ("yaml-with-bom", lambda t: ["solve", _write_bytes(t / "m.yaml", b"\xef\xbb\xbf" + MODEL.encode()), "dgx-h100",
                                 "--gpus", "8", *FAST], 0, []),
    ("json-not-utf8", lambda t: ["solve", _write_bytes(t / "config.json", b'{"model_type": "caf\xe9"}'),
                                 "dgx-h100"], 2, ["config.json", "not UTF-8"]),
    ("empty-model-file", lambda t: ["solve", _write(t / "m.yaml", "# nothing yet\n"), "dgx-h100"], 2,
     ["m.yaml", "the file is empty"]),  # was "expected a mapping ..., got NoneType"
    # arguments swapped: named as such, not a list of unknown fields or "unknown model 'dgx-h100'"
    ("swapped-files", lambda t: ["solve", cluster_file(t), model_file(t)], 2,
     ["cluster.yaml", "this is a cluster file (gpu, node, num_nodes), not a model file"]),
    ("swapped-names", lambda t: ["solve", "dgx-h100", "llama-3.1-8b"], 2, ["'dgx-h100' is a bundled cluster, not a model"]),
    ("model-as-study-cluster", lambda t: ["study", "llama-3.1-8b", "--cluster", model_file(t), "--gpus", "8"], 2,
     ["model.yaml", "this is a model file", "not a cluster file"]),
    # --- cluster file fields
    # a flat (single-pool) cluster's top level holds the pool's fields: they are the ones listed and matched
    ("flat-cluster-typo", _c("num_nodes: 128", "num_node: 128"), 2,
     ["field 'num_node'", "did you mean 'num_nodes'?", "gpu, inter_pool_gbps, name, node, num_nodes"]),
    ("gpus-per-node-1e6", _c("gpus_per_node: 8", "gpus_per_node: 1e6"), 2, ["gpus_per_node", "576"]),
    ("num-nodes-2^40", _c("num_nodes: 128", f"num_nodes: {2**40}"), 2, ["num_nodes", "131072"]),
    ("bf16-tflops-1e-12", _c("bf16_tflops: 989", "bf16_tflops: 1e-12"), 2,
     ["bf16_tflops", "greater than or equal to 1"]),
    ("hbm-1e30", _c("hbm_gib: 79.6", "hbm_gib: 1e30"), 2, ["hbm_gib", "65536"]),
    ("hbm-inf", _c("hbm_gib: 79.6", "hbm_gib: .inf"), 2, ["hbm_gib", "finite"]),
    # HBM below the 4 GiB runtime reserve: was "a GPU has -3.6 GiB of its 0.5 GiB for a rank" and
    # "Nearest fixes: ." (empty)
    ("hbm-below-the-reserve", _c("hbm_gib: 79.6", "hbm_gib: 0.5"), 1,
     ["The runtime reserve alone", "4.0 GiB per GPU", "more than the 0.4 GiB of its 0.5 GiB",
      "Nearest fixes: GPUs with more memory (gpu.hbm_gib"]),
    ("gemm-half-dim-inf", _c("  efficiency:\n", "  efficiency:\n    gemm_half_dim: .inf\n"), 2,
     ["gemm_half_dim", "finite"]),
    ("latency-inf", _c("  efficiency:\n", "  efficiency:\n    inter_node_latency_us: .inf\n"), 2,
     ["inter_node_latency_us", "finite"]),
    # --- --from-megatron / --from-vllm
    ("megatron-mbs-0", lambda t: ["evaluate", "dgx-h100", "--from-megatron", MEGATRON + " --micro-batch-size 0"], 2,
     ["--micro-batch-size must be positive"]),
    ("megatron-solve-mbs-0", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", *FAST,
                                        "--from-megatron", MEGATRON + " --micro-batch-size 0"], 2,
     ["--micro-batch-size must be positive"]),
    ("megatron-script-2mb", lambda t: ["evaluate", "dgx-h100", "--from-megatron",
                                       _write(t / "big.sh", MEGATRON + " --micro-batch-size 1\n" + "# pad\n" * 400_000)],
     2, ["MiB", "at most 1 MiB"]),
    # a directory was "file not found", a binary file the codec's own words
    ("megatron-script-is-a-directory", lambda t: ["evaluate", "dgx-h100", "--from-megatron", str(t) + "/"], 2,
     ["this is a directory, not a launch script"]),
    ("megatron-script-not-utf8", lambda t: ["evaluate", "dgx-h100", "--from-megatron",
                                            _write_bytes(t / "run.sh", b"\xff\xfe torchrun pretrain_gpt.py")], 2,
     ["run.sh", "the launch script is not UTF-8 text"]),
    ("megatron-layout-1e11", lambda t: ["evaluate", "dgx-h100", "--from-megatron", MEGATRON + " --micro-batch-size 1 "
                                        "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                                        "'Et*16|t*100000000000L'"], 2, ["repeats something", "decoder layers"]),
    ("megatron-moe-freq-1e10", lambda t: ["evaluate", "dgx-h100", "--from-megatron", MEGATRON + " --micro-batch-size 1 "
                                          "--num-experts 8 --moe-layer-freq '([0]*100000)*100000'"], 2,
     ["--moe-layer-freq"]),
    ("megatron-tp-0", lambda t: ["evaluate", "dgx-h100", "--from-megatron",
                                 MEGATRON + " --micro-batch-size 1 --tensor-model-parallel-size 0"], 2,
     ["--tensor-model-parallel-size must be positive"]),
    ("megatron-layers-1e9", lambda t: ["evaluate", "dgx-h100", "--from-megatron",
                                       MEGATRON.replace("--num-layers 32", "--num-layers 1000000000")], 2,
     ["--num-layers 1000000000", "at most 1024"]),
    # TP that does not divide the processes torchrun starts: was "the command does not say how many GPUs it runs
    # on (no torchrun --nproc-per-node/--nnodes)" about a command that says --nproc-per-node 8
    ("megatron-tp-vs-nproc", lambda t: ["evaluate", "dgx-h100", "--from-megatron",
                                        MEGATRON + " --micro-batch-size 1 --tensor-model-parallel-size 3"], 2,
     ["the launcher starts 8 processes", "TP x PP x CP = 3 x 1 x 1", "or pass --gpus"]),
    ("megatron-gpus-override", lambda t: ["evaluate", "dgx-h100", "--gpus", "16", "--from-megatron",
                                          MEGATRON + " --micro-batch-size 1 --use-distributed-optimizer"], 0,
     ["--gpus 16 replaces the 8 processes the command's launcher starts"]),  # was silent
    ("megatron-with-tp-pin", lambda t: ["evaluate", "dgx-h100", "--tp", "4", "--from-megatron",
                                        MEGATRON + " --micro-batch-size 1"], 2, ["--tp would be ignored"]),
    ("vllm-with-pp-pin", lambda t: ["evaluate", "dgx-h100", "--gpus", "8", "--pp", "2", "--from-vllm",
                                    "vllm serve meta-llama/Llama-3.1-8B"], 2, ["--pp would be ignored", "--from-vllm"]),
    ("vllm-unknown-quantization", lambda t: ["evaluate", "dgx-h100", "--gpus", "8", "--from-vllm",
                                             "vllm serve meta-llama/Llama-3.1-8B --quantization foo"], 2,
     ["--quantization foo"]),
    ("vllm-kv-int4", lambda t: ["evaluate", "dgx-h100", "--gpus", "8", "--from-vllm",
                                "vllm serve meta-llama/Llama-3.1-8B --kv-cache-dtype int4"], 2,
     ["--kv-cache-dtype int4"]),
    # --gpus below the command's own GPUs: was "TP 8 spans 2 NVLink domains of 4 GPUs ... evaluate the same GPUs
    # as TP 4 x PP 2" (8 GPUs, on 4)
    ("vllm-gpus-below-the-command", lambda t: ["evaluate", "dgx-h100", "--gpus", "4", "--from-vllm",
                                               "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 8"], 2,
     ["--gpus", "the command runs TP 8 x PP 1 x DP 1 = 8 GPUs; --gpus 4 is fewer: drop --gpus or give at least 8"]),
    # no plan for the command as read: the reading that explains it is said (it was on the lost plan only)
    # (its former row, --tp 8 --dp 8 --enable-dp-attention, read as 8 replicas of TP 1, is now SGLang's attention DP
    # with TP experts and starts: tests/emit/test_sglang_tp_moe.py)
    ("sglang-ep-below-tp", lambda t: ["evaluate", "dgx-h100", "--from-sglang",
                                      "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 "
                                      "--tp 8 --ep-size 4 --quantization fp8"], 1,
     ["deepseek-v3 on 8x H100-SXM5-80GB (TP8 PP1)", "as read from the command: --ep-size 4 differs from --tp-size 8"]),
    # TP across nodes (--tp 16 --nnodes 2) is a line SGLang starts: priced over the network with a note
    # (tests/emit/test_sglang_nodes.py); was refused here. A --nnodes that asks 16 GPUs of an 8-GPU node is not
    ("sglang-tp-beyond-the-node", lambda t: ["evaluate", "dgx-h200", "--gpus", "32", "--from-sglang",
                                             "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 "
                                             "--tp 16 --pp-size 2 --nnodes 2 --dist-init-addr 10.0.0.1:5000"], 2,
     ["field '--nnodes'", "16 a node, and dgx-h200's nodes have 8: pass --nnodes 4"]),
    # an unknown model path named the wrong option (was "field '--from-vllm'" for an SGLang line)
    ("sglang-unknown-model", lambda t: ["evaluate", "dgx-h100", "--gpus", "8", "--from-sglang",
                                        "python -m sglang.launch_server --model-path nosuch/Model --tp 8"], 2,
     ["field '--from-sglang'", "cannot tell which model 'nosuch/Model' is"]),
    ("vllm-unknown-model", lambda t: ["evaluate", "dgx-h100", "--gpus", "8", "--from-vllm",
                                      "vllm serve nosuch/Model -tp 8"], 2,
     ["field '--from-vllm'", "cannot tell which model 'nosuch/Model' is"]),
    # a context past the model's 131,072 positions: the flag to change and the limit (was "max_model_len 201000
    # exceeds the model's max_position_embeddings" for --input-len; exit 1 "no plan" from a launch line)
    ("serve-input-beyond-the-model", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                                "--input-len", "200000", *FAST], 2,
     ["field '--input-len'", "--input-len 200,000 + --output-len 1,000 = 201,000 tokens", "131,072-token context",
      "at most 131072 tokens"]),
    ("serve-max-model-len-below-the-requests", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode",
                                                           "serve", "--max-model-len", "10", *FAST], 2,
     ["max_model_len (10) is shorter than input_len + output_len (2000): raise max_model_len (--max-model-len) or "
      "shorten the requests (--input-len, --output-len)"]),
    ("serve-max-model-len-beyond-the-model", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode",
                                                        "serve", "--max-model-len", "200000", *FAST], 2,
     ["field '--max-model-len'", "131,072-token context", "use --max-model-len 131072 or less"]),
    ("vllm-max-model-len-beyond-the-model", lambda t: ["evaluate", "dgx-h100", "--gpus", "8", "--from-vllm",
                                                       "vllm serve meta-llama/Llama-3.1-8B --max-model-len 1000000"], 2,
     ["field '--max-model-len'", "--max-model-len 1,000,000", "131,072-token context",
      "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", "use --max-model-len 131072 or less"]),
    ("sglang-context-length-beyond-the-model", lambda t: ["evaluate", "dgx-h100", "--gpus", "8", "--from-sglang",
                                                          "python -m sglang.launch_server --model-path "
                                                          "meta-llama/Llama-3.1-8B --context-length 1000000"], 2,
     ["field '--context-length'", "131,072-token context", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
      "use --context-length 131072 or less"]),
    ("vllm-input-beyond-the-model", lambda t: ["evaluate", "dgx-h100", "--gpus", "8", "--input-len", "200000",
                                               "--from-vllm", "vllm serve meta-llama/Llama-3.1-8B"], 2,
     ["field '--input-len'", "131,072-token context"]),
    # a rate past what 131,072 GPUs sustain: was "use at least 150256 GPUs (--gpus)", which --gpus refuses;
    # 6.66 req/s per GPU at TP1 (1000+1000 tokens) -> 131,072 GPUs sustain about 872,000 req/s
    ("serve-rate-beyond-the-largest-cluster", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode",
                                                         "serve", "--request-rate", "1e6", *FAST], 1,
     ["needs about 150,256 GPUs", "more than the 131,072 GPUs of the largest cluster autoshard plans",
      "sustains about 872,", "split the traffic over 2 deployments", "--request-rate 500000"]),
    # --- contradictions that used to be exit 1 or silently ignored
    # a two-chunk layout at PP 1: was "virtual pipeline stages (vpp > 1) need pipeline parallelism", about a VPP
    # the user never gave
    ("layout-chunks-at-pp1", lambda t: ["evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp",
                                        "1", "--layout", "Et*40|t*40L"], 2,
     ["'Et*40|t*40L' has 2 chunks, which with PP 1 is VPP 2", "PP > 1"]),
    ("vpp-with-pp1", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--vpp", "4", "--pp", "1", *FAST],
     2, ["--vpp", "--pp 1"]),
    # pins no layout is legal for: the fix for the pinned knob (was "a global batch divisible by more
    # micro-batch x DP sizes" whatever the pin)
    ("tp-beyond-nvlink", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "16", "--tp", "16", *FAST], 1,
     ["with pins (tp=16): 1 x TP > NVLink domain (8 GPUs)", "Nearest fixes: TP within one 8-GPU NVLink domain "
      "(--tp 8 or less); fewer pinned knobs; or another --gpus."]),
    ("vpp-beyond-layers", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--pp", "2", "--vpp", "20",
                                     *FAST], 1,
     ["more model chunks than layers", "Nearest fixes: at most 32 model chunks, one per decoder layer (a smaller "
      "PP x VPP); fewer pinned knobs"]),
    ("cp-shard-below-512", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--cp", "2", "--seq-len",
                                      "512", *FAST], 1,
     ["CP shard shorter than 512 tokens", "Nearest fixes: a longer --seq-len or a smaller --cp (a CP rank needs at "
      "least 512 tokens); fewer pinned knobs"]),
    ("etp-on-dense", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "2", "--etp", "8", *FAST],
     2, ["--etp", "dense"]),
    ("recompute-layers-beyond-stage", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--pp", "2",
                                                 "--recompute-num-layers", "100", *FAST], 2,
     ["--recompute-num-layers", "at most 31"]),
    # more layers on the first/last rank than the model has: was "leave -8 of 32 layers for 1 other pipeline ranks"
    ("first-rank-beyond-the-model", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--pp", "2",
                                               "--decoder-first-pipeline-num-layers", "40", *FAST], 2,
     ["put 40 decoder layers on the first pipeline rank, more than the model's 32"]),
    ("first-and-last-short-of-the-model", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--pp", "2",
                                                     "--decoder-first-pipeline-num-layers", "10",
                                                     "--decoder-last-pipeline-num-layers", "10", *FAST], 2,
     ["put 20 decoder layers on the first and last pipeline ranks, not the model's 32", "add up to 32"]),
    ("first-and-last-take-all", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--pp", "4",
                                           "--decoder-first-pipeline-num-layers", "16",
                                           "--decoder-last-pipeline-num-layers", "16", *FAST], 2,
     ["none for the 2 other pipeline ranks"]),
    ("seq-beyond-learned-positions", lambda t: ["solve", "gpt3-175b", "dgx-h100", "--gpus", "64", "--seq-len", "4096",
                                                *FAST], 2, ["--seq-len", "2048 learned position embeddings"]),
    ("fp8-on-a100", lambda t: ["solve", "llama-3.1-8b", "dgx-a100-80gb", "--gpus", "8", "--precision", "fp8", *FAST],
     2, ["FP8", "A100"]),
    ("fp4-on-h100", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--precision", "fp4", *FAST],
     2, ["--precision", "FP4 (NVFP4) training needs FP4 tensor cores", "H100-SXM5-80GB", "train in fp8 or bf16"]),
    # solve --from-megatron compares the command with a solve over every knob: a pin beside it was dropped silently
    *[(f"from-megatron-ignores-{flag}", lambda t, f=flag, v=value: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8",
                                                                   "--from-megatron", MEGATRON, f, *v, *FAST],
       2, [flag, "would be ignored", "solve without --from-megatron"])
      for flag, value in (("--tp", ["2"]), ("--moe-a2a-overlap", []), ("--precision", ["fp8"]))],
    *[(f"serve-ignores-{flag}", lambda t, f=flag, v=value: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8",
                                                            "--mode", "serve", f, *v, *FAST], 2, [flag, "--mode train"])
      for flag, value in (("--mbs", ["2"]), ("--recompute", ["full"]), ("--cp", ["2"]), ("--zero-stage", ["1"]),
                          ("--vpp", ["2"]), ("--memory-fraction", ["0.8"]), ("--from-megatron", [MEGATRON]))],
    *[(f"train-ignores-{flag}", lambda t, f=flag, v=value: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", f, *v,
                                                            *FAST], 2, [flag, "--mode serve"])
      for flag, value in (("--input-len", ["100"]), ("--request-rate", ["5"]), ("--weight-dtype", ["fp8"]),
                          ("--kv-cache-dtype", ["fp8"]))],
    # the script was --emit's launcher whatever --target said
    ("serve-target-vs-emit", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                        "--target", "sglang", "--emit", "vllm", *FAST], 2,
     ["--emit", "--target sglang and --emit vllm name different engines"]),
    ("evaluate-ep-on-dense", lambda t: ["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "1", "--pp", "1",
                                        "--ep", "2"], 2, ["--ep 2", "llama-3.1-8b is dense: drop --ep"]),
    ("evaluate-etp-on-dense", lambda t: ["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "1", "--pp",
                                         "1", "--etp", "2"], 2, ["--etp 2", "is dense: drop --etp"]),
    ("serve-ep-on-dense", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                     "--ep", "2", *FAST], 2, ["--ep", "dense"]),  # was exit 1, "no plan"
    ("serve-tp-not-dividing-heads", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                               "--tp", "3", *FAST], 2, ["--tp", "TP 3 must divide the 32 attention heads",
                                                                        "1, 2, 4, 8, 16, 32"]),
    ("serve-tp-vs-kv-heads", lambda t: ["solve", REPO / "tests" / "fixtures" / "hf" / "phi-4.json", "dgx-h100",
                                        "--gpus", "8", "--mode", "serve", "--tp", "8", *FAST], 2,
     ["--tp", "TP 8 and the 10 KV heads must divide one another", "use one of 1, 2, 5, 10, 20, 40"]),
    ("int4-without-checkpoint", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                           "--weight-dtype", "int4", *FAST], 2, ["int4 checkpoint", "checkpoints:"]),
    # a plan over HBM names only fixes that apply to it: one GPU has no DP to trade for PP or to shard the
    # optimizer over (was "try --recompute full, more PP or Megatron-FSDP (--zero-stage 3)")
    ("overflow-one-gpu", lambda t: ["evaluate", "llama-2-7b", "dgx-h200", "--gpus", "1", "--tp", "1", "--pp", "1",
                                    "--mbs", "2", "--seq-len", "4096", "--global-batch-size", "16", "--recompute",
                                    "selective"], 1, ["over by 12.1 GiB); try --recompute full or more GPUs (--gpus)"]),
    ("overflow-with-dp", lambda t: ["evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "8", "--tp", "1", "--pp", "1",
                                    "--zero-stage", "0"], 1,
     ["try more PP, the distributed optimizer (--zero-stage 1) or more GPUs (--gpus)"]),  # 1,291 GiB over: no
    # recompute, which frees at most the activations (it was offered here too, and for 405B on 8 A100-40GB,
    # 882 GiB over in model states)
    ("overflow-in-model-states", lambda t: ["evaluate", "llama-3.1-405b", "dgx-a100-40gb", "--gpus", "8", "--tp", "8",
                                            "--pp", "1"], 1, ["over by 881.9 GiB); try more GPUs (--gpus)"]),
    # --- output paths, checked before solving
    ("o-is-directory", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--emit", "megatron", "-o", t],
     2, ["-o", "is a directory"]),
    # a DeepSeek config with no routed experts was planned as a dense model (Mixtral's is refused)
    ("hf-deepseek-no-routed-experts", lambda t: ["solve", _write(t / "config.json", json.dumps({
        "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61,
        "hidden_size": 7168, "num_attention_heads": 128, "vocab_size": 129280, "intermediate_size": 18432,
        "n_routed_experts": 0, "moe_intermediate_size": 2048, "num_experts_per_tok": 8})), "dgx-h100", "--gpus", "64",
        *FAST], 2, ["config.json", "'n_routed_experts'", "at least 1"]),
    # a serving study's request lengths are --input-len / --output-len: the training shape was dropped silently
    ("study-serve-seq-len", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                       "--seq-len", "4"], 2, ["--seq-len", "training studies only"]),
    ("study-serve-global-batch", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--mode",
                                            "serve", "--global-batch-size", "3"], 2, ["--global-batch-size"]),
    # MODEL and the command's model contradict each other: the 8B command was planned under the 70B's name
    ("from-megatron-another-model", lambda t: ["solve", "llama-3.1-70b", "dgx-h100", "--from-megatron",
                                               MEGATRON, *FAST], 2,
     ["MODEL/--from-megatron: the command trains another model than llama-3.1-70b", "num_layers: 80 vs 32",
      "give the model the command trains as MODEL"]),
    # a device, a FIFO or a symlink loop as MODEL was "file not found"
    ("model-is-a-device", lambda t: ["solve", "/dev/zero", "dgx-h100", "--gpus", "8", *FAST], 2,
     ["/dev/zero: this is not a regular file"]),
    ("model-is-a-symlink-loop", lambda t: ["solve", _loop(t), "dgx-h100", "--gpus", "8", *FAST], 2,
     ["this symbolic link leads to no file (dangling, or a loop)"]),
    # a 5,000-digit number: Python's "use sys.set_int_max_str_digits()" reached the user
    ("json-number-of-thousands-of-digits", lambda t: ["solve", _write(t / "config.json", '{"model_type": "llama", '
                                                      '"hidden_size": ' + "9" * 5000 + "}"), "dgx-h100", "--gpus", "8",
                                                      *FAST], 2, ["config.json", "thousands of digits"]),
    # FP8 weights already: "quantize the weights" is no fix
    ("serve-tpot-unreachable-fp8", lambda t: ["solve", "llama-3.1-70b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                              "--tpot-ms", "5", "--weight-dtype", "fp8", *FAST], 1,
     ["no plan meets TPOT <= 5 ms", "nearest fix: relax the target or use faster GPUs"]),
    # serving pins that cannot fit one engine are bad input (they were exit 1, "no vLLM engine is legal")
    ("serve-pins-beyond-the-gpus", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                              "--tp", "8", "--pp", "2", *FAST], 2,
     ["--tp/--pp", "TP 8 x PP 2 = 16 GPUs for one engine, more than the 8 GPUs given"]),
    # --dp on a dense model counts aggregated replicas: a split came back with it silently ignored
    ("serve-dp-pin-with-a-split", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                             "--tp", "2", "--dp", "3", *FAST], 2,
     ["--dp pins the replicas of an aggregated deployment", "add --disaggregate off"]),
    # more pipeline ranks than layers: evaluate blamed --decoder-first-pipeline-num-layers, never given
    ("evaluate-pp-beyond-layers", lambda t: ["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "128", "--tp", "2",
                                             "--pp", "64"], 2, ["--pp: PP 64 exceeds the 32 decoder layers"]),
    ("evaluate-chunks-beyond-layers", lambda t: ["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "128", "--tp", "2",
                                                 "--pp", "16", "--vpp", "4"], 2,
     ["--pp/--vpp: PP 16 x VPP 4 = 64 model chunks exceed the 32 decoder layers"]),
    # a device or FIFO is not a script file: writing it hung on a FIFO, and making /dev/null executable
    # (0755) took its write permission from every other user
    ("o-is-a-device", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--emit", "megatron", "-o",
                                 "/dev/null"], 2, ["-o", "/dev/null exists and is not a regular file"]),
    # the script used to replace the model file it was planned from
    ("o-is-the-model-file", lambda t: ["solve", model_file(t), "dgx-h100", "--gpus", "8", "--emit", "megatron", "-o",
                                       t / "model.yaml"], 2, ["-o", "is an input of this command", "another path"]),
    # a missing directory is created (as --out's and --emit k8s's are); a file on the path is refused
    ("o-file-on-the-path", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--emit", "megatron",
                                      "-o", model_file(t) / "x.sh"], 2, ["-o", "is a file, not a directory"]),
    ("o-without-emit", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "-o", t / "x.sh"], 2,
     ["--emit"]),
    # --emit k8s -o takes a directory: an existing one was refused as "a directory: give a file name"
    ("k8s-out-is-a-file", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", "--emit",
                                     "k8s", "-o", model_file(t), *FAST], 2,
     ["model.yaml is a file, not a directory (the directory --emit k8s writes manifests to)"]),
    # manifests already there would be applied with the new ones by the printed `kubectl apply -f DIR`
    ("k8s-out-holds-manifests", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                           "--emit", "k8s", "-o", _write(t / "old-0.yaml", "kind: Deployment\n").parent,
                                           *FAST], 2, ["already holds 1 manifest file(s) (old-0.yaml)", "kubectl apply"]),
    # a directory no one can create files in (root passes os.access there): refused before solving, not a traceback
    # from the study's temporary directory after it
    ("study-out-in-proc", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--out",
                                     "/proc/autoshard-study"], 2, ["--out", "cannot write /proc/autoshard-study (the directory for study.csv, study.md, pareto.png, study.json)"]),
    ("k8s-out-in-proc", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", "--emit",
                                   "k8s", "-o", "/proc/autoshard-k8s", *FAST], 2,
     ["cannot write /proc/autoshard-k8s (the directory --emit k8s writes manifests to)"]),
    # one check behind every output directory (study/files.check_output_dir): the same refusal at each
    ("pareto-out-file-on-the-path", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                               "--pareto", "--out", model_file(t) / "front", *FAST], 2,
     ["--out", "model.yaml is a file, not a directory, so", "cannot be created (the directory for pareto.png)"]),
    ("study-out-file-on-the-path", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                                              "--out", model_file(t) / "study"], 2,
     ["--out", "model.yaml is a file, not a directory, so", "cannot be created (the directory for study.csv"]),
    ("k8s-out-file-on-the-path", lambda t: ["solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve",
                                            "--emit", "k8s", "-o", model_file(t) / "k8s", *FAST], 2,
     ["-o", "model.yaml is a file, not a directory, so", "(the directory --emit k8s writes manifests to)"]),
    ("study-out-is-file", lambda t: ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                                     "--out", model_file(t)], 2, ["--out", "model.yaml is a file, not a directory (the directory for study.csv"]),
]


@pytest.mark.parametrize(("build", "code", "fragments"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_hostile_input(tmp_path: Path, build, code: int, fragments: list[str]) -> None:
    argv = build(tmp_path)
    start = time.perf_counter()
    got, stdout, stderr = run_cli(*argv)
    elapsed = time.perf_counter() - start
    flat = " ".join(stderr.split())
    assert got == code, f"exit {got}\n{stdout}\n{stderr}"
    for fragment in fragments:
        assert fragment.lower() in flat.lower(), f"{fragment!r} not in: {flat}"
    assert elapsed < 20, f"took {elapsed:.1f} s"  # refused before any long solve (the hangs of the issue)


def test_rich_markup_in_names_prints_verbatim(tmp_path: Path) -> None:
    model = model_file(tmp_path, "name: llama-3.1-8b", 'name: "x[/bold]"')
    cluster = cluster_file(tmp_path, "name: dgx-h100", 'name: "[red]c[/red]"')
    for mode in ("train", "serve"):
        code, stdout, stderr = run_cli("solve", model, cluster, "--gpus", "8", "--mode", mode, *FAST)
        assert code == 0, stderr
        assert "x[/bold]" in stdout and "[red]c[/red]" in stdout


# ----------------------------------------------------------------------------- the --json contract


@pytest.mark.parametrize("extra", [["--verbose"], ["--emit", "megatron"], ["--mode", "serve", "--emit", "vllm"],
                                   ["--mode", "serve", "--emit", "sglang"]])
def test_json_stdout_is_exactly_one_object(extra: list[str]) -> None:
    code, stdout, stderr = run_cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--json", *FAST, *extra)
    assert code == 0, stderr
    obj = json.loads(stdout)  # raises on anything else around the object
    assert obj["schema"].startswith("autoshard.plan/")
    if "--emit" in extra:
        assert stderr.startswith("#!/usr/bin/env bash")  # the script still comes out, on stderr
    if "--verbose" in extra:
        assert "CpSolverResponse" in stderr or "#Bound" in stderr or "Starting" in stderr


@pytest.mark.parametrize(("argv", "mode"), [
    (["solve", "deepseek-v3", "dgx-h100", "--gpus", "128"], "train"),  # model states alone need 87.9 GiB per GPU
    (["solve", "llama-3.1-405b", "dgx-h100", "--gpus", "8", "--mode", "serve"], "serve"),  # 756 GiB of weights
])
def test_json_without_a_plan_is_still_one_object(argv: list[str], mode: str) -> None:
    """`solve --json` that finds no plan (exit 1) used to print nothing on stdout: a pipeline reading it got
    no JSON at all. It prints the one object, with status infeasible, no plan and the message."""
    code, stdout, stderr = run_cli(*argv, "--json", *FAST)
    assert code == 1, stderr
    obj = json.loads(stdout)
    assert obj["schema"] == "autoshard.plan/v1" and obj["status"] == "infeasible" and obj["mode"] == mode
    assert obj["plan"] is None and obj["predicted"] is None and obj["launch"] == {}
    assert obj["num_gpus"] == int(argv[4]) and obj["model"] == argv[1]
    assert obj["error"] in " ".join(stderr.split()) or obj["error"].split("\n")[0] in stderr


@pytest.mark.parametrize(("argv", "schema"), [
    (["solve", "nosuchmodel", "dgx-h100"], "autoshard.plan/v1"),  # unknown model: exit 2
    (["solve", "llama-3.1-8b", "dgx-h100", "--tp", "3"], "autoshard.plan/v1"),  # a pin breaking a rule
    (["evaluate", "dgx-h100", "--gpus", "8", "--from-vllm", "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-sise 8"],
     "autoshard.plan/v1"),
    (["study", "llama-3.1-8b", "--cluster", "nosuch", "--gpus", "8"], "autoshard.study/v1"),
])
def test_json_on_bad_input_is_still_one_object(argv: list[str], schema: str) -> None:
    """ARCHITECTURE: `--json` prints exactly one JSON object. Bad input (exit 2) printed nothing on stdout;
    it prints the object with status "invalid" and the message; the plan JSON names the cluster (not the
    model) when a launch command names the model, and the cluster's GPU count when --gpus is left out."""
    code, stdout, stderr = run_cli(*argv, "--json")
    assert code == 2, stderr
    obj = json.loads(stdout)
    assert obj["schema"] == schema and obj["status"] == "invalid" and obj["error"].split(":")[0] in stderr
    if schema == "autoshard.plan/v1":
        assert obj["solver"]["status"] == "invalid" and obj["solver"]["objective"] is None
        assert obj["cluster"] == "dgx-h100" and obj["num_gpus"] in (8, 1024)


def test_json_on_a_refused_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A command line the parser refuses before the command runs (`--time-limit nan`, an unknown option)
    under --json: the parser's message on stderr and the one object on stdout, exit 2."""
    from autoshard.cli import _run

    assert _run(["solve", "llama-3.1-8b", "dgx-h100", "--time-limit", "nan", "--json"]) == 2
    out, err = capsys.readouterr()
    obj = json.loads(out)
    assert obj["status"] == "invalid" and "nan is not a finite number" in obj["error"] and "nan is not" in err
    assert _run(["solve", "llama-3.1-8b", "dgx-h100", "--mode", "serve", "--tpot-ms", "nan", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["mode"] == "serve"
    assert _run(["solve", "llama-3.1-8b", "dgx-h100", "--bogus"]) == 2  # without --json: the message only
    out, err = capsys.readouterr()
    assert out == "" and "No such option: --bogus" in err


def test_json_when_the_time_limit_finds_no_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    import autoshard.api as api
    from autoshard.errors import SolverError

    def no_plan(*args, **kwargs):
        raise SolverError("no plan found within the 5 s time limit: raise --time-limit or pin some knobs")

    monkeypatch.setattr(api, "solve", no_plan)
    code, stdout, stderr = run_cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--json", *FAST)
    assert code == 1
    obj = json.loads(stdout)
    assert obj["status"] == "unknown" and "raise --time-limit" in obj["error"]
    code, stdout, stderr = run_cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", *FAST)  # no --json: stderr only
    assert code == 1 and stdout == "" and "raise --time-limit" in stderr
    code, stdout, _ = run_cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "12", "--json", *FAST)  # bad input
    assert code == 2 and json.loads(stdout)["status"] == "invalid"


# ----------------------------------------------------------------------------- plans that launch


def test_default_plan_keeps_headroom_and_says_so() -> None:
    code, stdout, _ = run_cli("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "64", "--json", *FAST)
    assert code == 0
    obj = json.loads(stdout)
    head = obj["memory_headroom"]
    assert head["memory_fraction"] == 0.87
    assert head["peak_gib"] <= 0.87 * head["hbm_gib"] + 1e-9
    assert head["headroom_gib"] == pytest.approx(head["hbm_gib"] - head["peak_gib"], abs=0.02)
    code, stdout, _ = run_cli("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "64", *FAST)
    assert "planned to 87% of HBM" in " ".join(stdout.split())
    code, stdout, _ = run_cli("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "64", "--json", "--memory-fraction",
                              "1.0", *FAST)
    brim = json.loads(stdout)["memory_headroom"]
    assert brim["memory_fraction"] == 1.0 and brim["peak_gib"] > 0.87 * brim["hbm_gib"]
    assert "likely peak" not in head["note"]  # the default plan's memory band stays under HBM


def test_a_plan_whose_memory_band_passes_hbm_says_it_may_not_fit() -> None:
    """70B on 24 H100 at --memory-fraction 1.0: a 77.3 GiB peak whose memory band reaches 79.8 GiB of
    79.6 (the review found plans at 99.8 % of HBM reported with no warning)."""
    code, stdout, _ = run_cli("solve", "llama-3.1-70b", "dgx-h100", "--gpus", "24", "--json", "--memory-fraction",
                              "1.0", *FAST)
    assert code == 0
    obj = json.loads(stdout)
    top = obj["predicted"]["band"]["memory_gib_peak"][1]
    head = obj["memory_headroom"]
    assert top > head["hbm_gib"]
    assert (f"its likely peak reaches {top:.1f} GiB, more than the {head['hbm_gib']:.1f} GiB of HBM: it may run out "
            "of memory") in head["note"]


@pytest.mark.parametrize(("gpus", "expected"), [
    ("8", "(fill TOKENIZER_MODEL, DATA_PATH, CKPT_DIR)"),  # one node: localhost, node rank 0
    ("16", "(fill NODE_RANK, MASTER_ADDR, TOKENIZER_MODEL, DATA_PATH, CKPT_DIR)"),
])
def test_launch_header_names_the_variables_the_command_reads(gpus: str, expected: str) -> None:
    """The header used to say "fill MASTER_ADDR, NODE_RANK, DATA_PATH, TOKENIZER_MODEL" whatever the command
    read: CKPT_DIR (--save/--load "$CKPT_DIR", empty when unset) was never named, and a one-node command reads
    neither MASTER_ADDR nor NODE_RANK."""
    code, stdout, stderr = run_cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", gpus, *FAST)
    assert code == 0, stderr
    flat = " ".join(stdout.split())  # the header may wrap at 80 columns
    header = f"Megatron-LM launch {expected}:"
    assert header in flat, flat[flat.index("Megatron-LM launch"):][:120]
    command = flat[flat.index(header) + len(header):]
    used = {w.strip('"').lstrip("$").strip("{}") for w in command.split() if w.strip('"').startswith("$")}
    assert used == set(expected[len("(fill "):-1].split(", "))


def test_a_plan_that_does_not_fit_has_no_launch_command() -> None:
    code, stdout, stderr = run_cli("evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "8", "--tp", "1", "--pp", "1",
                                   "--json")
    assert code == 1
    obj = json.loads(stdout)
    assert obj["predicted"]["memory_gib"]["fits"] is False
    assert "megatron" not in obj["launch"]
    code, stdout, stderr = run_cli("evaluate", "llama-3.1-70b", "dgx-h100", "--gpus", "8", "--tp", "1", "--pp", "1")
    assert "torchrun" not in stdout and "pretrain_gpt.py" not in stdout


# ----------------------------------------------------------------------------- study output as a set


STUDY = ["study", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--time-limit", "5", "--jobs", "1"]
SET = {"study.csv", "study.json", "study.md", "pareto.png"}


def test_k8s_manifests_into_an_existing_empty_directory(tmp_path: Path) -> None:
    """--emit k8s -o DIR with DIR already there (empty) used to be refused: "is a directory: give a file name"."""
    code, _, stderr = run_cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", "--emit", "k8s",
                              "-o", tmp_path, *FAST)
    assert code == 0, stderr
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".yaml"] * len(list(tmp_path.iterdir())) != []
    assert f"kubectl apply -f {tmp_path}" in " ".join(stderr.split())


def test_study_set_lands_whole_beside_other_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, stderr = run_cli(*STUDY, "--out", out)
    assert code == 0, stderr
    assert {p.name for p in out.iterdir()} == SET | {"notes.txt"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left
    code, _, stderr = run_cli(*STUDY, "--out", tmp_path / "new" / "deeper")
    assert code == 0 and {p.name for p in (tmp_path / "new" / "deeper").iterdir()} == SET


def test_interrupted_study_leaves_no_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autoshard.study.report as report

    def interrupted(result, out_dir):
        (out_dir / "study.csv").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_outputs", interrupted)
    out = tmp_path / "out"
    code, _, stderr = run_cli(*STUDY, "--out", out)
    assert code == 130 and "no complete set" in " ".join(stderr.split())
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_interrupted_solve_says_nothing_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autoshard.study.run as study

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(study, "run_study", interrupted)
    code, _, stderr = run_cli(*STUDY, "--out", tmp_path / "out")
    assert code == 130
    assert "interrupted" in stderr and "nothing was written" in " ".join(stderr.split())
    assert not (tmp_path / "out").exists()


def test_compare_with_megatron_still_emits_the_best_plan(tmp_path: Path) -> None:
    """`solve --from-megatron ... --emit megatron -o F` used to drop --emit without a word."""
    out = tmp_path / "best.sh"
    code, stdout, stderr = run_cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", *FAST, "--emit", "megatron",
                                   "-o", out, "--from-megatron", MEGATRON + " --micro-batch-size 1")
    assert code == 0, stderr
    assert out.read_text().startswith("#!/usr/bin/env bash") and "pretrain_gpt.py" in out.read_text()


def test_rich_markup_in_warnings_paths_and_study_labels(tmp_path: Path) -> None:
    """User text reaches the report through warnings (an unknown vLLM flag), file paths and study labels."""
    code, stdout, stderr = run_cli("evaluate", "dgx-h100", "--gpus", "8", "--from-vllm",
                                   "vllm serve meta-llama/Llama-3.1-8B --[/bold]")
    assert code == 0 and "--[/bold]" in " ".join(stdout.split()), stderr
    (tmp_path / "q[").mkdir()
    cluster = tmp_path / "q[" / "b]z.yaml"  # the path holds the closing tag "[/b]"
    cluster.write_text(CLUSTER)
    out = tmp_path / "q[" / "o]"
    code, stdout, stderr = run_cli("study", "llama-3.1-8b", "--cluster", cluster, "--gpus", "8,12", "--time-limit",
                                   "5", "--jobs", "1", "--out", out)
    assert code == 0, stderr
    # a long temporary path wraps anywhere: compare with the whitespace taken out
    assert "".join(str(cluster).split()) in "".join(stdout.split())
    assert "".join(f"wrote {out}".split()) in "".join(stderr.split())


def test_rich_markup_in_pool_and_gpu_names(tmp_path: Path) -> None:
    text = (REPO / "clusters" / "mixed-h100-a100.yaml").read_text()
    text = _replace(_replace(text, "name: h100\n", 'name: "h[/x]"\n'), "name: H100-SXM5-80GB", 'name: "G[/y]"')
    cluster = _write(tmp_path / "mixed.yaml", text)
    code, stdout, stderr = run_cli("solve", "llama-3.1-8b", cluster, "--time-limit", "2", "--workers", "1", "--tp", "4",
                                   "--pp", "2", "--cp", "1", "--mbs", "1")
    assert code == 0, stderr
    assert "h[/x]" in stdout and "G[/y]" in stdout


def test_serving_header_counts_idle_gpus() -> None:
    """A serving plan of whole engines that leaves GPUs of the cluster unused printed "on 8 x H100" and one per-GPU
    figure per GPU used, while the deployment line and the solver's objective count every GPU of the cluster (a
    split plan on 15 of 16 GPUs read 7,064 per GPU in its head and 6,623 per GPU two lines below)."""
    argv = ["evaluate", "dgx-h100", "--gpus", "16", "--from-vllm",
            "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 4 --data-parallel-size 2"]
    code, stdout, stderr = run_cli(*argv, "--json")
    assert code == 0, stderr
    obj = json.loads(stdout)
    assert obj["num_gpus"] == 8 and obj["plan"]["unused_gpus"] == 8
    total = obj["predicted"]["serve"]["throughput_tokens_per_s"]
    code, stdout, stderr = run_cli(*argv)
    flat = " ".join(stdout.split())
    assert "serving on 8 x H100-SXM5-80GB (dgx-h100; 8 of its 16 GPUs idle)" in flat
    assert f"{total:,.0f} output tokens/s ({total / 8:,.0f} per GPU used, {total / 16:,.0f} per GPU of all 16)" in flat
    code, stdout, _ = run_cli("solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--mode", "serve", *FAST)
    assert code == 0 and "idle" not in stdout and "per GPU used" not in stdout  # every GPU serves


def test_block_recompute_reads_as_what_the_launch_does() -> None:
    """`--recompute-num-layers 4` printed "recompute none, +4 full/stage" over a launch that says
    --recompute-granularity full --recompute-method block --recompute-num-layers 4."""
    code, stdout, stderr = run_cli("evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", "8", "--tp", "2", "--pp", "2",
                                   "--recompute-num-layers", "4")
    assert code == 0, stderr
    flat = " ".join(stdout.split())
    assert "TP2 PP2 DP2, mbs 1, recompute full on 4 layers/stage, SP, ZeRO-1" in flat and "recompute none" not in flat[:400]
    assert "--recompute-granularity full \\ --recompute-method block \\ --recompute-num-layers 4" in flat


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_a_full_stdout_is_said_with_exit_2_not_a_traceback(extra: list[str]) -> None:
    import subprocess

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "autoshard.cli", "solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8",
                               *FAST, *extra], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "cannot write the output to standard output: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_a_reader_that_goes_away_ends_the_command_with_exit_0(extra: list[str]) -> None:
    """`autoshard solve ... | head -1`: rich's console and click both exit 1 on a broken pipe, the code
    for "no feasible plan"."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "autoshard.cli", "solve", "llama-3.1-8b", "dgx-h100", "--gpus", "8",
                             *FAST, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with proc:
        assert proc.stdout is not None and proc.stdout.readline()
        proc.stdout.close()
        assert proc.wait(timeout=120) == 0
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


def test_an_all_moe_command_without_ffn_hidden_size_is_the_named_model() -> None:
    """Qwen3-30B-A3B's public launch scripts leave --ffn-hidden-size out (every layer is MoE: Megatron-LM then
    assumes 4 x hidden, which no layer uses): that difference is a warning, not another model (the
    MODEL/--from-megatron refusal counts FFN size only for a model with a dense layer)."""
    cmd = ("torchrun --nproc-per-node 8 --nnodes 4 pretrain_gpt.py --num-layers 48 --hidden-size 2048 "
           "--num-attention-heads 32 --group-query-attention --num-query-groups 4 --kv-channels 128 --seq-length 4096 "
           "--max-position-embeddings 40960 --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 "
           "--expert-model-parallel-size 8 --global-batch-size 256 --micro-batch-size 1 --bf16 --swiglu "
           "--normalization RMSNorm --qk-layernorm --disable-bias-linear --untie-embeddings-and-output-weights "
           "--moe-grouped-gemm --use-distributed-optimizer --position-embedding-type rope")
    code, _, stderr = run_cli("evaluate", "qwen3-30b-a3b", "dgx-h100", "--from-megatron", cmd)
    assert code == 0, stderr
    assert "the command's model differs from qwen3-30b-a3b: ffn_hidden_size: 6144 vs 5440" in " ".join(stderr.split())


def test_a_full_disk_under_a_file_write_is_not_blamed_on_stdout() -> None:
    """An OSError with no file name (Path.write_text on a full disk raises one) is not reported as stdout's:
    only the command's own stdout writes (`write_stdout`, the stdout console, the final flush) say that."""
    import errno

    from autoshard.cli.app import guard

    @guard
    def writes_a_file() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left on device"):
        writes_a_file()
