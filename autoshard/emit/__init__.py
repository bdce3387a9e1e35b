"""Plan -> launcher command per framework, and launcher command -> plan facts. Emitters are pure
functions of a Plan and decide nothing.

One sub-package per engine, its launcher and its parser side by side (a new engine gets its own
`<engine>/command.py` + `<engine>/parse.py`, and a branch in the serving deployments below):
- megatron/: Megatron-LM training launch and its parser (its __init__ lists the files).
- vllm/: `vllm serve` lines (command.py), their parser (parse.py), vLLM's flag vocabulary (flags.py).
- sglang/: `sglang.launch_server` lines (command.py) and their parser (parse.py).
Serving deployments, for any engine:
- serve_script.py: the bash script that launches an aggregated serving plan, one `if` per node.
- pd.py: prefill/decode disaggregation: instance placement, per-instance lines, the router, the script.
- k8s.py: Kubernetes manifests (Deployments, LeaderWorkerSets, Services, the P/D router).
Shared:
- serve_args.py: `ParsedServe` and the command-line reading both serving parsers share.
- shell.py: shell quoting for everything emitted, and the launch-script reader the parsers use.
"""

from autoshard.emit.k8s import k8s_manifests, k8s_yaml
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.parse import ParsedMegatron, parse_megatron
from autoshard.emit.megatron.script import megatron_notes, megatron_script
from autoshard.emit.pd import pd_commands, pd_script
from autoshard.emit.serve_args import ParsedServe
from autoshard.emit.serve_script import serve_script
from autoshard.emit.sglang import parse_sglang, sglang_command, sglang_node_commands
from autoshard.emit.vllm import parse_vllm, vllm_command, vllm_node_commands

__all__ = [
    "ParsedMegatron", "ParsedServe", "megatron_command", "megatron_notes", "megatron_script",
    "parse_megatron", "parse_vllm", "sglang_command", "sglang_node_commands", "vllm_command",
    "vllm_node_commands", "parse_sglang", "serve_script", "pd_commands", "pd_script", "k8s_manifests",
    "k8s_yaml",
]
