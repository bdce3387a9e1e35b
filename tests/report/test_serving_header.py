"""Issue #14 follow-up: the serving report's header describes the deployment that runs. A split
(xPyD) plan is its prefill and decode instances, each with its own engine size and batch limit, not
"N engine(s) of M GPUs" (which described one decode instance); its GPU types are named per role
when the roles run on different pools. The header agrees with the launch commands it sits above."""

from __future__ import annotations

import re

import pytest

from autoshard.report.serving import render_serve_plan
from autoshard.api import solve_serve
from autoshard.api import serve_job_for
from autoshard.specs import load_cluster, load_model
from report_fixtures import render, assert_fits  # noqa: F401  (pytest fixtures)


def _solve(model: str, cluster, disaggregate: str):
    m = load_model(model)
    return solve_serve(m, cluster, serve_job_for(m), pins={}, top_k=1, time_limit_s=10, num_workers=1, seed=0,
                       disaggregate=disaggregate)[0]


@pytest.fixture(scope="module")
def split_plan():
    return _solve("llama-3.1-8b", load_cluster("dgx-h100").with_gpus(16), "on")


@pytest.fixture(scope="module")
def mixed_split_plan():
    return _solve("llama-3.1-8b", load_cluster("mixed-h100-a100"), "on")


def _header(text: str) -> str:
    """The panel's text, borders stripped and lines joined."""
    head = text[: text.index("╰")]
    return " ".join(line.strip("│╭╮ ─") for line in head.splitlines() if line.strip("│╭╮ ─"))


@pytest.mark.parametrize("width", [80, 160])
def test_split_header_names_prefill_and_decode_instances(split_plan, width, render, assert_fits):
    plan = split_plan
    assert plan.roles, "the 16-GPU 8B split plan exists"
    p, d = plan.role("prefill"), plan.role("decode")
    text = render(render_serve_plan, plan, width=width)
    assert_fits(text, width)
    head = _header(text)
    assert "engine(s)" not in head and "engines of" not in head
    assert f"serving on {plan.num_gpus} x H100-SXM5-80GB (dgx-h100)" in head
    inst = lambda n, role: f"{n} {role} instance" + ("" if n == 1 else "s")  # noqa: E731
    gpus = lambda n: f"{n} GPU" + ("" if n == 1 else "s")  # noqa: E731
    assert (f"prefill/decode split (xPyD): {inst(p.instances, 'prefill')} of {gpus(p.gpus_per_instance)} "
            f"(max-num-seqs {p.max_num_seqs}) + {inst(d.instances, 'decode')} of {gpus(d.gpus_per_instance)} "
            f"(max-num-seqs {d.max_num_seqs}) = {plan.num_gpus} GPUs") in head
    # the instances add up to the deployment, and the batch limits differ by role (so one figure would lie)
    assert p.instances * p.gpus_per_instance + d.instances * d.gpus_per_instance == plan.num_gpus == 16
    assert p.max_num_seqs != d.max_num_seqs
    assert "running requests per decode DP rank" in head and "GiB per decode GPU" in head
    # the memory table below is the decode instances' too, and says so (it was "Memory per GPU")
    assert "Memory per decode GPU" in text and "Memory per GPU" not in text


def test_split_header_matches_the_launch(split_plan, render):
    """What the header says is what the vLLM script starts: as many prefill and decode servers, each
    with the header's --max-num-seqs."""
    plan = split_plan
    p, d = plan.role("prefill"), plan.role("decode")
    launch = plan.launch["vllm"]
    assert len(re.findall(r"^# node \d+: prefill \d+$", launch, re.M)) == p.instances
    assert len(re.findall(r"^# node \d+: decode \d+$", launch, re.M)) == d.instances
    seqs = re.findall(r"--max-num-seqs (\d+)", launch)
    assert seqs.count(str(p.max_num_seqs)) == p.instances and seqs.count(str(d.max_num_seqs)) == d.instances
    head = _header(render(render_serve_plan, plan, width=160))
    assert f"(max-num-seqs {p.max_num_seqs})" in head and f"(max-num-seqs {d.max_num_seqs})" in head


def test_split_header_names_each_roles_gpu_on_a_mixed_cluster(mixed_split_plan, render, assert_fits):
    plan = mixed_split_plan
    pools = plan.cluster.pools
    kinds = {pools[r.pool_index].gpu.name for r in plan.roles}
    assert len(kinds) == 2, "the split plan on mixed-h100-a100 puts its roles on both pools"
    text = render(render_serve_plan, plan, width=80)
    assert_fits(text, 80)
    head = _header(text)
    where = " + ".join(f"{r.gpus} x {pools[r.pool_index].gpu.name} ({r.role})" for r in plan.roles)
    idle = plan.cluster.num_gpus - plan.num_gpus
    assert f"serving on {where} (mixed-h100-a100" + (f"; {idle} of its {plan.cluster.num_gpus} GPUs idle)" if idle
                                                     else ")") in head
    assert f"{plan.num_gpus} x {plan.pool.gpu.name}" not in head  # not every GPU is the decode pool's
    # the roles table (12 columns with the pool) keeps every figure whole at 80 columns
    for r in plan.roles:
        row = next(line for line in text.splitlines() if line.startswith(r.role + " "))
        assert row.split() == [r.role, str(r.instances), str(r.tp), str(r.pp), str(r.ep), str(r.attention_dp),
                               str(r.gpus), str(r.max_batch), f"{r.requests_per_s:,.2f}", f"{100 * r.utilization:.0f}%",
                               f"{r.prediction.memory.used_bytes / 2**30:.1f}", pools[r.pool_index].name]


def test_aggregated_header_counts_engines(render):
    plan = _solve("llama-3.1-8b", load_cluster("dgx-h100").with_gpus(8), "off")
    assert not plan.roles
    head = _header(render(render_serve_plan, plan, width=160))
    engines = f"{plan.replicas} engine" + ("" if plan.replicas == 1 else "s")
    size = f"{plan.engine_gpus} GPU" + ("" if plan.engine_gpus == 1 else "s")
    assert f"{plan.describe()} ({engines} of {size}), max-num-seqs {plan.max_num_seqs}" in head
    assert plan.replicas * plan.engine_gpus == plan.num_gpus
    assert "prefill/decode split" not in head and "per decode" not in head
