"""Vecchia approximation of a Gaussian process prior (pure JAX).

A joint Gaussian ``N(mean, K)`` over ``n`` ordered points is replaced by the product of the
conditionals of each point given at most ``m`` of the points before it (its *neighbours*):
``p(f) ~ prod_k p(f_k | f_{S(k)})`` (Vecchia 1988; for GPs and DGPs Katzfuss & Guinness
2021, Sauer, Cooper & Gramacy 2023). Each conditional is
``f_k = mean_k + b_k^T (f_S - mean_S) + d_k eps_k`` with ``eps_k ~ N(0, 1)``: the coefficients
``b_k (m,)`` and the conditional standard deviation ``d_k`` come from one Cholesky factor of
the ``(m + 1, m + 1)`` covariance of the neighbours and the point, so the whole prior costs
``O(n m^3)`` and its log density ``O(n m)`` more. With ``S(k)`` every earlier point it is the
exact joint density, in any order.

Points are handled in the order the caller gives (``points[k]`` conditions on rows ``< k``);
neighbour sets are padded to ``m`` with a mask, and a masked neighbour enters the factor as an
independent unit-variance stand-in that is uncorrelated with the point, so it changes nothing.

**References:**

* Vecchia (1988). Estimation and model identification for continuous spatial processes.
  Journal of the Royal Statistical Society B.
* Katzfuss, Guinness (2021). A general framework for Vecchia approximations of Gaussian
  processes. Statistical Science.
* Sauer, Cooper, Gramacy (2023). Vecchia-approximated deep Gaussian processes for computer
  experiments. Journal of Computational and Graphical Statistics.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike

from numpyro_dgp.core._triangular import cholesky


class VecchiaFactors(NamedTuple):
    """The conditionals ``f_k = mean_k + coef_k^T (f_S(k) - mean_S(k)) + scale_k eps_k``.

    :ivar neighbors: ``(n, m)`` int32 indices of each point's neighbours (all ``< k`` where
        ``mask`` holds; 0 where it does not).
    :ivar mask: ``(n, m)`` bool, which entries of ``neighbors`` are real.
    :ivar coef: ``(..., n, m)`` regression coefficients on the neighbours (0 where masked).
    :ivar scale: ``(..., n)`` conditional standard deviations.
    """

    neighbors: jax.Array
    mask: jax.Array
    coef: jax.Array
    scale: jax.Array


def nearest_previous_neighbors(
    points: ArrayLike, num_neighbors: int, block_size: int = 512
) -> tuple[jax.Array, jax.Array]:
    """Each point's ``num_neighbors`` nearest (Euclidean) among the points before it.

    ``O(n^2 D)`` time in blocks of ``block_size`` rows (``O(block_size n)`` memory).

    :param points: ``(n, D)`` points in their order.
    :param num_neighbors: ``m``, at least 1.
    :param block_size: rows per block of the distance computation.
    :return: ``(neighbors (n, m) int32, mask (n, m) bool)``, nearest first; row ``k`` has
        ``min(m, k)`` real entries.
    """
    points = jnp.asarray(points)
    # centred: |a|^2 + |b|^2 - 2 a.b loses the digits the points share (float32 far from 0)
    points = points - jnp.mean(points, axis=0)
    n = points.shape[0]
    m = int(num_neighbors)
    num_blocks = max(1, math.ceil(n / block_size))
    pad = num_blocks * block_size - n
    rows = jnp.pad(jnp.arange(n), (0, pad)).reshape(num_blocks, block_size)
    sq_norms = jnp.sum(points**2, axis=-1)
    k = min(m, n)

    def block(idx: jax.Array) -> tuple[jax.Array, jax.Array]:
        P = points[idx]
        sq = sq_norms[idx][:, None] + sq_norms[None, :] - 2.0 * P @ points.T
        allowed = jnp.arange(n)[None, :] < idx[:, None]  # earlier rows only
        neg, nbr = jax.lax.top_k(jnp.where(allowed, -sq, -jnp.inf), k)
        return nbr.astype(jnp.int32), jnp.isfinite(neg)

    neighbors, mask = jax.lax.map(block, rows)
    neighbors, mask = neighbors.reshape(-1, k)[:n], mask.reshape(-1, k)[:n]
    neighbors = jnp.where(mask, neighbors, 0)
    if k < m:  # fewer points than neighbours asked for
        neighbors = jnp.pad(neighbors, ((0, 0), (0, m - k)))
        mask = jnp.pad(mask, ((0, 0), (0, m - k)))
    return neighbors, mask


def vecchia_factors(
    gram: Callable[[jax.Array], jax.Array],
    points: ArrayLike,
    neighbors: ArrayLike,
    mask: ArrayLike,
    diag: ArrayLike,
) -> VecchiaFactors:
    """The Vecchia conditionals of ``N(mean, K + diag(diag))``, ``K = gram(points)``.

    One ``(m + 1, m + 1)`` Cholesky factor per point, ``O(n m^3)``; nothing ``n x n`` is formed.

    :param gram: ``X (k, D) -> K(X, X) (k, k)``, e.g. a kernel.
    :param points: ``(n, D)`` points in their order.
    :param neighbors: ``(n, m)`` indices from :func:`nearest_previous_neighbors` (or any sets
        of earlier points).
    :param mask: ``(n, m)`` bool, the real entries of ``neighbors``.
    :param diag: ``(n,)`` values added to the covariance's diagonal at each point (jitter,
        noise variances); ``(..., n)`` gives one set of factors per leading index.
    :return: the :class:`VecchiaFactors`, ``coef (..., n, m)``, ``scale (..., n)``.
    """
    points, neighbors, mask = jnp.asarray(points), jnp.asarray(neighbors), jnp.asarray(mask)
    diag = jnp.asarray(diag, points.dtype)
    m = neighbors.shape[-1]
    local = jnp.concatenate([neighbors, jnp.arange(points.shape[0])[:, None]], axis=1)
    real = jnp.concatenate([mask, jnp.ones_like(mask[:, :1])], axis=1)  # (n, m + 1)
    K = jax.vmap(gram)(points[local])  # (n, m + 1, m + 1), the point last
    pair = real[:, :, None] & real[:, None, :]
    eye = jnp.eye(m + 1, dtype=K.dtype)
    # a masked neighbour: unit variance, uncorrelated with the rest
    K = jnp.where(pair, K, 0.0) + jnp.where(real, diag[..., local], 1.0)[..., None] * eye
    L = cholesky(K)  # (..., n, m + 1, m + 1)
    # f_k = mean_k + l^T z_S + d eps with z_S = L_SS^{-1} (f_S - mean_S): coef = L_SS^{-T} l
    coef = solve_triangular(L[..., :m, :m], L[..., m, :m, None], lower=True, trans="T")[..., 0]
    return VecchiaFactors(neighbors, mask, jnp.where(mask, coef, 0.0), L[..., m, m])


def vecchia_log_density(factors: VecchiaFactors, residual: ArrayLike) -> jax.Array:
    """``log p(f)`` under the Vecchia conditionals, ``residual = f - mean``: ``O(n m)``.

    :param factors: from :func:`vecchia_factors` (``coef (..., n, m)``).
    :param residual: ``(..., n)`` values minus the prior mean, in the points' order.
    :return: ``(...)`` log densities.
    """
    residual = jnp.asarray(residual)
    predicted = jnp.sum(factors.coef * residual[..., factors.neighbors], axis=-1)
    z = (residual - predicted) / factors.scale
    return jnp.sum(-0.5 * z**2 - jnp.log(factors.scale) - 0.5 * math.log(2 * math.pi), axis=-1)


def vecchia_sample(
    factors: VecchiaFactors, eps: ArrayLike, given: ArrayLike | None = None
) -> jax.Array:
    """The residual ``f - mean`` whose standardized conditionals are ``eps``: ``f_k - mean_k =
    coef_k^T (f_S - mean_S) + scale_k eps_k``, point after point (a sequential scan, ``O(n m)``).

    The map ``eps -> f`` is the non-centered parameterization of the Vecchia prior (its
    Jacobian is triangular with diagonal ``scale``). With ``given``, the first points' residuals
    are held at those values and the rest drawn from their Vecchia conditional given them.
    Reverse-mode derivatives cost ``O(n m)`` too: one backward pass through the same sparse
    triangular system (forward-mode derivatives, e.g. ``jax.jvp``, are not defined).

    :param factors: from :func:`vecchia_factors`, ``coef (P, n, m)`` (or ``(n, m)``, shared).
    :param eps: ``(P, n - n0)`` standard normals of the points drawn.
    :param given: ``(P, n0)`` residuals of the first ``n0`` points (default: none).
    :return: ``(P, n)`` residuals of all points.
    """
    eps = jnp.asarray(eps)
    P = eps.shape[0]
    given = jnp.zeros((P, 0), eps.dtype) if given is None else jnp.asarray(given, eps.dtype)
    n = given.shape[-1] + eps.shape[-1]
    coef = jnp.broadcast_to(factors.coef, (P, n) + factors.coef.shape[-1:])
    scale = jnp.broadcast_to(factors.scale, (P, n))
    return _solve(factors.neighbors, coef, scale, eps, given)


@jax.custom_vjp
def _solve(
    neighbors: jax.Array, coef: jax.Array, scale: jax.Array, eps: jax.Array, given: jax.Array
) -> jax.Array:
    """The sequential pass of :func:`vecchia_sample` (all arguments broadcast)."""
    start = given.shape[-1]
    residual = jnp.concatenate([given, jnp.zeros_like(eps)], axis=-1)

    def step(residual: jax.Array, k: jax.Array) -> tuple[jax.Array, None]:
        nbr = residual[:, neighbors[k]]  # (P, m)
        value = jnp.sum(coef[:, k] * nbr, axis=-1) + scale[:, k] * eps[:, k - start]
        return residual.at[:, k].set(value.astype(residual.dtype)), None

    return jax.lax.scan(step, residual, jnp.arange(start, residual.shape[-1]))[0]


def _solve_forward(*args: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    residual = _solve(*args)
    return residual, args + (residual,)


def _solve_backward(
    saved: tuple[jax.Array, ...], cotangent: jax.Array
) -> tuple[None, jax.Array, jax.Array, jax.Array, jax.Array]:
    # r = (I - B)^{-1} (scale eps) with B strictly lower triangular (the coefficients): the
    # cotangent of (scale eps) is g = (I - B)^{-T} cotangent, solved last point first, each
    # point's g_k pushed onto its neighbours, O(n m). (Autodiff of the forward scan copies the
    # n-long state at every step, O(n^2); so would this loop if the value pushed were read from
    # the state being updated, hence g_{k-1} is read after step k and carried.)
    neighbors, coef, scale, eps, given, residual = saved
    start = given.shape[-1]

    def step(carry: tuple[jax.Array, jax.Array], k: jax.Array) -> tuple[tuple, jax.Array]:
        acc, g = carry
        acc = acc.at[:, neighbors[k]].add((coef[:, k] * g[:, None]).astype(acc.dtype))
        return (acc, acc[:, k - 1]), g

    ks = jnp.arange(start, residual.shape[-1])
    last = cotangent[:, -1:].sum(-1)  # the last point's g (zeros when there are no points)
    (acc, _), g = jax.lax.scan(step, (cotangent, last), ks, reverse=True)
    g = g.T  # (P, n - n0), the drawn points
    pad = ((0, 0), (start, 0))
    # a padded entry of point 0 names point 0 itself, which the forward pass read as 0
    earlier = neighbors[start:] < ks[:, None]
    d_coef = jnp.where(earlier, g[:, :, None] * residual[:, neighbors[start:]], 0.0)
    return (
        None,
        jnp.pad(d_coef, pad + ((0, 0),)).astype(coef.dtype),
        jnp.pad(g * eps, pad).astype(scale.dtype),
        (g * scale[:, start:]).astype(eps.dtype),
        acc[:, :start].astype(given.dtype),
    )


_solve.defvjp(_solve_forward, _solve_backward)
