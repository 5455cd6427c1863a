"""Per-point ("amortized") inducing sets of Meng & Zhang (2024) (pure JAX).

Every point ``n`` has its own inducing inputs ``Z_n (M, D)`` and values ``u_n (P, M)`` with
the unwhitened prior ``N(mean(Z_n), K(Z_n, Z_n))``; its output is the GP conditional on its own
set only: ``mean = m(x) + k_xz K^{-1} (mu - m(Z))`` and
``var = k(x, x) - k_xz K^{-1} (K - Sigma) K^{-1} k_zx``.

Shapes: ``B`` points, ``M`` inducing inputs per point, ``D`` input width, ``P`` outputs.

**References:**

* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from numpyro_dgp.core._conditionals import conditional
from numpyro_dgp.core._kl import gauss_kl
from numpyro_dgp.kernels import Kernel


def affine_inducing_inputs(
    weight: ArrayLike, bias: ArrayLike, encoder_input: ArrayLike
) -> jax.Array:
    """``z_m = W_m p + b_m`` for each of the ``M`` maps.

    :param weight: ``(M, D, D_p)`` the maps' matrices ``W_m``.
    :param bias: ``(M, D)`` the maps' offsets ``b_m``.
    :param encoder_input: ``(..., D_p)`` encoder inputs ``p``.
    :return: ``(..., M, D)`` inducing inputs.
    """
    return jnp.einsum("mij,...j->...mi", weight, encoder_input) + bias


def local_conditional(
    kernel: Kernel,
    Z: ArrayLike,
    Kzz_chol: ArrayLike,
    X: ArrayLike,
    q_mean: ArrayLike,
    q_sqrt: ArrayLike | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Each point's GP conditional on its own inducing set (zero prior mean; add the layer's
    mean function outside).

    :param kernel: a :mod:`numpyro_dgp.kernels` kernel.
    :param Z: ``(B, M, D)`` inducing inputs, one set per point.
    :param Kzz_chol: ``(B, M, M)`` Cholesky factors of ``K(Z_n, Z_n) + jitter``.
    :param X: ``(B, D)`` inputs.
    :param q_mean: ``(B, P, M)`` inducing values (or their means) about the prior mean.
    :param q_sqrt: ``(B, P, M, M)`` lower factors, ``(B, P, M)`` standard deviations, or
        ``None`` (the values are exact).
    :return: ``(mean (B, P), var (B, P))``.
    """

    def one(Z_n, L_n, x_n, m_n, s_n):
        mean, var = conditional(
            kernel(Z_n, x_n[None]), L_n, kernel.diag(x_n[None]), m_n, s_n, whiten=False
        )
        return mean[0], var[0]

    # a q_sqrt of None is an empty tree: vmap passes it on unmapped
    return jax.vmap(one)(Z, Kzz_chol, X, q_mean, q_sqrt)


def local_kl(q_mean: ArrayLike, q_sqrt: ArrayLike, Kzz_chol: ArrayLike) -> jax.Array:
    """Per-point ``KL[N(mu_n, Sigma_n) || N(0, K(Z_n, Z_n))]`` summed over the ``P`` outputs.

    :param q_mean: ``(B, P, M)`` means about the prior mean.
    :param q_sqrt: ``(B, P, M, M)`` lower factors or ``(B, P, M)`` standard deviations.
    :param Kzz_chol: ``(B, M, M)`` Cholesky factors of the prior covariances.
    :return: ``(B,)`` KL divergences (nats).
    """
    return jax.vmap(gauss_kl)(q_mean, q_sqrt, Kzz_chol)
