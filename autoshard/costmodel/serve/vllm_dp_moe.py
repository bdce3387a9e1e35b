"""vLLM's data parallelism on an MoE model without expert parallelism: `vllm serve ...
--tensor-parallel-size T --data-parallel-size D` with no --enable-expert-parallel. These are not D
independent replicas: the D engine cores step in lock-step and the MoE layers are sharded over all
T x D GPUs. What one step does, checked in the vllm 0.33.0 wheel (vllm/...):

- The experts: `FusedMoEParallelConfig.make` (model_executor/layers/fused_moe/config.py:1198-1225)
  flattens the MoE's tensor parallelism across DP (`flatten_tp_across_dp_and_pcp`, :1106-1114:
  tp_size = D x T) and, with `enable_expert_parallel` off, keeps use_ep False: every GPU holds
  1/(T x D) of every routed expert's intermediate dimension (`intermediate_size_per_partition`,
  :1351-1353). Attention, the dense MLPs, the shared experts, the embedding and lm_head are built on
  the attention TP group (T GPUs) and replicated over the D ranks; each DP rank keeps the KV cache of
  its own requests.
- The gather: without all-to-all kernels (`use_all2all_kernels` needs use_ep, :1034-1038) and with
  dp_size > 1, `maybe_make_prepare_finalize` falls back to the naive prepare/finalize
  (all2all_utils.py:217-228, "Falling back to AllGather+ReduceScatter dispatch/combine"), whose
  `prepare` quantizes the rank's tokens for the experts and hands them with their top-k weights and
  ids to the all-to-all manager (prepare_finalize/naive_dp_ep.py). The DP group's communicator runs
  `AgRsAll2AllManager` under the default --all2all-backend allgather_reducescatter (and "naive":
  device_communicators/cuda_communicator.py:202-207; `use_all2all` holds for any DP > 1,
  config/parallel.py:787-792): `dispatch` is one `all_gatherv` over the DP group (D GPUs, one per DP
  rank, stride T) of the hidden rows, top-k weights and ids (all2all.py:116-149; `_get_comm_group`
  :64-74 picks the DP group when DP > 1 and no sequence parallelism, which needs EP:
  config/parallel.py:768-785).
- The experts then run on the gathered rows of all D ranks, each GPU its 1/(T x D) slice.
- The combine: `combine_into_output`, one `reduce_scatterv` of the gathered BF16 outputs over the DP
  group back to each rank's own rows (all2all.py:181-197); the TP group's all-reduce after the MoE
  (`_maybe_reduce_final_output`, runner/moe_runner.py:509-515: moe tp_size = T x D > 1) sums the T
  attention-TP ranks' partial outputs, with the shared experts'.
- Padding: `coordinate_batch_across_dp` (v1/worker/dp_utils.py:190-250) pads every rank to the
  largest rank's tokens when the step runs a CUDA graph (so the gather moves D x max rows); steps
  without a graph (prefill chunks past the largest captured size) gather the ranks' actual tokens.

Priced here: the attention half, the dense layers, the router and the shared experts as a TP-T
engine's on this rank's rows; the routed experts as a TP-(T x D) engine's on the gathered rows;
`dispatch_combine_s` for the gather and scatter on the DP group's link. Weights: `ServeConfig.
expert_tp` (`serve.weights.stage_weight_bytes`). Not modelled: the monolithic kernels' variant that
gathers router logits instead of top-k ids (FlashInfer's TRT-LLM MoE on Blackwell), NVFP4 activation
dispatch (priced as BF16 rows).

The same gather and scatter run an expert-parallel engine on --all2all-backend allgather_reducescatter
(vLLM 0.33.0's default, `ServeConfig.all2all_backend`): `use_ag_rs_all2all_kernels` (fused_moe/config.py:
1073-1078) picks the naive prepare/finalize (all2all_utils.py:420-425), whose experts, each GPU its
E / EP whole experts, take the gathered rows in one pass (no DP chunking: vllm/envs.py has no
VLLM_MOE_DP_CHUNK_SIZE and `FusedMoEModularKernel` sizes its workspace on the full gathered M,
modular_kernel.py:1340-1367). With TP > 1 the MoE runs sequence-parallel over the EP group
(`use_sequence_parallel_moe`, config/parallel.py:768-785; `_get_comm_group` :64-66): each TP rank
gathers its 1/T of the rows, the same gathered rows over T x D GPUs (`agrs_ep_comm_s`).

Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from autoshard.costmodel.comm import Collective, Link, collective_time_s, group_link
from autoshard.costmodel.flops import Gemm, mlp_gemms
from autoshard.costmodel.serve.compute import _gemm_s, block_scaled_fp8, model_serving_gpu
from autoshard.costmodel.serve.config import AGRS_BACKEND, ServeConfig
from autoshard.costmodel.serve.engine_defaults import capture_sizes
from autoshard.costmodel.serve.memory import BF16
from autoshard.costmodel.serve.sharding import layer_tp_comm_s
from autoshard.specs.cluster import GpuSpec, PoolSpec
from autoshard.specs.job import WeightDtype
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = [
    "TOPK_BYTES",
    "vllm_dp_tp_moe",
    "local_config",
    "expert_config",
    "dispatch_bytes_per_row",
    "gathered_rows",
    "dispatch_combine_s",
    "vllm_dp_moe_layer",
    "VLLM_DP_MOE_SPLIT",
    "vllm_dp_one_engine",
    "FP8_BLOCK",
    "tp_experts_problem",
    "agrs_ep_engine",
    "agrs_ep_comm_s",
]

TOPK_BYTES = 4 + 4
"""Bytes per routed pair the dispatch gathers beside the hidden row: its FP32 top-k weight and its
int32 expert id."""


def vllm_dp_tp_moe(cfg: ServeConfig) -> bool:
    """Whether `cfg` is vLLM's DP without expert parallelism on an MoE engine (the module docstring)."""
    return cfg.engine == "vllm" and cfg.dp_attention > 1 and not cfg.expert_parallel


def local_config(cfg: ServeConfig) -> ServeConfig:
    """One DP rank's TP-T engine: attention, dense MLPs, router, shared experts, embedding, lm_head."""
    return replace(cfg, dp_attention=1)


def expert_config(cfg: ServeConfig) -> ServeConfig:
    """The routed experts as a TP engine over all T x DP GPUs (the flattened MoE TP)."""
    return replace(cfg, tp=cfg.expert_tp, dp_attention=1)


def dispatch_bytes_per_row(model: ModelSpec, cfg: ServeConfig, *, fp8_math: bool) -> float:
    """Bytes one token adds to the dispatch's all-gather: its hidden row as the experts take it (FP8
    when the experts run FP8 math, with one FP32 scale per 128 elements for a block-scaled checkpoint;
    else BF16), plus its top-k weights and ids (`TOPK_BYTES` each)."""
    assert model.moe is not None
    h = model.hidden_size
    if fp8_math and cfg.weight_dtype is WeightDtype.FP8:
        row = h * (1.0 + (4.0 / 128 if block_scaled_fp8(model, cfg.weight_dtype) else 0.0))
    else:
        row = h * BF16
    return row + model.moe.top_k * TOPK_BYTES


def gathered_rows(cfg: ServeConfig, gpu: GpuSpec, *, rows_sum: float, rows_max: float) -> float:
    """Rows the experts run on: D x the busiest rank's when the step runs a CUDA graph (its tokens at
    most the largest size vLLM captures by default on `gpu`, `serve.engine_defaults.capture_sizes`:
    every rank padded to the largest), else the ranks' summed tokens."""
    graphed = cfg.cuda_graphs and rows_max <= capture_sizes(gpu, cfg)[-1]
    return cfg.dp_attention * rows_max if graphed else rows_sum


def dispatch_combine_s(
    model: ModelSpec, cfg: ServeConfig, link: Link, *, rows: float, fp8_math: bool
) -> float:
    """One MoE layer's all-gather of `rows` gathered rows (`dispatch_bytes_per_row` each) and the
    reduce-scatter of their BF16 outputs, over the D ranks of the DP group on `link`."""
    d = cfg.dp_attention
    gather = collective_time_s(
        Collective.ALL_GATHER, rows * dispatch_bytes_per_row(model, cfg, fp8_math=fp8_math), d, link
    )
    return gather + collective_time_s(Collective.REDUCE_SCATTER, rows * model.hidden_size * BF16, d, link)


def agrs_ep_engine(cfg: ServeConfig) -> bool:
    """Whether `cfg` is a vLLM expert-parallel engine over DP ranks on allgather_reducescatter."""
    return cfg.all2all_backend == AGRS_BACKEND and cfg.expert_parallel and cfg.dp_attention > 1


def agrs_ep_comm_s(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, link: Link, *, tokens: float,
                   rows_sum: float) -> float:
    """One MoE layer's dispatch and combine of an `agrs_ep_engine`: `dispatch_combine_s` of the gathered
    rows (`gathered_rows`: D x the busiest rank's `tokens` in a CUDA graph, else the ranks' `rows_sum`)
    over the EP group: the D DP ranks on `link` (the DP group's), or with TP > 1 the T x D ranks of the
    sequence-parallel MoE, each gathering its 1/T of the rows, on the EP group's own link (TP innermost,
    DP outermost: T x D consecutive ranks when PP is 1, each PP stage's T ranks per DP rank otherwise)."""
    rows = gathered_rows(cfg, pool.gpu, rows_sum=rows_sum, rows_max=tokens)
    if cfg.tp > 1:
        link = group_link(pool, ranks=cfg.ep) if cfg.pp == 1 else link
    fp8_math = cfg.weight_dtype is WeightDtype.FP8 and bool(model_serving_gpu(model, pool.gpu, cfg.weight_dtype).fp8_tflops)
    return dispatch_combine_s(model, replace(cfg, dp_attention=cfg.ep), link, rows=rows, fp8_math=fp8_math)


def _router_shared_s(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, rows: float) -> float:
    """The router and shared-expert GEMMs of one MoE layer on `rows` rows at `cfg.tp`."""
    assert model.moe is not None
    gpu = model_serving_gpu(model, pool.gpu, cfg.weight_dtype)
    n = max(1, round(rows))
    gemms = [Gemm(n, model.moe.num_experts, model.hidden_size, fp8_capable=False)]
    if model.moe.shared_expert_ffn_hidden_size:
        gemms += mlp_gemms(model, n, model.moe.shared_expert_ffn_hidden_size, cfg.tp)
    return sum(_gemm_s(g, gpu, cfg.weight_dtype) for g in gemms)


def vllm_dp_moe_layer(
    layer_time: Callable, model: ModelSpec, kind: LayerKind, pool: PoolSpec, cfg: ServeConfig,
    links: tuple[Link, Link, Link], *, tokens: float, decode_seqs: float, context_len: float, prefills: float,
    prefill_len: int, query_len: int, rows_sum: float,
):
    """One decoder layer of the engine on one GPU (`layer_time`: `serve.step._layer_time`): a dense
    layer is the DP rank's TP-T layer on its `tokens` (the busiest rank's); an MoE layer's attention
    half too, its routed experts a TP-(T x D) layer's FFN half on the gathered rows (router and shared
    experts moved back to this rank's rows at TP T), plus the gather and scatter on the DP group's
    link (ep_comm_s) and the TP-T all-reduce after the MoE."""
    local = local_config(cfg)
    own = dict(decode_seqs=decode_seqs, context_len=context_len, prefills=prefills, prefill_len=prefill_len,
               query_len=query_len)
    if kind is not LayerKind.MOE:
        return layer_time(model, kind, pool, local, links, tokens=tokens, **own)
    attn = layer_time(model, kind, pool, local, links, tokens=tokens, part="attention", **own)
    rows = gathered_rows(cfg, pool.gpu, rows_sum=rows_sum, rows_max=tokens)
    experts = expert_config(cfg)
    ffn = layer_time(model, kind, pool, experts, links, tokens=rows, decode_seqs=0, context_len=0, prefills=0,
                     prefill_len=prefill_len, part="ffn")
    moved = _router_shared_s(model, pool, local, tokens) - _router_shared_s(model, pool, experts, rows)
    gpu = model_serving_gpu(model, pool.gpu, cfg.weight_dtype)
    fp8_math = cfg.weight_dtype is WeightDtype.FP8 and bool(gpu.fp8_tflops)
    comm = dispatch_combine_s(model, cfg, links[1], rows=rows, fp8_math=fp8_math)
    after = layer_tp_comm_s(model, pool, local, links[0], tokens=tokens) / 2
    return attn + replace(ffn, gemm_s=ffn.gemm_s + moved, tp_comm_s=after, ep_comm_s=comm)


VLLM_DP_MOE_SPLIT = ("vLLM's --data-parallel-size without --enable-expert-parallel on an MoE model (one engine, "
                     "the routed experts over all TP x DP GPUs) is priced for aggregated engines only")
"""Why such engines are left out of prefill/decode instances (`search.serve.space._unpriced`)."""


def vllm_dp_one_engine(model: ModelSpec, framework: str) -> bool:
    """Whether vLLM runs `--data-parallel-size` of this model as one engine: on an MoE model, with or
    without expert parallelism (its MoE layers meet every DP rank's tokens); a dense model's DP ranks
    are independent replicas."""
    return framework == "vllm" and model.is_moe


FP8_BLOCK = 128
"""Rows and columns of one block of a block-scaled FP8 checkpoint (DeepSeek's and Qwen's 128 x 128)."""


def tp_experts_problem(model: ModelSpec, weight_dtype: WeightDtype, *, tp: int, dp: int,
                       expert_parallel: bool) -> str | None:
    """Why the engines refuse to shard the routed experts over the TP x DP GPUs of attention DP without
    expert parallelism (vLLM's DP on an MoE model, SGLang's --attn-dp-size with TP experts), or None:
    the expert width must split evenly (vLLM: `FusedMoEConfig.__post_init__` asserts intermediate_size
    % tp_size == 0) and, for a block-scaled FP8 checkpoint, each GPU's slice must hold whole 128-row
    blocks (vLLM 0.33.0 `validate_fp8_block_shape_moe`, quantization/utils/fp8_utils.py:1347-1370)."""
    if model.moe is None or expert_parallel or dp < 2:
        return None
    n, width = tp * dp, model.moe.expert_ffn_hidden_size
    if width % n:
        return f"the experts' {width} intermediate rows do not split over TP x DP = {n} GPUs"
    if block_scaled_fp8(model, weight_dtype) and (width // n) % FP8_BLOCK:
        return (f"the block-scaled FP8 experts' {width} intermediate rows over TP x DP = {n} GPUs leave {width // n} "
                f"a GPU, not whole {FP8_BLOCK}-row blocks (the engines refuse to load them)")
    return None
