"""SGLang's attention data parallelism with the MoE on tensor parallelism (no expert parallelism):
`--tp-size N --attn-dp-size D` (N = attention TP x D) with no --ep-size and no --moe-a2a-backend.
Attention runs data-parallel, each DP rank on its own requests with attention TP N / D; every dense
MLP, shared and routed expert runs TP-sharded over all N ranks on the tokens of every DP rank. What
one decoder layer adds, checked in the sglang 0.5.23 wheel (python/sglang/srt/...):

- The gather: `MoeRowTransport` takes the TP-MoE gather path whenever attention DP is on and no a2a
  backend is set (models/deepseek_common/moe_transport.py:114-122) and fills the global DP buffer with
  `dp_gather_replicate` (:187). `_dp_gather` (layers/dp_attention.py:987-1043) then runs, by the step's
  `DpPaddingMode` (:165-205): SUM_LEN, every rank writing its rows into a zeroed buffer of the sum of
  the DP ranks' tokens and one all-reduce of it over the N ranks (`_dp_gather_via_all_reduce`,
  :661-713); or MAX_LEN, each rank padded to the largest rank's tokens and one all-gather of D x max
  rows (`_dp_gather_via_all_gather`, :716-765; with attention TP > 1 a reduce-scatter inside the
  attention-TP group first). Steps with prefill (extend) take SUM_LEN (:186-193); decode steps take
  SUM_LEN while the summed buffer fits the custom all-reduce (CustomAllReduceV2, the CUDA default,
  environ.py:1532, at most SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB = 16 MiB, :1535) and no
  speculative decoding runs (:222-243; V2 only inside one NVLink clique, else NCCL:
  distributed/device_communicators/custom_all_reduce.py:387-398), else MAX_LEN (graph capture: :207-219; balanced eager
  decode: sum x 2 >= max x D, :197-202).
- The experts: the gate, the shared experts and the routed experts run on the gathered rows (the
  shared expert locally only under SGLANG_DP_SHARED_EXPERT_LOCAL, moe_transport.py:33-42, off by
  default), each rank holding 1/N of every expert; block-FP8 experts on Triton's fused_moe (no
  DeepGEMM runner without DeepEP: `serve.engines`).
- The combine: `post_experts_all_reduce` sums the TP-sharded outputs over all N ranks
  (models/deepseek_v2.py:1452, layers/moe/utils.py:851-865), then `dp_scatter` copies this rank's
  rows back (moe_transport.py:251, dp_attention.py:1080-1108): an all-reduce of the whole gathered
  buffer. Its reduce-scatter variants are off: reduce_scatterv needs EP = attention DP
  (layers/moe/utils.py:742-749), SGLANG_DP_USE_REDUCE_SCATTER defaults on for ROCm only
  (environ.py:976).
- Dense layers gather and combine the same way (their MLP is data-parallel only under
  --moe-dense-tp-size 1, layers/layer_boundary/layout.py:83-84); the output projection is sharded
  over all N ranks (ParallelLMHead without --enable-dp-lm-head, models/deepseek_v2.py:3290-3297),
  the input embedding over the attention-TP group (layers/vocab_parallel_embedding.py:182-185).

So per rank: the attention weights of its DP rank (1 / attention TP) and the KV cache of its own
requests; every FFN weight over N. Priced here: the FFN half of a layer is a TP-N engine's on the
gathered rows (`ffn_config`), the attention half a TP-(N/D) engine's on the rank's own rows, plus
`dp_gather_combine_s`.

Pure functions: no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from autoshard.costmodel.comm import Collective, Link, collective_time_s, group_link, tp_all_reduce_s
from autoshard.costmodel.flops import Gemm
from autoshard.costmodel.serve.compute import (
    ELEMENTWISE_KERNELS, MLA_EXTRA_KERNELS, _elementwise_bytes, _rows, extra_kernels_s,
)
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.memory import BF16
from autoshard.specs.cluster import GpuSpec, LinkKind, PoolSpec
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec
from autoshard.units import MIB

__all__ = [
    "SGLANG_CUSTOM_AR_V2_MAX_BYTES",
    "attention_dp_tp_moe",
    "ffn_config",
    "custom_all_reduce_v2",
    "padding_mode",
    "gathered_rows",
    "dp_gather_combine_s",
    "split_elementwise_s",
    "edge_engine",
]

SGLANG_CUSTOM_AR_V2_MAX_BYTES = 16 * MIB
"""Largest buffer SGLang's CustomAllReduceV2 takes (SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB 16,384:
sglang 0.5.23 srt/environ.py:1535): a decode step's SUM_LEN gather fits below it."""


def attention_dp_tp_moe(cfg: ServeConfig) -> bool:
    """Whether `cfg` is SGLang's attention DP with tensor-parallel experts (see the module docstring;
    vLLM's counterpart: `serve.vllm_dp_moe`)."""
    return cfg.dp_attention > 1 and not cfg.expert_parallel and cfg.engine == "sglang"


def ffn_config(cfg: ServeConfig) -> ServeConfig:
    """The FFN half of the engine as a TP engine: TP N = attention TP x DP, one DP rank."""
    return replace(cfg, tp=cfg.moe_tp, dp_attention=1)


def edge_engine(
    pool: PoolSpec, cfg: ServeConfig, links: tuple[Link, Link, Link]
) -> tuple[ServeConfig, tuple[Link, Link, Link], int]:
    """(engine, its links, DP ranks whose rows it gathers) of the embedding and output layers: with
    attention DP and TP experts the output projection and the logits' all-gather run over all N ranks
    on the gathered rows of the D DP ranks (ParallelLMHead on the full TP group); otherwise `cfg`."""
    if not attention_dp_tp_moe(cfg):
        return cfg, links, 1
    return ffn_config(cfg), (group_link(pool, ranks=cfg.moe_tp), links[1], links[2]), cfg.dp_attention


def custom_all_reduce_v2(pool: PoolSpec, cfg: ServeConfig, link: Link) -> bool:
    """Whether SGLang's CustomAllReduceV2 runs on the N GPUs of `link`: enabled, one NVLink domain
    (`can_use_custom_all_reduce_v2`; a group across nodes or on PCIe takes NCCL)."""
    return cfg.custom_all_reduce and not link.crosses_nodes and pool.node.intra_node_link is not LinkKind.PCIE


def padding_mode(model: ModelSpec, cfg: ServeConfig, *, rows_sum: float, prefill: bool, custom: bool) -> str:
    """"sum_len" or "max_len": how SGLang gathers the DP ranks' rows of one step (module docstring);
    `custom`: CustomAllReduceV2 runs on the group (`custom_all_reduce_v2`)."""
    if prefill:
        return "sum_len"
    fits = rows_sum * model.hidden_size * BF16 <= SGLANG_CUSTOM_AR_V2_MAX_BYTES
    return "sum_len" if fits and custom and not cfg.speculative_tokens else "max_len"


def gathered_rows(
    model: ModelSpec, cfg: ServeConfig, *, rows_sum: float, rows_max: float, prefill: bool, custom: bool
) -> float:
    """Rows of the global DP buffer the FFNs run on: the DP ranks' summed tokens (SUM_LEN) or D times
    the busiest rank's (MAX_LEN)."""
    if padding_mode(model, cfg, rows_sum=rows_sum, prefill=prefill, custom=custom) == "sum_len":
        return rows_sum
    return cfg.dp_attention * rows_max


def dp_gather_combine_s(
    model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, link: Link, *, rows_sum: float, rows_max: float,
    prefill: bool,
) -> float:
    """The gather before one layer's FFN and the combine after it, over the N = TP x DP ranks on
    `link`: SUM_LEN, an all-reduce of the summed buffer each way; MAX_LEN, an all-gather of D x max
    rows, then the all-reduce of that buffer (BF16 hidden rows either way)."""
    n, custom = cfg.moe_tp, custom_all_reduce_v2(pool, cfg, link)
    rows = gathered_rows(model, cfg, rows_sum=rows_sum, rows_max=rows_max, prefill=prefill, custom=custom)
    size = rows * model.hidden_size * BF16
    combine = tp_all_reduce_s(size, n, link, pool, custom=cfg.custom_all_reduce)
    if padding_mode(model, cfg, rows_sum=rows_sum, prefill=prefill, custom=custom) == "sum_len":
        return 2 * combine
    return collective_time_s(Collective.ALL_GATHER, size, n, link) + combine


def split_elementwise_s(
    model: ModelSpec, kind: LayerKind, cfg: ServeConfig, gpu: GpuSpec, gemms: list[Gemm], *, tokens: float,
    part: str,
) -> float:
    """Elementwise kernels of one half of a layer (`serve.step._layer_time`'s `part`): the attention half keeps a
    dense layer's norms, residual, rotary and activation bytes and kernels, MLA's extra kernels and
    the group quantizations of its GEMMs; the FFN half the MoE-only bytes and kernels (routing,
    align, sum) and the quantizations of its GEMMs and experts."""
    eff = gpu.efficiency
    bw = gpu.hbm_tbps * 1e12 * eff.hbm
    if part == "attention":
        ew = tokens * _elementwise_bytes(model, LayerKind.DENSE, cfg) / bw
        ew += ELEMENTWISE_KERNELS[LayerKind.DENSE] * eff.kernel_overhead_us * 1e-6
        return ew + extra_kernels_s(model, LayerKind.DENSE, cfg, gpu, gemms, tokens=_rows(tokens), routed=tokens)
    ew = extra_kernels_s(model, kind, cfg, gpu, gemms, tokens=_rows(tokens), routed=tokens)
    ew -= (MLA_EXTRA_KERNELS if model.mla is not None else 0) * eff.kernel_overhead_us * 1e-6
    if kind is LayerKind.MOE:
        moe_bytes = _elementwise_bytes(model, kind, cfg) - _elementwise_bytes(model, LayerKind.DENSE, cfg)
        ew += tokens * max(moe_bytes, 0.0) / bw
        ew += (ELEMENTWISE_KERNELS[kind] - ELEMENTWISE_KERNELS[LayerKind.DENSE]) * eff.kernel_overhead_us * 1e-6
    return ew
