"""EP dispatch and combine of a prefill-only serving step on DeepEP's high-throughput ("normal")
kernels: the bytes those kernels move and the links they cross.

Which kernels a step runs (the engines autoshard's commands launch):
- vLLM prefill instances run `--all2all-backend deepep_high_throughput` (`emit/pd.py`; vLLM's
  `DeepEPHTAll2AllManager`, vllm/distributed/device_communicators/all2all.py, builds a `deep_ep.Buffer`
  with NVLink and RDMA buffers and no low-latency mode), SGLang's `--deepep-mode auto` runs batches
  with prompt tokens in them on the normal kernels (`DeepEPMode.resolve`: normal when the batch
  extends). Decode steps stay on the low-latency kernels (`sharding.ep_dispatch_s`, unchanged), and
  so does a vLLM aggregated engine, whose commands pass `deepep_low_latency`.
- DeepEP's normal kernels dedupe by destination: intranode (csrc/kernels/legacy/intranode.cu) a token
  goes once to every rank holding at least one of its experts (`is_token_in_rank`), which expands it
  to its local experts; internode (csrc/kernels/legacy/internode.cu) it crosses RDMA once per node
  holding one of its experts, to the same-index GPU there (`num_tokens_per_rdma_rank`), which forwards
  it over NVLink to the node's ranks that need it. Combine sums a rank's expert outputs and a node's
  ranks' outputs before the return trip: the same copies, back, in BF16. Dispatch sends FP8 with one
  FP32 scale per 128 elements for FP8 models (`FP8_WITH_BLOCK_SCALES`).
- DeepSeek-V3's group-limited router (n_group 8, topk_group 4) with experts in order reaches at most
  4 groups' ranks and nodes: `moe.domains_touched_per_token` counts both with the group limit.
- The RDMA and NVLink parts run at once (the forwarders pipeline them): the slower sets the time, as
  in `comm.hierarchical_all_to_all_s`, but the NVLink part at `DEEPEP_NORMAL_NVL_FRACTION` of the
  link (`comm.deepep_normal_all_to_all_s`): the normal kernels copy through a few dozen SMs' loads
  and stores, not the copy engines. Checked
  against DeepEP's published normal-kernel table (docs/legacy.md: H800, CX7 400 Gb/s, 4096 tokens,
  hidden 7168, top-8, FP8 dispatch / BF16 combine; intranode EP 8 153 / 158 GB/s NVLink, internode
  EP 16 / 32 / 64 43 / 58 / 51 GB/s RDMA as its tests/legacy/test_internode.py counts them: every
  node a token reaches, its own included) in tests/costmodel/test_serving_ep_high_throughput.py.
- No overlap with compute is priced: vLLM's dual-batch overlap (`--enable-dbo`) would hide part of it,
  and autoshard's commands do not pass it.

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.comm import deepep_normal_all_to_all_s
from autoshard.costmodel.moe import GroupLimit, domains_touched_per_token
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.ep_buffers import DEEPEP_LL_GENERATIONS, scattered_deepep
from autoshard.specs.cluster import PoolSpec
from autoshard.specs.model import ModelSpec

__all__ = [
    "DEEPEP_HT_GENERATIONS", "DEEPEP_NORMAL_NVL_FRACTION", "uses_deepep_high_throughput", "deepep_normal_step",
    "ht_copies_per_token", "ht_dispatch_combine_s",
]

DEEPEP_NORMAL_NVL_FRACTION = 0.67
"""NVLink bandwidth DeepEP's normal kernels reach between ranks, as a fraction of the node's
per-direction NVLink figure: its intranode row (H800, EP 8, 153 GB/s dispatch counted over every
copy a rank receives, its own included: 7/8 x 153 = 134 GB/s across ranks on 200 GB/s NVLink; the
158 GB/s combine gives 0.69). The internode rows are left to check it (EP 16 is NVLink-bound)."""

DEEPEP_HT_GENERATIONS = DEEPEP_LL_GENERATIONS
"""GPUs whose engines run DeepEP's internode normal kernels (SM90 and later; DeepEP's SM80 build has
the intranode kernels only, and AMD engines use other libraries: their dispatch keeps the per-copy
pricing of `sharding.ep_dispatch_s`)."""


def uses_deepep_high_throughput(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig) -> bool:
    """Whether a prefill-only step of this engine dispatches on DeepEP's normal kernels: an MoE model
    with expert parallelism over attention-DP ranks on a GPU DeepEP supports."""
    return (
        model.moe is not None
        and cfg.expert_parallel
        and cfg.dp_attention > 1
        and gpu_generation(pool.gpu.name) in DEEPEP_HT_GENERATIONS
    )


def deepep_normal_step(model: ModelSpec, pool: PoolSpec, cfg: ServeConfig, *, prefill: bool) -> bool:
    """Whether a step of this engine (`prefill`: with prompt tokens in it) dispatches on DeepEP's
    normal kernels rather than its low-latency ones (engines that run no DeepEP: False).
    - vLLM picks one all-to-all backend per engine (`ParallelConfig.all2all_backend`, default
      allgather_reducescatter; `FusedMoEParallelConfig.use_deepep_ht_kernels` /
      `use_deepep_ll_kernels`, vllm/model_executor/layers/fused_moe/config.py lines 1040-1049 in
      vLLM 0.33.0) and never switches per step: DBO only splits a step into two micro-batches on that
      backend (vllm/v1/worker/ubatch_utils.py). So a prefill instance (`deepep_high_throughput`) runs
      every step on the normal kernels, and an aggregated or decode engine (`deepep_low_latency`) runs
      every step on the low-latency ones, a prompt alone and a mixed step included.
    - SGLang's `--deepep-mode auto` resolves per step: normal when the batch has prompt (extend) tokens
      in it, mixed steps included (`DeepEPMode.resolve(is_extend_in_batch)`,
      sglang/srt/layers/moe/utils.py), low-latency for decode-only steps."""
    if not (uses_deepep_high_throughput(model, pool, cfg) or scattered_deepep(model, pool.gpu, cfg)):
        return False
    if cfg.engine == "sglang":
        return prefill
    return cfg.role == "prefill"


def ht_copies_per_token(model: ModelSpec, cfg: ServeConfig, per_domain: int) -> tuple[float, float]:
    """(copies of one token over NVLink, copies over RDMA) of a normal-kernel dispatch: the attention-DP
    ranks (`tp` EP ranks each) holding one of its experts, and the NVLink domains of `per_domain`
    DP ranks other than the sender's holding one (0 when the group fits in one domain)."""
    assert model.moe is not None
    moe = model.moe
    limit = GroupLimit.of(moe, engine=cfg.engine)
    ep, tp = cfg.ep, cfg.tp
    ranks = domains_touched_per_token(moe.num_experts, moe.top_k, ep, tp, limit)
    domains = -(-cfg.dp_attention // per_domain)
    if domains <= 1:
        return ranks, 0.0
    touched = domains_touched_per_token(moe.num_experts, moe.top_k, ep, tp * per_domain, limit)
    return ranks, touched * (domains - 1) / domains


def ht_dispatch_combine_s(
    model: ModelSpec, cfg: ServeConfig, pool: PoolSpec, *, routed: float, per_domain: int,
    dispatch_bytes: float, combine_bytes: float, imbalance: float,
) -> float:
    """Dispatch (`dispatch_bytes` per element) plus combine (`combine_bytes`) of `routed` tokens of one
    DP rank on DeepEP's normal kernels, the busiest rank's share (`imbalance` x the mean), over the
    `per_domain` DP ranks of each NVLink domain (`comm.deepep_normal_all_to_all_s`). Inside one
    NVLink domain: one copy per destination rank over NVLink; across domains: one copy per remote
    domain through the GPU's own NIC and the NVLink fan-out, at once."""
    nvl, remote = ht_copies_per_token(model, cfg, per_domain)
    elements = routed * model.hidden_size / cfg.tp * imbalance
    return sum(
        deepep_normal_all_to_all_s(
            elements * nvl * b, elements * remote * b, cfg.dp_attention, per_domain, pool,
            DEEPEP_NORMAL_NVL_FRACTION,
        )
        for b in (dispatch_bytes, combine_bytes)
    )
