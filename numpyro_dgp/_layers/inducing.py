"""A layer's inducing part: the inducing inputs' parameter, the factor of ``K(Z, Z)`` (and its
inverse for whitened layers) and the prior of the inducing values."""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from numpyro_dgp._compat import is_tracer
from numpyro_dgp._layers.parts import LayerArgs
from numpyro_dgp.core import cholesky, inverse_cholesky, kmeans
from numpyro_dgp.kernels import Kernel

__all__ = [
    "inducing_factor",
    "inducing_inputs_site",
    "inducing_prior",
    "jittered_factor",
    "jittered_factor_program",
    "mean_diagonal",
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
        in_dim = args.X.shape[-1]
        points = jax.lax.stop_gradient(args.X.reshape(-1, in_dim))
        # A fixed key: the same data give the same inducing inputs in every run of the model
        # (a guide's prototype run and SVI's initial run must agree, e.g. for inducing locations).
        init = lambda _: kmeans(jax.random.PRNGKey(0), points, int(num_inducing))  # noqa: E731
    Z = numpyro.param(f"{name}.inducing_inputs", init)
    return Z if learn_inducing else jax.lax.stop_gradient(Z)


def inducing_factor(
    kernel: Kernel, Z: jax.Array, jitter: float, with_inverse: bool = False
) -> tuple[jax.Array, jax.Array | None, jax.Array]:
    """The jittered Cholesky factor of ``K(Z, Z)``, with ``with_inverse`` its inverse (from
    :func:`~numpyro_dgp.core.inverse_cholesky`, else ``None``), and the jitter it used: one
    compiled program per kernel type and shapes when the model runs eagerly (``svi.init``),
    where each operation would otherwise compile on its own. Traced (a training step), the
    operations are inlined as they are: differentiating through a nested ``jit`` would regroup
    the step's backward pass and change its round-off."""
    if any(is_tracer(leaf) for leaf in jax.tree_util.tree_leaves((kernel, Z))):
        return jittered_factor(kernel, Z, jitter, with_inverse)
    return jittered_factor_program(kernel, Z, jitter, with_inverse)


def jittered_factor(
    kernel: Kernel, Z: jax.Array, jitter: float, with_inverse: bool
) -> tuple[jax.Array, jax.Array | None, jax.Array]:
    """:func:`inducing_factor`'s operations."""
    # A failed factorization gives NaN, which fit() detects (skips and counts the step);
    # a lax.cond retry here would triple the compile time of every layer.
    Kmm = kernel(Z)
    # Relative to the prior variance, as for per-point sets: a classifier's output layer grows
    # its kernel variance to ~100, and a fixed 1e-4 then falls below float32 round-off.
    absolute = jitter * mean_diagonal(Kmm)
    jittered = Kmm + absolute * jnp.eye(Kmm.shape[-1], dtype=Kmm.dtype)
    inverse = inverse_cholesky(jittered) if with_inverse else None
    return cholesky(jittered), inverse, absolute


jittered_factor_program = partial(jax.jit, static_argnums=(2, 3))(jittered_factor)


def inducing_prior(
    Kmm_chol: jax.Array,
    prior_mean: jax.Array,
    out_dim: int,
    whiten: bool,
    locations: bool,
    dtype: np.dtype,
) -> dist.Distribution:
    """``p(u)`` per output: N(mean(Z), K) for locations, else N(0, I) whitened or N(0, K)."""
    M = Kmm_chol.shape[-1]
    if locations:
        return dist.MultivariateNormal(prior_mean, scale_tril=Kmm_chol)
    if whiten:
        # the standard normal by construction: its arguments are constants, concrete even in an
        # abstract (eval_shape) run, so validating them would compile ~20 small programs eagerly
        prior = dist.MultivariateNormal(
            jnp.zeros(M, dtype), scale_tril=jnp.eye(M, dtype=dtype), validate_args=False
        )
    else:
        prior = dist.MultivariateNormal(jnp.zeros(M, dtype), scale_tril=Kmm_chol)
    return prior.expand([out_dim])


def mean_diagonal(K: jax.Array) -> jax.Array:
    """The mean of the diagonal of ``K`` (per matrix of a batch), kept above the smallest
    normal number so that a relative jitter never becomes zero."""
    mean = jnp.mean(jnp.diagonal(K, axis1=-2, axis2=-1), axis=-1)
    return jnp.maximum(mean, jnp.finfo(K.dtype).tiny)
