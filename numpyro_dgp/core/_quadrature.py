"""Gauss-Hermite rules and closed-form Gaussian expectations (pure JAX / NumPy)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike


def gauss_hermite(num_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights for ``E[g(xi)]``, ``xi ~ N(0, 1)``.

    Exact for polynomials of degree ``<= 2 * num_points - 1``.

    :param num_points: number of nodes ``K`` (``>= 1``).
    :return: ``(nodes (K,), weights (K,))`` as NumPy float64 arrays; weights sum to 1.
    :raises ValueError: if ``num_points < 1``.
    """
    if int(num_points) < 1:
        raise ValueError(f"num_points must be >= 1, got {num_points}")
    nodes, weights = np.polynomial.hermite_e.hermegauss(int(num_points))
    return nodes, weights / weights.sum()


def gauss_hermite_product(num_points: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Tensor-product Gauss-Hermite rule for ``xi ~ N(0, I_dim)``.

    :param num_points: nodes ``K`` per dimension.
    :param dim: dimension.
    :return: ``(nodes (K^dim, dim), weights (K^dim,))`` as NumPy float64 arrays.
    """
    nodes, weights = gauss_hermite(num_points)
    grid = np.array(list(itertools.product(nodes, repeat=dim)))
    w = np.prod(np.array(list(itertools.product(weights, repeat=dim))), axis=1)
    return grid.reshape(-1, dim), w


def expected_log_normal(
    y: ArrayLike, f_mean: ArrayLike, f_var: ArrayLike, noise_var: ArrayLike
) -> jax.Array:
    """``E_{f ~ N(f_mean, f_var)} log N(y | f, noise_var)`` in closed form (elementwise).

    :param y: observations.
    :param f_mean: means of ``f``.
    :param f_var: variances of ``f``.
    :param noise_var: observation noise variances.
    :return: the expectations, broadcast over the arguments.
    """
    y, f_mean = jnp.asarray(y), jnp.asarray(f_mean)
    return -0.5 * jnp.log(2 * jnp.pi * noise_var) - 0.5 * ((y - f_mean) ** 2 + f_var) / noise_var
