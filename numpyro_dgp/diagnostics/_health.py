"""MCMC health per layer: R-hat, ESS, divergences, and chains grouped into modes."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from numpyro_dgp.diagnostics._trees import layer_names

if TYPE_CHECKING:
    import pandas
    import xarray

__all__ = ["MultimodalityWarning", "Health", "mcmc_health"]


class MultimodalityWarning(UserWarning):
    """MCMC chains settled in different modes (compositions); pooled summaries mislead.

    Issued by :func:`mcmc_health`.
    """


class Health(NamedTuple):
    """MCMC health of a result in this module's layout.

    :ivar table: ``pandas.DataFrame``, one row per layer: ``layer``, ``chains``, ``draws``,
        ``max_rhat``, ``min_ess_bulk``, ``min_ess_tail``, ``divergences``, ``ok`` (all within
        the thresholds).
    :ivar chain_means: ``pandas.DataFrame`` of each chain's mean per layer, output and grid point.
    :ivar modes: chains grouped by the composition they settled in (lists of chain indices);
        one group when all chains agree.
    :ivar multimodal: whether the chains split into more than one mode.
    """

    table: pandas.DataFrame
    chain_means: pandas.DataFrame
    modes: list[list[int]]
    multimodal: bool


def _chain_modes(tree, names, tolerance):
    """Group chains whose per-chain means agree within ``tolerance`` within-chain sds, measured
    in the coordinates that whiten the pooled within-chain covariance of all layers' grid values:
    a direction of large spread shared by every chain (a shift of an inner layer that the next
    layer's stationary kernel ignores) must not hide a difference along a tight one."""
    C = tree["posterior"].sizes["chain"]
    draws = np.concatenate(
        [
            np.asarray(tree["posterior"][name].values).reshape(
                C, tree["posterior"].sizes["draw"], -1
            )
            for name in names
        ],
        axis=2,
    )  # (C, D, F)
    means = draws.mean(1)
    centered = (draws - means[:, None]).reshape(-1, draws.shape[2])
    within = centered.T @ centered / max(centered.shape[0] - C, 1)
    evals, evecs = np.linalg.eigh(within)
    # directions without spread (fewer draws than features, constant values) count at the
    # floor's scale instead of dividing by zero
    evals = np.maximum(evals, max(evals.max(), 1e-300) * 1e-8)
    whitened = means @ (evecs / np.sqrt(evals))
    modes = []
    for c in range(C):
        for group in modes:
            if np.max(np.abs(whitened[c] - whitened[group[0]])) < tolerance:
                group.append(c)
                break
        else:
            modes.append([c])
    return modes


def mcmc_health(
    tree: xarray.DataTree,
    *,
    rhat_threshold: float = 1.01,
    ess_threshold: float = 400.0,
    mode_tolerance: float = 3.0,
    warn: bool = True,
) -> Health:
    """R-hat, ESS, divergences per layer, per-chain means, and modes.

    Chains are one mode when their per-chain means (every layer at every grid point) lie
    within ``mode_tolerance`` within-chain standard deviations of the group's first chain in
    every direction -- measured after whitening by the pooled within-chain covariance, so a
    tight direction is not drowned by a wide one. With several modes (chains settled in
    different compositions), a :class:`MultimodalityWarning` names them: pooled summaries
    average modes away. Weigh the modes by their mass (:func:`mode_evidence`,
    :func:`mode_mixture`; more chains from dispersed starts find more of them) or use a
    sampler that moves between them before calling MCMC ground truth.

    :param tree: an MCMC result in this module's layout (from :func:`from_mcmc`).
    :param rhat_threshold: a layer is ``ok`` when its largest R-hat is below this (not
        checked with one chain).
    :param ess_threshold: a layer is ``ok`` only when its smallest bulk ESS is above this
        (and there are no divergences).
    :param mode_tolerance: within-chain standard deviations (whitened) within which chains
        count as one mode.
    :param warn: issue a :class:`MultimodalityWarning` when the chains split into modes.
    :return: :class:`Health`.
    """
    import arviz as az
    import pandas as pd

    names = layer_names(tree)
    posterior = tree["posterior"]
    C = posterior.sizes["chain"]
    div = None
    if "sample_stats" in tree.children and "diverging" in tree["sample_stats"]:
        div = int(np.asarray(tree["sample_stats"]["diverging"].values).sum())
    rows = []
    for name in names:
        row: dict[str, Any] = dict(layer=name, chains=C, draws=posterior.sizes["draw"])
        if C > 1:
            row["max_rhat"] = float(np.nanmax(np.asarray(az.rhat(posterior[name]).values)))
        else:
            row["max_rhat"] = float("nan")
        row["min_ess_bulk"] = float(
            np.nanmin(np.asarray(az.ess(posterior[name], method="bulk").values))
        )
        row["min_ess_tail"] = float(
            np.nanmin(np.asarray(az.ess(posterior[name], method="tail").values))
        )
        row["divergences"] = div
        row["ok"] = bool(
            (C == 1 or row["max_rhat"] < rhat_threshold)
            and row["min_ess_bulk"] > ess_threshold
            and not div
        )
        rows.append(row)
    table = pd.DataFrame(rows)
    chain_rows = []
    for name in names:
        v = np.asarray(posterior[name].values).mean(1)  # (C, G, P)
        for c in range(C):
            for g in range(v.shape[1]):
                for p in range(v.shape[2]):
                    chain_rows.append(
                        dict(layer=name, chain=c, grid=g, output=p, mean=float(v[c, g, p]))
                    )
    chain_means = pd.DataFrame(chain_rows)
    modes = _chain_modes(tree, names, mode_tolerance) if C > 1 else [[0]]
    multimodal = len(modes) > 1
    if multimodal and warn:
        warnings.warn(
            f"MCMC chains settled in {len(modes)} different modes {modes} (per-chain means of the "
            f"layers differ by more than {mode_tolerance} within-chain sds; max R-hat "
            f"{table['max_rhat'].max():.3g}). Pooled summaries average these compositions away; "
            "see Health.chain_means; weigh the modes by their mass (mode_evidence, mode_mixture) "
            "or use a sampler that moves between them.",
            MultimodalityWarning,
            stacklevel=2,
        )
    return Health(table, chain_means, modes, multimodal)
