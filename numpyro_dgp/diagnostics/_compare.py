"""Variational answers against one MCMC answer: per-layer distances, a table, a summary,
figures."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np
from jax.typing import ArrayLike

from numpyro_dgp.diagnostics._modes import Health, mcmc_health
from numpyro_dgp.diagnostics._trees import grid_inputs, layer_names, layer_values
from numpyro_dgp.plots import draw_layers, output_label

if TYPE_CHECKING:
    import matplotlib.figure
    import pandas
    import xarray


def wasserstein_1d(a: ArrayLike, b: ArrayLike) -> float:
    """Wasserstein-1 distance between the empirical distributions of samples ``a`` and ``b``
    (exact: the integral of ``|F_a - F_b|`` over the merged sample points).

    :param a: samples of the first distribution, any shape (flattened).
    :param b: samples of the second distribution, any shape (flattened).
    :return: ``W1(a, b)``.
    """
    a = np.sort(np.asarray(a, float).ravel())
    b = np.sort(np.asarray(b, float).ravel())
    both = np.sort(np.concatenate([a, b]))
    widths = np.diff(both)
    Fa = np.searchsorted(a, both[:-1], side="right") / a.size
    Fb = np.searchsorted(b, both[:-1], side="right") / b.size
    return float(np.sum(np.abs(Fa - Fb) * widths))


def layer_metrics(
    vi: xarray.DataTree, mcmc: xarray.DataTree, *, interval: float = 0.9, label: str | None = None
) -> pandas.DataFrame:
    """Per layer, output and grid point: how the VI marginal compares with MCMC's.

    :param vi: a ``DataTree`` from :func:`from_guide` (or any tree in this layout).
    :param mcmc: the reference, from :func:`from_mcmc`.
    :param interval: probability of the VI central interval used for ``coverage``.
    :param label: the ``method`` column (default: the VI tree's ``label`` attribute, else
        ``"vi"``).
    :return: a ``pandas.DataFrame`` with columns ``method, layer, output, grid, x, mean_vi,
        mean_mcmc, var_vi, var_mcmc, variance_ratio`` (VI / MCMC), ``wasserstein``
        (W1 between the sample marginals), ``kl_gaussian`` (KL(VI || MCMC) of moment-matched
        Gaussians) and ``coverage`` (fraction of MCMC draws inside the VI interval;
        ``interval`` when they agree).
    """
    import pandas as pd

    if not 0 < interval < 1:
        raise ValueError(f"layer_metrics: interval must be in (0, 1), got {interval!r}")
    names = layer_names(mcmc)
    missing = [n for n in names if n not in layer_names(vi)]
    if missing:
        raise ValueError(
            f"layer_metrics: the VI result lacks layers {missing} (it has {layer_names(vi)})"
        )
    x, vi_x = grid_inputs(mcmc), grid_inputs(vi)
    if x.shape != vi_x.shape or not np.allclose(x, vi_x):
        raise ValueError("layer_metrics: the VI and MCMC results are on different grids")
    label = label or vi.attrs.get("label", "vi")
    lo, hi = 0.5 - interval / 2, 0.5 + interval / 2
    frames = []
    for name in names:
        a, b = layer_values(vi, name, flat=True), layer_values(mcmc, name, flat=True)
        q_lo, q_hi = np.quantile(a, lo, axis=0), np.quantile(a, hi, axis=0)
        ma, va, mb, vb = a.mean(0), a.var(0), b.mean(0), b.var(0)
        kl = 0.5 * (np.log(vb / va) + (va + (ma - mb) ** 2) / vb - 1.0)  # KL(N_vi || N_mcmc)
        grid, output = np.indices(ma.shape).reshape(2, -1)  # rows: grid points, then outputs
        columns = dict(
            method=label,
            layer=name,
            output=output,
            grid=grid,
            x=x[grid, 0].astype(float),
            mean_vi=ma.ravel(),
            mean_mcmc=mb.ravel(),
            var_vi=va.ravel(),
            var_mcmc=vb.ravel(),
            variance_ratio=(va / vb).ravel(),
            wasserstein=[wasserstein_1d(a[:, g, p], b[:, g, p]) for g, p in zip(grid, output)],
            kl_gaussian=kl.ravel(),
            coverage=((b >= q_lo) & (b <= q_hi)).mean(0).ravel(),
        )
        frames.append(pd.DataFrame(columns))
    return pd.concat(frames, ignore_index=True)


class Comparison(NamedTuple):
    """Result of :func:`compare`.

    :ivar table: ``pandas.DataFrame`` of tidy per-point metrics of every method
        (:func:`layer_metrics`).
    :ivar summary: ``pandas.DataFrame``, per method and layer over the chosen points: median
        variance ratio, mean W1, mean Gaussian KL, mean coverage.
    :ivar health: :class:`Health` of the MCMC reference (:func:`mcmc_health`'s default
        thresholds).
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
    x: int | ArrayLike | None = None,
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
    :param x: the horizontal axis of the layer figure (see :func:`plot_layers`): an input
        coordinate index, or one value per grid point; default: the grid's one coordinate, or
        the first principal component of grid inputs of more than one dimension.
    :return: :class:`Comparison`.
    :raises ValueError: for an empty ``vi``, ``points`` outside the grid, or (when ``plot``)
        a bad ``x``, before anything is computed.
    """
    import pandas as pd

    if not vi:
        raise ValueError("compare: vi must name at least one variational result")
    G = mcmc["posterior"].sizes["grid"]
    points = list(range(G)) if points is None else [int(p) for p in points]
    if any(p < 0 or p >= G for p in points):
        raise ValueError(f"compare: points must be grid indices in [0, {G}), got {points}")
    if plot:
        _horizontal(grid_inputs(mcmc), x)
    health = mcmc_health(mcmc)
    table = pd.concat(
        [layer_metrics(tree, mcmc, interval=interval, label=name) for name, tree in vi.items()],
        ignore_index=True,
    )
    chosen = table[table["grid"].isin(points)]
    how = dict.fromkeys(["variance_ratio", "wasserstein", "kl_gaussian", "coverage"], "mean")
    how["variance_ratio"] = "median"
    summary = chosen.groupby(["method", "layer"], sort=False).agg(how).reset_index()
    figures = {}
    if plot:
        figures["layers"] = plot_layers({**vi, "MCMC": mcmc}, x=x)
        figures["marginals"] = plot_marginals(
            {**vi, "MCMC": mcmc}, points=points[:: max(1, len(points) // 3)][:3]
        )
    return Comparison(table, summary, health, figures)


def _check_x(x: int | ArrayLike, G: int, D: int) -> np.ndarray | int:
    """``x`` of :func:`plot_layers` checked against a grid of ``G`` points in ``D`` dimensions:
    an input coordinate index in ``[0, D)``, or ``G`` finite values.

    :raises ValueError: for a scalar that is not an integer in ``[0, D)`` (a bool included), or
        values of another shape, not numbers, or not finite.
    """
    values = np.asarray(x)
    if values.ndim == 0:  # an index: an integer (NumPy and JAX ones too), not a bool
        if values.dtype.kind not in "iu" or not 0 <= int(values) < D:
            raise ValueError(
                f"plot_layers: x as an index must be an integer input coordinate in [0, {D}), "
                f"got {x!r}"
            )
        return int(values)
    if values.shape != (G,) or values.dtype.kind not in "iuf":
        raise ValueError(
            f"plot_layers: x as a projection must hold one number per grid point, shape ({G},), "
            f"got shape {values.shape} of {values.dtype}"
        )
    bad = int(np.sum(~np.isfinite(values)))
    if bad:
        raise ValueError(
            f"plot_layers: x as a projection must be finite, got {bad} non-finite values"
        )
    return values.astype(float)


def _horizontal(grid: np.ndarray, x: int | ArrayLike | None) -> tuple[np.ndarray, str, bool]:
    """The horizontal values of the first layer and composition panels of :func:`plot_layers`,
    their axis label, and whether they determine the grid point (then lines join the points).

    :param grid: ``(G, D)`` grid inputs.
    :param x: see :func:`plot_layers`.
    :return: ``(values (G,), label, joined)``.
    """
    G, D = grid.shape
    chosen = None if x is None else _check_x(x, G, D)
    if isinstance(chosen, np.ndarray):
        return chosen, "x projected (values given)", False
    if chosen is not None or D == 1:
        k = chosen or 0
        return grid[:, k], ("x" if D == 1 else f"x[{k}] (coordinate {k} of {D})"), D == 1
    centred = grid - grid.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    pc = vt[0] if vt[0][np.argmax(np.abs(vt[0]))] >= 0 else -vt[0]
    share = s[0] ** 2 / max(float(np.sum(s**2)), np.finfo(float).tiny)
    return centred @ pc, f"x: 1st principal component\n({share:.0%} of variance, D = {D})", False


def plot_layers(
    trees: dict[str, xarray.DataTree], *, x: int | ArrayLike | None = None
) -> matplotlib.figure.Figure:
    """Per method (rows): each layer's samples against its own input, and the composition (25
    samples per method, or all its draws if fewer).

    Columns: the first layer against the grid inputs, every later layer against the previous
    layer's values, the last layer against the grid inputs again. Every panel shows a layer's
    first output only. Points are sorted by their horizontal value; they are joined by lines
    only where that value determines the point (one-dimensional grid inputs shown as they
    are, or a previous layer with one output), and drawn as small translucent markers
    otherwise. A previous layer with several outputs is shown by its output 0 (the label says
    so): a cut through its values, not the layer's whole input.

    :param trees: ``{method: DataTree}`` in this module's layout (the first one's layers
        and grid are used for all).
    :param x: the horizontal axis of the first and last columns: an input coordinate index
        in ``[0, D)``, or one value per grid point (a projection such as ``X_grid @ w``,
        drawn with markers). Default: the grid's one coordinate for ``D = 1``; for ``D > 1``
        the first principal component of the grid inputs (centred), as the axis label says.
    :return: the matplotlib figure.
    :raises ValueError: for an ``x`` that is neither an index in ``[0, D)`` nor ``G`` finite
        values (before anything is drawn).
    """
    import matplotlib.pyplot as plt

    methods = list(trees)
    names = layer_names(trees[methods[0]])
    horizontal = _horizontal(grid_inputs(trees[methods[0]]), x)
    ncols = len(names) + 1
    fig, axes = plt.subplots(
        len(methods), ncols, figsize=(3.1 * ncols, 2.4 * len(methods)), squeeze=False
    )
    rng = np.random.default_rng(0)
    for r, method in enumerate(methods):
        draws = {n: layer_values(trees[method], n, flat=True) for n in names}
        S = draws[names[0]].shape[0]
        idx = rng.choice(S, size=min(25, S), replace=False)
        draw_layers(axes[r], {n: v[idx] for n, v in draws.items()}, horizontal, f"C{r}")
        axes[r, 0].set_ylabel(f"{method}\n{axes[r, 0].get_ylabel()}")
    for ax in axes.flat:
        ax.title.set_fontsize(9)
        plt.setp([ax.xaxis.label, ax.yaxis.label], fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def _point(grid: np.ndarray, g: int) -> str:
    """Grid point ``g`` for a title: ``x = 0.12``, ``x = (0.12, -0.30)``, or by index for
    inputs of more than three dimensions."""
    if grid.shape[1] == 1:
        return f"x = {grid[g, 0]:.2f}"
    if grid.shape[1] <= 3:
        return "x = (" + ", ".join(f"{v:.2f}" for v in grid[g]) + ")"
    return f"grid point {g}"


def plot_marginals(
    trees: dict[str, xarray.DataTree], points: Sequence[int], bins: int = 40
) -> matplotlib.figure.Figure:
    """Histograms of each layer's marginal at chosen grid points, one color per method.

    Each panel's title names the grid point by its inputs (all of them up to three
    dimensions, else its index); only each layer's first output is shown.

    :param trees: ``{method: DataTree}`` in this module's layout (the last one's layers and
        grid are used for all).
    :param points: grid indices, one column of panels each.
    :param bins: histogram bins.
    :return: the matplotlib figure (one row of panels per layer; first output only).
    """
    import matplotlib.pyplot as plt

    last = list(trees.values())[-1]  # its layers and grid are used for all
    names, grid = layer_names(last), grid_inputs(last)
    points = list(points)
    fig, axes = plt.subplots(
        len(names), len(points), figsize=(3.2 * len(points), 2.4 * len(names)), squeeze=False
    )
    for r, name in enumerate(names):
        for c, g in enumerate(points):
            ax = axes[r, c]
            for k, (method, tree) in enumerate(trees.items()):
                draws = layer_values(tree, name, flat=True)
                style = dict(density=True, histtype="step", lw=1.2, color=f"C{k}", label=method)
                ax.hist(draws[:, g, 0], bins=bins, **style)
            ax.set_title(f"{output_label(name, draws.shape[-1])} at {_point(grid, g)}", fontsize=9)
            ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig
