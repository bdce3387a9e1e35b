"""Megatron-LM emitter and command parser: golden files, the framework's validation rules, round
trips for every bundled model, real-world commands and bad input.

The rules below are copied from Megatron-LM's validate_args / TransformerConfig as summarized in the
project's launcher-flag reference (Megatron-LM commit d98e8a64, 2026-08-22); tests never read that file.
Regenerate the golden files with `UPDATE_GOLDEN=1 python -m pytest tests/emit`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.emit import megatron_command, megatron_notes, megatron_script, parse_megatron
from autoshard.emit.megatron import flags as mf
from autoshard.emit.megatron import flags_retired
from autoshard.search.train.knobs import default_fp8_recipe
from autoshard.emit.megatron.args import pipeline_layout
from autoshard.emit.megatron.layout import default_stages, parse_layout
from autoshard.emit.megatron.parse import model_shape_differences
from autoshard.errors import SpecError
from autoshard.parallel import ParallelDims, Recompute, check_dims
from autoshard.plans.base import SolverStats
from autoshard.plans.train import Plan
from autoshard.specs import bundled_models, load_cluster, load_model
from autoshard.specs.job import Precision

GOLDEN = Path(__file__).parent / "golden"

# --------------------------------------------------------------------------- facts copied from Megatron-LM
CHOICES = {
    "--fp8-format": {"e4m3", "hybrid"},
    "--fp8-recipe": {"tensorwise", "delayed", "mxfp8", "blockwise", "custom"},
    "--cross-entropy-fusion-impl": {"native", "te"},
    "--attention-backend": {"flash", "fused", "unfused", "local", "auto"},
    "--transformer-impl": {"local", "transformer_engine", "inference_optimized"},
    "--tokenizer-type": {
        "BertWordPieceLowerCase",
        "BertWordPieceCase",
        "GPT2BPETokenizer",
        "SentencePieceTokenizer",
        "GPTSentencePieceTokenizer",
        "HuggingFaceTokenizer",
        "Llama2Tokenizer",
        "TikTokenizer",
        "MultimodalTokenizer",
        "NullTokenizer",
        "NullMultimodalTokenizer",
        "SFTTokenizer",
    },
    "--position-embedding-type": {"learned_absolute", "rope", "yarn", "mrope", "relative", "none"},
    "--normalization": {"LayerNorm", "RMSNorm"},
    "--recompute-granularity": {"full", "selective"},
    "--recompute-method": {"uniform", "block"},
    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads", "optim_grads_params"},
    "--ckpt-format": {"torch", "torch_dist", "torch_dcp", "fsdp_dtensor"},
    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},
    "--lr-decay-style": {"constant", "linear", "cosine", "inverse-square-root", "WSD"},
    "--optimizer": {"adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"},
}
SWITCHES = {
    "--group-query-attention",
    "--swiglu",
    "--squared-relu",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--add-qkv-bias",
    "--qk-layernorm",
    "--multi-latent-attention",
    "--moe-grouped-gemm",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--use-megatron-fsdp",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--tp-comm-overlap",
    "--bf16",
    "--log-throughput",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--moe-router-enable-expert-bias",
    "--grad-reduce-in-bf16",
    "--use-precision-aware-optimizer",
    "--fp8-param-gather",
    "--cross-entropy-loss-fusion",
    "--use-rope-scaling",
    "--no-yarn-correction-range-round-to-int",
}
REMOVED = {
    "--standalone-embedding-stage",
    "--pipeline-model-parallel-split-rank",
    "--fp8",
    "--use-legacy-models",
    "--moe-extended-tp",
    "--overlap-p2p-communication",
}


def expand_layout(text: str) -> list[str]:
    """Megatron's PipelineParallelLayerLayout.parse_str_to_list, written independently."""
    s = text.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return s.split("|")


def split_command(text: str) -> tuple[dict[str, str], list[str], dict[str, list[str]]]:
    """(env assignments, launcher words, flags) of the launch line of a command or script."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    entry = next(i for i, w in enumerate(words) if w.endswith("pretrain_gpt.py"))
    env = dict(w.split("=", 1) for w in words[:entry] if re.match(r"^[A-Z_]+=", w))
    flags: dict[str, list[str]] = {}
    for w in words[entry + 1 :]:
        if w.startswith("--"):
            assert w not in flags, f"{w} given twice"
            flags[w] = []
        else:
            flags[list(flags)[-1]].append(w)
    return env, words[:entry], flags


def rule_violations(text: str, *, world: int, blackwell: bool) -> list[str]:
    """Megatron-LM's validate_args rules that a command breaks (empty when it would start)."""
    env, _, f = split_command(text)
    bad: list[str] = []

    def val(name: str, default: int | None = None) -> int | None:
        return int(f[name][0]) if name in f else default

    for name, values in f.items():
        if name not in mf.KNOWN or name in REMOVED:
            bad.append(f"{name}: not a Megatron-LM flag")
        if (name in SWITCHES) != (values == []):
            bad.append(f"{name}: wrong arity {values}")
        if name in CHOICES and values[0] not in CHOICES[name]:
            bad.append(f"{name}: invalid choice {values[0]}")
    tp, pp, cp = (
        val("--tensor-model-parallel-size", 1),
        val("--pipeline-model-parallel-size", 1),
        val("--context-parallel-size", 1),
    )
    ep, etp = val("--expert-model-parallel-size", 1), val("--expert-tensor-parallel-size", tp)
    assert tp and pp and cp and ep and etp
    L, heads, seq = val("--num-layers"), val("--num-attention-heads"), val("--seq-length")
    assert L and heads and seq
    if world % (tp * pp * cp) or world % (etp * ep * pp):
        bad.append("world size not divisible by TP*PP*CP or ETP*EP*PP")
    dp = world // (tp * pp * cp)
    if heads % tp:
        bad.append("heads % TP")
    if "--group-query-attention" in f:
        groups = val("--num-query-groups")
        assert groups
        if groups % tp and tp % groups:
            bad.append("query groups vs TP")
    if cp > 1 and seq % (2 * cp):
        bad.append("seq % 2CP")
    if (val("--max-position-embeddings") or 0) < seq:
        bad.append("max positions < seq")
    mbs, gbs = val("--micro-batch-size"), val("--global-batch-size")
    if mbs is None or gbs is None or gbs % (mbs * dp):
        bad.append("global batch not divisible by micro-batch x DP")
    vpp_flags = [
        x
        for x in (
            "--num-layers-per-virtual-pipeline-stage",
            "--num-virtual-stages-per-pipeline-rank",
            "--pipeline-model-parallel-layout",
        )
        if x in f
    ]
    if len(vpp_flags) > 1:
        bad.append("more than one VPP flag")
    if "--pipeline-model-parallel-layout" in f:
        chunks = expand_layout(f["--pipeline-model-parallel-layout"][0])
        flat = "".join(chunks)
        if len(chunks) % pp:
            bad.append("layout chunks not divisible by PP")
        if not (flat.startswith("E") and flat.endswith("L") and flat.count("E") == flat.count("L") == 1):
            bad.append("layout must start with E and end with L")
        if flat.count("t") != L:
            bad.append("layout decoder count != --num-layers")
        if any(x in f for x in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                                "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")):
            bad.append("layout string combined with first/last or account-for flags")
    elif "--decoder-first-pipeline-num-layers" in f or "--decoder-last-pipeline-num-layers" in f:
        vpp = val("--num-virtual-stages-per-pipeline-rank", 1) or 1
        rest, middle = L, pp
        for name in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
            if name in f:
                x = val(name)
                assert x is not None
                if x <= 0 or x % vpp:
                    bad.append(f"{name} must be positive and divisible by VPP")
                rest, middle = rest - x, middle - 1
        if bool(rest) != bool(middle) or (middle and (rest % middle or (rest // middle) % vpp)):
            bad.append("uneven pipeline: the middle ranks do not split the rest evenly")
        if any(x in f for x in ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")):
            bad.append("first/last layers combined with account-for flags")
    else:
        counted = L + ("--account-for-embedding-in-pipeline-split" in f) + ("--account-for-loss-in-pipeline-split" in f)
        if counted % (pp * (val("--num-virtual-stages-per-pipeline-rank", 1) or 1)):
            bad.append("num layers not divisible by PP (x VPP)")
    if "--tp-comm-overlap" in f and not ("--sequence-parallel" in f and tp > 1):
        bad.append("--tp-comm-overlap needs --sequence-parallel")
    gran = f.get("--recompute-granularity", [None])[0]
    if gran == "full" and not ("--recompute-method" in f and "--recompute-num-layers" in f):
        bad.append("full recompute needs method and num layers")
    if gran == "selective" and ("--recompute-method" in f or "--recompute-num-layers" in f):
        bad.append("selective recompute forbids method / num layers")
    dist = "--use-distributed-optimizer" in f or "--use-megatron-fsdp" in f
    if "--overlap-param-gather" in f and not (dist and "--overlap-grad-reduce" in f):
        bad.append("--overlap-param-gather needs a distributed optimizer and --overlap-grad-reduce")
    fsdp = "--use-megatron-fsdp" in f
    if fsdp != (f.get("--ckpt-format") == ["fsdp_dtensor"]):
        bad.append("Megatron-FSDP <-> --ckpt-format fsdp_dtensor")
    if "--num-experts" in f and int(f["--num-experts"][0]) % ep:
        bad.append("experts % EP")
    wants_one = (tp > 1 or cp > 1) and not blackwell and not fsdp
    if (
        wants_one
        and env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1"
        and "export CUDA_DEVICE_MAX_CONNECTIONS=1" not in text
    ):
        bad.append("CUDA_DEVICE_MAX_CONNECTIONS=1 missing")
    if fsdp and ("CUDA_DEVICE_MAX_CONNECTIONS" in env or "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text):
        bad.append("Megatron-FSDP forbids CUDA_DEVICE_MAX_CONNECTIONS=1")
    return bad


# --------------------------------------------------------------------------- plans without the solver
def chunk_stages(
    n_layers: int, decoders: list[int], *, block: int = 0, pools: list[int] | None = None
) -> tuple[Stage, ...]:
    out, pos, last = [], 0, len(decoders) - 1
    for i, n in enumerate(decoders):
        size = n + (i == 0) + (i == last)
        out.append(Stage(pos, pos + size, pools[i] if pools else 0, min(block, n)))
        pos += size
    assert pos == n_layers + 2
    return tuple(out)


def make_plan(
    model: str,
    cluster: str,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int = 1,
    mbs: int = 1,
    gbs: int | None = None,
    recompute: str = "none",
    block: int = 0,
    zero: int = 1,
    precision: str = "bf16",
    sp: bool = True,
    tp_overlap: bool = False,
    overlap: bool = True,
    decoders: list[int] | None = None,
) -> Plan:
    m, c = load_model(model), load_cluster(cluster)
    dims = ParallelDims(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp)
    if dims.world_size != c.num_gpus:
        c = c.with_gpus(dims.world_size)
    seq = m.training.seq_len if m.training and m.training.seq_len else 4096
    cfg = TrainConfig(
        dims=dims,
        micro_batch_size=mbs,
        global_batch_size=gbs or mbs * dp * 8,
        seq_len=seq,
        precision=Precision(precision),
        recompute=Recompute(recompute),
        sequence_parallel=sp,
        zero_stage=zero,
        tp_comm_overlap=tp_overlap,
        overlap_grad_reduce=overlap,
        fp8_recipe=default_fp8_recipe(c),  # what solve/evaluate pick: mxfp8 on Blackwell, delayed elsewhere
    )
    n = dims.num_stages
    if decoders is None:
        decoders = [m.num_layers // n + (i < m.num_layers % n) for i in range(n)]
    stages = chunk_stages(m.num_layers, decoders, block=block)
    pred = predict_train(m, c, cfg, stages)
    solver = SolverStats(status="EVALUATED", wall_s=0.0, objective=pred.step_time_s, bound=pred.step_time_s)
    return Plan(model=m, cluster=c, config=cfg, stages=stages, prediction=pred, solver=solver)


GOLDEN_PLANS = {
    "llama-3.1-8b_dgx-h100_tp2-dp4": lambda: make_plan(
        "llama-3.1-8b", "dgx-h100", tp=2, dp=4, gbs=512, recompute="selective"
    ),
    "llama-3.1-70b_dgx-h100_tp8-pp4-vpp2-uneven": lambda: make_plan(
        "llama-3.1-70b",
        "dgx-h100",
        tp=8,
        pp=4,
        dp=2,
        vpp=2,
        gbs=512,
        recompute="selective",
        decoders=[9, 10, 10, 11, 11, 10, 10, 9],
    ),
    "gpt3-175b_dgx-a100-80gb_tp8-pp16-full": lambda: make_plan(
        "gpt3-175b", "dgx-a100-80gb", tp=8, pp=16, dp=4, gbs=1536, recompute="full", zero=0
    ),
    "mixtral-8x7b_dgx-h100_ep8-zero3": lambda: make_plan(
        "mixtral-8x7b", "dgx-h100", tp=2, dp=8, ep=8, etp=1, gbs=256, zero=3, mbs=2
    ),
    "deepseek-v3_gb200-nvl72_fp8-layout": lambda: make_plan(
        "deepseek-v3",
        "gb200-nvl72",
        tp=2,
        pp=8,
        dp=36,
        ep=8,
        etp=1,
        vpp=2,
        gbs=2304,
        precision="fp8",
        recompute="selective",
        block=1,
        decoders=[3] + [4] * 14 + [2],
    ),
    "nemotron-4-340b_mi300x_cp2-zero2-block": lambda: make_plan(
        "nemotron-4-340b", "mi300x", tp=8, pp=4, cp=2, dp=4, gbs=2304, zero=2, block=2
    ),
    "qwen3-30b-a3b_dgx-b200_vpp-tp-overlap": lambda: make_plan(
        "qwen3-30b-a3b",
        "dgx-b200",
        tp=2,
        pp=2,
        vpp=2,
        dp=8,
        ep=8,
        gbs=1024,
        tp_overlap=True,
        recompute="selective",
    ),
}


@pytest.fixture(scope="module", params=sorted(GOLDEN_PLANS))
def golden(request: pytest.FixtureRequest) -> tuple[str, Plan]:
    return request.param, GOLDEN_PLANS[request.param]()


# --------------------------------------------------------------------------- golden files
def _compare(path: Path, text: str) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path.name}: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"{path.name} changed; inspect the diff and regenerate with UPDATE_GOLDEN=1"
    )


def test_golden_script(golden: tuple[str, Plan]) -> None:
    name, plan = golden
    _compare(GOLDEN / f"{name}.sh", megatron_script(plan))


def test_golden_command(golden: tuple[str, Plan]) -> None:
    name, plan = golden
    _compare(GOLDEN / f"{name}.command.sh", megatron_command(plan))


def test_golden_files_are_all_used() -> None:
    names = {p.name.removesuffix(".command.sh").removesuffix(".sh") for p in GOLDEN.glob("*.sh")}
    assert names == set(GOLDEN_PLANS)


def test_script_and_command_carry_the_same_flags(golden: tuple[str, Plan]) -> None:
    _, plan = golden
    assert split_command(megatron_script(plan))[2] == split_command(megatron_command(plan))[2]
    script = megatron_script(plan)
    assert script.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in script
    for var in (
        "MASTER_ADDR",
        "NODE_RANK",
        "MASTER_PORT",
        "NNODES",
        "GPUS_PER_NODE",
        "DATA_PATH",
        "TOKENIZER_MODEL",
    ):
        assert re.search(rf"^{var}=", script, re.M), var


def test_golden_commands_obey_megatron_rules(golden: tuple[str, Plan]) -> None:
    _, plan = golden
    blackwell = plan.cluster.primary.gpu.name.startswith(("B200", "GB200"))
    for text in (megatron_command(plan), megatron_script(plan)):
        assert rule_violations(text, world=plan.num_gpus, blackwell=blackwell) == []


def test_launch_is_valid_bash(golden: tuple[str, Plan], tmp_path: Path) -> None:
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    _, plan = golden
    path = tmp_path / "launch.sh"
    path.write_text(megatron_script(plan))
    assert subprocess.run([bash, "-n", str(path)], capture_output=True).returncode == 0


# --------------------------------------------------------------------------- rules over many plans
def _variants(model_name: str) -> list[dict[str, object]]:
    m = load_model(model_name)
    out: list[dict[str, object]] = [
        dict(tp=8, dp=8, recompute="selective"),
        dict(tp=4, pp=4, vpp=2, dp=4, recompute="full", zero=0),
        dict(tp=8, pp=4, dp=2, block=2, precision="fp8", uneven=True),
        dict(tp=2, cp=2, pp=2, dp=8, recompute="selective", block=1, zero=2, uneven=True),
        dict(tp=1, dp=64, zero=3),
        dict(tp=4, pp=2, dp=8, tp_overlap=True, recompute="selective"),
        dict(tp=2, pp=4, vpp=3, dp=8, uneven=True, embedding_alone=True, recompute="full"),
        dict(tp=8, pp=2, dp=4, zero=0, overlap=False),
    ]
    if m.moe is not None:
        out += [
            dict(tp=2, pp=2, ep=8, etp=1, dp=16, recompute="selective"),
            dict(tp=4, pp=4, ep=4, etp=2, dp=4, uneven=True, block=1, precision="fp8"),
            dict(tp=1, ep=8, dp=64, zero=2),
        ]
    return out


def _decoders(n_layers: int, chunks: int, *, uneven: bool, embedding_alone: bool) -> list[int] | None:
    if embedding_alone:
        rest = chunks - 1
        return [0] + [n_layers // rest + (i < n_layers % rest) for i in range(rest)]
    if not uneven and n_layers % chunks == 0:
        return None
    base = [n_layers // chunks] * chunks
    if chunks >= 3 and base[0] > 1:
        base[0] -= 1
        base[-1] -= 1
    for i in range(n_layers - sum(base)):
        base[1 + i % (chunks - 1) if chunks > 1 else 0] += 1
    return base


def _plans(model_name: str, cluster: str) -> list[Plan]:
    m = load_model(model_name)
    plans = []
    for v in _variants(model_name):
        kw = dict(v)
        uneven, alone = bool(kw.pop("uneven", False)), bool(kw.pop("embedding_alone", False))
        dims = ParallelDims(**{k: kw[k] for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp") if k in kw})  # type: ignore[arg-type]
        if check_dims(dims, m, seq_len=m.training.seq_len if m.training and m.training.seq_len else 4096):
            continue
        if cluster == "gb200-nvl72":  # whole 72-GPU NVLink domains
            if 72 % (dims.tp * dims.pp * dims.cp):
                continue
            kw["dp"] = 72 // (dims.tp * dims.pp * dims.cp)
            try:
                ParallelDims(**{k: kw[k] for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp") if k in kw})  # type: ignore[arg-type]
            except ValueError:
                continue
        kw["gbs"] = int(kw["dp"]) * 16  # type: ignore[call-overload]
        kw["decoders"] = _decoders(m.num_layers, dims.num_stages, uneven=uneven, embedding_alone=alone)
        plans.append(make_plan(model_name, cluster, **kw))  # type: ignore[arg-type]
    return plans


MODELS = sorted(bundled_models())
CLUSTERS = ["dgx-h100", "dgx-a100-80gb", "gb200-nvl72", "mi300x"]


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("model", MODELS)
def test_every_emitted_launch_obeys_megatron_rules(model: str, cluster: str) -> None:
    plans = _plans(model, cluster)
    assert plans
    for plan in plans:
        blackwell = cluster == "gb200-nvl72"
        for text in (megatron_command(plan), megatron_script(plan)):
            assert rule_violations(text, world=plan.num_gpus, blackwell=blackwell) == [], plan.config


@pytest.mark.parametrize("model", MODELS)
def test_round_trip_every_bundled_model(model: str) -> None:
    spec = load_model(model)
    for plan in _plans(model, "dgx-h100"):
        cfg = plan.config
        for text in (megatron_command(plan), megatron_script(plan)):
            parsed = parse_megatron(text, vocab_size=spec.vocab_size)
            assert model_shape_differences(spec, parsed.model) == []
            assert parsed.dims is not None
            assert (
                parsed.dims.tp,
                parsed.dims.pp,
                parsed.dims.dp,
                parsed.dims.cp,
                parsed.dims.ep,
                parsed.dims.expert_tp,
                parsed.dims.vpp,
            ) == (
                cfg.dims.tp,
                cfg.dims.pp,
                cfg.dims.dp,
                cfg.dims.cp,
                cfg.dims.ep,
                cfg.dims.expert_tp,
                cfg.dims.vpp,
            )
            assert (parsed.micro_batch_size, parsed.global_batch_size, parsed.seq_len, parsed.precision) == (
                cfg.micro_batch_size,
                cfg.global_batch_size,
                cfg.seq_len,
                cfg.precision,
            )
            assert parsed.sequence_parallel == cfg.sp and parsed.zero_stage == cfg.zero_stage
            assert parsed.overlap_grad_reduce == cfg.overlap_grad_reduce
            assert parsed.tp_comm_overlap == (cfg.tp_comm_overlap and cfg.sp)
            assert parsed.recompute_num_layers == (
                0 if cfg.recompute is Recompute.FULL else plan.recompute_num_layers
            )
            expected = (
                cfg.recompute
                if not plan.recompute_num_layers
                else (Recompute.FULL if cfg.recompute is Recompute.FULL else Recompute.NONE)
            )
            assert parsed.recompute is expected
            stages = (
                plan.stages
                if cfg.recompute is not Recompute.FULL
                else tuple(dataclasses.replace(s, full_recompute_layers=0) for s in plan.stages)
            )
            assert parsed.layout() == stages
            assert (parsed.stages is None) == (
                pipeline_layout(spec, plan.stages) is None or len(plan.stages) == 1
            )
            assert parsed.train_config() == dataclasses.replace(
                cfg,
                tp_comm_overlap=cfg.tp_comm_overlap and cfg.sp,
                sequence_parallel=cfg.sp,
                recompute=expected,
            )
            assert not [w for w in parsed.warnings if "flag" in w]


# --------------------------------------------------------------------------- specific rules and notes
def test_no_overlap_param_gather_without_a_sharded_optimizer() -> None:
    _, _, f = split_command(megatron_command(make_plan("llama-3.1-8b", "dgx-h100", tp=8, zero=0)))
    assert "--overlap-grad-reduce" in f and "--overlap-param-gather" not in f
    assert "--use-distributed-optimizer" not in f
    _, _, f = split_command(megatron_command(make_plan("llama-3.1-8b", "dgx-h100", tp=8, zero=1)))
    assert {"--overlap-grad-reduce", "--overlap-param-gather", "--use-distributed-optimizer"} <= set(f)


def test_zero_stages_map_to_megatron_fsdp() -> None:
    for zero, strategy in ((2, "optim_grads"), (3, "optim_grads_params")):
        plan = make_plan("llama-3.1-8b", "dgx-h100", tp=2, dp=4, zero=zero)
        env, _, f = split_command(megatron_command(plan))
        assert f["--data-parallel-sharding-strategy"] == [strategy] and f["--ckpt-format"] == ["fsdp_dtensor"]
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env
        assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in megatron_script(plan)


def test_layout_chunks_divisible_by_pp_and_vpp_flags_exclusive() -> None:
    plan = make_plan("llama-3.1-70b", "dgx-h100", tp=8, pp=4, vpp=3, dp=2, decoders=[6] + [7] * 10 + [4])
    _, _, f = split_command(megatron_command(plan))
    chunks = expand_layout(f["--pipeline-model-parallel-layout"][0])
    assert len(chunks) == 12 and len(chunks) % 4 == 0
    assert (
        "--num-virtual-stages-per-pipeline-rank" not in f
        and "--num-layers-per-virtual-pipeline-stage" not in f
    )
    even = make_plan("llama-3.1-70b", "dgx-h100", tp=8, pp=4, vpp=2, dp=2)
    _, _, f = split_command(megatron_command(even))
    assert (
        f["--num-virtual-stages-per-pipeline-rank"] == ["2"] and "--pipeline-model-parallel-layout" not in f
    )


def test_layout_strings() -> None:
    m = load_model("llama-3.1-70b")
    assert pipeline_layout(m, chunk_stages(80, [19, 21, 21, 19])) == "Et*19|t*21|t*21|t*19L"
    assert pipeline_layout(m, chunk_stages(80, [20] * 4)) is None
    assert pipeline_layout(m, chunk_stages(80, [0, 27, 27, 26])) == "E|t*27|t*27|t*26L"
    assert pipeline_layout(m, chunk_stages(80, [3] + [5] * 15 + [2])) == "Et*3|(t*5|)*15,t*2L"
    stages, _ = parse_layout("Et*3|(t*5|)*15,t*2L", num_layers=80, pp=17)
    assert tuple(stages) == chunk_stages(80, [3] + [5] * 15 + [2])


def test_recompute_modes() -> None:
    def flags(**kw: object) -> dict[str, list[str]]:
        return split_command(megatron_command(make_plan("llama-3.1-8b", "dgx-h100", tp=8, **kw)))[2]  # type: ignore[arg-type]

    assert flags(recompute="selective")["--recompute-granularity"] == ["selective"]
    full = flags(recompute="full")
    assert (full["--recompute-method"], full["--recompute-num-layers"]) == (["uniform"], ["1"])
    block = flags(block=3)
    assert (
        block["--recompute-granularity"],
        block["--recompute-method"],
        block["--recompute-num-layers"],
    ) == (["full"], ["block"], ["3"])
    assert "--recompute-granularity" not in flags()
    both = make_plan("llama-3.1-8b", "dgx-h100", tp=8, recompute="selective", block=2)
    assert split_command(megatron_command(both))[2]["--recompute-method"] == ["block"]
    assert any("selective" in n for n in megatron_notes(both))


def test_cuda_device_max_connections() -> None:
    def env(cluster: str, **kw: object) -> dict[str, str]:
        return split_command(megatron_command(make_plan("llama-3.1-8b", cluster, **kw)))[0]  # type: ignore[arg-type]

    assert env("dgx-h100", tp=2, dp=4) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert env("mi300x", tp=2, dp=4) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert env("dgx-h100", dp=4, cp=2) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert env("dgx-h100", dp=8) == {}
    assert env("dgx-b200", tp=2, dp=4) == {}


def test_fp8_flags() -> None:
    hopper = split_command(
        megatron_command(make_plan("llama-3.1-8b", "dgx-h100", tp=2, dp=4, precision="fp8"))
    )[2]
    assert (
        hopper["--fp8-format"] == ["hybrid"] and hopper["--fp8-recipe"] == ["delayed"] and "--bf16" in hopper
    )
    blackwell = split_command(
        megatron_command(make_plan("llama-3.1-8b", "dgx-b200", tp=2, dp=4, precision="fp8"))
    )[2]
    assert blackwell["--fp8-recipe"] == ["mxfp8"]


def test_fp4_flags_and_round_trip() -> None:
    """An NVFP4 plan launches with Megatron's FP4 switches (--fp4-format e2m1 --fp4-recipe nvfp4, with
    --bf16 for everything else) and no FP8 flag (Megatron: --fp4-format and --fp8-format are mutually
    exclusive); parsing the command back gives the FP4 precision, and the parsed plan predicts the
    same step."""
    plan = make_plan("llama-3.1-8b", "dgx-b200", tp=2, dp=4, precision="fp4")
    command = megatron_command(plan)
    flags = split_command(command)[2]
    assert flags["--fp4-format"] == ["e2m1"] and flags["--fp4-recipe"] == ["nvfp4"] and "--bf16" in flags
    assert not [f for f in flags if f.startswith("--fp8")]
    parsed = parse_megatron(command, vocab_size=plan.model.vocab_size)
    assert parsed.precision is Precision.FP4 and not parsed.warnings
    custom = parse_megatron(command.replace("--fp4-recipe nvfp4", "--fp4-recipe custom"),
                            vocab_size=plan.model.vocab_size)
    assert custom.precision is Precision.FP4
    assert any("--fp4-recipe custom" in w for w in custom.warnings)


def test_model_flags() -> None:
    qwen = split_command(megatron_command(make_plan("qwen3-30b-a3b", "dgx-h100", tp=4, dp=2, ep=8, etp=1)))[2]
    assert qwen["--kv-channels"] == ["128"] and "--qk-layernorm" in qwen and "--moe-layer-freq" not in qwen
    ds = split_command(
        megatron_command(make_plan("deepseek-v3", "dgx-h100", tp=8, pp=4, dp=2, ep=16, etp=1))
    )[2]
    assert ds["--moe-layer-freq"] == ["([0]*3+[1]*58)"] and ds["--q-lora-rank"] == ["1536"]
    assert "--group-query-attention" not in ds and "--multi-latent-attention" in ds
    gpt = split_command(megatron_command(make_plan("gpt3-175b", "dgx-h100", tp=8, pp=8, dp=1)))[2]
    assert gpt["--position-embedding-type"] == ["learned_absolute"] and gpt["--normalization"] == [
        "LayerNorm"
    ]
    assert not {"--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"} & set(gpt)
    nemo = split_command(megatron_command(make_plan("nemotron-4-340b", "dgx-h100", tp=8, pp=8, dp=1)))[2]
    assert "--squared-relu" in nemo and "--swiglu" not in nemo


def test_heterogeneous_cluster_note() -> None:
    m, c = load_model("llama-2-70b"), load_cluster("mixed-h100-a100")
    cfg = TrainConfig(
        dims=ParallelDims(tp=8, pp=3, dp=4), micro_batch_size=1, global_batch_size=64, seq_len=4096
    )
    stages = chunk_stages(80, [30, 25, 25], pools=[0, 1, 1])
    pred = predict_train(m, c, cfg, stages)
    plan = Plan(
        model=m,
        cluster=c,
        config=cfg,
        stages=stages,
        prediction=pred,
        solver=SolverStats(status="EVALUATED", wall_s=0, objective=1, bound=1),
    )
    assert any("NODE_RANK 0-3 on pool h100; NODE_RANK 4-11 on pool a100" in n for n in megatron_notes(plan))
    assert rule_violations(megatron_command(plan), world=96, blackwell=False) == []


def test_pools_of_different_node_sizes_start_their_own_gpus(tmp_path: Path) -> None:
    """mixed-3pool has 8-GPU H100 and A100-80GB servers and 4-GPU A100-40GB ones. The launch script started 8
    processes on every node (12 nodes x 8, with a note), which a 4-GPU server cannot run; each node now starts
    its own pool's GPUs (16 nodes: 2 x 8, 8 x 4, 4 x 8, 2 x 8). torchrun's elastic agent gives a node's ranks
    from the sum of the process counts of the nodes before it (`_assign_worker_ranks`), so node i runs the
    global ranks [sum(sizes[:i]), sum(sizes[:i + 1])), and those must all sit on a pipeline rank of the node's
    pool (pipeline rank is Megatron's outermost dimension)."""
    import subprocess

    from autoshard.emit.megatron.script import node_sizes

    m, c = load_model("llama-3.1-70b"), load_cluster("mixed-3pool")
    cfg = TrainConfig(dims=ParallelDims(tp=4, pp=6, dp=2, cp=2), micro_batch_size=1, global_batch_size=64,
                      seq_len=8192)
    stages = chunk_stages(80, [9, 9, 8, 23, 23, 8], pools=[1, 2, 2, 0, 0, 1])
    plan = Plan(model=m, cluster=c, config=cfg, stages=stages, prediction=predict_train(m, c, cfg, stages),
                solver=SolverStats(status="EVALUATED", wall_s=0, objective=1, bound=1))
    sizes = node_sizes(plan)
    assert [n for n, _ in sizes] == [8] * 2 + [4] * 8 + [8] * 4 + [8] * 2 and sum(n for n, _ in sizes) == 96
    first, per_rank = 0, 96 // 6
    for n, pool in sizes:  # every rank of a node on a pipeline rank of the node's pool, of its node size
        assert {c.pools[stages[r // per_rank].pool].name for r in range(first, first + n)} == {pool}
        assert c.pools[[p.name for p in c.pools].index(pool)].node.gpus_per_node == n
        first += n
    script = megatron_script(plan)
    assert "96 GPUs = 16 nodes (2 x 8, 8 x 4, 4 x 8, 2 x 8 GPUs)" in script and "NNODES=${NNODES:-16}" in script
    block = script[script.index("if (( NODE_RANK < 0 ))"):script.index("if (( NNODES != 16 ))")]
    got = {}
    for rank in (-1, 0, 1, 2, 9, 10, 13, 14, 15, 16):
        run = subprocess.run(["bash", "-c", f"NODE_RANK={rank}\n{block}echo $GPUS_PER_NODE"], capture_output=True,
                             text=True)
        got[rank] = run.stdout.strip() if run.returncode == 0 else "refused"
    assert got == {-1: "refused", 0: "8", 1: "8", 2: "4", 9: "4", 10: "8", 13: "8", 14: "8", 15: "8", 16: "refused"}
    # one node size: the plain launch, unchanged
    assert node_sizes(make_plan("llama-3.1-8b", "dgx-h100", tp=1, pp=2, dp=8)) is None
    # read back: no pool per stage in the command, so refused with the way out (it was "pass --gpus", then
    # "--gpus cannot resize a heterogeneous cluster")
    from autoshard.api import evaluate_megatron

    with pytest.raises(SpecError, match="a heterogeneous cluster's script is not read back; evaluate its degrees"):
        evaluate_megatron(script, "llama-3.1-70b", "mixed-3pool", None)


# --------------------------------------------------------------------------- real-world commands
GPT3_EXAMPLE = r"""#!/bin/bash
# Runs the "175B" parameter model (Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh style)
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=29500
NUM_NODES=16
NODE_RANK=0
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
CHECKPOINT_PATH=$1 #<Specify path>
DATA_PATH=$5 #<Specify path and file prefix>_text_document

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)
GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --attention-backend auto # Can use (flash/fused/unfused/local)
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --rampup-batch-size 16 16 5859375
    --train-iters 500000
    --weight-decay 0.1
    --init-method-std 0.006
    --clip-grad 1.0
    --fp16
    --lr 6.0e-5
    --lr-decay-style cosine
)
MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size 8
	--pipeline-model-parallel-size 16
)
DATA_ARGS=(
    --data-path $DATA_PATH
    --vocab-file $VOCAB_FILE
    --merge-file $MERGE_FILE
    --split 949,50,1
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]}
"""

LLAMA3_70B = """CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node=8 --nnodes=8 --node_rank=$NODE_RANK \
  --master_addr=$MASTER_ADDR --master_port=6000 pretrain_gpt.py \
  --use-mcore-models --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 \
  --num-attention-heads 64 --group-query-attention --num-query-groups 8 --kv-channels 128 \
  --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 \
  --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear \
  --tensor-model-parallel-size=8 --pipeline-model-parallel-size=4 --num-layers-per-virtual-pipeline-stage 5 \
  --context-parallel-size 2 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce \
  --overlap-param-gather --micro-batch-size 1 --global-batch-size 1024 --recompute-activations --bf16 \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-70B \
  --data-path "$DATA_PATH" --lr 1.5e-4 --train-iters 1000 --use-flash-atn
"""


def test_parse_gpt3_example_script(tmp_path: Path) -> None:
    path = tmp_path / "train_gpt3_175b_distributed.sh"
    path.write_text(GPT3_EXAMPLE)
    p = parse_megatron(str(path))
    gpt3 = load_model("gpt3-175b")
    assert model_shape_differences(gpt3, p.model) == []  # learned positions, LayerNorm, GeLU, biases, tied
    assert p.world_size == 128 and p.dims == ParallelDims(tp=8, pp=16, dp=1)
    assert (p.micro_batch_size, p.global_batch_size, p.seq_len, p.precision) == (
        1,
        1536,
        2048,
        Precision.BF16,
    )
    assert p.recompute is Recompute.NONE and p.zero_stage == 0 and p.stages is None
    assert any("--fp16" in w for w in p.warnings) and any("--rampup-batch-size" in w for w in p.warnings)
    assert len(p.layout()) == 16 and p.vocab_from_command


LLAMA3_8B_FP8_STYLE = """#!/bin/bash
GPUS_PER_NODE=8
NUM_NODES=${NUM_NODES:-2}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
TP_SIZE=2
PP_SIZE=$((WORLD_SIZE / 8))
DTYPE="fp8"
TOKENIZER_ARG=${3:-"MOCK"}
USE_UV=${USE_UV:-1}
if [ "${USE_UV}" = 1 ]; then
    VENV_PREFIX="uv run"
else
    VENV_PREFIX=""
fi
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --kv-channels 128
    --seq-length 8192 --max-position-embeddings 8192 --position-embedding-type rope
    --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear
)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --bf16)
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=(
        "--fp8-format hybrid"
        "--fp8-amax-history-len 1024"
    )
fi
DDP_ARGS=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
if [[ "$TOKENIZER_ARG" == "MOCK" ]]; then
    DATA_ARGS=("--mock-data" "--tokenizer-type NullTokenizer" "--vocab-size 128256")
else
    DATA_ARGS=("--tokenizer-type HuggingFaceTokenizer" "--tokenizer-model $TOKENIZER_ARG")
fi
if [ ! -f "pretrain_gpt.py" ]; then
    echo "Error: pretrain_gpt.py not found"
    exit 1
fi
$VENV_PREFIX python -m torch.distributed.run --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES \
    pretrain_gpt.py ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${DTYPE_ARGS[@]} \
    --tensor-model-parallel-size $TP_SIZE --pipeline-model-parallel-size $PP_SIZE ${DATA_ARGS[@]}
"""


def test_parse_script_with_arrays_arithmetic_and_branches(tmp_path: Path) -> None:
    path = tmp_path / "train_llama3_8b_fp8.sh"
    path.write_text(LLAMA3_8B_FP8_STYLE)
    p = parse_megatron(str(path))
    assert model_shape_differences(load_model("llama-3.1-8b"), p.model) == []  # vocab from the MOCK branch
    assert p.world_size == 16 and p.dims == ParallelDims(tp=2, pp=2, dp=4)
    assert p.precision is Precision.FP8 and p.zero_stage == 1 and p.overlap_grad_reduce
    assert any("first branch" in w for w in p.warnings)


def test_parse_llama3_70b_command() -> None:
    p = parse_megatron(LLAMA3_70B, vocab_size=128256)
    assert model_shape_differences(load_model("llama-3.1-70b"), p.model) == []
    assert p.dims == ParallelDims(tp=8, pp=4, cp=2, dp=1, vpp=4)
    assert p.recompute is Recompute.SELECTIVE and p.zero_stage == 1 and p.sequence_parallel
    assert p.overlap_grad_reduce and p.global_batch_size == 1024 and p.seq_len == 8192
    assert any(
        "--use-flash-atn is not a Megatron-LM flag (did you mean --use-flash-attn?)" in w for w in p.warnings
    )
    assert any("--recompute-activations is deprecated" in w for w in p.warnings)
    assert any("--use-mcore-models is deprecated" in w for w in p.warnings)
    assert not p.vocab_from_command and p.model.vocab_size == 128256
    assert p.layout() == default_stages(p.model, pp=4, vpp=4)


def test_parse_mixtral_and_deepseek_layouts() -> None:
    mixtral = parse_megatron(
        "torchrun --nproc-per-node 8 --nnodes 4 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
        "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
        "--seq-length 4096 --max-position-embeddings 32768 --position-embedding-type rope --swiglu "
        "--normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear --num-experts 8 "
        "--moe-router-topk 2 --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
        "--tensor-model-parallel-size 2 --sequence-parallel "
        "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 7 "
        "--decoder-last-pipeline-num-layers 7 --micro-batch-size 1 --global-batch-size 256 --bf16 "
        "--vocab-size 32000 --tokenizer-type NullTokenizer",
    )
    assert model_shape_differences(load_model("mixtral-8x7b"), mixtral.model) == []
    assert [s.stop - s.start for s in mixtral.layout()] == [8, 9, 9, 8]
    ds = parse_megatron(
        "torchrun --nproc-per-node 8 --nnodes 64 pretrain_gpt.py --num-layers 61 --hidden-size 7168 "
        "--num-attention-heads 128 --seq-length 4096 --max-position-embeddings 163840 "
        "--num-experts 256 --moe-layer-freq ([0]*3+[1]*58) --moe-ffn-hidden-size 2048 --micro-batch-size 1 "
        "--pipeline-model-parallel-size 16 --pipeline-model-parallel-layout Et*3|(tt|)*29,m|L --bf16 "
        "--expert-model-parallel-size 32 --mtp-num-layers 1",
        vocab_size=129280,
    )
    assert ds.vpp == 2 and len(ds.layout()) == 32 and ds.dims is not None and ds.dims.dp == 32
    assert (
        ds.layout()[0] == Stage(0, 4)
        and ds.layout()[-2] == Stage(62, 62)
        and ds.layout()[-1] == Stage(62, 63)
    )
    assert ds.model.num_moe_layers == 58 and ds.global_batch_size == 32
    assert any("MTP" in w for w in ds.warnings)


def test_parse_unknown_removed_and_value_forms() -> None:
    p = parse_megatron(
        "python pretrain_gpt.py --num-layers=4 --hidden-size=256 --num-attention-heads 4 --seq-length=128 "
        "--max-position-embeddings 128 --standalone-embedding-stage --tensor-model-paralel-size 2 --bf16=1"
    )
    assert p.model.num_layers == 4 and p.model.hidden_size == 256 and p.world_size is None and p.dims is None
    text = " | ".join(p.warnings)
    assert "--standalone-embedding-stage is not a Megatron-LM flag any more" in text
    assert "--pipeline-model-parallel-layout" in text  # the replacement is named
    assert "did you mean --tensor-model-parallel-size?" in text and "--bf16 takes no value" in text
    assert p.with_world_size(8).dims == ParallelDims(dp=8)
    with pytest.raises(SpecError, match="how many GPUs"):
        p.train_config()


def test_world_size_that_cannot_run_the_plan_is_left_open() -> None:
    p = parse_megatron(
        "torchrun --nproc-per-node 6 pretrain_gpt.py --num-layers 4 --hidden-size 8 --num-attention-heads 2 "
        "--seq-length 8 --tensor-model-parallel-size 4 --micro-batch-size 2"
    )
    assert p.dims is None and any("starts 6 processes" in w for w in p.warnings)
    with pytest.raises(SpecError, match="how many GPUs"):
        p.train_config()
    with pytest.raises(SpecError, match="not a multiple of TP"):
        p.with_world_size(6)
    cfg = p.with_world_size(8).train_config()
    assert (cfg.dims.dp, cfg.global_batch_size) == (2, 4)  # Megatron's default global batch: micro x DP


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("torchrun pretrain_gpt.py --hidden-size 8 --num-attention-heads 2 --seq-length 8", "--num-layers"),
        ("torchrun pretrain_gpt.py --num-layers 2 --num-attention-heads 2 --seq-length 8", "--hidden-size"),
        ("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 8 --seq-length 8", "--num-attention-heads"),
        (
            "torchrun pretrain_gpt.py --num-layers $L --hidden-size 8 --num-attention-heads 2",
            "not a whole number",
        ),
        # a degree Megatron-LM's argparse refuses was read as 1 with a warning: another plan priced
        (
            "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
            "--tensor-model-parallel-size abc",
            "'abc' is not a whole number: Megatron-LM's argparse would refuse it",
        ),
        (
            "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
            "--tensor-model-parallel-size 2.5",
            "'2.5' is not a whole number",
        ),
        (
            "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
            "--tensor-model-parallel-size",
            "--tensor-model-parallel-size expects a value",
        ),
        ("", "empty"),
        ("echo hello", "no Megatron-LM launch"),
        ("/nonexistent/launch.sh", "file not found"),
        (
            "python pretrain_gpt.py --num-layers 4 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
            "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|t*2L",
            "decoder layers",
        ),
        (
            "python pretrain_gpt.py --num-layers 4 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
            "--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*2|t|tL",
            "not a multiple",
        ),
        (
            "python pretrain_gpt.py --num-layers 4 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
            "--num-experts 4 --moe-layer-freq [1]*3",
            "--moe-layer-freq",
        ),
        (
            "python pretrain_gpt.py --num-layers 4 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
            "--num-experts 4 --moe-layer-freq __import__('os')",
            "--moe-layer-freq",
        ),
        (
            "python pretrain_gpt.py --num-layers 4 --hidden-size 8 --num-attention-heads 3 --seq-length 8",
            "impossible",
        ),
        (
            "python pretrain_gpt.py --num-layers 4 --hidden-size 8 --num-attention-heads 2 --seq-length 8 "
            "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 5",
            "put 5 decoder layers on the first pipeline rank, more than the model's 4",
        ),
    ],
)
def test_bad_input_is_a_spec_error(command: str, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_megatron(command)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            [
                "torchrun",
                "pretrain_gpt.py",
                "--num-layers",
                "--hidden-size",
                "--num-attention-heads",
                "--seq-length",
                "8",
                "2",
                "0",
                "-1",
                "x",
                "'",
                '"',
                "\\\n",
                "(",
                ")",
                "ARR=(",
                "${ARR[@]}",
                "--pipeline-model-parallel-layout",
                "E|t|L",
                "--num-experts",
                "--moe-layer-freq",
                "[1]*2",
                "--pipeline-model-parallel-size",
                "=",
                "--nnodes",
                "--nproc-per-node",
                "if",
                "fi",
                "\n",
                "#",
                "--tensor-model-parallel-size",
                "--kv-channels",
                "$X",
            ]
        ),
        max_size=30,
    )
)
def test_parser_never_raises_anything_but_spec_errors(words: list[str]) -> None:
    try:
        parse_megatron(" ".join(words))
    except SpecError:
        pass


def test_flag_table_matches_megatron() -> None:
    assert len(mf.KNOWN) == 900 and mf.SOURCE_COMMIT.startswith("d98e8a64")
    assert {
        "--pipeline-model-parallel-layout",
        "--use-megatron-fsdp",
        "--qk-pos-emb-head-dim",
    } <= mf.ONE_VALUE | mf.NO_VALUE
    assert REMOVED <= set(flags_retired.REMOVED) and not REMOVED & mf.KNOWN
    assert "--recompute-activations" in flags_retired.DEPRECATED and "--moe-router-load-balancing-type" in mf.MULTI_VALUE


def test_shape_differences_read_as_facts() -> None:
    """`evaluate MODEL --from-megatron` with another model's command listed the MoE layer pattern as two
    tuples of 80 and 32 zeros for dense models, and the MoE block as two reprs (`<RouterScore.SIGMOID:
    'sigmoid'>`): each differing fact now reads on its own."""
    dense = model_shape_differences(load_model("llama-3.1-70b"), load_model("llama-2-7b"))
    assert "num_layers: 80 vs 32" in dense and not any(d.startswith("moe") for d in dense)
    moe = model_shape_differences(load_model("deepseek-v3"), load_model("qwen3-235b-a22b"))
    assert "moe_layers: dense 0-2, MoE 3-60 vs MoE 0-93" in moe
    assert "moe.num_experts: 256 vs 128" in moe and "moe.score_function: sigmoid vs softmax" in moe
    assert "moe.top_k" not in " ".join(moe)  # both route 8 experts per token
    assert any(d.startswith("mla: q_lora_rank=1536 kv_lora_rank=512") and d.endswith(" vs none") for d in moe)
    mixed = model_shape_differences(load_model("llama-3.1-70b"), load_model("mixtral-8x7b"))
    assert "moe_layers: none vs MoE 0-31" in mixed and not any("<" in d for d in moe + mixed)
