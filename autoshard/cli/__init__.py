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

from autoshard.cli.app import app, flush_stdout
from autoshard.cli.options import mark_process_start

__all__ = ["app", "main"]


def main() -> None:
    mark_process_start()
    if sys.stdout is None:  # started with stdout closed (`autoshard ... >&-`)
        print("error (bad input): standard output is closed: give the command somewhere to print", file=sys.stderr)
        raise SystemExit(2)
    try:
        app()
    finally:
        flush_stdout()


if __name__ == "__main__":
    main()
