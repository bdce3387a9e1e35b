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
import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from autoshard.costmodel.train.step import Stage, TrainConfig
from autoshard.emit.megatron import flags as mf
from autoshard.emit.megatron.model_args import FlagReader, build_model, moe_pattern
from autoshard.emit.shell import read_launch
from autoshard.errors import SpecError
from autoshard.parallel import Fp8Recipe, MoeDispatcher, ParallelDims, Recompute
from autoshard.specs.base import MAX_LAYERS
from autoshard.specs.job import Optimizer, Precision
from autoshard.specs.model import LayerKind, ModelSpec, PositionKind

__all__ = [
    "ParsedMegatron",
    "parse_megatron",
    "parse_layout",
    "default_stages",
    "model_shape_differences",
    "DEFAULT_VOCAB_SIZE",
]

DEFAULT_VOCAB_SIZE = 32000
"""Used only when neither the command nor the caller says how large the vocabulary is."""

Flags = dict[str, list[str]]


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
    recompute_modules: tuple[str, ...] = ()
    """--recompute-modules under selective recompute (empty: Megatron's default, core_attn)."""

    def with_world_size(self, world_size: int) -> ParsedMegatron:
        """The same launch on `world_size` GPUs (fills DP, and the global batch if it was defaulted)."""
        dims = _dims(self.tp, self.pp, self.cp, self.ep, self.etp, self.vpp, world_size)
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
                recompute_modules=self.recompute_modules,
            )
        except ValueError as exc:
            raise SpecError(
                f"{exc} (fix --global-batch-size or --micro-batch-size)", source=self.source
            ) from None


# ----------------------------------------------------------------------------- layouts


def _expand_layout(text: str) -> list[str]:
    """Megatron's parse_str_to_list: drop commas, unroll `(...)*n`, then `x*n`, split on `|`. An unrolled
    layout longer than any model's (MAX_LAYERS layers) is refused before it is built."""
    limit = 8 * MAX_LAYERS + len(text)

    def unroll(s: str, pattern: str) -> str:
        grown = len(s)

        def repeat(m: re.Match[str]) -> str:
            nonlocal grown
            n = int(m.group(2)) if len(m.group(2)) < 10 else limit + 1
            grown += len(m.group(1)) * n - len(m.group(0))
            if grown > limit:
                raise SpecError(f"--pipeline-model-parallel-layout unrolls to more layers than any model has (at most "
                                f"{MAX_LAYERS}): check the repeat counts", source="--pipeline-model-parallel-layout")
            return m.group(1) * n

        return re.sub(pattern, repeat, s)

    s = unroll(text.replace(",", ""), r"\(([^)]+)\)\*(\d+)")
    return unroll(s, r"(.)\*(\d+)").split("|")


def parse_layout(
    text: str, *, num_layers: int, pp: int, mtp_num_layers: int | None = None
) -> tuple[list[Stage], list[str]]:
    """`--pipeline-model-parallel-layout` -> stages (layer indices: 0 = embedding, 1..L decoders,
    L+1 output) and warnings. Raises SpecError where Megatron-LM would refuse the layout.
    `mtp_num_layers` (the model's MTP modules; None: do not check) must match the layout's m count;
    MTP modules are costed with the output layer, on the last chunk."""
    flag = "--pipeline-model-parallel-layout"
    if len(text) > 100_000:
        raise SpecError(f"{flag}: a layout string of {len(text)} characters is not a layout", source=flag)
    limit = num_layers + 2
    for count in re.findall(r"\*\s*(\d+)", text):
        if len(count) > 7 or int(count) > limit:
            raise SpecError(
                f"{flag} '{text[:80]}' repeats something {count} times, more than the model's {num_layers} "
                "decoder layers (plus embedding and loss) allow: fix the repetition count",
                source=flag,
            )
    chunks = _expand_layout(text.strip())
    warnings: list[str] = []
    bad = sorted({c for chunk in chunks for c in chunk} - set("EtLm"))
    if bad:
        raise SpecError(
            f"{flag} '{text}': unknown layer symbol(s) {bad}; use E (embedding), t (decoder layer), "
            "m (MTP layer), L (loss), | between chunks",
            source=flag,
        )
    flat = "".join(chunks).replace("m", "")
    m_count = sum(c.count("m") for c in chunks)
    if mtp_num_layers is not None and m_count != mtp_num_layers:
        raise SpecError(
            f"{flag} '{text}' places {m_count} MTP layer(s) (m) but the model has {mtp_num_layers} "
            f"(--mtp-num-layers): write {mtp_num_layers} m in the last chunk",
            source=flag,
        )
    if m_count and any("m" in c for c in chunks[:-1]):
        warnings.append(f"{flag}: MTP layers (m) outside the last chunk are predicted on the last chunk")
    if flat.count("E") != 1 or flat.count("L") != 1 or not flat.startswith("E") or not flat.endswith("L"):
        raise SpecError(
            f"{flag} '{text}': the layout must start with one E (embedding) and end with one L (loss)",
            source=flag,
        )
    if flat.count("t") != num_layers:
        raise SpecError(
            f"{flag} '{text}' places {flat.count('t')} decoder layers but --num-layers is {num_layers}: "
            "make the t counts add up to --num-layers",
            source=flag,
        )
    if len(chunks) % pp:
        raise SpecError(
            f"{flag} '{text}' has {len(chunks)} chunks, not a multiple of "
            f"--pipeline-model-parallel-size {pp}: give PP x VPP chunks",
            source=flag,
        )
    stages, pos = [], 0
    for chunk in chunks:
        n = len(chunk.replace("m", ""))
        stages.append(Stage(pos, pos + n))
        pos += n
    return stages, warnings


def _chunk_decoders(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> list[int]:
    """Decoder layers per chunk under --decoder-first/last-pipeline-num-layers (Megatron: the first and
    last pipeline ranks get those counts, the middle ranks share the rest evenly; each rank splits its
    layers evenly over its VPP chunks)."""
    if pp == 1:
        raise SpecError(
            "--decoder-first/last-pipeline-num-layers need pipeline parallelism (PP > 1)",
            source="--decoder-first-pipeline-num-layers",
        )
    for name, x in (("first", first), ("last", last)):
        if x is not None and x <= 0:
            raise SpecError(
                f"--decoder-{name}-pipeline-num-layers must be at least 1 (Megatron-LM), got {x}",
                source=f"--decoder-{name}-pipeline-num-layers",
            )
    per_rank: list[int | None] = [None] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    rest = num_layers - sum(x for x in per_rank if x is not None)
    middle = sum(1 for x in per_rank if x is None)
    if (rest != 0) != (middle != 0) or (middle and rest % middle) or rest < 0:
        raise SpecError(
            f"--decoder-first/last-pipeline-num-layers leave {rest} of {num_layers} layers for {middle} "
            "other pipeline ranks: they must split evenly",
            source="--decoder-first-pipeline-num-layers",
        )
    ranks = [x if x is not None else rest // middle for x in per_rank]
    if any(r % vpp for r in ranks):
        raise SpecError(
            f"layers per pipeline rank {ranks} are not all divisible by VPP {vpp}",
            source="--decoder-first-pipeline-num-layers",
        )
    return [ranks[i % pp] // vpp for i in range(pp * vpp)]


def _stages_from_counts(decoders: list[int]) -> list[Stage]:
    stages, pos = [], 0
    last = len(decoders) - 1
    for i, n in enumerate(decoders):
        size = n + (i == 0) + (i == last)
        stages.append(Stage(pos, pos + size))
        pos += size
    return stages


@dataclass(frozen=True, slots=True)
class LayoutFlags:
    """How a Megatron-LM launch places layers on pipeline stages (all optional; none given means
    Megatron's default even split)."""

    layout: str | None = None
    """--pipeline-model-parallel-layout, e.g. "Et*3|t*4|t*4|t*3L"."""
    first: int | None = None
    """--decoder-first-pipeline-num-layers."""
    last: int | None = None
    """--decoder-last-pipeline-num-layers."""
    account_embedding: bool = False
    """--account-for-embedding-in-pipeline-split."""
    account_loss: bool = False
    """--account-for-loss-in-pipeline-split."""

    def given(self) -> bool:
        return (
            self.layout is not None
            or self.first is not None
            or self.last is not None
            or self.account_embedding
            or self.account_loss
        )

    def args(self) -> list[tuple[str, str | None]]:
        """The Megatron-LM flags that say this layout."""
        out: list[tuple[str, str | None]] = []
        if self.layout is not None:
            out.append(("--pipeline-model-parallel-layout", self.layout))
        if self.first is not None:
            out.append(("--decoder-first-pipeline-num-layers", str(self.first)))
        if self.last is not None:
            out.append(("--decoder-last-pipeline-num-layers", str(self.last)))
        if self.account_embedding:
            out.append(("--account-for-embedding-in-pipeline-split", None))
        if self.account_loss:
            out.append(("--account-for-loss-in-pipeline-split", None))
        return out

    def describe(self) -> str:
        import shlex

        return " ".join(f if v is None else f"{f} {shlex.quote(v)}" for f, v in self.args())


def layout_stages(
    model: ModelSpec, *, pp: int, vpp: int = 1, flags: LayoutFlags = LayoutFlags(), recompute_num_layers: int = 0
) -> tuple[tuple[Stage, ...], int]:
    """(stages, VPP) Megatron-LM builds for these layout flags; a layout string decides VPP itself
    (chunks / PP). Raises SpecError (naming the flag) where Megatron-LM refuses the combination."""
    L = model.num_layers
    if flags.layout is not None:
        others = [f for f, _ in LayoutFlags(first=flags.first, last=flags.last,
                                            account_embedding=flags.account_embedding,
                                            account_loss=flags.account_loss).args()]
        if others:
            raise SpecError(
                f"--pipeline-model-parallel-layout cannot be combined with {', '.join(others)} "
                "(Megatron-LM rejects it): give the layout string alone",
                source="--pipeline-model-parallel-layout",
            )
        stages, _ = parse_layout(flags.layout, num_layers=L, pp=pp, mtp_num_layers=model.mtp_num_layers)
        chunks_vpp = len(stages) // pp
        if vpp > 1 and chunks_vpp != vpp:
            raise SpecError(
                f"--pipeline-model-parallel-layout has {len(stages)} chunks = PP {pp} x VPP {chunks_vpp}, "
                f"but VPP {vpp} was given: drop the VPP setting (the layout decides it)",
                source="--pipeline-model-parallel-layout",
            )
        return tuple(_with_block(stages, model, recompute_num_layers)), chunks_vpp
    if flags.first is not None or flags.last is not None:
        if flags.account_embedding or flags.account_loss:
            raise SpecError(
                "--decoder-first/last-pipeline-num-layers cannot be combined with "
                "--account-for-embedding/loss-in-pipeline-split (Megatron-LM rejects it): pick one",
                source="--decoder-first-pipeline-num-layers",
            )
        stages = _stages_from_counts(_chunk_decoders(L, pp, vpp, flags.first, flags.last))
        return tuple(_with_block(stages, model, recompute_num_layers)), vpp
    chunks = pp * vpp
    if flags.account_embedding or flags.account_loss:
        emb, loss = int(flags.account_embedding), int(flags.account_loss)
        total = L + emb + loss
        if total % chunks or total // chunks - emb < 0 or total // chunks - loss < 0:
            raise SpecError(
                f"--account-for-*-in-pipeline-split: {L} decoder layers + {emb + loss} counted "
                f"= {total} do not split evenly over PP {pp} x VPP {vpp} = {chunks} chunks",
                source="--account-for-embedding-in-pipeline-split",
            )
        per = total // chunks
        counts = [per] * chunks
        counts[0] -= emb
        counts[-1] -= loss
        return tuple(_with_block(_stages_from_counts(counts), model, recompute_num_layers)), vpp
    return default_stages(model, pp=pp, vpp=vpp, recompute_num_layers=recompute_num_layers), vpp


def _balanced_layout(L: int, chunks: int, mtp: int = 0) -> str:
    """A layout string that spreads L decoder layers plus the embedding and the loss (one layer each)
    as evenly as possible over `chunks` chunks, the extra layers on the middle chunks."""
    total = L + 2
    base, extra = divmod(total, chunks)
    sizes = [base] * chunks
    # the extra units go to the middle chunks (the first and last also host embedding and loss)
    order = sorted(range(chunks), key=lambda i: (i in (0, chunks - 1), abs(i - (chunks - 1) / 2)))
    for i in order[:extra]:
        sizes[i] += 1
    sizes[0] -= 1
    sizes[-1] -= 1
    if min(sizes) < 0:  # more chunks than units: cannot happen while chunks <= L + 2
        raise SpecError(f"{chunks} chunks cannot hold {L} decoder layers")
    parts = []
    for i, n in enumerate(sizes):
        body = "t" if n == 1 else f"t*{n}" if n else ""
        parts.append(("E" if i == 0 else "") + body + ("m" * mtp + "L" if i == chunks - 1 else ""))
    return "|".join(parts)


def predict_layout(model: ModelSpec, *, pp: int, vpp: int = 1) -> LayoutFlags:
    """The layout flags Megatron-LM needs when the decoder layers do not split evenly over PP x VPP:
    the first that works of --account-for-embedding/loss-in-pipeline-split (both, then one),
    --decoder-first/last-pipeline-num-layers (the most balanced), then a balanced
    --pipeline-model-parallel-layout. LayoutFlags() when the default even split works."""
    L, chunks = model.num_layers, pp * vpp
    if L % chunks == 0:
        return LayoutFlags()
    for emb, loss in ((True, True), (False, True), (True, False)):
        total = L + emb + loss
        if total % chunks == 0 and total // chunks >= 1:
            return LayoutFlags(account_embedding=emb, account_loss=loss)
    if pp > 1:
        # for each middle-rank count, the first and last ranks share the rest as evenly as VPP allows
        # (the first takes the odd chunk: the loss stage's logits weigh more than the embedding)
        best: tuple[tuple[int, int], int, int] | None = None
        middle = pp - 2
        for mid in range(0, L + 1, vpp) if middle else (0,):
            rest = L - middle * mid
            if rest < 2 * vpp:
                break
            if rest % vpp:
                continue
            last = rest // vpp // 2 * vpp
            first = rest - last
            key = (max(first + 1, last + 1, mid), last - first)  # embedding and loss weigh about one layer
            if best is None or key < best[0]:
                best = (key, first, last)
        if best is not None:
            _, first, last = best
            return LayoutFlags(first=first, last=last)
    return LayoutFlags(layout=_balanced_layout(L, chunks, model.mtp_num_layers))


def default_stages(
    model: ModelSpec, *, pp: int, vpp: int = 1, recompute_num_layers: int = 0
) -> tuple[Stage, ...]:
    """Megatron-LM's default split: num_layers / (PP x VPP) decoder layers per chunk, the embedding on
    the first chunk and the output on the last."""
    chunks = pp * vpp
    if model.num_layers % chunks:
        raise SpecError(
            f"{model.num_layers} decoder layers do not split evenly over PP {pp} x VPP {vpp} = {chunks} "
            "chunks: Megatron-LM needs --pipeline-model-parallel-layout (or "
            "--decoder-first/last-pipeline-num-layers)"
        )
    stages = _stages_from_counts([model.num_layers // chunks] * chunks)
    return tuple(_with_block(stages, model, recompute_num_layers))


def _with_block(stages: list[Stage], model: ModelSpec, n: int) -> list[Stage]:
    if n <= 0:
        return stages
    out = []
    for s in stages:
        dec = sum(1 for k in model.layer_kinds[s.start : s.stop] if k in (LayerKind.DENSE, LayerKind.MOE))
        out.append(dataclasses.replace(s, full_recompute_layers=min(n, dec)))
    return out


# ----------------------------------------------------------------------------- flag reading


def _is_option(word: str) -> bool:
    if not word.startswith("-") or len(word) < 2:
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def _read_flags(args: list[str], warnings: list[str]) -> Flags:
    flags: Flags = {}
    known = sorted(f for f in mf.KNOWN)
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not _is_option(word):
            warnings.append(f"ignored stray argument '{word}' (Megatron-LM takes no positional arguments)")
            continue
        name, eq, inline = word.partition("=")
        if name not in mf.KNOWN:
            if name in mf.REMOVED:
                warnings.append(f"{name} is not a Megatron-LM flag any more: {mf.REMOVED[name]}")
            else:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
                hint = f" (did you mean {close[0]}?)" if close else ""
                warnings.append(f"{name} is not a Megatron-LM flag{hint}; ignored")
            if not eq and i < len(args) and not _is_option(args[i]):
                i += 1  # its value
            continue
        if name in mf.DEPRECATED:
            warnings.append(f"{name} is deprecated: {mf.DEPRECATED[name]}")
        primary = mf.canonical(name)
        if primary in mf.NO_VALUE or name in mf.NEGATIONS:
            if eq:
                warnings.append(f"{name} takes no value (got '={inline}'); the value was ignored")
            values: list[str] = []
        elif eq:
            values = [inline]
        elif primary in mf.ONE_VALUE:
            if i < len(args) and not _is_option(args[i]):
                values = [args[i]]
                i += 1
            else:
                warnings.append(f"{name} expects a value; ignored")
                continue
        else:
            want = mf.FIXED_NARGS.get(primary)
            values = []
            while i < len(args) and not _is_option(args[i]) and (want is None or len(values) < want):
                values.append(args[i])
                i += 1
        if primary in flags:
            warnings.append(f"{name} is given more than once; the last one wins (as in Megatron-LM)")
        flags[primary] = values
    return flags


# ----------------------------------------------------------------------------- parse


def _dims(tp: int, pp: int, cp: int, ep: int, etp: int | None, vpp: int, world: int) -> ParallelDims:
    model_parallel = tp * pp * cp
    if world % model_parallel:
        raise SpecError(
            f"world size {world} is not a multiple of TP x PP x CP = {tp} x {pp} x {cp}: "
            "change the parallel sizes or the GPU count"
        )
    try:
        return ParallelDims(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, dp=world // model_parallel)
    except ValueError as exc:
        hint = ""
        if "expert grid" in str(exc):
            dense = world // (pp)
            ok = [e for e in (1, 2, 4, 8) if e != (etp or tp) and dense % (e * ep) == 0]
            if ok:
                hint = f"; --expert-tensor-parallel-size {ok[0]} makes it legal (expert TP is independent of TP)"
        raise SpecError(f"{exc}: fix the parallel sizes in the command{hint}") from None


MAX_SCRIPT_BYTES = 1 << 20


def _read_text(command_or_path: str) -> tuple[str, str]:
    text = command_or_path.strip()
    if not text:
        raise SpecError(
            "the Megatron-LM command is empty: pass the torchrun/python command line or a script path"
        )
    if "\n" not in text:
        path = Path(text)
        try:
            is_file = path.is_file()
        except (OSError, ValueError):  # a command line too long or odd to be a file name
            is_file = False
        if is_file:
            try:
                if path.stat().st_size > MAX_SCRIPT_BYTES:
                    raise SpecError(f"the launch script is {path.stat().st_size / 2**20:.1f} MiB, more than a launch "
                                    f"script holds (at most {MAX_SCRIPT_BYTES >> 20} MiB): give the right file",
                                    source=str(path))
                return path.read_text(encoding="utf-8"), str(path)
            except (OSError, UnicodeDecodeError) as exc:
                raise SpecError(f"cannot read the launch script ({exc})", source=str(path)) from None
        if " " not in text and (path.suffix in (".sh", ".bash") or "/" in text):
            raise SpecError(
                f"file not found: {text} (give the path of a launch script, or the command itself)"
            )
    return command_or_path, "megatron command"


def _precision(r: FlagReader) -> Precision:
    if r.on("--fp8-format"):
        return Precision.FP8
    if r.on("--fp4-format"):
        r.warnings.append("--fp4-format: FP4 training is not modeled; predicted as FP8")
        return Precision.FP8
    if r.on("--fp16"):
        r.warnings.append("--fp16 is predicted as bf16 (same speed and memory)")
    elif not r.on("--bf16"):
        r.warnings.append(
            "neither --bf16 nor --fp16: Megatron-LM trains in fp32, which is not modeled; predicted as bf16"
        )
    return Precision.BF16


def _dispatcher(r: FlagReader) -> MoeDispatcher:
    if r.on("--moe-enable-deepep"):
        return MoeDispatcher.FLEX
    kind = r.text("--moe-token-dispatcher-type", "allgather")
    try:
        return MoeDispatcher(kind)
    except ValueError:
        r.warnings.append(f"--moe-token-dispatcher-type '{kind}' is not allgather, alltoall or flex; read as allgather")
        return MoeDispatcher.ALLGATHER


def _fp8_recipe(r: FlagReader) -> Fp8Recipe:
    recipe = r.text("--fp8-recipe", "delayed")
    try:
        return Fp8Recipe(recipe)
    except ValueError:
        r.warnings.append(f"--fp8-recipe {recipe} is not delayed, tensorwise, blockwise or mxfp8; read as delayed")
        return Fp8Recipe.DELAYED


def _recompute(r: FlagReader) -> tuple[Recompute, int, tuple[str, ...]]:
    """(base mode, block-recomputed layers per stage, selective modules)."""
    from autoshard.costmodel.train.recompute import RECOMPUTE_MODULES

    granularity = r.text("--recompute-granularity")
    if r.on("--recompute-activations"):
        granularity = "selective"
    method = r.text("--recompute-method")
    given = r.flags.get("--recompute-modules") or []
    unknown = [m for m in given if m not in RECOMPUTE_MODULES]
    if unknown:
        r.warnings.append(f"--recompute-modules {' '.join(unknown)}: not modules Megatron-Core recomputes "
                          f"({', '.join(RECOMPUTE_MODULES)}); ignored")
    modules = tuple(dict.fromkeys(m for m in given if m in RECOMPUTE_MODULES))
    if granularity == "selective":
        if method is not None or r.on("--recompute-num-layers"):
            r.warnings.append(
                "--recompute-method/--recompute-num-layers are rejected with selective recompute"
            )
        if modules == ("core_attn",):
            modules = ()  # Megatron's default
        return Recompute.SELECTIVE, 0, modules
    if modules:
        r.warnings.append("--recompute-modules applies only with --recompute-granularity selective; ignored")
    if granularity == "full":
        n = r.int("--recompute-num-layers", 1) or 1
        if method == "block":
            return Recompute.NONE, n, ()
        if method != "uniform":
            r.warnings.append(
                "--recompute-granularity full needs --recompute-method uniform|block; read as uniform"
            )
        return Recompute.FULL, 0, ()
    if granularity is not None:
        r.warnings.append(f"--recompute-granularity '{granularity}' is not full or selective; ignored")
    return Recompute.NONE, 0, ()


def _zero_stage(r: FlagReader) -> int:
    if r.on("--use-megatron-fsdp"):
        strategy = r.text("--data-parallel-sharding-strategy", "optim_grads_params")
        stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages:
            r.warnings.append(
                f"--data-parallel-sharding-strategy '{strategy}' unknown; read as optim_grads_params"
            )
        return stages.get(strategy or "", 3)
    if r.on("--use-torch-fsdp2"):
        r.warnings.append("--use-torch-fsdp2 is predicted as ZeRO-3 (fully sharded parameters)")
        return 3
    return 1 if r.on("--use-distributed-optimizer") else 0


def _vpp(r: FlagReader, num_layers: int, pp: int) -> int:
    given = [
        f
        for f in (
            "--pipeline-model-parallel-layout",
            "--num-virtual-stages-per-pipeline-rank",
            "--num-layers-per-virtual-pipeline-stage",
        )
        if r.on(f)
    ]
    if len(given) > 1:
        r.warnings.append(
            f"{' and '.join(given)} cannot be combined (Megatron-LM rejects it); read {given[0]}"
        )
    if r.on("--pipeline-model-parallel-layout"):
        return 0  # decided by the layout
    if r.on("--num-virtual-stages-per-pipeline-rank"):
        return r.int("--num-virtual-stages-per-pipeline-rank", 1) or 1
    per_chunk = r.int("--num-layers-per-virtual-pipeline-stage")
    if per_chunk:
        total = (
            num_layers
            + r.on("--account-for-embedding-in-pipeline-split")
            + r.on("--account-for-loss-in-pipeline-split")
        )
        if total % pp or (total // pp) % per_chunk:
            raise SpecError(
                f"--num-layers-per-virtual-pipeline-stage {per_chunk} does not divide the {total // pp} "
                f"layers per pipeline rank ({total} layers / PP {pp})"
            )
        return max(1, total // pp // per_chunk)
    return 1


def _layout_flags(r: FlagReader) -> LayoutFlags:
    return LayoutFlags(
        layout=r.text("--pipeline-model-parallel-layout"),
        first=r.int("--decoder-first-pipeline-num-layers"),
        last=r.int("--decoder-last-pipeline-num-layers"),
        account_embedding=r.on("--account-for-embedding-in-pipeline-split"),
        account_loss=r.on("--account-for-loss-in-pipeline-split"),
    )


def _layout(r: FlagReader, model: ModelSpec, pp: int, vpp: int) -> tuple[list[Stage] | None, int]:
    flags = _layout_flags(r)
    if flags.layout is not None:
        stages, warns = parse_layout(flags.layout, num_layers=model.num_layers, pp=pp,
                                     mtp_num_layers=model.mtp_num_layers)
        r.warnings.extend(warns)
        vpp = 1
    if flags.given():
        stages_t, vpp = layout_stages(model, pp=pp, vpp=vpp, flags=flags)
        return list(stages_t), vpp
    chunks = pp * vpp
    if model.num_layers % chunks:
        predicted = predict_layout(model, pp=pp, vpp=vpp)
        r.warnings.append(
            f"--num-layers {model.num_layers} does not split evenly over PP {pp} x VPP {vpp}: Megatron-LM "
            f"refuses it without a layout flag; predicted with {predicted.describe()}"
        )
        stages_t, vpp = layout_stages(model, pp=pp, vpp=vpp, flags=predicted)
        return list(stages_t), vpp
    return None, vpp


def parse_megatron(command_or_path: str, *, vocab_size: int | None = None) -> ParsedMegatron:
    """Read a Megatron-LM launch (a command line, or the path of a launch script).

    `vocab_size` is used when the command does not fix the vocabulary (HuggingFace/SentencePiece
    tokenizers read it from their files); otherwise DEFAULT_VOCAB_SIZE, with a warning.
    Raises SpecError (naming the flag and the fix) when the model cannot be read; everything else
    that is odd becomes a warning.
    """
    text, source = _read_text(command_or_path)
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
    r = FlagReader(_read_flags(launch.args, warnings), source, warnings)

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
    vpp = _vpp(r, num_layers, pp)
    stages, vpp = _layout(r, model, pp, vpp or 1)
    recompute, block, modules = _recompute(r)
    if stages is not None:
        stages = _with_block(stages, model, block)
    per_chunk = min(sum(k in (LayerKind.DENSE, LayerKind.MOE) for k in model.layer_kinds[st.start:st.stop])
                    for st in stages) if stages else num_layers // (pp * (vpp or 1))
    if block > per_chunk:
        warnings.append(f"--recompute-num-layers {block} is more than the {per_chunk} decoder layers of a pipeline "
                        f"stage: Megatron-LM recomputes all of them (read as {per_chunk})")
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
        precision=_precision(r),
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
        zero_stage=_zero_stage(r),
        tp_comm_overlap=r.on("--tp-comm-overlap"),
        overlap_grad_reduce=r.on("--overlap-grad-reduce"),
        stages=tuple(stages) if stages is not None else None,
        warnings=(),
        vocab_from_command=vocab_known,
        moe_dispatcher=_dispatcher(r),
        fp8_recipe=_fp8_recipe(r),
        fp8_param_gather=r.on("--fp8-param-gather"),
        recompute_modules=modules,
    )
    if launch.world_size is not None:
        try:
            parsed = parsed.with_world_size(launch.world_size)
        except SpecError as exc:
            warnings.append(
                f"the launcher starts {launch.world_size} processes, which cannot run this plan "
                f"({exc}); the GPU count is left open"
            )
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
            "mla": m.mla,
            "moe": m.moe,
            "moe_layers": moe_pattern(m),
            "num_layers": m.num_layers,
            "max_position_embeddings": (
                m.max_position_embeddings if m.position_embedding is PositionKind.LEARNED else None
            ),
        }

    a, b = facts(expected), facts(got)
    return [f"{k}: {a[k]} vs {b[k]}" for k in a if a[k] != b[k]]
