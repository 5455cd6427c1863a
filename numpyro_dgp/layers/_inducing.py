"""A layer's inducing part: the inducing inputs' parameter, the factor of ``K(Z, Z)`` and its
inverse, and the prior of the inducing values."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_dgp.core import (
    cholesky,
    cholesky_and_inverse,
    default_jitter,
    inverse_cholesky,
    kmeans,
)
from numpyro_dgp.kernels import Kernel
from numpyro_dgp.layers._parts import LayerArgs

__all__ = [
    "inducing_factor",
    "inducing_inputs_site",
    "inducing_prior",
    "kmeans_inducing_inputs",
    "mean_diagonal",
    "points_and_gaussian_draws",
]


def inducing_inputs_site(
    name: str, args: LayerArgs, num_inducing: int | None, learn_inducing: bool
) -> jax.Array:
    """The layer's inducing inputs: the propagated locations, or a parameter initialized from the
    given inputs or by k-means on ``X``."""
    if args.propagated_Z is not None:
        return args.propagated_Z
    init: jax.Array | Callable[[jax.Array], jax.Array]
    if args.inducing_inputs is not None:
        init = args.inducing_inputs
    else:
        assert num_inducing is not None  # check_layer_args: given when inducing_inputs is not
        X, M = args.X, int(num_inducing)
        init = lambda _: kmeans_inducing_inputs(X, M)  # noqa: E731
    Z = numpyro.param(f"{name}.inducing_inputs", init)
    if jnp.ndim(Z) != 2 or jnp.shape(Z)[-1] != args.X.shape[-1]:  # fitted values given to a run
        raise ValueError(
            f"gp_layer {name!r}: its inputs have {args.X.shape[-1]} columns, its inducing_inputs "
            f"have shape {jnp.shape(Z)}: inputs with another number of columns than the layer "
            "was fitted on (for the first layer, X_new must have the training inputs' columns)"
        )
    return Z if learn_inducing else jax.lax.stop_gradient(Z)


def kmeans_inducing_inputs(X: jax.Array, num_inducing: int) -> jax.Array:
    """k-means centers of the rows of ``X`` (leading axes flattened) as inducing inputs.

    A fixed key: the same data give the same inducing inputs in every run of the model (a
    guide's prototype run and SVI's initial run must agree, e.g. for inducing locations). With
    fewer rows than ``num_inducing`` (a minibatch
    smaller than ``M``, which is all a layer sees at initialization) k-means cannot give
    ``M`` distinct centers: :func:`points_and_gaussian_draws` instead."""
    points = jax.lax.stop_gradient(X.reshape(-1, X.shape[-1]))
    if points.shape[0] < num_inducing:
        return points_and_gaussian_draws(points, num_inducing)
    return kmeans(jax.random.PRNGKey(0), points, num_inducing)


def points_and_gaussian_draws(points: jax.Array, num_inducing: int) -> jax.Array:
    """``(M, D)`` inducing inputs from ``n < M`` points: the ``n`` points, then ``M - n`` draws
    (fixed key) from the Gaussian with their mean and covariance.

    The draws cover the region the points span, and with probability one no two inducing
    inputs coincide (``K(Z, Z)`` stays invertible). The covariance gets a ridge of
    :func:`~numpyro_dgp.core.default_jitter` times its mean variance (fewer points than
    dimensions leave it singular, and its round-off in float32 can make it indefinite);
    identical points (or one) give a unit covariance.

    :param points: ``(n, D)``.
    :param num_inducing: ``M > n``.
    :return: ``(M, D)``, the points first.
    """
    n, D = points.shape
    mean = points.mean(0)
    centered = points - mean
    cov = centered.T @ centered / max(n - 1, 1)
    scale = jnp.trace(cov) / D
    identity = jnp.eye(D, dtype=points.dtype)
    ridge = default_jitter(points.dtype) * scale
    cov = jnp.where(scale > 0, cov + ridge * identity, identity)
    eps = jax.random.normal(jax.random.PRNGKey(0), (num_inducing - n, D), points.dtype)
    return jnp.concatenate([points, mean + eps @ jnp.linalg.cholesky(cov).T])


def inducing_factor(
    kernel: Kernel, Z: jax.Array, jitter: float, reads_factor: bool = True
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The jittered Cholesky factor ``L`` of ``K(Z, Z)``, its inverse and the jitter it used.

    ``reads_factor``: the caller's step reads ``L`` as well as ``L^{-1}`` (a non-whitened
    layer's prior, inducing locations), and the two are differentiated together
    (:func:`~numpyro_dgp.core.cholesky_and_inverse`); ``False``: a whitened layer's step reads
    ``L^{-1}`` alone, whose own rule (:func:`~numpyro_dgp.core.inverse_cholesky`) is cheaper."""
    # A failed factorization gives NaN, which fit() detects (skips and counts the step);
    # a lax.cond retry here would triple the compile time of every layer.
    Kmm = kernel(Z)
    # Relative to the prior variance, as for per-point sets: a classifier's output layer grows
    # its kernel variance to ~100, and a fixed 1e-4 then falls below float32 round-off.
    absolute = jitter * mean_diagonal(Kmm)
    jittered = Kmm + absolute * jnp.eye(Kmm.shape[-1], dtype=Kmm.dtype)
    if reads_factor:
        return *cholesky_and_inverse(jittered), absolute
    # L's own rule applies only where a step reads L after all (XLA drops it otherwise)
    return cholesky(jittered), inverse_cholesky(jittered), absolute


def inducing_prior(
    Kmm_chol: jax.Array,
    prior_mean: jax.Array,
    out_dim: int,
    whiten: bool,
    locations: bool,
    dtype: np.dtype,
) -> dist.Distribution:
    """``p(u)`` per output: N(mean(Z), K) for locations, else N(0, I) whitened or N(0, K)."""
    if locations:
        return dist.MultivariateNormal(prior_mean, scale_tril=Kmm_chol)
    M = Kmm_chol.shape[-1]
    zeros, eye = jnp.zeros(M, dtype), jnp.eye(M, dtype=dtype)
    if whiten:
        # the standard normal by construction: nothing to validate
        prior = dist.MultivariateNormal(zeros, scale_tril=eye, validate_args=False)
    else:
        prior = dist.MultivariateNormal(zeros, scale_tril=Kmm_chol)
    return prior.expand([out_dim])


def mean_diagonal(K: jax.Array) -> jax.Array:
    """The mean of the diagonal of ``K`` (per matrix of a batch), kept above the smallest
    normal number so that a relative jitter never becomes zero."""
    mean = jnp.mean(jnp.diagonal(K, axis1=-2, axis2=-1), axis=-1)
    return jnp.maximum(mean, jnp.finfo(K.dtype).tiny)
