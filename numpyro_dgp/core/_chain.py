"""Exact per-point propagation through layers whose inducing values are jointly Gaussian.

With a guide that correlates the inducing values of different layers, the ELBO needs each
point's own chain of layer outputs. For one point, layer ``l`` is a linear-Gaussian
observation of its inducing values::

    f_l = mean_l(f_{l-1}) + H u_l + e,   H = I_P (x) alpha_l(f_{l-1})^T,   e ~ N(0, s_l I_P),

with ``alpha`` and ``s = k(f, f) - q(f, f)`` from :func:`point_projection`. A Gaussian belief
``N(a, B)`` over the inducing values not yet used (the current layer's block first) gives
the output's moments (:func:`output_moments`); the sampled output then updates the belief
like a Kalman filter (:func:`condition_on_output`), and for a chain-structured guide the
belief moves to the next layer through ``q(u_{l+1} | u_l)`` (:func:`chain_transition`).
This is the exact per-point recursion, not the recursion of eqs. (16)-(17) of Ustyuzhaninov
et al. (2020), which is wrong for ``L >= 3``.

A point's belief covariance is a covariance shared by the points minus a low-rank correction
of its own (:class:`Belief`): each conditioning on a layer's ``P`` outputs adds ``P`` rows.
Memory and cost per point are ``O(r K)`` for ``r`` outputs conditioned on so far, instead of
the ``O(K^2)`` of a dense per-point covariance (a 1000-point minibatch with ``K = 800``
inducing values would need 5 GB per covariance).

Shapes: ``N`` points, ``P`` outputs, ``M`` inducing points, belief over ``K >= P * M`` values
(the current layer's ``u`` flattened output-major, ``vec(u) = u.reshape(-1)`` for ``u (P, M)``).
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
from numpyro_dgp.core._triangular import lower_gram


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
    """A Gaussian belief per point over ``K`` inducing values:
    ``N(loc_n, shared_cov - downdate_n^T downdate_n)``.

    :ivar loc: ``(K,)`` (the same for every point) or ``(N, K)``.
    :ivar shared_cov: ``(K, K)`` the covariance before any conditioning, or ``(P, M, M)`` the
        diagonal blocks of a block-diagonal one (``K = P M``: a chain's first layer, whose
        products then skip the zero blocks).
    :ivar downdate: ``(N, r, K)`` each point's correction, or ``None`` (none yet).
    """

    loc: jax.Array
    shared_cov: jax.Array
    downdate: jax.Array | None = None

    def covariance(self) -> jax.Array:
        """The dense covariance, ``(K, K)`` or ``(N, K, K)`` (for checks; the recursion never
        forms it)."""
        shared = _dense(self.shared_cov)
        if self.downdate is None:
            return shared
        return shared - jnp.einsum("njk,njl->nkl", self.downdate, self.downdate)

    def tail(self, start: int) -> Belief:
        """The belief over the values from index ``start`` on."""
        downdate = None if self.downdate is None else self.downdate[..., start:]
        return Belief(self.loc[..., start:], _dense(self.shared_cov)[start:, start:], downdate)


def _dense(cov: jax.Array) -> jax.Array:
    """A shared covariance as a ``(K, K)`` matrix (from its diagonal blocks if it has them)."""
    return cov if cov.ndim == 2 else block_diag(*[cov[p] for p in range(cov.shape[0])])


def output_moments(
    alpha: jax.Array, base_var: jax.Array, belief: Belief, out_dim: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Moments of one layer's (residual) output at each point under the belief.

    :param alpha: ``(N, M)`` weights (see :func:`point_projection`).
    :param base_var: ``(N,)`` residual prior variances (see :func:`point_projection`).
    :param belief: the belief over ``K`` values; the first ``P * M`` are this layer's.
    :param out_dim: ``P``.
    :return: ``(mean (N, P), cov (N, P, P), HB (N, P, K))``: the mean (add the mean function),
        the covariance, and the output's cross-covariance with the belief (needed by
        :func:`condition_on_output`).
    :raises ValueError: if the belief's covariance blocks are not ``(P, M, M)``.
    """
    N, M = alpha.shape
    P = int(out_dim)
    loc = jnp.broadcast_to(belief.loc, (N,) + belief.loc.shape[-1:])
    mean = jnp.einsum("npm,nm->np", loc[:, : P * M].reshape(N, P, M), alpha)
    # row p of H_n times the shared covariance; from the diagonal blocks alone when it is
    # block-diagonal ((P, M, M))
    cov = belief.shared_cov
    if cov.ndim == 2:
        HB = jnp.einsum("nm,pmk->npk", alpha, cov[: P * M].reshape(P, M, cov.shape[-1]))
    else:
        _check_blocks(cov, (P, M, M), "the belief's shared_cov")
        rows = jnp.einsum("nm,pmk->npk", alpha, cov)  # output p's block, (N, P, M)
        eye = jnp.eye(P, dtype=rows.dtype)
        HB = (rows[:, :, None, :] * eye[None, :, :, None]).reshape(N, P, P * M)
    if belief.downdate is not None:
        V = belief.downdate  # (N, r, K)
        HV = jnp.einsum("nm,njpm->npj", alpha, V[:, :, : P * M].reshape(N, V.shape[1], P, M))
        HB = HB - jnp.einsum("npj,njk->npk", HV, V)
    HBH = jnp.einsum("npqm,nm->npq", HB[:, :, : P * M].reshape(N, P, P, M), alpha)
    out_cov = HBH + base_var[:, None, None] * jnp.eye(P, dtype=alpha.dtype)
    return mean, out_cov, HB


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
    belief: Belief, HB: jax.Array, out_cov: jax.Array, residual: jax.Array
) -> Belief:
    """Kalman update of the belief on the sampled output of the current layer.

    :param belief: the belief (see :func:`output_moments`).
    :param HB: ``(N, P, K)`` cross-covariance from :func:`output_moments`.
    :param out_cov: ``(N, P, P)`` output covariance from :func:`output_moments`.
    :param residual: ``(N, P)`` sampled output minus :func:`output_moments`'s mean.
    :return: the belief given this output: the mean moves by ``W^T L^{-1} r`` and the
        correction gains the ``P`` rows ``W = L^{-1} H B`` (``L L^T`` the output covariance),
        so the covariance ``B - W^T W`` stays exactly symmetric.
    """
    N, P, K = HB.shape
    loc = jnp.broadcast_to(belief.loc, (N,) + belief.loc.shape[-1:])
    chol = jnp.linalg.cholesky(_stabilized(out_cov))
    W = solve_triangular(chol, HB, lower=True)  # (N, P, K)
    r = solve_triangular(chol, residual[..., None], lower=True)[..., 0]  # (N, P)
    new_loc = loc + jnp.einsum("npk,np->nk", W, r)
    downdate = W if belief.downdate is None else jnp.concatenate([belief.downdate, W], axis=1)
    return Belief(new_loc, belief.shared_cov, downdate)


def block_diag_covariance(scale_tril: ArrayLike) -> jax.Array:
    """Block-diagonal covariance ``blockdiag(L_1 L_1^T, ..., L_P L_P^T)``.

    :param scale_tril: ``(P, M, M)`` lower factors, one per output.
    :return: ``(P * M, P * M)`` covariance.
    """
    return _dense(block_covariances(scale_tril))


def block_covariances(scale_tril: ArrayLike) -> jax.Array:
    """The diagonal blocks ``L_p L_p^T`` of :func:`block_diag_covariance`, without its zeros.

    :param scale_tril: ``(P, M, M)`` lower factors, one per output.
    :return: ``(P, M, M)``.
    """
    scale_tril = jnp.asarray(scale_tril)
    return jnp.einsum("pij,pkj->pik", scale_tril, scale_tril)


def congruence(coupling: ArrayLike, cov: ArrayLike) -> jax.Array:
    """``C S C^T``, with ``S`` ``(K, K)`` or the ``(P, M, M)`` diagonal blocks of a
    block-diagonal ``S`` (then ``C_p S_p`` per block: ``P`` times fewer FLOPs in the first
    product than with the zeros).

    :param coupling: ``(J, K)`` ``C``.
    :param cov: ``(K, K)``, or ``(P, M, M)`` with ``K = P M``.
    :return: ``(J, J)``.
    :raises ValueError: if ``(P, M, M)`` blocks do not cover ``coupling``'s ``K`` columns.
    """
    coupling, cov = jnp.asarray(coupling), jnp.asarray(cov)
    if cov.ndim == 2:
        return coupling @ cov @ coupling.T
    P, M = cov.shape[0], coupling.shape[-1] // max(cov.shape[0], 1)
    _check_blocks(cov, (P, M, M), f"cov (for a coupling with {coupling.shape[-1]} columns)")
    per_block = jnp.einsum("jpm,pmn->jpn", coupling.reshape(-1, P, M), cov)
    return per_block.reshape(coupling.shape[0], P * M) @ coupling.T


def _check_blocks(blocks: jax.Array, expected: tuple[int, int, int], name: str) -> None:
    """Diagonal blocks of a block-diagonal covariance must be ``expected``: a wrong number of
    outputs would otherwise broadcast silently.

    :raises ValueError: for another shape.
    """
    if blocks.shape != expected:
        raise ValueError(
            f"{name}: block-diagonal covariance blocks must have shape {expected}, got "
            f"{blocks.shape}"
        )


def joint_covariance(scale_tril: ArrayLike) -> jax.Array:
    """The covariance ``L L^T`` of a joint Gaussian over several layers' inducing values.

    Computed from the blocks of the lower factor that are not zero, each block of the product
    summing only over the columns where both factors' rows can be non-zero: over two layers of
    width 8 and 1 at ``M = 500`` (``K = 4500``, 9 blocks) 23% of the dense product's FLOPs, the
    largest product of an ``AutoJointDGP`` step.

    :param scale_tril: ``(K, K)`` lower factor; its upper triangle is ignored.
    :return: ``(K, K)`` covariance.
    """
    return lower_gram(jnp.asarray(scale_tril))


def chain_transition(
    belief: Belief,
    parent_mean: jax.Array,
    mean: jax.Array,
    coupling: jax.Array,
    scale_tril: jax.Array,
) -> Belief:
    """Belief over ``u_{l+1}`` from the belief over ``u_l`` and ``q(u_{l+1} | u_l)``.

    ``q(u_{l+1} | u_l) = N(m_{l+1} + C (u_l - m_l), D D^T)``: the belief ``N(a, B)`` over
    ``vec(u_l)`` maps to ``N(m_{l+1} + C (a - m_l), C B C^T + D D^T)`` (the shared part
    ``C S C^T + D D^T``, each point's correction ``V C^T``).

    :param belief: the belief over ``vec(u_l)`` (``K_l`` values).
    :param parent_mean: ``(K_l,)`` ``vec(m_l)``.
    :param mean: ``(P, M)`` ``m_{l+1}``.
    :param coupling: ``(P * M, K_l)`` ``C``.
    :param scale_tril: ``(P, M, M)`` ``D``, one factor per output.
    :return: the belief over ``vec(u_{l+1})`` (``P M`` values).
    """
    new_loc = mean.reshape(-1) + (belief.loc - parent_mean) @ coupling.T
    shared = congruence(coupling, belief.shared_cov) + block_diag_covariance(scale_tril)
    downdate = (
        None if belief.downdate is None else jnp.einsum("njk,ik->nji", belief.downdate, coupling)
    )
    return Belief(new_loc, shared, downdate)


def chain_gauss_kl_term(
    mean: jax.Array,
    scale_tril: jax.Array,
    marginal_cov: jax.Array,
    prior_chol: jax.Array | None = None,
) -> jax.Array:
    """One layer's share of ``KL[q(u_1..u_L) || prod_l p(u_l)]`` for a chain-structured ``q``.

    With ``q(u_l | u_{l-1}) = N(., D_l D_l^T)`` and marginal ``q(u_l) = N(m_l, S_l)``, the
    KL is ``sum_l 0.5 [tr(K_l^{-1} S_l) + m_l^T K_l^{-1} m_l - d_l + log|K_l|] - log|D_l|``
    (the entropy of a chain is the sum of its conditional entropies).

    :param mean: ``(P, M)`` marginal mean ``m_l`` (about the prior mean).
    :param scale_tril: ``(P, M, M)`` ``D_l``.
    :param marginal_cov: ``(P M, P M)`` ``S_l``, or its ``(P, M, M)`` diagonal blocks (all this
        term reads).
    :param prior_chol: ``(M, M)`` Cholesky factor of ``K_l`` shared by the outputs; ``None``
        for the whitened prior ``N(0, I)``.
    :return: scalar, this layer's term (nats).
    :raises ValueError: if ``(P, M, M)`` blocks are of another shape.
    """
    P, M = mean.shape
    if marginal_cov.ndim == 3:
        _check_blocks(marginal_cov, (P, M, M), "marginal_cov")
        blocks = marginal_cov
    else:
        blocks = marginal_cov.reshape(P, M, P, M)[jnp.arange(P), :, jnp.arange(P), :]  # (P, M, M)
    if prior_chol is None:
        trace = jnp.sum(jnp.trace(blocks, axis1=-2, axis2=-1))
        mahalanobis = jnp.sum(mean**2)
        logdet_p: float | jax.Array = 0.0
    else:
        Linv = solve_triangular(prior_chol, jnp.eye(M, dtype=mean.dtype), lower=True)
        trace = jnp.sum(jnp.einsum("im,pmn,in->p", Linv, blocks, Linv))
        mahalanobis = jnp.sum((mean @ Linv.T) ** 2)
        logdet_p = P * 2.0 * jnp.sum(jnp.log(jnp.diagonal(prior_chol)))
    logdet_d = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(scale_tril, axis1=-2, axis2=-1))))
    return 0.5 * (trace + mahalanobis - P * M + logdet_p) - logdet_d
