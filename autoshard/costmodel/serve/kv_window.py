"""The KV cache of sliding-window layers (`LayerGroup.attention_window`) as vLLM 0.33.0 and SGLang 0.5.23
allocate it, and the window's bound on attention work.

vLLM 0.33.0 (hybrid KV-cache manager, on by default on GPUs):

- Layers are bucketed by KV spec (full attention; sliding window w, one bucket per w) and split into KV-cache
  groups of equal size G: the smallest bucket's layer count, or the largest's where that is under 1.5 x the
  smallest; a bucket of n layers makes ceil(n / G) groups, the last padded (`_get_kv_cache_groups_uniform_page_size`,
  vllm/v1/core/kv_cache_planning.py:416-556; Gemma-3-27B: 10 full, 52 sliding -> G 10, 1 + 6 groups, 8 padding
  layers, "may waste at most 15.38% KV cache memory"). All groups draw blocks from one pool whose block holds G
  layers' pages (`get_kv_cache_config_from_groups`, :642-690: num_blocks = memory // bytes_per_block).
- A full group holds cdiv(tokens, block) blocks for a request. A sliding group's reservation is capped at
  cdiv(min(w - 1 + in_flight, max_model_len), block) + 1 (`SlidingWindowSpec.max_admission_blocks_per_request`,
  vllm/v1/kv_cache_interface.py:918-944: the last w - 1 computed tokens plus the tokens of the batches in flight,
  whose blocks are freed only once processed; +1 because the window need not start on a block boundary), and the
  scheduler admits a request against min(cdiv(tokens, block), that cap) per sliding group
  (`SingleTypeKVCacheManager.get_num_blocks_to_allocate` with apply_admission_cap, single_type_kv_cache_manager.py:
  213-226; kv_cache_manager.py:531-547). in_flight = max_concurrent_batches x max_num_batched_tokens
  (`VllmConfig.max_in_flight_tokens`, config/vllm.py:600-609), max_concurrent_batches = PP + 1 under async
  scheduling (the default, config/vllm.py:588-598 and 1685-1719). The start check and the logged "Maximum
  concurrency" count max_model_len with the cap alone, cdiv(min(w - 1 + in_flight, M), block) + 1 blocks per sliding
  group (`get_max_concurrency_for_kv_cache_config`, kv_cache_utils.py:1061-1093; `max_memory_usage_bytes`).
  So at 32k tokens, window 1,024 and an 8,192-token step, a sliding group holds 1,089 blocks of 16 to a full group's
  2,048, not 65: the in-flight reservation, not the window, bounds it.

SGLang 0.5.23 has a separate SWA pool (`--swa-full-tokens-ratio`, "the ratio of SWA layer KV tokens / full layer KV
tokens", fallback 0.8: srt/arg_groups/fields/schedule.py:150-162; `SWAPrefillBudget`, mem_cache/prefill_budget.py)
only for the architectures `is_hybrid_swa_model` lists (configs/model_config.py:2651-2697: Llama 4, gpt-oss, Gemma 4,
...), and it turns it off for Gemma 2 and Gemma 3 (`disable_hybrid_swa_memory`, arg_groups/model_overrides/
gemma2_gemma3.py): for every family autoshard imports with a window (Gemma 2/3, Mistral, Mixtral, Phi-3, Qwen) its
pool stores every token in every layer, as full attention; the attention kernels still read only the window.

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from autoshard.costmodel.serve.config import pp_layer_split
from autoshard.errors import SpecError
from autoshard.specs.model import ModelSpec

__all__ = ["KVLayout", "vllm_kv_groups", "vllm_global_groups", "engine_stage_layouts",
           "mean_window_keys", "stage_windows", "without_windows"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vllm_kv_groups(windows: Sequence[int | None]) -> tuple[tuple[int | None, ...], int]:
    """(each KV-cache group's window, layers per group G) of vLLM's hybrid manager for these layers' windows."""
    buckets = Counter(windows)
    if len(buckets) == 1:
        ((window, count),) = buckets.items()
        return (window,), count
    lo, hi = min(buckets.values()), max(buckets.values())
    size = hi if hi < 1.5 * lo else lo
    groups = tuple(w for w, n in sorted(buckets.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))
                   for _ in range(math.ceil(n / size)))
    return groups, size


def vllm_global_groups(windows: Sequence[int | None]) -> tuple[tuple[int | None, tuple[int, ...]], ...]:
    """vLLM's KV-cache groups over the whole model's layers (all PP stages' specs merged,
    `get_global_kv_cache_groups`, kv_cache_planning.py:1609-1660): (window, the layer indices it holds) per group.
    Buckets in the order of their first layer; a bucket of n layers makes k = ceil(n / G) groups and group i takes
    its layers [i::k] (kv_cache_planning.py:528-555), so each group spans the whole depth of the model."""
    buckets: dict[int | None, list[int]] = {}
    for i, w in enumerate(windows):
        buckets.setdefault(w, []).append(i)
    _, size = vllm_kv_groups(windows)
    out: list[tuple[int | None, tuple[int, ...]]] = []
    for w, layers in buckets.items():
        k = _cdiv(len(layers), size)
        out.extend((w, tuple(layers[i::k])) for i in range(k))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """How an engine's KV pool holds one pipeline stage's layers: `groups` KV-cache groups (each one's window, None:
    full) of `group_layers` layers each, blocks of `block` tokens shared by all groups. A model without windows (or an
    engine that stores them whole) is one full group of all the stage's layers. Under pipeline parallelism the groups
    are the whole model's (`vllm_global_groups`, every one of them in a request's blocks) and `group_layers` the most
    layers any of them has on this stage: a pool block holds that many layers' pages (`_get_kv_cache_bytes_per_block`,
    kv_cache_planning.py:574-605, the largest projected group)."""

    groups: tuple[int | None, ...] = (None,)
    group_layers: int = 1
    block: int = 1
    in_flight: int = 0
    """Tokens scheduled but not yet freed, which a sliding group keeps beside its window (vLLM)."""
    max_model_len: int = 1

    @property
    def paged_layers(self) -> int:
        """Layers whose pages a pool block holds, across all groups (padding layers included)."""
        return len(self.groups) * self.group_layers

    def group_blocks(self, window: int | None, tokens: int, *, startup: bool = False) -> int:
        """Blocks one group holds for a request of `tokens` tokens: at admission (min of the need and the sliding
        cap), or `startup`: vLLM's start check and logged concurrency at max_model_len (the cap alone)."""
        need = _cdiv(tokens, self.block)
        if window is None:
            return need
        cap = _cdiv(min(window - 1 + self.in_flight, self.max_model_len), self.block) + 1
        return cap if startup else min(need, cap)

    @property
    def startup_blocks(self) -> int:
        """Blocks a max_model_len request holds over all groups by vLLM's start check."""
        return sum(self.group_blocks(w, self.max_model_len, startup=True) for w in self.groups)

    def pool_tokens(self, pool_blocks: float) -> float:
        """The KV cache size vLLM logs for a pool of `pool_blocks` blocks (`get_kv_cache_capacity`,
        kv_cache_utils.py:1120-1128): the max_model_len requests it holds times max_model_len."""
        return pool_blocks * self.max_model_len / self.startup_blocks

    def request_tokens(self, tokens: int, *, startup: bool = False) -> int:
        """A request's blocks over all groups, in the tokens of `pool_tokens` (a max_model_len request at start-up
        is max_model_len of them), rounded up to a token; a full-attention layout: the whole blocks of `tokens`."""
        blocks = sum(self.group_blocks(w, tokens, startup=startup) for w in self.groups)
        if not self.windowed:
            return blocks * self.block
        return _cdiv(blocks * self.max_model_len, self.startup_blocks)

    @property
    def windowed(self) -> bool:
        return any(w is not None for w in self.groups)


def stage_windows(model: ModelSpec, pp: int) -> list[tuple[int | None, ...]]:
    """The decoder windows of each pipeline stage, split as `serve.config.pp_layer_split` splits the layers."""
    out, start = [], 0
    for n in pp_layer_split(model.num_layers, pp):
        out.append(model.decoder_windows[start:start + n])
        start += n
    return out


def engine_stage_layouts(stages: Sequence[Sequence[int | None]], *, engine: str, block: int, in_flight: int,
                         max_model_len: int, pinned_blocks: bool = False, hybrid: bool = True) -> list[KVLayout]:
    """The KV layout of each pipeline stage (its layers' windows in `stages`). vLLM 0.33.0 groups the whole model's
    layers once (`vllm_global_groups`) and projects the groups onto each worker
    (`_project_kv_cache_groups_to_worker`, kv_cache_planning.py:1413-1458; a group with none of the stage's layers
    stays, empty): every stage counts a request's blocks over all the global groups, and its block holds the pages
    of its largest projected group; the pool's block count is then the smallest over the workers (:1580-1595).
    `hybrid` False (--disable-hybrid-kv-cache-manager): a model mixing sliding and full layers has every sliding
    layer promoted to full attention for the cache (`unify_hybrid_kv_cache_specs`, kv_cache_planning.py:853-877;
    its attention still reads the window): one full group; a model of one window alone keeps it (a uniform spec is
    not promoted, `_promote_local_kv_cache_specs`, :744-757). SGLang, and a pinned block size (TensorRT-LLM's rows,
    `ServeConfig.kv_block_tokens`), store every layer whole: one full group of the stage's layers."""
    every = [w for st in stages for w in st]
    mixed = len(set(every)) > 1
    if engine != "vllm" or pinned_blocks or all(w is None for w in every) or (mixed and not hybrid):
        return [KVLayout((None,), len(st), block, 0, max_model_len) for st in stages]
    groups = vllm_global_groups(every)
    out, start = [], 0
    for st in stages:
        here = range(start, start + len(st))
        start += len(st)
        most = max(sum(1 for i in layers if i in here) for _, layers in groups)
        out.append(KVLayout(tuple(w for w, _ in groups), most, block, in_flight, max_model_len))
    return out


def mean_window_keys(model: ModelSpec, length: float) -> float:
    """Mean over the decoder layers of the keys a decode query at `length` cached tokens reads:
    min(length, window) in a sliding layer, `length` in a full one."""
    windows = model.decoder_windows
    return sum(length if w is None else min(length, w) for w in windows) / len(windows)


def without_windows(model: ModelSpec, max_model_len: int | None, *, allow_long: bool = False) -> tuple[ModelSpec, int]:
    """(the model as vLLM 0.33.0 runs it under --disable-sliding-window, the max model length it starts with) for a
    model with windows: the derived max model length is capped at the config's sliding_window
    (`_get_and_verify_max_len`, vllm/config/model.py:2560-2569), which the engine takes without --max-model-len
    and refuses a longer one against (:2657-2683) unless VLLM_ALLOW_LONG_MAX_MODEL_LEN (`allow_long`); the window is
    then dropped (hf sliding_window = None, :914-917) and every layer attends and caches in full. SpecError: the
    refusal, naming --max-model-len and the cap. A model without windows is returned as it is."""
    windows = {w for w in model.decoder_windows if w is not None}
    if not windows:
        return model, max_model_len or model.max_position_embeddings
    cap = min(min(windows), model.max_position_embeddings)
    if max_model_len is not None and max_model_len > cap and not allow_long:
        raise SpecError(f"--max-model-len {max_model_len:,} is longer than {cap:,}: with --disable-sliding-window "
                        f"vLLM 0.33.0 caps {model.name}'s max model length at its sliding window (sliding_window="
                        f"{min(windows)}, config/model.py:2560-2569) and refuses to start past it; pass --max-model-len "
                        f"{cap} or less, drop --disable-sliding-window, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                        field="--max-model-len")
    full = tuple(g.model_copy(update={"attention_window": None}) for g in model.layers)
    return model.model_copy(update={"layers": full}), max_model_len or cap
