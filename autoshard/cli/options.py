"""Option types, choices and checks the `autoshard` commands share, and their JSON/script output."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from autoshard import api
from autoshard.api import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, Fp8Recipe, MoeDispatcher, write_launch_script
from autoshard.cli.app import JSON_PRINTED, NOTES, err, write_stdout
from autoshard.errors import SpecError

_ENTRY: dict[str, float] = {}


STARTUP_SLACK_S = 10.0
"""How far the wall time before the entry point may exceed the process's CPU time and still count as
its start-up (waits for a loaded machine's cores and disk); see start_age."""


def start_age(proc_age: float | None, cpu_s: float) -> float:
    """Seconds before the entry point that `--time-limit` counts, from the age /proc gives the process
    (None where it cannot be read) and the CPU time it has used (`time.process_time()`).

    /proc's start is the fork, not the exec: a shell that execs its last command (`bash -c "pip install
    . && autoshard solve ..."`, a subshell's last command) hands autoshard a process forked before the
    earlier commands ran, and counting their minutes left a 30 s limit spent before the solve began. The
    interpreter start-up and the imports run on the CPU, so an age more than STARTUP_SLACK_S beyond the
    CPU time is such a fork, and the CPU time stands for the start-up instead; so it does where /proc
    cannot be read or gives an impossible age."""
    if proc_age is None or not 0.0 <= proc_age < 600.0 or proc_age > cpu_s + STARTUP_SLACK_S:
        return cpu_s
    return proc_age


def mark_process_start() -> None:
    """Called by the console entry point (`autoshard`, `python -m autoshard.cli`) before the command
    runs: `--time-limit` then also counts the interpreter start-up and the imports (ortools, numpy,
    pydantic: about a second). Linux reads the process start from /proc (its start tick against the
    uptime), bounded by `start_age`; elsewhere the process's CPU time stands for the start-up."""
    now, cpu = time.monotonic(), time.process_time()
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age: float | None = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # stat field 22: starttime
    except (OSError, ValueError, IndexError):
        age = None
    _ENTRY["started"] = now - start_age(age, cpu)


def command_started() -> float:
    """time.monotonic() at which the command's `--time-limit` starts: the process start under the
    console entry point, else (the Typer app called in-process, as tests do) now."""
    return _ENTRY.get("started", time.monotonic())


class Mode(StrEnum):
    TRAIN = "train"
    SERVE = "serve"


class Target(StrEnum):
    MEGATRON = "megatron"
    VLLM = "vllm"
    SGLANG = "sglang"
    K8S = "k8s"


LAUNCHERS = (Target.MEGATRON, Target.VLLM, Target.SGLANG)
"""--target's choices: the launchers a plan is priced and written for. --emit takes these and k8s."""


def parse_target(text: str) -> Target:
    """--target's value. k8s is an output format (manifests that run vLLM or SGLang), not a launcher: it
    is offered by --emit only, and `--target k8s` says so (exit 2, as every bad choice)."""
    if text == Target.K8S.value:
        raise typer.BadParameter("k8s is an --emit format (Kubernetes manifests), not a launcher: use --emit k8s "
                                 "-o DIR (with --target vllm or sglang for the engine they run)")
    if text not in {t.value for t in LAUNCHERS}:
        raise typer.BadParameter(f"{text!r} is not one of {', '.join(repr(t.value) for t in LAUNCHERS)}")
    return Target(text)


TargetOpt = Annotated[Target | None, typer.Option(
    "--target", parser=parse_target, metavar="<" + "|".join(t.value for t in LAUNCHERS) + ">",
    help="Launcher to plan for (train: megatron; serve: vllm or sglang); Kubernetes manifests: --emit k8s.")]


class Disaggregate(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class RecomputeOpt(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


# ----------------------------------------------------------------------------- shared option types

def float_option(*names: str, lo: float, hi: float, help: str, **kwargs: Any) -> Any:
    """A float option in [lo, hi]. typer's own min/max compare, and every comparison with NaN is false, so
    `--time-limit nan` was refused as "should be less than or equal to 86400"; this parser names a NaN or
    an infinity as such, and a number out of range with the range."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"'{text}' is not a number: give one from {lo:g} to {hi:g}") from None
        if not math.isfinite(value):
            raise typer.BadParameter(f"{text} is not a finite number: give one from {lo:g} to {hi:g}")
        if not lo <= value <= hi:
            raise typer.BadParameter(f"{text} is out of range: give a number from {lo:g} to {hi:g}")
        return value

    return typer.Option(*names, parser=parse, metavar="<float>", help=f"{help} [{lo:g}<=x<={hi:g}]", **kwargs)


GpusOpt = Annotated[int | None, typer.Option("--gpus", min=1, max=MAX_GPUS, help="Use this many GPUs (resizes a homogeneous cluster).")]
SeqOpt = Annotated[int | None, typer.Option("--seq-len", min=1, max=MAX_SEQ_LEN, help="Training sequence length (default: the model's training: section, else 4096).")]
GbsOpt = Annotated[int | None, typer.Option("--global-batch-size", min=1, max=MAX_GLOBAL_BATCH, help="Sequences per optimizer step.")]
PrecisionOpt = Annotated[str | None, typer.Option("--precision", help="bf16, fp8 or fp4 (NVFP4 GEMMs, Blackwell).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (schema autoshard.plan/v1) on stdout.")]
StudyJsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (schema autoshard.study/v1) on stdout.")]
ListJsonOpt = Annotated[bool, typer.Option("--json", help="Print the list as one JSON object on stdout.")]
TpOpt = Annotated[int | None, typer.Option("--tp", min=1, max=MAX_GPUS, help="Tensor parallel size.")]
PpOpt = Annotated[int | None, typer.Option("--pp", min=1, max=MAX_GPUS, help="Pipeline parallel size.")]
DpOpt = Annotated[int | None, typer.Option("--dp", min=1, max=MAX_GPUS, help="Data parallel size.")]
CpOpt = Annotated[int | None, typer.Option("--cp", min=1, max=MAX_GPUS, help="Context parallel size.")]
EpOpt = Annotated[int | None, typer.Option("--ep", min=1, max=MAX_GPUS, help="Expert parallel size.")]
EtpOpt = Annotated[int | None, typer.Option("--etp", min=1, max=MAX_GPUS, help="Expert tensor parallel size (default: TP).")]
VppOpt = Annotated[int | None, typer.Option("--vpp", min=1, max=MAX_LAYERS, help="Virtual pipeline stages per rank (interleaving).")]
MbsOpt = Annotated[int | None, typer.Option("--mbs", min=1, max=MAX_GLOBAL_BATCH, help="Micro-batch size.")]
RecomputeOptT = Annotated[RecomputeOpt | None, typer.Option("--recompute", help="Activation recomputation.")]
RecomputeLayersOpt = Annotated[int | None, typer.Option("--recompute-num-layers", min=0, max=MAX_LAYERS, help="Decoder layers per stage fully recomputed on top of --recompute.")]
SpOpt = Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Sequence parallelism (with TP > 1).")]
ZeroOpt = Annotated[int | None, typer.Option("--zero-stage", min=0, max=3, help="0: none, 1: distributed optimizer, 2/3: Megatron FSDP.")]
RecomputeModulesOpt = Annotated[str | None, typer.Option("--recompute-modules", help="Selective recompute of these Megatron modules (comma-separated): core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts. Implies --recompute selective.")]
LayoutOpt = Annotated[str | None, typer.Option("--layout", help="Megatron's --pipeline-model-parallel-layout string, e.g. 'Et*10|t*10|t*10|t*10L' (sets VPP).")]
FirstLayersOpt = Annotated[int | None, typer.Option("--decoder-first-pipeline-num-layers", min=1, help="Decoder layers on the first pipeline rank (Megatron's flag).")]
LastLayersOpt = Annotated[int | None, typer.Option("--decoder-last-pipeline-num-layers", min=1, help="Decoder layers on the last pipeline rank (Megatron's flag).")]
AcctEmbOpt = Annotated[bool, typer.Option("--account-for-embedding-in-pipeline-split", help="Count the embedding as a layer when splitting (Megatron's flag).")]
AcctLossOpt = Annotated[bool, typer.Option("--account-for-loss-in-pipeline-split", help="Count the loss as a layer when splitting (Megatron's flag).")]
TpOverlapOpt = Annotated[bool | None, typer.Option("--tp-comm-overlap/--no-tp-comm-overlap", help="Evaluate: TP communication overlap (default: on with sequence parallelism).")]
DpOverlapOpt = Annotated[bool | None, typer.Option("--overlap-grad-reduce/--no-overlap-grad-reduce", help="Evaluate: overlap DP gradient reduce / param gather with compute (default: on).")]
DistOptOpt = Annotated[bool | None, typer.Option("--distributed-optimizer/--no-distributed-optimizer", help="Evaluate: Megatron's distributed optimizer (= --zero-stage 1 / 0).")]
DispatcherOpt = Annotated[MoeDispatcher | None, typer.Option("--moe-dispatcher", help="MoE token dispatcher (default: the cheapest for the plan's expert grid; flex = DeepEP/HybridEP).")]
Fp8RecipeOpt = Annotated[Fp8Recipe | None, typer.Option("--fp8-recipe", help="FP8 scaling recipe with --precision fp8 (default: mxfp8 on Blackwell, delayed elsewhere).")]
A2aOverlapOpt = Annotated[bool | None, typer.Option("--moe-a2a-overlap", help="MoE with EP > 1: Megatron's EP all-to-all overlap (--overlap-moe-expert-parallel-comm --delay-wgrad-compute): one micro-batch's dispatch and combine under another's compute; needs the alltoall or flex dispatcher, VPP > 1 when PP > 1, no full recompute. Priced savings have run above the one measured pair's (README).")]
Fp8AttnOpt = Annotated[bool | None, typer.Option("--fp8-attention", help="Evaluate: attention in FP8 (Transformer Engine fp8_dot_product_attention under NVTE_DPA_FP8_RECIPE=Float8CurrentScaling, as NeMo / Megatron-Bridge set it) with --precision fp8 or fp4 on B200, B300, GB200, GB300, head dimension 128; no Megatron-LM launch is printed (it has no flag for it).")]


def print_json(obj: dict) -> None:
    """One JSON object on stdout; a plan's carries the warnings the command showed on stderr (the
    importer's notes first) under "warnings"."""
    if NOTES and obj.get("schema") == "autoshard.plan/v1":
        obj = {**obj, "warnings": [*NOTES, *(w for w in obj.get("warnings", []) if w not in NOTES)]}
    write_stdout(json.dumps(obj, indent=2) + "\n")
    JSON_PRINTED.append(True)


def plans_json(plans: list) -> dict:
    """The best plan's JSON object, with the runner-ups (--top) under "alternatives"."""
    obj = plans[0].to_json()
    if len(plans) > 1:
        obj["alternatives"] = [p.to_json() for p in plans[1:]]
    return obj


TRAIN_ONLY = ("seq_len", "global_batch_size", "precision", "from_megatron", "verbose", "memory_fraction", "cp",
              "etp", "vpp", "mbs", "recompute", "recompute_num_layers", "sequence_parallel", "zero_stage",
              "show_schedule", "layout", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
              "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "recompute_modules",
              "moe_dispatcher", "fp8_recipe", "moe_a2a_overlap")
SERVE_ONLY = ("input_len", "output_len", "max_model_len", "tpot_ms", "ttft_s", "request_rate", "weight_dtype",
              "kv_cache_dtype")


PLAN_KNOBS = ("seq_len", "global_batch_size", "precision", "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs",
              "recompute", "recompute_num_layers", "sequence_parallel", "zero_stage", "layout",
              "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "recompute_modules",
              "moe_dispatcher", "fp8_recipe", "tp_comm_overlap", "overlap_grad_reduce", "distributed_optimizer",
              "fp8_attention", "moe_a2a_overlap")


def given_plan_knob(values: dict[str, Any]) -> str | None:
    """The flag of the first plan knob in `values` (parameter name -> value, None when not given), e.g.
    "--tp"; None when there is none: what a command that reads its plan from a launch would drop."""
    return next(("--" + k.replace("_", "-") for k, v in values.items() if v is not None and k in PLAN_KNOBS), None)


def check_mode_flags(mode: Mode, given: dict[str, Any]) -> None:
    """A flag the other mode owns would be silently ignored: refuse it, naming the flag."""
    wrong = TRAIN_ONLY if mode is Mode.SERVE else SERVE_ONLY
    for name in wrong:
        if name in given:
            flag = "--" + name.replace("_", "-")
            other = "train" if mode is Mode.SERVE else "serve"
            hint = " (serving weights: --weight-dtype)" if name == "precision" else ""
            raise SpecError(f"{flag} applies to --mode {other} only; with --mode {mode.value} it would be ignored: "
                            f"drop it{hint}", source=flag)


def check_output(output: Path | None, emit: Target | None, inputs: tuple[str | None, ...] = ()) -> None:
    """Refuse an -o that cannot be written before any solving starts: a directory, something other than a
    regular file (a device, a FIFO), one of the command's `inputs` (the model or cluster file)."""
    if output is None:
        return
    if emit is None:
        raise SpecError("-o/--output is the file for the launch script: add --emit megatron, vllm or sglang", source="-o")
    where = str(output)
    if emit is Target.K8S:  # a directory of manifests, created with its missing parents
        _check_manifest_dir(output)
        return
    try:
        if output.is_dir():
            raise SpecError(f"{where} is a directory: give a file name, e.g. {output / 'launch.sh'}", source="-o")
        api.check_script_path(output, [Path(ref) for ref in inputs if ref and Path(ref).is_file()])
        api.check_output_dir(output.parent, "-o", "the launch script's directory")
        if output.exists() and not os.access(output, os.W_OK):
            raise SpecError(f"{where} is not writable: choose a path you can write to", source="-o")
    except OSError as exc:
        raise SpecError(f"cannot write {where[:120]}: {exc.strerror}: choose another path", source="-o") from None


def _check_manifest_dir(output: Path) -> None:
    """--emit k8s -o DIR: a directory (new, or one without manifests) that can be written. Manifests already
    in it would be applied too by the `kubectl apply -f DIR` the command prints."""
    where = str(output)[:200]
    try:
        stale = sorted(p.name for p in output.iterdir() if p.suffix in (".yaml", ".yml", ".json")) if output.is_dir() else []
    except OSError as exc:
        raise SpecError(f"cannot read {where}: {exc.strerror}: choose another directory", source="-o") from None
    if stale:
        listed = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        raise SpecError(f"{where} already holds {len(stale)} manifest file(s) ({listed}): `kubectl apply -f "
                        f"{shlex.quote(where)}` would apply them too: give a new or empty directory", source="-o")
    api.check_output_dir(output, "-o", "the directory --emit k8s writes manifests to")


def write_script(text: str, output: Path | None, json_out: bool) -> None:
    """The launch script to -o, else to stdout (to stderr under --json: stdout holds the JSON object only)."""
    if output is None:
        sys.stderr.write(text) if json_out else write_stdout(text)
        return
    write_launch_script(text, output)
    err.print(f"wrote {escape(str(output))}", highlight=False)
