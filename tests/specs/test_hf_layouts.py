"""Hugging Face config.json layouts the importer used to misread (review of the reader, fix 19): quantization
in text_config (Kimi-K2.5) or in ModelOpt's hf_quant_config.json, transformers v5's rope_parameters,
explicit nulls meaning "none" (Moonlight's q_lora_rank), multi-MiB configs, the layer cap, long
_name_or_path values, multimodal towers and empty files. Each test pins the number the fix changes."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoshard.cli import app
from autoshard.costmodel.serve.weights import total_weight_bytes
from autoshard.emit.megatron.network_args import network_args
from autoshard.emit.megatron.rope import rope_args
from autoshard.errors import SpecError
from autoshard.specs import load_model
from autoshard.specs.hf import model_from_hf_config
from autoshard.specs.job import WeightDtype
from autoshard.specs.loader import MAX_JSON_BYTES

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
GiB = 2**30


def fixture(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def imported(config: dict, source: str = "config.json", **kw) -> tuple:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = model_from_hf_config(copy.deepcopy(config), source=source, **kw)
    return spec, [str(w.message) for w in caught]


# ------------------------------------------------------------------ 1. quantization inside text_config
# moonshotai/Kimi-K2.5: a kimi_k25 wrapper around Kimi K2's text model whose routed experts ship as
# compressed-tensors int4, group 32, in text_config.quantization_config (ROCm/ATOM recipes/Kimi-K2.5.md:
# "native INT4 quantization (compressed-tensors, group_size=32) for the routed MoE expert weights").
# vLLM's get_quant_config falls back to text_config.quantization_config (model_loader/weight_utils.py).
INT4_G32 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                                       "symmetric": True}}}}


def kimi_k25() -> dict:
    text = {k: v for k, v in fixture("kimi-k2-instruct").items() if k not in ("quantization_config", "_name_or_path")}
    return {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
            "_name_or_path": "moonshotai/Kimi-K2.5", "text_config": text | {"quantization_config": INT4_G32},
            "vision_config": {"model_type": "moonvit", "hidden_size": 1152}}


def test_kimi_k25_int4_experts_in_text_config_are_its_checkpoint() -> None:
    spec, notes = imported(kimi_k25())
    (ckpt,) = spec.checkpoints  # was none: priced as BF16
    assert (ckpt.weights, ckpt.quantization, ckpt.repo) == (WeightDtype.INT4, "compressed-tensors",
                                                            "moonshotai/Kimi-K2.5")
    assert ckpt.source == "config.json: text_config.quantization_config"
    assert spec.num_params == 1_026_408_209_408  # Kimi K2's shapes
    assert total_weight_bytes(spec, WeightDtype.BF16) / GiB == pytest.approx(1911.83, abs=0.01)
    assert total_weight_bytes(spec, ckpt.weights) / GiB == pytest.approx(496.37, abs=0.01)
    assert notes == ["config.json: vision_config: only the language model is imported: the vision "
                     "tower's weights are not counted, so serving weight memory is low by their size and training "
                     "leaves their FLOPs out"]


def test_top_level_quantization_config_comes_before_text_configs() -> None:
    config = kimi_k25() | {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (ckpt,) = imported(config)[0].checkpoints
    assert (ckpt.weights, ckpt.block_scaled, ckpt.source) == (WeightDtype.FP8, True, "config.json: quantization_config")


# ------------------------------------------------------------------ 2. ModelOpt's hf_quant_config.json
# ModelOpt 0.29 and older write {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": ...,
# "kv_cache_quant_algo": ...}} beside config.json; vLLM reads it when config.json has no
# quantization_config (vllm/transformers_utils/config.py).
def modelopt_dir(tmp: Path, algo: str | None, kv: str | None = None, *, name: str = "nvidia/Llama-3.1-8B-Instruct-FP8") -> Path:
    (tmp / "config.json").write_text(json.dumps(fixture("llama-3.1-8b") | {"_name_or_path": name}))
    if algo is not None:
        quant = {"quant_algo": algo, "kv_cache_quant_algo": kv, "exclude_modules": ["lm_head"]}
        (tmp / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.19.0"},
                                                              "quantization": quant}))
    return tmp / "config.json"


def load_noting(path: Path) -> tuple:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = load_model(path)
    return spec, [str(w.message) for w in caught]


@pytest.mark.parametrize(("algo", "want"), [("FP8", (WeightDtype.FP8, "modelopt")),
                                            ("NVFP4", (WeightDtype.NVFP4, "modelopt_fp4"))])
def test_hf_quant_config_beside_config_json_is_read(tmp_path: Path, algo: str, want: tuple) -> None:
    spec, notes = load_noting(modelopt_dir(tmp_path, algo))
    (ckpt,) = spec.checkpoints  # was none: read as BF16
    assert (ckpt.weights, ckpt.quantization, ckpt.block_scaled) == (*want, False)
    assert ckpt.source.endswith("config.json: hf_quant_config.json") and notes == []
    bf16 = total_weight_bytes(spec, WeightDtype.BF16) / GiB
    assert bf16 == pytest.approx(14.96, abs=0.01)  # Llama 3.1 8B
    assert total_weight_bytes(spec, ckpt.weights) / GiB == pytest.approx(
        {"FP8": 8.46, "NVFP4": 5.61}[algo], abs=0.01)


def test_the_sidecar_comes_before_text_config_as_in_vllm(tmp_path: Path) -> None:
    """vLLM's get_config makes hf_quant_config.json the config's quantization_config when it has none, before
    get_quant_config reads text_config's: a wrapper with FP8 in text_config and an NVFP4 sidecar is NVFP4
    (it read FP8, and its launch line passed a --quantization vLLM refuses beside the detected modelopt_fp4)."""
    path = modelopt_dir(tmp_path, "NVFP4")
    inner = json.loads(path.read_text())
    path.write_text(json.dumps({"model_type": "llava", "_name_or_path": "nvidia/wrapped-NVFP4", "text_config": {
        **inner, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}}))
    spec, _ = load_noting(path)
    (ckpt,) = spec.checkpoints
    assert (ckpt.weights, ckpt.quantization) == (WeightDtype.NVFP4, "modelopt_fp4")


def test_hf_quant_config_kv_cache_algorithm_and_unknown_algorithms_are_said(tmp_path: Path) -> None:
    spec, notes = load_noting(modelopt_dir(tmp_path, "FP8", kv="FP8"))
    assert spec.checkpoints[0].weights is WeightDtype.FP8
    (note,) = notes
    assert "hf_quant_config.json.kv_cache_quant_algo: the checkpoint carries FP8 KV-cache scales" in note
    assert "give --kv-cache-dtype fp8" in note
    spec, notes = load_noting(modelopt_dir(tmp_path, "W4A8_AWQ"))
    assert spec.checkpoints == ()
    assert notes == [f"{tmp_path / 'config.json'}: hf_quant_config.json.quant_algo: ModelOpt 'W4A8_AWQ' is not "
                     "modelled (FP8 and NVFP4 are); imported as BF16"]


def test_an_unreadable_sidecar_is_a_warning_and_only_config_json_has_one(tmp_path: Path) -> None:
    path = modelopt_dir(tmp_path, None)
    (tmp_path / "hf_quant_config.json").write_text("{not json")
    spec, notes = load_noting(path)
    assert spec.checkpoints == () and len(notes) == 1
    assert "hf_quant_config.json: invalid JSON at line 1, column 2" in notes[0] and "imported as BF16" in notes[0]
    modelopt_dir(tmp_path, "FP8")
    renamed = tmp_path / "llama.json"
    renamed.write_text(path.read_text())
    assert load_noting(renamed)[0].checkpoints == ()  # a file of another name is no checkpoint folder's config
    assert load_noting(path)[0].checkpoints[0].weights is WeightDtype.FP8


def test_config_json_quantization_config_wins_over_the_sidecar(tmp_path: Path) -> None:
    path = modelopt_dir(tmp_path, "NVFP4")
    config = json.loads(path.read_text()) | {"quantization_config": {"quant_method": "fp8"}}
    path.write_text(json.dumps(config))
    assert load_noting(path)[0].checkpoints[0].weights is WeightDtype.FP8
    (tmp_path / "hf_quant_config.json").unlink()
    assert load_noting(path)[0].checkpoints[0].quantization == "fp8"
    assert load_noting(modelopt_dir(tmp_path, None))[0].checkpoints == ()


@pytest.mark.parametrize("qc", [
    {"producer": {"name": "modelopt", "version": "0.31.0"}, "quantization": {"quant_algo": "NVFP4"}},
    {"producer": {"name": "modelopt"}, "quant_algo": "NVFP4", "group_size": 16},
])
def test_modelopt_producer_without_quant_method_is_modelopt(qc: dict) -> None:
    spec, notes = imported(fixture("qwen3-8b") | {"_name_or_path": "nvidia/Qwen3-8B-NVFP4", "quantization_config": qc})
    (ckpt,) = spec.checkpoints  # was "quant_method: missing or not a string (None); imported as BF16"
    assert (ckpt.weights, ckpt.quantization) == (WeightDtype.NVFP4, "modelopt_fp4") and notes == []


# ------------------------------------------------------------------ 3. transformers v5 rope_parameters
def v5(config: dict, **params) -> dict:
    out = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling", "partial_rotary_factor")}
    return out | {"rope_parameters": params}


def test_rope_theta_and_rotary_fraction_in_rope_parameters_reach_the_launch() -> None:
    llama = fixture("llama-3.1-8b")
    spec, _ = imported(v5(llama, **llama["rope_scaling"], rope_theta=500000.0))
    assert spec.rope_theta == 500000.0 and spec.rope_scaling is not None
    assert ("--rotary-base", "500000") in rope_args(spec)  # was absent: Megatron-LM's 10,000
    glm = fixture("glm-4.5")
    assert glm["partial_rotary_factor"] == 0.5
    spec, _ = imported(v5(glm, rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.5))
    assert (spec.rope_theta, spec.rotary_percent) == (1e6, 0.5)
    assert rope_args(spec) == [("--rotary-base", "1000000"), ("--rotary-percent", "0.5")]


def test_rope_parameters_contradicting_the_top_level_is_refused_naming_both(tmp_path: Path) -> None:
    llama = fixture("llama-3.1-8b")
    same = llama | {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    assert imported(same)[0].rope_theta == 500000.0
    bad = llama | {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    with pytest.raises(SpecError) as err:
        model_from_hf_config(bad, source="x.json")
    assert err.value.field == "rope_parameters.rope_theta"
    assert "10000 contradicts rope_theta 500000" in str(err.value)
    (tmp_path / "config.json").write_text(json.dumps(bad))
    result = CliRunner().invoke(app, ["solve", str(tmp_path / "config.json"), "dgx-h100", "--gpus", "8"])
    assert result.exit_code == 2 and "rope_parameters.rope_theta" in result.output


# ------------------------------------------------------------------ 4. null means "none"
def test_moonlight_q_lora_rank_null_is_a_dense_query_projection() -> None:
    """moonshotai/Moonlight-16B-A3B's config.json: deepseek_v3 with "q_lora_rank": null (no query LoRA).
    It was read as absent, so DeepSeek-V3's 1536 applied (16.003B, --q-lora-rank=1536 in the launch)."""
    spec = load_model(HF / "moonlight-16b-a3b.json")
    assert spec.mla is not None and spec.mla.q_lora_rank is None
    launch = dict(network_args(spec, 8192))
    assert "--q-lora-rank" not in launch and launch["--kv-lora-rank"] == "512"  # was --q-lora-rank=1536
    h, heads, vocab, experts, ffn, expert_ffn = 2048, 16, 163840, 64, 11264, 1408
    attention = h * heads * 192 + h * (512 + 64) + 512 + 512 * heads * (128 + 128) + heads * 128 * h + 2 * h
    expert = 3 * h * expert_ffn
    total = 2 * vocab * h + 27 * attention + 3 * h * ffn + 26 * ((experts + 2) * expert + experts * h) + h
    assert spec.num_params == total == 15_960_108_544
    active = spec.num_active_params - 2 * vocab * h
    assert active == total - 2 * vocab * h - 26 * (experts - 6) * expert == 2_243_685_888  # card: 2.24B


def test_n_shared_experts_null_is_no_shared_expert() -> None:
    config = fixture("moonlight-16b-a3b") | {"n_shared_experts": None}
    spec, _ = imported(config)
    assert spec.moe is not None and spec.moe.num_shared_experts == 0  # was 1 (DeepSeek-V3's default)
    assert spec.num_params == 15_960_108_544 - 26 * 2 * 3 * 2048 * 1408
    absent = {k: v for k, v in config.items() if k not in ("n_shared_experts", "q_lora_rank")}
    spec, _ = imported(absent)  # absent keys still take transformers' DeepseekV3Config defaults
    assert (spec.moe.num_shared_experts, spec.mla.q_lora_rank) == (1, 1536)


# ------------------------------------------------------------------ 5. multi-MiB config.json
def test_a_config_json_of_several_mib_imports(tmp_path: Path) -> None:
    """nvidia/MiniMax-M3-NVFP4's config.json is 2.9 MiB (its quantization ignore list); the cap was 1 MiB."""
    ignore = [f"model.layers.{i}.block_sparse_moe.experts.{e}.w{w}" for i in range(80) for e in range(256)
              for w in (1, 2, 3)]
    config = fixture("qwen3-8b") | {"_name_or_path": "nvidia/Qwen3-8B-NVFP4", "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ignore}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert path.stat().st_size > 2.9 * 2**20 and len(ignore) == 61_440
    assert load_model(path).checkpoints[0].weights is WeightDtype.NVFP4
    with path.open("r+b") as f:
        f.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(SpecError, match=r"the file is 32.0 MiB; a JSON \(Hugging Face config.json\) file is at "
                                        r"most 32 MiB"):
        load_model(path)


# ------------------------------------------------------------------ 6. one layer cap, named by its key
@pytest.mark.parametrize("layers", [1025, 5000, 100_000, 2_000_000])
def test_too_many_layers_names_num_hidden_layers(layers: int) -> None:
    with pytest.raises(SpecError) as err:
        model_from_hf_config(fixture("llama-3.1-8b") | {"num_hidden_layers": layers}, source="x.json")
    assert err.value.field == "num_hidden_layers"  # was layers[1].count up to 100,000
    assert f"{layers} decoder layers: autoshard models at most 1024" in str(err.value)
    assert imported(fixture("llama-3.1-8b") | {"num_hidden_layers": 1024})[0].num_layers == 1024


# ------------------------------------------------------------------ 7. a long _name_or_path
def test_name_or_path_over_200_characters_falls_back_to_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "Llama-3.1-8B-local"
    folder.mkdir()
    long = "/scratch/" + "deep/" * 50 + "Llama-3.1-8B"
    (folder / "config.json").write_text(json.dumps(fixture("llama-3.1-8b") | {"_name_or_path": long}))
    spec, notes = load_noting(folder / "config.json")  # was exit 2 (field '_name_or_path', 200 characters)
    assert spec.name == "Llama-3.1-8B-local" and spec.num_params == 8_030_261_248
    assert notes == [f"{folder / 'config.json'}: _name_or_path: {len(long)} characters, more than a model name "
                     "holds (200): the model is named 'Llama-3.1-8B-local' after its file instead"]


# ------------------------------------------------------------------ 9. an empty file
@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_an_empty_config_json_says_so(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(SpecError, match="the file is empty: a config.json is a JSON object"):
        load_model(path)  # was "invalid JSON at line 1, column 1: Expecting value"
