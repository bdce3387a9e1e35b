"""ServePlan -> `python -m sglang.launch_server` command lines (SGLang 0.5 flag names and rules).

SGLang counts GPUs as tp_size x pp_size x dp_size; expert parallelism and attention data parallelism
are carved out of the TP group. So a vLLM plan TP t x DP d with expert parallelism becomes
`--tp-size t*d --attn-dp-size d --ep-size t*d` (attention TP t per DP rank, experts over all t*d).

One line per node (head first). SGLang rejects `--dp-size > 1` with `--nnodes > 1`, so:
- replicas of an engine that fits one node: one server per node with `--dp-size` = the replicas it holds
  (put a router, e.g. sglang_router, in front);
- engines spanning nodes: `--nnodes N --node-rank R --dist-init-addr HEAD:5000` per engine; replica
  i > 0 uses its own head address `$HEAD_IP_<i>`.

`--chunked-prefill-size` is per engine: SGLang divides it among the attention-DP ranks, so the line
passes the plan's per-rank budget times the attention-DP size (`sglang_chunked_prefill_size`).

`--mem-fraction-static` is weights plus the KV pool as a share of the memory SGLang measures its budget
from: what is free after its parallel initialization (`costmodel.serve.engine_defaults.sglang_baseline_bytes`:
the capacity less the CUDA context and NCCL's communicators), so that SGLang's pool, fraction x that
baseline - weights, is the plan's: the plan's vLLM budget minus the activation and graph memory SGLang
keeps outside it. Weights: the same checkpoint as vLLM
(`autoshard.emit.vllm.command.vllm_quantization`), with SGLang's name for its method; a method SGLang has no
name for is left to SGLang, which reads it from the checkpoint's quantization_config. KV cache: `auto`
or `fp8_e4m3`.

Attention-DP + EP engines run DeepEP where SGLang can start it (`costmodel.serve.engines.sglang_deepep`:
Hopper/Blackwell, an EP size DeepEP has a config for, one node or several): `--moe-a2a-backend deepep
--deepep-mode auto` (normal kernels for steps with prefill, low-latency ones for decode-only steps; the
MoE runner `auto` then takes DeepGEMM), SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK set to the
planned decode tokens per rank rounded up to 128 (`costmodel.serve.ep_buffers.sglang_deepep_tokens`,
the buffer the plan's memory counts), and `--cuda-graph-max-bs-decode` at the planned requests per
rank, since a captured graph or a batch with more tokens on a rank than the buffer holds fails DeepEP's
assert. A plan with more requests per rank than that buffer allows (at most 256 tokens: autoshard's
SGLang plans never have one) runs fewer under SGLang (`sglang_deepep_seqs`). The variable is a
`VAR=value` prefix of each line (`sglang_env` gives it alone, for Kubernetes manifests).
"""

from __future__ import annotations

import math
import shlex

from autoshard.costmodel.serve.engine_defaults import sglang_baseline_bytes
from autoshard.costmodel.serve.engines import sglang_deepep
from autoshard.costmodel.serve.memory import ServeMemory
from autoshard.costmodel.serve.ep_buffers import (
    SGLANG_DEEPEP_TOKENS_MAX,
    sglang_deepep_tokens,
    uses_deepep_low_latency,
)
from autoshard.emit.vllm.command import HEAD_ADDRESS, speculative_tokens, vllm_quantization
from autoshard.emit.shell import shell_join
from autoshard.plans.serve import ServePlan
from autoshard.costmodel.serve.config import ServeConfig
from autoshard.specs.cluster import GpuSpec, PoolSpec
from autoshard.specs.job import WeightDtype
from autoshard.specs.model import ModelSpec

__all__ = [
    "sglang_command",
    "sglang_node_commands",
    "mem_fraction_static",
    "sglang_memory_utilization",
    "sglang_chunked_prefill_size",
    "runs_deepep",
    "sglang_fp8_problem",
    "sglang_deepep_seqs",
    "sglang_env",
    "SGLANG_DEEPEP_ENV",
    "SGLANG_QUANTIZATION",
    "SGLANG_KV_CACHE_DTYPE",
]

DIST_INIT_PORT = 5000
SGLANG_QUANTIZATION: dict[str, str] = {  # vLLM method -> SGLang 0.5 --quantization
    "fp8": "fp8",
    "modelopt": "modelopt_fp8",
    "gptq_marlin": "gptq_marlin",
    "awq_marlin": "awq_marlin",
    "compressed-tensors": "compressed-tensors",
    "moe_wna16": "moe_wna16",
    "modelopt_fp4": "modelopt_fp4",
    "mxfp4": "mxfp4",
}
SGLANG_KV_CACHE_DTYPE: dict[WeightDtype, str] = {WeightDtype.BF16: "auto", WeightDtype.FP8: "fp8_e4m3"}
SGLANG_DEEPEP_ENV = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


def sglang_fp8_problem(gpus: list[GpuSpec], model: ModelSpec, weights: WeightDtype) -> str | None:
    """Why SGLang cannot serve these FP8 weights of this model on these GPUs, or None. Before compute
    capability 8.9 SGLang runs dense FP8 linears through Marlin (Fp8Config's minimum is 80), but a ModelOpt
    FP8 checkpoint needs 8.9 (ModelOptFp8Config.get_min_capability() is 89; the loader raises "Minimum
    capability: 89") and its FP8 MoE runs Triton kernels in e4m3, which sm80 lacks. vLLM runs all of them
    there through Marlin."""
    old = sorted({g.name for g in gpus if g.fp8_tflops is None})
    if weights is not WeightDtype.FP8 or not old:
        return None
    ckpt = next((c for c in model.checkpoints if c.weights is WeightDtype.FP8), None)
    if model.moe is not None:
        why = "its FP8 MoE kernels need e4m3 (compute capability 8.9)"
    elif ckpt is not None and ckpt.quantization == "modelopt":
        why = f"the ModelOpt FP8 checkpoint {ckpt.repo} needs compute capability 8.9 (its loader's minimum)"
    else:
        return None  # online FP8 on the BF16 checkpoint, or another FP8 method: Marlin on sm80
    return (f"SGLang cannot serve this model's FP8 weights on {', '.join(old)}: {why}; use --target vllm "
            "(Marlin FP8 kernels there) or --weight-dtype bf16")


def runs_deepep(plan: ServePlan) -> bool:
    """Whether the plan's aggregated SGLang line runs DeepEP (see the module docstring)."""
    pred = plan.prediction
    if pred is None:
        return False
    cfg = pred.config
    return uses_deepep_low_latency(plan.model, plan.pool.gpu, cfg) and sglang_deepep(
        cfg, plan.pool.node.gpus_per_node, split=False, gpu=plan.pool.gpu)


def sglang_deepep_seqs(plan: ServePlan) -> int:
    """Running requests per attention-DP rank the DeepEP line allows: the plan's, at most as many as
    SGLANG_DEEPEP_TOKENS_MAX decode tokens per rank hold."""
    return max(1, min(plan.max_num_seqs, SGLANG_DEEPEP_TOKENS_MAX // (1 + speculative_tokens(plan))))


def sglang_env(plan: ServePlan) -> tuple[tuple[str, str], ...]:
    """Environment the plan's aggregated SGLang line needs: DeepEP's low-latency buffer size, or none."""
    if not runs_deepep(plan):
        return ()
    return ((SGLANG_DEEPEP_ENV, str(sglang_deepep_tokens(sglang_deepep_seqs(plan), speculative_tokens(plan)))),)


def sglang_chunked_prefill_size(tokens_per_rank: int, attn_dp: int) -> int:
    """`--chunked-prefill-size` for a prefill budget of `tokens_per_rank` on each attention-DP rank. The
    plan's budget is per DP rank (vLLM's --max-num-batched-tokens: every DP rank runs its own scheduler),
    while SGLang reads the flag per engine and gives each attention-DP rank `chunked_prefill_size //
    attn_dp_size` (sglang 0.5.23 srt/arg_groups/parallel_hook.py:324-332, handle_data_parallelism), so
    the line passes the budget times the attention-DP size."""
    return tokens_per_rank * attn_dp


def mem_fraction_static(plan: ServePlan) -> float:
    """Weights + KV pool as a fraction of SGLang's memory baseline B (`sglang_baseline_bytes`), rounded down
    to 0.001 and kept inside (0.05, 0.95). SGLang 0.5.23 sizes its KV pool as the memory free after the
    weights load less B x (1 - fraction), i.e. fraction x B - weights
    (srt/mem_cache/kv_cache_configurator.py:2990-3061), B measured after its parallel initialization
    (srt/distributed/bootstrap.py:193-223): a fraction of the GPU's capacity instead left the pool
    fraction x (capacity - B) short (2.3 GiB on an H100 at TP 4: 6.1 % of a 70B plan's KV cache).
    Rounded down to 0.01 it lost up to 1 % more."""
    mem = plan.prediction.memory
    static = mem.budget_bytes - mem.activation_bytes - mem.overhead_bytes
    base = sglang_baseline_bytes(plan.pool, plan.prediction.config)
    # rounded down, but not for a float's last bit: a line read back (--from-sglang adds the activations back
    # on top, `sglang_memory_utilization`) writes the fraction it was read with
    return min(0.95, max(0.05, math.floor(1000 * static / base + 1e-9) / 1000))


def sglang_memory_utilization(fraction: float, mem: ServeMemory, pool: PoolSpec, cfg: ServeConfig) -> float:
    """The vLLM-style gpu_memory_utilization of a line with --mem-fraction-static `fraction` (how
    `evaluate --from-sglang` prices it): SGLang's weights + KV pool, fraction x its baseline, plus the
    activations and buffers `mem` (the same engine) keeps outside it, over the capacity."""
    static = fraction * sglang_baseline_bytes(pool, cfg)
    return (static + mem.activation_bytes + mem.overhead_bytes) / mem.capacity_bytes


def _base(plan: ServePlan, *, dp: int, deepep: bool = False) -> list[str]:
    tp = plan.tp * plan.dp_attention
    words = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        plan.model_path,
        "--tp-size",
        str(tp),
        "--pp-size",
        str(plan.pp),
    ]
    if dp > 1:
        words += ["--dp-size", str(dp)]
    if plan.expert_parallel:
        if plan.dp_attention > 1:
            words += ["--attn-dp-size", str(plan.dp_attention)]
        words += ["--ep-size", str(plan.ep)]
    elif plan.dp_attention > 1:  # attention DP with the experts TP-sharded over all ranks (no --ep-size)
        words += ["--attn-dp-size", str(plan.dp_attention)]
    seqs = sglang_deepep_seqs(plan) if deepep else plan.max_num_seqs
    running = seqs * plan.dp_attention
    words += [
        "--context-length",
        str(plan.max_model_len),
        "--mem-fraction-static",
        f"{mem_fraction_static(plan):.3f}",
        "--max-running-requests",
        str(running),
        "--chunked-prefill-size",
        str(sglang_chunked_prefill_size(plan.max_num_batched_tokens, plan.dp_attention)),
        "--kv-cache-dtype",
        SGLANG_KV_CACHE_DTYPE[plan.job.kv_cache_dtype],
    ]
    quant = SGLANG_QUANTIZATION.get(vllm_quantization(plan) or "")
    if quant:
        words += ["--quantization", quant]
    if deepep:
        words += ["--moe-a2a-backend", "deepep", "--deepep-mode", "auto", "--cuda-graph-max-bs-decode", str(seqs)]
    drafts = speculative_tokens(plan)
    if drafts:  # DeepSeek's MTP module as SGLang's EAGLE drafter: one chain of `drafts` tokens
        words += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(drafts),
                  "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(drafts + 1)]
    return words


def _multi_node(base: list[str], nodes: int, head: str) -> list[str]:
    return [
        shell_join(
            base
            + ["--nnodes", str(nodes), "--node-rank", str(k), "--dist-init-addr", f"{head}:{DIST_INIT_PORT}"]
        )
        for k in range(nodes)
    ]


def sglang_node_commands(plan: ServePlan, *, deepep: bool = True, env: bool = True) -> list[str]:
    """The command for every node of the deployment, head node first. `deepep` False leaves DeepEP's
    words out (`emit.pd` adds its own to prefill/decode instances); `env` False leaves out the
    `VAR=value` prefix (`sglang_env`)."""
    deepep = deepep and runs_deepep(plan)
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in sglang_env(plan)) if deepep and env else ""
    if env and plan.max_model_len > plan.model.max_position_embeddings:  # a line read back with it: SGLang
        prefix += "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 "  # refuses to start without it
    return [prefix + line for line in _node_commands(plan, deepep)]


def _node_commands(plan: ServePlan, deepep: bool) -> list[str]:
    per_node = plan.pool.node.gpus_per_node
    if plan.num_gpus <= per_node:
        return [shell_join(_base(plan, dp=plan.replicas, deepep=deepep))]
    engine = plan.engine_gpus
    if plan.expert_parallel:
        return _multi_node(_base(plan, dp=1, deepep=deepep), -(-engine // per_node), HEAD_ADDRESS)
    if engine <= per_node:
        local = per_node // engine
        nodes = -(-plan.replicas // local)
        return [shell_join(_base(plan, dp=min(local, plan.replicas - k * local))) for k in range(nodes)]
    out: list[str] = []
    for i in range(plan.replicas):
        head = HEAD_ADDRESS if i == 0 else f"{HEAD_ADDRESS}_{i}"
        out += _multi_node(_base(plan, dp=1), -(-engine // per_node), head)
    return out


def sglang_command(plan: ServePlan, *, node_rank: int = 0) -> str:
    """The SGLang launch line for one node (the head node by default)."""
    commands = sglang_node_commands(plan)
    if not 0 <= node_rank < len(commands):
        raise ValueError(f"node_rank {node_rank} out of range: the deployment has {len(commands)} nodes")
    return commands[node_rank]
