"""Megatron-LM launch command -> model, job and plan facts (`autoshard evaluate --from-megatron`).

`parse_megatron` reads a command line or a launch script (see `autoshard.emit.shell` for exactly
what is resolved: bash arrays, literal assignments and integer arithmetic, nothing else), finds
the `pretrain_*.py` invocation and reads its flags the way Megatron-LM's argparse does (no
abbreviations; `--flag=value` and `--flag value`), with Megatron-LM's own defaults for what the
command leaves out (learned absolute positions, LayerNorm, GeLU, biases on, tied embeddings, ...).
Unknown, removed and deprecated flags become warnings that name the fix; a command that does not
say what model it trains (no --num-layers, --hidden-size or --num-attention-heads) or says something
impossible is a SpecError that names the flag and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, ValidationError

import autoshard.emit.megatron.plan_facts as facts
from autoshard.costmodel.train.types import Stage, TrainConfig
from autoshard.emit.megatron.cmdline import read_flags, read_text
from autoshard.emit.megatron.layout import default_stages, with_block
from autoshard.emit.megatron.model_args import FlagReader, build_model, moe_pattern
from autoshard.emit.shell import read_launch
from autoshard.errors import SpecError
from autoshard.parallel import CrossEntropyImpl, Fp8Recipe, MoeDispatcher, ParallelDims, Recompute
from autoshard.specs.base import MAX_LAYERS
from autoshard.specs.job import Optimizer, Precision
from autoshard.specs.layers import PositionKind
from autoshard.specs.model import ModelSpec

__all__ = [
    "ParsedMegatron",
    "parse_megatron",
    "model_shape_differences",
    "DEFAULT_VOCAB_SIZE",
]

DEFAULT_VOCAB_SIZE = 32000
"""Used only when neither the command nor the caller says how large the vocabulary is."""


@dataclass(frozen=True, slots=True)
class ParsedMegatron:
    """What a Megatron-LM launch says about the model, the job and the plan."""

    source: str
    model: ModelSpec
    seq_len: int
    global_batch_size: int | None
    """None when the command leaves it to Megatron (micro-batch x DP) and the world size is unknown."""
    precision: Precision
    optimizer: Optimizer
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int | None
    vpp: int
    world_size: int | None
    """From torchrun --nproc-per-node x --nnodes (or srun --ntasks, WORLD_SIZE=...); None if unknown."""
    dims: ParallelDims | None
    """None while the world size (hence DP) is unknown: see `with_world_size`."""
    micro_batch_size: int
    recompute: Recompute
    recompute_num_layers: int
    """Decoder layers per stage fully recomputed on top of `recompute` (Megatron's block method)."""
    sequence_parallel: bool
    zero_stage: int
    tp_comm_overlap: bool
    overlap_grad_reduce: bool
    stages: tuple[Stage, ...] | None
    """Explicit layer layout; None means Megatron's default even split (see `default_stages`)."""
    warnings: tuple[str, ...]
    vocab_from_command: bool
    """False when the vocabulary size came from the caller or DEFAULT_VOCAB_SIZE (the tokenizer file
    decides it at run time)."""
    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLGATHER
    """--moe-token-dispatcher-type (Megatron's default is allgather); --moe-enable-deepep reads as flex."""
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED
    """--fp8-recipe (Megatron's default is delayed)."""
    fp8_param_gather: bool = False
    grad_reduce_fp32: bool = True
    """False with --grad-reduce-in-bf16 (BF16 gradient buffer and reduction)."""
    optimizer_moments_bf16: bool = False
    """--use-precision-aware-optimizer with 16-bit --exp-avg-dtype and --exp-avg-sq-dtype."""
    recompute_modules: tuple[str, ...] = ()
    """--recompute-modules under selective recompute (empty: Megatron's default, core_attn)."""
    cross_entropy: CrossEntropyImpl = CrossEntropyImpl.UNFUSED
    """--cross-entropy-loss-fusion (+ --cross-entropy-fusion-impl); without it Megatron's unfused loss."""
    moe_a2a_overlap: bool = False
    """--overlap-moe-expert-parallel-comm (TrainConfig.moe_a2a_overlap)."""
    moe_a2a_delay_wgrad: bool = True
    """--delay-wgrad-compute beside it (TrainConfig.moe_a2a_delay_wgrad)."""
    full_cuda_graph: bool = False
    """--cuda-graph-impl full_iteration (TrainConfig.full_cuda_graph; plan_facts.full_cuda_graph)."""
    launcher_world_size: int | None = None
    """The processes the launcher starts (torchrun --nproc-per-node x --nnodes, ...), None if it does not say."""
    launcher_problem: str | None = None
    """Why the launcher's process count cannot run the command's parallel sizes (world_size is then None)."""

    def with_world_size(self, world_size: int) -> ParsedMegatron:
        """The same launch on `world_size` GPUs (fills DP, and the global batch if it was defaulted)."""
        dims = facts.dims(self.tp, self.pp, self.cp, self.ep, self.etp, self.vpp, world_size)
        gbs = (
            self.global_batch_size if self.global_batch_size is not None else self.micro_batch_size * dims.dp
        )
        return dataclasses.replace(self, world_size=world_size, dims=dims, global_batch_size=gbs)

    def layout(self) -> tuple[Stage, ...]:
        """The stages Megatron-LM builds: the explicit layout, or its default even split."""
        if self.stages is not None:
            return self.stages
        return default_stages(
            self.model, pp=self.pp, vpp=self.vpp, recompute_num_layers=self.recompute_num_layers
        )

    def train_config(self) -> TrainConfig:
        if self.dims is None or self.global_batch_size is None:
            raise SpecError(
                "the command does not say how many GPUs it runs on (torchrun --nproc-per-node x --nnodes), "
                "or gives a count this plan cannot use: give the GPU count (autoshard: --gpus N)",
                source=self.source,
            )
        try:
            return TrainConfig(
                dims=self.dims,
                micro_batch_size=self.micro_batch_size,
                global_batch_size=self.global_batch_size,
                seq_len=self.seq_len,
                precision=self.precision,
                recompute=self.recompute,
                sequence_parallel=self.sequence_parallel,
                zero_stage=self.zero_stage,
                optimizer=self.optimizer,
                overlap_grad_reduce=self.overlap_grad_reduce,
                tp_comm_overlap=self.tp_comm_overlap,
                # dense models ignore the dispatcher: keep TrainConfig's default
                moe_dispatcher=self.moe_dispatcher if self.model.moe is not None else MoeDispatcher.ALLTOALL,
                fp8_recipe=self.fp8_recipe,
                fp8_param_gather=self.fp8_param_gather,
                grad_reduce_fp32=self.grad_reduce_fp32,
                optimizer_moments_bf16=self.optimizer_moments_bf16,
                recompute_modules=self.recompute_modules,
                cross_entropy=self.cross_entropy,
                moe_a2a_overlap=self.moe_a2a_overlap,
                moe_a2a_delay_wgrad=self.moe_a2a_delay_wgrad,
                full_cuda_graph=self.full_cuda_graph,
            )
        except ValueError as exc:
            raise SpecError(
                f"{exc} (fix --global-batch-size or --micro-batch-size)", source=self.source
            ) from None


def parse_megatron(command_or_path: str, *, vocab_size: int | None = None) -> ParsedMegatron:
    """Read a Megatron-LM launch (a command line, or the path of a launch script).

    `vocab_size` is used when the command does not fix the vocabulary (HuggingFace/SentencePiece
    tokenizers read it from their files); otherwise DEFAULT_VOCAB_SIZE, with a warning.
    Raises SpecError (naming the flag and the fix) when the model cannot be read; everything else
    that is odd becomes a warning.
    """
    text, source = read_text(command_or_path)
    launch = read_launch(text)
    if launch is None:
        raise SpecError(
            "no Megatron-LM launch found: expected a command that runs pretrain_gpt.py "
            "(torchrun ... pretrain_gpt.py --num-layers ...)",
            source=source,
        )
    warnings = list(launch.warnings)
    if launch.entry.rsplit("/", 1)[-1] != "pretrain_gpt.py":
        warnings.append(f"{launch.entry}: read as a GPT (decoder-only) model")
    r = FlagReader(read_flags(launch.args, warnings), source, warnings)

    num_layers = r.int("--num-layers", required="decoder layers")
    assert num_layers is not None
    if num_layers > MAX_LAYERS:
        raise SpecError(f"--num-layers {num_layers} is more than autoshard plans for (at most {MAX_LAYERS})", source=source)
    tp = r.int("--tensor-model-parallel-size", 1) or 1
    pp = r.int("--pipeline-model-parallel-size", 1) or 1
    cp = r.int("--context-parallel-size", 1) or 1
    ep = r.int("--expert-model-parallel-size", 1) or 1
    etp = r.int("--expert-tensor-parallel-size")
    etp = None if etp == tp else etp  # Megatron's default: the same as TP
    seq_len = r.int("--seq-length") or r.int("--encoder-seq-length")
    if seq_len is None:
        seq_len = r.int("--max-position-embeddings")
        if seq_len is None:
            raise SpecError(
                "the command has no --seq-length: add --seq-length <tokens per sample>", source=source
            )
        warnings.append("no --seq-length (Megatron-LM requires it); read --max-position-embeddings instead")
    try:
        model, vocab_known = build_model(
            r, num_layers=num_layers, seq_len=seq_len, vocab_size=vocab_size, default_vocab=DEFAULT_VOCAB_SIZE
        )
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise SpecError(f"the command describes an impossible model: {problems}", source=source) from None
    vpp = facts.vpp(r, num_layers, pp)
    stages, vpp = facts.layout(r, model, pp, vpp or 1)
    group = r.int("--microbatch-group-size-per-virtual-pipeline-stage")
    if group is not None and (vpp or 1) > 1 and group != pp:
        raise SpecError(
            f"--microbatch-group-size-per-virtual-pipeline-stage {group} is not modelled: autoshard prices the "
            f"interleaved schedule with Megatron's default group of PP = {pp} micro-batches; drop the flag to "
            "compare that schedule", source=source)
    recompute, block, modules = facts.recompute(r)
    if stages is not None:
        stages = with_block(stages, model, block)
    per_chunk = min(model.decoders_between(st.start, st.stop) for st in stages) if stages else \
        num_layers // (pp * (vpp or 1))
    if block > per_chunk:
        warnings.append(f"--recompute-num-layers {block} is more than the {per_chunk} decoder layers of a pipeline "
                        f"stage: Megatron-LM recomputes all of them (read as {per_chunk})")
    distributed = r.on("--use-distributed-optimizer") or r.on("--use-megatron-fsdp")
    for refused, rule in (  # Megatron-LM's validate_args (arguments.py) and get_megatron_optimizer assert these
        ((vpp or 1) > 1 and pp <= 2 and r.on("--no-overlap-p2p-communication"),
         "the interleaved schedule with --no-overlap-p2p-communication needs PP > 2"),
        (r.on("--overlap-param-gather") and not distributed,
         "--overlap-param-gather needs --use-distributed-optimizer (or Megatron-FSDP)"),
        (r.on("--overlap-param-gather") and not r.on("--overlap-grad-reduce"),
         "--overlap-param-gather needs --overlap-grad-reduce"),
        (r.on("--use-precision-aware-optimizer") and not distributed,
         "--use-precision-aware-optimizer needs --use-distributed-optimizer"),
    ):
        if refused:
            raise SpecError(f"Megatron-LM refuses the command at start-up: {rule}", source=source)
    mbs = r.int("--micro-batch-size")
    if mbs is None:
        warnings.append("no --micro-batch-size (Megatron-LM requires it); read as 1")
        mbs = 1
    if r.on("--rampup-batch-size") or r.on("--step-batch-size-schedule"):
        warnings.append("batch-size ramp-up is not modeled: predicted at the final --global-batch-size")
    optimizer = Optimizer.ADAM
    if r.text("--optimizer", "adam") == "sgd":
        optimizer = Optimizer.SGD
    elif r.text("--optimizer", "adam") != "adam":
        warnings.append(f"--optimizer {r.text('--optimizer')} is predicted as Adam")
    sp = r.on("--sequence-parallel")
    if sp and tp == 1:
        warnings.append("--sequence-parallel has no effect with TP 1 (Megatron-LM turns it off)")
    parsed = ParsedMegatron(
        source=source,
        model=model,
        seq_len=seq_len,
        global_batch_size=r.int("--global-batch-size"),
        precision=facts.precision(r),
        optimizer=optimizer,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        world_size=None,
        dims=None,
        micro_batch_size=mbs,
        recompute=recompute,
        recompute_num_layers=block,
        sequence_parallel=sp,
        zero_stage=facts.zero_stage(r),
        tp_comm_overlap=r.on("--tp-comm-overlap"),
        overlap_grad_reduce=r.on("--overlap-grad-reduce"),
        stages=tuple(stages) if stages is not None else None,
        warnings=(),
        vocab_from_command=vocab_known,
        moe_dispatcher=facts.dispatcher(r),
        fp8_recipe=facts.fp8_recipe(r),
        fp8_param_gather=r.on("--fp8-param-gather"),
        grad_reduce_fp32=facts.grad_reduce_fp32(r),
        optimizer_moments_bf16=facts.optimizer_moments_bf16(r),
        recompute_modules=modules,
        cross_entropy=facts.cross_entropy(r),
        moe_a2a_overlap=r.on("--overlap-moe-expert-parallel-comm"),
        # meaningful with the overlap only (Megatron refuses it alone, below): otherwise TrainConfig's default
        moe_a2a_delay_wgrad=r.on("--delay-wgrad-compute") or not r.on("--overlap-moe-expert-parallel-comm"),
        full_cuda_graph=facts.full_cuda_graph(r),
    )
    if parsed.full_cuda_graph and model.moe is not None:
        warnings.append("--cuda-graph-impl full_iteration under MoE: priced without the host floor of its MoE layers; "
                        "the launch written back keeps the graph but not the static expert buffers Megatron needs "
                        "for it (--moe-paged-stash, --moe-expert-rank-capacity-factor): add those back")
    if r.on("--delay-wgrad-compute") and not parsed.moe_a2a_overlap:
        raise SpecError("it needs --overlap-moe-expert-parallel-comm (Megatron-Core asserts it): add that flag or drop "
                        "this one", source="--delay-wgrad-compute")
    if parsed.moe_a2a_overlap:
        for broken, problem in (
            (r.on("--moe-shared-expert-overlap"), "Megatron-Core refuses it with --moe-shared-expert-overlap: drop one"),
            (not (r.on("--bf16") or r.on("--fp16")), "Megatron-Core runs it in a --bf16 or --fp16 model only: add one"),
            (r.text("--recompute-method") is not None, "Megatron-Core refuses it with any --recompute-method: drop "
                                                       "--recompute-method and --recompute-num-layers"),
        ):
            if broken:
                raise SpecError(problem, source="--overlap-moe-expert-parallel-comm")
    if launch.world_size is not None:
        parsed = dataclasses.replace(parsed, launcher_world_size=launch.world_size)
        try:
            parsed = parsed.with_world_size(launch.world_size)
        except SpecError as exc:
            problem = f"the launcher starts {launch.world_size} processes, which cannot run this plan ({exc})"
            parsed = dataclasses.replace(parsed, launcher_problem=problem)
            warnings.append(f"{problem}; the GPU count is left open")
    return dataclasses.replace(parsed, warnings=tuple(warnings))


def model_shape_differences(expected: ModelSpec, got: ModelSpec) -> list[str]:
    """Architecture facts that differ between two model specs (names, sources and defaults aside):
    e.g. a bundled model against the one a Megatron-LM command describes."""

    def facts(m: ModelSpec) -> dict[str, object]:
        return {
            "hidden_size": m.hidden_size,
            "ffn_hidden_size": m.ffn_hidden_size,
            "num_attention_heads": m.num_attention_heads,
            "kv_heads": m.kv_heads,
            "kv_channels": m.kv_channels if m.mla is None else None,
            "vocab_size": m.vocab_size,
            "tied_embeddings": m.tied_embeddings,
            "mlp": m.mlp.value,
            "norm": m.norm.value,
            "attention": m.attention.value,
            "position_embedding": m.position_embedding.value,
            "linear_bias": m.linear_bias,
            "qkv_bias": m.qkv_bias and not m.linear_bias,
            "qk_norm": m.qk_norm,
            "moe_layers": _runs(moe_pattern(m)),
            "attention_windows": _window_runs(m.decoder_windows) if m.has_attention_window else None,
            "num_layers": m.num_layers,
            "max_position_embeddings": (
                m.max_position_embeddings if m.position_embedding is PositionKind.LEARNED else None
            ),
        }

    a, b = facts(expected), facts(got)
    return ([f"{k}: {a[k]} vs {b[k]}" for k in a if a[k] != b[k]]
            + _block_differences("mla", expected.mla, got.mla) + _block_differences("moe", expected.moe, got.moe))


def _block_differences(name: str, a: BaseModel | None, b: BaseModel | None) -> list[str]:
    """An MLA or MoE block's differing fields one by one ("moe.num_experts: 256 vs 128"), not two reprs."""
    def value(v: object) -> object:
        return v.value if isinstance(v, Enum) else v

    def whole(block: BaseModel | None) -> str:
        return "none" if block is None else " ".join(f"{f}={value(getattr(block, f))}" for f in type(block).model_fields)

    if a is None or b is None:
        return [] if a is b else [f"{name}: {whole(a)} vs {whole(b)}"]
    return [f"{name}.{f}: {value(getattr(a, f))} vs {value(getattr(b, f))}"
            for f in type(a).model_fields if getattr(a, f) != getattr(b, f)]


def _window_runs(windows: tuple[int | None, ...]) -> str:
    """Each decoder layer's attention window as runs ("window 1024 0-4, full 5, ...")."""
    return _labelled_runs(windows, lambda w: "full" if w is None else f"window {w}")


def _runs(pattern: tuple[int, ...]) -> str:
    """Which decoder layers are MoE, as runs ("dense 0-2, MoE 3-60"); "none" without MoE layers (a dense
    model's layer count is num_layers' fact, not a list of 80 zeros)."""
    if not any(pattern):
        return "none"
    return _labelled_runs(pattern, lambda b: "MoE" if b else "dense")


def _labelled_runs(values: Sequence[object], label: Callable[[Any], str]) -> str:
    """Equal neighbours as runs of layer indices, each named by `label` of its value."""
    runs: list[str] = []
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            runs.append(f"{label(values[start])} {span}")
            start = i
    return ", ".join(runs)
