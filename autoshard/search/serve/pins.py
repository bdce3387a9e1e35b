"""Serving pins that contradict the cluster or the deployment kind: bad input (exit 2), checked before
any engine is enumerated."""

from __future__ import annotations

from autoshard.errors import SpecError
from autoshard.specs.cluster import ClusterSpec
from autoshard.specs.model import ModelSpec

__all__ = ["check_serve_pins"]


def check_serve_pins(model: ModelSpec, cluster: ClusterSpec, pins: dict[str, int], disaggregate: str) -> None:
    """SpecError when pinned TP x PP needs more GPUs for one engine than the largest pool has (it was exit
    1, "no vLLM engine is legal"), or when --dp pins a dense model's replicas beside a possible
    prefill/decode split, whose instance counts are the solver's (it was silently ignored: --tp 2 --dp 3 on
    8 GPUs came back as 1 prefill + 3 decode instances). On an MoE model --dp pins attention DP, split or
    not."""
    most = max(pool.num_gpus for pool in cluster.pools)
    need = pins.get("tp", 1) * pins.get("pp", 1)
    if need > most:
        flags = "/".join(f"--{k}" for k in ("tp", "pp") if k in pins)
        raise SpecError(f"TP {pins.get('tp', 1)} x PP {pins.get('pp', 1)} = {need} GPUs for one engine, more than the "
                        f"{most} GPUs {'of the largest pool' if len(cluster.pools) > 1 else 'given'}: lower the degrees "
                        f"or add --gpus", field=flags)
    if "dp" in pins and not model.is_moe and disaggregate != "off":
        raise SpecError("--dp pins the replicas of an aggregated deployment; a prefill/decode split's instance counts "
                        "are the solver's: add --disaggregate off, or drop --dp", field="--dp")
