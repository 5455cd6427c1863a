"""Quantiles of a prediction's mixture: bisection on the distribution function of a continuous
mixture, and the first count reaching each level for counts."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = ["predictive_quantiles"]


def predictive_quantiles(
    prediction: Any, quantiles: ArrayLike, *, num_iters: int = 60
) -> jax.Array:
    """Quantiles of a regression prediction's mixture (a :class:`~numpyro_dgp.Prediction` with a
    Normal or any other likelihood of a number), per point: by bisection on the mixture's
    distribution function, or, for counts, the smallest count whose probability of not being
    exceeded reaches the level (from the distribution function accumulated over the counts up
    to the largest mean plus 12 standard deviations, at most 10^6; NaN where that does not
    reach the level).

    :param prediction: the prediction.
    :param quantiles: ``(Q,)`` levels in ``(0, 1)``, e.g. ``[0.025, 0.975]``.
    :param num_iters: bisection steps (60 halve the starting bracket to below float64's
        resolution).
    :return: ``(Q, N)`` quantiles (``(Q, N, T)`` for ``T`` target columns).
    :raises ValueError: a classification prediction, or levels outside ``(0, 1)``.
    """
    levels = _check_quantile_request(prediction, quantiles)
    q = jnp.asarray(levels, prediction.mean.dtype)
    arrays = {
        k: getattr(prediction, k)
        for k in ("component_means", "component_variances", "weights", "atoms", "atom_weights")
    }
    if prediction.atoms is not None and bool(prediction.atoms.support.is_discrete):
        spread = np.sqrt(np.maximum(np.asarray(prediction.variance), 0.0))
        largest = (
            int(
                np.nanmax(
                    np.where(np.isfinite(spread), np.asarray(prediction.mean) + 12 * spread, 0.0)
                )
            )
            + 10
        )
        return _count_quantiles(q, arrays, min(largest, 1_000_000))
    return _bisect_quantiles(q, arrays, int(num_iters))


def _check_quantile_request(prediction: Any, quantiles: ArrayLike) -> np.ndarray:
    """The levels ``(Q,)`` as float64, checked to lie in ``(0, 1)`` for a regression prediction.

    :raises ValueError: a classification prediction, or levels outside ``(0, 1)``.
    """
    if prediction.likelihood not in ("normal", "general"):
        raise ValueError(
            "predictive_quantiles: needs a regression prediction (Normal or another likelihood of "
            f"a number), got likelihood {prediction.likelihood!r}"
        )
    levels = np.atleast_1d(np.asarray(quantiles, np.float64))
    if not np.all((levels > 0) & (levels < 1)):
        raise ValueError(f"predictive_quantiles: quantiles must lie in (0, 1), got {quantiles!r}")
    return levels


def _component_weights(arrays: dict) -> jax.Array:
    """``(S, K)`` weights of every atom (``(S, 1)`` for Gaussian components)."""
    m = arrays["component_means"]
    w = (
        jnp.full((m.shape[0],), 1.0 / m.shape[0], m.dtype)
        if arrays["weights"] is None
        else arrays["weights"]
    )
    return w[:, None] * (
        arrays["atom_weights"][None] if arrays["atoms"] is not None else jnp.ones((1,), m.dtype)
    )


# One program per shape: eagerly, every operation of the loops would compile on its own.
@partial(jax.jit, static_argnums=2)
def _bisect_quantiles(q: jax.Array, arrays: dict, num_iters: int) -> jax.Array:
    """Bisection on the mixture's distribution function, from a bracket around the components
    widened until it holds every level (heavy tails)."""
    from jax.scipy.stats import norm

    m, v = arrays["component_means"], arrays["component_variances"]
    weights = _component_weights(arrays).reshape(
        (m.shape[0], -1) + (1,) * (m.ndim - 1)
    )  # (S, K, N...)
    if arrays["atoms"] is None:
        s = jnp.sqrt(jnp.maximum(v, jnp.finfo(v.dtype).tiny))
        cdf_at = lambda x: (  # noqa: E731
            norm.cdf((x[:, None, None] - m[None, :, None]) / s[None, :, None])
        )
    else:
        cdf_at = lambda x: arrays["atoms"].cdf(x[:, None, None])  # noqa: E731

    def cdf(x):  # (Q, N...) -> (Q, N...)
        return jnp.sum(weights[None] * cdf_at(x), axis=(1, 2))

    q_full = q.reshape((-1,) + (1,) * (m.ndim - 1))
    spread = jnp.sqrt(jnp.maximum(v, jnp.finfo(v.dtype).tiny))
    spread = jnp.where(jnp.isfinite(spread), spread, 1.0)
    z = jnp.max(jnp.abs(norm.ppf(q))) + 1
    lo = jnp.broadcast_to(jnp.min(m - z * spread, axis=0), q.shape + m.shape[1:])
    hi = jnp.broadcast_to(jnp.max(m + z * spread, axis=0), lo.shape)

    def unbracketed(state):
        lo, hi, count = state
        return (count < 64) & (jnp.any(cdf(lo) >= q_full) | jnp.any(cdf(hi) < q_full))

    def widen(state):
        lo, hi, count = state
        width = hi - lo + 1.0
        return (
            jnp.where(cdf(lo) < q_full, lo, lo - width),
            jnp.where(cdf(hi) >= q_full, hi, hi + width),
            count + 1,
        )

    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < q_full
        return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

    lo, hi, _ = jax.lax.while_loop(unbracketed, widen, (lo, hi, 0))
    lo, hi = jax.lax.fori_loop(0, num_iters, halve, (lo, hi))
    return 0.5 * (lo + hi)


#: entries of the probability table of one block of counts (counts x components x atoms)
_COUNT_TABLE_ENTRIES = 1 << 22


@partial(jax.jit, static_argnums=2)
def _count_quantiles(q: jax.Array, arrays: dict, largest: int) -> jax.Array:
    """Quantiles of a mixture of count distributions: its distribution function accumulated
    over blocks of the counts ``0 .. largest`` (a table of at most :data:`_COUNT_TABLE_ENTRIES`
    at a time), point by point, and the first count that reaches each level (NaN for a level
    the counts up to ``largest`` do not reach)."""
    from numpyro_dgp._predict.mixture import rebuild

    atoms = arrays["atoms"]
    weights = _component_weights(arrays)  # (S, K)
    S, K = weights.shape
    points = arrays["component_means"].shape[1:]
    block = max(1, min(largest + 1, _COUNT_TABLE_ENTRIES // (S * K)))
    starts = jnp.arange(0, largest + 1, block)
    levels = q * (1 - 1e-12)

    def at_point(index):  # the atoms of one point (of one column): (S, K)
        point = rebuild(atoms, lambda a: a.reshape(S, K, -1)[:, :, index])

        def accumulate(carry, start):
            below, found = (
                carry  # the distribution function before this block; counts found (-1: not yet)
            )
            counts = (start + jnp.arange(block)).astype(q.dtype)
            pmf = jnp.exp(point.log_prob(counts[:, None, None]))  # (block, S, K)
            cdf = below + jnp.cumsum(jnp.sum(pmf * weights[None], axis=(1, 2)))
            first = jnp.searchsorted(
                cdf, levels
            )  # the smallest count in the block with cdf >= q, or block
            found = jnp.where((found < 0) & (first < block), start + first, found)
            return (cdf[-1], found), None

        (_, found), _ = jax.lax.scan(
            accumulate, (jnp.zeros((), q.dtype), jnp.full(q.shape, -1)), starts
        )
        return jnp.where(found < 0, jnp.nan, found.astype(q.dtype))

    per_point = jax.lax.map(at_point, jnp.arange(int(np.prod(points))))  # (N T, Q)
    return per_point.T.reshape(q.shape + points)
