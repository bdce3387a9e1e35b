"""A Megatron-LM launch -> its `pretrain_*.py` flags, read as Megatron-LM's argparse reads them: exact
names (no abbreviations), `--flag=value` and `--flag value`, switches, fixed and open value counts; the
last of a repeated flag wins. Unknown, removed and deprecated flags become warnings that name the fix.
`read_text` takes a command line or the path of a launch script (at most MAX_SCRIPT_BYTES).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import autoshard.emit.megatron.flags as mf
from autoshard.emit.megatron.flags_retired import DEPRECATED, REMOVED
from autoshard.errors import SpecError

__all__ = ["Flags", "MAX_SCRIPT_BYTES", "read_text", "read_flags", "is_option", "canonical"]

Flags = dict[str, list[str]]

MAX_SCRIPT_BYTES = 1 << 20


def read_text(command_or_path: str) -> tuple[str, str]:
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
            except UnicodeDecodeError:
                raise SpecError("the launch script is not UTF-8 text: give the shell script or the command line",
                                source=str(path)) from None
            except OSError as exc:
                raise SpecError(f"cannot read the launch script ({exc.strerror})", source=str(path)) from None
        try:
            is_dir = path.is_dir()
        except (OSError, ValueError):
            is_dir = False
        if is_dir:
            raise SpecError("this is a directory, not a launch script: give the script inside it, or the command "
                            "itself", source=str(path))
        if " " not in text and (path.suffix in (".sh", ".bash") or "/" in text):
            raise SpecError(
                f"file not found: {text} (give the path of a launch script, or the command itself)"
            )
    return command_or_path, "megatron command"


def canonical(flag: str) -> str:
    """The primary spelling of `flag` (itself unless it is a plain alias)."""
    return mf.ALIASES.get(flag, flag)


def is_option(word: str) -> bool:
    if not word.startswith("-") or len(word) < 2:
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def read_flags(args: list[str], warnings: list[str]) -> Flags:
    flags: Flags = {}
    known = sorted(f for f in mf.KNOWN)
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not is_option(word):
            warnings.append(f"ignored stray argument '{word}' (Megatron-LM takes no positional arguments)")
            continue
        name, eq, inline = word.partition("=")
        if name not in mf.KNOWN:
            if name in REMOVED:
                warnings.append(f"{name} is not a Megatron-LM flag any more: {REMOVED[name]}")
            else:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
                hint = f" (did you mean {close[0]}?)" if close else ""
                warnings.append(f"{name} is not a Megatron-LM flag{hint}; ignored")
            if not eq and i < len(args) and not is_option(args[i]):
                i += 1  # its value
            continue
        if name in DEPRECATED:
            warnings.append(f"{name} is deprecated: {DEPRECATED[name]}")
        primary = canonical(name)
        if primary in mf.NO_VALUE or name in mf.NEGATIONS:
            if eq:
                warnings.append(f"{name} takes no value (got '={inline}'); the value was ignored")
            values: list[str] = []
        elif eq:
            values = [inline]
        elif primary in mf.ONE_VALUE:
            if i < len(args) and not is_option(args[i]):
                values = [args[i]]
                i += 1
            else:  # argparse: "expected one argument"
                raise SpecError(f"{name} expects a value: give it one or drop the flag", source=name)
        else:
            want = mf.FIXED_NARGS.get(primary)
            values = []
            while i < len(args) and not is_option(args[i]) and (want is None or len(values) < want):
                values.append(args[i])
                i += 1
        if primary in flags:
            warnings.append(f"{name} is given more than once; the last one wins (as in Megatron-LM)")
        flags[primary] = values
    return flags

