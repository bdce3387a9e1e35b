"""The cost-study half of the public API (re-exported by `autoshard.api`): `study` solves every
(cluster kind, GPU count) and prices it (`autoshard.study.run`), `write_study` writes the output set as
one set, `study_json` is the `--json` object. `autoshard.api` takes the serving fronts
(`serve_study_fronts`, `render_fronts`), the renderer (`render_study`) and `check_output_dir` (the one check of
every output directory) straight from `autoshard.study`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autoshard.study import run as _run
from autoshard.study.costs import StudyResult
from autoshard.study.files import write_study_set
from autoshard.study.front import ClusterFront, FrontsWriter, fronts_json

__all__ = ["study", "write_study", "study_json", "StudyResult", "ClusterFront"]


def study(model: Any, clusters: Sequence[Any], sizes: Sequence[int], **kwargs: Any) -> StudyResult:
    """`autoshard.study.run.run_study` (same arguments): the best plan per cluster kind and size, with
    days, dollars and the answers a buyer wants first."""
    return _run.run_study(model, clusters, sizes, **kwargs)


def write_study(result: StudyResult, out_dir: Path, extra: Sequence[Callable[[Path], Path]] = ()) -> list[Path]:
    """Write study.csv, study.md, pareto.png and study.json (and what the `extra` writers add, e.g. the
    serving fronts' PNG) to `out_dir` as one set; the paths written. The fronts' `FrontsWriter` also puts
    them into study.json (`serve_front`, as `--json` has it)."""
    fronts = [w for w in extra if isinstance(w, FrontsWriter)]
    if fronts:
        result.serve_front = [f for w in fronts for f in w.json()]
    return write_study_set(result, out_dir, extra=[w for w in extra if not isinstance(w, FrontsWriter) or w.fronts])


def study_json(result: StudyResult, fronts: list[ClusterFront] | None, tpot_ms: float | None,
               written: Sequence[Path]) -> dict[str, Any]:
    """The `study --json` object: the study, the serving fronts when studied, the files written."""
    if fronts is not None:
        result.serve_front = fronts_json(fronts, tpot_ms / 1e3 if tpot_ms else None)
    obj = result.to_json()
    if written:
        obj["files"] = [str(p) for p in written]
    return obj
