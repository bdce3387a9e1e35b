"""`autoshard models` and `autoshard clusters`: the bundled catalogs with their key figures."""

from __future__ import annotations

from autoshard import api
from autoshard.cli.app import app, guard, out
from autoshard.cli.options import ListJsonOpt, print_json
from autoshard.report.terminal import render_clusters, render_models


@app.command()
@guard
def models(json_out: ListJsonOpt = False) -> None:
    """List the bundled models with their key figures."""
    items = [(name, api.load_model(path)) for name, path in api.bundled_models().items()]
    if json_out:
        print_json({"models": [{"name": n, "params": m.num_params, "active_params": m.num_active_params,
                                "params_with_mtp": m.num_params_with_mtp, "mtp_layers": m.mtp_num_layers,
                                "layers": m.num_layers, "hidden_size": m.hidden_size, "source": m.source}
                               for n, m in items]})
        return
    render_models(items, out)


@app.command()
@guard
def clusters(json_out: ListJsonOpt = False) -> None:
    """List the bundled clusters with their key figures."""
    items = [(name, api.load_cluster(path)) for name, path in api.bundled_clusters().items()]
    if json_out:
        print_json({"clusters": [{"name": n, "gpus": c.num_gpus,
                                  "pools": [{"name": p.name, "gpu": p.gpu.name, "gpus": p.num_gpus,
                                             "price_per_gpu_hour": p.price_per_gpu_hour} for p in c.pools]}
                                 for n, c in items]})
        return
    render_clusters(items, out)
