"""The `autoshard` command line. Parses, calls the API (`autoshard.api`), renders (`autoshard.report`),
sets exit codes; computes nothing.

Exit codes: 0 success, 1 no feasible plan (or the solver gave none), 2 bad input.

One module per concern: `app` (the Typer app, consoles, error guard), `options` (shared option types
and checks), `solve` (`solve`, training and --from-megatron), `serve` (the serving paths of `solve`
and `evaluate`), `evaluate`, `study`, `catalog` (`models`, `clusters`). Importing them registers the
commands, in the order `--help` lists them.
"""

from autoshard.cli import solve, evaluate, study, catalog  # noqa: F401, I001  (registers the commands, in this order)
from autoshard.cli.app import app
from autoshard.cli.options import mark_process_start

__all__ = ["app", "main"]


def main() -> None:
    mark_process_start()
    app()


if __name__ == "__main__":
    main()
