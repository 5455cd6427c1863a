"""Closed-form Gaussian KL divergences (pure JAX)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike

from numpyro_dgp.core._triangular import lower_times


def gauss_kl(
    q_mean: ArrayLike,
    q_sqrt: ArrayLike,
    prior_chol: ArrayLike | None = None,
    prior_chol_inv: ArrayLike | None = None,
) -> jax.Array:
    """``sum_p KL[N(m_p, S_p) || N(0, K)]`` with ``S_p = L_p L_p^T``.

    :param q_mean: ``(P, M)``.
    :param q_sqrt: ``(P, M, M)`` lower-triangular factors or ``(P, M)`` diagonal std devs.
    :param prior_chol: ``(M, M)`` lower Cholesky factor of ``K``; ``None`` means ``K = I``
        (the whitened case).
    :param prior_chol_inv: ``prior_chol^{-1}`` when the caller has it (a non-whitened layer's
        factorization builds it): the whitening ``L^{-1} m_p``, ``L^{-1} L_p`` is then matrix
        products with triangular factors, where triangular solves (and the two more of their
        derivative) cost far more on CPU; ``None``: solves.
    :return: scalar KL (nats).
    :raises ValueError: if ``prior_chol_inv`` is given without ``prior_chol`` or with another
        shape.
    """
    if prior_chol_inv is not None:
        if prior_chol is None:
            raise ValueError("gauss_kl: prior_chol_inv needs prior_chol (None means K = I)")
        if jnp.shape(prior_chol_inv) != jnp.shape(prior_chol):
            raise ValueError(
                f"gauss_kl: prior_chol_inv must have prior_chol's shape {jnp.shape(prior_chol)}; "
                f"got {jnp.shape(prior_chol_inv)}"
            )
    return _gauss_kl(q_mean, q_sqrt, prior_chol, prior_chol_inv)


# One program per shape: outside jit (interactive use, tests) the KL's operations would
# otherwise each compile on their own; inside jit it is inlined. Its arguments arrive as arrays
# (jit converts them).
@jax.jit
def _gauss_kl(
    q_mean: jax.Array,
    q_sqrt: jax.Array,
    prior_chol: jax.Array | None,
    prior_chol_inv: jax.Array | None,
) -> jax.Array:
    P, M = q_mean.shape
    diag = q_sqrt.ndim == 2
    q_diag = q_sqrt if diag else jnp.diagonal(q_sqrt, axis1=-2, axis2=-1)
    logdet_q = 2.0 * jnp.sum(jnp.log(jnp.abs(q_diag)))
    if prior_chol is None:
        trace = jnp.sum(q_sqrt**2)
        mahalanobis = jnp.sum(q_mean**2)
        logdet_p: float | jax.Array = 0.0
    else:
        # sum_p |L^{-1} m_p|^2 and sum_p |L^{-1} L_p|_F^2: with L^{-1} products that skip its
        # zero blocks (its upper triangle is read as zero), else triangular solves
        L, Linv = prior_chol, prior_chol_inv
        if Linv is None:
            Linv_m = solve_triangular(L, q_mean.T, lower=True)  # (M, P)
        else:
            Linv_m = lower_times(Linv, q_mean.T)
        if diag:  # diagonal factors: |L^{-1} diag(s_p)|_F^2
            if Linv is None:
                Linv = solve_triangular(L, jnp.eye(M, dtype=q_mean.dtype), lower=True)
            trace = jnp.sum((jnp.tril(Linv)[None] * q_sqrt[:, None, :]) ** 2)
        elif Linv is None:
            trace = jnp.sum(solve_triangular(L[None], q_sqrt, lower=True) ** 2)
        else:
            # all of q_sqrt, as the solves read it: (M, M) times (P, M, M)
            trace = jnp.sum(lower_times(Linv, q_sqrt) ** 2)
        mahalanobis = jnp.sum(Linv_m**2)
        logdet_p = P * 2.0 * jnp.sum(jnp.log(jnp.diagonal(prior_chol)))
    return 0.5 * (trace + mahalanobis - P * M + logdet_p - logdet_q)
