"""The cluster description: GPU types, nodes and their links, pools, prices and efficiency knobs.

Units are in the field names. Bandwidths are decimal GB/s (1e9 bytes/s) **per GPU, per direction**,
the figure NCCL's bus bandwidth is compared with. HBM capacity is GiB as `nvidia-smi` reports it.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any

from pydantic import Field, model_validator

from autoshard.specs.base import FrozenSpec

__all__ = ["LinkKind", "EfficiencySpec", "GpuSpec", "NodeSpec", "PoolSpec", "ClusterSpec"]

PosFloat = Annotated[float, Field(gt=0)]
PosInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]


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
    measured efficiencies. One fit per GPU type, never per run."""

    gemm: Fraction = 0.70
    """Fraction of dense peak a large BF16 GEMM reaches (cuBLAS on big square-ish shapes)."""
    gemm_fp8: Fraction = 0.55
    """Fraction of dense FP8 peak a large FP8 GEMM reaches (scaling and casts cost more)."""
    gemm_half_dim: Annotated[float, Field(ge=0)] = 128.0
    """Small-shape fall-off: a GEMM whose smallest per-GPU dimension is d runs at
    gemm * d / (d + gemm_half_dim). High TP and micro-batch 1 shrink d."""
    attention: Fraction = 0.25
    """Fraction of dense BF16 peak that fused (flash) attention reaches."""
    hbm: Fraction = 0.80
    """Fraction of HBM bandwidth element-wise kernels (norms, activations, softmax, optimizer) reach."""
    intra_node_bw: Fraction = 0.90
    """Achieved NCCL bus bandwidth over the intra-node link, as a fraction of the link figure."""
    inter_node_bw: Fraction = 0.90
    """Achieved NCCL bus bandwidth across nodes, as a fraction of the per-GPU NIC figure."""
    intra_node_latency_us: Annotated[float, Field(ge=0)] = 8.0
    """Per-step latency of a collective inside the node."""
    inter_node_latency_us: Annotated[float, Field(ge=0)] = 20.0
    """Per-step latency of a collective across nodes."""
    kernel_overhead_us: Annotated[float, Field(ge=0)] = 4.0
    """Launch/tail cost of one kernel; bounds tiny GEMMs from below."""
    reserved_memory_gib: Annotated[float, Field(ge=0)] = 4.0
    """CUDA context, NCCL buffers and cuBLAS workspace, per GPU."""
    fragmentation: Annotated[float, Field(ge=0, lt=1)] = 0.07
    """Fraction of HBM lost to caching-allocator fragmentation (plan for ~90 % of HBM)."""
    tp_overlap: Annotated[float, Field(ge=0, le=1)] = 0.8
    """Fraction of tensor-parallel traffic hidden behind GEMMs with Megatron's --tp-comm-overlap
    (userbuffer AG/RS pipelined with the GEMM chunks; needs sequence parallelism)."""
    dp_overlap: Annotated[float, Field(ge=0, le=1)] = 0.85
    """Fraction of the data-parallel gradient/parameter traffic hidden behind compute when the
    framework overlaps it (Megatron --overlap-grad-reduce/--overlap-param-gather)."""
    serve_gemm: Fraction | None = None
    """Serving only (autoshard/costmodel/serving.py): fraction of dense BF16 peak an inference
    engine's GEMMs reach at serving shapes (decode batches, grouped MoE GEMMs); its FP8 GEMMs keep the
    ratio gemm_fp8 / gemm. None: the training `gemm`. Fitted per GPU type on published serving runs
    by tests/validation/validate_serving.py (leave-one-source-out there)."""
    serve_attention_hbm: Fraction | None = None
    """Serving only: fraction of HBM bandwidth the engine's paged decode-attention kernel reaches
    reading the KV cache (block tables, scattered pages, the FP8 dequantize). None: `hbm`. Fitted with
    serve_gemm."""


class GpuSpec(FrozenSpec):
    name: str = Field(min_length=1)
    hbm_gib: PosFloat
    bf16_tflops: PosFloat
    """Dense (no sparsity) BF16 tensor-core peak."""
    fp8_tflops: PosFloat | None = None
    """Dense FP8 peak; None when the GPU has no FP8 tensor cores."""
    hbm_tbps: PosFloat
    """HBM bandwidth, decimal TB/s."""
    efficiency: EfficiencySpec = EfficiencySpec()
    source: str | None = None


class NodeSpec(FrozenSpec):
    gpus_per_node: PosInt
    intra_node_link: LinkKind
    intra_node_gbps: PosFloat
    """GPU-to-GPU bandwidth inside the NVLink domain, GB/s per GPU per direction
    (H100 NVLink 4: 450; PCIe Gen5 x16: ~64 minus the host bridge)."""
    inter_node_gbps: PosFloat
    """Network bandwidth per GPU per direction in GB/s (one 400 Gb/s NDR NIC per GPU: 50)."""
    nvlink_domain_gpus: PosInt | None = None
    """GPUs reachable at intra-node speed; defaults to gpus_per_node (72 for GB200 NVL72)."""

    @property
    def domain_size(self) -> int:
        return self.nvlink_domain_gpus or self.gpus_per_node

    @model_validator(mode="after")
    def _check(self) -> NodeSpec:
        d = self.domain_size
        if d % self.gpus_per_node and self.gpus_per_node % d:
            raise ValueError(
                f"nvlink_domain_gpus ({d}) must be a multiple or a divisor of gpus_per_node ({self.gpus_per_node})"
            )
        return self


class PoolSpec(FrozenSpec):
    """A homogeneous set of nodes."""

    name: str = Field(min_length=1)
    gpu: GpuSpec
    node: NodeSpec
    num_nodes: PosInt
    price_per_gpu_hour: PosFloat | None = None
    """US dollars per GPU-hour (a public on-demand or reserved cloud list price; cite it)."""

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    @model_validator(mode="after")
    def _check(self) -> PoolSpec:
        d = self.node.domain_size
        if d > self.node.gpus_per_node and self.num_gpus % d:
            raise ValueError(
                f"pool '{self.name}': {self.num_gpus} GPUs do not fill whole NVLink domains of {d}: "
                f"use a multiple of {d // self.node.gpus_per_node} nodes"
            )
        return self


class ClusterSpec(FrozenSpec):
    """One or more pools. A single-pool cluster may be written flat (gpu/node/num_nodes at the top)."""

    name: str = Field(min_length=1)
    source: str | None = None
    pools: tuple[PoolSpec, ...] = Field(min_length=1)
    inter_pool_gbps: PosFloat | None = None
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

        Raises ValueError when the size does not fill whole nodes (or whole NVLink domains)."""
        if self.is_heterogeneous:
            raise ValueError("--gpus cannot resize a heterogeneous cluster; edit the pool sizes in its YAML")
        pool = self.primary
        per_node = pool.node.gpus_per_node
        domain = pool.node.domain_size
        unit = max(per_node, domain) if num_gpus >= domain else per_node
        lower, upper = max(unit, num_gpus // unit * unit), (num_gpus // unit + 1) * unit
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
            if domain > per_node and num_gpus > domain and num_gpus % domain:
                raise ValueError(f"{num_gpus} GPUs does not fill whole {domain}-GPU NVLink domains: {hint}")
            if domain > per_node and num_gpus < domain:
                # part of one rack-scale domain (e.g. some GB200 trays): the domain is what is rented
                node = pool.node.model_copy(update={"nvlink_domain_gpus": num_gpus})
                return self.model_copy(update={"pools": (pool.model_copy(update={"node": node, "num_nodes": num_gpus // per_node}),)})
            new_pool = pool.model_copy(update={"num_nodes": num_gpus // per_node})
        return self.model_copy(update={"pools": (new_pool,)})
