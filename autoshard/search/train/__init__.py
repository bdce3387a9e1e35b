"""Training search: from a model, a cluster and a job to the best plans, with a certificate.

Which file owns what:
- options.py: the solve's options (SolverOptions: time limit, workers, seed, gap, memory headroom).
- space.py: the candidate space (every legal TP/CP/PP/VPP/DP/EP/ETP/micro-batch/recompute/ZeRO tuple,
  each discarded one with its reason) and the user's pins.
- tables.py: per-candidate integer tables (prefix sums of time, memory, parameters and DP traffic).
- bounds.py: lower bounds on a candidate's objective over every layout (the entry the rest call);
  bounds_rank.py one pool's per-rank bounds, bounds_mixed.py models with differing layers,
  bounds_pools.py heterogeneous clusters (which pool each rank runs on).
- assign.py: heterogeneous clusters, one candidate per rank -> pool assignment.
- incumbents.py: good feasible layouts built before CP-SAT (the solver's hint).
- prepare.py: enumerate, bound, tabulate and build incumbents best-first, pruning with a reason (Prepared).
- build.py: the CP-SAT model over the surviving candidates.
- result.py: a solved candidate decoded into a plan; the message when nothing fits.
- solve.py: the orchestration (solve_train): prepare, build, solve, decode, re-check in floats.
- layout.py: the search on a layout the user fixed (Megatron-LM layout flags).
"""
