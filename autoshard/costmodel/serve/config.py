"""The settings of a vLLM-style engine (`ServeConfig`, named as vLLM's flags) and the decoder layers
each pipeline rank hosts (vLLM's `get_pp_indices` split).

Pure functions of the specs: no I/O, no solver.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autoshard.parallel import ParallelDims
from autoshard.specs.job import WeightDtype
from autoshard.specs.layers import LayerKind
from autoshard.specs.model import ModelSpec

__all__ = ["AGRS_BACKEND", "HOST_US_PER_SEQ", "ROLES", "ServeConfig", "StageLayers", "pp_layer_split", "stage_layers"]

HOST_US_PER_SEQ = 2.5
"""Host (CPU) work of one engine step per request in it, microseconds, serial with the GPU work:
scheduling, stop-criteria checks, updating each request's response (what TensorRT-LLM's later
"overlap scheduler" hides: nvidia.github.io/TensorRT-LLM/features/overlap-scheduler.html; the
0.14-0.17 engines in tests/validation/serving_runs.yaml run it serially). Fitted, with the serving
GPU efficiencies, on the published offline runs by tests/validation/validate_serving.py (a grid of
0 / 2.5 / 5 / 7.5 / 10, leave-one-source-out there)."""

ROLES = ("aggregated", "prefill", "decode")
"""`ServeConfig.role` values."""
AGRS_BACKEND = "allgather_reducescatter"
"""vLLM's all-gather + reduce-scatter MoE backend (`ServeConfig.all2all_backend`)."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """One engine's settings, named as vLLM's flags."""

    tp: int = 1
    pp: int = 1
    dp_attention: int = 1
    """Attention data-parallel ranks inside the engine. With expert parallelism the MoE layers are
    sharded over all TP x DP ranks (vLLM --data-parallel-size with --enable-expert-parallel); without
    it, SGLang's attention DP with tensor-parallel experts (`--tp-size TP*DP --attn-dp-size DP`, no
    --ep-size): every dense and MoE FFN runs TP-sharded over all TP x DP ranks on the gathered tokens
    (`autoshard.costmodel.serve.dp_tp_moe`); or vLLM's --data-parallel-size on an MoE model without
    --enable-expert-parallel: only the routed experts are sharded over all TP x DP ranks, on the
    gathered tokens (`autoshard.costmodel.serve.vllm_dp_moe`)."""
    expert_parallel: bool = False
    weight_dtype: WeightDtype = WeightDtype.BF16
    kv_cache_dtype: WeightDtype = WeightDtype.BF16
    gpu_memory_utilization: float = 0.90
    max_num_seqs: int = 256
    """Running requests per DP rank (vLLM --max-num-seqs)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one scheduler step, the prefill chunk size (vLLM --max-num-batched-tokens)."""
    kv_cache_memory_bytes: float | None = None
    """A fixed KV-cache size per GPU (vLLM --kv-cache-memory-bytes); None: derive it from the utilization."""
    cuda_graphs: bool = True
    """False models --enforce-eager (no graph pools, but no launch-overhead savings either)."""
    custom_all_reduce: bool = True
    """The engine's custom all-reduce for small TP messages on NVLink (False: vLLM
    --disable-custom-all-reduce, NCCL only)."""
    nccl_nvls: bool = True
    """NCCL's NVLink SHARP left on: NCCL's default, which vLLM keeps (NVLS buffers are charged where
    the node enables them, `serve.comm_memory.engine_comm_bytes`). False: NCCL_NVLS_ENABLE=0, SGLang's
    default unless --enable-nccl-nvls."""
    host_us_per_seq: float = HOST_US_PER_SEQ
    """Serial host work per request per engine step, microseconds (0: an engine that overlaps it
    with the GPU work)."""
    speculative_tokens: int = 0
    """Draft tokens per decode step from the model's own multi-token-prediction modules (DeepSeek's MTP:
    vLLM --speculative-config '{"method": "mtp", ...}', SGLang --speculative-algorithm EAGLE); 0: none.
    At most the model's `mtp_num_layers`. Priced by `autoshard.costmodel.serve.mtp`."""
    kv_block_tokens: int | None = None
    """Tokens per paged KV-cache block when the engine reserves a request's whole prompt + output in
    blocks at admission: TensorRT-LLM's guaranteed-no-evict scheduler (its default policy) takes
    ceil((ISL + OSL) / tokens_per_block) blocks per request (64 or 32 tokens: the plugin config's
    default, by release), and its pool holds whole blocks. None: the block of the attention backend vLLM or
    SGLang selects (`serve.engine_defaults.kv_block_tokens`: vLLM 16, 64 for FlashMLA's FP8 MLA cache on
    Hopper, 32 for MLA on Blackwell; SGLang 1, 64 on Blackwell); a request then holds whole blocks as it
    grows, ceil(tokens / block) of them at its end, which is what autoshard's concurrency counts."""
    fp8_context_attention: bool = False
    """Prefill (context) attention in FP8 on GPUs with FP8 tensor cores, when the KV cache is FP8:
    TensorRT-LLM's FP8 engines (`trtllm-bench build --quantization FP8` sets the plugin's
    use_fp8_context_fmha). False: BF16 prefill attention, as vLLM and SGLang run it by default."""
    moe_kernels: str = "fused_moe"
    """The routed experts' kernels: "fused_moe", vLLM's and SGLang's Triton fused_moe
    (`autoshard.costmodel.serve.fused_moe`); "tensorrt_llm", TensorRT-LLM's MoE plugin (permute and
    finalize kernels around its grouped GEMMs), for the published runs of that engine."""
    deep_gemm: bool = True
    """DeepGEMM may run the block-scaled FP8 experts. vLLM: DeepGEMM is installed (the vllm/vllm-openai
    images build it; autoshard's manifests use them) and fused_moe hands it the steps its shape rules
    allow (`serve.fused_moe.deep_gemm_experts`); False: a PyPI install, which ships without it. SGLang:
    its MoE runner is DeepGEMM (--moe-runner-backend deep_gemm, or auto behind DeepEP / Mooncake)."""
    engine: str = "vllm"
    """The engine whose kernel-dispatch rules apply where vLLM and SGLang differ ("vllm" or "sglang"):
    vLLM's fused_moe takes DeepGEMM only for some expert shapes (`serve.fused_moe.deep_gemm_experts`);
    `serve.engines.engine_config` sets what each engine's launch line runs."""
    moe_dp_chunk: int | None = None
    """Tokens per DP rank of one MoE pass when the engine loops an attention-DP + EP MoE layer over DP
    chunks: vLLM 0.11.0's VLLM_MOE_DP_CHUNK_SIZE (256, `compute.MOE_DP_CHUNK`), whose DeepEP
    low-latency buffer holds one chunk per rank. None: one pass per step (vLLM 0.33.0, which has no DP
    chunking and sizes that buffer at `max_num_batched_tokens`, `ep_buffers.deepep_ll_engine_bytes`;
    SGLang). Set for the validation rows measured on older vLLM."""
    all2all_backend: str | None = None
    """The MoE all-to-all backend of a vLLM expert-parallel engine over DP ranks. None: the one autoshard's
    own lines pass (`deepep_low_latency`, `deepep_high_throughput` for prefill instances: `role`);
    "allgather_reducescatter": vLLM 0.33.0's default (`ParallelConfig.all2all_backend`,
    config/parallel.py:220, which "pplx" and "naive" fall back to, :537-543), read from a line that names
    no DeepEP backend: each MoE layer all-gathers the DP ranks' tokens and reduce-scatters the expert
    outputs (`serve.vllm_dp_moe.agrs_ep_comm_s`), one pass a step, with no DeepEP buffer
    (`serve.ep_buffers.uses_deepep_low_latency`) and its experts' workspace on the gathered rows
    (`serve.memory.serve_memory`)."""
    role: str = "aggregated"
    """What the engine serves: "aggregated" (prefill and decode in one engine), or the "prefill" or
    "decode" instance of a prefill/decode split. It decides which DeepEP kernels an expert-parallel
    vLLM engine runs (`serve.ep_dispatch.deepep_normal_step`), and so its buffers
    (`serve.ep_buffers.deepep_ll_engine_bytes`): autoshard's vLLM prefill instances pass
    `--all2all-backend deepep_high_throughput`, its other vLLM lines `deepep_low_latency`."""
    hybrid_kv_cache: bool = True
    """vLLM's hybrid KV-cache manager (its default): sliding-window layers in their own KV-cache groups
    (`serve.kv_window`). False: --disable-hybrid-kv-cache-manager, a hybrid model's sliding layers cached as
    full attention (their attention still reads the window)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp_attention", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_dtype not in (WeightDtype.BF16, WeightDtype.FP8):
            raise ValueError("kv_cache_dtype must be bf16 or fp8")
        if not isinstance(self.speculative_tokens, int) or self.speculative_tokens < 0:
            raise ValueError(
                f"speculative_tokens must be a non-negative integer, got {self.speculative_tokens!r}"
            )
        if self.kv_block_tokens is not None and (
            not isinstance(self.kv_block_tokens, int) or self.kv_block_tokens < 1
        ):
            raise ValueError(f"kv_block_tokens must be a positive integer, got {self.kv_block_tokens!r}")
        if self.moe_kernels not in ("fused_moe", "tensorrt_llm"):
            raise ValueError(f"moe_kernels must be fused_moe or tensorrt_llm, got {self.moe_kernels!r}")
        if self.moe_dp_chunk is not None and (not isinstance(self.moe_dp_chunk, int) or self.moe_dp_chunk < 1):
            raise ValueError(f"moe_dp_chunk must be a positive integer or None, got {self.moe_dp_chunk!r}")
        if self.all2all_backend not in (None, AGRS_BACKEND):
            raise ValueError(f"all2all_backend must be None or {AGRS_BACKEND}, got {self.all2all_backend!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.engine not in ("vllm", "sglang"):
            raise ValueError(f"engine must be vllm or sglang, got {self.engine!r}")
        if not self.host_us_per_seq >= 0:
            raise ValueError(f"host_us_per_seq must be >= 0, got {self.host_us_per_seq!r}")

    @property
    def ep(self) -> int:
        """Expert-parallel size: TP x DP with expert parallelism, else 1 (experts TP-sharded)."""
        return self.tp * self.dp_attention if self.expert_parallel else 1

    @property
    def moe_tp(self) -> int:
        """Ranks each dense MLP, shared and routed expert is TP-sharded over: TP x DP for SGLang's
        attention DP without expert parallelism (`serve.dp_tp_moe`), else TP (vLLM's DP without
        expert parallelism shards only the routed experts wider: `expert_tp`)."""
        return self.expert_tp if self.engine == "sglang" else self.tp

    @property
    def expert_tp(self) -> int:
        """Ranks each routed expert is TP-sharded over: TP x DP without expert parallelism (SGLang's
        attention DP with TP experts; vLLM's DP on an MoE model, `FusedMoEParallelConfig.
        flatten_tp_across_dp_and_pcp`), else TP (experts whole on their EP rank, or TP-sharded)."""
        return self.tp * self.dp_attention if not self.expert_parallel else self.tp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp_attention

    @property
    def dims(self) -> ParallelDims:
        ep = self.ep
        return ParallelDims(tp=self.tp, pp=self.pp, dp=self.dp_attention, ep=ep, etp=1 if ep > 1 else None)


# --------------------------------------------------------------------------- layers per stage


@dataclass(frozen=True, slots=True)
class StageLayers:
    """What one pipeline rank hosts."""

    dense: int
    moe: int
    embedding: bool
    output: bool

    @property
    def decoders(self) -> int:
        return self.dense + self.moe


def pp_layer_split(num_layers: int, pp: int) -> list[int]:
    """Decoder layers per pipeline rank as vLLM's `get_pp_indices` splits them: an even share each,
    the remainder going one apiece to the ranks before the last (first and last also hold the
    embedding and the output layer)."""
    if pp > num_layers:
        raise ValueError(f"PP {pp} exceeds the {num_layers} decoder layers")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_layers(model: ModelSpec, pp: int) -> list[StageLayers]:
    return list(_stage_layers(model, pp))


@lru_cache(maxsize=256)
def _stage_layers(model: ModelSpec, pp: int) -> tuple[StageLayers, ...]:
    kinds = [k for k in model.layer_kinds if k in (LayerKind.DENSE, LayerKind.MOE)]
    out, start = [], 0
    for i, n in enumerate(pp_layer_split(len(kinds), pp)):
        chunk = kinds[start : start + n]
        start += n
        out.append(
            StageLayers(
                dense=chunk.count(LayerKind.DENSE),
                moe=chunk.count(LayerKind.MOE),
                embedding=i == 0,
                output=i == pp - 1,
            )
        )
    return tuple(out)
