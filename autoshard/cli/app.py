"""The `autoshard` Typer application, its two consoles and the error guard every command runs under."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from autoshard.errors import AutoshardError, SpecError

app = typer.Typer(
    name="autoshard",
    help="Plan how to split LLM training and serving across GPUs: the best parallel layout, its "
    "predicted speed and memory, and the command that launches it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)


def _fail(exc: AutoshardError) -> None:
    kind = "bad input" if isinstance(exc, SpecError) else "no plan"
    err.print(f"[bold red]error ({kind}):[/bold red] {escape(str(exc))}", markup=True, highlight=False)
    raise typer.Exit(exc.exit_code)


NOTES: list[str] = []
"""The warnings shown while the current command runs (the importer's notes), which `--json` output
carries under "warnings" too (cli.options.print_json)."""


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A warning as one `warning:` line on stderr, like the commands' own (not Python's file:line echo
    of the source line that raised it)."""
    NOTES.append(str(message))
    err.print(f"[yellow]warning:[/yellow] {escape(str(message))}", highlight=False)


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every AutoshardError into its message and exit code, never a traceback; warnings raised
    while the command runs (the Hugging Face importer's notes) print as `warning:` lines."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        NOTES.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("default", UserWarning)  # each note once, whatever the caller's filters
            warnings.showwarning = _show_warning
            try:
                _finite_options(kwargs)
                return fn(*args, **kwargs)
            except AutoshardError as exc:
                _fail(exc)

    return wrapper


def _finite_options(kwargs: dict[str, Any]) -> None:
    """NaN and infinities pass click's range checks (every comparison with NaN is false): refuse them."""
    for name, value in kwargs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"{value} is not a finite number: give a number", source="--" + name.replace("_", "-"))


def _version(value: bool) -> None:
    if value:
        from autoshard import __version__

        print(f"autoshard {__version__}")
        raise typer.Exit(0)


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """autoshard: parallelism planner for LLM training and serving."""
