"""The exact DGP's Vecchia approximation for MCMC at thousands of points.

:class:`vecchia_layers` is :class:`~numpyro_dgp.handlers.exact_layers` with each layer's
``O(n^3)`` GP prior replaced by its Vecchia approximation, ``O(n m^3)`` (the numerical core's
:mod:`numpyro_dgp.core._vecchia`); the sites, arguments and collapsed last layer are the same.

**References:**

* Vecchia (1988). Estimation and model identification for continuous spatial processes.
  Journal of the Royal Statistical Society B.
* Guinness (2018). Permutation and grouping methods for sharpening Gaussian process
  approximations. Technometrics.
* Sauer, Cooper, Gramacy (2023). Vecchia-approximated deep Gaussian processes for computer
  experiments. Journal of Computational and Graphical Statistics.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.typing import ArrayLike

from numpyro_dgp._validation import check_choice, check_positive_int
from numpyro_dgp.core import (
    VecchiaFactors,
    nearest_previous_neighbors,
    vecchia_factors,
    vecchia_log_density,
    vecchia_sample,
)
from numpyro_dgp.handlers._mcmc import CollapsedLayer, CollapsedNormal, exact_layers, output_site
from numpyro_dgp.layers import Layer

#: The values of ``ordering`` of :class:`vecchia_layers`.
ORDERINGS = ("random", "given")


class _Neighbors(NamedTuple):
    """One run's ordering and neighbour sets (``(n, m)`` indices into the ordered points)."""

    order: jax.Array
    inverse: jax.Array
    sets: tuple[jax.Array, jax.Array]


class vecchia_layers(exact_layers):
    """The Vecchia-approximated exact DGP: every layer's output a latent site, ``O(n m^3)``.

    The model of :class:`~numpyro_dgp.handlers.exact_layers` (no inducing points; layer ``l``'s
    output at its ``n`` inputs drawn from ``N(mean_l, K_l + jitter I)``, ``+ noise I`` for a
    noisy layer), with each layer's joint prior replaced by Vecchia's (1988) product of
    conditionals: the points in an order, each conditioned on its ``num_neighbors`` nearest
    earlier points. NUTS on the result samples the Vecchia DGP of Sauer, Cooper & Gramacy
    (2023). Cost per log density and gradient: ``O(n m^3)`` per layer (one ``(m + 1)``-square
    Cholesky factor per point) plus, non-centered, a sequential pass over the points
    (``O(n m)``, ``n`` steps); memory ``O(n m^2)``. With ``num_neighbors >= n - 1`` it is the
    exact model. Reverse-mode derivatives only (NUTS and SVI take these); forward mode (e.g.
    ``NUTS(forward_mode_differentiation=True)``, Hessians) is not defined for the
    non-centered pass: use ``parameterization="centered"`` there.

    **Accuracy.** 25 neighbours suit low-dimensional inputs; a layer that is smooth over many
    input dimensions needs far more (on kin8nm's eight inputs a one-layer GP's held-out
    posterior was several posterior standard deviations off at ``m = 25``; see the
    limitations page). Check an answer at twice the neighbours, or against
    :class:`~numpyro_dgp.handlers.exact_layers` on a subset.

    **Neighbour policy.** The data rows are put in a random order (``ordering="random"``,
    drawn from ``ordering_seed``; Guinness 2018 found random orders far better than
    coordinate orders) or kept in theirs (``"given"``); ``grid`` rows follow them in their own
    order, so the data's density does not depend on the grid. Every layer uses the neighbour
    sets of the *first layer's inputs* (the data inputs, Euclidean distance: standardize them),
    computed once per compilation (``O(n^2 D)``) and held fixed for the whole run, so NUTS
    sees one smooth density. (Inputs passed as traced arguments, e.g. MCMC's
    ``jit_model_args=True``, make the search part of every evaluation: correct, but at
    ``n = 10^4`` as costly as the density itself.) Sauer et al. (2023) choose a deeper
    layer's neighbours among its latent inputs instead, refreshed as the chain moves; here a
    layer's sets can come from any points you give (``neighbor_inputs``, e.g. the posterior
    mean of its inputs from a first run), fixed for the run you start with them: refresh them
    between runs (e.g. after warm-up), never within one.

    :param fn: the model.
    :param num_neighbors: ``m``, the neighbours per point (default 25, deepgp's default).
    :param grid: ``(G, D)`` extra inputs of the first layer, as in
        :class:`~numpyro_dgp.handlers.exact_layers` (the grid values follow the data in the
        ordering, each conditioned on its nearest earlier data and grid points).
    :param parameterization: ``"noncentered"`` (default; ``"<name>.f_white"`` holds the
        standard normals ``eps (P, n)`` of each point's conditional, ``eps[:, i]`` point
        ``i``'s) or ``"centered"`` (``"<name>.f"`` holds ``f^T (P, n)``; no sequential pass).
    :param jitter: diagonal jitter of the prior covariances (default: each layer's own).
    :param collapse_last: integrate the last layer out (Gaussian likelihood): ``y`` is scored
        by the Vecchia approximation of ``N(m_L, K_L + jitter I + diag(s^2))``, Sauer et al.'s
        outer layer; the grid values are drawn from the same approximation's conditional
        given ``y`` (``"<name>.grid_white"``), each given its nearest earlier observations
        and grid values.
    :param ordering: ``"random"`` (default) or ``"given"``.
    :param ordering_seed: seed of the random order.
    :param neighbor_inputs: ``{layer name: (n, D_l) points}``: that layer's neighbour sets
        from these points (rows as the layer's inputs: data rows, then grid rows).
    :raises ValueError: for a ``num_neighbors`` that is not a positive integer, an unknown
        ``ordering`` or ``parameterization``, ``neighbor_inputs`` that are not finite 2-D
        arrays, and what :class:`~numpyro_dgp.handlers.exact_layers` refuses; during a run,
        for ``neighbor_inputs`` whose rows are not the layer's points; after a run, for
        ``neighbor_inputs`` naming a layer the model did not run.
    """

    def __init__(
        self,
        fn: Callable | None = None,
        num_neighbors: int = 25,
        grid: ArrayLike | None = None,
        parameterization: str = "noncentered",
        jitter: float | None = None,
        collapse_last: bool = False,
        ordering: str = "random",
        ordering_seed: int = 0,
        neighbor_inputs: Mapping[str, ArrayLike] | None = None,
    ) -> None:
        check_positive_int(num_neighbors, "num_neighbors", "vecchia_layers")
        check_choice(ordering, ORDERINGS, "ordering", "vecchia_layers")
        self.num_neighbors = int(num_neighbors)
        self.ordering = ordering
        self.ordering_seed = int(ordering_seed)
        self.neighbor_inputs = {n: jnp.asarray(p) for n, p in (neighbor_inputs or {}).items()}
        for name, points in self.neighbor_inputs.items():
            if points.ndim != 2 or not bool(jnp.all(jnp.isfinite(points))):
                raise ValueError(
                    f"vecchia_layers: neighbor_inputs[{name!r}] must be a finite (num_points, dim) "
                    f"array, got shape {points.shape}"
                    + ("" if points.ndim != 2 else " with NaN or inf values")
                )
        super().__init__(fn, grid, parameterization, jitter, collapse_last)

    def _reset(self) -> None:
        super()._reset()
        self._neighbors: _Neighbors | None = None

    def _problem_after_run(self) -> str | None:
        unknown = sorted(set(self.neighbor_inputs) - set(self.layer_order))
        if unknown and super()._problem_after_run() is None:
            return (
                f"vecchia_layers: neighbor_inputs names {unknown}, which the model did not run "
                f"as layers (it ran {self.layer_order})"
            )
        return super()._problem_after_run()

    def _output_site(self, layer: Layer, A: jax.Array, jitter: float | jax.Array) -> jax.Array:
        """The layer's output ``(n, P)`` at ``A (n, D)``: a site with the Vecchia prior."""
        run, neighbors, mask = self._neighbor_sets(layer, A)
        factors = vecchia_factors(
            layer.kernel, A[run.order], neighbors, mask, _diag(layer, jitter, A.shape[0], A.dtype)
        )
        mean = layer.mean_fn(A).T  # (P, n), the points' order
        shape = mean.shape
        if self.parameterization == "noncentered":
            eps = output_site(layer.name, shape, A.dtype)
            residual = vecchia_sample(factors, eps[:, run.order])[:, run.inverse]
            return (mean + residual).T
        prior = _VecchiaPrior(mean, factors, run.order, run.inverse)
        return output_site(layer.name, shape, A.dtype, prior)

    def _neighbor_sets(self, layer: Layer, A: jax.Array) -> tuple[_Neighbors, jax.Array, jax.Array]:
        """This run's ordering and the first layer's neighbour sets (found at the first layer),
        and the layer's neighbour sets: its own ``neighbor_inputs``, or the first layer's."""
        if self._neighbors is None:
            num_data = A.shape[0] - (0 if self.grid is None else self.grid.shape[0])
            with jax.ensure_compile_time_eval():
                data = jnp.arange(num_data)
                if self.ordering == "random":
                    key = jax.random.PRNGKey(self.ordering_seed)
                    data = jax.random.permutation(key, num_data)
                order = jnp.concatenate([data, jnp.arange(num_data, A.shape[0])])
                points = jax.lax.stop_gradient(A)[order]
                sets = nearest_previous_neighbors(points, self.num_neighbors)
                self._neighbors = _Neighbors(order, jnp.argsort(order), sets)
        run = self._neighbors
        given = self.neighbor_inputs.get(layer.name)
        if given is None:
            return run, *run.sets
        if given.shape[0] != A.shape[0]:
            raise ValueError(
                f"vecchia_layers: neighbor_inputs[{layer.name!r}] has {given.shape[0]} rows, but "
                f"the layer has {A.shape[0]} points (data rows, then grid rows)"
            )
        with jax.ensure_compile_time_eval():
            return run, *nearest_previous_neighbors(given[run.order], self.num_neighbors)

    def _collapsed_parts(
        self, state: CollapsedLayer, y: jax.Array, noise_var: jax.Array
    ) -> tuple[dist.Distribution, jax.Array | None]:
        """The observations' Vecchia density with the last layer integrated out, and the grid
        values from the same approximation's conditional given them."""
        N, P = noise_var.shape
        A, layer = state.inputs, state.layer
        run, neighbors, mask = self._neighbor_sets(layer, A)
        diag = _diag(layer, state.jitter, A.shape[0], A.dtype)
        diag = jnp.broadcast_to(diag, (P, A.shape[0])).at[:, :N].add(noise_var.T[:, run.order[:N]])
        factors = vecchia_factors(layer.kernel, A[run.order], neighbors, mask, diag)
        data = VecchiaFactors(
            neighbors[:N], mask[:N], factors.coef[:, :N], factors.scale[:, :N]
        )  # data rows come first in the order and condition on data rows only
        fn = _CollapsedVecchia(state.mean[:N].reshape(y.shape), data, run.order[:N])
        if state.grid_white is None:
            return fn, None
        # the joint Vecchia approximation of (y, f_grid), y first: the grid rows drawn in
        # order, each given its nearest earlier observations and grid values
        residual = (y.reshape(N, P) - state.mean[:N]).T[:, run.order[:N]]  # (P, N), ordered
        drawn = vecchia_sample(factors, state.grid_white, given=residual)[:, N:]
        return fn, (state.mean[N:].T + drawn).T


def _diag(layer: Layer, jitter: float | jax.Array, n: int, dtype: Any) -> jax.Array:
    """``(n,)`` the prior's diagonal addition: the jitter, plus a noisy layer's noise."""
    extra = jitter if layer.noise is None else jitter + layer.noise
    return jnp.full((n,), extra, dtype)


class _VecchiaPrior(dist.Distribution):
    """A layer's Vecchia prior over ``f^T (P, n)`` (event shape ``(P, n)``, points in their
    own order; ``order`` is the Vecchia order)."""

    support = dist.constraints.real_matrix
    reparametrized_params = ["loc"]

    def __init__(
        self, loc: jax.Array, factors: VecchiaFactors, order: jax.Array, inverse: jax.Array
    ) -> None:
        self.loc, self.factors, self.order, self.inverse = loc, factors, order, inverse
        super().__init__(batch_shape=(), event_shape=jnp.shape(loc))

    def sample(self, key: jax.Array, sample_shape: tuple = ()) -> jax.Array:
        eps = jax.random.normal(key, sample_shape + self.loc.shape, self.loc.dtype)
        flat = eps.reshape(-1, self.loc.shape[-1])[:, self.order]
        residual = vecchia_sample(self.factors, flat)[:, self.inverse]
        return self.loc + residual.reshape(eps.shape)

    def log_prob(self, value: jax.Array) -> jax.Array:
        residual = (value - self.loc)[..., self.order]
        return jnp.sum(vecchia_log_density(self.factors, residual), axis=-1)


class _CollapsedVecchia(CollapsedNormal):
    """Observations of a collapsed layer under the Vecchia approximation of their marginal."""

    def __init__(self, loc: jax.Array, factors: VecchiaFactors, order: jax.Array) -> None:
        self.factors, self.order = factors, order
        dist.Distribution.__init__(self, batch_shape=jnp.shape(loc), event_shape=())
        self.loc = loc

    def _residual_log_prob(self, residual: jax.Array) -> jax.Array:
        return jnp.sum(vecchia_log_density(self.factors, residual[:, self.order]))
