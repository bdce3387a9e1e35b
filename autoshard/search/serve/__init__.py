"""Serving search: from a model, a cluster and a serving job to the best deployments.

Which file owns what:
- space.py: the candidate engines (vLLM-legal TP, PP, EP, attention DP, each dropped one with its
  reason) and their table rows at a ladder of concurrencies (Engine, Row, enumerate_serve, tabulate).
- disagg.py: prefill and decode instance tables for disaggregated (xPyD) deployments.
- model.py: the CP-SAT model over aggregated rows and prefill/decode pairs alike.
- result.py: serving plans from the solver's pick (the xPyD plan recomputed in floats).
- messages.py: what to say when no serving plan exists (needed, available, nearest fix).
- evaluate.py: predicting a serving configuration the user already has.
- front.py: the Pareto front of tokens/s per GPU against tokens/s per user.
- solve.py: the entries (solve_serve, evaluate_serve, model_for_path): tabulate, solve, decode.
"""

from autoshard.search.serve.solve import evaluate_serve, solve_serve

__all__ = ["evaluate_serve", "solve_serve"]
