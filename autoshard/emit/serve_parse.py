"""The serving parsers' former module, kept so existing imports work. The parsers now sit beside their
launchers: `autoshard.emit.vllm.parse` (`parse_vllm`), `autoshard.emit.sglang.parse` (`parse_sglang`);
`ParsedServe` and the reading they share are in `autoshard.emit.serve_args`. New code imports from there.
"""

from autoshard.emit.serve_args import ParsedServe, kv_cache_dtype_of, weight_dtype_of
from autoshard.emit.sglang.parse import parse_sglang
from autoshard.emit.vllm.flags import REMOVED, VLLM_VERSION
from autoshard.emit.vllm.parse import parse_vllm

__all__ = ["ParsedServe", "parse_vllm", "parse_sglang", "VLLM_VERSION", "REMOVED", "weight_dtype_of",
           "kv_cache_dtype_of"]
