"""The serving half of the public API (re-exported by `autoshard.api`): serving jobs from a model's `serving:`
defaults, solve and evaluate with the launch commands attached, the interactive-SLA default of `solve --mode
serve` (`plan_serving`), and the launch script or Kubernetes manifests of a plan (the Pareto front,
`serve_front`, is the search layer's: `autoshard.search.serve.front`). The solver (`autoshard.search.serve`)
returns plans; the launch commands are written here, by the emitters (`autoshard.emit`), so the search layer
never builds one."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from autoshard.api_engines import (
    ENGINE_SAME_REL, aggregated_on, engine_figures, launched_by, pct, sglang_priced_plan, split_figures, split_on,
    vllm_budget_row,
)
from autoshard.costmodel.serve.engines import (
    DEFAULT_ENGINE, ENGINE_NAMES, SGLANG_UNPRICED,
)
from autoshard.emit.k8s import k8s_manifests, k8s_yaml
from autoshard.emit.pd import pd_launch, pd_script
from autoshard.emit.serve_script import serve_script
from autoshard.emit.sglang import (parse_sglang, sglang_fp8_problem, sglang_memory_utilization, sglang_node_commands,
                                   sglang_nodes)
from autoshard.emit.vllm import (backend_role, carry_overrides, check_checkpoint, parse_vllm,
                                 serve_weight_dtype, start_context, vllm_node_commands, window_switches)
from autoshard.errors import InfeasibleError, SolverError, SpecError
from autoshard.plans.serve import ServePlan
from autoshard.search.deadline import Deadline
from autoshard.search.serve import solve as _search
from autoshard.search.serve.result import reconcile_interactive
from autoshard.search.serve.solve import model_for_path
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.job import ServeJob, WeightDtype
from autoshard.specs.loader import load_cluster, load_model, validate
from autoshard.specs.model import Checkpoint, ModelSpec
from autoshard.specs.prepare import resize
from autoshard.study.files import check_output_dir

__all__ = ["serve_job_for", "INTERACTIVE_TPOT_MS", "interactive_job", "serve_launch", "with_serve_launch",
           "solve_serve", "evaluate_serve", "evaluate_vllm", "evaluate_serve_command", "model_for_path", "ServeSolution",
           "plan_serving", "repo_weights", "serve_launch_script", "write_k8s_manifests", "with_engine_check",
           "launched_by"]

INTERACTIVE_TPOT_MS = 50.0
"""The SLA serve mode plans for when the user gives none: 50 ms per output token (20 tokens/s per
user, faster than people read), the interactive tier serving benchmarks report beside max throughput."""
ALTERNATIVE_SHARE = 0.4
"""Share of the time left that the throughput-optimal solve (the alternative, solved first) may take when the
interactive default is planned too; the interactive plan, the answer, gets the rest. Its aggregated rows take
about 30-45 % of the interactive solve's (no target: one ladder row per engine instead of a bisection)."""


def serve_job_for(model: ModelSpec | None, input_len: int | None = None, output_len: int | None = None,
                  max_model_len: int | None = None, tpot_ms: float | None = None, ttft_s: float | None = None,
                  request_rate: float | None = None, weight_dtype: str | None = None,
                  kv_cache_dtype: str | None = None) -> ServeJob:
    """A ServeJob from the model's `serving:` section, overridden by the given values."""
    data: dict = {}
    defaults = model.serving if model is not None else None
    if defaults is not None:
        for key in ("input_len", "output_len", "max_model_len"):
            value = getattr(defaults, key)
            if value is not None:
                data[key] = value
        if defaults.precision is not None:
            data["weight_dtype"] = defaults.precision
    if model is not None and (weight_dtype is None or weight_dtype in {d.value for d in WeightDtype}):
        # a quantized-only repository (DeepSeek-V3's FP8) decides the default and refuses what it cannot load
        weight_dtype = serve_weight_dtype(model, weight_dtype or data.get("weight_dtype"))
    given = {
        "input_len": input_len, "output_len": output_len, "max_model_len": max_model_len,
        "tpot_target_s": None if tpot_ms is None else tpot_ms / 1000.0, "ttft_target_s": ttft_s,
        "request_rate": request_rate, "weight_dtype": weight_dtype, "kv_cache_dtype": kv_cache_dtype,
    }
    data.update({k: v for k, v in given.items() if v is not None})
    name = model.name if model is not None else "the command's model"
    job = validate(ServeJob, data, source=f"serving job for {name}")
    wd = job.weight_dtype
    if model is not None:  # refused before solving, not when the command is written
        check_checkpoint(model, wd)
    return job


def interactive_job(job: ServeJob) -> ServeJob | None:
    """The job with the interactive TPOT target when it has no target and no request rate; else None."""
    if job.tpot_target_s is not None or job.ttft_target_s is not None or job.request_rate is not None:
        return None
    return job.model_copy(update={"tpot_target_s": INTERACTIVE_TPOT_MS / 1000.0})


def serve_launch(plan: ServePlan) -> dict[str, str]:
    """The launch commands of a serving plan: a prefill/decode deployment's per-role lines and router
    (`emit.pd`), else vLLM's and SGLang's head-node line, with every node's line when it spans nodes."""
    if plan.disaggregated:
        return pd_launch(plan)
    launch: dict[str, str] = {}
    engines = [("vllm", vllm_node_commands)]
    if sglang_fp8_problem([plan.pool.gpu], plan.model, plan.job.weight_dtype) is None:  # no line SGLang refuses
        engines.append(("sglang", sglang_node_commands))
    for name, build in engines:
        lines = build(plan)
        launch[name] = lines[0]  # the head node's line
        if len(lines) > 1:
            launch[f"{name}_nodes"] = "\n".join(lines)  # every node's line, head first
    return launch


def with_serve_launch(plan: ServePlan) -> ServePlan:
    """The plan with its launch commands attached, and a note when the name they launch is neither a
    Hugging Face repo id nor a local directory (a model file that names no checkpoint: GPT-3 175B, a
    renamed config file): vLLM and SGLang would look it up on the Hub and fail."""
    plan = plan.with_launch(serve_launch(plan))
    name = plan.model_path
    if "/" not in name and not Path(name).is_dir():
        note = (f"the launch lines name the model {name!r}, which is neither a Hugging Face repo id nor a local "
                "directory (the model file names no checkpoint): replace it with the checkpoint's repo id or "
                "directory before launching")
        plan = dataclasses.replace(plan, warnings=(*plan.warnings, note))
    return plan


def solve_serve(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, **kwargs) -> list[ServePlan]:
    """`search.serve.solve.solve_serve` (same arguments), each plan with its launch commands."""
    return [with_serve_launch(p) for p in _search.solve_serve(model, cluster, job, **kwargs)]


def evaluate_serve(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, **kwargs) -> ServePlan:
    """`search.serve.solve.evaluate_serve` (same arguments), with the plan's launch commands."""
    return with_serve_launch(_search.evaluate_serve(model, cluster, job, **kwargs))


def evaluate_vllm(model: ModelSpec | None, cluster: ClusterSpec, command: str, *, job: ServeJob,
                  concurrency: int | None = None, shape_given: bool = True, sglang: bool = False) -> ServePlan:
    """`evaluate --from-vllm` (`--from-sglang` with sglang=True): the plan read from the launch line, predicted.
    Its max model length, quantization, KV-cache dtype and window switches (`window_switches`) override the job's;
    a request shape not given (`shape_given` False) past its max model length is scaled to fit, with a warning.
    No model given: the command's model path must name a bundled model's Hugging Face repository."""
    parsed = parse_sglang(command) if sglang else parse_vllm(command)
    model, parsed = window_switches(parsed, model or model_for_path(parsed.model, "--from-sglang" if sglang else
                                                                    "--from-vllm"))
    job, note = parsed.fit_request_shape(job, shape_given=shape_given)
    if note:
        parsed = dataclasses.replace(parsed, warnings=(*parsed.warnings, note))
    role, note = (sglang_nodes(parsed, cluster.primary) if sglang  # its --nnodes against the pool's nodes
                  else backend_role(parsed, model, cluster.primary))
    parsed = dataclasses.replace(parsed, warnings=(*parsed.warnings, note)) if note else parsed
    applied = parsed.apply_to(job)
    model, applied, parsed = start_context(model, applied, parsed, engine="sglang" if sglang else "vllm")
    quantization, named = parsed.quantization, None
    if quantization is None:
        # no --quantization: vLLM and SGLang read the repository's quantization_config, so the weights
        # are what that repository holds (listed under checkpoints:, else what its name says)
        listed = next((c for c in model.checkpoints if c.repo == parsed.model), None)
        named = None if listed is not None else repo_weights(parsed.model)
        if listed is not None or named is not None:
            wd, quantization = (listed.weights, listed.quantization) if listed is not None else named
            applied = ServeJob.model_validate({**applied.model_dump(), "weight_dtype": wd})
        if named is not None:
            note = (f"{parsed.model}: the command gives no --quantization and its name says {named[0].value} "
                    f"weights: priced as {named[0].value}"
                    + (f" ({named[1]})" if named[1] != named[0].value else "")
                    + "; pass --quantization, or the repository's config.json as MODEL, to state it (the "
                    "launch lines leave the method to its quantization_config, as the command does)")
            parsed = dataclasses.replace(parsed, warnings=(*parsed.warnings, note))
    if quantization is not None and applied.weight_dtype is not WeightDtype.BF16:
        # the command loads its own quantized checkpoint: relaunch exactly that one
        wd = applied.weight_dtype
        same = next((c for c in model.checkpoints if c.repo == parsed.model and c.weights is wd), None)
        block = same is not None and same.block_scaled
        if same is None and wd is WeightDtype.FP8:
            block, note = unlisted_fp8_checkpoint(model, parsed.model, quantization)
            parsed = dataclasses.replace(parsed, warnings=(*parsed.warnings, note))
        # a method guessed from the name is not written back: vLLM refuses a --quantization that differs
        # from the repository's quant_method (RedHatAI's -FP8-dynamic is compressed-tensors, not fp8)
        own = Checkpoint.model_construct(weights=wd, repo=parsed.model,
                                         quantization=None if named is not None else quantization,
                                         block_scaled=block)
        model = model.model_copy(update={"checkpoints": (own, *model.checkpoints)})
    try:
        def priced(util: float) -> ServePlan:
            return evaluate_serve(
                model, cluster, applied, tp=parsed.tp, pp=parsed.pp, dp=parsed.dp,
                expert_parallel=parsed.enable_expert_parallel, attention_dp=parsed.attention_dp,
                gpu_memory_utilization=util, max_num_seqs=parsed.max_num_seqs,
                max_num_batched_tokens=parsed.max_num_batched_tokens, warnings=parsed.warnings, concurrency=concurrency,
                nccl_nvls=parsed.nccl_nvls, deep_gemm=parsed.deep_gemm if sglang else None,  # vLLM: its own oracle
                framework="sglang" if sglang else "vllm", max_len_flag="--context-length" if sglang else "--max-model-len",
                role=role, all2all_backend=parsed.all2all_backend, allow_long_context=parsed.allow_long_context,
                hybrid_kv_cache=getattr(parsed, "hybrid_kv_cache", None))  # `ParsedVllm`
        if not (sglang and parsed.static_fraction):
            plan = with_engine_check(priced(parsed.gpu_memory_utilization))
        else:  # --mem-fraction-static: weights + KV pool of SGLang's baseline (emit.sglang.mem_fraction_static)
            plan = with_engine_check(priced(min(0.98, sglang_memory_utilization(parsed.static_fraction, (
                first := priced(0.98)).prediction.memory, first.pool, first.prediction.config))))
        return dataclasses.replace(plan, launch=carry_overrides(plan.launch, parsed.hf_overrides))  # the line's
    except InfeasibleError as exc:  # how the command was read explains what was priced (the plan's notes, lost)
        if not parsed.warnings:
            raise
        raise InfeasibleError(f"{exc}\nas read from the command: " + "; ".join(parsed.warnings)) from None


# Name words of quantized Hugging Face releases -> (weights, vLLM method its quantization_config selects):
# Qwen's -FP8 / -AWQ / -GPTQ-Int4|Int8, RedHatAI's -FP8-dynamic / -W4A16 / -W8A8, NVIDIA's -FP8 / -NVFP4 /
# -FP4, gpt-oss's MXFP4.
_NAME_WEIGHTS: tuple[tuple[frozenset[str], WeightDtype, str], ...] = (
    (frozenset({"nvfp4", "fp4"}), WeightDtype.NVFP4, "modelopt_fp4"),
    (frozenset({"mxfp4"}), WeightDtype.MXFP4, "mxfp4"),
    (frozenset({"fp8"}), WeightDtype.FP8, "fp8"),
    (frozenset({"awq"}), WeightDtype.INT4, "awq_marlin"),
    (frozenset({"w4a16", "int4"}), WeightDtype.INT4, "compressed-tensors"),
    (frozenset({"w8a8", "w8a16", "int8"}), WeightDtype.INT8, "compressed-tensors"),
)


def repo_weights(repo: str) -> tuple[WeightDtype, str] | None:
    """(weights, vLLM method) a quantized release's repository name states (``Qwen/Qwen3-Coder-480B-A35B-
    Instruct-FP8``: FP8; ``...-GPTQ-Int4``: int4 by gptq_marlin), or None for a name that states none."""
    words = set(re.split(r"[-_./]", repo.rsplit("/", 1)[-1].lower()))
    if "gptq" in words:
        return (WeightDtype.INT8, "gptq_marlin") if "int8" in words else (WeightDtype.INT4, "gptq_marlin")
    return next(((wd, method) for names, wd, method in _NAME_WEIGHTS if words & names), None)


def unlisted_fp8_checkpoint(model: ModelSpec, repo: str, quantization: str) -> tuple[bool, str]:
    """(block-scaled?, the note saying why) for an FP8 checkpoint `repo` that the model's `checkpoints:`
    do not list: block-scaled when every FP8 checkpoint listed for this architecture is (DeepSeek's and
    Qwen's own FP8 releases all are) and the command loads it with vLLM's `fp8` method (which reads
    the checkpoint's weight_block_size) or names `fp8_per_block`; else per-tensor."""
    listed = [c for c in model.checkpoints if c.weights is WeightDtype.FP8]
    q = quantization.lower()
    block = q == "fp8_per_block" or (bool(listed) and all(c.block_scaled for c in listed) and q == "fp8")
    how = ("block-scaled (--quantization fp8_per_block)" if q == "fp8_per_block" else
           f"block-scaled (128 x 128) like the listed {listed[0].repo}" if block
           else "per-tensor FP8" + (f" (the listed {listed[0].repo} is not block-scaled)" if listed and not
                                    listed[0].block_scaled else ""))
    return block, (f"{repo} is not under {model.name}'s checkpoints: priced as {how}; pass its config.json "
                   "as MODEL to read its quantization_config instead")


def evaluate_serve_command(command: str, model_ref: str | None, cluster_ref: str, gpus: int | None, *,
                           input_len: int | None = None, output_len: int | None = None,
                           concurrency: int | None = None, sglang: bool = False) -> ServePlan:
    """`evaluate --from-vllm/--from-sglang`: the specs loaded by reference (the model from the command's
    model path when `model_ref` is None), the request shape from the model's `serving:` defaults unless
    given, then `evaluate_vllm`. Without `gpus` a homogeneous cluster is sized to the command's GPUs in
    whole nodes (as --from-megatron runs on its world size), not left at the bundled file's size."""
    model_spec = load_model(model_ref) if model_ref else None
    cluster_spec = load_cluster(cluster_ref)
    parsed = parse_sglang(command) if sglang else parse_vllm(command)
    need = parsed.tp * parsed.pp * parsed.dp
    if gpus is not None and gpus < need:
        raise SpecError(f"the command runs TP {parsed.tp} x PP {parsed.pp} x DP {parsed.dp} = {need} GPUs; --gpus {gpus} "
                        f"is fewer: drop --gpus or give at least {need}", source="--gpus")
    if gpus is None and not cluster_spec.is_heterogeneous:
        per_node = cluster_spec.primary.node.gpus_per_node
        gpus = min(cluster_spec.num_gpus, -(-need // per_node) * per_node)
    cluster_spec = resize(cluster_spec, gpus)
    return evaluate_vllm(model_spec, cluster_spec, command, job=serve_job_for(model_spec, input_len, output_len),
                         concurrency=concurrency, shape_given=input_len is not None or output_len is not None,
                         sglang=sglang)


@dataclass(frozen=True, slots=True)
class ServeSolution:
    """What `solve --mode serve` shows: the plans (best first); with no SLA given, the throughput-optimal
    plan beside the interactive one (`alternative`) and the note saying which SLA was planned for."""

    plans: list[ServePlan]
    alternative: ServePlan | None
    sla_note: str
    interactive: bool
    """True when the job had no target and no rate, so the interactive default was tried."""


def plan_serving(model: ModelSpec, cluster: ClusterSpec, job: ServeJob, *, top_k: int, pins: dict[str, int | None] | None,
                 time_limit_s: float, num_workers: int, seed: int, disaggregate: str = "auto",
                 started_at: float | None = None, framework: str = DEFAULT_ENGINE) -> ServeSolution:
    """The best `top_k` serving plans, priced for `framework` (vllm or sglang: the kernels its launch line
    runs, `costmodel.serve.engines`), each with the same deployment priced for the other engine
    (`with_engine_check`). A job with no TPOT/TTFT target and no request rate is planned at
    the interactive TPOT (`INTERACTIVE_TPOT_MS`), with the throughput-optimal plan as the alternative;
    when no plan reaches it, the throughput-optimal plan is the answer, with a note saying so. Both solves share
    `time_limit_s` (counted from `started_at`, a `time.monotonic()` value, else from this call): the
    throughput-optimal one runs first in `ALTERNATIVE_SHARE` of it; when the limit cuts one short, the other is
    the answer with a note (SolverError only when neither found a plan)."""
    gpus = [p.gpu for p in cluster.pools]
    if framework == "sglang" and (problem := sglang_fp8_problem(gpus, model, job.weight_dtype)):
        raise SpecError(problem, source="--target/--emit sglang")
    deadline = Deadline(time_limit_s, start=started_at)  # both solves share it: `--time-limit` bounds the command
    run = dict(pins={k: v for k, v in (pins or {}).items() if v is not None}, time_limit_s=time_limit_s,
               num_workers=num_workers, seed=seed, disaggregate=disaggregate, framework=framework)
    interactive = interactive_job(job)
    alternative, sla_note, late = None, "", None
    if interactive is None:
        plans = solve_serve(model, cluster, job, top_k=top_k, deadline=deadline, **run)
    else:
        try:  # the answer is the interactive plan: the alternative gets a share of the limit
            alternative = solve_serve(model, cluster, job, top_k=1, deadline=deadline.part(ALTERNATIVE_SHARE),
                                      **run)[0]
        except SolverError as exc:
            late = exc  # out of time for it: the interactive plan may still be found in the rest
        try:
            plans = solve_serve(model, cluster, interactive, top_k=top_k, deadline=deadline, **run)
            sla_note = (f"SLA: TPOT <= {INTERACTIVE_TPOT_MS:g} ms (the interactive default; set --tpot-ms, --ttft-s "
                        "or --request-rate to plan for your own)"
                        + ("" if alternative is not None else "; the time limit ran out before the throughput-optimal "
                           "plan was found"))
        except (InfeasibleError, SolverError) as exc:
            if late is not None:  # no plan at all within the limit
                raise late from None
            plans, alternative = [alternative], None
            why = ("the time limit ran out before a plan at" if isinstance(exc, SolverError)
                   else "no plan reaches")
            sla_note = (f"{why} the interactive default TPOT <= {INTERACTIVE_TPOT_MS:g} ms ({exc}); "
                        "showing the throughput-optimal plan")
    if interactive is not None and alternative is not None and plans:
        plans, alternative, sla_note = reconcile_interactive(plans, alternative, interactive, sla_note)
    plans = [with_engine_check(p) for p in plans]
    alternative = None if alternative is None else with_engine_check(alternative)
    return ServeSolution(plans, alternative, sla_note, interactive is not None)


def with_engine_check(plan: ServePlan) -> ServePlan:
    """The plan with `engine_other`: the same deployment (degrees, batch caps, running requests) priced
    for the other engine as its own launch line runs it, with one sentence saying whether and how much
    the figures differ. The plan's own figures stay those of the engine it is priced for. A vLLM line
    on DeepEP's low-latency kernels sizes its buffer at --max-num-batched-tokens, a vLLM plan's choice
    (`search.serve.budget`): an SGLang plan's vLLM figure and vLLM lines run the budget the vLLM
    planner would choose for the same deployment (`engine_other["max_num_batched_tokens"]`)."""
    engine = plan.prediction.config.engine
    other = "sglang" if engine == "vllm" else "vllm"
    name, other_name = ENGINE_NAMES[engine], ENGINE_NAMES[other]
    if other == "sglang" and (problem := sglang_fp8_problem([plan.pool.gpu], plan.model, plan.job.weight_dtype)):
        return dataclasses.replace(plan, engine_other={"engine": other, "differs": True,
                                                       "note": f"under {other_name} this deployment would not start: "
                                                               f"{problem.split('; use')[0]}"})
    if other == "sglang" and not sglang_priced_plan(plan):
        return dataclasses.replace(plan, engine_other={
            "engine": other, "differs": True, "priced": False,
            "note": f"{SGLANG_UNPRICED} for this deployment; --target sglang plans only what it prices"})
    budget = vllm_budget_row(plan) if other == "vllm" else None
    try:
        if plan.disaggregated:
            figures = split_on(plan, other)
        elif budget is not None:
            figures = engine_figures(budget.throughput, budget.prediction)
        else:
            figures = aggregated_on(plan, other)
    except (InfeasibleError, SpecError) as exc:  # SpecError: an engine it refuses (vLLM fuses an MoE's DP ranks)
        return dataclasses.replace(plan, engine_other={
            "engine": other, "differs": True,
            "note": f"under {other_name} this deployment would not start: {exc}"})
    ours = split_figures(plan) if plan.disaggregated else engine_figures(plan.throughput_tokens_per_s, plan.prediction)
    differs = any(abs(figures[k] / ours[k] - 1) > ENGINE_SAME_REL for k in ours if ours[k])
    at = "" if budget is None else f" at --max-num-batched-tokens {budget.config.max_num_batched_tokens:,}"
    if not differs:
        note = f"{other_name}'s launch line runs the same kernels here: the same figures"
    elif plan.disaggregated:
        note = (f"under {other_name} (its own launch lines) a prefill instance sustains "
                f"{figures['prefill_requests_per_s']:,.2f} requests/s ({pct(figures, ours, 'prefill_requests_per_s')} "
                f"vs {name}) and decode TPOT is {1e3 * figures['decode_tpot_s']:.1f} ms "
                f"({pct(figures, ours, 'decode_tpot_s')}); --target {other} plans for {other_name}")
    else:
        note = (f"under {other_name} (its own launch line{at}) this deployment predicts {figures['tokens_per_s']:,.0f} "
                f"output tokens/s ({pct(figures, ours, 'tokens_per_s')} vs {name}), TPOT "
                f"{1e3 * figures['tpot_s']:.1f} ms, TTFT {figures['ttft_s']:.2f} s; --target {other} plans for "
                f"{other_name}")
    checked = dataclasses.replace(plan, engine_other={"engine": other, **figures, "differs": differs, "note": note})
    if budget is None:
        return checked
    checked.engine_other["max_num_batched_tokens"] = budget.config.max_num_batched_tokens
    launch = dict(plan.launch)
    if launch:  # the vLLM lines run what the vLLM figure prices
        lines = vllm_node_commands(launched_by(checked, "vllm"))
        launch.update({"vllm": lines[0], **({"vllm_nodes": "\n".join(lines)} if len(lines) > 1 else {})})
    return dataclasses.replace(checked, launch=launch)


def serve_launch_script(plan: ServePlan, engine: str) -> str:
    """The launch script of a serving plan for `engine` (vllm or sglang): a prefill/decode deployment's
    roles and router (`emit.pd`), else the replicas (`emit.serve_script`), as `engine` runs the plan
    (`launched_by`)."""
    return pd_script(plan, engine) if plan.disaggregated else serve_script(launched_by(plan, engine), engine)


def write_k8s_manifests(plan: ServePlan, output: Path, framework: str | None = None) -> int:
    """Write one Kubernetes manifest per instance of the plan into the directory `output` (created);
    the number of files. `framework` defaults to the engine the plan is priced for (its figures are that
    engine's: `costmodel.serve.engines`)."""
    check_output_dir(output, "-o", "the directory --emit k8s writes manifests to")  # as the command checks it
    output.mkdir(parents=True, exist_ok=True)
    if framework is None:
        framework = plan.prediction.config.engine
    files = k8s_manifests(launched_by(plan, framework), framework)
    for name, objects in files.items():
        (output / name).write_text(k8s_yaml(objects))
    return len(files)
