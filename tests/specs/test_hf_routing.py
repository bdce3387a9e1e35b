"""DeepSeek routing and MTP fields read from Hugging Face config.json (the fixtures are the hub's files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard.errors import SpecError
from autoshard.specs import load_model
from autoshard.specs.hf import model_from_hf_config
from autoshard.specs.model import RouterScore

# the DeepSeek-V3 fixture is the hub's config.json: block-scaled FP8 weights but no _name_or_path, so
# the importer notes that it cannot list the checkpoint (tests/specs/test_hf_quant.py checks the note)
pytestmark = pytest.mark.filterwarnings("ignore:.*no Hugging Face repo id:UserWarning")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def _load(name: str, **override):
    cfg = json.loads((FIXTURES / f"{name}.json").read_text())
    cfg.update(override)
    return model_from_hf_config(cfg, source=f"{name}.json")


def test_deepseek_v3_routing_and_mtp_match_the_bundled_model() -> None:
    """config.json: scoring_func sigmoid, topk_method noaux_tc, n_group 8, topk_group 4,
    routed_scaling_factor 2.5, num_nextn_predict_layers 1 -- the same facts models/deepseek-v3.yaml states."""
    spec = _load("deepseek-v3")
    bundled = load_model("deepseek-v3")
    assert spec.moe == bundled.moe
    assert spec.moe.score_function is RouterScore.SIGMOID and spec.moe.expert_bias
    assert (spec.moe.num_groups, spec.moe.topk_groups, spec.moe.topk_scaling_factor) == (8, 4, 2.5)
    assert spec.mtp_num_layers == bundled.mtp_num_layers == 1
    assert spec.num_params == bundled.num_params  # MTP outside the published 671B


def test_deepseek_v2_lite_is_plain_softmax_top_k() -> None:
    spec = _load("deepseek-v2-lite")
    moe = spec.moe
    assert moe.score_function is RouterScore.SOFTMAX and not moe.expert_bias
    assert moe.num_groups is None and moe.topk_scaling_factor is None
    assert spec.mtp_num_layers == 0


@pytest.mark.parametrize(("override", "fragment"), [
    ({"scoring_func": "relu"}, "softmax or sigmoid"),
    ({"routed_scaling_factor": "big"}, "positive number"),
    ({"num_nextn_predict_layers": 99}, "implausibly large"),
    ({"n_group": 7}, "must divide"),
])
def test_bad_routing_fields(override: dict, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        _load("deepseek-v3", **override)
