"""Rendering: terminal tables, pipeline Gantt charts, plan comparisons, cost-study reports."""
