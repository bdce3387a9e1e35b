"""Rendering for the terminal: reads plans and predictions, computes nothing new. One file per view:

- terminal.py: the training plan (headline, degrees, layers per stage, schedule) and the catalogs.
- memory.py: a training plan's memory story (weights, gradients, optimizer, activations, headroom).
- gantt.py: the ASCII pipeline schedule (1F1B, interleaved).
- compare.py: your plan next to the best one (gain, memory, the launcher flags that change).
- serving.py: serving plans; disagg.py: a disaggregated plan's roles and KV hand-off.
- pareto.py: the serving Pareto front (table, SLA cuts, PNG).
- fit.py: table and command wrapping so every view fits 80 columns.

Cost-study tables and files are rendered in `autoshard.study.report`, beside the study.
"""
