"""ServePlan -> a bash script that launches the deployment with vLLM or SGLang, one `if` per node."""

from __future__ import annotations

from autoshard.emit.sglang import sglang_node_commands
from autoshard.emit.shell import comment
from autoshard.emit.vllm import vllm_node_commands
from autoshard.serve_plan import ServePlan

__all__ = ["serve_script"]


def serve_script(plan: ServePlan, launcher: str) -> str:
    """The script for `launcher` ("vllm" or "sglang"): every word the commands interpolate is quoted by
    the emitters, the header is one comment line, and a multi-node deployment picks its line by
    $NODE_RANK."""
    commands = vllm_node_commands(plan) if launcher == "vllm" else sglang_node_commands(plan)
    if len(commands) == 1:
        body = commands[0] + "\n"
    else:
        body = "".join(f'if [ "${{NODE_RANK:?set NODE_RANK}}" = {i} ]; then\n  {cmd}\nfi\n'
                       for i, cmd in enumerate(commands))
    header = comment(f"# {launcher} deployment of {plan.model.name} on {plan.num_gpus} GPUs ({plan.describe()}), "
                     "written by autoshard.")
    return f"#!/usr/bin/env bash\n{header}\nset -euo pipefail\n" + body
