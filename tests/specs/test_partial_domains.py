"""Rack-scale NVLink domains partly filled: any whole number of trays, racks run with 64 of 72 GPUs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autoshard.costmodel.comm import group_link
from autoshard.specs import ClusterSpec, load_cluster


def _full_racks(cluster: ClusterSpec) -> ClusterSpec:
    """The bundled NVL72 cluster with every rack's 72 GPUs used (the bundled file fills 64 per rack)."""
    node = cluster.primary.node.model_copy(update={"nvlink_domain_gpus_used": None})
    return cluster.model_copy(update={"pools": (cluster.primary.model_copy(update={"node": node}),)})


GB200 = _full_racks(load_cluster("gb200-nvl72"))


def _racks_of_64(gpus: int) -> ClusterSpec:
    node = GB200.primary.node.model_copy(update={"nvlink_domain_gpus_used": 64})
    pool = GB200.primary.model_copy(update={"node": node})
    return GB200.model_copy(update={"pools": (pool,)}).with_gpus(gpus)


def test_trays_fill_racks_in_order() -> None:
    assert GB200.with_gpus(256).primary.domain_fill == (72, 72, 72, 40)
    assert _racks_of_64(256).primary.domain_fill == (64, 64, 64, 64)
    assert _racks_of_64(200).primary.domain_fill == (64, 64, 64, 8)


@pytest.mark.parametrize(("ranks", "stride", "racks_of_64", "tray_filled"), [
    (8, 1, True, True),     # a TP 8 group never leaves a rack
    (16, 1, True, False),   # 16 | 64, but aligned groups of 16 straddle the 72-GPU rack boundary
    (64, 1, True, False),
    (2, 32, True, False),   # span 64 divides 64, not 72
    (128, 1, False, False),
])
def test_group_stays_inside_a_domain_only_when_aligned(ranks, stride, racks_of_64, tray_filled) -> None:
    for cluster, inside in ((_racks_of_64(256), racks_of_64), (GB200.with_gpus(256), tray_filled)):
        link = group_link(cluster.primary, ranks=ranks, stride=stride)
        assert link.crosses_nodes is (not inside), (cluster.primary.domain_fill, ranks, stride)


def test_cross_rack_bandwidth_is_members_times_nic() -> None:
    pool = _racks_of_64(256).primary
    eff = pool.gpu.efficiency
    link = group_link(pool, ranks=128, stride=1)  # 64 members per rack, each with its own 50 GB/s NIC
    assert link.bytes_per_s == pytest.approx(min(64 * 50 * eff.inter_node_bw, 900 * eff.intra_node_bw) * 1e9)
    one_per_rack = group_link(pool, ranks=4, stride=64)  # one member per rack: one NIC
    assert one_per_rack.bytes_per_s == pytest.approx(50e9 * eff.inter_node_bw)


def test_a_pool_inside_one_rack_is_all_nvlink() -> None:
    pool = GB200.with_gpus(40).primary
    assert group_link(pool, ranks=40, stride=1).crosses_nodes is False


@pytest.mark.parametrize(("used", "fragment"), [(76, "at most"), (66, "whole number")])
def test_bad_used_counts(used: int, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        GB200.primary.node.model_copy(update={}).model_validate(
            {**GB200.primary.node.model_dump(), "nvlink_domain_gpus_used": used})


def test_used_count_needs_a_rack_scale_domain() -> None:
    node = load_cluster("dgx-h100").primary.node
    with pytest.raises(ValidationError, match="rack-scale"):
        type(node).model_validate({**node.model_dump(), "nvlink_domain_gpus_used": 8})


@pytest.mark.parametrize(("trays", "fill"), [(18, (72,)), (16, (64,)), (10, (40,)), (36, (64, 64, 16))])
def test_a_pool_that_fits_one_rack_takes_it_whole(trays: int, fill: tuple[int, ...]) -> None:
    """The bundled NVL72 file fills 64 GPUs per rack in a multi-rack job; a pool of 72 GPUs or fewer (a YAML
    with num_nodes 18, or `--gpus 72`) is one rack, and an EP 24 group on it stays inside (NVLink), where
    the 64-per-rack fill would have put ranks 48-71 over two racks."""
    bundled = load_cluster("gb200-nvl72")
    pool = bundled.primary.model_copy(update={"num_nodes": trays})
    assert pool.node.domain_used == 64
    assert pool.domain_fill == fill
    if trays == 18:
        assert not group_link(pool, ranks=24).crosses_nodes
        assert bundled.with_gpus(72).primary.domain_fill == (72,)
