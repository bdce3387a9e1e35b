"""SGLang launch lines are read against SGLang 0.5.23's whole flag vocabulary (autoshard.emit.sglang.flags,
from its parser): a misspelt flag or an ambiguous abbreviation, both of which SGLang's argparse refuses,
is refused (it used to be ignored with a note, pricing another plan: `--tp-sise 8` as TP 1); a unique
abbreviation is read as its flag, as argparse's allow_abbrev does; a flag's values are skipped by its
arity, not by guessing; flags of earlier 0.5 releases autoshard still reads say what 0.5.23 makes of them."""

from __future__ import annotations

import pytest

from autoshard.emit.serve_args import misspelling_of
from autoshard.emit.sglang import parse_sglang
from autoshard.emit.sglang.flags import KNOWN, MULTI_VALUE, NO_VALUE, ONE_VALUE
from autoshard.emit.vllm import parse_vllm
from autoshard.errors import SpecError

BASE = "python -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-FP8 --tp-size 8 --quantization fp8"


def test_the_vocabulary_is_sglang_0_5_23s() -> None:
    assert len(KNOWN) == 559 and len(NO_VALUE) == 173 and len(ONE_VALUE) == 336 and len(MULTI_VALUE) == 22
    assert {"--tp-size", "--attn-dp-size", "--moe-a2a-backend", "--disaggregation-mode"} <= ONE_VALUE
    assert "--cuda-graph-bs-decode" in MULTI_VALUE and "--enable-dp-attention" in NO_VALUE


@pytest.mark.parametrize(("extra", "message"), [
    ("--tp-sise 8", "--tp-sise is not an SGLang 0.5.23 flag: did you mean --tp-size?"),
    ("--chunked-prefil-size 4096", "did you mean --chunked-prefill-size?"),
    ("--mem-fraction-statc 0.8", "did you mean --mem-fraction-static?"),
    ("--cuda-graph-max 64", "ambiguous to SGLang 0.5.23's parser, which refuses it: it could be "
                            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"),
    # not among SGLang's choices (vLLM's spellings): refused as SGLang refuses them (both were read as FP8)
    ("--kv-cache-dtype fp8", "SGLang has no --kv-cache-dtype fp8: use auto, bf16, fp8_e4m3 or fp8_e5m2"),
    ("--kv-cache-dtype int8", "SGLang has no --kv-cache-dtype int8"),
    ("--quantization bogus", "SGLang has no --quantization bogus"),  # was priced as BF16 with a note
    ("--config sg.yaml", "--config: the flags in a config file are not read; put them on the line"),  # was TP 1
])
def test_what_sglang_refuses_is_refused(extra: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("?", r"\?").replace(".", r"\.")):
        parse_sglang(f"{BASE} {extra}")


def test_abbreviations_legacy_flags_and_arity() -> None:
    p = parse_sglang(f"{BASE} --mem-frac 0.8 --cuda-graph-bs-decode 1 2 4 8 --enable-foo-bar --ep-size 8")
    assert p.gpu_memory_utilization == 0.8 and p.enable_expert_parallel
    notes = " ".join(p.warnings)
    assert "--mem-frac: accepted by SGLang only as an abbreviation of --mem-fraction-static" in notes
    assert "--enable-foo-bar: unknown SGLang 0.5.23 flag" in notes  # far from every flag: a newer one
    assert "unexpected positional" not in notes  # 2 4 8 are --cuda-graph-bs-decode's values
    legacy = parse_sglang(f"{BASE} --enable-ep-moe --cuda-graph-max-bs 64")
    assert legacy.enable_expert_parallel  # read as before, with what SGLang 0.5.23 makes of them
    notes = " ".join(legacy.warnings)
    assert "--enable-ep-moe: removed before SGLang 0.5.23" in notes and "refuses the old name as ambiguous" in notes


@pytest.mark.parametrize(("name", "expected"), [
    ("--tp-sise", "--tp-size"),  # difflib's ratio: 0.89, under the 0.9 cutoff
    ("--tp-szie", "--tp-size"),  # two neighbours swapped
    ("--tp-siz", "--tp-size"),  # a letter dropped
    ("--tensor-paralel-size", "--tensor-parallel-size"),
    ("--enable-foo-bar", None),
])
def test_misspelling_of(name: str, expected: str | None) -> None:
    assert misspelling_of(name, ["--tp-size", "--pp-size", "--tensor-parallel-size", "--enable-lora"], 0.9) == expected


def test_vllm_refuses_a_one_letter_misspelling_too() -> None:
    with pytest.raises(SpecError, match=r"--tensor-parallel-sise is not a vLLM .* did you mean --tensor-parallel-size"):
        parse_vllm("vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-sise 4")


def test_older_sglang_spellings_are_notes_not_refusals() -> None:
    """Flags of earlier 0.5 releases that 0.5.23 renamed or split are read or skipped with a note, not refused as
    misspellings or ambiguous abbreviations (review of 2026-11-24: --cuda-graph-bs, common in launch lines,
    was refused as ambiguous, --oltp-traces-endpoint and --max-micro-batch-size as typos)."""
    p = parse_sglang(f"{BASE} --cuda-graph-bs 1 2 4 8 --oltp-traces-endpoint host:4317 --max-micro-batch-size 4")
    notes = " ".join(p.warnings)
    assert "--cuda-graph-bs: SGLang 0.5.23 split it" in notes and "unexpected positional" not in notes
    assert "--oltp-traces-endpoint: the older spelling" in notes and "--max-micro-batch-size: renamed" in notes


@pytest.mark.parametrize(("kv", "dtype", "noted"), [("bf16", "bf16", False), ("bfloat16", "bf16", False),
                                                     ("auto", "bf16", False), ("fp8_e4m3", "fp8", False),
                                                     ("fp8_e5m2", "fp8", False), ("mxfp8", "fp8", False),
                                                     ("nvfp4", "fp8", True), ("fp4_mx_block16", "fp8", True)])
def test_sglang_kv_cache_dtypes_read_as_sglang_means_them(kv: str, dtype: str, noted: bool) -> None:
    """SGLang 0.5.23's --kv-cache-dtype choices: bf16 is a BF16 cache (it was read as FP8, half the bytes per
    token: twice the KV tokens), the FP4 caches are modelled as FP8 and say so."""
    p = parse_sglang(f"{BASE} --kv-cache-dtype {kv}")
    assert p.kv_dtype.value == dtype
    assert any("modelled as fp8" in w for w in p.warnings) == noted


def test_an_ep_spanning_all_to_all_backend_spreads_the_experts_over_tp() -> None:
    """SGLang sets ep_size = tp_size for DeepEP, Mooncake and the other EP-spanning all-to-all backends
    (srt/arg_groups/overrides.py _a2a_ep_size), so its DeepSeek recipes leave --ep-size out: such a line was
    read as attention DP with TP-sharded experts, without DeepEP."""
    line = ("python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --dp 8 --enable-dp-attention "
            "--moe-a2a-backend deepep")
    p = parse_sglang(line)
    assert (p.tp, p.dp, p.enable_expert_parallel) == (1, 8, True)
    assert not parse_sglang(line.replace("deepep", "none")).enable_expert_parallel


def test_vllm_config_files_are_not_read_silently() -> None:
    """`vllm serve MODEL --config cfg.yaml` (tensor-parallel-size 8, max-model-len, kv-cache-dtype in the file)
    was priced as TP 1 BF16 with no warning: refused, naming the file and the fix."""
    with pytest.raises(SpecError, match="--config cfg.yaml: the flags in a config file are not read"):
        parse_vllm("vllm serve meta-llama/Llama-3.1-70B-Instruct --config cfg.yaml")
