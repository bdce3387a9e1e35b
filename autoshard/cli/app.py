"""The `autoshard` Typer application, its two consoles and the error guard every command runs under."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from autoshard.errors import AutoshardError, SolverError, SpecError

app = typer.Typer(
    name="autoshard",
    help="Plan how to split LLM training and serving across GPUs: the best parallel layout, its "
    "predicted speed and memory, and the command that launches it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
class _StdoutConsole(Console):
    """Rich's console for stdout, except that a reader that went away (`| head`) ends the command with
    exit 0, not rich's 1 (which the exit codes reserve for "no feasible plan")."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _quiet_stdout()
        raise SystemExit(0)

    def _check_buffer(self) -> None:  # rich handles only BrokenPipeError here: a full device, too
        try:
            super()._check_buffer()
        except OSError as exc:
            del self._buffer[:]
            self.quiet = True
            _stdout_gone(exc)


out = _StdoutConsole(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)
report_err = Console(stderr=True, soft_wrap=False)
"""Where a report goes when --emit writes its script to stdout: stderr, wrapped to the terminal like
`out` (with `err`'s soft wrap a panel's long lines were cut at its border)."""


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


JSON_PRINTED: list[bool] = []
"""Set by cli.options.print_json when the current command has printed its JSON object."""


def _no_plan_json(exc: AutoshardError, kwargs: dict[str, Any], command: str, wall_s: float) -> None:
    """`--json` that ends without a result still prints its one JSON object (ARCHITECTURE: exactly one):
    the status ("invalid": bad input, exit 2; "infeasible": no plan fits, exit 1; "unknown": the time
    limit ran out before any plan was found, exit 1), no plan or prediction, the `solver` block with no
    objective, and the message stderr shows under "error". `study` prints its own schema's object."""
    status = "invalid" if isinstance(exc, SpecError) else "unknown" if isinstance(exc, SolverError) else "infeasible"
    if command == "study":
        obj: dict[str, Any] = {"schema": "autoshard.study/v1", "status": status,
                               "mode": str(kwargs.get("mode", "train")), "rows": [], "warnings": list(NOTES),
                               "error": str(exc)}
        sys.stdout.write(json.dumps(obj, indent=2) + "\n")
        return
    serve = str(kwargs.get("mode", "train")) == "serve" or any(kwargs.get(k) for k in ("from_vllm", "from_sglang"))
    model, cluster = kwargs.get("model"), kwargs.get("cluster")
    from_command = any(kwargs.get(k) is not None for k in ("from_megatron", "from_vllm", "from_sglang"))
    if cluster is None and from_command:
        model, cluster = None, model  # one positional is the cluster when the command names the model
    gpus = kwargs.get("gpus")
    if gpus is None and cluster is not None and not from_command:  # a command's own process count decides there
        try:  # the cluster's own size, as the plan's num_gpus would be
            from autoshard.api import load_cluster

            gpus = load_cluster(cluster).num_gpus
        except AutoshardError:
            gpus = None
    obj = {"schema": "autoshard.plan/v1", "status": status, "mode": "serve" if serve else "train", "model": model,
           "cluster": cluster, "num_gpus": gpus, "plan": None, "predicted": None, "launch": {},
           "solver": {"status": status, "wall_s": wall_s, "objective": None, "bound": None, "gap": None},
           "warnings": list(NOTES), "error": str(exc)}
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def usage_error_json(exc: Exception, argv: list[str]) -> None:
    """A command line the parser refused before the command ran: under `--json` (solve, evaluate, study)
    the one JSON object too, status "invalid", with the parser's message."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if "--json" not in argv or command not in ("solve", "evaluate", "study"):
        return
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    mode = next((v.split("=", 1)[1] for v in argv if v.startswith("--mode=")), None)
    mode = mode or next((argv[i + 1] for i, v in enumerate(argv[:-1]) if v == "--mode"), "train")
    _no_plan_json(SpecError(message), {"json_out": True, "mode": mode}, command, 0.0)


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every AutoshardError into its message and exit code, never a traceback; warnings raised
    while the command runs (the Hugging Face importer's notes) print as `warning:` lines."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        NOTES.clear()
        JSON_PRINTED.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("default", UserWarning)  # each note once, whatever the caller's filters
            warnings.showwarning = _show_warning
            started = time.monotonic()
            try:
                return fn(*args, **kwargs)
            except AutoshardError as exc:
                if kwargs.get("json_out") and fn.__name__ in ("solve", "evaluate", "study") and not JSON_PRINTED:
                    _no_plan_json(exc, kwargs, fn.__name__, time.monotonic() - started)
                _fail(exc)

    return wrapper


def _stdout_gone(exc: OSError) -> None:
    """Stdout cannot take the output. A reader that went away (EPIPE: `| head` read what it wanted) ends
    the command quietly, exit 0; anything else is said on stderr, exit 2. Stdout then goes to /dev/null so
    that Python's flush at exit has nothing left to fail on."""
    _quiet_stdout()
    if exc.errno == errno.EPIPE:
        raise typer.Exit(0)
    err.print(f"[bold red]error (bad input):[/bold red] cannot write the output to standard output: "
              f"{escape(exc.strerror or str(exc))}: print to a file or a pipe that reads it", markup=True, highlight=False)
    raise typer.Exit(2)


def write_stdout(text: str) -> None:
    """Write the command's output to stdout; a stdout that cannot take it ends the command (`_stdout_gone`)."""
    try:
        sys.stdout.write(text)
    except OSError as exc:
        _stdout_gone(exc)


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def flush_stdout() -> None:
    """Flush stdout at the end of the command (`cli.main`): what is still buffered fails here when the
    reader went away or the device is full, which Python would report as an ignored exception with exit
    120 (`_stdout_gone` says what happened and sets the exit code)."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as exc:
        try:
            _stdout_gone(exc)
        except typer.Exit as done:
            raise SystemExit(done.exit_code) from None


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
