"""Which engine a serving prediction is for: the `ServeConfig` settings in which vLLM and SGLang differ
for the same TP / PP / EP / attention-DP engine, as autoshard's own launch lines start them
(`autoshard.emit.vllm`, `autoshard.emit.sglang`, `autoshard.emit.pd`), so that a plan is priced on the
kernels of the engine it is launched with.

- vLLM (`ServeConfig` as it is): the vllm/vllm-openai image, which builds DeepGEMM (`deep_gemm`:
  vLLM v0.11.0 Fp8MoEMethod sets allow_deep_gemm from VLLM_USE_DEEP_GEMM, default 1, and an installed
  DeepGEMM, vllm/model_executor/layers/quantization/fp8.py:454-463, vllm/envs.py:1148-1149), with
  NCCL's NVLink SHARP left on (NCCL's default, which vLLM keeps).
- SGLang: its block-FP8 MoE layers run DeepGEMM only under `--moe-runner-backend deep_gemm`, or `auto`
  behind the DeepEP / Mooncake all-to-all (Fp8MoEMethod.create_moe_runner,
  `is_deepgemm_moe_runner_backend_enabled`), else Triton's fused_moe. autoshard's aggregated SGLang
  lines pass neither, and its prefill/decode lines add `--moe-a2a-backend deepep` only to
  expert-parallel instances spanning more than one node (`emit.pd.uses_deepep`): TP-sharded experts run
  Triton. SGLang sets NCCL_NVLS_ENABLE to 0 unless --enable-nccl-nvls (`_set_envs_and_config`,
  sglang/srt/entrypoints/engine.py), which autoshard's lines do not pass. `evaluate --from-sglang` reads
  the same two settings off a command (`emit.sglang.parse`).

Pure functions: no I/O.
"""

from __future__ import annotations

import dataclasses

from autoshard.costmodel.serve.config import ServeConfig

__all__ = ["ENGINES", "DEFAULT_ENGINE", "ENGINE_NAMES", "SGLANG_UNPRICED", "sglang_deepep", "sglang_priced",
           "engine_config", "engine_json"]

ENGINES = ("vllm", "sglang")
DEFAULT_ENGINE = "vllm"
"""What a plan with no --target is priced for: vLLM, the first launch line a plan prints, the engine of
its aggregated Kubernetes manifests and the one the serving validation runs measure most."""
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def sglang_deepep(cfg: ServeConfig, gpus_per_node: int, *, split: bool) -> bool:
    """Whether autoshard launches this SGLang instance with `--moe-a2a-backend deepep`: an
    expert-parallel instance of a prefill/decode split (`split`) over more than one node."""
    return split and cfg.expert_parallel and cfg.gpus > gpus_per_node


def engine_config(cfg: ServeConfig, engine: str, *, gpus_per_node: int, split: bool = False) -> ServeConfig:
    """`cfg` as `engine` ("vllm" or "sglang") runs it when autoshard's launch line starts it (see the
    module docstring); `split`: an instance of a prefill/decode deployment."""
    if engine == "vllm":
        if cfg.engine == "vllm" and cfg.deep_gemm and cfg.nccl_nvls:
            return cfg
        return dataclasses.replace(cfg, engine="vllm", deep_gemm=True, nccl_nvls=True)
    if engine == "sglang":
        deepep = sglang_deepep(cfg, gpus_per_node, split=split)
        return dataclasses.replace(cfg, engine="sglang", deep_gemm=deepep, nccl_nvls=False)
    raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")


def engine_json(cfg: ServeConfig) -> dict[str, object]:
    """What a prediction of `cfg` is priced for, as the plan JSON states it (`autoshard.plan/v1` key
    "engine"): the engine and the two settings in which the engines' launch lines differ."""
    return {"priced_for": cfg.engine, "name": ENGINE_NAMES[cfg.engine], "moe_deep_gemm": cfg.deep_gemm,
            "nccl_nvls": cfg.nccl_nvls}


SGLANG_UNPRICED = ("SGLang's launch line runs attention-DP + EP without DeepEP (all-gather dispatch, Triton "
                   "experts): a path autoshard does not price")
"""Why such SGLang instances are left out of SGLang-priced plans (`sglang_priced`)."""


def sglang_priced(cfg: ServeConfig, gpus_per_node: int, *, split: bool = False) -> bool:
    """Whether autoshard prices the path SGLang runs for this instance. An attention-DP + EP engine is
    priced with DeepEP's all-to-all (`serve.sharding.ep_dispatch_s`, `serve.ep_buffers`); SGLang runs
    it only under --moe-a2a-backend deepep, which autoshard's lines pass to multi-node expert-parallel
    instances of a split deployment (`sglang_deepep`) and nowhere else; without it SGLang gathers every
    DP rank's tokens onto each rank and runs Triton's fused_moe over its local experts, which is not
    priced."""
    return not (cfg.expert_parallel and cfg.dp_attention > 1) or sglang_deepep(cfg, gpus_per_node, split=split)
