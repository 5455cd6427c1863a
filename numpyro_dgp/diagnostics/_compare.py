"""Several variational answers against one MCMC answer: a table, a summary, figures."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from numpyro_dgp.diagnostics._health import Health, mcmc_health
from numpyro_dgp.diagnostics._metrics import layer_draws, layer_metrics
from numpyro_dgp.diagnostics._trees import layer_names

if TYPE_CHECKING:
    import matplotlib.figure
    import pandas
    import xarray

__all__ = ["Comparison", "compare", "plot_layers", "plot_marginals"]


class Comparison(NamedTuple):
    """Result of :func:`compare`.

    :ivar table: ``pandas.DataFrame`` of tidy per-point metrics of every method
        (:func:`layer_metrics`).
    :ivar summary: ``pandas.DataFrame``, per method and layer over the chosen points: median
        variance ratio, mean W1, mean Gaussian KL, mean coverage.
    :ivar health: :class:`Health` of the MCMC reference.
    :ivar figures: ``{"layers": Figure, "marginals": Figure}`` (when ``plot``; else ``{}``).
    """

    table: pandas.DataFrame
    summary: pandas.DataFrame
    health: Health
    figures: dict[str, matplotlib.figure.Figure]


def compare(
    vi: dict[str, xarray.DataTree],
    mcmc: xarray.DataTree,
    *,
    points: Sequence[int] | None = None,
    interval: float = 0.9,
    plot: bool = True,
    rhat_threshold: float = 1.01,
    ess_threshold: float = 400.0,
) -> Comparison:
    """Compare variational results with an MCMC reference, layer by layer.

    :param vi: ``{method name: DataTree}`` (from :func:`from_guide`).
    :param mcmc: reference ``DataTree`` (from :func:`from_mcmc`).
    :param points: grid indices the summary and the marginal plots use (default: all
        points; pass interior ones to leave out the edges of the data).
    :param interval: probability of the VI central interval used for ``coverage`` (see
        :func:`layer_metrics`).
    :param plot: also draw :func:`plot_layers` and :func:`plot_marginals` (at up to three of
        ``points``).
    :param rhat_threshold: R-hat limit of the health report (see :func:`mcmc_health`).
    :param ess_threshold: bulk-ESS limit of the health report.
    :return: :class:`Comparison`.
    """
    import pandas as pd

    _check_methods(vi)
    health = mcmc_health(mcmc, rhat_threshold=rhat_threshold, ess_threshold=ess_threshold)
    table = pd.concat(
        [layer_metrics(tree, mcmc, interval=interval, label=name) for name, tree in vi.items()],
        ignore_index=True,
    )
    points = _check_points(points, mcmc["posterior"].sizes["grid"])
    chosen = table[table["grid"].isin(points)]
    summary = (
        chosen.groupby(["method", "layer"], sort=False)
        .agg(
            variance_ratio=("variance_ratio", "median"),
            wasserstein=("wasserstein", "mean"),
            kl_gaussian=("kl_gaussian", "mean"),
            coverage=("coverage", "mean"),
        )
        .reset_index()
    )
    figures = {}
    if plot:
        figures["layers"] = plot_layers({**vi, "MCMC": mcmc})
        figures["marginals"] = plot_marginals(
            {**vi, "MCMC": mcmc}, points=points[:: max(1, len(points) // 3)][:3]
        )
    return Comparison(table, summary, health, figures)


def _check_methods(vi: dict[str, xarray.DataTree]) -> None:
    """Refuse an empty ``vi`` (:func:`compare`).

    :raises ValueError: for one.
    """
    if not vi:
        raise ValueError("compare: vi must name at least one variational result")


def _check_points(points: Sequence[int] | None, G: int) -> list[int]:
    """``points`` as a list of grid indices (default: all ``G``), each checked to be in ``[0, G)``.

    :raises ValueError: for an index outside.
    """
    chosen = list(range(G)) if points is None else [int(p) for p in points]
    if any(p < 0 or p >= G for p in chosen):
        raise ValueError(f"compare: points must be grid indices in [0, {G}), got {chosen}")
    return chosen


def plot_layers(
    trees: dict[str, xarray.DataTree], num_samples: int = 25, seed: int = 0
) -> matplotlib.figure.Figure:
    """Per method (rows): each layer's samples against its own input, and the composition.

    :param trees: ``{method: DataTree}`` in this module's layout (the first one's layers
        and grid are used for all).
    :param num_samples: samples drawn per method (at most the number of draws).
    :param seed: NumPy seed choosing the samples.
    :return: the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    methods = list(trees)
    names = layer_names(trees[methods[0]])
    ncols = len(names) + 1
    fig, axes = plt.subplots(
        len(methods), ncols, figsize=(3.1 * ncols, 2.4 * len(methods)), squeeze=False
    )
    rng = np.random.default_rng(seed)
    x = np.asarray(trees[methods[0]]["constant_data"]["grid_x"].values)[:, 0]
    for r, method in enumerate(methods):
        tree = trees[method]
        draws = {n: layer_draws(tree, n)[..., 0] for n in names}
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


def plot_marginals(
    trees: dict[str, xarray.DataTree], points: Sequence[int], bins: int = 40
) -> matplotlib.figure.Figure:
    """Histograms of each layer's marginal at chosen grid points, one color per method.

    :param trees: ``{method: DataTree}`` in this module's layout (the last one's layers and
        grid are used for all).
    :param points: grid indices, one column of panels each.
    :param bins: histogram bins.
    :return: the matplotlib figure (one row of panels per layer; first output only).
    """
    import matplotlib.pyplot as plt

    methods = list(trees)
    names = layer_names(trees[methods[-1]])
    points = list(points)
    fig, axes = plt.subplots(
        len(names), len(points), figsize=(3.2 * len(points), 2.4 * len(names)), squeeze=False
    )
    x = np.asarray(trees[methods[-1]]["constant_data"]["grid_x"].values)[:, 0]
    for r, name in enumerate(names):
        for c, g in enumerate(points):
            ax = axes[r, c]
            for k, method in enumerate(methods):
                v = layer_draws(trees[method], name)[:, g, 0]
                ax.hist(
                    v, bins=bins, density=True, histtype="step", lw=1.2, color=f"C{k}", label=method
                )
            ax.set_title(f"{name} at x = {x[g]:.2f}", fontsize=9)
            ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig
