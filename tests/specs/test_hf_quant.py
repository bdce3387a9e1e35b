"""The Hugging Face importer reads ``quantization_config`` (#13): the checkpoint's weight dtype, vLLM's
--quantization method and whether FP8 weights carry 128 x 128 block scales, as the model's one
`checkpoints:` entry; anything it cannot read is a UserWarning naming the file and key, never an
error. And `evaluate --from-vllm` prices an FP8 repo the model file does not list by what its
architecture's listed FP8 checkpoints are, saying so."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest

from autoshard.api import evaluate_vllm
from autoshard.costmodel.serve.compute import block_scaled_fp8
from autoshard.specs import load_cluster, load_model
from autoshard.specs.hf import model_from_hf_config
from autoshard.specs.job import ServeJob, WeightDtype

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
DSV3_HUB = json.loads((FIXTURES / "deepseek-v3.json").read_text())
QWEN3 = json.loads((FIXTURES / "qwen3-30b-a3b.json").read_text())


def _import(config: dict, repo: str | None = "org/model"):
    config = copy.deepcopy(config)
    if repo is not None:
        config["_name_or_path"] = repo
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = model_from_hf_config(config, source="cfg.json")
    return spec, [str(w.message) for w in caught]


def test_deepseek_v3_hub_config_is_a_block_scaled_fp8_checkpoint():
    """deepseek-ai/DeepSeek-V3's config.json: quant_method fp8, fmt e4m3, weight_block_size [128, 128]."""
    spec, notes = _import(DSV3_HUB, "deepseek-ai/DeepSeek-R1-0528")
    assert notes == []
    (ckpt,) = spec.checkpoints
    assert (ckpt.weights, ckpt.repo, ckpt.quantization, ckpt.block_scaled) == (
        WeightDtype.FP8, "deepseek-ai/DeepSeek-R1-0528", "fp8", True)
    assert block_scaled_fp8(spec, WeightDtype.FP8)
    # the same facts the bundled model file states for its listed checkpoint
    bundled = load_model("deepseek-v3").checkpoints[0]
    assert (bundled.quantization, bundled.block_scaled) == (ckpt.quantization, ckpt.block_scaled)


def test_the_hugging_face_cache_path_names_the_repo():
    config = {k: v for k, v in DSV3_HUB.items() if k != "_name_or_path"}
    source = "/h/.cache/huggingface/hub/models--deepseek-ai--DeepSeek-V3/snapshots/0123/config.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = model_from_hf_config(config, source=source)
    assert spec.checkpoints[0].repo == "deepseek-ai/DeepSeek-V3" and spec.checkpoints[0].block_scaled


@pytest.mark.parametrize(
    ("qc", "want"),
    [
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, ("fp8", "fp8", False)),
        ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, ("fp8", "fp8", True)),
        ({"quant_method": "fbgemm_fp8"}, ("fp8", "fbgemm_fp8", False)),
        ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
            "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}},
         ("fp8", "compressed-tensors", True)),
        ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
            "num_bits": 8, "type": "float", "strategy": "channel"}}}}, ("fp8", "compressed-tensors", False)),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
            "num_bits": 4, "type": "int", "strategy": "group"}}}}, ("int4", "compressed-tensors", False)),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, ("fp8", "modelopt", False)),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, ("nvfp4", "modelopt_fp4", False)),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, ("int4", "gptq_marlin", False)),
        ({"quant_method": "gptq", "bits": 8}, ("int8", "gptq_marlin", False)),
        ({"quant_method": "awq", "bits": 4}, ("int4", "awq_marlin", False)),
        ({"quant_method": "mxfp4"}, ("mxfp4", "mxfp4", False)),
    ],
)
def test_quantization_methods(qc, want):
    spec, notes = _import(QWEN3 | {"quantization_config": qc})
    assert notes == []
    (ckpt,) = spec.checkpoints
    assert (ckpt.weights.value, ckpt.quantization, ckpt.block_scaled) == want


@pytest.mark.parametrize(
    ("qc", "note", "listed"),
    [
        ("fp8", "quantization_config: expected an object", False),
        ({"fmt": "e4m3"}, "quantization_config.quant_method: missing", False),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes' is not modelled", False),
        ({"quant_method": 7}, "quant_method: missing or not a string", False),
        ({"quant_method": "fp8", "weight_block_size": "128"}, "weight_block_size: expected two positive", True),
        ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "block [64, 64] is priced as the 128", True),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt: 'e5m2' FP8 is priced as E4M3", True),
        ({"quant_method": "compressed-tensors"}, "config_groups: missing or empty", False),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 2, "type": "int"}}}},
         "2 bits are not modelled", False),
        ({"quant_method": "gptq", "bits": 3}, "gptq with 3 bits is not modelled", False),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "ModelOpt 'W4A8_AWQ' is not modelled", False),
    ],
)
def test_what_cannot_be_read_is_a_note_not_an_error(qc, note, listed):
    spec, notes = _import(QWEN3 | {"quantization_config": qc})
    assert len(notes) == 1 and notes[0].startswith("cfg.json: ") and note in notes[0], notes
    assert len(spec.checkpoints) == (1 if listed else 0)
    if listed:
        assert spec.checkpoints[0].weights is WeightDtype.FP8
        assert spec.checkpoints[0].block_scaled is (qc.get("weight_block_size") == [64, 64])


def test_without_a_repo_id_the_checkpoint_cannot_be_listed():
    spec, notes = _import(DSV3_HUB, repo=None)  # the fixture, as the hub serves it: no _name_or_path
    assert spec.checkpoints == () and spec.name == "cfg"
    assert len(notes) == 1 and "fp8 weights (fp8) found, but the model's name 'cfg' is no Hugging Face repo id" in notes[0]


def test_no_quantization_config_no_checkpoint():
    spec, notes = _import(QWEN3)
    assert spec.checkpoints == () and notes == []


H200_8 = load_cluster("dgx-h200").with_gpus(8)
DSV3 = load_model("deepseek-v3")
JOB = ServeJob(input_len=1000, output_len=1000, weight_dtype=WeightDtype.FP8)
CMD = "vllm serve {repo} -tp 8 --quantization {q} --max-model-len 4096"


def test_from_vllm_prices_an_unlisted_deepseek_fp8_repo_block_scaled():
    """DeepSeek-Prover-V2-671B is not under deepseek-v3's checkpoints (DeepSeek-V3, V3-0324, V3.1, R1 and
    R1-0528, block-scaled): with --quantization fp8 it is priced as the block-scaled FP8 release it is, with a
    note (R1-0528 was, before it was listed); the same command naming a listed repo reads the same, without the
    note. A listed release needs no --quantization: `vllm serve deepseek-ai/DeepSeek-R1-0528 -tp 8` was priced as
    BF16 weights (157.9 GiB a GPU, no plan on 8 H200; found by a review helper)."""
    unlisted = evaluate_vllm(DSV3, H200_8, CMD.format(repo="deepseek-ai/DeepSeek-Prover-V2-671B", q="fp8"), job=JOB)
    listed = evaluate_vllm(DSV3, H200_8, CMD.format(repo="deepseek-ai/DeepSeek-V3", q="fp8"), job=JOB)
    assert block_scaled_fp8(unlisted.model, WeightDtype.FP8)
    assert unlisted.throughput_tokens_per_s == pytest.approx(listed.throughput_tokens_per_s, rel=1e-12)
    (note,) = [w for w in unlisted.warnings if "not under" in w]
    assert "deepseek-ai/DeepSeek-Prover-V2-671B is not under deepseek-v3's checkpoints: priced as block-scaled" in note
    assert not any("not under" in w for w in listed.warnings)
    r1 = evaluate_vllm(DSV3, H200_8, "vllm serve deepseek-ai/DeepSeek-R1-0528 --tensor-parallel-size 8", job=JOB)
    assert r1.throughput_tokens_per_s == pytest.approx(listed.throughput_tokens_per_s, rel=1e-12)
    from autoshard.search.serve.solve import model_for_path  # and a line naming no MODEL finds it by its release

    assert model_for_path("deepseek-ai/DeepSeek-R1").name == model_for_path("deepseek-ai/DeepSeek-V3.1").name == DSV3.name


def test_from_vllm_other_fp8_methods_of_an_unlisted_repo_stay_per_tensor():
    """An FP8 release loaded with a per-channel method (fbgemm_fp8) is no block checkpoint;
    --quantization fp8_per_block is one whatever the model file lists."""
    plan = evaluate_vllm(DSV3, H200_8, CMD.format(repo="someone/DeepSeek-R1-FP8-dynamic", q="fbgemm_fp8"),
                         job=JOB)
    assert not block_scaled_fp8(plan.model, WeightDtype.FP8)
    assert any("priced as per-tensor FP8" in w for w in plan.warnings)
    block = evaluate_vllm(DSV3, H200_8, CMD.format(repo="deepseek-ai/DeepSeek-V3", q="fp8"), job=JOB)
    assert plan.throughput_tokens_per_s > block.throughput_tokens_per_s  # per-tensor FP8 GEMMs are faster
    named = evaluate_vllm(DSV3, H200_8, CMD.format(repo="someone/x", q="fp8_per_block"), job=JOB)
    assert block_scaled_fp8(named.model, WeightDtype.FP8)
    assert named.throughput_tokens_per_s == pytest.approx(block.throughput_tokens_per_s, rel=1e-12)


def test_from_vllm_with_the_imported_config_uses_its_quantization_config():
    """MODEL given as the repo's config.json: its own checkpoint entry is the one the command loads."""
    spec, _ = _import(DSV3_HUB, "deepseek-ai/DeepSeek-R1-0528")
    plan = evaluate_vllm(spec, H200_8, CMD.format(repo="deepseek-ai/DeepSeek-R1-0528", q="fp8"), job=JOB)
    assert block_scaled_fp8(plan.model, WeightDtype.FP8)
    assert not any("not under" in w for w in plan.warnings)
