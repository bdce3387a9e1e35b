"""The training cost model's inputs and outputs: the plan's settings (`TrainConfig`), its model chunks
(`Stage`), and the costs of one layer, one stage and the whole step with their time and memory
breakdowns. Plain frozen dataclasses, no physics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoshard.costmodel.train.memory import TrainFramework
from autoshard.parallel import CrossEntropyImpl, Fp8Recipe, MoeDispatcher, ParallelDims, Recompute
from autoshard.specs.job import Optimizer, Precision

__all__ = [
    "TrainConfig", "Stage", "LayerCost", "StageCost", "TimeBreakdown", "MemoryBreakdown", "TrainPrediction",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """Everything about a training plan except the layer layout."""

    dims: ParallelDims
    micro_batch_size: int
    global_batch_size: int
    seq_len: int
    precision: Precision = Precision.BF16
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = True
    zero_stage: int = 1
    optimizer: Optimizer = Optimizer.ADAM
    overlap_grad_reduce: bool = True
    """Overlap DP gradient reduction (and, with a sharded optimizer, the parameter all-gather) with
    backward/forward compute (Megatron --overlap-grad-reduce / --overlap-param-gather)."""
    tp_comm_overlap: bool = False
    """Overlap TP collectives with GEMMs (Megatron --tp-comm-overlap; needs sequence parallelism)."""
    flash_attention: bool = True
    """Fused attention kernels (every current framework); False models pre-2022 Megatron-LM, which
    stored the s x s attention scores."""
    framework: TrainFramework = TrainFramework.MEGATRON
    """Whose memory behaviour to model (model states, loss, selective recompute, allocator); see
    autoshard.costmodel.train.memory. Step time is modelled the same for every framework."""
    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
    """MoE token dispatcher (Megatron --moe-token-dispatcher-type); ignored for dense models."""
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED
    """FP8 scaling recipe (Megatron --fp8-recipe); ignored unless precision is FP8."""
    recompute_modules: tuple[str, ...] = ()
    """Selective recompute by module (Megatron --recompute-modules; see costmodel.train.recompute);
    () is Megatron's default, the attention core. Ignored unless recompute is selective."""

    grad_reduce_fp32: bool = True
    """FP32 gradient buffer and reduction (Megatron-LM's default for BF16, --accumulate-allreduce-
    grads-in-fp32); False: BF16 gradients (Megatron-Core grad_reduce_in_fp32=False, NeMo's
    performance recipes): half the gradient memory and half the DP reduce-scatter bytes."""
    fp8_param_gather: bool = False
    """Keep the weights in FP8 and all-gather them in FP8 (Megatron --fp8-param-gather; FP8 only)."""
    optimizer_moments_bf16: bool = False
    """Adam's moments in BF16 (NeMo distributed_fused_adam optim.dtype=bf16; Megatron-Core
    --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16): a run's setting
    that validation replays; plans keep FP32 moments."""
    cross_entropy: CrossEntropyImpl = CrossEntropyImpl.NATIVE
    """The loss implementation (Megatron --cross-entropy-loss-fusion, --cross-entropy-fusion-impl):
    plans run Megatron-Core's native fused loss; a parsed launch without the flag runs the unfused
    default (costmodel.compute.CROSS_ENTROPY_BYTES). Megatron and NeMo runs only."""
    defer_embedding_wgrad: bool = False
    """Megatron-Core defer_embedding_wgrad_compute (NeMo 2.x performance recipes): the output layer's
    wgrad GEMMs wait for the pipeline flush (costmodel.train.deferral). Off by default, as in Megatron;
    a run's setting that validation replays."""
    wgrad_deferral_limit: int = 0
    """How many output-layer backward calls per step defer their wgrad (0: all), with defer_embedding_wgrad."""
    fp8_attention: bool = False
    """The attention core in FP8: Transformer Engine's fp8_dot_product_attention under current scaling
    (NVTE_DPA_FP8_RECIPE=Float8CurrentScaling; cuDNN's FP8 fused attention, head dimension 128), which NeMo
    and Megatron-Bridge set and Megatron-LM's command line cannot (no flag): a run's
    setting that validation and the Python API price on GPUs with a
    kernel measurement; plans keep BF16 attention. FP8 or FP4 precision with flash attention only
    (costmodel.attention.fp8_attention_s)."""
    moe_a2a_overlap: bool = False
    """Megatron-Core's EP all-to-all overlap (--overlap-moe-expert-parallel-comm with --delay-wgrad-compute):
    in the 1F1B steady state one micro-batch's forward runs layer by layer beside another's backward, so
    each MoE layer's dispatch and combine ride on a second stream under the other micro-batch's compute
    (costmodel.train.a2a_overlap). MoE with EP > 1, alltoall or flex dispatcher, interleaving when PP > 1,
    no full recompute and no MoE module recompute (costmodel.train.a2a_overlap.a2a_overlap_problems)."""
    moe_a2a_delay_wgrad: bool = True
    """With moe_a2a_overlap: Megatron's --delay-wgrad-compute, the expert weight gradient run after the
    dispatch backward has left (what fills the middle phase); False prices the overlap a command runs without
    it (the expert wgrad inside its backward, before the dispatch backward can start)."""
    full_cuda_graph: bool = False
    """The whole step runs in CUDA graphs, routed experts included (Megatron's full-iteration graphs
    with paged activation stashing, no device-to-host sync per MoE layer): no host time per local
    expert (EfficiencySpec.expert_host_us). Plans and Megatron's partial graphs (--cuda-graph-scope
    attn moe_router moe_preprocess, which leave the routed experts out) keep it False."""
    compiled_loss: bool = False
    """torchtitan compiles its cross-entropy (--training.compile since torchtitan 2025-04): fused
    kernels, no FP32 logits (see costmodel.train.memory_torchtitan.torchtitan_loss_bytes). torchtitan only."""

    def __post_init__(self) -> None:
        per_step = self.micro_batch_size * self.dims.dp
        if self.global_batch_size % per_step:
            raise ValueError(
                f"global batch {self.global_batch_size} is not a multiple of micro-batch x DP = "
                f"{self.micro_batch_size} x {self.dims.dp} = {per_step}"
            )
        m, pp = self.global_batch_size // per_step, self.dims.pp
        if self.dims.vpp > 1 and m % pp:
            # Megatron-Core's interleaved schedule runs micro-batches through each model chunk in groups
            # of PP (microbatch_group_size_per_vp_stage's default) and raises on fewer than PP or a last
            # group smaller than PP ("dependency bubbles", schedules.py since 2024-11; earlier
            # versions asserted m % PP == 0 outright)
            raise ValueError(
                f"the interleaved pipeline (VPP {self.dims.vpp}) needs the micro-batches per DP rank to be a "
                f"multiple of PP {pp}, got {m} (global batch {self.global_batch_size} / (micro-batch "
                f"{self.micro_batch_size} x DP {self.dims.dp})); Megatron-Core refuses the rest"
            )
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.fp8_attention and not (self.precision.quantized and self.flash_attention):
            raise ValueError("fp8_attention needs FP8 or FP4 precision and flash attention "
                             f"(got {self.precision.value}, flash_attention={self.flash_attention})")

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dims.dp)

    @property
    def sp(self) -> bool:
        """Sequence parallelism is only real with TP > 1 (Megatron turns it off otherwise)."""
        return self.sequence_parallel and self.dims.tp > 1


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One layer on one GPU of `pool`, per micro-batch (times) and in total (memory)."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    fwd_bwd_compute_s: float
    """Forward + backward compute, the window DP traffic can hide behind."""
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    """Saved for backward per in-flight micro-batch."""
    full_activation_bytes: float
    """What the layer would save without full recomputation (its working set during recompute)."""
    dense_params: float
    expert_params: float
    weight_cast_s: float = 0.0
    """Once per step (not per micro-batch): Transformer Engine's FP8 cast of the layer's GEMM weights on
    its chunk's first micro-batch (costmodel.fp8.fp8_weight_cast_bytes_per_param)."""
    ep_overlap_s: float = 0.0
    """Seconds of EP traffic a micro-batch hides when its forward and backward of this layer each run
    paired with another micro-batch's (TrainConfig.moe_a2a_overlap; costmodel.train.a2a_overlap); the
    step applies it to the paired share of its micro-batches. Never more than ep_comm_s."""

    @property
    def time_s(self) -> float:
        return self.compute_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


@dataclass(frozen=True, slots=True)
class Stage:
    """One model chunk: layers [start, stop) of the model, on `pool`, with the first
    `full_recompute_layers` decoder layers fully recomputed (Megatron's block method)."""

    start: int
    stop: int
    pool: int = 0
    full_recompute_layers: int = 0


@dataclass(frozen=True, slots=True)
class StageCost:
    time_s: float
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    fwd_bwd_compute_s: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    """Per in-flight micro-batch."""
    working_bytes: float
    """Transient: the largest layer's full activations while it is recomputed."""
    dense_params: float
    expert_params: float
    largest_layer_params: float
    """Per-GPU parameters of the stage's largest layer (what ZeRO-3 gathers at once)."""
    weight_cast_s: float = 0.0
    """Once per step: the FP8 weight casts of the stage's first micro-batch (LayerCost.weight_cast_s)."""
    layer_overlaps: tuple[float, ...] = ()
    """LayerCost.ep_overlap_s of the stage's decoder layers in order (the output layer's MTP modules last):
    what the EP all-to-all overlap pairs layer by layer (costmodel.train.a2a_overlap.rank_hidden_s)."""


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    compute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    pp_comm: float
    dp_comm_exposed: float
    bubble: float
    optimizer: float
    recompute: float = 0.0
    """Part of `compute` spent recomputing activations (informational, already in compute)."""
    ep_comm_hidden: float = 0.0
    """EP traffic the all-to-all overlap runs under the other micro-batch's compute (informational, not in
    the step: `ep_comm` is what stays exposed; TrainConfig.moe_a2a_overlap)."""

    @property
    def total(self) -> float:
        return (self.compute + self.tp_comm + self.cp_comm + self.ep_comm + self.pp_comm
                + self.dp_comm_exposed + self.bubble + self.optimizer)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on the most loaded GPU."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    kv_cache: float
    overhead: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.kv_cache + self.overhead


@dataclass(frozen=True, slots=True)
class TrainPrediction:
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    hw_tflops_per_gpu: float
    mfu: float
    time: TimeBreakdown
    memory: MemoryBreakdown
    peak_memory_bytes: float
    capacity_bytes: float
    rank_memory_bytes: tuple[float, ...]
    rank_capacity_bytes: tuple[float, ...]
    rank_time_s: tuple[float, ...]
    num_gpus: int
    notes: tuple[str, ...] = field(default=())
    mfu_peak: str = "bf16 dense"
    """The peak MFU is measured against: "bf16 dense", "fp8 dense" or "fp4 dense" (no sparsity)."""

    @property
    def fits(self) -> bool:
        return all(m <= c for m, c in zip(self.rank_memory_bytes, self.rank_capacity_bytes, strict=True))
