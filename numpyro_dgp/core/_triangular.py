"""Products with triangular factors that skip the zero triangle (pure JAX).

XLA's matrix product does not know a factor is triangular, so ``L^T B`` with ``L (M, M)``
lower triangular costs ``2 M^2 N`` FLOPs where ``M^2 N`` suffice. Splitting ``L`` into ``k``
column (or row) blocks and multiplying each block only with the rows it can touch costs the
fraction ``(k + 1) / (2 k)`` of the full product, in ``k`` ordinary matrix products that run
at the machine's matrix-product speed. JAX differentiates the blocks, so forward mode (Hessians,
Laplace approximations) works through them. A DSVI step at large ``M`` spends most of its time
in these products.
"""

from __future__ import annotations

from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

#: Block edge of :func:`quadratic_form_diagonals` (one product per block and all outputs), and
#: the most blocks it uses: larger blocks above M = 256 instead of more of them. 4 blocks cost
#: 5/8 of the full product against 9/16 for 8, yet the step ran 5-12% faster (fewer, larger
#: products near the machine's matrix-product speed, and less slicing and padding around them;
#: measured with ``LOWER_TIMES_MOST_BLOCKS`` below, see benchmarks/topics/scale.md, item 10).
QUADRATIC_FORM_BLOCK = 64
QUADRATIC_FORM_MOST_BLOCKS = 4
#: Block edge of :func:`lower_times` and the two products beside it, and the most blocks they
#: use (2: 3/4 of the full product's FLOPs, faster at M >= 500 than 4 blocks' 5/8, as above).
LOWER_TIMES_BLOCK = 128
LOWER_TIMES_MOST_BLOCKS = 2
#: Block edge of :func:`lower_gram`, and the most blocks it uses (a joint guide's factor over
#: two layers of width 8 at M = 500 is 4500 square: 9 blocks, 45 products, 23% of the dense FLOPs).
GRAM_BLOCK = 512
GRAM_MOST_BLOCKS = 16


def triangular_blocks(size: int, block: int, most: int) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` of ``ceil(size / block)`` (at most ``most``) nearly equal blocks covering
    ``range(size)``."""
    count = min(max(1, -(-size // block)), most)
    edges = [round(i * size / count) for i in range(count + 1)]
    return tuple(zip(edges[:-1], edges[1:]))


def quadratic_form_diagonals(q_sqrt: jax.Array, B: jax.Array) -> jax.Array:
    """``diag(B^T L_p L_p^T B)`` for every output ``p``: ``sum_k ((L_p^T B)_{kn})^2``.

    :param q_sqrt: ``(P, M, M)`` factors ``L_p``; their upper triangles are ignored.
    :param B: ``(M, N)``.
    :return: ``(P, N)``.
    """
    P, M = q_sqrt.shape[0], B.shape[0]
    blocks = triangular_blocks(M, QUADRATIC_FORM_BLOCK, QUADRATIC_FORM_MOST_BLOCKS)
    # the column blocks by one split, whose derivative is one concatenation: cutting each
    # block's diagonal square and the rows below it apart made the derivative a sum of eight
    # zero-padded (P, M, M) arrays (benchmarks/topics/scale.md, item 18)
    columns = jnp.split(q_sqrt, [start for start, _ in blocks[1:]], axis=2)
    total = jnp.zeros((P, B.shape[1]), B.dtype)
    for (start, stop), column in zip(blocks, columns):
        products = _block_factors(column[:, start:]).T @ B[start:]  # rows of L_p^T B in the block
        total = total + jnp.sum(products.reshape(P, stop - start, -1) ** 2, axis=1)
    return total


def _block_factors(rows: jax.Array) -> jax.Array:
    """A column block of every ``L_p`` from its diagonal down (``(P, rows, width)``, its top
    ``width x width`` square on the diagonal), zero above the diagonal, as one
    ``(rows, P * width)`` matrix (outputs side by side: one product serves them all)."""
    P, count, width = rows.shape
    below = np.arange(count)[:, None] >= np.arange(width)[None, :]
    return jnp.transpose(jnp.where(below, rows, 0), (1, 0, 2)).reshape(count, P * width)


def lower_times(T: jax.Array, X: jax.Array) -> jax.Array:
    """``tril(T) @ X``, reading only the lower triangle of ``T``.

    :param T: ``(..., M, M)``; its upper triangle is ignored.
    :param X: ``(..., M, N)``.
    :return: ``(..., M, N)``.
    """
    # row block [start, stop) of tril(T) is zero right of column stop
    blocks = triangular_blocks(T.shape[-1], LOWER_TIMES_BLOCK, LOWER_TIMES_MOST_BLOCKS)
    rows = [jnp.tril(T[..., start:stop, :stop], start) @ X[..., :stop, :] for start, stop in blocks]
    return jnp.concatenate(rows, axis=-2)


def lower_times_lower(T: jax.Array, U: jax.Array) -> jax.Array:
    """``tril(T) @ tril(U)``, a lower-triangular matrix, reading only the lower triangles.

    Row block ``[start, stop)`` of the product needs columns ``< stop`` of ``T`` and the leading
    ``stop x stop`` block of ``U``: with 2 blocks, 5/8 of the full product's FLOPs (the
    triangular minimum is 1/6); the zeros above the diagonal are exact.

    :param T: ``(..., M, M)``.
    :param U: ``(..., M, M)``.
    :return: ``(..., M, M)``, zero above the diagonal.
    """
    n, U = T.shape[-1], jnp.tril(U)
    rows = [
        _pad_columns(jnp.tril(T[..., start:stop, :stop], start) @ U[..., :stop, :stop], n)
        for start, stop in triangular_blocks(n, LOWER_TIMES_BLOCK, LOWER_TIMES_MOST_BLOCKS)
    ]
    return jnp.concatenate(rows, axis=-2)


def lower_of_times_transpose(X: jax.Array, T: jax.Array) -> jax.Array:
    """``tril(X @ tril(T)^T)``: the lower triangle of a product with a transposed lower factor.

    Entry ``(i, j)``, ``j <= i``, sums over columns ``<= j`` of both, so row block
    ``[start, stop)`` needs columns ``< stop`` only: 5/8 of the full product with 2 blocks.

    :param X: ``(..., M, M)``.
    :param T: ``(..., M, M)``; its upper triangle is ignored.
    :return: ``(..., M, M)``, zero above the diagonal.
    """
    n, T = T.shape[-1], jnp.tril(T)
    rows = [
        _pad_columns(
            jnp.tril(X[..., start:stop, :stop] @ jnp.swapaxes(T[..., :stop, :stop], -1, -2), start),
            n,
        )
        for start, stop in triangular_blocks(n, LOWER_TIMES_BLOCK, LOWER_TIMES_MOST_BLOCKS)
    ]
    return jnp.concatenate(rows, axis=-2)


def _pad_columns(block: jax.Array, n: int) -> jax.Array:
    """``block`` with zero columns appended up to ``n``."""
    pad = [(0, 0)] * (block.ndim - 1) + [(0, n - block.shape[-1])]
    return jnp.pad(block, pad)


def lower_gram(L: jax.Array) -> jax.Array:
    """``tril(L) @ tril(L)^T``, symmetric, reading only the lower triangle of ``L``.

    Block ``(i, j)``, ``j <= i``, sums over the columns before the end of block ``j`` only (row
    block ``j`` of ``L`` is zero right of it); the blocks above the diagonal are the transposes
    of those below. With ``k`` blocks that is ``k (k + 1) (k + 2) / 6`` block products, the
    fraction ``(k + 1) (k + 2) / (6 k^2)`` of the dense product's FLOPs (1/6 for many blocks).

    :param L: ``(..., K, K)``; its upper triangle is ignored.
    :return: ``(..., K, K)``.
    """
    L = jnp.tril(L)
    blocks = triangular_blocks(L.shape[-1], GRAM_BLOCK, GRAM_MOST_BLOCKS)
    below = {
        (i, j): L[..., start:stop, :inner] @ jnp.swapaxes(L[..., inner_start:inner, :inner], -1, -2)
        for i, (start, stop) in enumerate(blocks)
        for j, (inner_start, inner) in enumerate(blocks[: i + 1])
    }

    def block(i: int, j: int) -> jax.Array:
        return below[i, j] if j <= i else jnp.swapaxes(below[j, i], -1, -2)

    count = len(blocks)
    rows = [jnp.concatenate([block(i, j) for j in range(count)], axis=-1) for i in range(count)]
    return jnp.concatenate(rows, axis=-2)


def lower_from_vector(vector: jax.Array) -> jax.Array:
    """The lower-triangular ``(..., n, n)`` matrix of NumPyro's lower-Cholesky vector layout.

    ``vector`` holds the strict lower triangle row by row, then the diagonal
    (``(..., n (n + 1) / 2)``), as
    ``numpyro.distributions.transforms.SoftplusLowerCholeskyTransform`` lays it out, with one
    gather (NumPyro's ``vec_to_tril_matrix`` scatters into zeros and adds the diagonal as a
    broadcast product: several passes over ``n^2`` entries that a step at ``M = 500`` felt); the
    result keeps ``vector``'s dtype.

    :param vector: ``(..., n (n + 1) / 2)``.
    :return: ``(..., n, n)``, zero above the diagonal.
    :raises ValueError: for a last axis whose length is no triangular number.
    """
    length = vector.shape[-1]
    n = round((np.sqrt(1 + 8 * length) - 1) / 2)
    if n * (n + 1) // 2 != length:
        raise ValueError(f"vector's last axis must be n (n + 1) / 2 long; got {length}")
    return _lower_from_vector(vector, n)


@lru_cache(maxsize=None)
def _lower_layout(n: int) -> np.ndarray:
    """Where each matrix entry reads from in the vector (``n (n + 1) / 2``: a zero after it)."""
    rows, cols = np.tril_indices(n, -1)
    positions = np.concatenate([rows * n + cols, np.arange(n) * (n + 1)])
    source = np.full(n * n, positions.size)
    source[positions] = np.arange(positions.size)
    # int32 whatever jax_enable_x64 says: one program stays valid if it changes
    return source.astype(np.int32)


# one program per shape outside jit (a guide's set-up runs eagerly)
@partial(jax.jit, static_argnums=1)
def _lower_from_vector(vector: jax.Array, n: int) -> jax.Array:
    padded = jnp.concatenate([vector, jnp.zeros(vector.shape[:-1] + (1,), vector.dtype)], axis=-1)
    # gathering whole rows of the transposed array lays the result out as XLA's CPU gather
    # likes it (measured: 2-5x faster than gathering along the last axis)
    rows = jnp.take(jnp.moveaxis(padded, -1, 0), _lower_layout(n), axis=0, mode="clip")
    # the (..., n, n) layout written once: without the barrier XLA fuses the transposing read of
    # the gather's (n^2, ...) output into each consumer, which then reads one entry per cache
    # line (the KL's derivative at M = 1000, width 32: a fifth of the step; scale.md, item 18)
    matrices = jnp.moveaxis(rows, 0, -1).reshape(vector.shape[:-1] + (n, n))
    return jax.lax.optimization_barrier(matrices)
