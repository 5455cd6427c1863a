"""Exact per-point propagation through layers whose inducing values are jointly Gaussian.

With a guide that correlates the inducing values of different layers, the ELBO needs each
point's own chain of layer outputs. For one point, layer ``l`` is a linear-Gaussian
observation of its inducing values::

    f_l = mean_l(f_{l-1}) + H u_l + e,   H = I_P (x) alpha_l(f_{l-1})^T,   e ~ N(0, s_l I_P),

with ``alpha`` and ``s = k(f, f) - q(f, f)`` from :func:`point_projection`. The guide writes the
inducing values through standard-normal draws, ``vec(u_l) = vec(m_l) + T_l eps`` with ``T``
block lower-triangular (a joint guide's factor; for a chain, ``q(u_l | u_{l-1}) = N(m_l +
C_l (u_{l-1} - m_{l-1}), D_l D_l^T)`` gives ``T_l = [C_l T_{l-1}, D_l]``). Each point carries a
Gaussian belief over the draws of the layers run so far (:class:`Belief`); a layer's output is a
linear-Gaussian observation of them with rows ``H T_l`` (:func:`output_moments`), and the sampled
output updates the belief like a Kalman filter (:func:`condition_on_output`). This is the exact
per-point recursion, not the recursion of eqs. (16)-(17) of Ustyuzhaninov et al. (2020), which
is wrong for ``L >= 3``.

Working in the draws, not in the inducing values, no covariance over the inducing values is
formed: a layer costs ``O(N P M K)`` for the ``K`` draws of the layers before it, and DSVI's
``O(N P M^2)`` for its own draws when ``T_l``'s own block is one factor per output (a chain).
Each point's belief is the identity minus a low-rank downdate: conditioning on a layer's ``P``
outputs adds ``P`` rows, ``O(r K)`` memory per point for ``r`` outputs so far.

Shapes: ``N`` points, ``P`` outputs, ``M`` inducing points, ``K`` draws (the current layer's
``u`` flattened output-major, ``vec(u) = u.reshape(-1)`` for ``u (P, M)``).
No NumPyro below this line.

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import block_diag, solve_triangular
from jax.typing import ArrayLike

from numpyro_dgp.core._conditionals import project
from numpyro_dgp.core._triangular import lower_factors_transpose_times


def point_projection(
    Kmn: ArrayLike,
    Kmm_chol: ArrayLike,
    Knn_diag: ArrayLike,
    whiten: bool = True,
    Kmm_chol_inv: ArrayLike | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Per-point weights and residual prior variance of a sparse GP layer.

    :param Kmn: ``(M, N)`` ``k(Z, X)``.
    :param Kmm_chol: ``(M, M)`` Cholesky factor of ``k(Z, Z) (+ jitter)``.
    :param Knn_diag: ``(N,)`` prior variances ``k(x, x)``.
    :param whiten: whether ``u`` is whitened (``u = L v``).
    :param Kmm_chol_inv: ``L^{-1}`` when the caller has it (see :func:`project`).
    :return: ``(alpha (N, M), s (N,))`` with ``E[f(x) | u] = alpha(x) . u`` (``u`` whitened
        or not) and ``s = k(x, x) - k(x, Z) K^{-1} k(Z, x)``.
    :raises ValueError: if ``Kmm_chol_inv``'s shape is not ``Kmm_chol``'s.
    """
    A, B = project(Kmn, Kmm_chol, whiten, Kmm_chol_inv)
    return B.T, jnp.asarray(Knn_diag) - jnp.sum(A**2, axis=0)


class Belief(NamedTuple):
    """Each point's Gaussian over the standard-normal draws ``eps`` behind the inducing values of
    the layers run so far (``vec(u_l) = vec(m_l) + T_l eps``): ``N(G_n^T v_n, I - G_n^T W_n
    G_n)``.

    Each output conditioned on adds a row to ``G_n`` (its covariance with the draws), the
    layer's inverse output covariance to the block-diagonal ``W_n`` and its weighted residual
    to ``v_n``, so conditioning never solves against the draws, and the mean over the draws is
    never formed: a later layer needs it only through its rows' products with ``G_n``.

    :ivar weighted: ``(N, r)`` ``v_n = W_n r_n``, ``r_n`` the residuals of the ``r`` outputs
        conditioned on so far.
    :ivar rows: ``(N, r, K)`` ``G_n``: one row per output conditioned on so far.
    :ivar weight: ``(N, r, r)`` ``W_n``.
    """

    weighted: jax.Array
    rows: jax.Array
    weight: jax.Array

    def dense_rows(self) -> jax.Array:
        """``rows`` as ``(N, r, K)``."""
        return self.rows


class BlockBelief(Belief):
    """A :class:`Belief` after a first layer with one factor per output: ``rows`` is ``(N, r,
    K / r)``, row ``j`` on the ``j``-th block of draws only (``r`` times less memory and work
    than the zeros)."""

    def dense_rows(self) -> jax.Array:
        """``rows`` as ``(N, r, K)``, with the zeros off each row's block."""
        return _spread(self.rows)


def _spread(blocks: jax.Array) -> jax.Array:
    """``(N, P, M)`` rows, row ``p`` on block ``p``, as ``(N, P, P M)`` with the zeros."""
    N, P, M = blocks.shape
    eye = jnp.eye(P, dtype=blocks.dtype)
    return (blocks[:, :, None, :] * eye[None, :, :, None]).reshape(N, P, P * M)


def output_moments(
    alpha: jax.Array,
    base_var: jax.Array,
    mean: jax.Array,
    own: jax.Array,
    cross: jax.Array | None = None,
    belief: Belief | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Moments of one layer's (residual) output at each point, its inducing values
    ``vec(u) = vec(mean) + cross eps_before + own eps_own``.

    The output's rows in the draws, ``H T`` (``H = I_P (x) alpha^T``), cost ``O(N P M K)``
    for ``K`` draws of the layers before, and ``O(N P M^2)`` for ``own`` given as one factor per
    output (DSVI's cost, skipping the factors' zero triangles as DSVI does); no covariance over
    the inducing values is formed.

    :param alpha: ``(N, M)`` weights (see :func:`point_projection`).
    :param base_var: ``(N,)`` residual prior variances (see :func:`point_projection`).
    :param mean: ``(P, M)`` the guide's mean of ``u``.
    :param own: ``(P, M, M)`` one lower factor per output (a block-diagonal ``T`` of the
        layer's own draws; upper triangles ignored), or the ``(P M, P M)`` factor (blocks
        above its block diagonal ignored; see :func:`block_lower_rows`).
    :param cross: ``(P M, K)`` how ``u`` depends on the draws of the layers before (``None``:
        on none).
    :param belief: each point's belief over those ``K`` draws (required with ``cross``).
    :return: ``(mean (N, P), cov (N, P, P), gain (N, P, K + P M))``: the mean (add the mean
        function), the covariance, and the output's covariance with the draws (those before,
        then the layer's own), needed by :func:`condition_on_output`; without ``cross`` and
        with ``own`` as blocks, ``gain`` is ``(N, P, M)``, output ``p``'s row over its own
        block of draws only (``P`` times less memory and work than the zeros).
    :raises ValueError: if ``own`` is neither ``(P, M, M)`` nor ``(P M, P M)``.
    """
    N, M = alpha.shape
    P = mean.shape[0]
    eye = jnp.eye(P, dtype=alpha.dtype)
    out_mean = alpha @ mean.T
    if own.ndim == 3:
        _check_blocks(own, (P, M, M), "own")
        # output p's row over its own block, D_p^T alpha, skipping D_p's zero triangle
        gain = jnp.transpose(lower_factors_transpose_times(own, alpha.T), (2, 0, 1))
        out_cov = jnp.sum(gain**2, axis=-1)[..., None] * eye
    else:
        _check_blocks(own, (P * M, P * M), "own")
        gain = block_lower_rows(alpha, own)
        out_cov = jnp.einsum("npk,nqk->npq", gain, gain)
    if cross is not None:
        assert belief is not None  # the draws before have a belief
        rows = jnp.einsum("nm,pmk->npk", alpha, cross.reshape(P, M, cross.shape[-1]))
        # rows G^T v, rows B rows^T and rows B with B = I - G^T W G: products with the r
        # conditioned rows (block rows: each against its own block of draws)
        blocks = isinstance(belief, BlockBelief)
        if blocks:
            by_block = rows.reshape(N, P, *belief.rows.shape[1:])
            seen = jnp.einsum("npjm,njm->npj", by_block, belief.rows)  # (N, P, r)
        else:
            seen = jnp.einsum("npk,njk->npj", rows, belief.rows)
        out_mean = out_mean + jnp.einsum("npj,nj->np", seen, belief.weighted)
        weighted = jnp.einsum("npj,nji->npi", seen, belief.weight)
        out_cov = (
            out_cov
            + jnp.einsum("npk,nqk->npq", rows, rows)
            - jnp.einsum("npj,nqj->npq", weighted, seen)
        )
        if blocks:
            before = (by_block - weighted[..., None] * belief.rows[:, None]).reshape(rows.shape)
        else:
            before = rows - jnp.einsum("npj,njk->npk", weighted, belief.rows)
        own_rows = _spread(gain) if own.ndim == 3 else gain
        gain = jnp.concatenate([before, own_rows], axis=-1)
    return out_mean, out_cov + base_var[:, None, None] * eye, gain


@jax.custom_vjp
def block_lower_rows(alpha: jax.Array, factor: jax.Array) -> jax.Array:
    """Each point's rows ``H_n T`` (``H_n = I_P (x) alpha_n^T``) for a block lower-triangular
    factor ``T``: row ``p`` of point ``n`` is ``alpha_n^T T[pM:(p+1)M, :]``.

    Reads only ``T``'s blocks on and below the block diagonal, ``(P + 1) / (2 P)`` of the dense
    product's work, in ``P`` matrix products (one per column block). Reverse mode only
    (``jax.jvp`` is not defined): the reverse pass is written as ``alpha^T G`` and ``G T^T``, so
    that XLA's CPU matrix product reads the ``(N, P, P M)`` cotangent ``G`` with the points'
    axis leading; JAX's own rule contracts ``G`` over that axis, and the transposing copy that
    needs was more than half of a joint guide's step (``benchmarks/topics/scale.md``).

    :param alpha: ``(N, M)`` weights (see :func:`point_projection`).
    :param factor: ``(P M, P M)`` ``T``; its blocks above the block diagonal are ignored.
    :return: ``(N, P, P M)``.
    """
    return _block_lower_rows_forward(alpha, factor)[0]


def _block_lower_rows_forward(
    alpha: jax.Array, factor: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, list[jax.Array]]]:
    N, M = alpha.shape
    P = factor.shape[0] // M
    # column block c of T, rows c M onwards, as (M, (P - c) M): its blocks side by side
    columns = [
        jnp.transpose(factor[c * M :, c * M : (c + 1) * M].reshape(P - c, M, M), (1, 0, 2)).reshape(
            M, -1
        )
        for c in range(P)
    ]
    rows = [
        jnp.pad((alpha @ W).reshape(N, P - c, M), ((0, 0), (c, 0), (0, 0)))
        for c, W in enumerate(columns)
    ]
    return jnp.stack(rows, axis=2).reshape(N, P, P * M), (alpha, columns)


def _block_lower_rows_backward(
    residuals: tuple[jax.Array, list[jax.Array]], cotangent: jax.Array
) -> tuple[jax.Array, jax.Array]:
    alpha, columns = residuals
    N, M = alpha.shape
    P = len(columns)
    by_block = cotangent.reshape(N, P, P, M)
    d_alpha = jnp.zeros_like(alpha)
    d_columns = []
    for c, W in enumerate(columns):
        G = by_block[:, c:, c, :].reshape(N, -1)
        d_alpha = d_alpha + G @ W.T
        d_W = jnp.transpose((alpha.T @ G).reshape(M, P - c, M), (1, 0, 2)).reshape(-1, M)
        d_columns.append(jnp.pad(d_W, ((c * M, 0), (0, 0))))
    return d_alpha.astype(alpha.dtype), jnp.concatenate(d_columns, axis=1).astype(columns[0].dtype)


block_lower_rows.defvjp(_block_lower_rows_forward, _block_lower_rows_backward)


def _stabilized(out_cov: jax.Array) -> jax.Array:
    """``out_cov`` plus round-off-sized diagonal (machine epsilon times its mean variance).

    No jitter is needed beyond that: the output variance has a floor ``k(x,x) - q(x,x) > 0``
    from the jittered ``K(Z, Z)``, so the factor stays exact to round-off (and a guide that
    correlates nothing reproduces the factorized path to ~1e-15).
    """
    P = out_cov.shape[-1]
    eps = jnp.finfo(out_cov.dtype).eps
    scale = jnp.trace(out_cov, axis1=-2, axis2=-1)[..., None, None] / P
    return out_cov + eps * jnp.maximum(scale, eps) * jnp.eye(P, dtype=out_cov.dtype)


def _output_factor(out_cov: jax.Array) -> jax.Array:
    if out_cov.shape[-1] == 1:
        # one output: the square root, exactly as the factorized (DSVI) path takes it
        return jnp.sqrt(jnp.maximum(out_cov, 0.0))
    return jnp.linalg.cholesky(_stabilized(out_cov))


def sample_output(mean: jax.Array, out_cov: jax.Array, eps: jax.Array) -> jax.Array:
    """``mean + chol(out_cov) eps`` per point.

    :param mean: ``(N, P)`` output means.
    :param out_cov: ``(N, P, P)`` output covariances (see :func:`output_moments`).
    :param eps: ``(N, P)`` standard-normal draws, one per point.
    :return: ``(N, P)``.
    """
    return mean + jnp.einsum("npq,nq->np", _output_factor(out_cov), eps)


def output_at_nodes(mean: jax.Array, out_cov: jax.Array, nodes: jax.Array) -> jax.Array:
    """``mean + chol(out_cov) node`` at every point for each of ``K`` quadrature nodes.

    (Kept apart from :func:`sample_output`: with as many nodes as points a shape test cannot
    tell nodes from per-point draws.)

    :param mean: ``(N, P)`` output means.
    :param out_cov: ``(N, P, P)`` output covariances (see :func:`output_moments`).
    :param nodes: ``(K, P)`` quadrature nodes shared by the points, or ``(K, 1, P)`` (the same),
        or ``(K, N, P)`` standard-normal draws per point.
    :return: ``(K, N, P)``.
    """
    factor = _output_factor(out_cov)
    if nodes.ndim == 2:
        return mean[None] + jnp.einsum("npq,kq->knp", factor, nodes)
    return mean[None] + (factor[None] @ nodes[..., None])[..., 0]


def condition_on_output(
    gain: jax.Array,
    out_cov: jax.Array,
    residual: jax.Array,
    belief: Belief | None = None,
    blocks: bool = False,
) -> Belief:
    """Kalman update of the belief on the sampled output of the current layer.

    :param gain: ``(N, P, K')`` from :func:`output_moments` (``K'``: the draws before and the
        layer's own).
    :param out_cov: ``(N, P, P)`` output covariance from :func:`output_moments`.
    :param residual: ``(N, P)`` sampled output minus :func:`output_moments`'s mean.
    :param belief: the belief over the draws before (``None``: none).
    :param blocks: ``gain`` is ``(N, P, M)``, each output's row over its own block of draws
        (:func:`output_moments` without ``cross``, ``own`` as blocks); only without ``belief``
        (the result is then a :class:`BlockBelief`).
    :return: the belief over all ``K'`` draws given this output: ``gain`` joins the rows,
        ``S^{-1}`` the weight and ``S^{-1} r`` the weighted residuals (``S`` the output
        covariance; the mean over the draws moves by ``gain^T S^{-1} r``). Cost ``O(N P K' + N
        P^3)``: no triangular solve against ``gain``.
    """
    P = out_cov.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(P, dtype=out_cov.dtype), out_cov.shape)
    if blocks:  # independent outputs: S is diagonal
        assert belief is None  # block rows come from a first layer
        precision = eye / jnp.diagonal(_stabilized(out_cov), axis1=-2, axis2=-1)[..., None]
        return BlockBelief(jnp.einsum("npq,nq->np", precision, residual), gain, precision)
    chol = jnp.linalg.cholesky(_stabilized(out_cov))
    chol_inv = solve_triangular(chol, eye, lower=True)
    precision = jnp.einsum("nqp,nqr->npr", chol_inv, chol_inv)  # S^{-1} = L^{-T} L^{-1}
    weighted = jnp.einsum("npq,nq->np", precision, residual)
    if belief is None:
        return Belief(weighted, gain, precision)
    before = belief.dense_rows()
    before = jnp.pad(before, ((0, 0), (0, 0), (0, gain.shape[-1] - before.shape[-1])))
    rows = jnp.concatenate([before, gain], axis=1)
    r = belief.weight.shape[-1]
    weight = jnp.concatenate(
        [
            jnp.pad(belief.weight, ((0, 0), (0, 0), (0, P))),
            jnp.pad(precision, ((0, 0), (0, 0), (r, 0))),
        ],
        axis=1,
    )
    return Belief(jnp.concatenate([belief.weighted, weighted], axis=-1), rows, weight)


def block_diag_covariance(scale_tril: ArrayLike) -> jax.Array:
    """Block-diagonal covariance ``blockdiag(L_1 L_1^T, ..., L_P L_P^T)``.

    :param scale_tril: ``(P, M, M)`` lower factors, one per output.
    :return: ``(P * M, P * M)`` covariance.
    """
    scale_tril = jnp.asarray(scale_tril)
    return block_diag(*jnp.einsum("pij,pkj->pik", scale_tril, scale_tril))


def _check_blocks(blocks: jax.Array, expected: tuple[int, ...], name: str) -> None:
    """A factor (one per output, or one over all outputs) must be ``expected``: a wrong number
    of outputs would otherwise broadcast, or be cut, silently.

    :raises ValueError: for another shape.
    """
    if blocks.shape != expected:
        raise ValueError(
            f"{name}: the factor must have shape {expected} for these outputs and inducing "
            f"points, got {blocks.shape}"
        )


def chain_cross(
    coupling: jax.Array, parent_own: jax.Array, parent_cross: jax.Array | None = None
) -> jax.Array:
    """How a chain link's inducing values depend on the draws of the layers before it.

    ``q(u_l | u_{l-1}) = N(m_l + C (u_{l-1} - m_{l-1}), D D^T)`` with ``u_{l-1} - m_{l-1} =
    [cross_{l-1}, own_{l-1}] eps``: ``cross_l = C [cross_{l-1}, own_{l-1}]`` (computed once per
    step, shared by the points).

    :param coupling: ``(J, K_l)`` ``C``.
    :param parent_own: ``(P, M, M)`` the parent's factors ``D_{l-1}`` (``K_l = P M``).
    :param parent_cross: ``(K_l, K)`` the parent's own ``cross`` (``None`` for a first link).
    :return: ``(J, K + K_l)``.
    :raises ValueError: if the parent's blocks do not cover ``coupling``'s columns.
    """
    P, M = parent_own.shape[0], coupling.shape[-1] // max(parent_own.shape[0], 1)
    columns = coupling.shape[-1]
    _check_blocks(parent_own, (P, M, M), f"parent_own (for a coupling with {columns} columns)")
    own = jnp.einsum("jpm,pmn->jpn", coupling.reshape(-1, P, M), parent_own).reshape(-1, P * M)
    return own if parent_cross is None else jnp.concatenate([coupling @ parent_cross, own], -1)


def chain_gauss_kl_term(
    mean: jax.Array,
    scale_tril: jax.Array,
    *,
    cross: jax.Array | None = None,
    prior_chol: jax.Array | None = None,
) -> jax.Array:
    """One layer's share of ``KL[q(u_1..u_L) || prod_l p(u_l)]`` for a chain-structured ``q``.

    With ``vec(u_l) = vec(m_l) + [cross_l, D_l] eps`` in the guide's standard-normal draws
    (:func:`chain_cross`), ``q(u_l)`` has the covariance ``S_l = cross_l cross_l^T + D_l D_l^T``
    and the KL is ``sum_l 0.5 [tr(K_l^{-1} S_l) + m_l^T K_l^{-1} m_l - d_l + log|K_l|] -
    log|D_l|`` (the entropy of a chain is the sum of its conditional entropies). The trace is
    ``||L^{-1} [cross_p, D_p]||_F^2`` per output ``p``: no covariance is formed, ``O(P M^2 K)``
    (``O(P M K)`` whitened).

    :param mean: ``(P, M)`` marginal mean ``m_l`` (about the prior mean).
    :param scale_tril: ``(P, M, M)`` ``D_l``.
    :param cross: ``(P M, K)`` how ``u_l`` depends on the draws of the layers before it
        (``None``: a first link).
    :param prior_chol: ``(M, M)`` Cholesky factor of ``K_l`` shared by the outputs; ``None``
        for the whitened prior ``N(0, I)``.
    :return: scalar, this layer's term (nats).
    """
    P, M = mean.shape
    factors = [scale_tril] if cross is None else [scale_tril, cross.reshape(P, M, -1)]
    if prior_chol is None:
        trace = sum(jnp.sum(f**2) for f in factors)
        mahalanobis = jnp.sum(mean**2)
        logdet_p: float | jax.Array = 0.0
    else:
        Linv = solve_triangular(prior_chol, jnp.eye(M, dtype=mean.dtype), lower=True)
        trace = sum(jnp.sum(jnp.einsum("im,pmk->pik", Linv, f) ** 2) for f in factors)
        mahalanobis = jnp.sum((mean @ Linv.T) ** 2)
        logdet_p = P * 2.0 * jnp.sum(jnp.log(jnp.diagonal(prior_chol)))
    logdet_d = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(scale_tril, axis1=-2, axis2=-1))))
    return 0.5 * (trace + mahalanobis - P * M + logdet_p) - logdet_d
