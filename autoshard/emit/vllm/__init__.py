"""vLLM: the `vllm serve` launcher and its parser, side by side.

- command.py: ServePlan -> `vllm serve` command lines, one per node (`vllm_node_commands`, `vllm_command`);
  the weight/KV dtype rules (`VLLM_QUANTIZATION`, `vllm_quantization`, `no_checkpoint`).
- parse.py: a `vllm serve` command line -> `ParsedServe` (`parse_vllm`), the backend it is priced on.
- context.py: the max model length such a line starts with (`start_context`), and the relaunch lines
  carrying its --hf-overrides (`carry_overrides`).
- flags.py: vLLM 0.33.0's flag vocabulary (data), which the parser reads with.
"""

from autoshard.emit.vllm.command import (
    DP_RPC_PORT,
    HEAD_ADDRESS,
    MASTER_PORT,
    VLLM_KV_CACHE_DTYPE,
    VLLM_QUANTIZATION,
    check_checkpoint,
    native_checkpoint,
    no_checkpoint,
    serve_weight_dtype,
    vllm_command,
    vllm_node_commands,
    vllm_quantization,
)
from autoshard.emit.vllm.flags import VLLM_VERSION
from autoshard.emit.vllm.context import carry_overrides, start_context
from autoshard.emit.vllm.parse import ParsedVllm, backend_role, parse_vllm, window_switches

__all__ = ["vllm_command", "vllm_node_commands", "vllm_quantization", "no_checkpoint", "check_checkpoint", "VLLM_QUANTIZATION",
           "VLLM_KV_CACHE_DTYPE", "HEAD_ADDRESS", "DP_RPC_PORT", "MASTER_PORT", "parse_vllm", "VLLM_VERSION", "native_checkpoint", "serve_weight_dtype",
           "backend_role", "start_context", "carry_overrides", "ParsedVllm", "window_switches"]
