"""k-means for inducing-input initialization (pure JAX, runs on traced or concrete data)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


def _kmeanspp_start(rng_key: jax.Array, X: jax.Array, num_clusters: int) -> jax.Array:
    """k-means++ seeding: ``num_clusters`` distinct data points, each drawn with probability
    proportional to its squared distance from the points already chosen.

    A uniform draw often puts two starting points in one cluster, and Lloyd's iterations
    then stay in that local optimum (on three well-separated blobs, about 40% of keys).
    """
    N = X.shape[0]
    first_key, rest_key = jax.random.split(rng_key)
    first = jax.random.randint(first_key, (), 0, N)
    chosen = jnp.zeros((N,), bool).at[first].set(True)
    d2 = jnp.sum((X - X[first]) ** 2, -1)
    idx = jnp.zeros((num_clusters,), first.dtype).at[0].set(first)

    def body(i, carry):
        idx, chosen, d2 = carry
        key = jax.random.fold_in(rest_key, i)
        d2 = jnp.where(chosen, 0.0, d2)
        # D^2 sampling among unchosen points; if every unchosen point duplicates a chosen
        # one (all d2 == 0), draw uniformly among the unchosen points instead.
        weights = jnp.where(jnp.any(d2 > 0), d2, jnp.where(chosen, 0.0, 1.0))
        # a clamp, not a stand-in value: both masks may not see the same rounding under jit
        logits = jnp.where(
            weights > 0, jnp.log(jnp.maximum(weights, jnp.finfo(weights.dtype).tiny)), -jnp.inf
        )
        new = jax.random.categorical(key, logits).astype(idx.dtype)
        chosen = chosen.at[new].set(True)
        d2 = jnp.minimum(d2, jnp.sum((X - X[new]) ** 2, -1))
        return idx.at[i].set(new), chosen, d2

    idx, _, _ = jax.lax.fori_loop(1, num_clusters, body, (idx, chosen, d2))
    return X[idx]


#: the most points k-means runs on; larger data are subsampled (uniformly, without replacement)
MAX_KMEANS_POINTS = 100_000


def kmeans(
    rng_key: jax.Array,
    X: ArrayLike,
    num_clusters: int,
    num_iters: int = 25,
    max_points: int | None = MAX_KMEANS_POINTS,
) -> jax.Array:
    """Lloyd's algorithm started from ``num_clusters`` distinct data points (k-means++
    seeding), on at most ``max_points`` points.

    With more than ``max_points`` points, k-means runs on a uniform subsample of
    ``max_points`` of them (drawn with ``rng_key``), so initialization on a large data set
    costs ``O(max_points M D)`` per iteration, not ``O(N M D)``.

    :param rng_key: PRNG key choosing the subsample and the starting points.
    :param X: ``(N, D)`` data.
    :param num_clusters: number of centers ``M`` (``<= N``).
    :param num_iters: Lloyd iterations.
    :param max_points: the subsample bound (default :data:`MAX_KMEANS_POINTS` = 100,000;
        ``None``: every point).
    :return: ``(M, D)`` centers; an empty cluster keeps its previous center.
    :raises ValueError: if ``num_clusters`` exceeds the number of points ``N`` (keep it at most
        ``max_points`` too).
    """
    N = jnp.shape(X)[0]
    if num_clusters > N:
        raise ValueError(
            f"num_inducing={num_clusters} exceeds the {N} points available to initialize "
            "the inducing inputs by k-means; lower num_inducing or pass inducing_inputs="
        )
    if max_points is not None and N > max_points:
        # drawn once, at initialization; the Lloyd iterations then cost O(max_points M D)
        subsample_key = jax.random.fold_in(rng_key, 0x5AB)
        keep = jax.random.choice(subsample_key, N, (int(max_points),), replace=False)
        X = jnp.asarray(X)[keep]
    return _kmeans(rng_key, X, int(num_clusters), int(num_iters))


@partial(jax.jit, static_argnums=(2, 3))
def _kmeans(rng_key, X, num_clusters, num_iters):
    # jitted: run eagerly (at model initialization) the loops would be re-traced op by op
    centers = _kmeanspp_start(rng_key, X, num_clusters)

    def step(centers, _):
        d2 = jnp.sum(X**2, -1)[:, None] + jnp.sum(centers**2, -1)[None, :] - 2 * X @ centers.T
        assign = jax.nn.one_hot(jnp.argmin(d2, axis=1), num_clusters, dtype=X.dtype)  # (N, M)
        counts = assign.sum(0)
        sums = assign.T @ X
        new = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1)[:, None], centers)
        return new, None

    centers, _ = jax.lax.scan(step, centers, None, length=num_iters)
    return centers
