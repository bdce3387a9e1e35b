"""The `autoshard` command line. Parses, calls the API (`autoshard.api`), renders (`autoshard.report`),
sets exit codes; computes nothing.

Exit codes: 0 success, 1 no feasible plan (or the solver gave none), 2 bad input.

One module per concern: `app` (the Typer app, consoles, error guard), `options` (shared option types
and checks), `solve` (`solve`, training and --from-megatron), `serve` (the serving paths of `solve`
and `evaluate`), `evaluate`, `study`, `catalog` (`models`, `clusters`). Importing them registers the
commands, in the order `--help` lists them.
"""

from autoshard.cli import solve, evaluate, study, catalog  # noqa: F401, I001  (registers the commands, in this order)
import sys

import typer

from autoshard.cli.app import app, flush_stdout, usage_error_json
from autoshard.cli.options import mark_process_start

__all__ = ["app", "main"]


def main() -> None:
    mark_process_start()
    if sys.stdout is None:  # started with stdout closed (`autoshard ... >&-`)
        print("error (bad input): standard output is closed: give the command somewhere to print", file=sys.stderr)
        raise SystemExit(2)
    try:
        code = _run(sys.argv[1:])
    finally:
        flush_stdout()
    raise SystemExit(code)


def _run(argv: list[str]) -> int:
    """The app as Typer's standalone mode runs it, except that a command line the parser refuses (an
    unknown option, `--time-limit nan`) under `--json` also prints the one JSON object `--json` promises
    (`usage_error_json`) beside the parser's message."""
    # click's ClickException, from Typer's own copy of click or click itself, whichever Typer uses
    click_exception = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        rv = app(args=argv, standalone_mode=False)
    except click_exception as exc:
        usage_error_json(exc, argv)
        exc.show()
        return exc.exit_code
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        return 1
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    main()
