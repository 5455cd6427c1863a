"""The same model for MCMC: exact layers, latent layer outputs given u, a collapsed last layer.

Which model each handler's posterior belongs to:

* :class:`exact_layers` -- the exact DGP (no inducing points);
* :class:`latent_conditionals` -- the sparse DGP: with ``full_cov=False`` (default) each
  layer's outputs are independent across points given its inducing values, the fully
  independent training conditional (FITC) of Snelson & Ghahramani (2006), in the unifying
  view of Quiñonero-Candela & Rasmussen (2005); with ``full_cov=True`` the exact joint
  conditional, so integrating ``u`` out gives back the exact GP prior of each layer;
* :class:`collapse_last_layer` -- the inner layers as the default propagation (point by point
  given ``u``, FITC), the last layer's FITC conditional integrated out against a Gaussian
  likelihood (Havasi et al. 2018).

A layer with output noise (``gp_layer(..., noise=...)``) adds its noise variance to the
variance of its outputs in all three (``K + noise I`` for exact layers): the sampled model is
the DGP with noisy hidden layers ``h_l = f_l(h_{l-1}) + eps_l``.

**References:**

* Havasi, Hernández-Lobato, Murillo-Fuentes (2018). Inference in deep Gaussian processes
  using stochastic gradient Hamiltonian Monte Carlo. NeurIPS.
* Snelson, Ghahramani (2006). Sparse Gaussian processes using pseudo-inputs. NIPS.
* Quiñonero-Candela, Rasmussen (2005). A unifying view of sparse approximate Gaussian process
  regression. JMLR.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike

from numpyro_dgp._compat import lazy_param_initializer
from numpyro_dgp._protocol import LAYER_MESSAGE, inducing_tag, layer_call
from numpyro_dgp._validation import as_float_array, check_choice
from numpyro_dgp.core import cholesky, jittered_cholesky
from numpyro_dgp.handlers._base import (
    PerRunMessenger,
    SpreadTotal,
    check_layer_supported,
    gaussian_observation,
    replace_observation,
)
from numpyro_dgp.layers import Layer, layer_moments
from numpyro_dgp.posteriors import unwrap_distribution

#: The values of ``parameterization`` of :class:`exact_layers` and :class:`latent_conditionals`.
PARAMETERIZATIONS = ("noncentered", "centered")


def _layer_output_site(
    name: str, mean: jax.Array, scale: jax.Array, parameterization: str
) -> jax.Array:
    """Latent layer output ``f (n, P)`` with mean ``mean (n, P)``, as a NumPyro site.

    ``scale`` is ``(P, n, n)`` lower-triangular (points correlated, one factor per output) or
    ``(n, P)`` standard deviations (points independent). Non-centered: the site
    ``"<name>.f_white"`` holds ``eps (P, n) ~ N(0, I)`` and ``f = mean + scale eps`` (better
    for NUTS where the data constrain the layer weakly); centered: ``"<name>.f"`` holds
    ``f^T (P, n)`` itself.
    """
    dense = scale.ndim == 3
    shape = mean.shape[::-1]
    if parameterization == "noncentered":
        eps = output_site(name, shape, mean.dtype)
        if dense:
            return mean + jnp.einsum("pnm,pm->np", scale, eps)
        return mean + scale * eps.T
    if dense:
        fn = dist.MultivariateNormal(mean.T, scale_tril=scale).to_event(1)
    else:
        fn = dist.Normal(mean.T, scale.T).to_event(2)
    return output_site(name, shape, mean.dtype, fn)


def standard_normal(shape: tuple, dtype: Any) -> dist.Distribution:
    """Standard normals of ``shape`` (two event dimensions)."""
    return dist.Normal(jnp.zeros(shape, dtype), 1.0).to_event(2)


def output_site(
    name: str, shape: tuple, dtype: Any, prior: dist.Distribution | None = None
) -> jax.Array:
    """A layer's latent output site of ``shape (P, n)``: without ``prior`` the non-centered
    ``"<name>.f_white"`` (``eps (P, n) ~ N(0, I)``, returned as drawn); with it the centered
    ``"<name>.f"`` over ``f^T (P, n)`` (``f (n, P)`` returned). A substituted value (e.g. MCMC
    samples given to ``Predictive``) must have the layer's number of points: it exists only at
    the inputs it was sampled at."""
    site = f"{name}.f_white" if prior is None else f"{name}.f"
    value = numpyro.sample(site, standard_normal(shape, dtype) if prior is None else prior)
    if tuple(jnp.shape(value))[-2:] != tuple(shape):
        raise ValueError(
            f"latent layer output {site!r} has shape {tuple(jnp.shape(value))[-2:]}, but the layer "
            f"has {shape[-1]} points here: latent layer outputs exist only at the inputs they were "
            "sampled at. At new inputs, predict with "
            "numpyro_dgp.predict_from_samples(model, samples, ...), or pass Predictive only the "
            "samples of the '<layer>.u' sites and of the parameters"
        )
    return value if prior is None else value.T


class exact_layers(PerRunMessenger):
    """The exact DGP: every layer's output is a latent site with the full GP prior.

    Under this handler a model built from :func:`numpyro_dgp.gp_layer` has no inducing
    points: the ``"<name>.u"`` sites and the k-means initialization of the inducing inputs
    are removed, and layer ``l``'s output at its ``n`` input points is drawn from
    ``N(mean_l(f_{l-1}), K_l(f_{l-1}, f_{l-1}) + jitter I)`` per output (``+ noise I`` for a
    layer with output noise). NUTS on the result samples the exact DGP posterior (no sparse
    approximation; ``O(n^3)`` per layer and gradient: small data, ``n`` up to a few hundred).

    Kernel hyperparameters, noise and mean weights are whatever the model makes them:
    ``numpyro.param`` values stay fixed under MCMC (substitute fitted ones with
    ``numpyro.handlers.substitute``), hyperparameters with ``priors=`` are sampled. Data
    subsampling (``plate(..., subsample_size=...)``) is not meaningful here: NUTS needs the
    full data.

    :param fn: the model.
    :param grid: ``(G, D)`` extra inputs of the first layer at which every layer's output is
        sampled jointly with the data (the posterior at the grid is not independent of the
        data rows, so it must be part of the chain). Layer ``l``'s grid inputs are layer
        ``l-1``'s grid outputs, so the layers must run as a chain (each takes the previous
        layer's output). Recorded as ``numpyro.deterministic("<name>.grid", (G, P))``.
    :param parameterization: ``"noncentered"`` (default; site ``"<name>.f_white"`` holds the
        standard-normal ``eps (P, n)`` with ``f = mean + L eps``) or ``"centered"`` (site
        ``"<name>.f"`` holds ``f^T (P, n)``).
    :param jitter: diagonal jitter of the prior covariances (default: each layer's own).
    :param collapse_last: integrate the last layer out analytically (default ``False``). Its
        output at the data is then no latent site: the observation site after it (the first
        observed sample site, a ``Normal(f, s)`` with ``f`` the layer's output) scores ``y``
        with the exact marginal ``N(y | m_L, K_L(f_{L-1}, f_{L-1}) + jitter I + diag(s^2))``
        per output, and the layer's grid values are drawn from their exact conditional given
        ``y`` and the inner layers (non-centered: site ``"<name>.grid_white"``). The target of
        the remaining sites is the same posterior marginal, with one layer fewer to sample
        and without the near-deterministic coupling of ``f_L`` to ``y`` that makes NUTS
        crawl when the noise is small. Gaussian likelihoods only; the observations must be
        given.
    :raises ValueError: for an unknown ``parameterization``, a ``grid`` that is not finite and
        2-D, or a non-positive ``jitter``.
    """

    def __init__(
        self,
        fn: Callable | None = None,
        grid: ArrayLike | None = None,
        parameterization: str = "noncentered",
        jitter: float | None = None,
        collapse_last: bool = False,
    ) -> None:
        name = type(self).__name__  # exact_layers, or a subclass (vecchia_layers)
        check_choice(parameterization, PARAMETERIZATIONS, "parameterization", name)
        if grid is not None:
            grid = as_float_array(grid, "grid", name, ndim=2)
            if not bool(jnp.all(jnp.isfinite(grid))):
                raise ValueError(f"{name}: grid contains NaN or inf values")
        if jitter is not None and not (jitter > 0):
            raise ValueError(f"{name}: jitter must be positive, got {jitter!r}")
        self.grid = grid
        self.parameterization = parameterization
        self.jitter = jitter
        self.collapse_last = bool(collapse_last)
        super().__init__(fn)

    def _reset(self) -> None:
        self._grid_inputs = self.grid
        self.layer_order: list[str] = []
        # the collapsed layer's prior, until its observation site
        self._collapsed: CollapsedLayer | None = None

    def _needs_last_layer(self) -> bool:
        return self.collapse_last

    def _problem_after_run(self) -> str | None:
        if self._collapsed is not None:
            return (
                f"{type(self).__name__}(collapse_last=True): no observed sample site followed "
                f"layer {self._collapsed.layer.name!r}; the collapsed layer is scored by the "
                "observations, so they must be given"
            )
        return None

    def process_message(self, msg: dict) -> None:
        """Remove the inducing sites and their k-means initialization, replace each layer by an
        exact GP draw, and score the observations of a collapsed last layer."""
        if self._collapsed is not None and msg["type"] == "sample" and msg["is_observed"]:
            self._score_collapsed(msg)
            return
        if msg["type"] == "param" and msg["name"].endswith(".inducing_inputs"):
            # No inducing points in the exact model: skip the k-means initialization.
            init = lazy_param_initializer(msg)
            if init is not None and msg["value"] is None:
                shape = jax.eval_shape(init, jax.random.PRNGKey(0))
                msg["value"] = jnp.zeros(shape.shape, shape.dtype)
            return
        if inducing_tag(msg) is not None and not msg["is_observed"]:
            # the inducing values do not exist in the exact model: hide the site from the
            # handlers outside (trace, substitute, MCMC) and give it an inert value
            msg["value"] = jnp.zeros(msg["fn"].shape(), msg["fn"].mean.dtype) + msg["fn"].mean
            msg["stop"] = True
            return
        if msg["type"] == LAYER_MESSAGE:
            check_layer_supported(msg, type(self).__name__)
            msg["fn"] = self._exact

    def _exact(self, layer: Layer, X: jax.Array, u: jax.Array, **_: Any) -> jax.Array:
        """The layer's value (its message's ``fn``): its exact output site, given nothing of
        ``u`` or the message's key."""
        self.layer_order.append(layer.name)
        grid = self._grid_inputs
        if grid is not None and grid.shape[-1] != X.shape[-1]:
            raise ValueError(
                f"{type(self).__name__}: layer {layer.name!r} takes inputs of width {X.shape[-1]} "
                f"but the grid reaching it has width {grid.shape[-1]}; the layers must form a "
                "chain starting at the grid's input space"
            )
        with jax.ensure_compile_time_eval():  # concrete data and grid stay concrete (vecchia's
            # neighbour search runs once per compilation only on concrete inputs)
            A = X if grid is None else jnp.concatenate([X, jnp.asarray(grid, X.dtype)], axis=0)
        jitter = layer.jitter if self.jitter is None else self.jitter
        if self.collapse_last and layer.name == self._last_layer:
            return self._defer_collapsed(layer, X, A, jitter)
        f = self._output_site(layer, A, jitter)
        N = X.shape[0]
        if grid is not None:
            self._grid_inputs = f[N:]
            numpyro.deterministic(f"{layer.name}.grid", f[N:])
        return f[:N]

    def _output_site(self, layer: Layer, A: jax.Array, jitter: float | jax.Array) -> jax.Array:
        """The layer's output ``(n, P)`` at its inputs ``A (n, D)``: a site with the exact prior."""
        L = jittered_cholesky(_output_covariance(layer, A), jitter)
        L = jnp.broadcast_to(L, (layer.out_dim,) + L.shape)
        return _layer_output_site(layer.name, layer.mean_fn(A), L, self.parameterization)

    def _defer_collapsed(
        self, layer: Layer, X: jax.Array, A: jax.Array, jitter: float | jax.Array
    ) -> jax.Array:
        """The collapsed layer: keep its prior for the observation site, return its prior mean."""
        N = X.shape[0]
        mean = layer.mean_fn(A)
        grid_white = None
        if A.shape[0] > N:
            # the grid values' conditional depends on y, known only at the observation site;
            # their standard-normal noise is drawn here, in the layer's place in the run
            shape = (layer.out_dim, A.shape[0] - N)
            grid_white = numpyro.sample(f"{layer.name}.grid_white", standard_normal(shape, A.dtype))
        self._collapsed = CollapsedLayer(layer, N, A, mean, jitter, grid_white)
        return mean[:N]

    def _score_collapsed(self, msg: dict) -> None:
        state, self._collapsed = self._collapsed, None
        assert state is not None  # process_message calls this only with a collapsed layer pending
        layer = state.layer
        refusal = f"only a Normal likelihood can be integrated against layer {layer.name!r}"
        caller = f"{type(self).__name__}(collapse_last=True)"
        _, y, noise_var = gaussian_observation(msg, layer, state.num_data, caller, refusal)
        fn, grid = self._collapsed_parts(state, y, noise_var)
        replace_observation(msg, fn)
        if grid is not None:
            numpyro.deterministic(f"{layer.name}.grid", grid)

    def _collapsed_parts(
        self, state: CollapsedLayer, y: jax.Array, noise_var: jax.Array
    ) -> tuple[dist.Distribution, jax.Array | None]:
        """The observations' distribution (``y (N, P)`` or ``(N,)``) with the last layer
        integrated out, and its grid values ``(G, P)`` drawn from their conditional given ``y``
        (``None`` without a grid). ``noise_var (N, P)``: the likelihood's variances.
        """
        N, P = noise_var.shape
        kernel = _output_covariance(state.layer, state.inputs)
        K_data = kernel[:N, :N] + state.jitter * jnp.eye(N, dtype=y.dtype)
        # one factor of C = K_dd + jitter I + diag(s^2) per output, shared by the score and
        # the grid conditional
        L = cholesky(K_data + jax.vmap(jnp.diag)(noise_var.T))  # (P, N, N)
        fn = CollapsedNormal(state.mean[:N].reshape(y.shape), L)
        if state.grid_white is None:
            return fn, None
        # exact conditional of the grid values given y: per output p,
        # m_g + K_gd C^-1 (y - m_d),  K_gg - K_gd C^-1 K_dg
        residual = (y.reshape(N, P) - state.mean[:N]).T  # (P, N)
        K_dg = kernel[:N, N:]
        V = solve_triangular(L, jnp.broadcast_to(K_dg, (P,) + K_dg.shape), lower=True)  # (P, N, G)
        alpha = solve_triangular(L, residual[..., None], lower=True)[..., 0]  # (P, N)
        cond_mean = state.mean[N:].T + jnp.einsum("png,pn->pg", V, alpha)
        cond_cov = kernel[N:, N:] - jnp.einsum("png,pnh->pgh", V, V)
        L_grid = jittered_cholesky(cond_cov, state.jitter)
        return fn, (cond_mean + jnp.einsum("pgh,ph->pg", L_grid, state.grid_white)).T


def _output_covariance(layer: Layer, A: jax.Array) -> jax.Array:
    """Prior covariance of the layer's output at ``A``: ``K(A, A)``, plus ``noise I`` for a
    layer with output noise (its outputs are ``f + eps``)."""
    K = layer.kernel(A)
    return K if layer.noise is None else K + layer.noise * jnp.eye(K.shape[0], dtype=K.dtype)


class CollapsedLayer(NamedTuple):
    layer: Layer
    num_data: int
    inputs: jax.Array  # (N + G, D), data rows first
    mean: jax.Array  # (N + G, P)
    jitter: float | jax.Array
    grid_white: jax.Array | None  # (P, G)


class CollapsedNormal(SpreadTotal):
    """Observations of a collapsed GP layer: ``y[:, p] ~ N(loc[:, p], L_p L_p^T)`` with
    ``L_p`` the Cholesky factor of ``K + diag(noise_var[:, p])`` (``scale_tril (P, N, N)``).

    Batch shape ``(N,)`` or ``(N, P)`` like the Normal it replaces (so plates still match).
    """

    def __init__(self, loc: jax.Array, scale_tril: jax.Array) -> None:
        self.loc, self.scale_tril = loc, scale_tril
        super().__init__(batch_shape=jnp.shape(loc), event_shape=())

    @property
    def mean(self) -> jax.Array:
        return self.loc

    def total_log_prob(self, value: jax.Array) -> jax.Array:
        residual = (value - self.loc).reshape(value.shape[0], -1).T  # (P, N)
        return self._residual_log_prob(residual)

    def _residual_log_prob(self, residual: jax.Array) -> jax.Array:
        """The joint log density of the residuals ``(P, N)``."""
        alpha = solve_triangular(self.scale_tril, residual[..., None], lower=True)[..., 0]
        log_det = jnp.log(jnp.diagonal(self.scale_tril, axis1=-2, axis2=-1)).sum()
        return -0.5 * jnp.sum(alpha**2) - log_det - 0.5 * alpha.size * jnp.log(2 * jnp.pi)


class latent_conditionals(PerRunMessenger):
    """The sparse DGP for MCMC: inducing values latent, layer outputs latent given them.

    Each layer's output becomes a latent site drawn from the sparse conditional
    ``p(f_l | u_l, f_{l-1})``: point by point (``full_cov=False``: the fully independent
    training conditional of FITC, Snelson & Ghahramani 2006, ``prod_n N(f_n | mean_n + K_nm
    K_mm^-1 u, K_nn - Q_nn)``; the DSVI model whose marginals every variational family here
    approximates) or jointly over the points (``full_cov=True``: the exact augmented prior
    ``N(mean + K_nm K_mm^-1 u, K_nn - Q_nn)``, whose integral over ``u`` is the layer's exact
    GP prior). A layer with output noise adds its noise variance to the conditional's
    (``+ noise I``).
    The ``"<name>.u"`` sites stay latent with the model's prior, so NUTS samples
    ``p(u, f_1, ..., f_L | y)`` of the sparse model; the layer values at new inputs follow by
    running the model on them with the sampled ``u`` (see :mod:`numpyro_dgp.diagnostics`).

    Inducing inputs and other ``numpyro.param`` values stay at their values; substitute fitted
    ones with ``numpyro.handlers.substitute`` (inner layers' default k-means runs on the
    propagated values and would otherwise move with the chain's state).

    :param fn: the model.
    :param parameterization: ``"noncentered"`` (default, ``"<name>.f_white"``) or ``"centered"``
        (``"<name>.f"``), as in :class:`exact_layers`.
    :param full_cov: joint conditional over the points instead of point by point.
    :raises ValueError: for an unknown ``parameterization``.
    """

    def __init__(
        self,
        fn: Callable | None = None,
        parameterization: str = "noncentered",
        full_cov: bool = False,
    ) -> None:
        check_choice(parameterization, PARAMETERIZATIONS, "parameterization", "latent_conditionals")
        self.parameterization = parameterization
        self.full_cov = bool(full_cov)
        super().__init__(fn)

    def process_message(self, msg: dict) -> None:
        """Make every layer's output a latent site given its inducing values."""
        if msg["type"] == LAYER_MESSAGE:
            check_layer_supported(msg, "latent_conditionals")
            msg["fn"] = self._conditional

    def _conditional(self, layer: Layer, X: jax.Array, u: jax.Array, **_: Any) -> jax.Array:
        """The layer's value (its message's ``fn``): its output site given ``u``."""
        mean, var = layer_moments(layer, X, u, None, self.full_cov)
        if self.full_cov:
            scale = jittered_cholesky(var, layer.jitter)  # (P, n, n), one per output
        else:
            # the jitter keeps the scale (and its gradient) finite where the conditional
            # variance vanishes (inputs at inducing points)
            scale = jnp.sqrt(jnp.maximum(var, 0.0) + layer.jitter)
        return _layer_output_site(layer.name, mean, scale, self.parameterization)


class collapse_last_layer(PerRunMessenger):
    """Collapse the last GP layer given its inducing values: the likelihood of Havasi et al. (2018).

    Havasi et al. (2018) score the data with ``log N(y | m_L, v_L + s^2)``, where ``m_L, v_L``
    are the last layer's conditional mean and variance given its inducing values ``u_L``
    (and the sampled inner layers), instead of sampling ``f_L ~ p(f_L | u_L, f_{L-1})`` and
    scoring ``log N(y | f_L, s^2)``. Under this handler the collapsed layer's layer message
    returns the conditional mean ``m_L`` (point by point), and the first Normal sample site
    after it (whose location must be that layer's output: ``Normal(f[..., 0], s)`` for a
    one-output layer, or ``Normal(f, s)``) gets the scale ``sqrt(s^2 + v_L)``. Inner layers
    keep their default propagation (sampled given their ``u``, point by point: FITC). After a
    run, :attr:`moments` holds ``(mean (N, P), var (N, P))`` of the collapsed layer (its
    output noise included, if it has any).

    :param fn: the model.
    :param layer: name of the layer to collapse (default: the last ``gp_layer`` the model
        runs, found once by an abstract run of the model and cached).
    :raises ValueError: after a run in which no Normal observation site followed the layer.
    """

    def __init__(self, fn: Callable | None = None, layer: str | None = None) -> None:
        self.layer = layer
        super().__init__(fn)

    def _reset(self) -> None:
        self.moments: tuple[jax.Array, jax.Array] | None = None
        # var (N, P) of the collapsed layer until the observation site
        self._pending: jax.Array | None = None

    def _needs_last_layer(self) -> bool:
        return self.layer is None

    @property
    def target(self) -> str | None:
        """Name of the collapsed layer (``None`` before the first run if no ``layer`` was given)."""
        return self.layer if self.layer is not None else self._last_layer

    def _problem_after_run(self) -> str | None:
        # the layer returned its conditional mean; unless a Normal site absorbed its variance,
        # the run scored the data with that variance silently dropped
        if self._pending is not None:
            return (
                f"collapse_last_layer: no Normal observation site followed layer {self.target!r}, "
                "so its conditional variance was absorbed by none; the collapsed likelihood "
                "(Havasi et al. 2018) needs a Normal observation (Normal(f[..., 0], s)). Sample "
                "the layer instead (no handler)"
            )
        return None

    def process_message(self, msg: dict) -> None:
        """Return the collapsed layer's conditional mean and add its variance to the
        observation site's."""
        if msg["type"] == LAYER_MESSAGE:
            layer, X, u = layer_call(msg)
            if layer.name != self.target:
                return
            check_layer_supported(msg, "collapse_last_layer")
            mean, var = layer_moments(layer, X, u, None, False)
            var = jnp.maximum(var, 0.0)
            self.moments = (mean, var)
            self._pending = var
            msg["value"] = mean
            return
        if msg["type"] != "sample" or self._pending is None:
            return
        base = unwrap_distribution(msg["fn"])
        if isinstance(base, dist.Normal):
            extra = _matched_variance(self._pending, jnp.shape(base.loc))
            shape = msg["fn"].batch_shape + msg["fn"].event_shape
            normal = dist.Normal(base.loc, jnp.sqrt(base.scale**2 + extra))
            replace_observation(msg, normal.expand(shape))
            self._pending = None


def _matched_variance(var: jax.Array, loc_shape: tuple) -> jax.Array:
    """The layer's variance ``var (N, P)`` matched to a Normal's location ``(..., N)``
    (``P = 1``) or ``(..., N, P)``."""
    if var.shape[-1] == 1 and loc_shape[-1:] == var.shape[:1]:
        return var[..., 0]
    if loc_shape[-2:] == var.shape:
        return var
    raise ValueError(
        f"collapse_last_layer: cannot match the layer's variance {var.shape} to the "
        f"observation's location {loc_shape}; the location must be the layer's output "
        "(Normal(f[..., 0], s) for one output, Normal(f, s))"
    )
