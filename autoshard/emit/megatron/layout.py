"""Megatron-LM pipeline layouts, both ways: layout flags -> the stages Megatron-LM builds
(`parse_layout` for `--pipeline-model-parallel-layout`, `layout_stages` for every layout flag,
`default_stages` for its default even split), and a model -> the layout flags that split it when the
default cannot (`predict_layout`). `LayoutFlags` holds the five layout flags.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from autoshard.costmodel.train.types import Stage
from autoshard.errors import SpecError
from autoshard.specs.base import MAX_LAYERS
from autoshard.specs.model import ModelSpec

__all__ = ["LayoutFlags", "parse_layout", "layout_stages", "predict_layout", "default_stages", "with_block"]


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
    if pp == 1 and len(chunks) > 1:  # was "virtual pipeline stages (vpp > 1) need pipeline parallelism"
        raise SpecError(
            f"{flag} '{text[:80]}' has {len(chunks)} chunks, which with PP 1 is VPP {len(chunks)}: Megatron-LM "
            f"interleaves only with PP > 1: set the PP size to a divisor of {len(chunks)} above 1, or write one chunk",
            source=flag,
        )
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
    given = num_layers - rest
    where = ("first and last pipeline ranks" if first is not None and last is not None
             else f"{'first' if first is not None else 'last'} pipeline rank")
    if rest < 0 or (middle == 0) != (rest == 0):
        problem = (f"more than the model's {num_layers}: lower them" if rest < 0
                   else f"not the model's {num_layers}, and no other rank holds the rest: make them add up to "
                        f"{num_layers}" if middle == 0
                   else f"all of the model's {num_layers}, none for the {middle} other pipeline ranks: lower them")
        raise SpecError(f"--decoder-first/last-pipeline-num-layers put {given} decoder layers on the {where}, "
                        f"{problem}", source=f"--decoder-{'first' if first is not None else 'last'}-pipeline-num-layers")
    if (rest != 0) != (middle != 0) or (middle and rest % middle):
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
        return tuple(with_block(stages, model, recompute_num_layers)), chunks_vpp
    if flags.first is not None or flags.last is not None:
        if flags.account_embedding or flags.account_loss:
            raise SpecError(
                "--decoder-first/last-pipeline-num-layers cannot be combined with "
                "--account-for-embedding/loss-in-pipeline-split (Megatron-LM rejects it): pick one",
                source="--decoder-first-pipeline-num-layers",
            )
        stages = _stages_from_counts(_chunk_decoders(L, pp, vpp, flags.first, flags.last))
        return tuple(with_block(stages, model, recompute_num_layers)), vpp
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
        return tuple(with_block(_stages_from_counts(counts), model, recompute_num_layers)), vpp
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
    return tuple(with_block(stages, model, recompute_num_layers))


def with_block(stages: list[Stage], model: ModelSpec, n: int) -> list[Stage]:
    if n <= 0:
        return stages
    out = []
    for s in stages:
        out.append(dataclasses.replace(s, full_recompute_layers=min(n, model.decoders_between(s.start, s.stop))))
    return out

