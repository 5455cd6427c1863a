"""Converged MCMC ground truth in one call: explore, weigh, check within each mode.

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
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
import xarray
from jax.typing import ArrayLike
from numpyro.infer import MCMC, NUTS

from numpyro_dgp.diagnostics._modes import (
    Health,
    ModeEvidence,
    mcmc_health,
    mode_evidence,
    mode_mixture,
)
from numpyro_dgp.diagnostics._trees import (
    divergences,
    from_layer_samples,
    from_mcmc,
    grid_inputs,
    layer_names,
    layer_values,
)


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
    return GroundTruth(
        converged,
        reference,
        explored,
        health,
        evidence,
        mode_health,
        checked,
        mcmc,
        {"sampling": sampled, "weighing": weighed},
    )


def _chains(tree: xarray.DataTree, chains: list[int]) -> xarray.DataTree:
    """The tree of the given chains only, divergences kept; one chain becomes its two halves
    (so that its R-hat is the split R-hat)."""
    layers = {n: layer_values(tree, n)[chains] for n in layer_names(tree)}
    diverging = divergences(tree)
    stats = {} if diverging is None else {"diverging": diverging[chains]}
    if len(chains) == 1:
        half = next(iter(layers.values())).shape[1] // 2
        layers = {n: np.stack([v[0, :half], v[0, half : 2 * half]]) for n, v in layers.items()}
        stats = {k: np.stack([v[0, :half], v[0, half : 2 * half]]) for k, v in stats.items()}
    return from_layer_samples(layers, grid_inputs(tree), sample_stats=stats or None)
