"""ServePlan -> `vllm serve` command lines (vLLM 0.33 flag names and rules).

One line per node. A deployment that fits one node is one command. Beyond one node:
- engines of at most one node (data-parallel ranks spread over nodes): vLLM's multi-node data
  parallelism, `--data-parallel-size D --data-parallel-size-local L --data-parallel-address HEAD
  --data-parallel-rpc-port P` on every node, `--headless --data-parallel-start-rank` on all but the head;
- engines that span nodes (TP x PP beyond one node; TP itself never leaves a node): the multiprocessing
  executor over nodes, `--nnodes N --node-rank R --master-addr HEAD --master-port P
  --distributed-executor-backend mp`, `--headless` on all but the head.
`$HEAD_IP` is left for the shell to expand: export it on every node before running the line.

Weights: a published checkpoint with the plan's weight dtype (the model file's `checkpoints:`) is the
model path, with the --quantization its quantization_config selects; without one, fp8 is
`--quantization fp8` on the BF16 checkpoint (vLLM quantizes it online, on load). int8 and int4 have no
online path for a BF16 checkpoint: without a published checkpoint there is no command (SpecError).
The KV cache is `auto` (the model dtype) or `fp8`.

MoE engines with expert parallelism over attention-DP ranks on Hopper or Blackwell run DeepEP's
low-latency all-to-all (`--all2all-backend deepep_low_latency`), as the cost model prices them: each
step's MoE in one pass (vLLM 0.33.0) and DeepEP's buffers in the engine's memory at the plan's
`--max-num-batched-tokens`, which vLLM 0.33.0 sizes them for (`costmodel.serve.ep_buffers`; the plan
chooses that budget, `search.serve.budget`, and the line passes it); vLLM's default (allgather_reducescatter) would
run another path than the one priced. Prefill instances of a split deployment switch to
`deepep_high_throughput` (emit/pd.py), which takes a prefill batch whole, as priced.
"""

from __future__ import annotations

import json

from autoshard.costmodel.serve.ep_buffers import uses_deepep_low_latency
from autoshard.emit.shell import shell_join
from autoshard.errors import SpecError
from autoshard.plans.serve import ServePlan, model_path
from autoshard.specs.job import WeightDtype
from autoshard.specs.model import Checkpoint, ModelSpec

__all__ = ["vllm_command", "vllm_node_commands", "vllm_quantization", "no_checkpoint", "VLLM_QUANTIZATION",
           "VLLM_KV_CACHE_DTYPE", "HEAD_ADDRESS", "all2all_backend", "native_checkpoint", "serve_weight_dtype"]

HEAD_ADDRESS = "$HEAD_IP"
DP_RPC_PORT = 13345
MASTER_PORT = 29501

VLLM_QUANTIZATION: dict[WeightDtype, str | None] = {  # on the BF16 checkpoint (online quantization)
    WeightDtype.BF16: None,
    WeightDtype.FP8: "fp8",
}
VLLM_KV_CACHE_DTYPE: dict[WeightDtype, str] = {WeightDtype.BF16: "auto", WeightDtype.FP8: "fp8"}


def _base(plan: ServePlan) -> list[str]:
    words = [
        "vllm",
        "serve",
        plan.model_path,
        "--tensor-parallel-size",
        str(plan.tp),
        "--pipeline-parallel-size",
        str(plan.pp),
    ]
    if plan.dp > 1:
        words += ["--data-parallel-size", str(plan.dp)]
    if plan.expert_parallel:
        words.append("--enable-expert-parallel")
    backend = all2all_backend(plan)
    if backend:
        words += ["--all2all-backend", backend]
    words += [
        "--max-model-len",
        str(plan.max_model_len),
        "--gpu-memory-utilization",
        f"{plan.gpu_memory_utilization:.2f}",
        "--max-num-seqs",
        str(plan.max_num_seqs),
        "--max-num-batched-tokens",
        str(plan.max_num_batched_tokens),
        "--kv-cache-dtype",
        VLLM_KV_CACHE_DTYPE[plan.job.kv_cache_dtype],
    ]
    quant = vllm_quantization(plan)
    if quant:
        words += ["--quantization", quant]
    drafts = speculative_tokens(plan)
    if drafts:
        words += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": drafts},
                                                     separators=(",", ":"))]
    return words


def all2all_backend(plan: ServePlan) -> str | None:
    """`deepep_low_latency` where the cost model prices DeepEP's low-latency kernels (expert parallelism
    over attention-DP ranks on Hopper/Blackwell, `uses_deepep_low_latency`), `deepep_high_throughput`
    for such an engine priced on the high-throughput backend (`ServeConfig.role` "prefill": a prefill
    instance, or a line read back with that backend), else None (vLLM's default): also for a line read
    back on vLLM's default allgather_reducescatter (`ServeConfig.all2all_backend`, which runs no DeepEP)
    or on another backend (its engine priced in 256-token passes, `ServeConfig.moe_dp_chunk`: vLLM
    0.33.0 chunks no DeepEP pass, `search.serve.evaluate.batched_dp_backend`), relaunched as it was."""
    pred = plan.prediction
    if (pred is None or not uses_deepep_low_latency(plan.model, plan.pool.gpu, pred.config)
            or pred.config.moe_dp_chunk is not None):
        return None
    return "deepep_high_throughput" if pred.config.role == "prefill" else "deepep_low_latency"


def speculative_tokens(plan: ServePlan) -> int:
    """MTP draft tokens per decode step the plan's engine runs (its prediction's `speculative_tokens`;
    0 for plans without one)."""
    pred = plan.prediction
    return pred.config.speculative_tokens if pred is not None else 0


def vllm_quantization(plan: ServePlan) -> str | None:
    """--quantization for the plan's weights: the published checkpoint's method, else online FP8 on the
    BF16 checkpoint. SpecError for int8/int4 without a published checkpoint."""
    ckpt = plan.checkpoint
    if ckpt is not None:
        return ckpt.quantization
    wd = plan.job.weight_dtype
    if wd not in VLLM_QUANTIZATION:
        raise no_checkpoint(plan.model.name, wd)
    return VLLM_QUANTIZATION[wd]


def no_checkpoint(model_name: str, weights: WeightDtype, flag: str = "--weight-dtype") -> SpecError:
    """The error for int8/int4 weights with no published checkpoint to load."""
    return SpecError(
        f"{weights.value} weights need a published {weights.value} checkpoint of {model_name} (vLLM and SGLang only "
        f"quantize BF16 weights online, to fp8): name one under `checkpoints:` in the model file, or use "
        f"{flag} fp8 or bf16", source=flag)


def check_checkpoint(model: ModelSpec, weights: WeightDtype, flag: str = "--weight-dtype") -> None:
    """The emitters' rule (`vllm_quantization`), before solving: what engines cannot quantize online needs
    a published checkpoint (SpecError naming `flag`)."""
    if weights not in VLLM_QUANTIZATION and not any(c.weights is weights for c in model.checkpoints):
        raise no_checkpoint(model.name, weights, flag)


def native_checkpoint(model: ModelSpec) -> Checkpoint | None:
    """The quantized checkpoint published under the model's own repository (DeepSeek-V3's and Kimi K2's
    block-scaled FP8 weights, an imported AWQ or GPTQ config.json): the weights a launch command naming
    that repository loads, whatever the plan's weight dtype."""
    own = model_path(model)
    return next((c for c in model.checkpoints if c.repo == own), None)


def serve_weight_dtype(model: ModelSpec, requested: str | WeightDtype | None, *,
                       flag: str = "--weight-dtype") -> str | None:
    """The weight dtype a serving job plans for: the requested one, else the model's own repository's
    (FP8 for DeepSeek-V3). A dtype the launchers cannot serve from the model's quantized-only repository
    (BF16 from an FP8 repo, FP8 from an AWQ repo) with no other checkpoint listed for it is refused: the
    plan would price weights the command does not load."""
    own = native_checkpoint(model)
    if own is None:
        return None if requested is None else WeightDtype(requested).value
    if requested is None:
        return own.weights.value
    wanted = WeightDtype(requested)
    if wanted is own.weights or any(c.weights is wanted for c in model.checkpoints):
        return wanted.value
    method = f" ({own.quantization})" if own.quantization != own.weights.value else ""
    raise SpecError(
        f"{own.repo} publishes {own.weights.value} weights{method}, not {wanted.value}: vLLM and "
        f"SGLang load them as {own.weights.value} whatever the plan says, so a {wanted.value} plan would not "
        f"describe the run; use {flag} {own.weights.value} (this model's default), or a model file "
        f"whose source or `checkpoints:` name a {wanted.value} repository", source=flag)


def vllm_node_commands(plan: ServePlan) -> list[str]:
    """The command for every node of the deployment, head node first; prefixed with
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 when its max model length is past the model's context (a line read
    back with it: vLLM 0.33.0 refuses to start without it, config/model.py:2652-2683)."""
    long = plan.max_model_len > plan.model.max_position_embeddings
    return [("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 " if long else "") + line for line in _node_lines(plan)]


def _node_lines(plan: ServePlan) -> list[str]:
    per_node = plan.pool.node.gpus_per_node
    rank_gpus = plan.tp * plan.pp
    base = _base(plan)
    if plan.num_gpus <= per_node:
        return [shell_join(base)]
    if rank_gpus <= per_node:
        local = per_node // rank_gpus
        nodes = -(-plan.dp // local)
        out = []
        for k in range(nodes):
            words = base + [
                "--data-parallel-size-local",
                str(min(local, plan.dp - k * local)),
                "--data-parallel-address",
                HEAD_ADDRESS,
                "--data-parallel-rpc-port",
                str(DP_RPC_PORT),
            ]
            if k:
                words += ["--headless", "--data-parallel-start-rank", str(k * local)]
            out.append(shell_join(words))
        return out
    nodes = -(-plan.num_gpus // per_node)
    out = []
    for k in range(nodes):
        words = base + [
            "--nnodes",
            str(nodes),
            "--node-rank",
            str(k),
            "--master-addr",
            HEAD_ADDRESS,
            "--master-port",
            str(MASTER_PORT),
            "--distributed-executor-backend",
            "mp",
        ]
        if k:
            words.append("--headless")
        out.append(shell_join(words))
    return out


def vllm_command(plan: ServePlan, *, node_rank: int = 0) -> str:
    """The `vllm serve` line for one node (the head node by default)."""
    commands = vllm_node_commands(plan)
    if not 0 <= node_rank < len(commands):
        raise ValueError(f"node_rank {node_rank} out of range: the deployment has {len(commands)} nodes")
    return commands[node_rank]
