"""Euler–Maruyama integration of an Itô SDE ``dx = mu(x, t) dt + sqrt(Sigma(x, t)) dW``,
and standard-normal draws as XLA's CPU backend generates them fastest (pure JAX).

``Sigma`` is diagonal (a variance per point and dimension), as in DiffGP (Hegde et al.
2019), where the drift and diffusion are a GP layer's mean and marginal variance.

**References:**

* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian
  process flows. AISTATS.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike


def standard_normal(rng_key: jax.Array, shape: tuple[int, ...], dtype: DTypeLike) -> jax.Array:
    """``jax.random.normal(rng_key, shape, dtype)``, drawn as one flat vector and reshaped.

    JAX's threefry generator counts the draws by their flattened position, so the flat draw
    has the same random bits in the same places (the same uniforms; the normals agree to the
    last bit, or within one unit in the last place where XLA vectorizes the transform of
    another shape differently). On CPU the generator's rolled loop over a 2-D counter array
    with a narrow last axis is several times slower than over a vector, and a layer draws once
    per training step.

    :param rng_key: PRNG key.
    :param shape: shape of the draw.
    :param dtype: floating dtype.
    :return: ``shape`` standard-normal values.
    """
    return jax.random.normal(rng_key, (math.prod(shape),), dtype).reshape(shape)


def euler_maruyama(
    drift_diffusion: Callable,
    x0: ArrayLike,
    T: ArrayLike,
    num_steps: int,
    rng_key: jax.Array,
    *,
    diffusion: bool = True,
    record: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Integrate ``x_{k+1} = x_k + mu(x_k, t_k) dt + sqrt(Sigma(x_k, t_k) dt) eps_k`` from 0 to
    ``T``.

    Fresh standard-normal ``eps_k`` at every step, for every element of ``x`` (every point
    and dimension; independent keys give independent samples). Gradients flow through the
    unrolled solver (``lax.scan``).

    :param drift_diffusion: ``(x (N, D), t ()) -> (mu (N, D), Sigma (N, D))``.
    :param x0: ``(N, D)`` initial states.
    :param T: end time ``>= 0`` (``T = 0`` returns ``x0`` unchanged).
    :param num_steps: number of Euler–Maruyama steps ``K``; ``dt = T / K``.
    :param rng_key: PRNG key for the Brownian increments.
    :param diffusion: ``False`` drops the noise term (the ODE ``dx = mu dt``; ``Sigma`` is
        not used).
    :param record: also return the path ``(K + 1, N, D)`` (``x0`` first).
    :return: ``x_T (N, D)``, or ``(x_T, path)`` with ``record=True``.
    :raises ValueError: if ``num_steps`` is not a positive integer.
    """
    if not (isinstance(num_steps, int) and num_steps >= 1):
        raise ValueError(f"euler_maruyama: num_steps must be a positive integer, got {num_steps!r}")
    x0 = jnp.asarray(x0)
    dt = jnp.asarray(T, x0.dtype) / num_steps
    keys = jax.random.split(rng_key, num_steps)
    times = jnp.arange(num_steps, dtype=x0.dtype) * dt

    def step(x, key_and_time):
        key, t = key_and_time
        mu, var = drift_diffusion(x, t)
        x_new = x + mu * dt
        if diffusion:
            eps = standard_normal(key, x.shape, x.dtype)
            # sqrt(var) sqrt(dt), not sqrt(var dt): at T = 0 the gradient stays 0, not 0 * inf;
            # clip round-off negatives of the variance
            x_new = x_new + jnp.sqrt(jnp.maximum(var, 0.0)) * jnp.sqrt(dt) * eps
        return x_new, (x_new if record else None)

    x_T, path = jax.lax.scan(step, x0, (keys, times))
    if record:
        return x_T, jnp.concatenate([x0[None], path], axis=0)
    return x_T
