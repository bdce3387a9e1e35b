"""The public Python API, the one surface for solve / evaluate / compare / study in both modes: build
jobs, solve for the best plans, evaluate a given plan or launch command, compare it with the best,
and run cost studies. The command line (`autoshard.cli`) calls only this module (plus `autoshard.report`
to render and `autoshard.errors`).

    import autoshard
    model = autoshard.load_model("llama-3.1-70b")
    cluster = autoshard.load_cluster("dgx-h100").with_gpus(64)
    plans = autoshard.solve(model, cluster, autoshard.train_job(model, seq_len=8192))
    print(plans[0].to_json()["predicted"]["mfu"])

Where it lives (each sibling is re-exported here, so `autoshard.api.X` is always the name to use):
- this file: training — solve, evaluate, the Megatron-LM layout helpers, `evaluate_megatron` and
  `compare_megatron` (an existing Megatron-LM command, alone or next to the best plan), `load`;
- `api_train.py`: training inputs from plain values (pins, solver options, layout flags, recompute
  modules) and the memory figures printed beside a plan;
- `api_serve.py`: serving — jobs, solve/evaluate with the launch commands attached (the solver never
  builds them), the interactive-SLA default, launch scripts and Kubernetes manifests;
- `api_study.py`: cost studies (`study`), their output set and JSON.
Names the layers below already define are imported from there: the Megatron-LM command and script
(`autoshard.emit.megatron`), the serving Pareto front (`autoshard.search.serve.front.serve_front`), the
study's serving fronts and renderers (`autoshard.study`).
Jobs and the cluster resize/precision checks (`train_job`, `resize`, `check_precision`) live below, in
`autoshard.specs.prepare`, because the cost studies need them too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autoshard.api_serve import (
    INTERACTIVE_TPOT_MS,
    ServeSolution,
    evaluate_serve,
    evaluate_serve_command,
    evaluate_vllm,
    interactive_job,
    plan_serving,
    serve_job_for,
    serve_launch,
    serve_launch_script,
    solve_serve,
    with_serve_launch,
    write_k8s_manifests,
)
from autoshard.api_study import study, study_json, write_study
from autoshard.api_train import (check_fp8_attention, layout_flags, memory_headroom, overflow_messages,
                                 recompute_modules, solver_options, train_pins)
from autoshard.costmodel.bands import band_for, mark_ties
from autoshard.costmodel.serve.engines import DEFAULT_ENGINE, ENGINE_NAMES
from autoshard.costmodel.train.a2a_overlap import a2a_overlap_problems
from autoshard.costmodel.train.rules import check_config
from autoshard.costmodel.train.step import predict_train
from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.layout import LayoutFlags, default_stages, layout_stages, predict_layout
from autoshard.emit.megatron.parse import model_shape_differences, parse_megatron
from autoshard.emit.megatron.rope import rope_differences
from autoshard.emit.megatron.script import megatron_notes, megatron_script
from autoshard.errors import SpecError
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims, Recompute, check_dims
from autoshard.plans.base import SolverStats
from autoshard.plans.train import Plan
from autoshard.report.compare import compare_plans
from autoshard.search.serve.front import FRONT_SHARE, serve_front
from autoshard.search.train.options import SolverOptions
from autoshard.search.train.solve import solve_train
from autoshard.search.train.knobs import check_moe_fp8_knobs, dispatcher_for, fp8_recipe_for
from autoshard.search.train.space import Pins, expert_grid_hint
from autoshard.specs.base import MAX_CONTEXT, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, MAX_TOKENS
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import TrainJob
from autoshard.specs.layers import LayerKind
from autoshard.specs.loader import FILES_READ, bundled_clusters, bundled_models, load_cluster, load_model
from autoshard.specs.model import ModelSpec
from autoshard.specs.prepare import check_precision, resize, train_job
from autoshard.study.costs import StudyResult
from autoshard.study.files import STUDY_DIR, check_output_dir
from autoshard.study.front import ClusterFront, render_fronts, serve_study_fronts
from autoshard.study.report import render_study

__all__ = ["train_job", "solve", "evaluate", "even_stages", "megatron_layout", "expert_grid_hint", "with_launch", "resize",
           "check_precision", "serve_job_for", "interactive_job", "INTERACTIVE_TPOT_MS", "solve_serve", "evaluate_serve",
           "evaluate_vllm", "serve_launch", "with_serve_launch", "study", "serve_study_fronts", "write_study",
           "study_json", "STUDY_DIR", "check_output_dir", "render_study", "render_fronts", "StudyResult", "ClusterFront",
           "evaluate_serve_command", "ServeSolution", "plan_serving", "serve_front", "FRONT_SHARE", "serve_launch_script",
           "write_k8s_manifests", "train_pins", "recompute_modules", "layout_flags", "solver_options",
           "memory_headroom", "overflow_messages", "megatron_script", "megatron_notes", "load", "write_launch_script",
           "check_script_path", "evaluate_megatron", "compare_megatron", "MegatronComparison", "solve_with_layout", "Recompute",
           "MoeDispatcher", "Fp8Recipe", "MAX_CONTEXT", "MAX_GLOBAL_BATCH", "MAX_GPUS", "MAX_LAYERS", "MAX_SEQ_LEN",
           "MAX_TOKENS", "bundled_models", "bundled_clusters", "load_model", "load_cluster", "DEFAULT_ENGINE",
           "ENGINE_NAMES"]


def with_launch(plan: Plan) -> Plan:
    """The plan with its Megatron-LM launch command attached (training plans). A plan that does not fit
    gets none: a command that would run out of memory is not printed as runnable. Nor does a plan priced
    with FP8 attention: Megatron-LM has no flag for it (NeMo and Megatron-Bridge set it), so its command
    would run BF16 attention, not the plan that was priced."""
    if not plan.prediction.fits or plan.config.fp8_attention:
        return dataclasses.replace(plan, launch={k: v for k, v in plan.launch.items() if k != "megatron"})
    return dataclasses.replace(plan, launch={**plan.launch, "megatron": megatron_command(plan)})


def solve(
    model: ModelSpec, cluster: ClusterSpec, job: TrainJob, *, pins: Pins = Pins(), options: SolverOptions = SolverOptions()
) -> list[Plan]:
    """The best training plans (best first), each with its launch command and prediction band
    (runner-ups marked statistically tied with the best or not)."""
    check_precision(cluster, job.precision)
    return mark_ties([with_launch(p) for p in solve_train(model, cluster, job, pins=pins, options=options)])


def load(model_ref: str, cluster_ref: str, gpus: int | None = None) -> tuple[ModelSpec, ClusterSpec]:
    """The model (bundled name, YAML or config.json) and the cluster (bundled name or YAML), resized to
    `gpus` GPUs when given."""
    return load_model(model_ref), resize(load_cluster(cluster_ref), gpus)


def check_script_path(output: Path, inputs: Iterable[Path]) -> None:
    """SpecError naming -o when `output` is something other than a regular file (a device, a FIFO: a script
    is a file, and making one executable would change a device's permissions) or one of `inputs`, the
    command's model and cluster files. `cli.options.check_output` asks before solving, `write_launch_script`
    again when it writes (against every file read)."""
    where = str(output)[:120]
    if output.exists() and not output.is_file():
        raise SpecError(f"{where} exists and is not a regular file: give a file path for the script", source="-o")
    if output.resolve() in {i.resolve() for i in inputs}:
        raise SpecError(f"{where} is an input of this command: writing the script there would overwrite it: "
                        f"give another path", source="-o")


def write_launch_script(text: str, output: Path) -> None:
    """Write a launch script to `output`, executable; SpecError naming -o when it cannot be written or
    `check_script_path` refuses it (against every model or cluster file the command read)."""
    try:
        check_script_path(output, FILES_READ)
        output.parent.mkdir(parents=True, exist_ok=True)  # as --out and --emit k8s -o DIR create theirs
        output.write_text(text)
        output.chmod(0o755)
    except OSError as exc:
        raise SpecError(f"cannot write {str(output)[:120]}: {exc.strerror}: choose another path", source="-o") from None


SIZE_FACTS = frozenset({"hidden_size", "ffn_hidden_size", "num_attention_heads", "num_layers"})
"""Architecture facts (`model_shape_differences`) that make a Megatron-LM command's model another model than
the MODEL named beside it (refused), where the other facts (vocabulary padding, RoPE base, biases) make a
variant of it (warned). The FFN size counts only for a model with a dense layer: an all-MoE model's
scripts leave --ffn-hidden-size out (Qwen3-30B-A3B's: Megatron then assumes 4 x hidden, used by no layer)."""


def evaluate_megatron(command: str, model_ref: str | None, cluster_ref: str, gpus: int | None) -> tuple[Plan, list[str]]:
    """(plan, warnings) for an existing Megatron-LM command or script: its model (checked against
    `model_ref` when given), degrees, layout and knobs, on `gpus` GPUs or the command's world size."""
    expected = load_model(model_ref) if model_ref else None
    parsed = parse_megatron(command, vocab_size=expected.vocab_size if expected else None)
    if expected is None and not parsed.vocab_from_command:
        parsed = _vocab_from_bundled(command, parsed)
    warnings = list(parsed.warnings)
    if expected is not None:
        differences = model_shape_differences(expected, parsed.model) + rope_differences(expected, parsed.model)
        dense = any(k is LayerKind.DENSE for k in expected.layer_kinds)  # an all-MoE model runs no --ffn-hidden-size
        size = [d for d in differences if d.split(":", 1)[0] in SIZE_FACTS - (set() if dense else {"ffn_hidden_size"})]
        if size:  # another model, not a variant of it: the rule for contradictions
            raise SpecError(f"the command trains another model than {expected.name} ({'; '.join(size)}): give the "
                            f"model the command trains as MODEL", source="MODEL/--from-megatron")
        warnings += [f"the command's model differs from {expected.name}: {d}" for d in differences]
    world = gpus or parsed.world_size
    if world is None and parsed.launcher_problem is not None:
        raise SpecError(f"{parsed.launcher_problem}: fix the command's parallel sizes or its process count, or pass "
                        "--gpus with a count that runs them", source="--from-megatron")
    if world is None:  # a mixed cluster's script starts each pool's GPUs by NODE_RANK: no pool per stage in it
        mixed = load_cluster(cluster_ref).is_heterogeneous
        raise SpecError("the command does not say how many GPUs it runs on (no torchrun --nproc-per-node/--nnodes): " + (
            "a heterogeneous cluster's script is not read back; evaluate its degrees as pins" if mixed else "pass --gpus"),
                        source="--from-megatron")
    if gpus is not None and parsed.launcher_world_size not in (None, gpus):
        warnings.append(f"--gpus {gpus} replaces the {parsed.launcher_world_size} processes the command's launcher "
                        f"starts: predicted on {gpus} GPUs (data parallelism from them), not as the command runs")
    parsed = parsed.with_world_size(world)
    cluster_spec = resize(load_cluster(cluster_ref), world)
    cfg = parsed.train_config()
    check_precision(cluster_spec, cfg.precision, source="--from-megatron")
    check_config(parsed.model, cfg, source="--from-megatron", cluster=cluster_spec)
    stages = parsed.layout()
    if cfg.moe_a2a_overlap and (problems := a2a_overlap_problems(parsed.model, cfg, stages)):
        raise SpecError(f"Megatron-Core refuses it here: {'; '.join(problems)}",
                        source="--overlap-moe-expert-parallel-comm")
    prediction = predict_train(parsed.model, cluster_spec, cfg, stages)
    stats = SolverStats(status="EVALUATED", wall_s=0.0, objective=prediction.step_time_s, bound=prediction.step_time_s)
    # the command's shapes are what runs; a given model names it (its differences are warnings above)
    model = parsed.model if expected is None else parsed.model.model_copy(update={"name": expected.name})
    plan = Plan(model=model, cluster=cluster_spec, config=cfg, stages=stages, prediction=prediction, solver=stats)
    return with_launch(dataclasses.replace(plan, band=band_for(plan))), warnings


def _vocab_from_bundled(command: str, parsed: Any) -> Any:
    """A command whose tokenizer files hold the vocabulary (HuggingFace, SentencePiece) and no model given:
    when the bundled models with the command's architecture in every other respect agree on one
    vocabulary, it is the tokenizer's (Llama 3's 128,256, not the 32,000 fallback), said in a warning.
    When they disagree (Llama 2 70B's 32,000 and Llama 3.1 70B's 128,256 share every other shape), the
    fallback stays and the warning names them."""
    matches: dict[str, int] = {}
    for name, path in sorted(bundled_models().items()):
        bundled = load_model(path)
        if all(d.startswith("vocab_size:") for d in model_shape_differences(bundled, parsed.model)):
            matches[name] = bundled.vocab_size
    sizes = set(matches.values())
    if len(sizes) > 1:
        listed = ", ".join(f"{n} ({v:,})" for n, v in matches.items())
        note = (f"the command's architecture matches bundled models of different vocabularies: {listed}; "
                "give the model to use its real size")
        return dataclasses.replace(parsed, warnings=(*parsed.warnings, note))
    if not matches or sizes == {parsed.model.vocab_size}:
        return parsed
    name, vocab = next(iter(matches.items()))
    again = parse_megatron(command, vocab_size=vocab)
    note = (f"the vocabulary size is not in the command (the tokenizer files hold it): "
            f"{vocab:,} from bundled model {name}, whose architecture the command matches; "
            "give the model to be sure")
    kept = [w for w in again.warnings if "vocabulary size is not in the command" not in w]
    return dataclasses.replace(again, warnings=(*kept, note))


@dataclasses.dataclass(frozen=True, slots=True)
class MegatronComparison:
    """An existing Megatron-LM command's plan next to the best plan for its model, cluster and job."""

    yours: Plan
    best: Plan
    comparison: dict[str, Any]
    warnings: list[str]
    headroom: dict[str, Any]


def compare_megatron(command: str, model_ref: str | None, cluster_ref: str, gpus: int | None, *,
                     options: SolverOptions = SolverOptions()) -> MegatronComparison:
    """`solve --from-megatron`: evaluate the command (`evaluate_megatron`), solve the same job on the same
    GPUs, and compare the two (`report.compare.compare_plans`)."""
    yours, warnings = evaluate_megatron(command, model_ref, cluster_ref, gpus)
    job = train_job(yours.model, seq_len=yours.config.seq_len, global_batch_size=yours.config.global_batch_size,
                    precision=yours.config.precision)
    best = solve(yours.model, yours.cluster, job, options=options)
    comparison = compare_plans(yours, best[0])
    return MegatronComparison(yours, best[0], comparison, warnings, memory_headroom(best[0], options.memory_fraction))


def even_stages(model: ModelSpec, *, pp: int, vpp: int = 1, recompute_num_layers: int = 0) -> tuple[Stage, ...]:
    """Megatron-LM's default layout: decoder layers split evenly over pp*vpp chunks, the embedding
    with the first chunk and the output layer with the last. SpecError when they do not divide."""
    chunks = pp * vpp
    if model.num_layers % chunks:
        raise SpecError(
            f"{model.num_layers} decoder layers do not split evenly over PP {pp} x VPP {vpp} = {chunks} chunks "
            "(Megatron's default layout needs num_layers divisible by PP x VPP): pick a PP/VPP that divides "
            "it, or let `autoshard solve` choose an uneven layout",
            source="--pp",
        )
    return default_stages(model, pp=pp, vpp=vpp, recompute_num_layers=recompute_num_layers)


def megatron_layout(
    model: ModelSpec, *, pp: int, vpp: int = 1, flags: LayoutFlags | None = None, recompute_num_layers: int = 0
) -> tuple[tuple[Stage, ...], int, str | None]:
    """(stages, VPP, note) of the layout Megatron-LM builds from these flags. Without flags, when the
    decoder layers do not split evenly over PP x VPP, the layout Megatron-LM would need (see
    `predict_layout`), with a note naming the flags that produce it."""
    if (flags is None or flags.layout is None) and pp * vpp > model.num_layers + 2:
        # as solve's pins: every model chunk holds a decoder layer, the embedding or the loss
        what = f"PP {pp} x VPP {vpp} = {pp * vpp} model chunks exceed" if vpp > 1 else f"PP {pp} exceeds"
        raise SpecError(f"{what} the {model.num_layers} decoder layers: use a smaller degree",
                        source="--pp" if vpp == 1 else "--pp/--vpp")
    note = None
    if flags is None or not flags.given():
        if model.num_layers % (pp * vpp):
            flags = predict_layout(model, pp=pp, vpp=vpp)
            note = (f"{model.num_layers} decoder layers do not split evenly over PP {pp} x VPP {vpp}: Megatron-LM "
                    f"needs a layout flag; predicted with {flags.describe()}")
        else:
            flags = LayoutFlags()
    stages, vpp = layout_stages(model, pp=pp, vpp=vpp, flags=flags, recompute_num_layers=recompute_num_layers)
    return stages, vpp, note


def evaluate(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: TrainJob,
    *,
    tp: int,
    pp: int,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    vpp: int = 1,
    dp: int | None = None,
    micro_batch_size: int = 1,
    recompute: Recompute = Recompute.NONE,
    recompute_num_layers: int = 0,
    sequence_parallel: bool = True,
    zero_stage: int = 1,
    stages: tuple[Stage, ...] | None = None,
    layout: LayoutFlags | None = None,
    recompute_modules: tuple[str, ...] = (),
    tp_comm_overlap: bool | None = None,
    overlap_grad_reduce: bool = True,
    moe_dispatcher: MoeDispatcher | None = None,
    fp8_recipe: Fp8Recipe | None = None,
    fp8_attention: bool = False,
    moe_a2a_overlap: bool = False,
) -> Plan:
    """Predict a plan the user already has: `stages`, else the layout Megatron-LM builds from `layout`
    (its layout flags), else its even split, else (layers that do not divide) the layout it would need.
    `tp_comm_overlap` defaults to on wherever sequence parallelism makes it possible. The MoE dispatcher
    and FP8 recipe default to what the solver would pick (`search.train.space.dispatcher_for`,
    `fp8_recipe_for`). `fp8_attention`: the attention core in FP8 (Transformer Engine's
    fp8_dot_product_attention, as NeMo / Megatron-Bridge set it; TrainConfig.fp8_attention), FP8 or FP4
    precision on a GPU with a kernel measurement (costmodel.attention.FP8_ATTENTION_KERNELS); the plan
    then carries no Megatron-LM launch (with_launch). `moe_a2a_overlap`: Megatron's EP all-to-all overlap
    (--overlap-moe-expert-parallel-comm --delay-wgrad-compute; TrainConfig.moe_a2a_overlap), refused with
    the fix where Megatron would refuse it (costmodel.train.a2a_overlap.a2a_overlap_problems)."""
    check_precision(cluster, job.precision)
    if fp8_attention:
        check_fp8_attention(model, cluster, job.precision)
    if recompute is Recompute.SELECTIVE and recompute_num_layers:
        from autoshard.search.train.space import SELECTIVE_AND_BLOCK

        raise SpecError(SELECTIVE_AND_BLOCK, source="--recompute-num-layers")
    if stages is None:
        stages, vpp, _ = megatron_layout(model, pp=pp, vpp=vpp, flags=layout,
                                         recompute_num_layers=recompute_num_layers)
    gpus = cluster.num_gpus
    if gpus % (tp * cp * pp):
        raise SpecError(f"TP x CP x PP = {tp * cp * pp} does not divide the {gpus} GPUs: change the degrees or --gpus",
                        source="--tp/--cp/--pp")
    world_dp = gpus // (tp * cp * pp)
    if dp is not None and dp != world_dp:
        raise SpecError(f"DP {dp} x TP {tp} x CP {cp} x PP {pp} = {dp * tp * cp * pp} but the cluster has {gpus} GPUs: "
                        f"use --dp {world_dp} or --gpus {dp * tp * cp * pp}", source="--dp")
    try:
        dims = ParallelDims(tp=tp, pp=pp, dp=world_dp, cp=cp, ep=ep, etp=etp, vpp=vpp)
    except ValueError as exc:
        hint = expert_grid_hint(model, tp=tp, cp=cp, dp=world_dp, ep=ep, etp=etp) if "expert grid" in str(exc) else ""
        raise SpecError(f"{exc}{hint}", source="parallel degrees") from None
    problems = check_dims(dims, model, seq_len=job.seq_len, precision=job.precision)
    if problems:
        raise SpecError("; ".join(problems), source="parallel degrees")
    if zero_stage >= 2 and pp > 1:
        raise SpecError("ZeRO-2/3 (Megatron-FSDP) needs PP 1 (it shards over DP, with or without EP)",
                        source="--zero-stage")
    check_moe_fp8_knobs(model, cluster, job, moe_dispatcher, fp8_recipe)
    try:
        cfg = TrainConfig(
            dims=dims, micro_batch_size=micro_batch_size, global_batch_size=job.global_batch_size, seq_len=job.seq_len,
            precision=job.precision, recompute=recompute, sequence_parallel=sequence_parallel, zero_stage=zero_stage,
            optimizer=job.optimizer,
            tp_comm_overlap=(sequence_parallel and tp > 1) if tp_comm_overlap is None else tp_comm_overlap,
            overlap_grad_reduce=overlap_grad_reduce,
            recompute_modules=recompute_modules if recompute is Recompute.SELECTIVE else (),
            moe_dispatcher=moe_dispatcher or dispatcher_for(model, cluster, dims, job.seq_len,
                                                            a2a_overlap=moe_a2a_overlap),
            fp8_recipe=fp8_recipe_for(model, cluster, fp8_recipe), fp8_attention=fp8_attention,
            moe_a2a_overlap=moe_a2a_overlap,
        )
    except ValueError as exc:
        raise SpecError(f"{exc}: change --mbs or --global-batch-size", source="--mbs/--global-batch-size") from None
    if moe_a2a_overlap and (problems := a2a_overlap_problems(model, cfg, stages)):
        raise SpecError("; ".join(problems), source="--moe-a2a-overlap")
    check_config(model, cfg, source="plan")
    prediction = predict_train(model, cluster, cfg, stages)
    stats = SolverStats(status="EVALUATED", wall_s=0.0, objective=prediction.step_time_s, bound=prediction.step_time_s)
    plan = Plan(model=model, cluster=cluster, config=cfg, stages=stages, prediction=prediction, solver=stats)
    return with_launch(dataclasses.replace(plan, band=band_for(plan)))


def solve_with_layout(
    model: ModelSpec, cluster: ClusterSpec, job: TrainJob, flags: LayoutFlags, *, pins: Pins = Pins(),
    options: SolverOptions = SolverOptions(),
) -> list[Plan]:
    """The best plans whose pipeline layout is the one Megatron-LM builds from `flags` (a layout string,
    first/last-stage layer counts or the account-for flags). The layout fixes PP (pinned) and VPP, so
    each candidate is predicted exactly on that layout, cheapest lower bound
    (`search.train.bounds.quick_lower_bound`) first, until no remaining bound can beat the top_k-th plan
    found: status OPTIMAL, or FEASIBLE with that bound when the time limit stops it first."""
    from autoshard.search.train.layout import solve_on_layout

    plans = solve_on_layout(model, cluster, job, functools.partial(megatron_layout, model, flags=flags), pins=pins,
                            options=options)
    plans = [with_launch(p) for p in plans]
    return mark_ties(plans)
