"""Plan -> launcher command per framework, and launcher command -> plan facts. Emitters are pure
functions of a Plan and decide nothing."""

from autoshard.emit.megatron import megatron_command, megatron_notes, megatron_script
from autoshard.emit.megatron_parse import ParsedMegatron, parse_megatron

__all__ = ["ParsedMegatron", "megatron_command", "megatron_notes", "megatron_script", "parse_megatron"]
