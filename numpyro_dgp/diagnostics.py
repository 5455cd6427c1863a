"""How far is a variational answer from MCMC ground truth, layer by layer (ArviZ-backed).

Every inference result becomes an ArviZ ``DataTree`` with one layout: group ``posterior``
holds each layer's function values on a grid, ``<layer>`` with dims ``(chain, draw, grid,
<layer>_output)`` (layer ``l``'s grid inputs are layer ``l-1``'s values there), plus any
sampled hyperparameters; ``constant_data/grid_x`` holds the first layer's grid inputs;
``sample_stats/diverging`` the MCMC divergences where there are some.

* :func:`from_guide` -- a fitted guide: inducing values drawn from ``q``, each layer drawn
  jointly over the grid (coherent function samples).
* :func:`from_mcmc` -- a ``numpyro.infer.MCMC`` run: the ``"<layer>.grid"`` sites of
  :class:`numpyro_dgp.handlers.exact_layers`, or (sparse models: NUTS with
  :class:`~numpyro_dgp.handlers.latent_conditionals`, :class:`~numpyro_dgp.infer.SGHMC`) the
  layers re-run on the grid with each sampled ``u``.
* :func:`layer_metrics` -- per layer, output and grid point: variances, VI/MCMC variance
  ratio, Wasserstein-1 between the marginals, the KL between moment-matched Gaussians, and
  how much of the MCMC mass the VI central interval covers.
* :func:`mcmc_health` -- R-hat, bulk/tail ESS and divergences per layer, per-chain means, and
  the chains grouped into modes; warns (:class:`MultimodalityWarning`) when chains settled in
  different compositions instead of averaging them away.
* :func:`compare` -- all of it for several variational results against one MCMC result:
  a tidy table, a summary, the health report and figures.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.handlers import seed, substitute, trace

from numpyro_dgp.handlers import coherent_layers
from numpyro_dgp.predict import sample_layers

__all__ = [
    "MultimodalityWarning",
    "Comparison",
    "Health",
    "layer_samples",
    "from_layer_samples",
    "from_guide",
    "from_mcmc",
    "layer_names",
    "wasserstein_1d",
    "layer_metrics",
    "mcmc_health",
    "compare",
    "plot_layers",
    "plot_marginals",
]


class MultimodalityWarning(UserWarning):
    """MCMC chains settled in different modes (compositions); pooled summaries mislead."""


def layer_samples(model, samples, rng_key, grid, *args, params=None, coherent: bool = True, **kwargs) -> dict:
    """Every layer's values on ``grid`` for each posterior sample of a sparse DGP.

    :param model: the model (the plain one, without MCMC handlers).
    :param samples: ``{site: (S, ...)}`` posterior samples; the model's latent sites among
        them (inducing values, sampled hyperparameters) are substituted, others (the data-point
        latents of :class:`~numpyro_dgp.handlers.latent_conditionals`) are ignored.
    :param rng_key: PRNG key (layer outputs given ``u`` are random).
    :param grid: ``(G, D)`` inputs of the first layer.
    :param params: ``numpyro.param`` values (fitted ones, or the model's own if ``None``).
    :param coherent: draw each layer jointly over the grid (smooth samples).
    :return: ``{layer: (S, G, P)}``.
    """
    grid = jnp.asarray(grid)
    params = dict(params or {})
    probe = trace(seed(substitute(model, data=params), rng_key)).get_trace(grid, *args, **kwargs)
    latent = {n for n, s in probe.items() if s["type"] == "sample" and not s["is_observed"]}
    names = [s["args"][0].name for s in probe.values() if s["type"] == "dgp_layer"]
    chosen = {k: jnp.asarray(v) for k, v in samples.items() if k in latent}
    missing = sorted(n for n in latent if n not in chosen and (probe[n].get("infer") or {}).get("dgp_layer"))
    if missing:
        raise ValueError(f"layer_samples: samples lack the inducing-value sites {missing}")
    if not chosen:
        raise ValueError(f"layer_samples: none of the samples' sites {sorted(samples)} is a latent site of the model")
    S = next(iter(chosen.values())).shape[0]

    def one(key, sample):
        m = substitute(seed(model, key), data={**params, **sample})
        if coherent:
            m = coherent_layers(m)
        tr = trace(m).get_trace(grid, *args, **kwargs)
        return {n: tr[n]["value"] for n in names}

    keys = jax.random.split(rng_key, S)
    return jax.jit(jax.vmap(one))(keys, chosen)


def layer_names(tree) -> list:
    """The layer variables of a tree made by this module, in order."""
    return list(tree.attrs.get("layers") or [])


def from_layer_samples(layers: dict, grid, *, num_chains: int = 1, extra: dict | None = None,
                       sample_stats: dict | None = None, label: str | None = None):
    """A ``DataTree`` in this module's layout.

    :param layers: ``{layer: (C, D, G, P)}`` or ``{layer: (S, G, P)}`` (reshaped into
        ``num_chains`` chains).
    :param grid: ``(G, D_in)`` first-layer inputs.
    :param extra: more posterior variables (e.g. hyperparameters), same leading dims.
    :param sample_stats: e.g. ``{"diverging": (C, D)}``.
    :param label: a name for the method (stored in ``attrs``).
    """
    import arviz as az

    def shaped(v):
        v = np.asarray(v)
        if v.ndim >= 1 and num_chains > 1 and v.shape[0] % num_chains == 0:
            v = v.reshape((num_chains, v.shape[0] // num_chains) + v.shape[1:])
        elif num_chains == 1:
            v = v[None]
        return v

    posterior, dims = {}, {}
    names = list(layers)
    for name in names:
        value = np.asarray(layers[name])
        value = value if value.ndim == 4 else shaped(value)
        posterior[name] = value
        dims[name] = ["grid", f"{name}_output"]
    for name, value in (extra or {}).items():
        value = np.asarray(value)
        posterior[name] = value if value.shape[:2] == next(iter(posterior.values())).shape[:2] else shaped(value)
    data = {"posterior": posterior, "constant_data": {"grid_x": np.asarray(grid)}}
    if sample_stats:
        data["sample_stats"] = {k: np.asarray(v) for k, v in sample_stats.items()}
    tree = az.from_dict(data, dims={**dims, "grid_x": ["grid", "grid_x_dim"]},
                        coords={"grid": np.arange(np.asarray(grid).shape[0])})
    tree.attrs["layers"] = names
    if label is not None:
        tree.attrs["label"] = label
    return tree


def from_guide(model, guide, params, rng_key, grid, *args, num_samples: int = 1000, label=None, **kwargs):
    """A fitted guide's per-layer function samples on ``grid`` as a ``DataTree`` (one chain).

    Inducing values are drawn from the guide (jointly across layers, as the guide has them),
    then every layer is drawn jointly over the grid given its sampled input.
    """
    layers = sample_layers(model, guide, params, rng_key, grid, *args, num_samples=num_samples, **kwargs)
    return from_layer_samples(layers, grid, label=label)


def from_mcmc(mcmc, grid, *, model=None, params=None, rng_key=None, args=(), kwargs=None, label=None):
    """An MCMC run's per-layer function values on ``grid`` as a ``DataTree``, chains kept.

    If the run has ``"<layer>.grid"`` sites (NUTS on :class:`~numpyro_dgp.handlers.exact_layers`
    with this ``grid``) they are used as they are. Otherwise (sparse model: inducing values
    sampled) the layers are re-run on ``grid`` for each sample with :func:`layer_samples`;
    pass the plain ``model``, its ``params`` and an ``rng_key``.
    """
    samples = mcmc.get_samples(group_by_chain=True)
    first = next(iter(samples.values()))
    C, D = first.shape[:2]
    grid_sites = [k for k in samples if k.endswith(".grid")]
    if grid_sites:
        layers = {k[: -len(".grid")]: np.asarray(samples[k]) for k in grid_sites}
        grid_rows = next(iter(layers.values())).shape[2]
        if grid_rows != np.asarray(grid).shape[0]:
            raise ValueError(f"from_mcmc: the run's grid has {grid_rows} points, grid has {np.asarray(grid).shape[0]}")
    else:
        if model is None or rng_key is None:
            raise ValueError(
                "from_mcmc: the run has no '<layer>.grid' sites (exact_layers with a grid); pass "
                "model= and rng_key= to re-run the layers on the grid with the sampled inducing values"
            )
        flat = {k: np.asarray(v).reshape((C * D,) + v.shape[2:]) for k, v in samples.items()}
        layers = layer_samples(model, flat, rng_key, grid, *args, params=params, **(kwargs or {}))
        layers = {k: np.asarray(v).reshape((C, D) + v.shape[1:]) for k, v in layers.items()}
    hyper = {k: np.asarray(v) for k, v in samples.items() if ".kernel." in k}
    stats = {}
    try:
        extra = mcmc.get_extra_fields(group_by_chain=True)
        if "diverging" in extra:
            stats["diverging"] = np.asarray(extra["diverging"])
    except Exception:  # kernels without extra fields
        pass
    return from_layer_samples(layers, grid, extra=hyper, sample_stats=stats or None, label=label)


def wasserstein_1d(a, b) -> float:
    """Wasserstein-1 distance between the empirical distributions of samples ``a`` and ``b``
    (exact: the integral of ``|F_a - F_b|`` over the merged sample points)."""
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


def _draws(tree, name):
    """``(C * D, G, P)`` draws of a layer variable."""
    v = np.asarray(tree["posterior"][name].values)
    return v.reshape((-1,) + v.shape[2:])


def layer_metrics(vi, mcmc, *, interval: float = 0.9, label: str | None = None):
    """Per layer, output and grid point: how the VI marginal compares with MCMC's.

    :param vi: a ``DataTree`` from :func:`from_guide` (or any tree in this layout).
    :param mcmc: the reference, from :func:`from_mcmc`.
    :param interval: probability of the VI central interval used for ``coverage``.
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
        raise ValueError(f"layer_metrics: the VI result lacks layers {missing} (it has {layer_names(vi)})")
    x = np.asarray(mcmc["constant_data"]["grid_x"].values)
    vi_x = np.asarray(vi["constant_data"]["grid_x"].values)
    if x.shape != vi_x.shape or not np.allclose(x, vi_x):
        raise ValueError("layer_metrics: the VI and MCMC results are on different grids")
    label = label or vi.attrs.get("label", "vi")
    lo, hi = 0.5 - interval / 2, 0.5 + interval / 2
    rows = []
    for name in names:
        a, b = _draws(vi, name), _draws(mcmc, name)
        q_lo, q_hi = np.quantile(a, lo, axis=0), np.quantile(a, hi, axis=0)
        cover = ((b >= q_lo) & (b <= q_hi)).mean(0)
        ma, va, mb, vb = a.mean(0), a.var(0), b.mean(0), b.var(0)
        for g in range(a.shape[1]):
            for p in range(a.shape[2]):
                rows.append(dict(
                    method=label, layer=name, output=p, grid=g, x=float(x[g, 0]),
                    mean_vi=float(ma[g, p]), mean_mcmc=float(mb[g, p]),
                    var_vi=float(va[g, p]), var_mcmc=float(vb[g, p]),
                    variance_ratio=float(va[g, p] / vb[g, p]),
                    wasserstein=wasserstein_1d(a[:, g, p], b[:, g, p]),
                    kl_gaussian=float(_gaussian_kl(ma[g, p], va[g, p], mb[g, p], vb[g, p])),
                    coverage=float(cover[g, p]),
                ))
    return pd.DataFrame(rows)


class Health(NamedTuple):
    """MCMC health of a result in this module's layout.

    :ivar table: per layer: ``max_rhat``, ``min_ess_bulk``, ``min_ess_tail``, ``divergences``,
        ``ok`` (all within the thresholds).
    :ivar chain_means: ``pandas.DataFrame`` of each chain's mean per layer, output and grid point.
    :ivar modes: chains grouped by the composition they settled in (lists of chain indices);
        one group when all chains agree.
    :ivar multimodal: whether the chains split into more than one mode.
    """

    table: object
    chain_means: object
    modes: list
    multimodal: bool


def _chain_modes(tree, names, tolerance):
    """Group chains whose per-chain means agree within ``tolerance`` pooled within-chain sds."""
    C = tree["posterior"].sizes["chain"]
    feats, scales = [], []
    for name in names:
        v = np.asarray(tree["posterior"][name].values)  # (C, D, G, P)
        feats.append(v.mean(1).reshape(C, -1))
        scales.append(np.sqrt(v.var(1).mean(0)).reshape(-1))
    means = np.concatenate(feats, axis=1)
    sd = np.maximum(np.concatenate(scales), 1e-12)
    modes = []
    for c in range(C):
        for group in modes:
            if np.max(np.abs(means[c] - means[group[0]]) / sd) < tolerance:
                group.append(c)
                break
        else:
            modes.append([c])
    return modes


def mcmc_health(tree, *, rhat_threshold: float = 1.01, ess_threshold: float = 400.0,
                mode_tolerance: float = 3.0, warn: bool = True) -> Health:
    """R-hat, ESS, divergences per layer, per-chain means, and modes.

    Chains are one mode when every per-chain mean of every layer at every grid point lies
    within ``mode_tolerance`` within-chain standard deviations of the first chain of the
    group. With several modes (chains settled in different compositions), a
    :class:`MultimodalityWarning` names them: pooled summaries average modes away, so use a
    setup that mixes across them (more chains with dispersed starts, tempering, or a known
    symmetry) before calling MCMC ground truth.
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
        row = dict(layer=name, chains=C, draws=posterior.sizes["draw"])
        if C > 1:
            row["max_rhat"] = float(np.nanmax(np.asarray(az.rhat(posterior[name]).values)))
        else:
            row["max_rhat"] = float("nan")
        row["min_ess_bulk"] = float(np.nanmin(np.asarray(az.ess(posterior[name], method="bulk").values)))
        row["min_ess_tail"] = float(np.nanmin(np.asarray(az.ess(posterior[name], method="tail").values)))
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
                    chain_rows.append(dict(layer=name, chain=c, grid=g, output=p, mean=float(v[c, g, p])))
    chain_means = pd.DataFrame(chain_rows)
    modes = _chain_modes(tree, names, mode_tolerance) if C > 1 else [[0]]
    multimodal = len(modes) > 1
    if multimodal and warn:
        warnings.warn(
            f"MCMC chains settled in {len(modes)} different modes {modes} (per-chain means of the "
            f"layers differ by more than {mode_tolerance} within-chain sds; max R-hat "
            f"{table['max_rhat'].max():.3g}). Pooled summaries average these compositions away; "
            "see Health.chain_means and use a setup that mixes across modes.",
            MultimodalityWarning,
            stacklevel=2,
        )
    return Health(table, chain_means, modes, multimodal)


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
    """Histograms of each layer's marginal at chosen grid points, one colour per method."""
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
