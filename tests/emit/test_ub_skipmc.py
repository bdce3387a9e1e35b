"""--tp-comm-overlap on GPUs without CUDA multicast (compute capability < 9.0: A100, L40S): Transformer
Engine's userbuffers assert at start-up unless UB_SKIPMC=1 selects the CUDA-IPC path (Transformer
Engine, examples/pytorch/comm_gemm_overlap/README.md). The command and the script carry it exactly then."""

from __future__ import annotations

import pytest

from autoshard.api import evaluate, train_job
from autoshard.emit.megatron.command import megatron_command, needs_ub_skipmc
from autoshard.emit.megatron.script import megatron_script
from autoshard.specs import load_cluster, load_model

MODEL = load_model("llama-3.1-8b")


def _plan(cluster: str, **knobs):
    spec = load_cluster(cluster).with_gpus(8)
    return evaluate(MODEL, spec, train_job(MODEL, seq_len=4096, global_batch_size=64), tp=4, pp=1,
                    micro_batch_size=1, **knobs)


@pytest.mark.parametrize(
    ("cluster", "knobs", "expected"),
    [
        ("dgx-a100-80gb", {}, True),                          # SP on, so --tp-comm-overlap is written
        ("l40s-pcie", {}, True),                              # Ada, compute capability 8.9
        ("dgx-a100-80gb", {"tp_comm_overlap": False}, False),  # no overlap, no userbuffers
        ("dgx-h100", {}, False),                              # Hopper has multicast
        ("dgx-b200", {}, False),
    ],
)
def test_ub_skipmc_exactly_where_userbuffers_lack_multicast(cluster: str, knobs: dict, expected: bool) -> None:
    plan = _plan(cluster, **knobs)
    command, script = megatron_command(plan), megatron_script(plan)
    assert needs_ub_skipmc(plan) is expected
    assert ("--tp-comm-overlap" in command) is (knobs.get("tp_comm_overlap", True))
    assert ("UB_SKIPMC=1 torchrun" in command) is expected
    assert ("\nexport UB_SKIPMC=1\n" in script) is expected
