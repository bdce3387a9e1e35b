"""The roles of a disaggregated (xPyD) serving plan: prefill and decode instances with their own degrees,
batch limits and pools, and the deployment-level figures (throughput, TTFT, KV transfer) of the split.
The physics is in `autoshard.costmodel.serve.disagg`; `autoshard.plans` re-exports these names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoshard.costmodel.serve.disagg import KvTransfer
from autoshard.costmodel.serve.predict import ServePrediction
from autoshard.units import GIB

__all__ = ["Role", "Disaggregation"]


@dataclass(frozen=True, slots=True)
class Role:
    """One role of a disaggregated deployment: `instances` identical engines doing only prefill or
    only decode. Degrees per instance, vLLM naming (EP = TP x attention DP with expert parallelism)."""

    role: str
    """"prefill" or "decode"."""
    instances: int
    tp: int
    pp: int
    ep: int
    attention_dp: int
    max_num_seqs: int
    """Running requests per attention-DP rank (vLLM --max-num-seqs)."""
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    prediction: ServePrediction
    """One instance (for prefill: `decode` holds one full prefill step, `prefill` one prompt alone)."""
    requests_per_s: float
    """What one instance sustains at full load."""
    utilization: float
    """Planned load / capacity of the role."""
    pool_index: int = 0
    """The cluster pool its instances run on (roles may use different GPU types)."""

    @property
    def gpus_per_instance(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def gpus(self) -> int:
        return self.gpus_per_instance * self.instances

    @property
    def max_batch(self) -> int:
        """Running requests per instance (all attention-DP ranks)."""
        return self.max_num_seqs * self.attention_dp

    def label(self) -> str:
        ep = f" EP{self.ep} (attention DP{self.attention_dp})" if self.ep > 1 else ""
        mtp = f" MTP{self.speculative_tokens}" if self.speculative_tokens else ""
        return f"{self.instances} x {self.role} TP{self.tp} PP{self.pp}{ep}{mtp}"

    @property
    def speculative_tokens(self) -> int:
        """MTP draft tokens per decode step (0: none)."""
        return self.prediction.config.speculative_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "instances": self.instances,
            "tp": self.tp,
            "pp": self.pp,
            "ep": self.ep,
            "attention_dp": self.attention_dp,
            "gpus": self.gpus,
            "gpus_per_instance": self.gpus_per_instance,
            "max_batch": self.max_batch,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "requests_per_s_per_instance": self.requests_per_s,
            "utilization": self.utilization,
            "memory_gib_peak": self.prediction.memory.used_bytes / GIB,
            "kv_cache_tokens": self.prediction.memory.kv_cache_tokens,
            "pool_index": self.pool_index,
            "speculative_tokens": self.speculative_tokens,
        }


@dataclass(frozen=True, slots=True)
class Disaggregation:
    """Deployment-level figures of an xPyD plan."""

    throughput_tokens_per_s: float
    """Output tokens/s the deployment serves (the decode instances at their planned batch)."""
    ttft_s: float
    """Mean TTFT at the planned load: prefill queue + prompt + KV transfer + first decode step."""
    transfer: KvTransfer
    ttft_p90_s: float | None = None
    """90th percentile TTFT (the queue wait's tail; the rest deterministic)."""

    def to_json(self, roles: Sequence[Role], decode_tpot_s: float) -> dict[str, Any]:
        """The deployment's keys in the plan JSON's `predicted.serve` block."""
        t = self.transfer
        pools = {r.pool_index for r in roles}
        return {
            "kv_transfer_s": t.seconds,
            "kv_transfer_bytes_per_request": t.bytes_per_request,
            "kv_transfer_link": t.link if len(pools) == 1 else "inter-pool",
            "prefill_utilization": next(r for r in roles if r.role == "prefill").utilization,
            "ttft_p90_s": self.ttft_p90_s,
            "tpot_p90_s": decode_tpot_s,  # decode-only steps: no prefill chunk makes a slow one
        }
