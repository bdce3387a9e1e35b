"""A cost study's output set on disk: study.csv, study.md, pareto.png and study.json written as one set
(`write_study_set`), and the check that an output directory (`study --out` and the other commands' `-o`/`--out`) can receive
it before any solving starts."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from autoshard.errors import SpecError
from autoshard.study import report
from autoshard.study.costs import StudyResult

__all__ = ["STUDY_DIR", "STUDY_FILES", "check_output_dir", "write_study_set"]

STUDY_FILES = ("study.csv", "study.md", "pareto.png", "study.json")
"""The set `--out` holds, in the order it is moved into place: study.json last, so a set without it is
not a complete study."""
STUDY_DIR = f"the directory for {', '.join(STUDY_FILES)}"
"""The role of `study --out` in check_output_dir's messages."""


def check_output_dir(path: Path, source: str, what: str) -> None:
    """Refuse, before any solving, a directory an output goes to that cannot be made or written: a file
    in its place or on its path, a nearest existing directory that is not writable, or one that takes no
    files (a temporary directory is created and removed in it: root passes os.access on /proc). Missing
    directories are created when the output is written. The one check behind `-o` (the launch script's
    directory), `--emit k8s -o DIR`, `solve --pareto --out DIR` and `study --out DIR`; `what` names the
    directory's role in the message."""
    where = str(path)[:200]
    try:
        existing = next(p for p in (path, *path.parents) if p.exists())
        if existing == path and not path.is_dir():
            raise SpecError(f"{where} is a file, not a directory ({what}): choose another path", source=source)
        if not existing.is_dir():
            raise SpecError(f"{str(existing)[:200]} is a file, not a directory, so {where} cannot be created ({what}): "
                            "choose another path", source=source)
        if not os.access(existing, os.W_OK | os.X_OK):
            raise SpecError(f"{str(existing)[:200]} is not writable ({what} {where}): choose a path you can write to",
                            source=source)
        os.rmdir(tempfile.mkdtemp(prefix=".autoshard-probe-", dir=existing))
    except OSError as exc:
        raise SpecError(f"cannot write {where} ({what}): {exc.strerror}: choose another path", source=source) from None


def write_study_set(result: StudyResult, out_dir: Path, extra: Sequence[Callable[[Path], Path]] = ()) -> list[Path]:
    """Write study.csv, study.md, pareto.png and study.json as one set: all of them go to a temporary
    directory beside `out_dir` first. A new (or empty) `out_dir` is then that directory renamed, in one
    step; into an existing one the files are moved one by one with study.json, the marker of a complete
    set, removed first and moved last. An interruption leaves either no new set or one without its
    study.json, never one that looks complete. `extra` writers add files (e.g. serving fronts) to the set."""
    check_output_dir(out_dir, "--out", STUDY_DIR)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as exc:  # the directory went away or turned read-only while the study ran
        raise SpecError(f"cannot write the study to {str(out_dir)[:200]}: {exc.strerror}", source="--out") from None
    try:
        written = {p.name for p in report.write_outputs(result, tmp)}
        assert written == set(STUDY_FILES), written
        names = [*(write(tmp).name for write in extra), *STUDY_FILES]
        if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
            os.replace(tmp, out_dir)  # rename(2) replaces an empty directory atomically
        else:
            (out_dir / "study.json").unlink(missing_ok=True)
            for name in names:  # study.json last
                os.replace(tmp / name, out_dir / name)
    except OSError as exc:
        raise SpecError(f"cannot write the study to {str(out_dir)[:200]}: {exc.strerror}", source="--out") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [out_dir / name for name in names]
