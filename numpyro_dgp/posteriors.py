"""The Gaussian structures a guide declares over the layers' inducing values.

A guide tells the objectives (:class:`~numpyro_dgp.DGPElbo`,
:class:`~numpyro_dgp.PredictiveObjective`) and :func:`~numpyro_dgp.predict` which Gaussian it
places over the inducing values, so they can integrate the values out analytically instead
of sampling them:

* an independent Gaussian per layer needs nothing: its site distribution
  (``MultivariateNormal`` or ``Normal`` over ``(P, M)`` values) is read by
  :func:`gaussian_parameters` / :func:`site_gaussian`;
* a guide that correlates layers tags each inducing site with a :class:`ChainLink` (a
  chain ``q(u_1) prod q(u_l | u_{l-1})``) or a :class:`JointBlock` (one Gaussian over
  several sites);
* an amortized guide gives each point's inducing values through an encoder
  (:class:`AmortizedPosterior`);
* branches at learned quadrature points (the ``quadrature`` handler, the amortized guide's
  AR2P rule) register their points and weights with :func:`quadrature_points` and
  :func:`quadrature_log_weights`.

Write a custom guide by emitting these on its sites' ``infer`` dicts (see
:mod:`numpyro_dgp.guides` for the shipped ones).

**References:**

* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

import zlib
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike, DTypeLike

__all__ = [
    "AMORTIZATION_RULES",
    "AmortizedPosterior",
    "ChainLink",
    "JointBlock",
    "LatentPosterior",
    "POINT_BOUND",
    "CholeskyNormal",
    "gaussian_parameters",
    "quadrature_log_weights",
    "quadrature_points",
    "site_gaussian",
]

#: The amortization rules of Meng & Zhang (2024): what a layer's encoder sees and how
#: branches are drawn.
AMORTIZATION_RULES = ("AR1", "AR2", "AR2P")


class AmortizedPosterior(NamedTuple):
    """An amortized guide's ``q(u_n | p_n)`` for one layer with per-point inducing sets.

    :ivar encode: ``p (..., D) -> (loc (..., P, M), scale)`` with ``scale`` ``(..., P, M)``
        standard deviations or ``(..., P, M, M)`` lower factors.
    :ivar rule: ``"AR1"`` (the encoder sees each branch's sample, one inducing set per
        branch), ``"AR2"`` / ``"AR2P"`` (it sees the weighted mean of the previous layer's
        branch means; one set shared by the branches).
    :ivar num_branches: ``S``.
    :ivar points: ``(S, P)`` standard-normal points that draw this layer's branches
        (``"AR2P"``: learned quadrature points), or ``None`` (Monte Carlo).
    :ivar log_weights: ``(S,)`` log branch weights.
    """

    encode: Callable
    rule: str
    num_branches: int
    points: jax.Array | None
    log_weights: jax.Array

    @property
    def mixture(self) -> tuple:
        """``(points, log_weights)``: this layer's outputs branch into a weighted mixture."""
        return self.points, self.log_weights

    @property
    def sees_mixture_mean(self) -> bool:
        """Whether the encoder sees the weighted mean of the previous layer's branch means."""
        return self.rule != "AR1"


class LatentPosterior(NamedTuple):
    """A guide's ``q(w_n) = N(loc_n, diag(scale_n^2))`` of a latent input
    (:func:`~numpyro_dgp.latent_input`), evaluated by the objectives inside the model's run.

    :ivar encode: ``encoder_input (B, E) -> (loc (B, Q), scale (B, Q))`` (per-point parameters
        ignore their argument).
    """

    encode: Callable


class ChainLink(NamedTuple):
    """One factor ``q(u_l | u_parent) = N(mean + C vec(u_parent - parent_mean), D D^T)`` of a
    chain-structured guide, carried in the guide site's ``infer`` (key
    :data:`~numpyro_dgp._protocol.GAUSSIAN`).

    :ivar parent: the parent's u-site name, or ``None`` for the first layer of the chain.
    :ivar mean: ``(P, M)`` marginal mean ``m_l``.
    :ivar scale_tril: ``(P, M, M)`` ``D_l``, one factor per output.
    :ivar parent_mean: ``(P', M')`` ``m_{l-1}`` (``None`` without parent).
    :ivar coupling: ``(P M, P' M')`` ``C_l`` (``None`` without parent).
    """

    parent: str | None
    mean: jax.Array
    scale_tril: jax.Array
    parent_mean: jax.Array | None = None
    coupling: jax.Array | None = None


class JointBlock(NamedTuple):
    """One Gaussian ``N(loc, L L^T)`` over the flattened inducing values of several sites, in order
    (``vec(u)`` output-major), carried in each site's ``infer`` (key
    :data:`~numpyro_dgp._protocol.GAUSSIAN`).

    :ivar sites: u-site names in order.
    :ivar shapes: ``(P, M)`` per site.
    :ivar loc: ``(D,)``, ``D = sum P M``.
    :ivar scale_tril: ``(D, D)`` lower-triangular.
    """

    sites: tuple
    shapes: tuple
    loc: jax.Array
    scale_tril: jax.Array


def unwrap_distribution(fn: dist.Distribution) -> dist.Distribution:
    """The distribution inside ``Independent`` / ``expand`` wrappers.

    :param fn: a distribution, possibly wrapped.
    :return: the innermost distribution that is neither ``Independent`` nor expanded.
    """
    while isinstance(fn, (dist.Independent, dist.ExpandedDistribution)):
        fn = fn.base_dist
    return fn


class CholeskyNormal(dist.TransformedDistribution):
    """``N(loc, L L^T)`` over the last axis, drawn as ``loc + L z`` with ``z ~ N(0, I)``.

    The same draws as ``MultivariateNormal(loc, scale_tril=L)`` for the same key, but its
    log-density at a draw is computed from the stored ``z`` (``log N(z | 0, I) - log|L|``),
    without solving against ``L``. NumPyro's ``Trace_ELBO`` scores guide sites that way; a
    solve against a near-singular ``L`` (a near-deterministic inner layer, started at
    ``1e-5`` times its prior) loses every digit and returns log-densities of ``1e268``.
    Scoring a value that was not drawn by it (no intermediates) solves as
    ``MultivariateNormal`` does.

    :param loc: ``(..., M)`` means.
    :param scale_tril: ``(..., M, M)`` lower Cholesky factors.
    """

    def __init__(
        self, loc: ArrayLike, scale_tril: ArrayLike, *, validate_args: bool | None = None
    ) -> None:
        loc, scale_tril = jnp.asarray(loc), jnp.asarray(scale_tril)
        shape = jnp.broadcast_shapes(loc.shape, scale_tril.shape[:-1])
        self.loc = jnp.broadcast_to(loc, shape)
        self.scale_tril = scale_tril
        # the standard normal by construction: nothing to validate
        standard = jnp.zeros(shape, loc.dtype), jnp.ones(shape, loc.dtype)
        base = dist.Normal(*standard, validate_args=False).to_event(1)
        super().__init__(
            base,
            dist.transforms.LowerCholeskyAffine(self.loc, scale_tril),
            validate_args=validate_args,
        )

    @property
    def mean(self) -> jax.Array:
        """The mean ``loc``."""
        return self.loc

    @property
    def variance(self) -> jax.Array:
        """The marginal variances ``diag(L L^T)``."""
        return jnp.sum(self.scale_tril**2, axis=-1)


def gaussian_parameters(
    fn: dist.Distribution, shape: tuple[int, int]
) -> tuple[jax.Array, jax.Array] | None:
    """``(loc, scale)`` of a Gaussian site distribution over values of ``shape = (P, M)``.

    :param fn: the site distribution (``Independent`` / ``expand`` wrappers are looked through).
    :param shape: ``(P, M)``, the shape of the site's values.
    :return: ``(loc (P, M), scale)`` with ``scale`` ``(P, M, M)`` lower triangular for a
        multivariate normal over the last axis or ``(P, M)`` standard deviations for
        independent normals; ``None`` if ``fn`` is not Gaussian in that sense (e.g. a
        ``Delta``).
    """
    base = unwrap_distribution(fn)
    P, M = shape
    if isinstance(base, (CholeskyNormal, dist.MultivariateNormal)):
        if base.event_shape != (M,):
            return None
        return jnp.broadcast_to(base.loc, shape), jnp.broadcast_to(base.scale_tril, (P, M, M))
    if isinstance(base, dist.Normal):
        return jnp.broadcast_to(base.loc, shape), jnp.broadcast_to(base.scale, shape)
    return None


def site_gaussian(
    name: str, fn: dist.Distribution, shape: tuple[int, int]
) -> tuple[jax.Array, jax.Array] | JointBlock | None:
    """A site distribution's Gaussian over its ``(P, M)`` inducing values.

    :param name: the site's name (recorded in a :class:`JointBlock`).
    :param fn: the site distribution.
    :param shape: ``(P, M)``, the shape of the site's values.
    :return: :func:`gaussian_parameters`' ``(loc, scale)``, or a one-site :class:`JointBlock`
        when ``fn`` is a multivariate normal over all ``P M`` values reshaped to ``(P, M)``
        (outputs correlated); ``None`` otherwise.
    """
    params = gaussian_parameters(fn, shape)
    if params is not None:
        return params
    base = unwrap_distribution(fn)
    P, M = shape
    if (
        isinstance(base, dist.TransformedDistribution)
        and len(base.transforms) == 1
        and isinstance(base.transforms[0], dist.transforms.ReshapeTransform)
        and isinstance(base.base_dist, dist.MultivariateNormal)
        and base.base_dist.event_shape == (P * M,)
        and base.base_dist.batch_shape == ()
    ):
        return JointBlock((name,), (tuple(shape),), base.base_dist.loc, base.base_dist.scale_tril)
    return None


def check_weights(weights: ArrayLike | None, num_points: int, caller: str) -> np.ndarray:
    """``num_points`` starting weights summing to one: ``weights`` normalized (default uniform).

    :raises ValueError: unless ``weights`` are ``num_points`` positive numbers.
    """
    if weights is None:
        weights = np.full(num_points, 1.0 / num_points)
    weights = np.asarray(weights, float)
    if weights.shape != (num_points,) or np.any(weights <= 0):
        raise ValueError(
            f"{caller}: weights must be {num_points} positive numbers, got {weights!r}"
        )
    return weights / weights.sum()


def check_points(
    points: dict | ArrayLike | None,
    layer: str,
    num_points: int,
    out_dim: int,
    caller: str,
    dtype: DTypeLike | None = None,
) -> jax.Array:
    """A layer's ``(S, P)`` starting points: ``points[layer]`` of a dict, else ``points`` for
    every layer (``(S,)``: each output the same), or standard-normal draws keyed by the layer's
    name where none are given.

    :raises ValueError: for points of another shape.
    """
    if isinstance(points, dict):
        points = points.get(layer)
    if points is None:
        key = jax.random.PRNGKey(zlib.crc32(layer.encode()))
        return jax.random.normal(key, (num_points, out_dim), dtype or float)
    points = jnp.asarray(points, dtype)
    if points.ndim == 1:
        points = jnp.broadcast_to(points[:, None], (num_points, out_dim))
    if points.shape != (num_points, out_dim):
        raise ValueError(
            f"{caller}: points for layer {layer!r} must have shape ({num_points}, {out_dim}), "
            f"got {points.shape}"
        )
    return points


#: learned points live in (-POINT_BOUND, POINT_BOUND) (a scaled sigmoid, as in Meng & Zhang 2024)
POINT_BOUND = 5.0


def quadrature_points(name: str, init: ArrayLike, learnable: bool = True) -> jax.Array:
    """Learnable branch points bounded to ``(-5, 5)`` by a scaled sigmoid.

    The points are ``xi = 10 sigmoid(a) - 5`` with ``a`` the ``numpyro.param`` ``name``.

    :param name: the parameter's name.
    :param init: ``(S, P)`` initial points (clipped into the box).
    :param learnable: register the parameter; otherwise return ``init`` as it is.
    :return: ``(S, P)`` points.
    """
    init = jnp.asarray(init)
    if not learnable:
        return init
    inner = jnp.clip((init + POINT_BOUND) / (2 * POINT_BOUND), 1e-6, 1 - 1e-6)
    raw = numpyro.param(name, jnp.log(inner) - jnp.log1p(-inner))
    return 2 * POINT_BOUND * jax.nn.sigmoid(raw) - POINT_BOUND


def quadrature_log_weights(name: str, init: ArrayLike, learnable: bool = True) -> jax.Array:
    """Learnable log branch weights ``log softmax(logits)``.

    :param name: the name of the ``numpyro.param`` holding ``logits``.
    :param init: ``(S,)`` initial weights (``logits`` start at ``log init``).
    :param learnable: register the parameter; otherwise the weights stay at ``init``
        (normalized).
    :return: ``(S,)`` log weights.
    """
    logits = jnp.log(jnp.asarray(init))
    if learnable:
        logits = numpyro.param(name, logits)
    return jax.nn.log_softmax(logits)
