"""Psi statistics: kernel expectations under Gaussian inputs (pure JAX).

Point ``n`` is uncertain, ``x_n ~ N(mean[n], diag(var[n]))``; for inducing inputs ``Z (M, D)``
the statistics are (Titsias & Lawrence 2010)

* ``psi0[n] = E k(x_n, x_n)``, shape ``(N,)``;
* ``Psi1[n, m] = E k(x_n, z_m)``, shape ``(N, M)``;
* ``Psi2_n[m, m'] = E k(z_m, x_n) k(x_n, z_m')``, per point ``(N, M, M)`` or summed over the
  points ``(M, M)``;
* ``E[x_n k(x_n, z_m)]``, shape ``(N, M, D)`` (what a layer with a linear mean function needs).

Closed forms: the squared exponential kernel with ARD lengthscales
(:class:`~numpyro_dgp.kernels.RBF`) and the linear kernel (:class:`~numpyro_dgp.kernels.Linear`).
Every other kernel (Matérn, periodic, sums and products) falls back to a tensor-product
Gauss-Hermite rule over the ``D`` input dimensions of each point (``num_points`` nodes per
dimension, ``num_points ** D`` per point), which is exact only in the limit of many nodes and
costs ``num_points ** D`` kernel evaluations per point.

The summed ``Psi2`` of the squared exponential kernel never forms an ``N x M x M`` tensor. When
every point has the same input variances (``var`` of shape ``(D,)`` or a scalar), the exponent
separates, ``Psi2_n = c B * phi_n^T phi_n`` with ``phi (N, M)``, and sums and traces are matrix
products (``O(N M^2)`` flops, ``O(N M)`` exponentials). With per-point variances it does not:
each point needs its own factor for each pair ``m <= m'`` (``M (M + 1) / 2`` pairs, the matrix
is symmetric), whose squared distance is expanded into ``(N, D) x (D, pairs)`` products and
summed over the points, or contracted per point, in cache-sized blocks of points with a
hand-written gradient (``O(N M^2)`` exponentials, ``O(N M^2 D)`` flops, ``O(block M^2)``
memory). :func:`psi2_traces` contracts each point's ``Psi2_n`` with given matrices at the same
cost as the sum. With zero input variance every statistic is the kernel evaluated at the means.

**References:**

* Titsias, Lawrence (2010). Bayesian Gaussian process latent variable model. AISTATS.
* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from numpyro_dgp.core._gauss_sums import gauss_sums_over_points, gauss_sums_per_point, split_rows
from numpyro_dgp.core._quadrature import gauss_hermite_product
from numpyro_dgp.kernels import RBF, Kernel, Linear

#: Point-pair entries per block of the summed ``Psi2`` (bounds its working memory).
_BLOCK_ENTRIES = 2**23
#: Gauss-Hermite nodes per point at most (the fallback's rule has ``num_points ** D``).
_MAX_NODES = 20_000


def _check_input_moments(
    mean: ArrayLike, var: ArrayLike, caller: str, shared: bool = False
) -> tuple[jax.Array, jax.Array]:
    """``(mean (N, D), var)``: ``var`` broadcast to ``(N, D)``, or with ``shared`` kept ``(D,)``
    when every point has the same variances (a scalar or ``(D,)`` given).

    :raises ValueError: for a ``mean`` not ``(N, D)`` or a ``var`` that does not broadcast to it.
    """
    mean = jnp.asarray(mean)
    if mean.ndim != 2:
        raise ValueError(f"{caller}: mean must have shape (N, D), got {mean.shape}")
    if not jnp.issubdtype(mean.dtype, jnp.floating):
        mean = mean.astype(jnp.result_type(float))
    var = jnp.asarray(var, mean.dtype)
    if shared and var.ndim <= 1:
        return mean, jnp.broadcast_to(var, mean.shape[1:])
    return mean, jnp.broadcast_to(var, mean.shape)


def _check_inducing_inputs(Z: ArrayLike, mean: jax.Array, caller: str) -> jax.Array:
    """``Z`` as ``(M, D)`` in the inputs' dtype.

    :raises ValueError: for another shape.
    """
    Z = jnp.asarray(Z, mean.dtype)
    if Z.ndim != 2 or Z.shape[1] != mean.shape[1]:
        raise ValueError(f"{caller}: Z must have shape (M, {mean.shape[1]}), got {Z.shape}")
    return Z


def _rbf_parts(kernel: RBF, mean: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(variance, lengthscales (D,))`` in the inputs' dtype."""
    D = mean.shape[1]
    ls = jnp.broadcast_to(jnp.asarray(kernel.lengthscale, mean.dtype), (D,))
    return jnp.asarray(kernel.variance, mean.dtype), ls


def _scaled_sqdist(mean: jax.Array, scale: jax.Array, points: jax.Array) -> jax.Array:
    """``sum_d (mean[n, d] - points[q, d])^2 / scale[n, d]``, ``(N, Q)``, by two products.

    Both sides are centered on the mean of ``points`` first (the distance does not change), which
    keeps the cancellation of the expansion at the size of the distances, not of the inputs.
    """
    center = jnp.mean(points, axis=0)
    mean, points = mean - center, points - center
    inv = 1.0 / scale
    sq = jnp.sum(mean**2 * inv, -1)[:, None] - 2.0 * (mean * inv) @ points.T + inv @ (points**2).T
    return jnp.maximum(sq, 0.0)


def _gh_nodes(
    mean: jax.Array, var: jax.Array, num_points: int, caller: str
) -> tuple[jax.Array, jax.Array]:
    """Tensor-product Gauss-Hermite nodes ``(N, K, D)`` of every point's input and weights
    ``(K,)``.

    :raises ValueError: for a rule over :data:`_MAX_NODES` nodes per point.
    """
    D = mean.shape[1]
    if int(num_points) ** D > _MAX_NODES:
        raise ValueError(
            f"{caller}: the Gauss-Hermite fallback needs num_points ** D = {int(num_points)}^{D} "
            f"nodes per point (over {_MAX_NODES}); lower num_points or use a kernel with "
            "closed-form psi statistics (RBF, Linear)"
        )
    nodes, weights = gauss_hermite_product(int(num_points), D)
    x = (
        mean[:, None, :]
        + jnp.sqrt(jnp.maximum(var, 0.0))[:, None, :] * jnp.asarray(nodes, mean.dtype)[None]
    )
    return x, jnp.asarray(weights, mean.dtype)


def psi0(kernel: Kernel, mean: ArrayLike, var: ArrayLike, *, num_points: int = 10) -> jax.Array:
    """``psi0[n] = E k(x_n, x_n)`` for ``x_n ~ N(mean[n], diag(var[n]))``.

    :param kernel: the kernel (closed form for ``RBF`` and ``Linear``, else Gauss-Hermite).
    :param mean: ``(N, D)`` input means.
    :param var: ``(N, D)`` input variances (broadcast; ``0`` for deterministic inputs).
    :param num_points: Gauss-Hermite nodes per input dimension of the fallback.
    :return: ``(N,)``.
    :raises ValueError: for inputs of the wrong shape, or a fallback rule over 20,000 nodes.
    """
    mean, var = _check_input_moments(mean, var, "psi0")
    if type(kernel) is RBF:
        return jnp.broadcast_to(jnp.asarray(kernel.variance, mean.dtype), mean.shape[:1])
    if type(kernel) is Linear:
        return jnp.asarray(kernel.variance, mean.dtype) * jnp.sum(mean**2 + var, -1)
    x, w = _gh_nodes(mean, var, num_points, "psi0")
    N, K, D = x.shape
    return kernel.diag(x.reshape(N * K, D)).reshape(N, K) @ w


def psi1(
    kernel: Kernel, mean: ArrayLike, var: ArrayLike, Z: ArrayLike, *, num_points: int = 10
) -> jax.Array:
    """``Psi1[n, m] = E k(x_n, z_m)`` for ``x_n ~ N(mean[n], diag(var[n]))``.

    Squared exponential: ``variance prod_d (1 + var_nd / l_d^2)^(-1/2)
    exp(-1/2 sum_d (mean_nd - z_md)^2 / (l_d^2 + var_nd))``.

    :param kernel: the kernel (closed form for ``RBF`` and ``Linear``, else Gauss-Hermite).
    :param mean: ``(N, D)`` input means.
    :param var: ``(N, D)`` input variances.
    :param Z: ``(M, D)`` inducing inputs.
    :param num_points: Gauss-Hermite nodes per input dimension of the fallback.
    :return: ``(N, M)``.
    :raises ValueError: for inputs of the wrong shape, or a fallback rule over 20,000 nodes.
    """
    mean, var = _check_input_moments(mean, var, "psi1")
    Z = _check_inducing_inputs(Z, mean, "psi1")
    if type(kernel) is RBF:
        sf2, ls = _rbf_parts(kernel, mean)
        scale = ls**2 + var
        log_det = -0.5 * jnp.sum(jnp.log(scale / ls**2), -1)
        return sf2 * jnp.exp(log_det[:, None] - 0.5 * _scaled_sqdist(mean, scale, Z))
    if type(kernel) is Linear:
        return jnp.asarray(kernel.variance, mean.dtype) * mean @ Z.T
    x, w = _gh_nodes(mean, var, num_points, "psi1")
    N, K, D = x.shape
    return jnp.einsum("nkm,k->nm", kernel(x.reshape(N * K, D), Z).reshape(N, K, -1), w)


def expected_input_kernel(
    kernel: Kernel, mean: ArrayLike, var: ArrayLike, Z: ArrayLike, *, num_points: int = 10
) -> jax.Array:
    """``E[x_n k(x_n, z_m)]`` for ``x_n ~ N(mean[n], diag(var[n]))``: what a layer with a linear
    mean function ``x^T W + b`` needs (the covariance of its mean path with its GP path).

    Squared exponential: ``Psi1[n, m] (l_d^2 mean_nd + var_nd z_md) / (l_d^2 + var_nd)``;
    linear: ``variance (mean_n mean_n^T + diag(var_n)) z_m``.

    :param kernel: the kernel (closed form for ``RBF`` and ``Linear``, else Gauss-Hermite).
    :param mean: ``(N, D)`` input means.
    :param var: ``(N, D)`` input variances.
    :param Z: ``(M, D)`` inducing inputs.
    :param num_points: Gauss-Hermite nodes per input dimension of the fallback.
    :return: ``(N, M, D)``.
    :raises ValueError: for inputs of the wrong shape, or a fallback rule over 20,000 nodes.
    """
    mean, var = _check_input_moments(mean, var, "expected_input_kernel")
    Z = _check_inducing_inputs(Z, mean, "expected_input_kernel")
    if type(kernel) is RBF:
        _, ls = _rbf_parts(kernel, mean)
        scale = ls**2 + var  # (N, D)
        P1 = psi1(kernel, mean, var, Z)
        shrunk = (ls**2 * mean)[:, None, :] + var[:, None, :] * Z[None]  # (N, M, D)
        return P1[..., None] * shrunk / scale[:, None, :]
    if type(kernel) is Linear:
        sigma2 = jnp.asarray(kernel.variance, mean.dtype)
        return sigma2 * (mean[:, None, :] * (mean @ Z.T)[..., None] + var[:, None, :] * Z[None])
    x, w = _gh_nodes(mean, var, num_points, "expected_input_kernel")
    N, K, D = x.shape
    Kx = kernel(x.reshape(N * K, D), Z).reshape(N, K, -1)
    return jnp.einsum("nkm,nkd,k->nmd", Kx, x, w)


def _rbf_psi2_pairs(kernel: RBF, mean: jax.Array, var: jax.Array, Z: jax.Array):
    """The squared exponential ``Psi2`` over the pairs ``m <= m'``: ``Psi2_n[pair] =
    pair_factor[pair] E[n, pair]`` with ``E`` the Gaussian bumps of
    :mod:`numpyro_dgp.core._gauss_sums`; returns ``(pair_factor (Q,), bump arguments)``."""
    sf2, ls = _rbf_parts(kernel, mean)
    i, j = np.triu_indices(Z.shape[0])
    zbar = 0.5 * (Z[i] + Z[j])  # (Q, D)
    pair_factor = sf2**2 * jnp.exp(-0.25 * jnp.sum(((Z[i] - Z[j]) / ls) ** 2, -1))
    scale = ls**2 + 2.0 * var
    log_det = -0.5 * jnp.sum(jnp.log(scale / ls**2), -1)
    return pair_factor, (mean, scale, log_det, zbar)


def _rbf_shared_psi2(kernel: RBF, mean: jax.Array, var: jax.Array, Z: jax.Array):
    """The squared exponential ``Psi2`` when every point has the input variances ``var (D,)``:
    ``Psi2_n = scale * B * phi_n^T phi_n`` with ``phi (N, M)``, so sums and traces are products.

    Per dimension,
    ``(mean - zbar)^2 = (mean - z_m)^2 / 2 + (mean - z_m')^2 / 2 - (z_m - z_m')^2 / 4``:
    with a variance shared by the points, the last term is a factor of the pair alone.
    """
    sf2, ls = _rbf_parts(kernel, mean)
    scale_d = ls**2 + 2.0 * var  # (D,)
    scale = sf2**2 * jnp.exp(-0.5 * jnp.sum(jnp.log(scale_d / ls**2)))
    diff = (Z[:, None, :] - Z[None, :, :]) ** 2  # (M, M, D)
    B = jnp.exp(-0.25 * jnp.sum(diff * (1.0 / ls**2 - 1.0 / scale_d), -1))
    Phi = jnp.exp(-0.5 * _scaled_sqdist(mean, jnp.broadcast_to(scale_d, mean.shape), Z))
    return scale, B, Phi


def _fill_symmetric(values: jax.Array, M: int) -> jax.Array:
    """``(..., M, M)`` symmetric matrices from their upper-triangle entries ``(..., Q)``."""
    i, j = np.triu_indices(M)
    upper = jnp.zeros(values.shape[:-1] + (M, M), values.dtype).at[..., i, j].set(values)
    return upper + jnp.swapaxes(upper, -1, -2) - upper * jnp.eye(M, dtype=values.dtype)


def _sum_over_point_blocks(fn: Callable, mean: jax.Array, var: jax.Array, width: int) -> jax.Array:
    """``fn(mean_block, var_block, keep_block)``, the sum over a block's kept points, summed over
    blocks of at most ``_BLOCK_ENTRIES / width`` points (a ``lax.scan`` whose blocks are
    recomputed in the backward pass) when the points do not fit in one."""
    N = mean.shape[0]
    block = max(1, _BLOCK_ENTRIES // max(width, 1))
    if N <= block:
        return fn(mean, var, jnp.ones(N, bool))
    num_blocks = -(-N // block)
    # padded points are the first point again, left out of the block's sum by ``keep``
    mean_b = split_rows(mean, num_blocks, block, mean[:1])
    var_b = split_rows(var, num_blocks, block, var[:1])
    keep = (jnp.arange(num_blocks * block) < N).reshape(num_blocks, block)
    step = jax.checkpoint(fn)

    def body(total, xs):
        return total + step(*xs), None

    return jax.lax.scan(
        body, step(mean_b[0], var_b[0], keep[0]), (mean_b[1:], var_b[1:], keep[1:])
    )[0]


def psi2(
    kernel: Kernel,
    mean: ArrayLike,
    var: ArrayLike,
    Z: ArrayLike,
    *,
    per_point: bool = False,
    num_points: int = 10,
) -> jax.Array:
    """``Psi2_n[m, m'] = E k(z_m, x_n) k(x_n, z_m')`` for ``x_n ~ N(mean[n], diag(var[n]))``,
    summed over the points (default) or per point.

    Squared exponential: ``variance^2 prod_d (1 + 2 var_nd / l_d^2)^(-1/2)
    exp(-1/4 sum_d (z_md - z_m'd)^2 / l_d^2 - sum_d (mean_nd - zbar_d)^2 / (l_d^2 + 2 var_nd))``
    with ``zbar = (z_m + z_m') / 2``. The summed form is computed without an ``N x M x M``
    tensor (see the module docstring); ``per_point=True`` forms it.

    :param kernel: the kernel (closed form for ``RBF`` and ``Linear``, else Gauss-Hermite).
    :param mean: ``(N, D)`` input means.
    :param var: ``(N, D)`` input variances.
    :param Z: ``(M, D)`` inducing inputs.
    :param per_point: return ``(N, M, M)`` instead of the sum ``(M, M)``.
    :param num_points: Gauss-Hermite nodes per input dimension of the fallback.
    :return: ``(M, M)``, or ``(N, M, M)`` if ``per_point``.
    :raises ValueError: for inputs of the wrong shape, or a fallback rule over 20,000 nodes.
    """
    mean, var = _check_input_moments(mean, var, "psi2", shared=True)
    Z = _check_inducing_inputs(Z, mean, "psi2")
    M = Z.shape[0]
    if type(kernel) is RBF and var.ndim == 1:
        scale, B, Phi = _rbf_shared_psi2(kernel, mean, var, Z)
        if per_point:
            return scale * B[None] * Phi[:, :, None] * Phi[:, None, :]
        return scale * B * (Phi.T @ Phi)
    var = jnp.broadcast_to(var, mean.shape)
    if type(kernel) is RBF:
        pair_factor, (m, scale, log_det, zbar) = _rbf_psi2_pairs(kernel, mean, var, Z)
        if per_point:
            bumps = jnp.exp(log_det[:, None] - _scaled_sqdist(m, scale, zbar))
            return _fill_symmetric(pair_factor * bumps, M)
        summed = gauss_sums_over_points(m, scale, log_det, zbar, jnp.ones(m.shape[:1], m.dtype))
        return _fill_symmetric(pair_factor * summed, M)
    if type(kernel) is Linear:
        sigma2 = jnp.asarray(kernel.variance, mean.dtype)
        if per_point:
            second = mean[:, :, None] * mean[:, None, :] + jax.vmap(jnp.diag)(var)  # (N, D, D)
            return sigma2**2 * jnp.einsum("md,nde,ke->nmk", Z, second, Z)
        second = mean.T @ mean + jnp.diag(jnp.sum(var, 0))
        return sigma2**2 * Z @ second @ Z.T
    x, w = _gh_nodes(mean, var, num_points, "psi2")
    N, K, D = x.shape

    def weighted_kernel(x_block):
        n = x_block.shape[0]
        return kernel(x_block.reshape(n * K, D), Z).reshape(n, K, M) * jnp.sqrt(w)[None, :, None]

    if per_point:
        Kx = weighted_kernel(x)
        return jnp.einsum("nkm,nkl->nml", Kx, Kx)

    def block_sum(m, v, keep):
        Kx = weighted_kernel(_gh_nodes(m, v, num_points, "psi2")[0])
        Kx = jnp.where(keep[:, None, None], Kx, 0.0).reshape(-1, M)
        return Kx.T @ Kx

    return _sum_over_point_blocks(block_sum, mean, var, K * M)


def psi2_traces(
    kernel: Kernel,
    mean: ArrayLike,
    var: ArrayLike,
    Z: ArrayLike,
    matrices: ArrayLike,
    *,
    num_points: int = 10,
) -> jax.Array:
    """Per-point traces ``tr(Psi2_n A_j)`` without forming ``Psi2_n`` for every point.

    ``tr(Psi2_n A) = E[k(x_n, Z) A k(Z, x_n)]``: e.g. with ``A = K^-1`` the part of the prior
    variance the inducing values explain, with ``A = a a^T + C`` the second moment of
    ``k(x_n, Z) alpha`` for ``alpha ~ N(a, C)``.

    :param kernel: the kernel (closed form for ``RBF`` and ``Linear``, else Gauss-Hermite).
    :param mean: ``(N, D)`` input means.
    :param var: ``(N, D)`` input variances.
    :param Z: ``(M, D)`` inducing inputs.
    :param matrices: ``(J, M, M)`` matrices ``A_j`` (need not be symmetric).
    :param num_points: Gauss-Hermite nodes per input dimension of the fallback.
    :return: ``(N, J)``.
    :raises ValueError: for inputs of the wrong shape, or a fallback rule over 20,000 nodes.
    """
    mean, var = _check_input_moments(mean, var, "psi2_traces", shared=True)
    Z = _check_inducing_inputs(Z, mean, "psi2_traces")
    M = Z.shape[0]
    A = jnp.asarray(matrices, mean.dtype)
    if A.ndim != 3 or A.shape[1:] != (M, M):
        raise ValueError(f"psi2_traces: matrices must have shape (J, {M}, {M}), got {A.shape}")
    if type(kernel) is RBF and var.ndim == 1:
        scale, B, Phi = _rbf_shared_psi2(kernel, mean, var, Z)
        # tr(Psi2_n A) = scale phi_n (B * A^T) phi_n^T
        BA = B[None] * jnp.swapaxes(A, -1, -2)  # (J, M, M)
        return scale * jnp.einsum("nm,jmk,nk->nj", Phi, BA, Phi)
    var = jnp.broadcast_to(var, mean.shape)
    if type(kernel) is RBF:
        pair_factor, bump_args = _rbf_psi2_pairs(kernel, mean, var, Z)
        # the weights of the pairs m <= m' in sum_{m, m'} Psi2[m, m'] A[m, m'] for symmetric
        # Psi2: A[m, m'] + A[m', m] off the diagonal
        i, j = np.triu_indices(M)
        sym = A + jnp.swapaxes(A, -1, -2)
        pairs = jnp.where(i == j, A[..., i, j], sym[..., i, j])
        return gauss_sums_per_point(*bump_args, pair_factor[None] * pairs)
    if type(kernel) is Linear:
        sigma2 = jnp.asarray(kernel.variance, mean.dtype)
        ZAZ = jnp.einsum("md,jmk,ke->jde", Z, A, Z)  # (J, D, D)
        quad = jnp.einsum("nd,jde,ne->nj", mean, ZAZ, mean)
        return sigma2**2 * (quad + var @ jnp.diagonal(ZAZ, axis1=-2, axis2=-1).T)
    x, w = _gh_nodes(mean, var, num_points, "psi2_traces")
    N, K, D = x.shape
    Kx = kernel(x.reshape(N * K, D), Z).reshape(N, K, M)
    return jnp.einsum("nkm,jml,nkl,k->nj", Kx, A, Kx, w)
