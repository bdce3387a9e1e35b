"""The cluster description: GPU types, nodes and their links, pools, prices and efficiency knobs.

Units are in the field names. Bandwidths are decimal GB/s (1e9 bytes/s) **per GPU, per direction**,
the figure NCCL's bus bandwidth is compared with. HBM capacity is GiB as `nvidia-smi` reports it.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any

from pydantic import Field, model_validator

from autoshard.specs.base import (
    MAX_COUNT, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NAME_LEN, MAX_QUANTITY, NAME_PATTERN, FrozenSpec,
)

__all__ = ["LinkKind", "EfficiencySpec", "GpuSpec", "NodeSpec", "PoolSpec", "ClusterSpec"]

PosFloat = Annotated[float, Field(gt=0, le=MAX_QUANTITY)]
PosInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Fraction = Annotated[float, Field(gt=0, le=1)]
# size caps: beyond them no hardware exists and the planner's integer tables overflow or never finish
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LEN, pattern=NAME_PATTERN)]
Micros = Annotated[float, Field(ge=0, le=1e6)]  # at most one second
Bandwidth = Annotated[float, Field(ge=0.01, le=1e5)]  # GB/s per GPU per direction
Tflops = Annotated[float, Field(ge=1, le=1e6)]


class LinkKind(StrEnum):
    NVLINK = "nvlink"  # NVSwitch all-to-all inside a node (DGX/HGX)
    NVLINK_SWITCH = "nvlink_switch"  # rack-scale NVLink domain (GB200 NVL72)
    INFINITY_FABRIC = "infinity_fabric"  # AMD MI300X xGMI
    PCIE = "pcie"  # no GPU-to-GPU fabric: traffic goes over PCIe (and the host bridge)


class EfficiencySpec(FrozenSpec):
    """What fraction of datasheet peaks real kernels reach, as seen end to end in a training step.

    The defaults are the fit on the H100 SXM rows of tests/validation/training_runs.yaml (Megatron-LM
    and NeMo runs; `python tests/validation/fit_efficiency.py` reproduces it). The A100 fit lives in the
    A100 cluster files. GPU types with no published run to fit on (H200, B200, GB200, MI300X, L40S,
    H100 PCIe) use these H100 defaults: their predictions scale with their datasheet peaks, not with
    measured efficiencies. One fit per GPU type, never per run. The shared knobs are what serving
    prices with; the training step takes its compute knobs from the train_* overrides, refitted on
    today's larger run set (fit_efficiency.py), so that refit leaves serving predictions unchanged."""

    gemm: Fraction = 0.70
    """Fraction of dense peak a large BF16 GEMM reaches (cuBLAS on big square-ish shapes)."""
    gemm_fp8: Fraction = 0.55
    """Fraction of dense FP8 peak a large FP8 GEMM reaches (scaling and casts cost more)."""
    gemm_half_dim: Annotated[float, Field(ge=0, le=1e6)] = 128.0
    """Small-shape fall-off: a GEMM whose smallest per-GPU dimension is d runs at
    gemm * d / (d + gemm_half_dim). High TP and micro-batch 1 shrink d. Not used where
    `gemm_shape_measured` applies."""
    gemm_shape_measured: bool = False
    """Take the small-shape fall-off from the GEMM speeds measured on a GPU of this one's generation
    (autoshard/costmodel/gemm_shape.py; Hopper today) instead of gemm_half_dim's smooth curve, where
    such a measurement exists. Serving keeps the smooth curve its knobs were fitted with."""
    attention: Fraction = 0.25
    """Fraction of dense BF16 peak that fused (flash) attention reaches, at 4,096-token sequences."""
    attention_half_seq: Annotated[float, Field(ge=0, le=1e7)] = 4096.0
    """Sequence-length dependence of fused causal training attention: at sequence length s it runs
    at attention * r(s) / r(4096), r(s) = s / (s + attention_half_seq), capped at 1 (per-query-block
    fixed work and half-empty diagonal tiles weigh less as s grows). 0: flat."""
    hbm: Fraction = 0.80
    """Fraction of HBM bandwidth element-wise kernels (norms, activations, softmax, optimizer) reach."""
    intra_node_bw: Fraction = 0.90
    """Achieved NCCL bus bandwidth over the intra-node link, as a fraction of the link figure."""
    inter_node_bw: Fraction = 0.90
    """Achieved NCCL bus bandwidth across nodes, as a fraction of the per-GPU NIC figure."""
    intra_node_latency_us: Micros = 8.0
    """Per-step latency of a collective inside the node."""
    inter_node_latency_us: Micros = 20.0
    """Per-step latency of a collective across nodes."""
    kernel_overhead_us: Micros = 4.0
    """Launch/tail cost of one kernel; bounds tiny GEMMs from below."""
    reserved_memory_gib: Annotated[float, Field(ge=0, le=1024)] = 4.0
    """CUDA context, NCCL buffers and cuBLAS workspace, per GPU."""
    fragmentation: Annotated[float, Field(ge=0, lt=1)] = 0.07
    """Caching-allocator fragmentation, as a fraction of the training step's dynamic allocations
    (activations, working sets, transients); model states allocated once are not charged
    (costmodel.train.memory.static_bytes)."""
    tp_overlap: Annotated[float, Field(ge=0, le=1)] = 0.8
    """Fraction of tensor-parallel traffic hidden behind GEMMs with Megatron's --tp-comm-overlap
    (userbuffer AG/RS pipelined with the GEMM chunks; needs sequence parallelism)."""
    expert_host_us: Micros = 0.0
    """Host (CPU) time one local routed expert costs a dropless MoE layer per micro-batch, forward and
    backward together, that the GPU waits out: Megatron learns each expert's token count on the host
    (a device-to-host sync per MoE layer), so the GPU's queue is empty when the CPU starts on the
    routed experts, and Transformer Engine's grouped linear layers then quantize, split and launch per
    expert in Python. Training only (the train_ value is fitted); 0 where the routed experts run
    inside CUDA graphs (TrainConfig.full_cuda_graph)."""
    dp_overlap: Annotated[float, Field(ge=0, le=1)] = 0.85
    """Fraction of the data-parallel gradient/parameter traffic hidden behind compute when the
    framework overlaps it (Megatron --overlap-grad-reduce/--overlap-param-gather)."""
    train_gemm: Fraction | None = 0.60
    """Training-only override of `gemm` (None: use `gemm`). Training and serving share the physics
    but not the kernels' operating point (long back-to-back GEMM streams, sustained power), so the
    training step's compute knobs are fitted on the published training runs on their own, and
    serving keeps `gemm`/`gemm_fp8`/`hbm`. H100 default: `fit_efficiency.py` on the 154 held H100
    runs, with the measured GEMM shape table (`train_gemm_shape_measured`)."""
    train_gemm_fp8: Fraction | None = 0.60
    """Training-only override of `gemm_fp8` (None: use `gemm_fp8`). H100 default: the same fit (0.60 at
    README items AC-AF; DGX Cloud Benchmarking v24.11's 44 NeMo 24.09 FP8 runs took it to 0.55 at item AG,
    the source-weighted fit of item AH back to 0.60)."""
    train_hbm: Fraction | None = 0.60
    """Training-only override of `hbm` for a layer's element-wise kernels, FP8 casts, recompute and
    the optimizer step (None: use `hbm`); the solver prices the optimizer step with the same value."""
    train_attention: Fraction | None = 0.45
    """Training-only override of `attention` (None: use `attention`). H100 default: measured at kernel
    level, not fitted (autoshard.costmodel.efficiency.KERNEL_TRAIN_KNOBS)."""
    train_attention_half_seq: Annotated[float, Field(ge=0, le=1e7)] | None = 630.0
    """Training-only override of `attention_half_seq` (None: use `attention_half_seq`). H100 default:
    from kernel benchmarks like train_attention."""
    train_gemm_half_dim: Annotated[float, Field(ge=0, le=1e6)] | None = 64.0
    """Training-only override of `gemm_half_dim` (None: use `gemm_half_dim`): the smooth fall-off of a
    training GEMM with its smallest dimension where no measured shape table applies. Default 64: the A100
    fit's value (A100 clusters take it from here). H100 and H200 are indifferent to it: every Hopper GEMM
    takes the measured table, so their fit ties across the grid (it printed 0 at item Z, 64 before)."""
    train_tp_overlap: Annotated[float, Field(ge=0, le=1)] | None = 0.8
    """Training-only override of `tp_overlap` (None: use `tp_overlap`)."""
    train_intra_node_bw: Fraction | None = 0.7
    """Training-only override of `intra_node_bw` (None: use `intra_node_bw`): the training step's
    collectives inside the NVLink domain (TP, CP, EP, DP, pipeline sends). H100 default: the H100 fit
    (0.7 until README item AC priced the host-bound MoE layers, 0.9 from there to item AG, 0.7 again
    with the source-weighted fit of item AH)."""
    train_inter_node_bw: Fraction | None = 0.9
    """Training-only override of `inter_node_bw` (None: use `inter_node_bw`). With the three above, every
    knob `fit_efficiency.py` fits ships with the GPU: the shipped training prediction is the validated one
    (tests/validation/test_published.py holds every run's to its residual file's all-in prediction), while
    serving keeps the shared knobs its own fit was made with."""
    train_expert_host_us: Micros | None = 500.0
    """Training-only override of `expert_host_us` (None: use `expert_host_us`). Fitted on the H100 runs
    and lent to every GPU (fit_efficiency.LENT_KNOBS): it is the software's host time, Megatron-Core's
    dropless MoE and Transformer Engine's eager expert path, and only H100 runs of two sources bind on it."""
    train_gemm_shape_measured: bool | None = True
    """Training-only override of `gemm_shape_measured` (None: use it): the training step's GEMMs
    take their shape fall-off from the measured table of the GPU's generation where there is one."""
    fitted_gpu: str | None = "H100-SXM5-80GB"
    """The GPU whose published runs these values were fitted on (None: not fitted). A GPU of another
    name using them borrows that GPU's efficiencies (see autoshard.costmodel.efficiency.efficiency_source)."""
    fitted_runs: Annotated[int, Field(ge=0, le=100_000)] = 154
    """How many held published training runs of `fitted_gpu` the shipped training values were fitted on
    (H100: 154, by tests/validation/fit_efficiency.py; its train_attention and train_attention_half_seq
    come from kernel benchmarks, efficiency.KERNEL_TRAIN_KNOBS). Serving knobs are fitted on the serving
    validation rows (tests/validation/validate_serving.py)."""

    serve_gemm: Fraction | None = None
    """Serving only (autoshard/costmodel/serve/step.py): fraction of dense BF16 peak an inference
    engine's GEMMs reach at serving shapes (decode batches, grouped MoE GEMMs); its FP8 GEMMs keep the
    ratio gemm_fp8 / gemm. None: the training `gemm`. Fitted per GPU type on published serving runs
    by tests/validation/validate_serving.py (leave-one-source-out there)."""
    serve_attention_hbm: Fraction | None = None
    """Serving only: fraction of HBM bandwidth the engine's paged decode-attention kernel reaches
    reading the KV cache (block tables, scattered pages, the FP8 dequantize). None: `hbm`. Fitted with
    serve_gemm."""
    serve_fp8_ratio: Annotated[float, Field(gt=0, le=4)] | None = 1.0
    """Serving only: fraction of its FP8 peak an engine's FP8 GEMM reaches over a BF16 GEMM's of its
    BF16 peak, with which `serve_gemm` prices FP8 GEMMs (costmodel/serve/compute.fp8_gemm_ratio).
    1.0: what the bundled serving fits were made with. None: the training fit's ratio."""

    def training(self) -> EfficiencySpec:
        """These efficiencies as the training step uses them: each train_* override that is set
        replaces its shared knob (and the overrides are cleared)."""
        update: dict[str, Any] = {}
        for knob in TRAIN_KNOBS:
            value = getattr(self, "train_" + knob)
            if value is not None:
                update[knob] = value
            update["train_" + knob] = None
        return self.model_copy(update=update)


TRAIN_KNOBS = ("gemm", "gemm_fp8", "hbm", "attention", "attention_half_seq", "gemm_shape_measured", "gemm_half_dim",
               "tp_overlap", "intra_node_bw", "inter_node_bw", "expert_host_us")
"""Knobs with a training-only override (EfficiencySpec.train_<knob>)."""


class GpuSpec(FrozenSpec):
    name: Name
    hbm_gib: Annotated[float, Field(gt=0, le=65536)]
    bf16_tflops: Tflops
    """Dense (no sparsity) BF16 tensor-core peak."""
    fp8_tflops: Tflops | None = None
    """Dense FP8 peak; None when the GPU has no FP8 tensor cores."""
    fp4_tflops: Tflops | None = None
    """Dense FP4 (NVFP4/MXFP4) tensor-core peak; None when the GPU has no FP4 tensor cores (before Blackwell)."""
    hbm_tbps: Annotated[float, Field(ge=0.01, le=1000)]
    """HBM bandwidth, decimal TB/s."""
    efficiency: EfficiencySpec = EfficiencySpec()
    source: str | None = Field(default=None, max_length=2000, pattern=NAME_PATTERN)


class NodeSpec(FrozenSpec):
    gpus_per_node: Annotated[int, Field(gt=0, le=MAX_GPUS_PER_NODE)]
    intra_node_link: LinkKind
    intra_node_gbps: Bandwidth
    """GPU-to-GPU bandwidth inside the NVLink domain, GB/s per GPU per direction
    (H100 NVLink 4: 450; PCIe Gen5 x16: ~64 minus the host bridge)."""
    inter_node_gbps: Bandwidth
    """Network bandwidth per GPU per direction in GB/s (one 400 Gb/s NDR NIC per GPU: 50)."""
    nvlink_domain_gpus: Annotated[int, Field(gt=0, le=MAX_GPUS_PER_NODE)] | None = None
    """GPUs reachable at intra-node speed; defaults to gpus_per_node (72 for GB200 NVL72)."""
    nvlink_domain_gpus_used: PosInt | None = None
    """GPUs a job uses in each rack-scale NVLink domain (e.g. 64 of an NVL72's 72, leaving spare trays);
    defaults to all of them. Ranks fill one domain up to this count before the next; the last domain of
    a pool may be partly filled (any whole number of trays). The pool's `num_nodes` counts the trays the job
    uses, so at 64 a 144-GPU pool spans three racks (64 + 64 + 16); a pool no larger than one domain takes
    that domain whole (`PoolSpec.domain_fill_size`)."""
    socket_gpus: Annotated[int, Field(gt=0, le=MAX_GPUS_PER_NODE)] | None = None
    """PCIe nodes with two CPU sockets: GPUs under one socket's PCIe root complex. A group of more
    ranks crosses the CPU interconnect (UPI / xGMI), where NCCL runs through host memory at
    `cross_socket_gbps`. None: the node's intra-node link reaches every GPU alike."""
    cross_socket_gbps: Bandwidth | None = None
    """Bus bandwidth (GB/s per GPU per direction, the `intra_node_gbps` convention) of a ring that
    crosses the CPU sockets; set together with `socket_gpus`."""

    @property
    def domain_size(self) -> int:
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def domain_used(self) -> int:
        """GPUs of one NVLink domain that hold consecutive ranks."""
        return self.nvlink_domain_gpus_used or self.domain_size

    @model_validator(mode="after")
    def _check(self) -> NodeSpec:
        d = self.domain_size
        if d % self.gpus_per_node and self.gpus_per_node % d:
            raise ValueError(
                f"nvlink_domain_gpus ({d}) must be a multiple or a divisor of gpus_per_node ({self.gpus_per_node})"
            )
        used = self.nvlink_domain_gpus_used
        if used is not None:
            if d <= self.gpus_per_node:
                raise ValueError(
                    "nvlink_domain_gpus_used is for rack-scale NVLink domains (nvlink_domain_gpus larger than "
                    "gpus_per_node): remove it"
                )
            if used > d or used % self.gpus_per_node:
                raise ValueError(
                    f"nvlink_domain_gpus_used ({used}) must be a whole number of {self.gpus_per_node}-GPU nodes "
                    f"(trays) and at most nvlink_domain_gpus ({d})"
                )
        if (self.socket_gpus is None) != (self.cross_socket_gbps is None):
            raise ValueError("socket_gpus and cross_socket_gbps go together: set both or neither")
        if self.socket_gpus is not None and (
            self.socket_gpus >= self.gpus_per_node or self.gpus_per_node % self.socket_gpus
        ):
            raise ValueError(
                f"socket_gpus ({self.socket_gpus}) must be a divisor of gpus_per_node ({self.gpus_per_node}) "
                "smaller than it (one socket's share of the node's GPUs)"
            )
        if self.socket_gpus is not None and self.intra_node_link is not LinkKind.PCIE:
            raise ValueError(
                f"socket_gpus describes PCIe nodes whose GPU traffic crosses the CPU sockets; an "
                f"{self.intra_node_link.value} node's GPUs talk over their own fabric: drop socket_gpus and cross_socket_gbps"
            )
        if self.cross_socket_gbps is not None and self.cross_socket_gbps > self.intra_node_gbps:
            raise ValueError(
                f"cross_socket_gbps ({self.cross_socket_gbps:g}) is more than intra_node_gbps ({self.intra_node_gbps:g}): "
                "a ring through the CPU interconnect is no faster than the PCIe link; give the measured cross-socket figure"
            )
        return self


class PoolSpec(FrozenSpec):
    """A homogeneous set of nodes."""

    name: Name
    gpu: GpuSpec
    node: NodeSpec
    num_nodes: Annotated[int, Field(gt=0, le=MAX_GPUS)]
    price_per_gpu_hour: Annotated[float, Field(gt=0, le=10000)] | None = None
    """US dollars per GPU-hour (a public on-demand or reserved cloud list price; cite it)."""

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    @property
    def domain_fill_size(self) -> int:
        """GPUs of consecutive ranks one NVLink domain holds in this pool: the node's `domain_used`, except that a
        rack-scale pool no larger than one domain takes that one domain whole (a 72-GPU GB200 pool is one rack,
        not 64 + 8 over two)."""
        node = self.node
        if node.domain_size > node.gpus_per_node and self.num_gpus <= node.domain_size:
            return node.domain_size
        return node.domain_used

    @property
    def domain_fill(self) -> tuple[int, ...]:
        """GPUs in each NVLink domain this pool occupies, in rank order (the last may be partial)."""
        used = self.domain_fill_size
        full, rest = divmod(self.num_gpus, used)
        return (used,) * full + ((rest,) if rest else ())

    @model_validator(mode="after")
    def _check(self) -> PoolSpec:
        if self.num_gpus > MAX_GPUS:
            raise ValueError(f"pool '{self.name}' has {self.num_gpus} GPUs, more than autoshard plans for "
                             f"(at most {MAX_GPUS}): lower num_nodes")
        return self


class ClusterSpec(FrozenSpec):
    """One or more pools. A single-pool cluster may be written flat (gpu/node/num_nodes at the top)."""

    name: Name
    source: str | None = Field(default=None, max_length=2000, pattern=NAME_PATTERN)
    pools: tuple[PoolSpec, ...] = Field(min_length=1, max_length=64)
    inter_pool_gbps: Bandwidth | None = None
    """Bandwidth per GPU per direction between pools (GB/s); defaults to the slower pool's network."""

    @model_validator(mode="before")
    @classmethod
    def _flat_single_pool(cls, data: Any) -> Any:
        if isinstance(data, dict) and "pools" not in data and any(k in data for k in ("gpu", "node", "num_nodes")):
            data = dict(data)
            pool = {"name": data.get("name", "pool")}
            for key in ("gpu", "node", "num_nodes", "price_per_gpu_hour"):
                if key in data:
                    pool[key] = data.pop(key)
            data["pools"] = [pool]
        return data

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique, got {names}")
        if sum(p.num_gpus for p in self.pools) > MAX_GPUS:
            raise ValueError(f"the cluster has {sum(p.num_gpus for p in self.pools)} GPUs, more than autoshard "
                             f"plans for (at most {MAX_GPUS}): lower num_nodes")
        return self

    @property
    def is_heterogeneous(self) -> bool:
        return len(self.pools) > 1

    @cached_property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)

    @property
    def primary(self) -> PoolSpec:
        """The only pool of a homogeneous cluster (the first pool otherwise)."""
        return self.pools[0]

    @property
    def pool_link_gbps(self) -> float:
        return self.inter_pool_gbps or min(p.node.inter_node_gbps for p in self.pools)

    def with_gpus(self, num_gpus: int) -> ClusterSpec:
        """The same cluster resized to `num_gpus` GPUs (homogeneous clusters only).

        Raises ValueError when the size is not a whole number of nodes (trays, for rack-scale NVLink
        domains: the last domain may be partly filled)."""
        if self.is_heterogeneous:
            raise ValueError("--gpus cannot resize a heterogeneous cluster; edit the pool sizes in its YAML")
        if not 0 < num_gpus <= MAX_GPUS:
            raise ValueError(f"{num_gpus} GPUs is outside what autoshard plans for: use 1 to {MAX_GPUS} GPUs")
        pool = self.primary
        per_node = pool.node.gpus_per_node
        domain = pool.node.domain_size
        unit = per_node
        lower, upper = max(unit, num_gpus // unit * unit), (num_gpus // unit + 1) * unit
        upper = upper if upper <= MAX_GPUS else lower  # never a size autoshard refuses
        hint = f"use --gpus {lower} or --gpus {upper}" if lower != upper else f"use --gpus {lower}"
        if num_gpus < per_node:
            if per_node % num_gpus:
                divisors = [d for d in range(1, per_node + 1) if per_node % d == 0]
                below = max(d for d in divisors if d < num_gpus)
                raise ValueError(f"{num_gpus} GPUs is not a divisor of the {per_node} GPUs of one node: use --gpus "
                                 f"{below} or --gpus {per_node} (any of {', '.join(map(str, divisors))}, or whole nodes)")
            node = pool.node.model_copy(update={"gpus_per_node": num_gpus, "nvlink_domain_gpus": None})
            new_pool = pool.model_copy(update={"node": node, "num_nodes": 1})
        else:
            if num_gpus % per_node:
                raise ValueError(f"{num_gpus} GPUs is not a whole number of {per_node}-GPU nodes: {hint}")
            if domain > per_node and num_gpus <= domain:
                # one rack-scale domain holds the job (some GB200 trays, or a whole rack's 72 GPUs beyond the
                # GPUs a multi-rack job uses per rack): the domain is what is rented
                node = pool.node.model_copy(update={"nvlink_domain_gpus": num_gpus, "nvlink_domain_gpus_used": None})
                return self.model_copy(update={"pools": (pool.model_copy(update={"node": node, "num_nodes": num_gpus // per_node}),)})
            new_pool = pool.model_copy(update={"num_nodes": num_gpus // per_node})
        return self.model_copy(update={"pools": (new_pool,)})
