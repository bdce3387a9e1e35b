"""Plan -> a complete multi-node bash script for its Megatron-LM launch (`megatron_script`), and the
notes on what Megatron-LM cannot say exactly as the plan does (`megatron_notes`, written into the script
as NOTE comments) instead of silently changing it.

The launch itself is built next door: the flags in `args.py` (`megatron_args`), the `torchrun` command
in `command.py` (`megatron_command`).
"""

from __future__ import annotations

import textwrap

from autoshard.emit.megatron.args import pipeline_layout
from autoshard.emit.megatron.command import (
    A2A_ENV,
    ENTRY_POINT,
    MASTER_PORT,
    flag_lines,
    join_lines,
    launch_geometry,
    needs_single_cuda_connection,
    needs_ub_skipmc,
)
from autoshard.emit.megatron.rope import rope_notes
from autoshard.emit.shell import comment, path_component, shell_word
from autoshard.parallel import Recompute
from autoshard.plans.train import Plan
from autoshard.specs.layers import MlpKind, PositionKind

__all__ = ["megatron_script", "megatron_notes"]


def megatron_notes(plan: Plan) -> list[str]:
    """What the Megatron-LM launch cannot say exactly as the plan does (empty for most plans)."""
    model, cfg = plan.model, plan.config
    notes: list[str] = []
    if cfg.recompute is Recompute.SELECTIVE and plan.recompute_num_layers > 0:
        notes.append(
            "the plan combines selective recompute with full recompute of the first "
            f"{plan.recompute_num_layers} decoder layer(s) of each stage; Megatron-LM takes one "
            "--recompute-granularity, so the launch uses block full recompute only (the other layers "
            "keep all activations: a little more memory than planned)"
        )
    per_stage = {s.full_recompute_layers for s in plan.stages}
    if cfg.recompute is not Recompute.FULL and len(per_stage) > 1:
        notes.append(
            f"stages fully recompute different numbers of layers ({sorted(per_stage)}); Megatron-LM's "
            "--recompute-num-layers is one number for every stage, so each recomputes "
            f"{plan.recompute_num_layers}"
        )
    if model.position_embedding is PositionKind.ALIBI:
        notes.append("Megatron-LM has no ALiBi; the launch uses rotary position embeddings (same cost)")
    notes += rope_notes(model)
    if model.mlp is MlpKind.RELU:
        notes.append("Megatron-LM has no plain-ReLU MLP flag; the launch uses its default GeLU (same shapes)")
    if model.mlp is MlpKind.GEGLU:
        notes.append("Megatron-LM has no tanh-GELU gated MLP flag; the launch uses --quick-geglu (the same gated "
                     "shapes and cost, gated by quick-GELU)")
    windows = sorted({w for w in model.decoder_windows if w is not None})
    if len(windows) > 1:
        notes.append(f"Megatron-LM takes one --window-size for every sliding-window layer; the launch runs all of "
                     f"them at the largest, {windows[-1]:,} tokens, where the plan priced each at its own "
                     f"({', '.join(f'{w:,}' for w in windows[:-1])}): more attention work than planned, so the "
                     "launched step is longer than predicted (evaluate --from-megatron on it prices what it runs)")
    if cfg.seq_len > model.max_position_embeddings:
        notes.append(
            f"--max-position-embeddings raised from {model.max_position_embeddings} to the sequence length "
            f"{cfg.seq_len} (Megatron-LM requires max positions >= sequence length)"
        )
    if model.moe is not None and cfg.dims.tp > 1 and not cfg.sp:
        notes.append(
            "Megatron-LM wants sequence parallelism for MoE with TP > 1 (it warns; its YAML config "
            "path refuses): the plan does not use it"
        )
    if cfg.tp_comm_overlap and not cfg.sp:
        notes.append("--tp-comm-overlap needs sequence parallelism, which the plan does not use: left out")
    pools = sorted({s.pool for s in plan.stages})
    per_node = {plan.cluster.pools[p].node.gpus_per_node for p in pools}
    nproc, nnodes = launch_geometry(plan)
    if len(per_node) > 1 and node_sizes(plan) is not None:
        notes.append(
            f"the pools have {sorted(per_node)} GPUs per node: each node starts its own pool's count (GPUS_PER_NODE "
            "below, by NODE_RANK); torchrun numbers the ranks in node order, so the pipeline stages land on the pools"
        )
    elif len(per_node) > 1:
        notes.append(
            f"the pools have {sorted(per_node)} GPUs per node; torchrun starts {nproc} on every node"
        )
    elif nnodes > 1 and nproc != next(iter(per_node)):
        notes.append(f"{cfg.dims.world_size} GPUs do not fill whole nodes: torchrun starts {nproc} per node")
    if len(pools) > 1:
        notes.append("heterogeneous cluster: " + _node_pools(plan))
    return notes


def node_sizes(plan: Plan) -> list[tuple[int, str]] | None:
    """(processes, pool name) of each node in NODE_RANK order when the plan's pools differ in GPUs per node
    and every node holds ranks of one pool only (pipeline rank is Megatron's outermost rank dimension);
    None otherwise (one torchrun geometry for every node, `launch_geometry`). torchrun's elastic agent
    numbers the ranks in node order by each node's own process count (`_assign_worker_ranks`: a node's
    first rank is the sum of the counts of the nodes before it), so nodes of 4 and 8 GPUs may share a job."""
    dims, pools = plan.config.dims, plan.cluster.pools
    stage_pool = [plan.stages[r].pool for r in range(dims.pp)]
    if len({pools[p].node.gpus_per_node for p in stage_pool}) < 2:
        return None
    per_rank = dims.world_size // dims.pp
    nodes: list[tuple[int, str]] = []
    rank = 0
    while rank < dims.world_size:
        pool = stage_pool[rank // per_rank]
        n = pools[pool].node.gpus_per_node
        if rank + n > dims.world_size or stage_pool[(rank + n - 1) // per_rank] != pool:
            return None  # a node would hold ranks of two pools
        nodes.append((n, pools[pool].name))
        rank += n
    return nodes


def _node_pools(plan: Plan) -> str:
    """Which NODE_RANKs must run on which pool: pipeline rank is Megatron's outermost rank dimension."""
    dims = plan.config.dims
    if (sized := node_sizes(plan)) is not None:
        return "; ".join(f"NODE_RANK {a}-{b} on pool {p}" if a != b else f"NODE_RANK {a} on pool {p}"
                         for a, b, p, _ in _spans(sized))
    nproc, nnodes = launch_geometry(plan)
    per_rank = dims.world_size // dims.pp
    groups: list[tuple[int, int, str]] = []
    for n in range(nnodes):
        pool = plan.cluster.pools[plan.stages[min(dims.pp - 1, n * nproc // per_rank)].pool].name
        if groups and groups[-1][2] == pool:
            groups[-1] = (groups[-1][0], n, pool)
        else:
            groups.append((n, n, pool))
    spans = [
        f"NODE_RANK {a}-{b} on pool {p}" if a != b else f"NODE_RANK {a} on pool {p}" for a, b, p in groups
    ]
    return "; ".join(spans)


def _spans(nodes: list[tuple[int, str]]) -> list[tuple[int, int, str, int]]:
    """Runs of consecutive nodes of one pool: (first NODE_RANK, last, pool, processes per node)."""
    spans: list[tuple[int, int, str, int]] = []
    for i, (n, pool) in enumerate(nodes):
        if spans and spans[-1][2] == pool and spans[-1][3] == n:
            spans[-1] = (spans[-1][0], i, pool, n)
        else:
            spans.append((i, i, pool, n))
    return spans


def _summary(plan: Plan) -> list[str]:
    cfg, dims, model = plan.config, plan.config.dims, plan.model
    nproc, nnodes = launch_geometry(plan)
    gpus = list(dict.fromkeys(plan.cluster.pools[s.pool].gpu.name for s in plan.stages))
    degrees = f"TP {dims.tp}, PP {dims.pp}, VPP {dims.vpp}, CP {dims.cp}, DP {dims.dp}"
    if model.moe is not None:
        degrees += f", EP {dims.ep}, ETP {dims.expert_tp}"
    if cfg.sp:
        degrees += ", sequence parallel"
    recompute = cfg.recompute.value
    n = plan.recompute_num_layers
    if n and cfg.recompute is not Recompute.FULL:
        block = f"full recompute of the first {n} decoder layer{'s' if n > 1 else ''} of each stage"
        recompute = block if cfg.recompute is Recompute.NONE else f"{recompute} + {block}"
    zero = {
        0: "ZeRO-0 (plain data parallel)",
        1: "ZeRO-1 (distributed optimizer)",
        2: "ZeRO-2 (Megatron-FSDP optim_grads)",
        3: "ZeRO-3 (Megatron-FSDP optim_grads_params)",
    }
    layout = pipeline_layout(model, plan.stages) if len(plan.stages) > 1 else None
    sized = node_sizes(plan)
    shape = (f"{len(sized)} nodes ({', '.join(f'{b - a + 1} x {n}' for a, b, _, n in _spans(sized))} GPUs)"
             if sized else f"{nnodes} node{'s' if nnodes > 1 else ''} x {nproc} GPUs")
    lines = [
        f"{dims.world_size} GPUs = {shape} ({', '.join(gpus)})",
        degrees,
        f"micro-batch {cfg.micro_batch_size}, global batch {cfg.global_batch_size} "
        f"({cfg.num_microbatches} micro-batches per step), sequence length {cfg.seq_len}",
        f"recompute: {recompute}; {zero[cfg.zero_stage]}; {cfg.precision.value}",
        f"layer layout: {layout or 'Megatron default (even split)'}",
        f"vocabulary: {model.vocab_size} tokens, read from $TOKENIZER_MODEL",
    ]
    return lines


def megatron_script(plan: Plan) -> str:
    """A complete bash launch script: rendezvous and data variables (filled by the user), the
    environment Megatron-LM requires, and the torchrun command. Run the same script on every node."""
    nproc, nnodes = launch_geometry(plan)
    world = plan.config.dims.world_size
    sized = node_sizes(plan)
    nnodes = len(sized) if sized else nnodes
    multi = nnodes > 1
    out = [
        "#!/usr/bin/env bash",
        comment(f"# Megatron-LM training launch for {plan.model.name} on {plan.cluster.name}, written by autoshard."),
        "#",
        *(comment(f"#   {line}") for line in _summary(plan)),
        "#",
        "# Run it from a Megatron-LM checkout (or set MEGATRON_LM)" + (" on every node:" if multi else ":"),
        ("#   MASTER_ADDR=<node 0> NODE_RANK=<0.." + str(nnodes - 1) + "> " if multi else "#   ")
        + "DATA_PATH=<dataset prefix> TOKENIZER_MODEL=<tokenizer> bash <this script>",
        "# The training hyper-parameters (--train-iters, --lr, ...) are placeholders: edit them.",
    ]
    for note in megatron_notes(plan):
        out += textwrap.wrap(
            comment(note),
            width=100,
            initial_indent="# NOTE: ",
            subsequent_indent="#       ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    out += ["", "set -euo pipefail", "", "# Rendezvous (set on every node)."]
    if multi:
        out += [
            "MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}",
            f"NODE_RANK=${{NODE_RANK:?set NODE_RANK to the index of this node, 0..{nnodes - 1}}}",
        ]
    else:
        out += ["MASTER_ADDR=${MASTER_ADDR:-localhost}", "NODE_RANK=${NODE_RANK:-0}"]
    out += [f"MASTER_PORT=${{MASTER_PORT:-{MASTER_PORT}}}", f"NNODES=${{NNODES:-{nnodes}}}"]
    if sized:  # each node starts its own pool's GPUs
        spans = _spans(sized)
        bad = f'echo "NODE_RANK must be 0..{nnodes - 1}" >&2; exit 1'
        out += [f"if (( NODE_RANK < 0 )); then {bad}"]
        out += [f"elif (( NODE_RANK <= {b} )); then GPUS_PER_NODE={n}  # pool {comment(pool)}" for _, b, pool, n in spans]
        out += [f"else {bad}", "fi",
                f"if (( NNODES != {nnodes} )); then",
                f'  echo "this plan needs exactly {world} GPUs on {nnodes} nodes; got NNODES=$NNODES" >&2']
    else:
        out += [f"GPUS_PER_NODE={nproc}", f"if (( NNODES * GPUS_PER_NODE != {world} )); then",
                f'  echo "this plan needs exactly {world} GPUs ({nnodes} x {nproc}); got NNODES=$NNODES" >&2']
    out += [
        "  exit 1",
        "fi",
        "",
        "# Data, tokenizer and checkpoints.",
        "DATA_PATH=${DATA_PATH:?set DATA_PATH to a Megatron-LM indexed dataset prefix "
        "(path/to/corpus_text_document)}",
        "TOKENIZER_MODEL=${TOKENIZER_MODEL:?set TOKENIZER_MODEL to a Hugging Face tokenizer name "
        "or directory}",
        f"CKPT_DIR=${{CKPT_DIR:-{shell_word('checkpoints/' + path_component(plan.model.name))}}}",
        "MEGATRON_LM=${MEGATRON_LM:-$PWD}",
        "",
    ]
    if needs_single_cuda_connection(plan):
        out += [
            "# Megatron-LM requires one CUDA hardware queue with TP or CP > 1 on pre-Blackwell GPUs.",
            "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        ]
    elif plan.config.moe_a2a_overlap:
        out += [
            "# EP all-to-all overlap: several CUDA hardware queues for its two streams, and 24 SMs the",
            "# normalization kernels leave to the token dispatcher (Megatron-MoE-ModelZoo A2A_OVERLAP=1).",
            *(f"export {k}={v}" for k, v in A2A_ENV),
        ]
    elif plan.config.zero_stage >= 2:
        out += [
            "# Megatron-FSDP requires CUDA_DEVICE_MAX_CONNECTIONS unset or > 1.",
            "unset CUDA_DEVICE_MAX_CONNECTIONS",
        ]
    if needs_ub_skipmc(plan):
        out += [
            "# --tp-comm-overlap: Transformer Engine needs CUDA multicast (compute capability 9.0+) unless",
            "# UB_SKIPMC=1 selects its CUDA-IPC path, as on these GPUs.",
            "export UB_SKIPMC=1",
        ]
    if out[-1]:
        out.append("")
    head = [
        'torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK"',
        '--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"',
        f'"$MEGATRON_LM/{ENTRY_POINT}"',
    ]
    return "\n".join(out) + "\n" + join_lines(head, flag_lines(plan))
