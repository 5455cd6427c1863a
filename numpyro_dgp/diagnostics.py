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
* :func:`mode_evidence` -- the posterior mass of each mode the chains found (bridge sampling
  between the mode's draws and a Gaussian fitted to them), and
  :func:`mode_mixture` -- the modes pooled with those weights: a ground truth across modes
  from chains that each stay in one.
* :func:`compare` -- all of it for several variational results against one MCMC result:
  a tidy table, a summary, the health report and figures.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
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
    "ModeEvidence",
    "mode_evidence",
    "mode_mixture",
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
    """Group chains whose per-chain means agree within ``tolerance`` within-chain sds, measured
    in the coordinates that whiten the pooled within-chain covariance of all layers' grid values:
    a direction of large spread shared by every chain (a shift of an inner layer that the next
    layer's stationary kernel ignores) must not hide a difference along a tight one."""
    C = tree["posterior"].sizes["chain"]
    draws = np.concatenate(
        [np.asarray(tree["posterior"][name].values).reshape(C, tree["posterior"].sizes["draw"], -1) for name in names],
        axis=2,
    )  # (C, D, F)
    means = draws.mean(1)
    centred = (draws - means[:, None]).reshape(-1, draws.shape[2])
    within = centred.T @ centred / max(centred.shape[0] - C, 1)
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


def mcmc_health(tree, *, rhat_threshold: float = 1.01, ess_threshold: float = 400.0,
                mode_tolerance: float = 3.0, warn: bool = True) -> Health:
    """R-hat, ESS, divergences per layer, per-chain means, and modes.

    Chains are one mode when their per-chain means (every layer at every grid point) lie
    within ``mode_tolerance`` within-chain standard deviations of the group's first chain in
    every direction -- measured after whitening by the pooled within-chain covariance, so a
    tight direction is not drowned by a wide one. With several modes (chains settled in
    different compositions), a :class:`MultimodalityWarning` names them: pooled summaries
    average modes away. Weigh the modes by their mass (:func:`mode_evidence`,
    :func:`mode_mixture`; more chains from dispersed starts find more of them) or use a
    sampler that moves between them before calling MCMC ground truth.
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
            "see Health.chain_means; weigh the modes by their mass (mode_evidence, mode_mixture) or "
            "use a sampler that moves between them.",
            MultimodalityWarning,
            stacklevel=2,
        )
    return Health(table, chain_means, modes, multimodal)


class ModeEvidence(NamedTuple):
    """Result of :func:`mode_evidence`.

    :ivar modes: chain indices of each mode (as given).
    :ivar log_evidence: ``(K,)`` log of each mode's unnormalised posterior mass
        ``log int_mode p(theta, y) dtheta`` (bridge-sampling estimate).
    :ivar log_evidence_se: ``(K,)`` its Monte Carlo standard error (delta method, treating
        the draws as independent: an underestimate for autocorrelated chains).
    :ivar weights: ``(K,)`` posterior probability of each mode (normalised masses).
    :ivar khat: ``(K,)`` Pareto k-hat of the importance ratios ``p/q`` at the proposal
        draws; above 0.7 plain importance sampling would be unreliable (the Gaussian misses
        part of the mode) and the bridge estimate leans on the mode's own draws.
    """

    modes: list
    log_evidence: np.ndarray
    log_evidence_se: np.ndarray
    weights: np.ndarray
    khat: np.ndarray


def _latent_sites(model, args, kwargs, samples):
    tr = trace(seed(model, 0)).get_trace(*args, **kwargs)
    names = [n for n, site in tr.items() if site["type"] == "sample" and not site["is_observed"]]
    missing = [n for n in names if n not in samples]
    if missing:
        raise ValueError(f"mode_evidence: samples lack the model's latent sites {missing}")
    return names


def _bridge_log_evidence(log_ratio_posterior, log_ratio_proposal, num_iterations: int = 200):
    """log Z by the iterated optimal bridge of Meng & Wong (1996) from ``log p/q`` at posterior
    draws and at proposal draws; the standard error by the delta method on the final bridge."""
    from scipy.special import logsumexp as lse

    n1, n2 = log_ratio_posterior.size, log_ratio_proposal.size
    s1, s2 = n1 / (n1 + n2), n2 / (n1 + n2)
    log_r = lse(log_ratio_proposal) - np.log(n2)  # start from the importance-sampling estimate
    for _ in range(num_iterations):
        # numerator: mean over q draws of p/q / (s1 p/q + s2 r); denominator: mean over posterior
        # draws of 1 / (s1 p/q + s2 r)
        num = log_ratio_proposal - np.logaddexp(np.log(s1) + log_ratio_proposal, np.log(s2) + log_r)
        den = -np.logaddexp(np.log(s1) + log_ratio_posterior, np.log(s2) + log_r)
        new = (lse(num) - np.log(n2)) - (lse(den) - np.log(n1))
        if abs(new - log_r) < 1e-10:
            log_r = new
            break
        log_r = new
    num = np.exp(log_ratio_proposal - np.logaddexp(np.log(s1) + log_ratio_proposal, np.log(s2) + log_r))
    den = np.exp(-np.logaddexp(np.log(s1) + log_ratio_posterior, np.log(s2) + log_r) + log_r)
    rel_var = num.var() / (n2 * num.mean() ** 2) + den.var() / (n1 * den.mean() ** 2)
    return float(log_r), float(np.sqrt(rel_var))


def mode_evidence(model, samples: dict, modes: list, rng_key, *args, num_draws: int = 4000,
                  inflate: float = 1.0, **kwargs) -> ModeEvidence:
    """How much posterior mass each mode holds, from chains that each stay in one mode.

    Chains from dispersed starts that settle in different modes say nothing about the
    modes' relative mass (a chain count is not a probability). For each mode this fits a
    Gaussian ``q`` to the mode's draws in the unconstrained space (covariance times
    ``inflate``) and estimates the mode's mass ``Z_k = int p(theta, y) dtheta`` by bridge
    sampling between ``q`` (``num_draws`` draws of ``rng_key``) and the mode's draws
    (Meng & Wong 1996; Gronau et al. 2017), which stays accurate where importance sampling
    from ``q`` alone would not (``khat`` says how far that would be off). Valid when the modes
    are separated (``q`` fitted to one mode puts next to no mass on another) and each mode's
    chains cover it; the weights ``Z_k / sum Z`` then give :func:`mode_mixture`. A mode split
    over several groups of chains would be counted twice: merge them first
    (``mcmc_health(..., mode_tolerance=...)``). Estimating a several-chain mode from each of
    its chains alone shows how far to trust ``log_evidence``: the standard error treats the
    draws as independent and ignores the fit of ``q``.

    :param model: the model MCMC ran on (with its handlers, e.g. ``exact_layers(model, ...)``).
    :param samples: ``mcmc.get_samples(group_by_chain=True)``.
    :param modes: lists of chain indices (``mcmc_health(...).modes``).
    :param args, kwargs: the model's arguments, as given to ``mcmc.run``.
    """
    from arviz_stats.base import array_stats
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.util import potential_energy, unconstrain_fn

    if not modes or any(len(m) == 0 for m in modes):
        raise ValueError(f"mode_evidence: modes must be non-empty lists of chain indices, got {modes!r}")
    if num_draws < 100:
        raise ValueError(f"mode_evidence: num_draws must be at least 100, got {num_draws}")
    if not inflate > 0:
        raise ValueError(f"mode_evidence: inflate must be positive, got {inflate!r}")
    names = _latent_sites(model, args, kwargs, samples)
    C = np.asarray(samples[names[0]]).shape[0]
    bad = [m for m in modes for c in m if not 0 <= c < C]
    if bad:
        raise ValueError(f"mode_evidence: modes name chains outside 0..{C - 1}: {bad}")
    latent = {n: jnp.asarray(samples[n]) for n in names}
    # every latent site is given, so the log density does not depend on the key; the seed
    # only satisfies layers that ask for one
    model = seed(model, rng_seed=0)
    flat_fn = jax.vmap(lambda site: unconstrain_fn(model, args, kwargs, site))
    unconstrained = jax.vmap(flat_fn)(latent)  # (C, D, ...)
    _, unravel = ravel_pytree(jax.tree.map(lambda v: v[0, 0], unconstrained))
    flat = jax.vmap(jax.vmap(lambda t: ravel_pytree(t)[0]))(unconstrained)  # (C, D, dim)
    log_joint = jax.jit(jax.vmap(lambda z: -potential_energy(model, args, kwargs, unravel(z))))
    log_z, log_z_se, khat = [], [], []
    for k, chains in enumerate(modes):
        draws = np.asarray(flat[np.asarray(chains)]).reshape(-1, flat.shape[-1])
        mean = draws.mean(0)
        n, d = draws.shape
        if n < 2:
            raise ValueError(f"mode_evidence: mode {chains} has {n} draw(s); at least 2 are needed")
        cov = np.cov(draws, rowvar=False).reshape(d, d)
        # shrink towards the diagonal by d / (n + d): keeps q proper with fewer draws than
        # dimensions; the bridge estimate is consistent for any q, so this costs only variance
        shrink = d / (n + d)
        cov = (1 - shrink) * cov + shrink * np.diag(np.diag(cov))
        cov = cov + 1e-12 * np.trace(cov) / d * np.eye(d)
        proposal = dist.MultivariateNormal(jnp.asarray(mean), scale_tril=jnp.linalg.cholesky(jnp.asarray(cov) * inflate))
        theta = proposal.sample(jax.random.fold_in(rng_key, k), (num_draws,))
        log_ratio = np.asarray(log_joint(theta) - proposal.log_prob(theta), dtype=float)
        if not np.all(np.isfinite(log_ratio)):
            raise FloatingPointError(
                f"mode_evidence: {int(np.sum(~np.isfinite(log_ratio)))} of {num_draws} proposal draws of mode "
                f"{chains} have a non-finite log density"
            )
        # bridge sampling (Meng & Wong 1996, optimal bridge, iterated): uses the mode's own draws
        # too, so it stays accurate where plain importance sampling from q has heavy-tailed ratios
        own = np.asarray(log_joint(jnp.asarray(draws)) - proposal.log_prob(jnp.asarray(draws)), dtype=float)
        estimate, se = _bridge_log_evidence(own, log_ratio)
        log_z.append(estimate)
        log_z_se.append(se)
        with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
            # the Pareto fit overflows (k-hat nan) when the ratios span hundreds of nats
            warnings.simplefilter("ignore", RuntimeWarning)
            khat.append(float(array_stats.psislw(log_ratio)[1]))
    log_z = np.asarray(log_z)
    weights = np.exp(log_z - log_z.max())
    return ModeEvidence([list(m) for m in modes], log_z, np.asarray(log_z_se), weights / weights.sum(), np.asarray(khat))


def mode_mixture(tree, evidence: ModeEvidence, rng_key, *, num_draws: int | None = None, label: str | None = None):
    """The MCMC result with its modes pooled by their posterior mass (one chain of draws).

    Draws ``num_draws`` (default: all draws of the run) from the mixture of the modes'
    draws with :attr:`ModeEvidence.weights` -- the ground truth across modes when each chain
    stays in one.
    """
    names = layer_names(tree)
    post = tree["posterior"]
    values = {n: np.asarray(post[n].values) for n in names}
    C, D = values[names[0]].shape[:2]
    total = num_draws or C * D
    rng = np.random.default_rng(int(jax.random.randint(rng_key, (), 0, 2**31 - 1)))
    counts = rng.multinomial(total, np.asarray(evidence.weights, float))
    picks = []
    for chains, count in zip(evidence.modes, counts):
        pool = [(c, d) for c in chains for d in range(D)]
        idx = rng.choice(len(pool), size=int(count), replace=True)
        picks += [pool[i] for i in idx]
    layers = {n: np.stack([values[n][c, d] for c, d in picks]) for n in names}
    return from_layer_samples(layers, np.asarray(tree["constant_data"]["grid_x"].values),
                              label=label or f"{tree.attrs.get('label', 'MCMC')} (modes by mass)")


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
