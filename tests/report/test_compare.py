"""`solve --from-megatron`'s change list names every plan flag that differs, layout flags included."""

from __future__ import annotations

from autoshard.api import evaluate, train_job
from autoshard.emit.megatron.layout import LayoutFlags
from autoshard.report.compare import compare_plans
from autoshard.specs import load_cluster, load_model


def _plans(yours_layout: LayoutFlags | None, best_layout: LayoutFlags, model_ref: str = "llama-3.1-70b",
           **degrees):
    model = load_model(model_ref)
    cluster = load_cluster("dgx-h100").with_gpus(64)
    job = train_job(model, seq_len=8192, global_batch_size=512)
    yours = evaluate(model, cluster, job, **degrees, layout=yours_layout)
    best = evaluate(model, cluster, job, **degrees, layout=best_layout)
    return yours, best


def test_first_last_stage_counts_are_listed_as_changes():
    """The even split (20 layers per stage) against the solver's Et*21|t*20|t*20|t*19L, which the
    emitter writes as first/last-stage counts: applying the change list must give the best plan."""
    yours, best = _plans(None, LayoutFlags(first=21, last=19), tp=4, pp=4, cp=2)
    changes = {c["flag"]: (c["yours"], c["best"]) for c in compare_plans(yours, best)["changes"]}
    assert changes == {"--decoder-first-pipeline-num-layers": ("off", "21"),
                       "--decoder-last-pipeline-num-layers": ("off", "19")}


def test_account_for_flags_are_listed_as_changes():
    """Llama 3.1 405B's 126 decoder layers over PP 8: first/last-stage counts 16 and 14 against the
    account-for flags (126 + embedding + loss = 128: E+15, 16 x 6, 15+L)."""
    accounted = LayoutFlags(account_embedding=True, account_loss=True)
    yours, best = _plans(LayoutFlags(first=16, last=14), accounted, "llama-3.1-405b", tp=8, pp=8)
    changes = {c["flag"]: (c["yours"], c["best"]) for c in compare_plans(yours, best)["changes"]}
    assert changes == {"--decoder-first-pipeline-num-layers": ("16", "off"),
                       "--decoder-last-pipeline-num-layers": ("14", "off"),
                       "--account-for-embedding-in-pipeline-split": ("off", "on"),
                       "--account-for-loss-in-pipeline-split": ("off", "on")}
