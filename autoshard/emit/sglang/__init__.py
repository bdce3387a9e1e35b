"""SGLang: the `sglang.launch_server` launcher and its parser, side by side.

- command.py: ServePlan -> SGLang launch lines, one per node (`sglang_node_commands`, `sglang_command`);
  `mem_fraction_static` (and back, `sglang_memory_utilization`) and SGLang's quantization / KV-cache names.
- parse.py: an SGLang launch line -> `ParsedServe` in vLLM's terms (`parse_sglang`).
"""

from autoshard.emit.sglang.command import (
    DIST_INIT_PORT,
    SGLANG_DEEPEP_ENV,
    SGLANG_KV_CACHE_DTYPE,
    SGLANG_QUANTIZATION,
    mem_fraction_static,
    runs_deepep,
    sglang_command,
    sglang_deepep_seqs,
    sglang_env,
    sglang_fp8_problem,
    sglang_memory_utilization,
    sglang_node_commands,
)
from autoshard.emit.sglang.parse import SGLANG_VERSION, parse_sglang, sglang_nodes

__all__ = ["sglang_command", "sglang_node_commands", "mem_fraction_static", "SGLANG_QUANTIZATION",
           "SGLANG_KV_CACHE_DTYPE", "DIST_INIT_PORT", "SGLANG_DEEPEP_ENV", "runs_deepep", "sglang_deepep_seqs",
           "sglang_env", "sglang_fp8_problem", "sglang_memory_utilization", "parse_sglang", "SGLANG_VERSION",
           "sglang_nodes"]
