"""Jittered Cholesky factorization, triangular inverses, and products with triangular factors
that skip the zero triangle (pure JAX).

XLA's matrix product does not know a factor is triangular, so ``L^T B`` with ``L (M, M)``
lower triangular costs ``2 M^2 N`` FLOPs where ``M^2 N`` suffice. Splitting ``L`` into ``k``
column (or row) blocks and multiplying each block only with the rows it can touch costs the
fraction ``(k + 1) / (2 k)`` of the full product, in ``k`` ordinary matrix products that run
at the machine's matrix-product speed. JAX differentiates the blocks, so forward mode (Hessians,
Laplace approximations) works through them. A DSVI step at large ``M`` spends most of its time
in these products.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike, DTypeLike

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
    # summed block by block: one sum over the concatenated blocks made the step 6% slower
    total = jnp.zeros((q_sqrt.shape[0], B.shape[1]), B.dtype)
    for rows in _lower_transpose_blocks(q_sqrt, B):
        total = total + jnp.sum(rows**2, axis=1)
    return total


def lower_factors_transpose_times(q_sqrt: jax.Array, B: jax.Array) -> jax.Array:
    """``L_p^T B`` for every output ``p``, reading only the lower triangles: ``(n + 1) / (2 n)``
    of the dense products' work for its ``n = min(ceil(M / 64), 4)`` column blocks.

    :param q_sqrt: ``(P, M, M)`` factors ``L_p``; their upper triangles are ignored.
    :param B: ``(M, N)``.
    :return: ``(P, M, N)``.
    """
    return jnp.concatenate(_lower_transpose_blocks(q_sqrt, B), axis=1)


def _lower_transpose_blocks(q_sqrt: jax.Array, B: jax.Array) -> list[jax.Array]:
    """Rows ``[start, stop)`` of every ``L_p^T B`` (``(P, stop - start, N)``), block by block:
    column block ``[start, stop)`` of ``L_p`` is zero above row ``start``."""
    P, M = q_sqrt.shape[0], B.shape[0]
    blocks = triangular_blocks(M, QUADRATIC_FORM_BLOCK, QUADRATIC_FORM_MOST_BLOCKS)
    # the column blocks by one split, whose derivative is one concatenation: cutting each
    # block's diagonal square and the rows below it apart made the derivative a sum of eight
    # zero-padded (P, M, M) arrays (benchmarks/topics/scale.md, item 18)
    columns = jnp.split(q_sqrt, [start for start, _ in blocks[1:]], axis=2)
    return [  # one product for all outputs
        (_block_factors(column[:, start:]).T @ B[start:]).reshape(P, stop - start, -1)
        for (start, stop), column in zip(blocks, columns)
    ]


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


def default_jitter(dtype: DTypeLike) -> float:
    """Diagonal jitter that keeps kernel Cholesky factors finite in ``dtype``.

    float64: 1e-6, float32 (and lower): 1e-4 -- the settings of DSVI/GPflux runs; float32
    kernel matrices lose about 7 digits, so 1e-6 jitter is below their round-off.

    :param dtype: a floating-point dtype.
    :return: the jitter.
    """
    return 1e-6 if jnp.finfo(dtype).bits >= 64 else 1e-4


def check_jitter(jitter: ArrayLike, name: str = "jitter") -> None:
    """Check a concrete ``jitter``; a traced one passes unchecked.

    :param jitter: the value to check.
    :param name: the name the error message gives it.
    :raises ValueError: if ``jitter`` is concrete and not a finite positive number.
    """
    try:
        # ArrayLike has complex: its TypeError is caught
        value = float(jitter)  # type: ignore[arg-type]
    except (TypeError, jax.errors.ConcretizationTypeError):
        return  # traced: cannot check here
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"{name} must be a finite positive number, got {jitter!r}")


def jittered_cholesky(K: ArrayLike, jitter: ArrayLike) -> jax.Array:
    """Lower Cholesky factor of ``K + jitter * I``.

    :param K: ``(..., M, M)`` symmetric positive semi-definite matrix.
    :param jitter: positive scalar added to the diagonal, or ``(..., 1, 1)`` values, one per
        matrix of the batch (only a scalar is checked here).
    :return: ``(..., M, M)`` lower-triangular factor; NaN where the factorization fails.
    :raises ValueError: if a concrete scalar ``jitter`` is not a finite positive number.
    """
    check_jitter(jitter)
    K = jnp.asarray(K)
    M = K.shape[-1]
    return cholesky(K + jitter * jnp.eye(M, dtype=K.dtype))


@jax.custom_jvp
def cholesky(K: jax.Array) -> jax.Array:
    """Lower Cholesky factor of the symmetric positive-definite ``K`` (``(..., M, M)``).

    The factor of ``jnp.linalg.cholesky`` (which reads ``(K + K^T) / 2``): one LAPACK call up
    to ``M = 64``, above it the blocked recursion ``L21 = K21 L11^{-T}``,
    ``L22 = chol(K22 - L21 L21^T)`` with matrix products, down to LAPACK leaves of at most 64
    (at most 8 leaves above ``M = 512``: a program that stops growing with M compiles faster;
    inside a training step a large multithreaded LAPACK call competes with XLA's threads for
    the cores). The recursion builds
    ``L^{-1}`` beside ``L``, ``[[L11, 0], [L21, L22]]^{-1} =
    [[L11^{-1}, 0], [-L22^{-1} L21 L11^{-1}, L22^{-1}]]``, from the inverses its halves return
    (each leaf's by :func:`triangular_inverse`): every inverse is computed once, and no
    program slices the assembled factor (at ``M = 500`` the slices of a separate inverse of the
    concatenated factor took most of the step's compile time). Its derivative
    ``dL = L Phi(L^{-1} dK L^{-T})`` (``Phi``: lower triangle, half diagonal) is computed with
    that inverse and matrix products only, which skip the zero blocks of the triangular factors
    above ``M = 128`` (about ``3 M^3`` FLOPs where dense products take ``6 M^3``;
    ``lower_times_lower`` and ``lower_of_times_transpose``). JAX's own rule uses two triangular
    solves, which on CPU are far slower than a product of the same size; a DGP training step
    differentiates one factor per layer. NaN where the factorization fails, like
    ``jnp.linalg.cholesky``.

    :param K: ``(..., M, M)`` symmetric positive-definite matrix.
    :return: ``(..., M, M)`` lower-triangular factor.
    """
    return _factor(K)


#: Matrices at most this large are factored by LAPACK in one call; larger ones by recursion.
_CHOLESKY_LEAF = 64
#: At most this many leaves (larger leaves above M = 512): fewer operations to compile at large M.
#: Larger LAPACK leaves are slower inside a step (their threads compete with XLA's), so the bound
#: stays loose: 4 leaves (of 125) made a width-1 step at M = 500 slower, 154 against 100 ms.
_CHOLESKY_MOST_LEAVES = 8


def _leaf_size(n: int, smallest: int, most_leaves: int) -> int:
    """Leaf edge of a recursion that halves ``n``: at least ``smallest``, and large enough that
    at most ``most_leaves`` leaves remain (each level's halves are at most ``ceil(n / 2^k)``)."""
    return max(smallest, -(-n // most_leaves))


def _factor_pair(K: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(L, L^{-1})`` of the symmetrized ``K`` by the recursion of :func:`cholesky`."""
    K = 0.5 * (K + jnp.swapaxes(K, -1, -2))  # as jnp.linalg.cholesky
    return _pair_recursion(K, _leaf_size(K.shape[-1], _CHOLESKY_LEAF, _CHOLESKY_MOST_LEAVES))


def _pair_recursion(K: jax.Array, leaf: int) -> tuple[jax.Array, jax.Array]:
    # at M = 500 the step ran 20% faster with OpenBLAS held to one thread: its threads and
    # XLA's competed for the cores during the one large LAPACK call
    n = K.shape[-1]
    if n <= leaf:
        L = jnp.linalg.cholesky(K)
        return L, _triangular_inverse(L)
    h = n // 2
    L11, L11_inv = _pair_recursion(K[..., :h, :h], leaf)
    L21 = K[..., h:, :h] @ jnp.swapaxes(L11_inv, -1, -2)
    L22, L22_inv = _pair_recursion(K[..., h:, h:] - L21 @ jnp.swapaxes(L21, -1, -2), leaf)
    zeros = jnp.zeros(K.shape[:-2] + (h, n - h), K.dtype)
    L = _join_lower(L11, zeros, L21, L22)
    return L, _join_lower(L11_inv, zeros, -(L22_inv @ L21) @ L11_inv, L22_inv)


def _join_lower(
    top_left: jax.Array, zeros: jax.Array, bottom_left: jax.Array, bottom_right: jax.Array
) -> jax.Array:
    """``[[top_left, zeros], [bottom_left, bottom_right]]``."""
    top = jnp.concatenate([top_left, zeros], axis=-1)
    return jnp.concatenate([top, jnp.concatenate([bottom_left, bottom_right], axis=-1)], axis=-2)


@cholesky.defjvp
def _cholesky_jvp(primals: tuple, tangents: tuple) -> tuple[jax.Array, jax.Array]:
    (K,), (dK,) = primals, tangents
    L, Linv = _factor_and_inverse(K)
    # every factor is triangular: the three products skip their zero blocks (about 3 M^3 FLOPs
    # where dense products took 6 M^3)
    return L, lower_times_lower(L, _whitened_tangent(Linv, dK))


def _whitened_tangent(Linv: jax.Array, dK: jax.Array) -> jax.Array:
    """``Phi(L^{-1} dK L^{-T})`` of the symmetrized ``dK`` (the forward passes symmetrize their
    input), both factorization rules' common part: only its lower triangle is computed."""
    dK = 0.5 * (dK + jnp.swapaxes(dK, -1, -2))
    S = lower_of_times_transpose(lower_times(Linv, dK), Linv)
    return S - 0.5 * S * jnp.eye(dK.shape[-1], dtype=dK.dtype)


@jax.custom_jvp
def inverse_cholesky(K: jax.Array) -> jax.Array:
    """``L^{-1}`` of the lower Cholesky factor ``L`` of ``K`` (``(..., M, M)``), differentiated
    with respect to ``K`` directly.

    The value is the inverse :func:`cholesky`'s recursion builds beside ``L`` (inside a
    compiled program XLA computes the recursion once when a step needs both).
    The derivative is one rule where the chain of :func:`cholesky`'s and
    :func:`triangular_inverse`'s takes two: with ``Y = L^{-1}``,
    ``dY = -Y dL Y = -Phi(Y dK Y^T) Y`` (``Phi``: lower triangle, half diagonal; ``Y L = I``
    cancels), three products with triangular factors that skip their zero blocks (about
    ``3 M^3`` FLOPs) against five. A
    whitened conditional needs only ``L^{-1}``, so its training step takes this rule (float64,
    M = 1000, width 1: 28.1 -> 24.2 GFLOP per step). NaN where the factorization fails.

    :param K: ``(..., M, M)`` symmetric positive-definite matrix (read as ``(K + K^T) / 2``).
    :return: ``(..., M, M)`` lower-triangular ``L^{-1}``.
    """
    return _factor_and_inverse(K)[1]


@inverse_cholesky.defjvp
def _inverse_cholesky_jvp(primals: tuple, tangents: tuple) -> tuple[jax.Array, jax.Array]:
    (K,), (dK,) = primals, tangents
    Linv = inverse_cholesky(K)
    return Linv, -lower_times_lower(_whitened_tangent(Linv, dK), Linv)


@jax.custom_jvp
def cholesky_and_inverse(K: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(L, L^{-1})``: the lower Cholesky factor of ``K`` (``(..., M, M)``) and its inverse,
    differentiated together.

    The values are :func:`cholesky`'s and :func:`inverse_cholesky`'s (the recursion builds
    both). For a caller that reads both (a non-whitened conditional: its prior reads ``L``, its
    projection ``L^{-1}``) the derivative shares its costly part: with
    ``Phi = Phi(L^{-1} dK L^{-T})``, ``dL = L Phi`` and ``dL^{-1} = -Phi L^{-1}``, four
    products with triangular factors where the two rules (or ``L``'s and
    :func:`triangular_inverse`'s chained) take six or five, and no second inverse of ``L``.
    NaN where the factorization fails.

    :param K: ``(..., M, M)`` symmetric positive-definite matrix (read as ``(K + K^T) / 2``).
    :return: ``(L, L^{-1})``, both ``(..., M, M)`` lower triangular.
    """
    return _factor_and_inverse(K)


@cholesky_and_inverse.defjvp
def _cholesky_and_inverse_jvp(primals: tuple, tangents: tuple) -> tuple[tuple, tuple]:
    (K,), (dK,) = primals, tangents
    L, Linv = cholesky_and_inverse(K)
    Phi = _whitened_tangent(Linv, dK)
    return (L, Linv), (lower_times_lower(L, Phi), -lower_times_lower(Phi, Linv))


def robust_cholesky(
    K: ArrayLike, jitter: ArrayLike, max_tries: int = 2, factor: float = 100.0
) -> tuple[jax.Array, jax.Array]:
    """Cholesky of ``K + jitter * I``, retrying with ``factor`` times more jitter on failure.

    Kernel matrices at inducing inputs that an optimizer has pushed together become
    numerically singular; retrying with more jitter recovers instead of propagating NaN.
    The retries run only when the first factor is not finite (``lax.cond``).

    :param K: ``(..., M, M)`` symmetric positive semi-definite matrix.
    :param jitter: positive scalar added to the diagonal at the first try.
    :param max_tries: number of tries (the ``k``-th adds ``jitter * factor**k``).
    :param factor: jitter growth per retry.
    :return: ``(L, used_jitter)``; ``L`` is still NaN if every try failed.
    :raises ValueError: if a concrete ``jitter`` is not a finite positive number (checked by
        the first try).
    """
    K = jnp.asarray(K)
    jitter = jnp.asarray(jitter, K.dtype)

    L, used = jittered_cholesky(K, jitter), jitter
    for k in range(1, max_tries):
        new_jitter = jitter * factor**k
        # lax.cond traces both branches here, with this iteration's values
        L, used = jax.lax.cond(
            jnp.all(jnp.isfinite(L)),
            lambda _: (L, used),
            lambda _: (jittered_cholesky(K, new_jitter), new_jitter),
            None,
        )
    return L, used


#: Blocks at most this large are inverted by a triangular solve; larger ones by recursion.
_INVERSE_LEAF = 16


def triangular_inverse(L: ArrayLike) -> jax.Array:
    """``L^{-1}`` for lower-triangular ``L`` (``(..., M, M)``; the upper triangle is ignored).

    One explicit inverse followed by matrix products is faster on CPU than triangular
    solves against many right-hand sides. The inverse itself is built by block recursion,
    ``[[A, 0], [C, D]]^{-1} = [[A^{-1}, 0], [-D^{-1} C A^{-1}, D^{-1}]]``, down to blocks of
    at most 16 that a triangular solve inverts (small enough that OpenBLAS stays on one
    thread): XLA's CPU triangular solve is slow and erratic against an identity of more than a
    few dozen rows. The recursion
    runs breadth first (one batched solve of every leaf, one batched combination per level),
    so the program has ``O(log M)`` operations. Its derivative ``-L^{-1} dL L^{-1}`` is two
    lower-times-lower products that skip their zero blocks above ``M = 128``.

    :param L: ``(..., M, M)`` lower-triangular matrix.
    :return: ``(..., M, M)`` lower-triangular inverse.
    """
    return _triangular_inverse_compiled(jnp.asarray(L))


def _diagonal_blocks(L: jax.Array, size: int) -> jax.Array:
    """``(..., n / size, size, size)``: the diagonal blocks of ``(..., n, n)`` ``L``."""
    count = L.shape[-1] // size
    blocks = L.reshape(L.shape[:-2] + (count, size, count, size))
    return jnp.moveaxis(jnp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)


@jax.custom_jvp
def _triangular_inverse(L: jax.Array) -> jax.Array:
    """The block recursion of :func:`triangular_inverse` run breadth first: ``L`` padded with
    an identity block to ``leaf * 2^k`` (``[[L, 0], [0, I]]^{-1} = [[L^{-1}, 0], [0, I]]``),
    one batched triangular solve inverts its ``2^k`` diagonal leaves (each <= 16), then each
    level joins neighbouring pairs with batched products. The program has ``O(log M)``
    operations where the depth-first recursion had ``O(M / 16)`` (compile at M = 1000:
    16 -> 13.5 s)."""
    n = L.shape[-1]
    levels = max(0, math.ceil(math.log2(n / _INVERSE_LEAF)))
    leaf = -(-n // 2**levels)
    size = leaf * 2**levels
    if size > n:
        pad = [(0, 0)] * (L.ndim - 2) + [(0, size - n), (0, size - n)]
        L = jnp.pad(L, pad) + jnp.diag((jnp.arange(size) >= n).astype(L.dtype))
    blocks = _diagonal_blocks(L, leaf)
    inverse = solve_triangular(
        blocks, jnp.broadcast_to(jnp.eye(leaf, dtype=L.dtype), blocks.shape), lower=True
    )
    width = leaf
    while width < size:
        lower_left = _diagonal_blocks(L, 2 * width)[..., width:, :width]
        A_inv, D_inv = inverse[..., 0::2, :, :], inverse[..., 1::2, :, :]
        zeros = jnp.zeros_like(lower_left)
        inverse = _join_lower(A_inv, zeros, -(D_inv @ lower_left) @ A_inv, D_inv)
        width *= 2
    return inverse[..., 0, :n, :n]


@_triangular_inverse.defjvp
def _triangular_inverse_jvp(primals: tuple, tangents: tuple) -> tuple[jax.Array, jax.Array]:
    (L,), (dL,) = primals, tangents
    Linv = _triangular_inverse(L)
    # lower times lower twice, skipping the zero blocks (about 2 M^3 FLOPs where dense took 4 M^3)
    return Linv, -lower_times_lower(lower_times_lower(Linv, dL), Linv)


# One program per shape: outside jit (interactive use, tests) the recursions' few dozen
# operations would otherwise each compile on their own; inside jit they are inlined.
_triangular_inverse_compiled = jax.jit(_triangular_inverse)
_factor_and_inverse = jax.jit(_factor_pair)
# L alone: XLA drops the inverse's operations that L does not need (the second halves' inverses
# and the joined lower-left blocks)
_factor = jax.jit(lambda K: _factor_pair(K)[0])
