"""Plan -> launcher command per framework, and launcher command -> plan facts. Emitters are pure
functions of a Plan and decide nothing."""

from autoshard.emit.megatron.script import megatron_command, megatron_notes, megatron_script
from autoshard.emit.megatron.parse import ParsedMegatron, parse_megatron
from autoshard.emit.serve_parse import ParsedServe, parse_vllm
from autoshard.emit.sglang import sglang_command, sglang_node_commands
from autoshard.emit.vllm import vllm_command, vllm_node_commands

__all__ = [
    "ParsedMegatron", "ParsedServe", "megatron_command", "megatron_notes", "megatron_script", "parse_megatron",
    "parse_vllm", "sglang_command", "sglang_node_commands", "vllm_command", "vllm_node_commands",
]
