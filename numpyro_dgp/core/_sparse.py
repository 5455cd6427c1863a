"""One sparse GP layer with a Gaussian likelihood, the inducing values integrated out (pure JAX).

With ``K = k(Z, Z)``, ``Q_ff = K_fu K^-1 K_uf`` and noise variances ``sigma^2``:

* FITC (Snelson & Ghahramani 2006; Quiñonero-Candela & Rasmussen 2005): the likelihood
  ``p(y | u) = N(y | K_fu K^-1 u, Lambda)`` with ``Lambda = diag(K_ff - Q_ff) + sigma^2 I``, so
  ``log p(y) = log N(y | 0, Q_ff + Lambda)``: the marginal likelihood of a different model,
  **not a bound** on the GP's (it tends to under-estimate the noise variance; Bauer, van der Wilk &
  Rasmussen 2016);
* VFE (Titsias 2009): ``log N(y | 0, Q_ff + sigma^2 I) - tr(K_ff - Q_ff) / (2 sigma^2)``, a lower
  bound on the GP's log marginal likelihood, equal to the uncollapsed SVGP bound at its
  optimal ``q(u)``.

Both in ``O(N M^2)`` without ``N x N`` matrices, by the Woodbury identity: with
``V = L^-1 K_uf`` (``L L^T = K``), ``B = I + V Lambda^-1 V^T = L_B L_B^T`` and
``c = L_B^-1 V Lambda^-1 y``,
``log N(y | 0, Q_ff + Lambda) = -N/2 log 2 pi - 1/2 sum log Lambda - sum log diag L_B
- 1/2 y^T Lambda^-1 y + 1/2 c^T c``.
The posterior over the inducing values is ``N(K Sigma K_uf Lambda^-1 y, K Sigma K)`` with
``Sigma = (K + K_uf Lambda^-1 K_fu)^-1`` (whitened: ``N(L_B^-T c, B^-1)``), and the sparse
conditional under it (:func:`~numpyro_dgp.core.conditional`) is the FITC or VFE predictive:
mean ``K_*u Sigma K_uf Lambda^-1 y``, variance ``K_** - Q_** + K_*u Sigma K_u*``.

**References:**

* Snelson, Ghahramani (2006). Sparse Gaussian processes using pseudo-inputs. NIPS.
* Quiñonero-Candela, Rasmussen (2005). A unifying view of sparse approximate Gaussian process
  regression. JMLR.
* Titsias (2009). Variational learning of inducing variables in sparse Gaussian processes.
  AISTATS.
* Bauer, van der Wilk, Rasmussen (2016). Understanding probabilistic sparse Gaussian process
  approximations. NeurIPS.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from numpyro_dgp.core._conditionals import inverse_factor
from numpyro_dgp.core._triangular import cholesky, triangular_inverse

#: The values of ``method``: ``"vfe"`` (Titsias' bound) and ``"fitc"`` (not a bound).
COLLAPSED_METHODS = ("vfe", "fitc")


def _one_output(V: jax.Array, Knn_diag: jax.Array, y: jax.Array, noise: jax.Array, method: str):
    """``(log N(y | 0, Q + Lambda), whitened posterior mean (M,), L_B (M, M), trace term)`` for
    one output."""
    residual_var = Knn_diag - jnp.sum(V**2, axis=0)  # diag(K_ff - Q_ff)
    lam = noise + residual_var if method == "fitc" else noise
    Vs = V / jnp.sqrt(lam)
    B = jnp.eye(V.shape[0], dtype=V.dtype) + Vs @ Vs.T
    L_B = cholesky(B)
    c = triangular_inverse(L_B) @ (V @ (y / lam))
    N = y.shape[0]
    log_marginal = (
        -0.5 * N * math.log(2 * math.pi)
        - 0.5 * jnp.sum(jnp.log(lam))
        - jnp.sum(jnp.log(jnp.diagonal(L_B)))
        - 0.5 * jnp.sum(y**2 / lam)
        + 0.5 * jnp.sum(c**2)
    )
    trace = 0.5 * jnp.sum(residual_var / noise) if method == "vfe" else jnp.zeros((), V.dtype)
    whitened_mean = triangular_inverse(L_B).T @ c
    return log_marginal, whitened_mean, L_B, trace


def _per_output(Kmm_chol, Kmn, Knn_diag, y, noise_var, method, caller, Kmm_chol_inv=None):
    if method not in COLLAPSED_METHODS:
        raise ValueError(f"{caller}: method must be one of {COLLAPSED_METHODS}, got {method!r}")
    y = jnp.asarray(y)
    Y = y[:, None] if y.ndim == 1 else y
    noise = jnp.asarray(noise_var, Y.dtype)
    if noise.ndim == 1 and noise.shape[0] == Y.shape[0]:
        noise = noise[:, None]  # one variance per point, shared by the outputs
    noise = jnp.broadcast_to(noise, Y.shape)
    Linv = inverse_factor(jnp.asarray(Kmm_chol, Y.dtype), Kmm_chol_inv)
    V = jnp.asarray(Linv, Y.dtype) @ jnp.asarray(Kmn, Y.dtype)
    Knn_diag = jnp.asarray(Knn_diag, Y.dtype)
    return jax.vmap(lambda yp, sp: _one_output(V, Knn_diag, yp, sp, method), in_axes=(1, 1))(
        Y, noise
    )


def collapsed_log_marginal(
    Kmm_chol: ArrayLike,
    Kmn: ArrayLike,
    Knn_diag: ArrayLike,
    y: ArrayLike,
    noise_var: ArrayLike,
    *,
    method: str = "vfe",
    Kmm_chol_inv: ArrayLike | None = None,
) -> jax.Array:
    """Titsias' collapsed bound (``"vfe"``) or the FITC log marginal likelihood (``"fitc"``,
    **not a bound**), summed over outputs, in ``O(N M^2)``.

    :param Kmm_chol: ``(M, M)`` lower Cholesky factor of ``k(Z, Z) (+ jitter)``.
    :param Kmn: ``(M, N)`` ``k(Z, X)``.
    :param Knn_diag: ``(N,)`` ``k(x_n, x_n)``.
    :param y: ``(N,)`` or ``(N, P)`` targets minus the prior mean.
    :param noise_var: Gaussian noise variances, broadcast to ``y``.
    :param method: ``"vfe"`` or ``"fitc"``.
    :param Kmm_chol_inv: ``L^{-1}`` when the caller has it (see
        :func:`~numpyro_dgp.core.project`); ``None``: ``Kmm_chol`` is inverted here.
    :return: scalar.
    :raises ValueError: for an unknown ``method``.
    """
    log_marginal, _, _, trace = _per_output(
        Kmm_chol, Kmn, Knn_diag, y, noise_var, method, "collapsed_log_marginal", Kmm_chol_inv
    )
    return jnp.sum(log_marginal - trace)


def collapsed_posterior(
    Kmm_chol: ArrayLike,
    Kmn: ArrayLike,
    Knn_diag: ArrayLike,
    y: ArrayLike,
    noise_var: ArrayLike,
    *,
    method: str = "vfe",
    whiten: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """The Gaussian over the inducing values that FITC's or VFE's predictive uses (for VFE the
    optimal ``q(u)`` of Titsias 2009), in the layer's parameterization.

    :param Kmm_chol: ``(M, M)`` lower Cholesky factor of ``k(Z, Z) (+ jitter)``.
    :param Kmn: ``(M, N)`` ``k(Z, X)``.
    :param Knn_diag: ``(N,)`` ``k(x_n, x_n)``.
    :param y: ``(N,)`` or ``(N, P)`` targets minus the prior mean.
    :param noise_var: Gaussian noise variances, broadcast to ``y``.
    :param method: ``"vfe"`` or ``"fitc"``.
    :param whiten: return the Gaussian over ``v = L^-1 u`` (``True``) or over ``u``.
    :return: ``(q_mean (P, M), q_sqrt (P, M, M))``, ``q_sqrt`` lower triangular; pass them to
        :func:`~numpyro_dgp.core.conditional` for the predictive.
    :raises ValueError: for an unknown ``method``.
    """
    _, whitened_mean, L_B, _ = _per_output(
        Kmm_chol, Kmn, Knn_diag, y, noise_var, method, "collapsed_posterior"
    )
    L_B_inv = triangular_inverse(L_B)
    # lower factor of the whitened covariance B^-1 = L_B^-T L_B^-1
    whitened_sqrt = cholesky(jnp.swapaxes(L_B_inv, -1, -2) @ L_B_inv)
    if whiten:
        return whitened_mean, whitened_sqrt
    L = jnp.asarray(Kmm_chol, whitened_mean.dtype)
    return whitened_mean @ L.T, L @ whitened_sqrt
