"""Several variational answers against one MCMC answer: a table, a summary, figures."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpyro_dgp.diagnostics._health import Health, mcmc_health
from numpyro_dgp.diagnostics._metrics import _draws, layer_metrics
from numpyro_dgp.diagnostics._trees import layer_names

__all__ = ["Comparison", "compare", "plot_layers", "plot_marginals"]


class Comparison(NamedTuple):
    """Result of :func:`compare`.

    :ivar table: tidy per-point metrics of every method (:func:`layer_metrics`).
    :ivar summary: per method and layer over the chosen points: median variance ratio, mean
        W1, mean Gaussian KL, mean coverage.
    :ivar health: :class:`Health` of the MCMC reference.
    :ivar figures: ``{"layers": Figure, "marginals": Figure}`` (when ``plot``).
    """

    table: object
    summary: object
    health: Health
    figures: dict


def compare(vi: dict, mcmc, *, points=None, interval: float = 0.9, plot: bool = True,
            rhat_threshold: float = 1.01, ess_threshold: float = 400.0) -> Comparison:
    """Compare variational results with an MCMC reference, layer by layer.

    :param vi: ``{method name: DataTree}`` (from :func:`from_guide`).
    :param mcmc: reference ``DataTree`` (from :func:`from_mcmc`).
    :param points: grid indices the summary and the marginal plots use (default: all
        points; pass interior ones to leave out the edges of the data).
    :return: :class:`Comparison`.
    """
    import pandas as pd

    if not vi:
        raise ValueError("compare: vi must name at least one variational result")
    health = mcmc_health(mcmc, rhat_threshold=rhat_threshold, ess_threshold=ess_threshold)
    table = pd.concat([layer_metrics(tree, mcmc, interval=interval, label=name) for name, tree in vi.items()],
                      ignore_index=True)
    G = mcmc["posterior"].sizes["grid"]
    points = list(range(G)) if points is None else [int(p) for p in points]
    if any(p < 0 or p >= G for p in points):
        raise ValueError(f"compare: points must be grid indices in [0, {G}), got {points}")
    chosen = table[table["grid"].isin(points)]
    summary = (
        chosen.groupby(["method", "layer"], sort=False)
        .agg(variance_ratio=("variance_ratio", "median"), wasserstein=("wasserstein", "mean"),
             kl_gaussian=("kl_gaussian", "mean"), coverage=("coverage", "mean"))
        .reset_index()
    )
    figures = {}
    if plot:
        figures["layers"] = plot_layers({**vi, "MCMC": mcmc})
        figures["marginals"] = plot_marginals({**vi, "MCMC": mcmc}, points=points[:: max(1, len(points) // 3)][:3])
    return Comparison(table, summary, health, figures)


def plot_layers(trees: dict, num_samples: int = 25, seed: int = 0):
    """Per method (rows): each layer's samples against its own input, and the composition.

    :param trees: ``{method: DataTree}`` in this module's layout.
    """
    import matplotlib.pyplot as plt

    methods = list(trees)
    names = layer_names(trees[methods[0]])
    ncols = len(names) + 1
    fig, axes = plt.subplots(len(methods), ncols, figsize=(3.1 * ncols, 2.4 * len(methods)), squeeze=False)
    rng = np.random.default_rng(seed)
    x = np.asarray(trees[methods[0]]["constant_data"]["grid_x"].values)[:, 0]
    for r, method in enumerate(methods):
        tree = trees[method]
        draws = {n: _draws(tree, n)[..., 0] for n in names}
        S = next(iter(draws.values())).shape[0]
        idx = rng.choice(S, size=min(num_samples, S), replace=False)
        inputs = np.broadcast_to(x, (len(idx), x.size))
        for c, name in enumerate(names):
            out = draws[name][idx]
            for s in range(len(idx)):
                axes[r, c].plot(inputs[s], out[s], lw=0.7, alpha=0.6, color=f"C{r}")
            axes[r, c].set_title(f"{name} vs its input", fontsize=9)
            inputs = out
        for s in range(len(idx)):
            axes[r, -1].plot(x, draws[names[-1]][idx[s]], lw=0.7, alpha=0.6, color=f"C{r}")
        axes[r, -1].set_title("composition vs x", fontsize=9)
        axes[r, 0].set_ylabel(method, fontsize=9)
    fig.tight_layout()
    return fig


def plot_marginals(trees: dict, points, bins: int = 40):
    """Histograms of each layer's marginal at chosen grid points, one color per method."""
    import matplotlib.pyplot as plt

    methods = list(trees)
    names = layer_names(trees[methods[-1]])
    points = list(points)
    fig, axes = plt.subplots(len(names), len(points), figsize=(3.2 * len(points), 2.4 * len(names)), squeeze=False)
    x = np.asarray(trees[methods[-1]]["constant_data"]["grid_x"].values)[:, 0]
    for r, name in enumerate(names):
        for c, g in enumerate(points):
            ax = axes[r, c]
            for k, method in enumerate(methods):
                v = _draws(trees[method], name)[:, g, 0]
                ax.hist(v, bins=bins, density=True, histtype="step", lw=1.2, color=f"C{k}", label=method)
            ax.set_title(f"{name} at x = {x[g]:.2f}", fontsize=9)
            ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig
