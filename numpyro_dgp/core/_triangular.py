"""Products with triangular factors that skip the zero triangle (pure JAX).

XLA's matrix product does not know a factor is triangular, so ``L^T B`` with ``L (M, M)``
lower triangular costs ``2 M^2 N`` FLOPs where ``M^2 N`` suffice. Splitting ``L`` into ``k``
column (or row) blocks and multiplying each block only with the rows it can touch costs the
fraction ``(k + 1) / (2 k)`` of the full product, in ``k`` ordinary matrix products that run
at the machine's matrix-product speed. The derivative rules are written the same way (the
automatic ones would pad every block back to full size). A DSVI step at ``M = 500`` spends
most of its time in these products (``benchmarks/triangular_products.py`` measures the
speed-up and the block sizes; ``benchmarks/profile_step.py`` the step).
"""

from __future__ import annotations

from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["lower_from_vector", "lower_times", "quadratic_form_diagonals", "triangular_blocks"]

#: Block edge of :func:`quadratic_form_diagonals` (one product per block and all outputs).
QUADRATIC_FORM_BLOCK = 64
#: Block edge of :func:`lower_times`.
LOWER_TIMES_BLOCK = 128


def triangular_blocks(size: int, block: int) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` of ``ceil(size / block)`` nearly equal blocks covering ``range(size)``."""
    count = max(1, -(-size // block))
    edges = [round(i * size / count) for i in range(count + 1)]
    return tuple(zip(edges[:-1], edges[1:]))


def quadratic_form_diagonals(q_sqrt: jax.Array, B: jax.Array) -> jax.Array:
    """``diag(B^T L_p L_p^T B)`` for every output ``p``: ``sum_k ((L_p^T B)_{kn})^2``.

    :param q_sqrt: ``(P, M, M)`` factors ``L_p``; their upper triangles are ignored.
    :param B: ``(M, N)``.
    :return: ``(P, N)``.
    """
    return _quadratic_form_diagonals(q_sqrt, B, QUADRATIC_FORM_BLOCK)


def _block_factors(q_sqrt: jax.Array, start: int, stop: int) -> jax.Array:
    """Columns ``start:stop`` of every ``tril(L_p)`` from row ``start`` on, as one
    ``(M - start, P * width)`` matrix (outputs side by side: one product serves them all)."""
    P, M, _ = q_sqrt.shape
    block = jnp.concatenate([jnp.tril(q_sqrt[:, start:stop, start:stop]), q_sqrt[:, stop:, start:stop]], axis=1)
    return jnp.transpose(block, (1, 0, 2)).reshape(M - start, P * (stop - start))


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _quadratic_form_diagonals(q_sqrt: jax.Array, B: jax.Array, block: int) -> jax.Array:
    return _quadratic_form_forward(q_sqrt, B, block)[0]


def _quadratic_form_forward(q_sqrt: jax.Array, B: jax.Array, block: int) -> tuple[jax.Array, tuple]:
    P = q_sqrt.shape[0]
    total = jnp.zeros((P, B.shape[1]), B.dtype)
    saved = []
    for start, stop in triangular_blocks(B.shape[0], block):
        factors = _block_factors(q_sqrt, start, stop)
        products = (factors.T @ B[start:]).reshape(P, stop - start, -1)  # rows of L_p^T B in the block
        total = total + jnp.sum(products**2, axis=1)
        saved.append((factors, products))
    return total, (saved, B)


def _quadratic_form_backward(block: int, residuals: tuple, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    saved, B = residuals
    (M, N), P = B.shape, g.shape[0]
    columns, dB = [], jnp.zeros_like(B)
    for (start, stop), (factors, products) in zip(triangular_blocks(M, block), saved):
        width = stop - start
        G = (2 * products * g[:, None, :]).reshape(P * width, N)
        d_factors = (B[start:] @ G.T).reshape(M - start, P, width).transpose(1, 0, 2)
        d_factors = jnp.concatenate([jnp.tril(d_factors[:, :width]), d_factors[:, width:]], axis=1)
        columns.append(jnp.concatenate([jnp.zeros((P, start, width), B.dtype), d_factors], axis=1))
        dB = dB.at[start:].add(factors @ G)
    return jnp.concatenate(columns, axis=2), dB


_quadratic_form_diagonals.defvjp(_quadratic_form_forward, _quadratic_form_backward)


def lower_times(T: jax.Array, X: jax.Array) -> jax.Array:
    """``tril(T) @ X``, reading only the lower triangle of ``T``.

    :param T: ``(M, M)``; its upper triangle is ignored.
    :param X: ``(M, N)``.
    :return: ``(M, N)``.
    """
    return _lower_times(T, X, LOWER_TIMES_BLOCK)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _lower_times(T: jax.Array, X: jax.Array, block: int) -> jax.Array:
    # row block [start, stop) of tril(T) is zero right of column stop
    blocks = triangular_blocks(T.shape[-1], block)
    return jnp.concatenate([jnp.tril(T[start:stop, :stop], start) @ X[:stop] for start, stop in blocks], axis=0)


def _lower_times_forward(T: jax.Array, X: jax.Array, block: int) -> tuple[jax.Array, tuple]:
    return _lower_times(T, X, block), (T, X)


def _lower_times_backward(block: int, residuals: tuple, dY: jax.Array) -> tuple[jax.Array, jax.Array]:
    T, X = residuals
    M = T.shape[-1]
    rows, dX = [], jnp.zeros_like(X)
    for start, stop in triangular_blocks(M, block):
        d_rows = jnp.tril(dY[start:stop] @ X[:stop].T, start)
        rows.append(jnp.concatenate([d_rows, jnp.zeros((stop - start, M - stop), T.dtype)], axis=1))
        dX = dX.at[:stop].add(jnp.tril(T[start:stop, :stop], start).T @ dY[start:stop])
    return jnp.concatenate(rows, axis=0), dX


_lower_times.defvjp(_lower_times_forward, _lower_times_backward)


def lower_from_vector(vector: jax.Array) -> jax.Array:
    """The lower-triangular ``(..., n, n)`` matrix of NumPyro's lower-Cholesky vector layout.

    ``vector`` holds the strict lower triangle row by row, then the diagonal
    (``(..., n (n + 1) / 2)``), as ``numpyro.distributions.transforms.SoftplusLowerCholeskyTransform``
    lays it out. One gather builds the matrix and one gather its derivative; NumPyro's
    ``vec_to_tril_matrix`` scatters into zeros and its derivative adds the broadcast diagonal
    back, several passes over ``n^2`` entries that a step at ``M = 500`` felt.

    :param vector: ``(..., n (n + 1) / 2)``.
    :return: ``(..., n, n)``, zero above the diagonal.
    """
    n = round((np.sqrt(1 + 8 * vector.shape[-1]) - 1) / 2)
    if n * (n + 1) // 2 != vector.shape[-1]:
        raise ValueError(f"vector's last axis must be n (n + 1) / 2 long; got {vector.shape[-1]}")
    return _lower_from_vector_compiled(vector, n)


@lru_cache(maxsize=None)
def _lower_layout(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each matrix entry reads from (``n (n + 1) / 2``: a zero) and where each vector entry goes."""
    rows, cols = np.tril_indices(n, -1)
    positions = np.concatenate([rows * n + cols, np.arange(n) * (n + 1)])
    source = np.full(n * n, positions.size)
    source[positions] = np.arange(positions.size)
    # int32 whatever jax_enable_x64 says: the same program is valid when the flag changes
    return source.astype(np.int32), positions.astype(np.int32)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _lower_from_vector(vector: jax.Array, n: int) -> jax.Array:
    source, _ = _lower_layout(n)
    padded = jnp.concatenate([vector, jnp.zeros(vector.shape[:-1] + (1,), vector.dtype)], axis=-1)
    return _take_last(padded, source).reshape(vector.shape[:-1] + (n, n))


def _take_last(x: jax.Array, indices: np.ndarray) -> jax.Array:
    # gathering whole rows of the transposed array lays the result out as XLA's CPU gather
    # likes it (measured: 2-5x faster than gathering along the last axis, derivative included)
    moved = jnp.moveaxis(x, -1, 0)
    return jnp.moveaxis(jnp.take(moved, indices, axis=0, mode="clip"), 0, -1)


def _lower_from_vector_forward(vector: jax.Array, n: int) -> tuple[jax.Array, None]:
    return _lower_from_vector(vector, n), None


def _lower_from_vector_backward(n: int, _: None, cotangent: jax.Array) -> tuple[jax.Array]:
    _, positions = _lower_layout(n)
    return (_take_last(cotangent.reshape(cotangent.shape[:-2] + (n * n,)), positions),)


_lower_from_vector.defvjp(_lower_from_vector_forward, _lower_from_vector_backward)
# one program per shape outside jit (a guide's set-up runs eagerly); inlined inside jit
_lower_from_vector_compiled = jax.jit(_lower_from_vector, static_argnums=1)
