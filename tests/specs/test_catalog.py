"""The bundled catalog: every model and cluster loads, model sizes match what their authors published,
and the cluster entries carry the datasheet figures they cite.

Parameter counts are derived from the weight shapes by autoshard.specs.model; a count that misses the
published size by more than the tolerance means the YAML (or the formula) is wrong.
"""

from __future__ import annotations

import math

import pytest

from autoshard.specs import (
    AttentionKind,
    EfficiencySpec,
    LayerKind,
    LinkKind,
    MlpKind,
    NormKind,
    PositionKind,
    bundled_clusters,
    bundled_models,
    load_cluster,
    load_model,
)

B = 1e9

# name: (published total, published active or None for dense, where the figures come from)
PUBLISHED_SIZES: dict[str, tuple[float, float | None, str]] = {
    "gpt3-175b": (175 * B, None, "https://arxiv.org/abs/2005.14165 Table 2.1"),
    "llama-2-7b": (6.74 * B, None, "https://huggingface.co/meta-llama/Llama-2-7b-hf (6.74B params)"),
    "llama-2-70b": (68.98 * B, None, "https://huggingface.co/meta-llama/Llama-2-70b-hf (68.98B params)"),
    "llama-3.1-8b": (8.03 * B, None, "https://huggingface.co/meta-llama/Llama-3.1-8B (8.03B params)"),
    "llama-3.1-70b": (70.6 * B, None, "https://huggingface.co/meta-llama/Llama-3.1-70B (70.6B params)"),
    "llama-3.1-405b": (405.8 * B, None, "https://huggingface.co/meta-llama/Llama-3.1-405B (405.8B params)"),
    "mixtral-8x7b": (46.7 * B, 12.9 * B, "https://mistral.ai/news/mixtral-of-experts"),
    "mixtral-8x22b": (141 * B, 39 * B, "https://mistral.ai/news/mixtral-8x22b"),
    "qwen3-30b-a3b": (30.5 * B, 3.3 * B, "https://huggingface.co/Qwen/Qwen3-30B-A3B model card"),
    "qwen3-235b-a22b": (235 * B, 22 * B, "https://huggingface.co/Qwen/Qwen3-235B-A22B model card"),
    # 671B / 37B exclude the 14B multi-token-prediction module (https://arxiv.org/abs/2412.19437).
    "deepseek-v3": (671 * B, 37 * B, "https://arxiv.org/abs/2412.19437 Section 1"),
    "nemotron-4-340b": (340 * B, None, "https://arxiv.org/abs/2406.11704 (title; 341B by shape count)"),
}

TOTAL_REL_TOL = 0.01
# Published active counts have two significant digits and are truncated rather than rounded
# (Qwen3-30B-A3B counts 3.353B and is published as "3.3B"; DeepSeek-V3 counts 37.55B, "37B").
ACTIVE_REL_TOL = 0.02

# Exact counts of the released checkpoints, where a public source counts them to the parameter.
EXACT_COUNTS: dict[str, int] = {
    # Keras-Hub presets, whose conversion test asserts equality with transformers' num_parameters()
    # (keras_hub/src/models/qwen3_moe/qwen3_moe_presets.py).
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-235b-a22b": 235_093_634_560,
    # transformers LlamaForCausalLM("meta-llama/Llama-2-7b-hf").num_parameters().
    "llama-2-7b": 6_738_415_616,
}


def test_every_published_model_is_bundled() -> None:
    assert set(PUBLISHED_SIZES) <= set(bundled_models())


@pytest.mark.parametrize("name", sorted(bundled_models()))
def test_bundled_model_loads_and_cites_its_source(name: str) -> None:
    model = load_model(name)
    assert model.name == name
    assert model.source and model.source.startswith("https://")
    text = bundled_models()[name].read_text(encoding="utf-8")
    assert text.startswith("#"), "a bundled model starts with a comment citing its numbers"
    assert model.training is not None and model.training.seq_len and model.training.global_batch_size
    assert model.serving is not None and model.serving.input_len and model.serving.output_len


@pytest.mark.parametrize("name", sorted(PUBLISHED_SIZES))
def test_total_parameters_match_published_size(name: str) -> None:
    total, _, source = PUBLISHED_SIZES[name]
    model = load_model(name)
    assert model.num_params == pytest.approx(total, rel=TOTAL_REL_TOL), (
        f"{name}: {model.num_params / B:.2f}B vs published {total / B:.2f}B ({source})"
    )


@pytest.mark.parametrize("name", sorted(n for n, (_, a, _) in PUBLISHED_SIZES.items() if a is not None))
def test_active_parameters_match_published_size(name: str) -> None:
    _, active, source = PUBLISHED_SIZES[name]
    model = load_model(name)
    assert model.is_moe
    assert model.num_active_params == pytest.approx(active, rel=ACTIVE_REL_TOL), (
        f"{name}: {model.num_active_params / B:.2f}B active vs published {active / B:.2f}B ({source})"
    )


@pytest.mark.parametrize("name", sorted(n for n, (_, a, _) in PUBLISHED_SIZES.items() if a is None))
def test_dense_models_activate_everything(name: str) -> None:
    model = load_model(name)
    assert not model.is_moe
    assert model.num_active_params == model.num_params


@pytest.mark.parametrize("name", sorted(EXACT_COUNTS))
def test_exact_checkpoint_counts(name: str) -> None:
    assert load_model(name).num_params == EXACT_COUNTS[name]


def test_architecture_details() -> None:
    gpt3 = load_model("gpt3-175b")
    assert gpt3.mlp is MlpKind.GELU and gpt3.norm is NormKind.LAYERNORM
    assert gpt3.position_embedding is PositionKind.LEARNED
    assert gpt3.tied_embeddings and gpt3.linear_bias and gpt3.num_layers == 96 and gpt3.vocab_size == 50257

    nemotron = load_model("nemotron-4-340b")
    assert nemotron.mlp is MlpKind.SQUARED_RELU and nemotron.norm is NormKind.LAYERNORM
    assert nemotron.kv_heads == 8 and nemotron.kv_channels == 192 and not nemotron.tied_embeddings

    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        qwen = load_model(name)
        assert qwen.qk_norm and qwen.kv_channels == 128 and qwen.kv_heads == 4
        assert qwen.num_moe_layers == qwen.num_layers and qwen.moe.top_k == 8 and qwen.moe.num_experts == 128

    for name, layers in (("mixtral-8x7b", 32), ("mixtral-8x22b", 56)):
        mixtral = load_model(name)
        assert mixtral.num_moe_layers == mixtral.num_layers == layers
        assert (mixtral.moe.num_experts, mixtral.moe.top_k, mixtral.kv_heads) == (8, 2, 8)

    v3 = load_model("deepseek-v3")
    assert v3.attention is AttentionKind.MLA and v3.num_layers == 61 and v3.num_moe_layers == 58
    assert v3.layer_kinds[1:4] == (LayerKind.DENSE,) * 3 and v3.layer_kinds[4] is LayerKind.MOE
    assert (v3.moe.num_experts, v3.moe.top_k, v3.moe.num_shared_experts) == (256, 8, 1)

    assert load_model("llama-3.1-405b").training.global_batch_size * 8192 == 16 * 2**20  # 16M tokens


# name: (GPUs, GPUs per node, NVLink-domain size, link kind, dense BF16 TFLOP/s, dense FP8 TFLOP/s,
#        HBM TB/s, HBM GiB, intra-node GB/s, inter-node GB/s) -- the datasheet figures each YAML cites.
CLUSTERS: dict[str, tuple] = {
    "dgx-h100": (1024, 8, 8, LinkKind.NVLINK, 989, 1979, 3.35, 79.6, 450, 50),
    "dgx-a100-40gb": (512, 8, 8, LinkKind.NVLINK, 312, None, 1.555, 40.0, 300, 25),
    "dgx-a100-80gb": (512, 8, 8, LinkKind.NVLINK, 312, None, 2.039, 80.0, 300, 25),
    "dgx-h200": (1024, 8, 8, LinkKind.NVLINK, 989, 1979, 4.8, 140.4, 450, 50),
    "dgx-b200": (1024, 8, 8, LinkKind.NVLINK, 2250, 4500, 8.0, 179.1, 900, 50),
    "gb200-nvl72": (1152, 4, 72, LinkKind.NVLINK_SWITCH, 2500, 5000, 8.0, 185.0, 900, 50),
    "h100-pcie": (128, 8, 8, LinkKind.PCIE, 756, 1513, 2.0, 79.6, 50, 25),
    "l40s-pcie": (128, 8, 8, LinkKind.PCIE, 362.05, 733, 0.864, 45.0, 25, 12.5),
    "mi300x": (512, 8, 8, LinkKind.INFINITY_FABRIC, 1307.4, 2614.9, 5.3, 191.7, 448, 50),
    "gb300-nvl72": (1152, 4, 72, LinkKind.NVLINK_SWITCH, 2500, 5000, 8.0, 259.8, 900, 100),
    "dgx-b300": (1024, 8, 8, LinkKind.NVLINK, 2250, 4500, 8.0, 251.5, 900, 100),
    "hgx-h800": (2048, 8, 8, LinkKind.NVLINK, 989, 1979, 3.35, 79.6, 200, 50),
}
# Dense FP4 (NVFP4/MXFP4) tensor-core peaks, TFLOP/s: Blackwell only (datasheets cited in each YAML).
FP4_PEAKS = {"gb300-nvl72": 15000, "dgx-b300": 13500, "dgx-b200": 9000, "gb200-nvl72": 10000}


def test_every_expected_cluster_is_bundled() -> None:
    assert set(CLUSTERS) | {"mixed-h100-a100"} <= set(bundled_clusters())


A100_FIT = EfficiencySpec(gemm=0.85, gemm_half_dim=64, attention=0.30, attention_half_seq=2048, hbm=0.90, intra_node_bw=0.70,
                         inter_node_bw=0.90, train_gemm=0.85, train_gemm_fp8=0.60, train_hbm=0.90, train_attention=0.20,
                         train_attention_half_seq=4096, train_intra_node_bw=0.70, fitted_gpu="A100-SXM4-80GB",
                         fitted_runs=22)


def _train_fit(gemm: float, gemm_fp8: float, attention: float, fitted_gpu: str, runs: int,
               half_seq: float = 2048, hbm: float = 0.80, half_dim: float = 64, intra: float = 0.70,
               inter: float = 0.90) -> EfficiencySpec:
    """Every knob fit_efficiency.py fits, shipped as a training-only override (TP overlap fits 0.80 on
    every GPU)."""
    return EfficiencySpec(train_gemm=gemm, train_gemm_fp8=gemm_fp8, train_hbm=hbm, train_attention=attention,
                          train_attention_half_seq=half_seq, train_gemm_half_dim=half_dim, train_tp_overlap=0.80,
                          train_intra_node_bw=intra, train_inter_node_bw=inter, fitted_gpu=fitted_gpu,
                          fitted_runs=runs)


# Blackwell training fits (tests/validation/fit_efficiency.py, each run weighted by its source's run count
# ^ -1/2 since README item AH): B200, GB200, GB300 and (since the MLPerf v6.0 8B NVFP4 runs of eight
# submitters, now 14 held runs) B300, each on its own runs. Before item AH: B200 FP8 0.50, attention 0.20 at
# 8,192, fall-off 256; GB200 BF16 0.50, fall-off 64, NVLink 0.90; GB300 FP8 0.50, element-wise 0.90.
BLACKWELL_FITS = {
    "B200-SXM-180GB": _train_fit(0.60, 0.45, 0.25, "B200-SXM-180GB", 28, half_seq=4096, hbm=0.80, half_dim=64,
                                 intra=0.90, inter=0.70),
    "GB200-186GB": _train_fit(0.55, 0.50, 0.25, "GB200-186GB", 53, half_seq=8192, hbm=0.60, half_dim=256,
                              intra=0.70),
    "GB300-288GB": _train_fit(0.60, 0.55, 0.25, "GB300-288GB", 23, half_seq=2048, hbm=0.80, half_dim=0, intra=0.90),
    "B300-SXM-288GB": _train_fit(0.60, 0.50, 0.25, "B300-SXM-288GB", 14, half_seq=4096, hbm=0.80, half_dim=256,
                                 inter=0.70),
}


@pytest.mark.parametrize("name", sorted(bundled_clusters()))
def test_bundled_cluster_loads_and_cites_its_source(name: str) -> None:
    cluster = load_cluster(name)
    assert cluster.name == name
    assert cluster.source and cluster.source.startswith("https://")
    assert bundled_clusters()[name].read_text(encoding="utf-8").startswith("#")
    for pool in cluster.pools:
        if pool.price_per_gpu_hour is None:  # allowed only where the YAML says why
            assert "no public on-demand" in bundled_clusters()[name].read_text(encoding="utf-8")
        else:
            assert 0.5 < pool.price_per_gpu_hour < 20
        # Efficiency factors are fitted once per GPU type: the A100 fit is written in every A100 pool,
        # the Blackwell training fits in every Blackwell pool, every other GPU uses the defaults (the
        # H100 SXM fit).
        # (The serving-only fields, fitted per GPU type by tests/validation/validate_serving.py, aside.)
        training = pool.gpu.efficiency.model_copy(update={"serve_gemm": None, "serve_attention_hbm": None})
        if pool.gpu.name.startswith("A100"):
            assert training == A100_FIT
        elif pool.gpu.name in BLACKWELL_FITS:  # training-only knobs: serving keeps the defaults
            assert training == BLACKWELL_FITS[pool.gpu.name]
        elif pool.gpu.name.startswith("MI300X"):  # FP8 GEMMs: H200's serving 0.60 x the measured ratio;
            # training: the CDNA 3 pool's fit (MI325X's 6 held runs, tests/validation/clusters/mi325x.yaml),
            # attention CDNA 3's kernel-measured value (costmodel.efficiency.KERNEL_TRAIN_KNOBS["cdna3"])
            assert training == _train_fit(0.45, 0.50, 0.33, "CDNA 3 pool (MI325X-256GB)", 6, half_seq=850,
                                          hbm=0.80, half_dim=256, inter=0.70).model_copy(
                update={"gemm_fp8": MI300X_GEMM_FP8})
        elif pool.gpu.name == "H200-SXM-141GB":  # 4 held runs: the Hopper pool's fit (H100's values but for the
            # half-dimension H100's fit is indifferent to, every Hopper GEMM taking the measured shape table;
            # at items AC-AF the pool's own values, FP8 0.55 and element-wise 0.80 against H100's 0.60 and 0.60)
            assert training == EfficiencySpec(
                train_gemm=0.60, train_gemm_fp8=0.60, train_hbm=0.60, train_gemm_half_dim=0,
                fitted_gpu="Hopper pool (H100-SXM5-80GB, H200-SXM-141GB)", fitted_runs=158)
        else:
            assert training == EfficiencySpec()
        # FP8 peaks are twice the BF16 peaks on every GPU that has them (dense, no sparsity). 2 %:
        # the L40S datasheet lists 362.05 TFLOP/s BF16 but 733 FP8 (2 x 366.4 at the 2520 MHz boost).
        if pool.gpu.fp8_tflops is not None:
            assert pool.gpu.fp8_tflops == pytest.approx(2 * pool.gpu.bf16_tflops, rel=0.02)


MI300X_GEMM_FP8 = round(0.60 * (1159.23 / 2614.9) / (1300.6 / 1979), 2)
"""MI300X FP8 GEMMs as engines run them (clusters/mi300x.yaml): the H200 serving fit's 0.60 of peak
times the ratio of the two GPUs' FP8 GEMM fractions in one harness, Azure's AI-benchmarking-guide at
8192^3 (hipBLASLt on ND MI300X v5: 1,159.23 TFLOP/s; cuBLASLt on ND H200 v5: 1,300.6)."""


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_cluster_datasheet_figures(name: str) -> None:
    gpus, per_node, domain, link, bf16, fp8, hbm_tbps, hbm_gib, intra, inter = CLUSTERS[name]
    cluster = load_cluster(name)
    assert not cluster.is_heterogeneous
    pool = cluster.primary
    assert cluster.num_gpus == gpus
    node = pool.node
    assert (node.gpus_per_node, node.domain_size, node.intra_node_link) == (per_node, domain, link)
    assert pool.gpu.bf16_tflops == pytest.approx(bf16)
    assert pool.gpu.fp8_tflops == (None if fp8 is None else pytest.approx(fp8))
    assert pool.gpu.hbm_tbps == pytest.approx(hbm_tbps)
    assert pool.gpu.hbm_gib == pytest.approx(hbm_gib)
    assert node.intra_node_gbps == pytest.approx(intra)
    assert node.inter_node_gbps == pytest.approx(inter)
    assert pool.gpu.fp4_tflops == (pytest.approx(FP4_PEAKS[name]) if name in FP4_PEAKS else None)


def test_hbm_is_what_the_driver_reports() -> None:
    # hbm_gib is MiB (bytes for ROCm) from nvidia-smi / rocm-smi divided into GiB.
    reported_mib = {
        "dgx-a100-40gb": 40960, "dgx-a100-80gb": 81920, "dgx-h100": 81559, "dgx-h200": 143771,
        "dgx-b200": 183359, "gb200-nvl72": 189471, "h100-pcie": 81559, "l40s-pcie": 46068,
        "mi300x": 205822885888 / 2**20,
    }
    for name, mib in reported_mib.items():
        assert load_cluster(name).primary.gpu.hbm_gib == pytest.approx(mib / 1024, abs=0.05), name


def test_gb200_resizes_in_whole_trays_with_the_last_rack_partly_filled() -> None:
    """A multi-rack job fills 64 GPUs (16 trays) of each 72-GPU rack, the last rack partly; a job of 72 GPUs
    or fewer takes one rack."""
    gb200 = load_cluster("gb200-nvl72")
    assert gb200.primary.node.domain_used == 64
    assert gb200.with_gpus(144).num_gpus == 144
    assert gb200.with_gpus(144).primary.node.domain_size == 72
    assert gb200.with_gpus(144).primary.domain_fill == (64, 64, 16)
    assert gb200.with_gpus(256).primary.domain_fill == (64, 64, 64, 64)  # 64 trays
    assert gb200.with_gpus(72).primary.domain_fill == (72,)  # one whole rack
    assert gb200.with_gpus(40).primary.domain_fill == (40,)  # 10 trays of one rack
    with pytest.raises(ValueError, match="4-GPU nodes"):
        gb200.with_gpus(102)


def test_heterogeneous_cluster() -> None:
    mixed = load_cluster("mixed-h100-a100")
    assert mixed.is_heterogeneous
    assert {p.name: p.num_gpus for p in mixed.pools} == {"h100": 32, "a100": 64}
    assert mixed.num_gpus == 96
    assert mixed.pool_link_gbps == 25
    h100 = load_cluster("dgx-h100").primary
    a100 = load_cluster("dgx-a100-80gb").primary
    pools = {p.name: p for p in mixed.pools}
    # The pools repeat the homogeneous entries exactly.
    assert (pools["h100"].gpu, pools["h100"].node) == (h100.gpu, h100.node)
    assert (pools["a100"].gpu, pools["a100"].node) == (a100.gpu, a100.node)
    assert pools["h100"].price_per_gpu_hour == h100.price_per_gpu_hour
    assert pools["a100"].price_per_gpu_hour == a100.price_per_gpu_hour
    with pytest.raises(ValueError, match="heterogeneous"):
        mixed.with_gpus(64)


def test_weights_fit_where_the_catalog_suggests() -> None:
    # Sanity: a bf16 copy of Llama-3.1-405B does not fit one 8-GPU H100 node but fits one MI300X node.
    weights_gib = load_model("llama-3.1-405b").num_params * 2 / 2**30
    assert weights_gib > 8 * load_cluster("dgx-h100").primary.gpu.hbm_gib
    assert weights_gib < 8 * load_cluster("mi300x").primary.gpu.hbm_gib
    assert math.isclose(weights_gib, 756, rel_tol=0.01)
