"""Gauss-Hermite rules and closed-form Gaussian expectations (pure JAX / NumPy)."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np

__all__ = ["gauss_hermite", "gauss_hermite_product", "expected_log_normal"]


def gauss_hermite(num_points: int):
    """Nodes and weights for ``E[g(xi)]``, ``xi ~ N(0, 1)``.

    Exact for polynomials of degree ``<= 2 * num_points - 1``.

    :return: ``(nodes (K,), weights (K,))`` as NumPy float64 arrays; weights sum to 1.
    """
    if int(num_points) < 1:
        raise ValueError(f"num_points must be >= 1, got {num_points}")
    nodes, weights = np.polynomial.hermite_e.hermegauss(int(num_points))
    return nodes, weights / weights.sum()


def gauss_hermite_product(num_points: int, dim: int):
    """Tensor-product rule for ``xi ~ N(0, I_dim)``: ``(nodes (K^dim, dim), weights (K^dim,))``."""
    nodes, weights = gauss_hermite(num_points)
    grid = np.array(list(itertools.product(nodes, repeat=dim)))
    w = np.prod(np.array(list(itertools.product(weights, repeat=dim))), axis=1)
    return grid.reshape(-1, dim), w


def expected_log_normal(y, f_mean, f_var, noise_var):
    """``E_{f ~ N(f_mean, f_var)} log N(y | f, noise_var)`` in closed form (elementwise)."""
    return -0.5 * jnp.log(2 * jnp.pi * noise_var) - 0.5 * ((y - f_mean) ** 2 + f_var) / noise_var
