"""A serving plan whose launch lines name a model no engine can fetch says so (the name is neither a
Hugging Face repo id nor a local directory), and only then."""
from __future__ import annotations

import json

from autoshard import api
from autoshard.specs import load_cluster, load_model
from autoshard.specs.job import ServeJob

H100 = load_cluster("dgx-h100")
JOB = ServeJob(input_len=1000, output_len=1000)


def _plan(model, gpus, tmp_path=None):
    return api.solve_serve(model, H100.with_gpus(gpus), JOB, pins=None, top_k=1, time_limit_s=20,
                           num_workers=1, disaggregate="off")[0]


def _notes(plan):
    return [w for w in plan.warnings if "neither a Hugging Face repo id nor a local directory" in w]


def test_a_model_without_a_checkpoint_is_flagged():
    plan = _plan(load_model("gpt3-175b"), 16)
    assert plan.model_path == "gpt3-175b"
    assert plan.launch["vllm"].startswith("vllm serve gpt3-175b ")
    (note,) = _notes(plan)
    assert "'gpt3-175b'" in note


def test_a_repo_id_and_a_config_directory_are_not(tmp_path):
    assert _notes(_plan(load_model("llama-3.1-8b"), 8)) == []
    src = json.loads(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
    }))
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(src))
    plan = _plan(load_model(str(folder / "config.json")), 8)
    assert plan.model_path == str(folder.absolute())
    assert _notes(plan) == []
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(src))
    assert _notes(_plan(load_model(str(renamed)), 8)) != []
