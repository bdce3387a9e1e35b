"""Megatron-LM: the training launcher and its parser, side by side.

Plan -> launch (the emitter):
- args.py: every `pretrain_gpt.py` flag of a plan, in launch order (`megatron_args`), layout flags included.
- network_args.py: the model's shape, MoE and MTP flags; rope.py: its RoPE base, fraction and scaling flags.
- command.py: the `torchrun ... pretrain_gpt.py` command line (`megatron_command`), launch geometry.
- script.py: the multi-node bash script (`megatron_script`) and what the launch cannot say (`megatron_notes`).
Launch -> plan facts (the parser):
- parse.py: a command line or launch script -> `ParsedMegatron` (`parse_megatron`), `model_shape_differences`.
- cmdline.py: the command line / script text -> flag dict, read as Megatron-LM's argparse reads it.
- model_args.py: flags -> ModelSpec, with Megatron-LM's defaults (`FlagReader`, `build_model`).
- plan_facts.py: flags -> parallel dims, precision, recompute, ZeRO stage, VPP, layout.
Both ways:
- layout.py: pipeline layouts: layout flags <-> stages (`layout_stages`, `predict_layout`, `default_stages`).
- flags.py: Megatron-LM's flag table (data), the only names the emitter writes and the parser accepts.
- flags_retired.py: deprecated and removed flags, with what to write instead (data).
"""

from autoshard.emit.megatron.args import megatron_args
from autoshard.emit.megatron.command import megatron_command
from autoshard.emit.megatron.parse import ParsedMegatron, model_shape_differences, parse_megatron
from autoshard.emit.megatron.script import megatron_notes, megatron_script

__all__ = ["megatron_args", "megatron_command", "megatron_notes", "megatron_script", "ParsedMegatron",
           "parse_megatron", "model_shape_differences"]
