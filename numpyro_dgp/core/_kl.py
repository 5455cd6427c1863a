"""Closed-form Gaussian KL divergences (pure JAX)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike

__all__ = ["gauss_kl"]


def gauss_kl(
    q_mean: ArrayLike, q_sqrt: ArrayLike, prior_chol: ArrayLike | None = None
) -> jax.Array:
    """``sum_p KL[N(m_p, S_p) || N(0, K)]`` with ``S_p = L_p L_p^T``.

    :param q_mean: ``(P, M)``.
    :param q_sqrt: ``(P, M, M)`` lower-triangular factors or ``(P, M)`` diagonal std devs.
    :param prior_chol: ``(M, M)`` lower Cholesky factor of ``K``; ``None`` means ``K = I``
        (the whitened case).
    :return: scalar KL (nats).
    """
    q_mean, q_sqrt = jnp.asarray(q_mean), jnp.asarray(q_sqrt)
    return _gauss_kl(q_mean, q_sqrt, None if prior_chol is None else jnp.asarray(prior_chol))


# One program per shape: outside jit (interactive use, tests) the KL's operations would
# otherwise each compile on their own; inside jit it is inlined.
@jax.jit
def _gauss_kl(q_mean: jax.Array, q_sqrt: jax.Array, prior_chol: jax.Array | None) -> jax.Array:
    P, M = q_mean.shape
    diag = q_sqrt.ndim == 2
    q_diag = q_sqrt if diag else jnp.diagonal(q_sqrt, axis1=-2, axis2=-1)
    logdet_q = 2.0 * jnp.sum(jnp.log(jnp.abs(q_diag)))
    if prior_chol is None:
        trace = jnp.sum(q_sqrt**2)
        mahalanobis = jnp.sum(q_mean**2)
        logdet_p: float | jax.Array = 0.0
    else:
        Linv_m = solve_triangular(prior_chol, q_mean.T, lower=True)  # (M, P)
        mahalanobis = jnp.sum(Linv_m**2)
        if diag:
            Linv = solve_triangular(prior_chol, jnp.eye(M, dtype=q_mean.dtype), lower=True)
            trace = jnp.sum((Linv[None] * q_sqrt[:, None, :]) ** 2)
        else:
            Linv_S = solve_triangular(prior_chol[None], q_sqrt, lower=True)
            trace = jnp.sum(Linv_S**2)
        logdet_p = P * 2.0 * jnp.sum(jnp.log(jnp.diagonal(prior_chol)))
    return 0.5 * (trace + mahalanobis - P * M + logdet_p - logdet_q)
