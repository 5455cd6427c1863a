"""Per-layer distances between a variational answer and MCMC ground truth."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from jax.typing import ArrayLike

from numpyro_dgp.diagnostics._trees import layer_names

if TYPE_CHECKING:
    import pandas
    import xarray

__all__ = ["wasserstein_1d", "layer_metrics"]


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


def _gaussian_kl(m0, v0, m1, v1):
    """KL(N(m0, v0) || N(m1, v1)), elementwise."""
    return 0.5 * (np.log(v1 / v0) + (v0 + (m0 - m1) ** 2) / v1 - 1.0)


def layer_draws(tree, name):
    """``(C * D, G, P)`` draws of a layer variable."""
    v = np.asarray(tree["posterior"][name].values)
    return v.reshape((-1,) + v.shape[2:])


def _check_comparable(
    vi: xarray.DataTree, mcmc: xarray.DataTree, interval: float
) -> tuple[list[str], np.ndarray]:
    """The reference's layer names and grid, checked against the VI result's
    (:func:`layer_metrics`).

    :raises ValueError: ``interval`` outside ``(0, 1)``, a layer the VI result lacks, or another
        grid.
    """
    if not 0 < interval < 1:
        raise ValueError(f"layer_metrics: interval must be in (0, 1), got {interval!r}")
    names = layer_names(mcmc)
    missing = [n for n in names if n not in layer_names(vi)]
    if missing:
        raise ValueError(
            f"layer_metrics: the VI result lacks layers {missing} (it has {layer_names(vi)})"
        )
    x = np.asarray(mcmc["constant_data"]["grid_x"].values)
    vi_x = np.asarray(vi["constant_data"]["grid_x"].values)
    if x.shape != vi_x.shape or not np.allclose(x, vi_x):
        raise ValueError("layer_metrics: the VI and MCMC results are on different grids")
    return names, x


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

    names, x = _check_comparable(vi, mcmc, interval)
    label = label or vi.attrs.get("label", "vi")
    lo, hi = 0.5 - interval / 2, 0.5 + interval / 2
    rows = []
    for name in names:
        a, b = layer_draws(vi, name), layer_draws(mcmc, name)
        q_lo, q_hi = np.quantile(a, lo, axis=0), np.quantile(a, hi, axis=0)
        cover = ((b >= q_lo) & (b <= q_hi)).mean(0)
        ma, va, mb, vb = a.mean(0), a.var(0), b.mean(0), b.var(0)
        for g in range(a.shape[1]):
            for p in range(a.shape[2]):
                rows.append(
                    dict(
                        method=label,
                        layer=name,
                        output=p,
                        grid=g,
                        x=float(x[g, 0]),
                        mean_vi=float(ma[g, p]),
                        mean_mcmc=float(mb[g, p]),
                        var_vi=float(va[g, p]),
                        var_mcmc=float(vb[g, p]),
                        variance_ratio=float(va[g, p] / vb[g, p]),
                        wasserstein=wasserstein_1d(a[:, g, p], b[:, g, p]),
                        kl_gaussian=float(_gaussian_kl(ma[g, p], va[g, p], mb[g, p], vb[g, p])),
                        coverage=float(cover[g, p]),
                    )
                )
    return pd.DataFrame(rows)
