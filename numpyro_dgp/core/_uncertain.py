"""Moments of a sparse GP layer's output at Gaussian inputs, by psi statistics (pure JAX).

The layer is ``f_p(x) = x^T W[:, p] + b[p] + k(x, Z) alpha_p`` with ``alpha_p = K^-1 u_p`` and
``u_p`` from its variational Gaussian; its input is ``x_n ~ N(mean[n], diag(var[n]))``. By the
law of total variance, the variance of ``f_p(x_n)`` over the input, the inducing values and
the GP given them splits into three parts (:class:`UncertainInputMoments`):

* ``inducing_var`` -- ``Var_u E_x[f | u] = Psi1_n C_p Psi1_n^T`` (``C_p = Cov alpha_p``);
* ``input_var`` -- ``E_u Var_x E[f | x, u]``: what the input's uncertainty adds through the
  mean function and the GP's mean, ``w^T diag(var_n) w + 2 w^T Cov_x(x, k(x, Z)) a +
  tr((Psi2_n - Psi1_n^T Psi1_n)(a a^T + C))``;
* ``conditional_var`` -- ``E_x Var(f | x, u) = psi0_n - tr(K^-1 Psi2_n)``, the same for
  every output.

Nested variational compression (Hensman & Lawrence 2014) forwards ``inducing_var`` (plus the
layer's noise) to the next layer and pays ``input_var + conditional_var`` as a penalty; an
exact moment-matched prediction forwards all three.

**References:**

* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
* Titsias, Lawrence (2010). Bayesian Gaussian process latent variable model. AISTATS.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from numpyro_dgp.core._conditionals import factors_transpose_times, inverse_factor
from numpyro_dgp.core._psi import expected_input_kernel, psi0, psi1, psi2, psi2_traces
from numpyro_dgp.kernels import Kernel


class UncertainInputMoments(NamedTuple):
    """What :func:`uncertain_input_moments` returns (see the module docstring for the parts).

    :ivar mean: ``(N, P)`` ``E f_p(x_n)``.
    :ivar inducing_var: ``(N, P)`` the variance from the inducing values, or ``(P,)`` summed
        over the points (``per_point_inducing=False``).
    :ivar input_var: ``(N, P)`` the variance the input uncertainty adds, or ``(P,)`` summed
        over the points (``per_point=False``).
    :ivar conditional_var: ``(N,)`` the variance of the GP given its inducing values, or ``()``
        summed over the points.
    """

    mean: jax.Array
    inducing_var: jax.Array
    input_var: jax.Array
    conditional_var: jax.Array


def _alpha_factors(T: jax.Array, q_sqrt: ArrayLike | None) -> jax.Array | None:
    """``R (P, M, M)`` with ``C_p = Cov alpha_p = R_p R_p^T``, or ``None`` when ``q_sqrt`` is."""
    if q_sqrt is None:
        return None
    if jnp.ndim(q_sqrt) == 3:
        return jnp.einsum("mk,pkl->pml", T, q_sqrt)  # C_p = R_p R_p^T
    return T[None] * jnp.asarray(q_sqrt)[:, None, :]


def _inducing_variance(
    R: jax.Array | None, P1: jax.Array, f_mean: jax.Array, dtype: jnp.dtype, per_point: bool
) -> jax.Array:
    """``Var_u E_x[f | u]``: ``(N, P)`` per point, or ``(P,)`` summed over the points."""
    if R is None:
        return jnp.zeros_like(f_mean) if per_point else jnp.zeros(f_mean.shape[1:], dtype)
    if per_point:
        return jnp.sum(factors_transpose_times(R, P1.T) ** 2, axis=1).T
    return jnp.einsum("mk,pml,pkl->p", P1.T @ P1, R, R)  # sum_n Psi1_n C_p Psi1_n^T


def _psi_variances(
    kernel: Kernel,
    mean: jax.Array,
    var: jax.Array,
    Z: jax.Array,
    P1: jax.Array,
    a: jax.Array,
    R: jax.Array | None,
    K_inv: jax.Array,
    inducing_var: jax.Array,
    mean_weight: ArrayLike | None,
    per_point: bool,
    num_points: int,
) -> tuple[jax.Array, jax.Array]:
    """``(conditional_var, input_var)`` at Gaussian inputs from the psi statistics; with a linear
    mean function ``input_var`` gains ``w^T diag(var_n) w + 2 w^T Cov_x(x, k(x, Z)) a``."""
    P = a.shape[0]
    # second moments of alpha_p: G_p = a_p a_p^T + C_p
    G = a[:, :, None] * a[:, None, :]
    if R is not None:
        G = G + R @ jnp.swapaxes(R, -1, -2)
    gp_mean = P1 @ a.T  # (N, P): the GP part of the mean
    if per_point:
        traces = psi2_traces(
            kernel, mean, var, Z, jnp.concatenate([G, K_inv[None]]), num_points=num_points
        )
        conditional_var = psi0(kernel, mean, var, num_points=num_points) - traces[:, P]
        # tr((Psi2_n - Psi1_n^T Psi1_n) G_p) = tr(Psi2_n G_p) - (Psi1_n a_p)^2 - inducing_var
        input_var = traces[:, :P] - gp_mean**2 - inducing_var
    else:
        Psi2 = psi2(kernel, mean, var, Z, num_points=num_points)
        conditional_var = jnp.sum(psi0(kernel, mean, var, num_points=num_points)) - jnp.sum(
            Psi2 * K_inv
        )
        input_var = (
            jnp.einsum("mk,pmk->p", Psi2, G)
            - jnp.sum(gp_mean**2, 0)
            - (jnp.sum(inducing_var, 0) if inducing_var.ndim == 2 else inducing_var)
        )
    if mean_weight is not None:
        W = jnp.asarray(mean_weight, mean.dtype)
        # Cov_x(x_d, k(x, z_m)) = E[x_d k(x, z_m)] - mean_d Psi1[n, m]
        cross = (
            expected_input_kernel(kernel, mean, var, Z, num_points=num_points)
            - mean[:, None, :] * P1[..., None]
        )
        mean_path = jnp.broadcast_to(var, mean.shape) @ W**2 + 2.0 * jnp.einsum(
            "nmd,dp,pm->np", cross, W, a
        )
        input_var = input_var + (mean_path if per_point else jnp.sum(mean_path, 0))
    if per_point:
        # round-off can leave a tiny negative difference where the input is nearly certain
        input_var = jnp.maximum(input_var, 0.0)
    return conditional_var, input_var


def uncertain_input_moments(
    kernel: Kernel,
    Z: ArrayLike,
    Kmm_chol: ArrayLike,
    q_mean: ArrayLike,
    q_sqrt: ArrayLike | None,
    mean: ArrayLike,
    var: ArrayLike | None,
    *,
    whiten: bool = True,
    mean_weight: ArrayLike | None = None,
    mean_bias: ArrayLike | None = None,
    per_point: bool = True,
    per_point_inducing: bool = True,
    num_points: int = 10,
    Kmm_chol_inv: ArrayLike | None = None,
) -> UncertainInputMoments:
    """Mean and the three variance parts of a sparse GP layer's output at Gaussian inputs.

    :param kernel: the layer's kernel.
    :param Z: ``(M, D)`` inducing inputs.
    :param Kmm_chol: ``(M, M)`` lower Cholesky factor of ``k(Z, Z) (+ jitter)``.
    :param q_mean: ``(P, M)`` variational means (of ``v``, ``u = L v``, when whitened).
    :param q_sqrt: ``(P, M, M)`` lower factors, ``(P, M)`` standard deviations, or ``None``
        (the inducing values are known: no ``inducing_var``).
    :param mean: ``(N, D)`` input means.
    :param var: ``(N, D)`` input variances; ``(D,)`` or a scalar when every point has the same
        (then the squared exponential ``Psi2`` takes matrix products only); ``None`` for
        deterministic inputs (then the kernel is evaluated directly, any kernel works, and
        ``input_var`` is exactly zero).
    :param whiten: whitened parameterization.
    :param mean_weight: ``(D, P)`` weight ``W`` of the linear mean function (``None``: zero).
    :param mean_bias: ``(P,)`` its bias ``b`` (``None``: zero).
    :param per_point: return ``input_var`` and ``conditional_var`` per point; ``False`` sums
        them over the points, using the summed ``Psi2`` (no per-point ``M x M`` statistic).
    :param per_point_inducing: return ``inducing_var`` per point; ``False`` sums it over the
        points as ``tr(Psi1^T Psi1 C_p)`` (``O(N M^2 + P M^3)`` instead of ``O(P N M^2)``);
        ``per_point=True`` needs it (its per-point variances are built from it).
    :param num_points: Gauss-Hermite nodes per input dimension for kernels without closed-form
        psi statistics (see :mod:`numpyro_dgp.core` ``psi1``).
    :param Kmm_chol_inv: ``L^{-1}`` when the caller has it (see
        :func:`~numpyro_dgp.core.project`); ``None``: ``Kmm_chol`` is inverted here.
    :return: :class:`UncertainInputMoments`.
    :raises ValueError: if ``Kmm_chol_inv``'s shape is not ``Kmm_chol``'s, ``q_sqrt`` is not
        ``(P, M, M)`` or ``(P, M)``, or ``per_point`` comes without ``per_point_inducing``.
    """
    if q_sqrt is not None and jnp.ndim(q_sqrt) not in (2, 3):
        raise ValueError(
            "uncertain_input_moments: q_sqrt must be (P, M, M) or (P, M); "
            f"got shape {jnp.shape(q_sqrt)}"
        )
    if per_point and not per_point_inducing:
        raise ValueError("uncertain_input_moments: per_point=True needs per_point_inducing=True")
    mean = jnp.asarray(mean)
    Z = jnp.asarray(Z, mean.dtype)
    q_mean = jnp.asarray(q_mean, mean.dtype)
    Linv = jnp.asarray(inverse_factor(jnp.asarray(Kmm_chol, mean.dtype), Kmm_chol_inv), mean.dtype)
    # alpha = K^-1 u = T v for the variational coordinates v (u = L v whitened, u itself
    # otherwise); K^-1 = T T^T when whitened
    T = Linv.T if whiten else Linv.T @ Linv
    a = q_mean @ T.T  # (P, M): E alpha_p
    R = _alpha_factors(T, q_sqrt)
    K_inv = T @ T.T if whiten else T  # (M, M)
    if var is None:  # deterministic inputs
        P1 = kernel(mean, Z)
    else:
        var = jnp.asarray(var, mean.dtype)
        if var.ndim > 1:
            var = jnp.broadcast_to(var, mean.shape)
        P1 = psi1(kernel, mean, var, Z, num_points=num_points)
    f_mean = P1 @ a.T  # E f_p(x_n): the GP's part plus the linear mean function's
    if mean_weight is not None:
        f_mean = f_mean + mean @ jnp.asarray(mean_weight, mean.dtype)
    if mean_bias is not None:
        f_mean = f_mean + jnp.asarray(mean_bias, mean.dtype)
    inducing_var = _inducing_variance(R, P1, f_mean, mean.dtype, per_point_inducing)
    if var is None:  # the conditional variance alone, no input_var
        explained = jnp.sum((P1 @ T) ** 2, -1) if whiten else jnp.sum((P1 @ K_inv) * P1, -1)
        conditional_var = kernel.diag(mean) - explained
        if per_point:
            zero = jnp.zeros_like(f_mean)
            return UncertainInputMoments(f_mean, inducing_var, zero, conditional_var)
        zero = jnp.zeros(f_mean.shape[1:], mean.dtype)
        return UncertainInputMoments(f_mean, inducing_var, zero, jnp.sum(conditional_var))
    conditional_var, input_var = _psi_variances(
        kernel, mean, var, Z, P1, a, R, K_inv, inducing_var, mean_weight, per_point, num_points
    )
    return UncertainInputMoments(f_mean, inducing_var, input_var, conditional_var)
