"""Cost studies: the best plan for every (cluster kind, GPU count), what it costs in days and dollars,
and the answers a buyer wants first. One file per concern:

- `run.py`: `run_study`, the orchestration (inputs checked, sizes solved, rows, answers, notes);
- `runner.py`: the worker processes that solve one (cluster, size) each through the search layer;
- `costs.py`: the rows, the cost arithmetic and the answers (cheapest within a deadline, fastest
  within a budget, the Pareto front);
- `front.py`: the serving Pareto fronts across GPU types and prices (`study --mode serve`);
- `report.py`: the terminal table, CSV, JSON, Markdown and the Pareto PNG;
- `files.py`: the output set written to --out as one set.

The package sits below the API: it imports search, plans, costmodel, specs and report, never
`autoshard.api` or `autoshard.cli`; `autoshard.api.study` is its public entry.
"""

from autoshard.study.run import run_study

__all__ = ["run_study"]
