"""Sums of Gaussian bumps over (point, centre) pairs, in cache-sized blocks, with their gradient.

``E[n, q] = exp(log_weight[n] - sum_d (mean[n, d] - centers[q, d])^2 / scale[n, d])`` is the
per-point factor of the squared exponential ``Psi2`` (the centres are the midpoints of the
inducing-input pairs). Its ``(N, Q)`` matrix is only ever needed contracted: over the centres
(per-point traces) or over the points (the summed ``Psi2``). Both contractions here run over
tiles small enough for the CPU cache (``_BLOCK_ENTRIES`` entries: blocks of points, each over
chunks of at most ``_MOST_CENTERS`` centres, so that a tile keeps enough points for its products
to be efficient however many centres there are), and their gradients are written out
(``jax.custom_vjp``) so that the backward pass recomputes each tile's ``E`` once and reduces it
with a few thin products, instead of the many full passes over ``(N, Q)`` arrays that automatic
differentiation of the expanded exponent makes.

With ``G = dL/dE * E``: ``dL/dlog_weight[n] = sum_q G[n, q]``,
``dL/dmean[n] = -2 (mean[n] sum_q G[n, q] - G[n] @ centers) / scale[n]``,
``dL/dscale[n] = (mean[n]^2 sum_q G - 2 mean[n] G[n] @ centers + G[n] @ centers^2) / scale[n]^2``
and ``dL/dcenters[q] = 2 (G[:, q] @ (mean / scale) - centers[q] G[:, q] @ (1 / scale))``. Inputs
are centred on the mean centre first (distances, and so the gradients, do not change).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: Point-centre entries per tile (2 MiB of float64): the tile's matrices stay in cache.
_BLOCK_ENTRIES = 2**18
#: Centres per chunk at most, so that a tile keeps ``_BLOCK_ENTRIES / _MOST_CENTERS`` points or
#: more: blocks of all the centres and few points (2 at M = 500, where ``Q = 125,250``) spend
#: their time in thin ``(points, 2 D) x (2 D, Q)`` products; the sums alone, forward and
#: gradient, ran 6-7x slower so (B = 1000, D = 8, float64, 2-core CPU;
#: ``benchmarks/topics/nested.md``).
_MOST_CENTERS = 2**10


def _bumps(
    mean: jax.Array, scale: jax.Array, log_weight: jax.Array, centers: jax.Array
) -> jax.Array:
    inv = 1.0 / scale
    # the cross and centre terms as one product of inner size 2 D (one pass over the tile)
    left = jnp.concatenate([mean * inv, inv], -1)
    right = jnp.concatenate([-2.0 * centers, centers**2], -1)
    sq = jnp.sum(mean**2 * inv, -1)[:, None] + left @ right.T
    return jnp.exp(log_weight[:, None] - jnp.maximum(sq, 0.0))


def _grads(mean, scale, centers, G):
    """``(dmean, dscale, dlog_weight, dcenters)`` of one block from ``G = dL/dE * E``."""
    D, inv = mean.shape[1], 1.0 / scale
    # G's products with the centres, their squares and ones, and G^T's with the points' two
    # factors, as one product each: two passes over the tile where four products and a sum
    # made five
    moments = G @ jnp.concatenate([centers, centers**2, jnp.ones_like(centers[:, :1])], -1)
    Gz, Gz2, total = moments[:, :D], moments[:, D : 2 * D], moments[:, 2 * D :]
    dmean = -2.0 * inv * (mean * total - Gz)
    dscale = inv**2 * (mean**2 * total - 2.0 * mean * Gz + Gz2)
    by_center = G.T @ jnp.concatenate([mean * inv, inv], -1)
    dcenters = 2.0 * (by_center[:, :D] - centers * by_center[:, D:])
    return dmean, dscale, total[:, 0], dcenters


def _chunk_size(num_centers: int) -> int:
    """Centres per chunk: at most ``_MOST_CENTERS``, the chunks nearly equal (1 for none)."""
    count = max(1, -(-num_centers // _MOST_CENTERS))
    return max(1, -(-num_centers // count))


def split_rows(a: jax.Array, count: int, size: int, filler: jax.Array) -> jax.Array:
    """``a``'s rows padded with ``filler`` rows to ``count * size``, as ``(count, size, ...)``."""
    pad = count * size - a.shape[0]
    a = jnp.concatenate([a, jnp.broadcast_to(filler, (pad,) + a.shape[1:])])
    return a.reshape((count, size) + a.shape[1:])


def _blocked(fn, arrays: tuple, zero_padded: tuple, num_centers: int):
    """``fn`` over blocks of rows of ``arrays``: ``lax.map`` over the blocks, or one call when all
    rows fit in one block (``_BLOCK_ENTRIES`` point-centre entries with a chunk of the centres).
    The last block is padded with copies of the first row, or with zeros for the arrays flagged
    in ``zero_padded`` (cotangents and point weights, so the padding adds nothing). Returns the
    outputs with a leading block axis (a single block: an axis of one)."""
    N = arrays[0].shape[0]
    block = max(1, _BLOCK_ENTRIES // _chunk_size(num_centers))
    if N <= block:
        return jax.tree_util.tree_map(lambda a: a[None], fn(*arrays))
    num_blocks = -(-N // block)
    blocks = tuple(
        split_rows(a, num_blocks, block, jnp.zeros_like(a[:1]) if zero else a[:1])
        for a, zero in zip(arrays, zero_padded)
    )
    return jax.lax.map(lambda xs: fn(*xs), blocks)


def _center_chunks(centers: jax.Array, *per_center: jax.Array) -> tuple:
    """``centers`` and the arrays of ``per_center`` (rows: centres) as ``(count, size, ...)``
    chunks of at most ``_MOST_CENTERS`` rows, split once for every block of points. The last
    chunk is padded with copies of the first centre and with zero rows of ``per_center``
    (cotangents and weights of the centres, so the padding adds nothing); a single chunk is not
    padded."""
    Q = centers.shape[0]
    size = _chunk_size(Q)
    if size >= Q:
        return (centers[None],) + tuple(a[None] for a in per_center)
    count = -(-Q // size)
    return (split_rows(centers, count, size, centers[:1]),) + tuple(
        split_rows(a, count, size, jnp.zeros_like(a[:1])) for a in per_center
    )


def _over_chunks(fn, chunks: tuple):
    """``fn(centers_chunk, *per_center_chunks)`` over the chunks of :func:`_center_chunks`:
    ``lax.map``, or one call for a single chunk. Returns the outputs with a leading chunk axis."""
    if chunks[0].shape[0] == 1:
        return jax.tree_util.tree_map(lambda a: a[None], fn(*(c[0] for c in chunks)))
    return jax.lax.map(lambda xs: fn(*xs), chunks)


def _rows(stacked: jax.Array, N: int) -> jax.Array:
    return stacked.reshape((-1,) + stacked.shape[2:])[:N]


def _centred(mean: jax.Array, centers: jax.Array) -> tuple[jax.Array, jax.Array]:
    c = jax.lax.stop_gradient(jnp.mean(centers, axis=0))
    return mean - c, centers - c


@jax.custom_vjp
def gauss_sums_per_point(
    mean: jax.Array, scale: jax.Array, log_weight: jax.Array, centers: jax.Array, W: jax.Array
) -> jax.Array:
    """``out[n, j] = sum_q E[n, q] W[j, q]`` (see the module docstring).

    :param mean: ``(N, D)``.
    :param scale: ``(N, D)`` positive.
    :param log_weight: ``(N,)``.
    :param centers: ``(Q, D)``.
    :param W: ``(J, Q)``.
    :return: ``(N, J)``.
    """
    return _per_point_fwd(mean, scale, log_weight, centers, W)[0]


def _per_point_fwd(mean, scale, log_weight, centers, W):
    m, z = _centred(mean, centers)
    chunks = _center_chunks(z, W.T)

    def block(a, s, w):
        return jnp.sum(_over_chunks(lambda zc, Wc: _bumps(a, s, w, zc) @ Wc, chunks), 0)

    out = _blocked(block, (m, scale, log_weight), (False,) * 3, z.shape[0])
    return _rows(out, mean.shape[0]), (mean, scale, log_weight, centers, W)


def _per_point_bwd(res, g):
    mean, scale, log_weight, centers, W = res
    m, z = _centred(mean, centers)
    Q, chunks = z.shape[0], _center_chunks(z, W.T)

    def block(a, s, w, gb):
        def chunk(zc, Wc):
            E = _bumps(a, s, w, zc)
            return _grads(a, s, zc, E * (gb @ Wc.T)) + (E.T @ gb,)

        dm, ds, dw, dz, dWt = _over_chunks(chunk, chunks)
        return tuple(jnp.sum(a, 0) for a in (dm, ds, dw)) + (_rows(dz, Q), _rows(dWt, Q))

    # padded rows get a zero cotangent: they add nothing to the summed dz and dW
    dm, ds, dw, dz, dWt = _blocked(block, (m, scale, log_weight, g), (False, False, False, True), Q)
    N = mean.shape[0]
    return _rows(dm, N), _rows(ds, N), _rows(dw, N), jnp.sum(dz, 0), jnp.sum(dWt, 0).T


gauss_sums_per_point.defvjp(_per_point_fwd, _per_point_bwd)


@jax.custom_vjp
def gauss_sums_over_points(
    mean: jax.Array,
    scale: jax.Array,
    log_weight: jax.Array,
    centers: jax.Array,
    point_weight: jax.Array,
) -> jax.Array:
    """``out[q] = sum_n point_weight[n] E[n, q]`` (see the module docstring).

    :param mean: ``(N, D)``.
    :param scale: ``(N, D)`` positive.
    :param log_weight: ``(N,)``.
    :param centers: ``(Q, D)``.
    :param point_weight: ``(N,)``.
    :return: ``(Q,)``.
    """
    return _over_points_fwd(mean, scale, log_weight, centers, point_weight)[0]


def _over_points_fwd(mean, scale, log_weight, centers, point_weight):
    m, z = _centred(mean, centers)
    Q, chunks = z.shape[0], _center_chunks(z)

    def block(a, s, w, p):
        return _rows(_over_chunks(lambda zc: p @ _bumps(a, s, w, zc), chunks), Q)

    # padded points get weight zero
    out = _blocked(block, (m, scale, log_weight, point_weight), (False, False, False, True), Q)
    return jnp.sum(out, 0), (mean, scale, log_weight, centers, point_weight)


def _over_points_bwd(res, g):
    mean, scale, log_weight, centers, point_weight = res
    m, z = _centred(mean, centers)
    Q, chunks = z.shape[0], _center_chunks(z, g)

    def block(a, s, w, p):
        def chunk(zc, gc):
            Eg = _bumps(a, s, w, zc) * gc[None, :]
            return _grads(a, s, zc, Eg * p[:, None]) + (jnp.sum(Eg, axis=1),)

        dm, ds, dw, dz, dp = _over_chunks(chunk, chunks)
        return tuple(jnp.sum(a, 0) for a in (dm, ds, dw)) + (_rows(dz, Q), jnp.sum(dp, 0))

    padding = (False, False, False, True)
    dm, ds, dw, dz, dp = _blocked(block, (m, scale, log_weight, point_weight), padding, Q)
    N = mean.shape[0]
    return _rows(dm, N), _rows(ds, N), _rows(dw, N), jnp.sum(dz, 0), _rows(dp, N)


gauss_sums_over_points.defvjp(_over_points_fwd, _over_points_bwd)
