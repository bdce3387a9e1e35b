"""Pipeline layouts as Megatron-LM accepts them: every form round-trips plan -> launch -> parse ->
evaluate with identical stages and predictions, and `predict_layout` picks the flags Megatron needs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autoshard.api import evaluate, train_job
from autoshard.cli import app
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.layout import LayoutFlags, layout_stages, predict_layout
from autoshard.emit.megatron.parse import parse_megatron
from autoshard.errors import SpecError
from autoshard.plans.train import layer_counts
from autoshard.specs import load_cluster, load_model

LLAMA8 = load_model("llama-3.1-8b")  # 32 decoder layers
H100 = load_cluster("dgx-h100")

# (flags, PP, VPP, decoder layers per chunk, the flags the launch must carry)
FORMS = [
    pytest.param(LayoutFlags(), 4, 1, [8, 8, 8, 8], [], id="default-even"),
    pytest.param(LayoutFlags(), 4, 2, [4] * 8, ["--num-virtual-stages-per-pipeline-rank"], id="default-vpp"),
    pytest.param(LayoutFlags(account_loss=True), 3, 1, [11, 11, 10],
                 ["--account-for-loss-in-pipeline-split"], id="account-loss"),
    pytest.param(LayoutFlags(account_embedding=True), 3, 1, [10, 11, 11],
                 ["--account-for-embedding-in-pipeline-split"], id="account-embedding"),
    pytest.param(LayoutFlags(account_embedding=True, account_loss=True), 2, 1, [16, 16], [],
                 id="account-both-is-the-default-here"),  # 34 / 2 = 17: E+16 | 16+L, Megatron's plain split
    pytest.param(LayoutFlags(account_embedding=True, account_loss=True), 17, 1, [1] + [2] * 15 + [1],
                 ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
                 id="account-both"),
    pytest.param(LayoutFlags(first=6, last=6), 4, 1, [6, 10, 10, 6],
                 ["--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"], id="first-last"),
    pytest.param(LayoutFlags(first=4, last=4), 4, 2, [2, 6, 6, 2, 2, 6, 6, 2],
                 ["--decoder-first-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank"],
                 id="first-last-vpp"),
    pytest.param(LayoutFlags(layout="Et*5|t*9|t*9|t*9L"), 4, 1, [5, 9, 9, 9],
                 ["--decoder-first-pipeline-num-layers"], id="layout-string-said-by-first"),
    pytest.param(LayoutFlags(layout="Et*9|t*7|t*8|t*8L"), 4, 1, [9, 7, 8, 8],
                 ["--pipeline-model-parallel-layout"], id="layout-string"),
    pytest.param(LayoutFlags(layout="Et*3|(t*4|)*6,t*5L"), 4, 2, [3, 4, 4, 4, 4, 4, 4, 5],
                 ["--pipeline-model-parallel-layout"], id="layout-string-vpp"),
]


@pytest.mark.parametrize(("flags", "pp", "vpp", "decoders", "launch_flags"), FORMS)
def test_layout_round_trips(flags, pp, vpp, decoders, launch_flags) -> None:
    cluster = H100.with_gpus(8 * pp)
    job = train_job(LLAMA8, seq_len=4096, global_batch_size=64)
    plan = evaluate(LLAMA8, cluster, job, tp=8, pp=pp, vpp=vpp, layout=flags)
    assert [layer_counts(LLAMA8, s)[0] for s in plan.stages] == decoders
    command = megatron_command(plan)
    for flag in launch_flags:
        assert flag in command
    if flags.layout is None:
        assert "--pipeline-model-parallel-layout" not in command  # the simpler flags say it
    parsed = parse_megatron(command, vocab_size=LLAMA8.vocab_size).with_world_size(plan.num_gpus)
    assert parsed.vpp == plan.config.dims.vpp
    assert [(s.start, s.stop) for s in parsed.layout()] == [(s.start, s.stop) for s in plan.stages]
    res = CliRunner().invoke(app, ["evaluate", "llama-3.1-8b", "dgx-h100", "--gpus", str(plan.num_gpus), "--from-megatron",
                                   command, "--json"])
    assert res.exit_code in (0, 1), res.stderr
    again = json.loads(res.stdout)
    mine = plan.to_json()
    assert again["plan"]["stages"] == mine["plan"]["stages"]
    for key in ("step_time_s", "tflops_per_gpu"):
        assert again["predicted"][key] == pytest.approx(mine["predicted"][key], rel=1e-9)
    assert again["predicted"]["memory_gib"]["per_stage"] == pytest.approx(mine["predicted"]["memory_gib"]["per_stage"],
                                                                          rel=1e-9)


@pytest.mark.parametrize(("layers", "pp", "vpp", "expected"), [
    (32, 4, 1, LayoutFlags()),
    (126, 8, 1, LayoutFlags(account_embedding=True, account_loss=True)),   # Llama 3.1 405B: 128 = 8 x 16
    (126, 16, 1, LayoutFlags(account_embedding=True, account_loss=True)),  # 128 = 16 x 8
    (94, 8, 4, LayoutFlags(account_embedding=True, account_loss=True)),    # Qwen3-235B: 96 = 32 x 3
    (32, 3, 1, LayoutFlags(account_loss=True)),                            # 33 = 3 x 11
    (61, 8, 1, LayoutFlags(first=7, last=6)),                              # 61 = 7 + 6 x 8 + 6; 62, 63 do not split
    (70, 12, 1, LayoutFlags(account_embedding=True, account_loss=True)),   # BLOOM: 72 = 12 x 6
    (69, 4, 1, LayoutFlags(first=17, last=16)),                            # 71, 70 do not split; 17+2x18+16
])
def test_predicted_layout(layers, pp, vpp, expected) -> None:
    model = LLAMA8.model_copy(update={"layers": (LLAMA8.layers[0], LLAMA8.layers[1].model_copy(update={"count": layers}),
                                                 LLAMA8.layers[-1])})
    flags = predict_layout(model, pp=pp, vpp=vpp)
    assert flags == expected
    stages, got_vpp = layout_stages(model, pp=pp, vpp=vpp, flags=flags)
    assert got_vpp == vpp and len(stages) == pp * vpp
    assert sum(layer_counts(model, s)[0] for s in stages) == layers


def test_deepseek_61_layers_over_32_chunks_need_a_layout_string() -> None:
    """61 layers, PP 8 x VPP 4: no account-for flag or first/last count works (each rank's layers must
    divide by VPP 4 and 61 is odd), so a balanced layout string is predicted."""
    v3 = load_model("deepseek-v3")
    flags = predict_layout(v3, pp=8, vpp=4)
    assert flags.layout is not None and flags.first is None
    stages, vpp = layout_stages(v3, pp=8, vpp=4, flags=flags)
    sizes = [s.stop - s.start for s in stages]
    assert vpp == 4 and sum(sizes) == 63 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("flags", "pp", "fragment"), [
    (LayoutFlags(layout="Et*16|t*16L", first=16), 2, "cannot be combined"),
    (LayoutFlags(first=10, account_loss=True), 3, "cannot be combined"),
    (LayoutFlags(first=0), 2, "at least 1"),
    (LayoutFlags(first=10, last=11), 4, "split evenly"),  # 11 layers left for 2 middle ranks
    (LayoutFlags(first=8), 1, "PP > 1"),
    (LayoutFlags(account_embedding=True), 2, "do not split evenly"),  # 33 over 2 chunks
    (LayoutFlags(layout="Et*16|t*15L"), 2, "places 31 decoder layers"),
    (LayoutFlags(layout="Et*16|t*16|L"), 2, "not a multiple"),
    (LayoutFlags(layout="Et*16|t*16Lm"), 2, "MTP"),  # the model has no MTP module
    (LayoutFlags(layout="Et*16|tLt*15"), 2, "end with one L"),
])
def test_layouts_megatron_refuses(flags, pp, fragment) -> None:
    with pytest.raises(SpecError, match=fragment):
        layout_stages(LLAMA8, pp=pp, vpp=1, flags=flags)


def test_solve_with_a_pinned_layout_matches_brute_force() -> None:
    """The bound-ordered search returns the best of every candidate predicted on the pinned layout."""
    from autoshard.api import solve_with_layout
    from autoshard.costmodel.train.step import predict_train
    from autoshard.search.train.options import SolverOptions
    from autoshard.search.train.space import Pins, SpaceOptions, enumerate_train

    cluster = H100.with_gpus(32)
    job = train_job(LLAMA8, seq_len=4096, global_batch_size=64)
    flags = LayoutFlags(layout="Et*9|t*7|t*8|t*8L")
    pins = Pins(pp=4)
    options = SolverOptions(top_k=3, time_limit_s=60, space=SpaceOptions())
    plans = solve_with_layout(LLAMA8, cluster, job, flags, pins=pins, options=options)
    stages, _ = layout_stages(LLAMA8, pp=4, vpp=1, flags=flags)
    every = sorted(p.step_time_s for c in enumerate_train(LLAMA8, cluster, job, pins=Pins(pp=4, vpp=1)).candidates
                   if (p := predict_train(LLAMA8, cluster, c, stages)).fits)
    assert [p.prediction.step_time_s for p in plans] == pytest.approx(every[:3], rel=1e-12)
    assert plans[0].solver.status == "OPTIMAL"
    assert all(p.stages == stages for p in plans)


@pytest.mark.parametrize("text", ["Et*99999999999|L", "E(t|)*10000000000,L", "E" + "t" * 200_000 + "L"])
def test_hostile_layout_strings_are_refused_quickly(text: str) -> None:
    with pytest.raises(SpecError, match="repeats|not a layout"):
        layout_stages(LLAMA8, pp=2, vpp=1, flags=LayoutFlags(layout=text))
