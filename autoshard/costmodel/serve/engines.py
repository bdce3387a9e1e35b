"""Which engine a serving prediction is for: the `ServeConfig` settings in which vLLM and SGLang differ
for the same TP / PP / EP / attention-DP engine, as autoshard's own launch lines start them
(`autoshard.emit.vllm`, `autoshard.emit.sglang`, `autoshard.emit.pd`), so that a plan is priced on the
kernels of the engine it is launched with.

- vLLM 0.33.0 (the vllm/vllm-openai:latest image autoshard's lines and manifests run, which builds
  DeepGEMM): block-scaled FP8 experts run DeepGEMM where vLLM's FP8 MoE oracle picks it, which on
  Hopper is never for TP-sharded experts (Triton first: `vllm_deep_gemm`), with NCCL's NVLink SHARP
  left on (NCCL's default, which vLLM keeps).
- SGLang: its block-FP8 MoE layers run DeepGEMM only under `--moe-runner-backend deep_gemm`, or `auto`
  behind the DeepEP / Mooncake all-to-all (Fp8MoEMethod.create_moe_runner,
  `is_deepgemm_moe_runner_backend_enabled`), else Triton's fused_moe. autoshard's SGLang lines pass
  `--moe-a2a-backend deepep` (`sglang_deepep`) to every attention-DP + EP engine whose DeepEP SGLang
  can start: aggregated engines on one node or many (DeepEP's normal kernels run intranode over
  NVLink, its low-latency kernels over NVSHMEM with NVLink allowed: deep_ep/buffer.py
  `allow_nvlink_for_low_latency_mode`), and expert-parallel instances of a prefill/decode split over
  more than one node (`emit.pd.uses_deepep`). Under the default `--deepep-mode auto` a step with any
  prefill (extend) in the batch runs DeepEP's normal (high-throughput) kernels and a decode-only step
  the low-latency ones (`DeepEPMode.resolve(is_extend_in_batch)`, sglang/srt/layers/moe/utils.py;
  `DeepEPDispatcher._get_impl`, sglang/srt/layers/moe/token_dispatcher/deepep.py): priced as vLLM's
  DeepEP engines are (`serve.sharding.ep_dispatch_s`; decode-only steps in one MoE pass, since the
  plan keeps a rank's decode tokens within the low-latency buffer, `ep_buffers.SGLANG_DEEPEP_TOKENS_MAX`),
  with DeepGEMM experts and SGLang's own DeepEP buffers (`ep_buffers.deepep_sglang_engine_bytes`).
  DeepEP needs SM90+ for its low-latency kernels (`ep_buffers.DEEPEP_LL_GENERATIONS`) and has configs
  only for the EP sizes in `ep_buffers.DEEPEP_EP_RANKS` (`Buffer.get_dispatch_config` asserts); SGLang
  attention-DP + EP engines elsewhere would run its all-gather dispatch, which is not priced
  (`SGLANG_UNPRICED`, `sglang_priced`). TP-sharded experts run Triton. SGLang sets NCCL_NVLS_ENABLE to
  0 unless --enable-nccl-nvls (`_set_envs_and_config`, sglang/srt/entrypoints/engine.py), which
  autoshard's lines do not pass. `evaluate --from-sglang` reads the same settings off a command
  (`emit.sglang.parse`).

Pure functions: no I/O.
"""

from __future__ import annotations

import dataclasses

from autoshard.costmodel.band_table import gpu_generation
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.costmodel.serve.ep_buffers import (
    DEEPEP_EP_RANKS,
    DEEPEP_LL_GENERATIONS,
    SGLANG_DEEPEP_TOKENS_MAX,
    uses_deepep_low_latency,
)
from autoshard.specs.cluster import GpuSpec
from autoshard.specs.model import ModelSpec

__all__ = ["ENGINES", "DEFAULT_ENGINE", "ENGINE_NAMES", "SGLANG_UNPRICED", "sglang_deepep", "sglang_priced",
           "sglang_deepep_seqs", "vllm_deep_gemm",
           "engine_config", "engine_json"]

ENGINES = ("vllm", "sglang")
DEFAULT_ENGINE = "vllm"
"""What a plan with no --target is priced for: vLLM, the first launch line a plan prints, the engine of
its aggregated Kubernetes manifests and the one the serving validation runs measure most."""
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def sglang_deepep(cfg: ServeConfig, gpus_per_node: int, *, split: bool, gpu: GpuSpec | None = None) -> bool:
    """Whether autoshard launches this SGLang instance with `--moe-a2a-backend deepep`: an aggregated
    attention-DP + EP engine (one node or several) on a GPU DeepEP's low-latency kernels run on and at
    an EP size DeepEP has a config for (`gpu` None: not checked); an expert-parallel instance of a
    prefill/decode split (`split`) over more than one node."""
    if split:
        return cfg.expert_parallel and cfg.gpus > gpus_per_node and (cfg.dp_attention == 1 or _deepep_runs(cfg, gpu))
    return cfg.expert_parallel and cfg.dp_attention > 1 and _deepep_runs(cfg, gpu)


def _deepep_runs(cfg: ServeConfig, gpu: GpuSpec | None) -> bool:
    return cfg.ep in DEEPEP_EP_RANKS and (gpu is None or gpu_generation(gpu.name) in DEEPEP_LL_GENERATIONS)


def sglang_deepep_seqs(model: ModelSpec, gpu: GpuSpec, cfg: ServeConfig) -> int | None:
    """The most running requests per attention-DP rank an SGLang engine on DeepEP (`cfg` as
    `engine_config` sets it) runs: SGLang takes a decode batch in one pass through DeepEP's
    low-latency buffer, which autoshard's lines size for at most SGLANG_DEEPEP_TOKENS_MAX tokens per
    rank (`ep_buffers.sglang_deepep_tokens`); None where no such bound applies."""
    if cfg.engine == "sglang" and cfg.deep_gemm and uses_deepep_low_latency(model, gpu, cfg):
        return SGLANG_DEEPEP_TOKENS_MAX // (1 + cfg.speculative_tokens)
    return None


def vllm_deep_gemm(cfg: ServeConfig, gpu: GpuSpec | None) -> bool:
    """`ServeConfig.deep_gemm` of a vLLM 0.33.0 engine: False for TP-sharded experts (no expert
    parallelism) on Hopper, where vLLM's FP8 MoE oracle puts Triton first for block-scaled FP8
    ("On Hopper for Block Fp8, prefer Triton for TP and FI CUTLASS for EP",
    model_executor/layers/fused_moe/oracle/fp8.py:122-132), so no step runs DeepGEMM; True elsewhere
    (`gpu` None: not known). With expert parallelism vLLM 0.33.0 prefers FlashInfer's CUTLASS grouped
    GEMM (behind DeepEP low-latency a batched kernel): no measurement of it is at hand, so it is priced
    as the nearest kernel modelled, DeepGEMM's grouped block-FP8 GEMM (`serve.fused_moe`, its shape rules
    included: at TP 8 those price Triton)."""
    return cfg.expert_parallel or gpu is None or gpu_generation(gpu.name) != "hopper"


def engine_config(cfg: ServeConfig, engine: str, *, gpus_per_node: int, split: bool = False,
                  gpu: GpuSpec | None = None) -> ServeConfig:
    """`cfg` as `engine` ("vllm" or "sglang") runs it when autoshard's launch line starts it (see the
    module docstring); `split`: an instance of a prefill/decode deployment; `gpu`: its GPU (None:
    assumed to run DeepEP)."""
    if engine == "vllm":
        deep_gemm = vllm_deep_gemm(cfg, gpu)
        if cfg.engine == "vllm" and cfg.deep_gemm == deep_gemm and cfg.nccl_nvls:
            return cfg
        return dataclasses.replace(cfg, engine="vllm", deep_gemm=deep_gemm, nccl_nvls=True)
    if engine == "sglang":
        deepep = sglang_deepep(cfg, gpus_per_node, split=split, gpu=gpu)
        return dataclasses.replace(cfg, engine="sglang", deep_gemm=deepep, nccl_nvls=False)
    raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")


def engine_json(cfg: ServeConfig) -> dict[str, object]:
    """What a prediction of `cfg` is priced for, as the plan JSON states it (`autoshard.plan/v1` key
    "engine"): the engine and the two settings in which the engines' launch lines differ."""
    return {"priced_for": cfg.engine, "name": ENGINE_NAMES[cfg.engine], "moe_deep_gemm": cfg.deep_gemm,
            "nccl_nvls": cfg.nccl_nvls}


SGLANG_UNPRICED = ("SGLang runs attention-DP + EP through DeepEP (--moe-a2a-backend deepep) only on Hopper or "
                   "Blackwell GPUs, at EP sizes DeepEP has a config for (" + ", ".join(map(str, DEEPEP_EP_RANKS))
                   + ") and, in a prefill/decode split, on instances over more than one node; elsewhere its line "
                   "runs the all-gather dispatch with Triton experts, a path autoshard does not price (attention DP "
                   "with tensor-parallel experts is priced for aggregated engines only)")
"""Why such SGLang instances are left out of SGLang-priced plans (`sglang_priced`)."""


def sglang_priced(cfg: ServeConfig, gpus_per_node: int, *, split: bool = False, gpu: GpuSpec | None = None) -> bool:
    """Whether autoshard prices the path SGLang runs for this instance. An attention-DP + EP engine is
    priced with DeepEP's all-to-all (`serve.sharding.ep_dispatch_s`, `serve.ep_buffers`); SGLang runs
    it under the --moe-a2a-backend deepep autoshard's lines pass where `sglang_deepep` holds; without
    it SGLang gathers every DP rank's tokens onto each rank and runs Triton's fused_moe over its local
    experts, which is not priced."""
    if cfg.dp_attention > 1 and not cfg.expert_parallel:  # TP experts (`serve.dp_tp_moe`): aggregated only
        return not split
    return not (cfg.expert_parallel and cfg.dp_attention > 1) or sglang_deepep(cfg, gpus_per_node, split=split, gpu=gpu)
