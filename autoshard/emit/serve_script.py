"""ServePlan -> a bash script that launches the deployment with vLLM or SGLang, one `if` per node."""

from __future__ import annotations

from autoshard.emit.sglang import sglang_node_commands
from autoshard.emit.shell import comment
from autoshard.emit.vllm import vllm_node_commands
from autoshard.plans.serve import ServePlan
from autoshard.specs.job import WeightDtype

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
    header = [f"# {launcher} deployment of {plan.model.name} on {plan.num_gpus} GPUs ({plan.describe()}), "
              "written by autoshard."]
    ckpt = plan.checkpoint
    if ckpt is not None:
        header.append(f"# Weights: the published {ckpt.weights.value} checkpoint {ckpt.repo}.")
    elif plan.job.weight_dtype is WeightDtype.FP8:
        header.append(f"# Weights: no published fp8 checkpoint is named for {plan.model.name}; {launcher} quantizes "
                      "the BF16 weights to fp8 online, while loading.")
    if launcher == "sglang" and len(commands) > 1 and plan.engine_gpus <= plan.pool.node.gpus_per_node:
        header.append(f"# {len(commands)} independent SGLang servers, one per node (SGLang runs --dp-size on one node "
                      "only): put a router in front of them, e.g. python -m sglang_router.launch_router --worker-urls ...")
    lines = "\n".join(comment(h) for h in header)
    return f"#!/usr/bin/env bash\n{lines}\nset -euo pipefail\n" + body
