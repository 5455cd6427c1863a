"""MCMC health per layer (R-hat, ESS, divergences), the chains grouped into modes, the
posterior mass of each mode (bridge sampling), the modes pooled, and converged MCMC ground truth
in one call (:func:`ground_truth`): explore, weigh, check within each mode.

A DGP's posterior has modes (compositions that fit the data equally well up to a few nats, or
not at all) that chains seldom leave, so "the chains converged" cannot mean one R-hat over all
chains. This library's definition, the protocol of ``benchmarks/results/mcmc_ground_truth.md``:

1. **explore** -- chains from dispersed starts (the kernel's own: uniform in ``(-2, 2)`` on
   the unconstrained latent sites for NUTS, prior draws for
   :class:`~numpyro_dgp.infer.EllipticalSlice`), grouped into the modes they settled in
   (:func:`~numpyro_dgp.diagnostics.mcmc_health`);
2. **weigh** -- each mode's posterior mass by bridge sampling
   (:func:`~numpyro_dgp.diagnostics.mode_evidence`), relative to the mass of all modes found;
3. **check** -- within every mode that holds more than ``min_weight`` of that mass (and always
   the heaviest), R-hat at most ``rhat_threshold``, bulk ESS at least ``ess_threshold`` for
   every layer output at the grid, and no divergent transition (a mode found by one chain is
   checked on that chain's two halves: split R-hat).

The ground truth is then the modes pooled by their mass
(:func:`~numpyro_dgp.diagnostics.mode_mixture`). A heavier mode that no chain found is
missed, whatever the numbers say: only more chains guard against that.

**References:**

* Meng, Wong (1996). Simulating ratios of normalizing constants via a simple identity: a
  theoretical exploration. Statistica Sinica.
* Gronau, Sarafoglou, Matzke, Ly, Boehm, Marsman, Leslie, Forster, Wagenmakers, Steingroever
  (2017). A tutorial on bridge sampling. Journal of Mathematical Psychology.
"""

from __future__ import annotations

import time
import warnings
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import xarray
from jax.typing import ArrayLike
from numpyro.handlers import seed, trace
from numpyro.infer import MCMC, NUTS

from numpyro_dgp.diagnostics._trees import (
    divergences,
    from_layer_samples,
    from_mcmc,
    grid_inputs,
    layer_names,
    layer_values,
)

if TYPE_CHECKING:
    import pandas


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


#: The columns of :attr:`Health.table`, one row per layer.
_HEALTH_COLUMNS = "layer chains draws max_rhat min_ess_bulk min_ess_tail divergences ok".split()


def _chain_modes(tree, names, tolerance):
    """Group chains whose per-chain means agree within ``tolerance`` within-chain sds, measured
    in the coordinates that whiten the pooled within-chain covariance of all layers' grid values:
    a direction of large spread shared by every chain (a shift of an inner layer that the next
    layer's stationary kernel ignores) must not hide a difference along a tight one."""
    C, D = tree["posterior"].sizes["chain"], tree["posterior"].sizes["draw"]
    draws = np.concatenate([layer_values(tree, n).reshape(C, D, -1) for n in names], axis=2)
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
    diverging = divergences(tree)
    div = None if diverging is None else int(diverging.sum())
    rows, chain_means = [], []
    for name in names:
        rhat = float(np.nanmax(az.rhat(posterior[name]).values)) if C > 1 else float("nan")
        bulk = float(np.nanmin(az.ess(posterior[name], method="bulk").values))
        tail = float(np.nanmin(az.ess(posterior[name], method="tail").values))
        ok = (C == 1 or rhat < rhat_threshold) and bulk > ess_threshold and not div
        rows.append((name, C, posterior.sizes["draw"], rhat, bulk, tail, div, bool(ok)))
        means = layer_values(tree, name).mean(1)  # (C, G, P)
        chain, grid, output = np.indices(means.shape).reshape(3, -1)
        columns = dict(layer=name, chain=chain, grid=grid, output=output, mean=means.ravel())
        chain_means.append(pd.DataFrame(columns))
    table = pd.DataFrame(rows, columns=_HEALTH_COLUMNS)
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
    return Health(table, pd.concat(chain_means, ignore_index=True), modes, multimodal)


class ModeEvidence(NamedTuple):
    """Result of :func:`mode_evidence`.

    :ivar modes: chain indices of each mode (as given).
    :ivar log_evidence: ``(K,)`` log of each mode's unnormalized posterior mass
        ``log int_mode p(theta, y) dtheta`` (bridge-sampling estimate).
    :ivar log_evidence_se: ``(K,)`` its Monte Carlo standard error (delta method, treating
        the draws as independent: an underestimate for autocorrelated chains).
    :ivar weights: ``(K,)`` posterior probability of each mode (normalized masses).
    :ivar khat: ``(K,)`` Pareto k-hat of the importance ratios ``p/q`` at the proposal
        draws; above 0.7 plain importance sampling would be unreliable (the Gaussian misses
        part of the mode) and the bridge estimate leans on the mode's own draws.
    """

    modes: list[list[int]]
    log_evidence: np.ndarray
    log_evidence_se: np.ndarray
    weights: np.ndarray
    khat: np.ndarray


def _bridge_log_evidence(log_ratio_posterior, log_ratio_proposal, num_iterations: int = 200):
    """log Z by the iterated optimal bridge of Meng & Wong (1996) from ``log p/q`` at posterior
    draws and at proposal draws; the standard error by the delta method on the final bridge."""
    from scipy.special import logsumexp as lse

    n1, n2 = log_ratio_posterior.size, log_ratio_proposal.size
    s1, s2 = n1 / (n1 + n2), n2 / (n1 + n2)

    def terms(log_r):
        # numerator: over q draws, p/q / (s1 p/q + s2 r); denominator: over posterior draws,
        # 1 / (s1 p/q + s2 r); both as logs
        num = log_ratio_proposal - np.logaddexp(np.log(s1) + log_ratio_proposal, np.log(s2) + log_r)
        return num, -np.logaddexp(np.log(s1) + log_ratio_posterior, np.log(s2) + log_r)

    log_r = lse(log_ratio_proposal) - np.log(n2)  # start from the importance-sampling estimate
    for _ in range(num_iterations):
        num, den = terms(log_r)
        previous = log_r
        log_r = (lse(num) - np.log(n2)) - (lse(den) - np.log(n1))
        if abs(log_r - previous) < 1e-10:
            break
    num, den = terms(log_r)
    num, den = np.exp(num), np.exp(den + log_r)
    rel_var = num.var() / (n2 * num.mean() ** 2) + den.var() / (n1 * den.mean() ** 2)
    return float(log_r), float(np.sqrt(rel_var))


def mode_evidence(
    model: Callable,
    samples: dict,
    modes: list[list[int]],
    rng_key: jax.Array,
    *args,
    num_draws: int = 4000,
    **kwargs,
) -> ModeEvidence:
    """How much posterior mass each mode holds, from chains that each stay in one mode.

    Chains from dispersed starts that settle in different modes say nothing about the modes'
    relative mass (a chain count is not a probability). For each mode this fits a Gaussian ``q``
    to the mode's draws in the unconstrained space and estimates the mode's mass ``Z_k = int
    p(theta, y) dtheta`` by bridge sampling between ``q`` (``num_draws`` draws of ``rng_key``)
    and the mode's draws (Meng & Wong, 1996; Gronau et al., 2017), which stays accurate where
    importance sampling from ``q`` alone would not (``khat`` says how far that would be off).
    Valid when the modes are separated (``q`` fitted to one mode puts next to no mass on
    another) and each mode's chains cover it; the weights ``Z_k / sum Z`` then give
    :func:`mode_mixture`. A mode split over several groups of chains would be counted twice:
    merge them first (``mcmc_health(..., mode_tolerance=...)``). Estimating a several-chain mode
    from each of its chains alone shows how far to trust ``log_evidence``: the standard error
    treats the draws as independent and ignores the fit of ``q``.

    :param model: the model MCMC ran on (with its handlers, e.g. ``exact_layers(model, ...)``).
    :param samples: ``mcmc.get_samples(group_by_chain=True)``: ``{site: (C, D, ...)}``
        holding every latent site of the model.
    :param modes: lists of chain indices (``mcmc_health(...).modes``).
    :param rng_key: PRNG key of the proposal draws.
    :param args: the model's positional arguments, as given to ``mcmc.run``.
    :param num_draws: draws from each mode's Gaussian ``q`` (at least 100).
    :param kwargs: the model's keyword arguments, as given to ``mcmc.run``.
    :return: :class:`ModeEvidence`.
    """
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.util import potential_energy, unconstrain_fn

    if not modes or any(len(m) == 0 for m in modes):
        raise ValueError(
            f"mode_evidence: modes must be non-empty lists of chain indices, got {modes!r}"
        )
    if num_draws < 100:
        raise ValueError(f"mode_evidence: num_draws must be at least 100, got {num_draws}")
    tr = trace(seed(model, 0)).get_trace(*args, **kwargs)  # the latent sites, in order
    names = [n for n, site in tr.items() if site["type"] == "sample" and not site["is_observed"]]
    missing = [n for n in names if n not in samples]
    if missing:
        raise ValueError(f"mode_evidence: samples lack the model's latent sites {missing}")
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
    per_mode = [
        _mode_log_evidence(flat, chains, log_joint, jax.random.fold_in(rng_key, k), num_draws)
        for k, chains in enumerate(modes)
    ]
    log_evidence, log_evidence_se, khat = (np.asarray(v) for v in zip(*per_mode))
    weights = np.exp(log_evidence - log_evidence.max())
    modes = [list(m) for m in modes]
    return ModeEvidence(modes, log_evidence, log_evidence_se, weights / weights.sum(), khat)


def _mode_log_evidence(flat, chains, log_joint, key, num_draws):
    """``(log Z, its standard error, k-hat)`` of the mode of ``chains`` (:func:`mode_evidence`),
    from the ``(C, D, dim)`` unconstrained draws ``flat`` and ``num_draws`` draws of ``key``
    from the Gaussian ``q`` fitted to the mode's: their mean, and their covariance shrunk
    towards its diagonal.

    :raises ValueError: a mode of fewer than 2 draws (the covariance needs two).
    :raises FloatingPointError: proposal draws where ``log p/q`` is not finite.
    """
    from arviz_stats.base import array_stats

    draws = np.asarray(flat[np.asarray(chains)]).reshape(-1, flat.shape[-1])
    n, d = draws.shape
    if n < 2:
        raise ValueError(f"mode_evidence: mode {chains} has {n} draw(s); at least 2 are needed")
    cov = np.cov(draws, rowvar=False).reshape(d, d)
    # shrink towards the diagonal by d / (n + d): keeps q proper with fewer draws than
    # dimensions; the bridge estimate is consistent for any q, so this costs only variance
    shrink = d / (n + d)
    cov = (1 - shrink) * cov + shrink * np.diag(np.diag(cov))
    cov = cov + 1e-12 * np.trace(cov) / d * np.eye(d)
    scale_tril = jnp.linalg.cholesky(jnp.asarray(cov))
    proposal = dist.MultivariateNormal(jnp.asarray(draws.mean(0)), scale_tril=scale_tril)

    def log_ratio_at(theta):  # log p/q at draws theta
        return np.asarray(log_joint(theta) - proposal.log_prob(theta), dtype=float)

    log_ratio = log_ratio_at(proposal.sample(key, (num_draws,)))
    if not np.all(np.isfinite(log_ratio)):
        raise FloatingPointError(
            f"mode_evidence: {int(np.sum(~np.isfinite(log_ratio)))} of {num_draws} proposal "
            f"draws of mode {chains} have a non-finite log density"
        )
    # bridge sampling (Meng & Wong 1996, optimal bridge, iterated): uses the mode's own draws
    # too, so it stays accurate where plain importance sampling from q has heavy-tailed ratios
    estimate, se = _bridge_log_evidence(log_ratio_at(jnp.asarray(draws)), log_ratio)
    with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
        # the Pareto fit overflows (k-hat nan) when the ratios span hundreds of nats
        warnings.simplefilter("ignore", RuntimeWarning)
        khat = float(array_stats.psislw(log_ratio)[1])
    return estimate, se, khat


def mode_mixture(
    tree: xarray.DataTree,
    evidence: ModeEvidence,
    rng_key: jax.Array,
    *,
    num_draws: int | None = None,
    label: str | None = None,
) -> xarray.DataTree:
    """The MCMC result with its modes pooled by their posterior mass (one chain of draws).

    Draws ``num_draws`` (default: all draws of the run) from the mixture of the modes'
    draws with :attr:`ModeEvidence.weights` -- the ground truth across modes when each chain
    stays in one.

    :param tree: the MCMC result in this module's layout (from :func:`from_mcmc`), with the
        chains that ``evidence.modes`` names.
    :param evidence: from :func:`mode_evidence`.
    :param rng_key: PRNG key (seeds the NumPy draws).
    :param num_draws: number of pooled draws (default: chains times draws of ``tree``).
    :param label: name of the result (default: ``tree``'s label with ``" (modes by mass)"``).
    :return: a ``DataTree`` in this module's layout with one chain of ``num_draws`` draws.
    """
    C, D = tree["posterior"].sizes["chain"], tree["posterior"].sizes["draw"]
    rng = np.random.default_rng(int(jax.random.randint(rng_key, (), 0, 2**31 - 1)))
    counts = rng.multinomial(num_draws or C * D, np.asarray(evidence.weights, float))
    picks = []  # indices of the chains' draws one after another
    for chains, count in zip(evidence.modes, counts):
        pool = (np.asarray(chains)[:, None] * D + np.arange(D)).ravel()
        picks.append(pool[rng.choice(pool.size, size=int(count), replace=True)])
    picked = np.concatenate(picks)
    layers = {n: layer_values(tree, n, flat=True)[picked] for n in layer_names(tree)}
    label = label or f"{tree.attrs.get('label', 'MCMC')} (modes by mass)"
    return from_layer_samples(layers, grid_inputs(tree), label=label)


class GroundTruth(NamedTuple):
    """The result of :func:`ground_truth`.

    :ivar converged: every mode above ``min_weight`` passed its within-mode check.
    :ivar reference: the modes pooled by mass, a ``DataTree`` in the diagnostics' layout (what
        :func:`~numpyro_dgp.diagnostics.compare` takes as ``mcmc``).
    :ivar explored: every chain, as :func:`~numpyro_dgp.diagnostics.from_mcmc` gives it.
    :ivar health: the chains' health across all of them (its ``modes``).
    :ivar evidence: each mode's mass (:class:`~numpyro_dgp.diagnostics.ModeEvidence`).
    :ivar mode_health: one :class:`~numpyro_dgp.diagnostics.Health` per mode (within-mode
        R-hat and ESS), in the order of ``health.modes``.
    :ivar checked: indices of the modes above ``min_weight`` (those the verdict rests on).
    :ivar mcmc: the ``numpyro.infer.MCMC`` run (its samples, for a confirmation run).
    :ivar seconds: wall seconds of the sampling and of the weighing.
    """

    converged: bool
    reference: xarray.DataTree
    explored: xarray.DataTree
    health: Health
    evidence: ModeEvidence
    mode_health: list[Health]
    checked: list[int]
    mcmc: MCMC
    seconds: dict[str, float]

    def report(self) -> str:
        """A few lines a person reads: the verdict, and per mode its chains, weight, worst
        R-hat and smallest bulk ESS.

        :return: the text.
        """
        lines = [
            f"converged ground truth: {self.converged} ({len(self.health.modes)} mode(s) found; "
            f"checked: those above the weight threshold, {self.checked})"
        ]
        for k, chains in enumerate(self.health.modes):
            table = self.mode_health[k].table
            lines.append(
                f"mode {k} chains {chains}: weight {self.evidence.weights[k]:.3g}, "
                f"max R-hat {table.max_rhat.max():.3f}, min bulk ESS {table.min_ess_bulk.min():.0f}"
            )
        return "\n".join(lines)


def ground_truth(
    model: Callable,
    rng_key: jax.Array,
    grid: ArrayLike,
    *args: Any,
    kernel: Callable[[Callable], Any] = NUTS,
    num_chains: int = 16,
    num_warmup: int = 500,
    num_samples: int = 500,
    min_weight: float = 0.01,
    rhat_threshold: float = 1.01,
    ess_threshold: float = 400.0,
    evidence_draws: int = 4000,
    **kwargs: Any,
) -> GroundTruth:
    """Run the explore / weigh / check protocol (module docstring) and say whether the result
    is converged ground truth.

    The model is one whose layer outputs at ``grid`` are sites ``"<layer>.grid"``:
    :class:`~numpyro_dgp.handlers.exact_layers` or
    :class:`~numpyro_dgp.handlers.vecchia_layers` with this ``grid``. Chains run one after
    another (``chain_method="sequential"``). Cost: ``num_chains * (num_warmup + num_samples)``
    sampler steps, then ``evidence_draws`` log densities per mode.

    :param model: the model under its MCMC handler.
    :param rng_key: PRNG key.
    :param grid: ``(G, D)``, the handler's grid (the points the check looks at).
    :param args: the model's positional arguments (e.g. ``X, y``).
    :param kernel: ``model -> MCMCKernel`` (default NUTS; e.g.
        ``lambda m: NUTS(m, max_tree_depth=8)`` or :class:`~numpyro_dgp.infer.EllipticalSlice`).
    :param num_chains: exploration chains.
    :param num_warmup: warm-up steps per chain.
    :param num_samples: draws per chain.
    :param min_weight: modes lighter than this share of the mass found are not checked.
    :param rhat_threshold: the largest within-mode R-hat allowed.
    :param ess_threshold: the smallest within-mode bulk ESS allowed.
    :param evidence_draws: Gaussian draws per mode of the bridge-sampling estimate.
    :param kwargs: the model's keyword arguments.
    :return: :class:`GroundTruth`.
    :raises ValueError: for fewer than two chains or ``min_weight`` outside ``[0, 1)``.
    """
    if int(num_chains) < 2:
        raise ValueError(f"ground_truth: num_chains must be at least 2, got {num_chains!r}")
    if not 0 <= min_weight < 1:
        raise ValueError(f"ground_truth: min_weight must be in [0, 1), got {min_weight!r}")
    key_run, key_evidence, key_mixture = jax.random.split(rng_key, 3)
    mcmc = MCMC(
        kernel(model),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="sequential",
        progress_bar=False,
    )
    start = time.perf_counter()
    mcmc.run(key_run, *args, **kwargs)
    sampled = time.perf_counter() - start
    explored = from_mcmc(mcmc, grid, label="MCMC (explore)")
    health_of = partial(
        mcmc_health, rhat_threshold=rhat_threshold, ess_threshold=ess_threshold, warn=False
    )
    health = health_of(explored)
    start = time.perf_counter()
    samples = mcmc.get_samples(group_by_chain=True)
    evidence = mode_evidence(
        model, samples, health.modes, key_evidence, *args, num_draws=evidence_draws, **kwargs
    )
    weighed = time.perf_counter() - start
    mode_health = [health_of(_chains(explored, chains)) for chains in health.modes]
    heaviest = int(np.argmax(evidence.weights))
    checked = sorted({heaviest} | {k for k, w in enumerate(evidence.weights) if w > min_weight})
    converged = all(bool(mode_health[k].table.ok.all()) for k in checked)
    reference = mode_mixture(explored, evidence, key_mixture, label="MCMC (modes by mass)")
    seconds = {"sampling": sampled, "weighing": weighed}
    return GroundTruth(
        converged, reference, explored, health, evidence, mode_health, checked, mcmc, seconds
    )


def _chains(tree: xarray.DataTree, chains: list[int]) -> xarray.DataTree:
    """The tree of the given chains only, divergences kept; one chain becomes its two halves
    (so that its R-hat is the split R-hat)."""

    def pick(v):  # (C, D, ...) -> the chains (one chain: its two halves)
        v, half = v[chains], v.shape[1] // 2
        return v if len(chains) > 1 else np.stack([v[0, :half], v[0, half : 2 * half]])

    layers = {n: pick(layer_values(tree, n)) for n in layer_names(tree)}
    diverging = divergences(tree)
    stats = None if diverging is None else {"diverging": pick(diverging)}
    return from_layer_samples(layers, grid_inputs(tree), sample_stats=stats)
