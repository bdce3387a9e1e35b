"""Plan -> one `torchrun ... pretrain_gpt.py` command (the JSON `launch.megatron` field): launch
geometry (processes per node, nodes), the CUDA_DEVICE_MAX_CONNECTIONS rule, and the flag lines.

CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron asserts it when TP > 1 or CP > 1 on GPUs older than Blackwell
(AMD GPUs included), and asserts it is *not* 1 under Megatron-FSDP. With the EP all-to-all overlap it only
warns, and the overlap wants several hardware queues: such plans set it to 32 and leave 24 SMs to the
dispatcher in the normalization kernels (A2A_ENV, as Megatron-MoE-ModelZoo's A2A_OVERLAP=1 does).
"""

from __future__ import annotations

import math
import re

from autoshard.costmodel.band_table import gpu_generation
from autoshard.emit.megatron.args import megatron_args
from autoshard.emit.shell import shell_word
from autoshard.plans.train import Plan

__all__ = ["A2A_ENV", "ENTRY_POINT", "MASTER_PORT", "megatron_command", "needs_single_cuda_connection", "needs_ub_skipmc", "launch_geometry",
           "flag_lines", "join_lines"]

ENTRY_POINT = "pretrain_gpt.py"
MASTER_PORT = 6000

def _is_blackwell_or_newer(gpu_name: str) -> bool:
    name = gpu_name.upper()
    return bool(re.match(r"^G?B[1-9]\d\d(?![0-9])", name)) or "BLACKWELL" in name or "RUBIN" in name


A2A_ENV = (("CUDA_DEVICE_MAX_CONNECTIONS", "32"), ("NVTE_FWD_LAYERNORM_SM_MARGIN", "24"),
           ("NVTE_BWD_LAYERNORM_SM_MARGIN", "24"))
"""The environment of an EP all-to-all overlap plan: Megatron-MoE-ModelZoo `sbatch_benchmarking.sh`
(A2A_OVERLAP=1); costmodel.train.a2a_overlap.COMM_SMS prices the 24 SMs."""


def needs_single_cuda_connection(plan: Plan) -> bool:
    """Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 when TP > 1 or CP > 1 on pre-Blackwell GPUs,
    except under FSDP (which needs it unset or > 1) and with the EP all-to-all overlap (which only warns
    and sets it to 32: A2A_ENV)."""
    dims = plan.config.dims
    if dims.tp == 1 and dims.cp == 1 or plan.config.zero_stage >= 2 or plan.config.moe_a2a_overlap:
        return False
    pools = {s.pool for s in plan.stages}
    return any(not _is_blackwell_or_newer(plan.cluster.pools[p].gpu.name) for p in pools)


# GPUs of compute capability below 9.0: Transformer Engine's userbuffers cannot use CUDA multicast there
_NO_MULTICAST = frozenset({"ampere", "ada", "volta"})


def needs_ub_skipmc(plan: Plan) -> bool:
    """Transformer Engine's comm+GEMM overlap (`--tp-comm-overlap`) builds CUDA multicast objects,
    which need compute capability 9.0+; on older GPUs (A100, L40S) it stops at start-up unless
    UB_SKIPMC=1 selects its CUDA-IPC path (Transformer Engine, examples/pytorch/comm_gemm_overlap)."""
    if not any(flag == "--tp-comm-overlap" for flag, _ in megatron_args(plan)):
        return False
    pools = {s.pool for s in plan.stages}
    return any(gpu_generation(plan.cluster.pools[p].gpu.name) in _NO_MULTICAST for p in pools)


def launch_geometry(plan: Plan) -> tuple[int, int]:
    """(processes per node, nodes) for torchrun: whole nodes of the first stage's pool."""
    world = plan.config.dims.world_size
    per_node = plan.cluster.pools[plan.stages[0].pool].node.gpus_per_node
    if world <= per_node:
        return world, 1
    nproc = math.gcd(world, per_node)
    return nproc, world // nproc


def flag_lines(plan: Plan) -> list[str]:
    lines = []
    for flag, value in megatron_args(plan):
        if value is None:
            lines.append(flag)
        elif flag == "--recompute-modules":  # nargs='*': one word per module
            lines.append(f"{flag} " + " ".join(shell_word(v) for v in value.split()))
        else:
            lines.append(f"{flag} {shell_word(value)}")
    return lines


def join_lines(head: list[str], lines: list[str]) -> str:
    return " \\\n    ".join([*head, *lines]) + "\n"


def megatron_command(plan: Plan) -> str:
    """One `torchrun ... pretrain_gpt.py ...` command line, `\\`-continued, run from a Megatron-LM
    checkout on every node with NODE_RANK, MASTER_ADDR, DATA_PATH, TOKENIZER_MODEL and CKPT_DIR set."""
    nproc, nnodes = launch_geometry(plan)
    env = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if needs_single_cuda_connection(plan) else ""
    if plan.config.moe_a2a_overlap:
        env += "".join(f"{k}={v} " for k, v in A2A_ENV)
    if needs_ub_skipmc(plan):
        env += "UB_SKIPMC=1 "
    if nnodes == 1:
        rank, addr = "0", "localhost"
    else:
        rank, addr = '"$NODE_RANK"', '"$MASTER_ADDR"'
    head = [
        f"{env}torchrun --nproc-per-node {nproc} --nnodes {nnodes} --node-rank {rank}",
        f"--master-addr {addr} --master-port {MASTER_PORT}",
        ENTRY_POINT,
    ]
    return join_lines(head, flag_lines(plan))


