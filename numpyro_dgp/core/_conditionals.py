"""The sparse (inducing-point) GP conditional, whitened and not (pure JAX).

Shapes: ``M`` inducing inputs, ``N`` query points, ``P`` output dimensions sharing one
kernel. ``q_mean (P, M)``, ``q_sqrt (P, M, M)`` (lower triangular) or ``(P, M)`` (diagonal
standard deviations) or ``None`` (the inducing values are known exactly, S = 0).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from numpyro_dgp.core._triangular import lower_times, quadratic_form_diagonals, triangular_inverse


def factors_transpose_times(q_sqrt: ArrayLike, B: ArrayLike) -> jax.Array:
    """``L_p^T B`` for every output ``p``.

    Laid out as one ``(P K, M) x (M, N)`` product: its gradient is two unbatched products too,
    faster on CPU than the output-batched einsum.

    :param q_sqrt: ``(P, M, K)`` factors ``L_p``.
    :param B: ``(M, N)``.
    :return: ``(P, K, N)``.
    """
    P, M, K = jnp.shape(q_sqrt)
    factors = jnp.transpose(q_sqrt, (1, 0, 2)).reshape(M, P * K)
    return (factors.T @ B).reshape(P, K, jnp.shape(B)[-1])


def project(
    Kmn: ArrayLike,
    Kmm_chol: ArrayLike,
    whiten: bool = True,
    Kmm_chol_inv: ArrayLike | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The two projections the conditional needs.

    :param Kmn: ``(M, N)`` cross-covariance ``k(Z, X)``.
    :param Kmm_chol: ``(M, M)`` lower Cholesky factor of ``k(Z, Z) (+ jitter)``.
    :param whiten: whitened parameterization (``u = L v``).
    :param Kmm_chol_inv: ``L^{-1}`` when the caller has it (:func:`inverse_cholesky` or
        :func:`cholesky_and_inverse` of ``k(Z, Z) (+ jitter)``, whose derivatives are cheaper
        than inverting ``Kmm_chol``); ``None``: ``Kmm_chol`` is inverted here.
    :return: ``(A, B)``: ``A = L^{-1} Kmn`` (for the prior variance reduction) and ``B`` the
        map from the variational parameters to the mean: ``A`` when whitened, else
        ``K^{-1} Kmn = L^{-T} A``.
    :raises ValueError: if ``Kmm_chol_inv``'s shape is not ``Kmm_chol``'s.
    """
    Linv = inverse_factor(jnp.asarray(Kmm_chol), Kmm_chol_inv)
    A = lower_times(Linv, jnp.asarray(Kmn))
    B = A if whiten else Linv.T @ A
    return A, B


def inverse_factor(Kmm_chol: jax.Array, Kmm_chol_inv: ArrayLike | None) -> jax.Array:
    """The given ``L^{-1}`` (checked against ``L``'s shape; its upper triangle read as zero, as
    every caller's products assume), else ``L`` inverted.

    :raises ValueError: if ``Kmm_chol_inv``'s shape is not ``Kmm_chol``'s.
    """
    if Kmm_chol_inv is None:
        return triangular_inverse(Kmm_chol)
    if jnp.shape(Kmm_chol_inv) != Kmm_chol.shape:
        raise ValueError(
            f"Kmm_chol_inv must have Kmm_chol's shape {Kmm_chol.shape}; "
            f"got {jnp.shape(Kmm_chol_inv)}"
        )
    return jnp.tril(jnp.asarray(Kmm_chol_inv))


def conditional(
    Kmn: ArrayLike,
    Kmm_chol: ArrayLike,
    Knn: ArrayLike,
    q_mean: ArrayLike,
    q_sqrt: ArrayLike | None = None,
    *,
    whiten: bool = True,
    full_cov: bool = False,
    Kmm_chol_inv: ArrayLike | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Mean and (co)variance of ``q(f(X)) = int p(f(X) | u) q(u) du`` for a zero-mean GP.

    With ``u ~ N(m, S)`` (or, whitened, ``u = L v`` with ``v ~ N(m, S)``):
    ``mean = Kxm K^{-1} m`` and ``cov = Knn - Kxm K^{-1} (K - S) K^{-1} Kmx``
    (whitened: ``Knn - A^T A + A^T S A`` with ``A = L^{-1} Kmn``).

    :param Kmn: ``(M, N)`` cross-covariance ``k(Z, X)``.
    :param Kmm_chol: ``(M, M)`` lower Cholesky factor of ``Kmm``.
    :param Knn: ``(N,)`` prior variances (``full_cov=False``) or ``(N, N)`` prior covariance.
    :param q_mean: ``(P, M)`` variational means (of ``v`` when whitened, of ``u`` otherwise).
    :param q_sqrt: ``(P, M, M)`` lower factors (their upper triangles are ignored), ``(P, M)``
        diagonal std devs, or ``None``.
    :param whiten: whitened parameterization.
    :param full_cov: return ``(P, N, N)`` covariances instead of ``(N, P)`` variances.
    :param Kmm_chol_inv: ``L^{-1}`` when the caller has it (see :func:`project`).
    :return: ``(mean (N, P), var (N, P))`` or ``(mean (N, P), cov (P, N, N))``; the marginal
        variances are clipped at 0 (round-off).
    :raises ValueError: if ``q_sqrt`` or ``Knn`` has the wrong number of dimensions, or
        ``Kmm_chol_inv`` another shape than ``Kmm_chol``.
    """
    flags = {"whiten": bool(whiten), "full_cov": bool(full_cov)}
    return _conditional(Kmn, Kmm_chol, Knn, q_mean, q_sqrt, Kmm_chol_inv, **flags)


# One program per shape and flags: outside jit (interactive use, tests) the conditional's
# operations would otherwise each compile on their own; inside jit it is inlined. Its
# arguments arrive as arrays (jit converts them).
@partial(jax.jit, static_argnames=("whiten", "full_cov"))
def _conditional(
    Kmn: jax.Array,
    Kmm_chol: jax.Array,
    Knn: jax.Array,
    q_mean: jax.Array,
    q_sqrt: jax.Array | None,
    Kmm_chol_inv: jax.Array | None,
    *,
    whiten: bool,
    full_cov: bool,
) -> tuple[jax.Array, jax.Array]:
    if q_sqrt is not None and q_sqrt.ndim not in (2, 3):
        raise ValueError(f"q_sqrt must be (P, M, M) or (P, M); got shape {q_sqrt.shape}")
    if Knn.ndim != (2 if full_cov else 1):
        expected = "(N, N)" if full_cov else "(N,)"
        raise ValueError(f"full_cov={full_cov} needs Knn of shape {expected}; got {Knn.shape}")
    A, B = project(Kmn, Kmm_chol, whiten, Kmm_chol_inv)
    mean = (q_mean @ B).T
    if full_cov:  # (P, N, N): Knn - A^T A + B^T S_p B
        cov = jnp.broadcast_to(Knn - A.T @ A, (q_mean.shape[0],) + Knn.shape)
        if q_sqrt is None:
            return mean, cov
        if q_sqrt.ndim == 3:
            SB = factors_transpose_times(jnp.tril(q_sqrt), B)  # so B^T S B = SB^T SB
        else:
            SB = q_sqrt[:, :, None] * B[None]
        return mean, cov + jnp.einsum("pkn,pkm->pnm", SB, SB)
    var = (Knn - jnp.sum(A**2, axis=0))[:, None]
    if q_sqrt is not None and q_sqrt.ndim == 3:
        var = var + quadratic_form_diagonals(q_sqrt, B).T  # diag(B^T S_p B), skipping tril's zeros
    elif q_sqrt is not None:
        var = var + (q_sqrt**2 @ B**2).T  # diagonal S_p
    # Near the inducing inputs the prior variance and its reduction cancel; in float32, with a
    # kernel variance far above the jitter, the round-off can leave them below zero.
    return mean, jnp.maximum(jnp.broadcast_to(var, mean.shape), 0.0)
