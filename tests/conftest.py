"""Shared fixtures: small synthetic models and clusters that keep solver tests fast."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import pytest

from autoshard.costmodel.flops import mlp_gemms
from autoshard.costmodel.moe import busiest_rank_factor
from autoshard.costmodel.serve.fused_moe import expected_padded_rows
from autoshard.search.train.bounds_pools import pool_rank_limits
from autoshard.search.train.tables import Layout
from autoshard.specs import ClusterSpec, ModelSpec
from autoshard.specs.hf import model_from_hf_config

HF_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"


def hf_fixture(name: str) -> ModelSpec:
    """A stored Hugging Face config.json of tests/fixtures/hf, imported (its import warnings, such as Gemma 3's
    left-out vision tower, silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_from_hf_config(json.loads((HF_FIXTURES / f"{name}.json").read_text()), source=name)


def tiny_model(*, layers: int = 6, hidden: int = 1024, heads: int = 8, kv: int = 8, vocab: int = 32000,
               moe: dict | None = None, tied: bool = False, dense_first: int = 0) -> ModelSpec:
    groups: list[dict] = [{"kind": "embedding"}]
    if moe:
        if dense_first:
            groups.append({"kind": "dense", "count": dense_first})
        groups.append({"kind": "moe", "count": layers - dense_first})
    else:
        groups.append({"kind": "dense", "count": layers})
    groups.append({"kind": "output"})
    return ModelSpec.model_validate({
        "name": "tiny", "hidden_size": hidden, "ffn_hidden_size": 4 * hidden, "num_attention_heads": heads,
        "num_kv_heads": kv, "vocab_size": vocab, "tied_embeddings": tied, "max_position_embeddings": 8192,
        "layers": groups, "moe": moe,
    })


SYNTHETIC_EFFICIENCY = {"train_intra_node_bw": 0.7, "train_expert_host_us": 0.0}
"""The synthetic GPUs' training knobs that README item AC moved in the H100 defaults (EP traffic 0.7 of the
link, no host floor under MoE layers): the solver tests' situations (which bound is tight, which plan wins)
were built on them. tests/search/test_host_floor_bounds.py checks the bounds with the floor on."""


def gpu(name: str = "H100", *, hbm: float = 80.0, tflops: float = 989.0, efficiency: dict | None = None) -> dict:
    return {"name": name, "hbm_gib": hbm, "bf16_tflops": tflops, "fp8_tflops": 2 * tflops, "hbm_tbps": 3.35,
            "efficiency": SYNTHETIC_EFFICIENCY if efficiency is None else efficiency}


def node(gpus: int = 8) -> dict:
    return {"gpus_per_node": gpus, "intra_node_link": "nvlink", "intra_node_gbps": 450, "inter_node_gbps": 50}


def tiny_cluster(*, gpus_per_node: int = 4, nodes: int = 2, hbm: float = 80.0,
                 efficiency: dict | None = None) -> ClusterSpec:
    return ClusterSpec.model_validate({"name": "tiny", "gpu": gpu(hbm=hbm, efficiency=efficiency),
                                       "node": node(gpus_per_node), "num_nodes": nodes})


def hetero_cluster(*, hbm_a: float = 80.0, hbm_b: float = 40.0) -> ClusterSpec:
    return ClusterSpec.model_validate({
        "name": "mixed",
        "pools": [
            {"name": "fast", "gpu": gpu("H100", hbm=hbm_a), "node": node(4), "num_nodes": 1},
            {"name": "slow", "gpu": gpu("A100", hbm=hbm_b, tflops=312.0), "node": node(4), "num_nodes": 1},
        ],
        "inter_pool_gbps": 25,
    })


def three_tight_cluster(big_hbm: float, small_hbm: float) -> ClusterSpec:
    """Fast GPUs, slow GPUs with as much memory and slow GPUs with less, one 2-GPU node each."""
    return ClusterSpec.model_validate({
        "name": "three-tight",
        "pools": [
            {"name": "fast", "gpu": gpu("H100", hbm=big_hbm), "node": node(2), "num_nodes": 1},
            {"name": "slow", "gpu": gpu("A100", hbm=big_hbm, tflops=312.0), "node": node(2), "num_nodes": 1},
            {"name": "small", "gpu": gpu("A10", hbm=small_hbm, tflops=125.0), "node": node(2), "num_nodes": 1},
        ],
        "inter_pool_gbps": 25,
    })


def pool_assignments(tab, pool_gpus) -> list[tuple[int, ...]]:
    """Every pipeline rank -> pool assignment within the pools' rank limits (brute-force tests of the
    heterogeneous bounds)."""
    pp, k = tab.config.dims.pp, len(pool_gpus)
    limits = pool_rank_limits(tab, pool_gpus)
    return [v for v in itertools.product(range(k), repeat=pp) if all(v.count(q) <= limits[q] for q in range(k))]


def uniform_layouts(tab, pool_gpus):
    """Every layout with one recompute count for every chunk: each assignment within the pools' rank
    limits, each contiguous split, each count up to the smallest chunk's decoder layers (none where
    the plan recomputes everything already or selectively)."""
    cfg = tab.config
    s, n, pp = tab.num_chunks, tab.num_layers, cfg.dims.pp
    allow_rc = not tab.base_full and cfg.recompute.value != "selective"
    for v in pool_assignments(tab, pool_gpus):
        chunk_pools = tuple(v[k % pp] for k in range(s))
        for inner in itertools.combinations(range(1, n), s - 1):
            bnds = (0, *inner, n)
            smallest = min(int(tab.decoders[bnds[k + 1]] - tab.decoders[bnds[k]]) for k in range(s))
            for rc in range(smallest + 1 if allow_rc else 1):
                yield Layout(bounds=bnds, recompute=(rc,) * s, pools=chunk_pools)


def layout_objectives(model: ModelSpec, cluster: ClusterSpec, cfg):
    """Every contiguous split of candidate `cfg` on pool 0 the solver may choose
    (`CandidateTables.chunks_allowed`), no partial recompute: (the configuration and stages the layout
    runs, the integer objective the CP-SAT model counts for it, in seconds). Tests that hold the
    solver's objective to `predict_train` walk these."""
    from autoshard.search.train.result import layout_stages
    from autoshard.search.train.tables import build_tables, int_objective
    from autoshard.units import US_PER_S

    vpp = cfg.dims.vpp
    tab = build_tables(model, cluster, cfg, scale=vpp)
    s, n = tab.num_chunks, tab.num_layers
    for inner in itertools.combinations(range(1, n), s - 1):
        bounds = (0, *inner, n)
        if not tab.chunks_allowed([int(tab.decoders[bounds[k + 1]] - tab.decoders[bounds[k]]) for k in range(s)]):
            continue
        layout = Layout(bounds=bounds, recompute=(0,) * s, pools=(0,) * s)
        obj, _ = int_objective(tab, layout)
        c, stages = layout_stages(tab, layout)
        yield c, stages, obj / vpp / US_PER_S


@pytest.fixture
def small_dense() -> ModelSpec:
    return tiny_model()


def closed_form_experts_s(model, gpu, *, tokens: float, rate: float, tile: int, tp: int = 1, ep: int = 1) -> float:
    """One serving MoE layer's routed experts on the busiest of `ep` expert-parallel GPUs, experts split
    `tp` ways (no attention DP): E/ep local experts, of which E/ep (1 - (1 - k/E)^tokens) are hit; the
    busiest rank's pairs tokens k / ep x `busiest_rank_factor` (1 at EP 1), each hit expert's rows padded
    to `tile` (Poisson); per weight matrix the slower of 2 x hit x padded x n x k at `rate` of the FP8
    peak (shape fall-off) and reading the hit experts' FP8 weights plus the pairs' activations, plus one
    launch."""
    e, k = model.moe.num_experts, model.moe.top_k
    pairs = tokens * k / ep
    pairs *= busiest_rank_factor(ep, pairs, e, k, model.moe.num_groups, model.moe.topk_groups)
    hit = e / ep * (1 - (1 - k / e) ** tokens)
    padded = expected_padded_rows(pairs * ep / e, tile)
    eff = gpu.efficiency
    total = 0.0
    for g in mlp_gemms(model, 1, model.moe.expert_ffn_hidden_size, tp):
        d = min(padded, g.n, g.k)
        math_s = 2 * hit * padded * g.n * g.k / (gpu.fp8_tflops * 1e12 * rate * d / (d + eff.gemm_half_dim))
        mem_s = (hit * g.n * g.k + pairs * (g.k + 2 * g.n)) / (gpu.hbm_tbps * 1e12 * eff.hbm)
        total += max(math_s, mem_s) + eff.kernel_overhead_us * 1e-6
    return total
