"""numpyro_dgp.core against independent dense float64 NumPy/SciPy references."""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import scipy.linalg  # noqa: E402
from scipy.stats import multivariate_normal  # noqa: E402

from numpyro_dgp import core  # noqa: E402
from numpyro_dgp.core import (  # noqa: E402
    cholesky,
    conditional,
    default_jitter,
    expected_log_normal,
    gauss_hermite,
    gauss_hermite_product,
    gauss_kl,
    cholesky_and_inverse,
    inverse_cholesky,
    jittered_cholesky,
    kmeans,
    project,
    robust_cholesky,
    triangular_inverse,
)
from tests._mc import z_threshold  # noqa: E402

RTOL = 1e-8
ATOL = 1e-8


def _rs(seed=0):
    return np.random.RandomState(seed)


def rbf(X1, X2, variance=1.3, lengthscale=0.9):
    d2 = ((X1[:, None, :] - X2[None, :, :]) ** 2).sum(-1)
    return variance * np.exp(-0.5 * d2 / lengthscale**2)


def random_lower(rs, P, M, scale=0.5):
    """(P, M, M) lower-triangular factors with a positive, well-away-from-zero diagonal."""
    L = np.tril(rs.randn(P, M, M)) * scale
    idx = np.arange(M)
    L[:, idx, idx] = 0.3 + np.abs(L[:, idx, idx])
    return L


def setup_problem(seed=0, M=7, N=9, D=2, jitter=1e-8):
    rs = _rs(seed)
    Z = rs.randn(M, D) * 1.5
    X = rs.randn(N, D) * 1.5
    Kmm = rbf(Z, Z) + jitter * np.eye(M)
    Kmn = rbf(Z, X)
    Knn = rbf(X, X)
    L = np.linalg.cholesky(Kmm)
    return rs, Kmm, Kmn, Knn, L


def ref_conditional(Kmm, Kmn, Knn, q_mean, S, whiten):
    """Dense reference; S: (P, M, M) covariance of u (unwhitened) or v (whitened)."""
    Kinv = np.linalg.inv(Kmm)
    Knm = Kmn.T
    P = q_mean.shape[0]
    means, covs = [], []
    if whiten:
        L = np.linalg.cholesky(Kmm)
        LinvT = np.linalg.inv(L).T  # L^{-T}
        for p in range(P):
            means.append(Knm @ LinvT @ q_mean[p])
            covs.append(Knn - Knm @ Kinv @ Kmn + Knm @ LinvT @ S[p] @ LinvT.T @ Kmn)
    else:
        for p in range(P):
            means.append(Knm @ Kinv @ q_mean[p])
            covs.append(Knn - Knm @ Kinv @ (Kmm - S[p]) @ Kinv @ Kmn)
    return np.stack(means, axis=1), np.stack(covs)  # (N, P), (P, N, N)


# ======================================================================== conditional


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("sqrt_kind", ["full", "diag", "none"])
@pytest.mark.parametrize("P", [1, 3])
def test_conditional_matches_dense_reference(whiten, sqrt_kind, P):
    rs, Kmm, Kmn, Knn, L = setup_problem(seed=P + 10 * whiten)
    M = Kmm.shape[0]
    q_mean = rs.randn(P, M)
    if sqrt_kind == "full":
        q_sqrt = random_lower(rs, P, M)
        S = np.einsum("pij,pkj->pik", q_sqrt, q_sqrt)
    elif sqrt_kind == "diag":
        q_sqrt = 0.2 + np.abs(rs.randn(P, M))
        S = np.stack([np.diag(s**2) for s in q_sqrt])
    else:
        q_sqrt = None
        S = np.zeros((P, M, M))
    ref_mean, ref_cov = ref_conditional(Kmm, Kmn, Knn, q_mean, S, whiten)
    qs = None if q_sqrt is None else jnp.asarray(q_sqrt)

    mean, cov = conditional(
        jnp.asarray(Kmn), jnp.asarray(L), jnp.asarray(Knn), jnp.asarray(q_mean), qs,
        whiten=whiten, full_cov=True,
    )
    assert mean.shape == (Knn.shape[0], P) and cov.shape == (P,) + Knn.shape
    np.testing.assert_allclose(np.asarray(mean), ref_mean, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(cov), ref_cov, rtol=RTOL, atol=ATOL)

    mean2, var = conditional(
        jnp.asarray(Kmn), jnp.asarray(L), jnp.asarray(np.diag(Knn)), jnp.asarray(q_mean), qs,
        whiten=whiten, full_cov=False,
    )
    assert var.shape == (Knn.shape[0], P)
    np.testing.assert_allclose(np.asarray(mean2), ref_mean, rtol=RTOL, atol=ATOL)
    ref_var = np.stack([np.diag(c) for c in ref_cov], axis=1)
    np.testing.assert_allclose(np.asarray(var), ref_var, rtol=RTOL, atol=ATOL)
    # variances are the diagonal of the full covariance from the same code
    np.testing.assert_allclose(
        np.asarray(var), np.diagonal(np.asarray(cov), axis1=1, axis2=2).T, rtol=1e-12, atol=1e-12
    )


def test_conditional_diag_sqrt_equals_full_diagonal_sqrt():
    rs, Kmm, Kmn, Knn, L = setup_problem(seed=3)
    q_mean = rs.randn(2, 7)
    s = 0.1 + np.abs(rs.randn(2, 7))
    full = np.stack([np.diag(v) for v in s])
    for whiten in (True, False):
        a = conditional(Kmn, L, np.diag(Knn), q_mean, jnp.asarray(s), whiten=whiten)
        b = conditional(Kmn, L, np.diag(Knn), q_mean, jnp.asarray(full), whiten=whiten)
        for x, y in zip(a, b):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-12, atol=1e-12)


def test_conditional_interpolates_at_inducing_inputs():
    # Z = X, whitened, v = L^{-1} f, S = 0: the mean reproduces f and the variance vanishes
    rs = _rs(4)
    X = np.linspace(-3, 3, 8)[:, None]
    K = rbf(X, X, variance=1.0, lengthscale=0.7)
    L = np.linalg.cholesky(K)
    f = rs.randn(2, 8)
    q_mean = scipy.linalg.solve_triangular(L, f.T, lower=True).T  # (P, M)
    mean, var = conditional(K, L, np.diag(K), q_mean, None, whiten=True)
    np.testing.assert_allclose(np.asarray(mean), f.T, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(np.asarray(var), 0.0, atol=1e-8)
    _, cov = conditional(K, L, K, q_mean, jnp.zeros((2, 8, 8)), whiten=True, full_cov=True)
    np.testing.assert_allclose(np.asarray(cov), 0.0, atol=1e-8)
    # unwhitened: u = f directly
    mean_u, var_u = conditional(K, L, np.diag(K), f, None, whiten=False)
    np.testing.assert_allclose(np.asarray(mean_u), f.T, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(np.asarray(var_u), 0.0, atol=1e-8)


def test_conditional_with_prior_q_returns_prior():
    rs, Kmm, Kmn, Knn, L = setup_problem(seed=5)
    M, N, P = Kmm.shape[0], Knn.shape[0], 3
    zeros = np.zeros((P, M))
    # whitened prior: v ~ N(0, I), full and diagonal parameterizations
    for q_sqrt in (np.broadcast_to(np.eye(M), (P, M, M)), np.ones((P, M))):
        mean, cov = conditional(Kmn, L, Knn, zeros, jnp.asarray(q_sqrt), whiten=True, full_cov=True)
        np.testing.assert_allclose(np.asarray(mean), 0.0, atol=1e-12)
        np.testing.assert_allclose(
            np.asarray(cov), np.broadcast_to(Knn, (P, N, N)), rtol=RTOL, atol=ATOL
        )
    # unwhitened prior: u ~ N(0, Kmm), q_sqrt = chol(Kmm)
    mean, var = conditional(
        Kmn, L, np.diag(Knn), zeros, jnp.asarray(np.broadcast_to(L, (P, M, M))), whiten=False
    )
    np.testing.assert_allclose(np.asarray(mean), 0.0, atol=1e-12)
    np.testing.assert_allclose(
        np.asarray(var), np.tile(np.diag(Knn)[:, None], (1, P)), rtol=RTOL, atol=ATOL
    )


def test_project_matches_reference():
    _, Kmm, Kmn, _, L = setup_problem(seed=6)
    for whiten in (True, False):
        A, B = project(jnp.asarray(Kmn), jnp.asarray(L), whiten)
        A_ref = np.linalg.solve(L, Kmn)
        np.testing.assert_allclose(np.asarray(A), A_ref, rtol=RTOL, atol=ATOL)
        B_ref = A_ref if whiten else np.linalg.solve(Kmm, Kmn)
        np.testing.assert_allclose(np.asarray(B), B_ref, rtol=RTOL, atol=ATOL)


def test_conditional_shape_errors():
    rs, Kmm, Kmn, Knn, L = setup_problem(seed=7)
    q_mean = rs.randn(2, 7)
    with pytest.raises(ValueError):
        conditional(Kmn, L, np.diag(Knn), q_mean, jnp.ones((2, 7, 7, 1)))
    with pytest.raises(ValueError):
        conditional(Kmn, L, np.diag(Knn), q_mean, None, full_cov=True)
    with pytest.raises(ValueError):
        conditional(Kmn, L, Knn, q_mean, None, full_cov=False)

    with pytest.raises(ValueError, match="Kmm_chol_inv"):
        conditional(Kmn, L, np.diag(Knn), q_mean, None, Kmm_chol_inv=jnp.eye(6))


@pytest.mark.parametrize("whiten", [True, False])
def test_conditional_with_the_inverse_factor_given_matches_inverting_the_factor(whiten):
    # the same moments, and the same derivatives with respect to K(Z, Z) and K(Z, X), whether
    # the conditional inverts L or is handed inverse_cholesky's L^{-1} (whose rule differs)
    rs = np.random.RandomState(12)
    M, N, P = 9, 5, 2
    A = rs.randn(M, M)
    Kmm = jnp.asarray(A @ A.T + M * np.eye(M))
    Kmn, Knn = jnp.asarray(rs.randn(M, N)), jnp.asarray(10.0 + rs.rand(N))
    q_mean, q_sqrt = jnp.asarray(rs.randn(P, M)), jnp.asarray(np.tril(rs.randn(P, M, M)))
    W = jnp.asarray(rs.randn(2, N, P))

    def loss(Kmm, Kmn, given):
        inverse = inverse_cholesky(Kmm) if given else None
        mean, var = conditional(Kmn, cholesky(Kmm), Knn, q_mean, q_sqrt, whiten=whiten, Kmm_chol_inv=inverse)
        return jnp.sum(W[0] * mean) + jnp.sum(W[1] * jnp.sqrt(var))

    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(Kmm, Kmn, True)
    value_ref, grads_ref = jax.value_and_grad(loss, argnums=(0, 1))(Kmm, Kmn, False)
    assert float(value) == pytest.approx(float(value_ref), rel=1e-13)
    for g, g_ref in zip(grads, grads_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-12)


# ======================================================================== KL


def ref_kl(q_mean, S, K):
    """sum_p KL[N(m_p, S_p) || N(0, K)], dense."""
    P, M = q_mean.shape
    Kinv = np.linalg.inv(K)
    _, logdet_K = np.linalg.slogdet(K)
    total = 0.0
    for p in range(P):
        _, logdet_S = np.linalg.slogdet(S[p])
        total += 0.5 * (
            np.trace(Kinv @ S[p]) + q_mean[p] @ Kinv @ q_mean[p] - M + logdet_K - logdet_S
        )
    return total


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("sqrt_kind", ["full", "diag"])
def test_gauss_kl_matches_dense_formula(whiten, sqrt_kind):
    rs = _rs(20 + 2 * whiten + (sqrt_kind == "diag"))
    P, M = 3, 6
    q_mean = rs.randn(P, M)
    if sqrt_kind == "full":
        q_sqrt = random_lower(rs, P, M)
        S = np.einsum("pij,pkj->pik", q_sqrt, q_sqrt)
    else:
        q_sqrt = 0.2 + np.abs(rs.randn(P, M))
        S = np.stack([np.diag(s**2) for s in q_sqrt])
    if whiten:
        K, prior_chol = np.eye(M), None
    else:
        Z = rs.randn(M, 2) * 1.5
        K = rbf(Z, Z) + 1e-6 * np.eye(M)
        prior_chol = jnp.asarray(np.linalg.cholesky(K))
    kl = gauss_kl(jnp.asarray(q_mean), jnp.asarray(q_sqrt), prior_chol)
    assert np.ndim(kl) == 0
    np.testing.assert_allclose(float(kl), ref_kl(q_mean, S, K), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("sqrt_kind", ["full", "diag"])
@pytest.mark.parametrize("M", [6, 130])  # 130: the products' two row blocks
def test_gauss_kl_whitens_with_the_given_inverse_factor(M, sqrt_kind):
    # with L^{-1} given (a non-whitened layer's factorization builds it) the KL takes products
    # instead of solves: the dense formula's value, and the solves' gradient in q
    rs = _rs(40 + M)
    P = 3
    q_mean = jnp.asarray(rs.randn(P, M))
    q_sqrt = jnp.asarray(random_lower(rs, P, M) if sqrt_kind == "full" else 0.2 + np.abs(rs.randn(P, M)))
    Z = rs.randn(M, 2) * 3.0
    K = rbf(Z, Z) + 1e-2 * np.eye(M)
    L = np.linalg.cholesky(K)
    Linv = jnp.asarray(np.linalg.inv(L))
    S = np.einsum("pij,pkj->pik", q_sqrt, q_sqrt) if sqrt_kind == "full" else np.stack([np.diag(s**2) for s in q_sqrt])
    products = jax.value_and_grad(lambda m, s: gauss_kl(m, s, L, Linv), argnums=(0, 1))(q_mean, q_sqrt)
    solves = jax.value_and_grad(lambda m, s: gauss_kl(m, s, L), argnums=(0, 1))(q_mean, q_sqrt)
    # the dense formula, log det S_p from the factor's diagonal (slogdet of a random factor's
    # product loses digits at M = 130)
    Kinv, m = np.linalg.inv(K), np.asarray(q_mean)
    diagonals = np.asarray(q_sqrt) if sqrt_kind == "diag" else np.diagonal(np.asarray(q_sqrt), axis1=1, axis2=2)
    dense = 0.5 * sum(np.trace(Kinv @ S[p]) + m[p] @ Kinv @ m[p] - M + np.linalg.slogdet(K)[1]
                      - 2 * np.sum(np.log(diagonals[p])) for p in range(P))
    np.testing.assert_allclose(float(products[0]), dense, rtol=1e-9)
    np.testing.assert_allclose(float(products[0]), float(solves[0]), rtol=1e-11)
    for got, expected in zip(products[1], solves[1]):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * float(np.max(np.abs(expected))))
    # the given inverse's upper triangle is not read (as the solves' is not there)
    noisy = Linv + jnp.triu(jnp.asarray(rs.randn(M, M)), 1)
    np.testing.assert_allclose(float(gauss_kl(q_mean, q_sqrt, L, noisy)), float(products[0]), rtol=1e-13)
    with pytest.raises(ValueError, match="prior_chol_inv must have prior_chol's shape"):
        gauss_kl(q_mean, q_sqrt, L, Linv[:-1, :-1])
    with pytest.raises(ValueError, match="prior_chol_inv needs prior_chol"):
        gauss_kl(q_mean, q_sqrt, None, Linv)


def test_gauss_kl_zero_when_q_equals_p():
    rs = _rs(30)
    M, P = 6, 2
    Z = rs.randn(M, 2)
    K = rbf(Z, Z) + 1e-3 * np.eye(M)
    L = np.linalg.cholesky(K)
    zeros = np.zeros((P, M))
    assert abs(float(gauss_kl(zeros, jnp.asarray(np.broadcast_to(np.eye(M), (P, M, M)))))) < 1e-12
    assert abs(float(gauss_kl(zeros, jnp.ones((P, M))))) < 1e-12
    assert abs(float(gauss_kl(zeros, jnp.asarray(np.broadcast_to(L, (P, M, M))), L))) < 1e-9
    # a diagonal prior matched by a diagonal q
    Kd = np.diag(0.5 + rs.rand(M))
    kl = gauss_kl(zeros, jnp.asarray(np.tile(np.sqrt(np.diag(Kd)), (P, 1))), np.linalg.cholesky(Kd))
    assert abs(float(kl)) < 1e-12


def test_gauss_kl_nonnegative_random():
    rs = _rs(31)
    P, M = 2, 5
    kl_white = jax.jit(lambda m, s: gauss_kl(m, s))
    kl_prior = jax.jit(lambda m, s, L: gauss_kl(m, s, L))
    for _ in range(10):
        q_mean = rs.randn(P, M) * rs.rand()
        Z = rs.randn(M, 2) * 2
        L = np.linalg.cholesky(rbf(Z, Z) + 1e-4 * np.eye(M))
        for q_sqrt in (random_lower(rs, P, M, scale=rs.rand()), 0.1 + rs.rand(P, M)):
            assert float(kl_white(q_mean, q_sqrt)) >= 0.0
            assert float(kl_prior(q_mean, q_sqrt, L)) >= 0.0


@pytest.mark.stochastic
def test_gauss_kl_monte_carlo():
    rs = _rs(32)
    M = 3
    m = rs.randn(M) * 0.5
    Lq = random_lower(rs, 1, M, scale=0.3)[0]
    S = Lq @ Lq.T
    Z = rs.randn(M, 1) * 1.5
    K = rbf(Z, Z) + 1e-2 * np.eye(M)
    q = multivariate_normal(mean=m, cov=S)
    p = multivariate_normal(mean=np.zeros(M), cov=K)
    x = q.rvs(size=200_000, random_state=rs)
    d = q.logpdf(x) - p.logpdf(x)
    est, se = d.mean(), d.std(ddof=1) / np.sqrt(d.size)
    kl = float(gauss_kl(m[None], jnp.asarray(Lq[None]), np.linalg.cholesky(K)))
    assert abs(kl - est) < z_threshold() * se, (kl, est, se)


# ======================================================================== linalg


def test_jittered_cholesky_reconstructs():
    rs = _rs(40)
    A = rs.randn(8, 8)
    K = A @ A.T
    for jitter in (1e-6, 0.5):
        L = np.asarray(jittered_cholesky(jnp.asarray(K), jitter))
        assert np.allclose(L, np.tril(L))
        np.testing.assert_allclose(L @ L.T, K + jitter * np.eye(8), rtol=1e-10, atol=1e-10)
    # batched
    Kb = np.stack([K, K + np.eye(8)])
    Lb = np.asarray(jittered_cholesky(jnp.asarray(Kb), 1e-3))
    np.testing.assert_allclose(
        np.einsum("bij,bkj->bik", Lb, Lb), Kb + 1e-3 * np.eye(8), rtol=1e-10, atol=1e-10
    )


def test_robust_cholesky_recovers_from_singular():
    rs = _rs(41)
    V = rs.randn(50, 3) * 100.0
    K = V @ V.T  # exactly rank 3, entries ~1e4
    plain = np.asarray(jittered_cholesky(jnp.asarray(K), 1e-12))
    assert not np.all(np.isfinite(plain))  # precondition: plain Cholesky fails
    L, used = jax.jit(lambda k: robust_cholesky(k, 1e-12, max_tries=6, factor=100.0))(K)
    L, used = np.asarray(L), float(used)
    assert np.all(np.isfinite(L))
    assert used > 1e-12
    np.testing.assert_allclose(
        L @ L.T, K + used * np.eye(50), rtol=1e-8, atol=1e-8 * np.abs(K).max()
    )


def test_robust_cholesky_float32_near_duplicates():
    rs = _rs(42)
    base = rs.rand(10, 1)
    X = np.repeat(base, 5, axis=0) + 1e-6 * rs.randn(50, 1)
    K = jnp.asarray(rbf(X, X, variance=1.0, lengthscale=1.0), jnp.float32)
    jitter = 1e-7
    assert not np.all(np.isfinite(np.asarray(jittered_cholesky(K, jitter))))
    L, used = jax.jit(lambda k: robust_cholesky(k, jitter, max_tries=5, factor=10.0))(K)
    assert np.all(np.isfinite(np.asarray(L)))
    assert float(used) > jitter
    Ln = np.asarray(L, np.float64)
    np.testing.assert_allclose(
        Ln @ Ln.T, np.asarray(K, np.float64) + float(used) * np.eye(50), atol=1e-4
    )


def test_robust_cholesky_keeps_first_jitter_when_fine():
    rs = _rs(43)
    A = rs.randn(6, 6)
    K = jnp.asarray(A @ A.T + np.eye(6))
    L, used = robust_cholesky(K, 1e-6)
    assert float(used) == 1e-6
    L_plain = np.asarray(jittered_cholesky(K, 1e-6))
    np.testing.assert_allclose(np.asarray(L), L_plain, rtol=0, atol=0)
    # also under jit
    L2, used2 = jax.jit(lambda k: robust_cholesky(k, 1e-6))(K)
    np.testing.assert_allclose(np.asarray(L2), np.asarray(L), rtol=1e-12, atol=1e-12)
    assert float(used2) == 1e-6


@pytest.mark.parametrize("bad", [0.0, -1e-6, float("nan"), float("inf")])
def test_bad_jitter_raises(bad):
    K = jnp.eye(3)
    with pytest.raises(ValueError, match="jitter"):
        jittered_cholesky(K, bad)
    with pytest.raises(ValueError, match="jitter"):
        robust_cholesky(K, bad)


def test_triangular_inverse():
    rs = _rs(44)
    L = random_lower(rs, 1, 9)[0]
    np.testing.assert_allclose(
        np.asarray(triangular_inverse(jnp.asarray(L))), np.linalg.inv(L), rtol=1e-10, atol=1e-10
    )
    Lb = random_lower(rs, 4, 5)
    np.testing.assert_allclose(
        np.asarray(triangular_inverse(jnp.asarray(Lb))), np.linalg.inv(Lb), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("M", [1, 7, 32, 33, 100, 131])
def test_triangular_inverse_blocked_sizes(M):
    # the block recursion splits above 32: odd splits, batches, and an ignored upper triangle
    rs = _rs(M)
    Lb = random_lower(rs, 3, M) + 2.0 * np.eye(M)
    junk = np.triu(rs.randn(M, M), 1)
    Linv = np.asarray(triangular_inverse(jnp.asarray(Lb + junk)))
    np.testing.assert_allclose(Linv, np.linalg.inv(Lb), rtol=1e-10, atol=1e-10)


def _spd(rs, batch, M):
    A = rs.randn(batch, M, M)
    return A @ np.swapaxes(A, -1, -2) + M * np.eye(M)


def _jax_factor_and_inverse(K):
    """``(L, L^{-1})`` by JAX's own Cholesky and triangular solve (and their derivative rules)."""
    L = jnp.linalg.cholesky(K)
    return L, scipy_solve_lower(L, jnp.broadcast_to(jnp.eye(K.shape[-1]), K.shape))


@pytest.mark.parametrize("M", [5, 40, 100, 500])  # 500 (2 blocks) runs with --runslow
def test_cholesky_and_inverse_derivatives_match_jax(M):
    # The matmul-only derivative rules against JAX's own (triangular-solve) rules, in reverse
    # mode through a function of both the factor and its inverse, for a non-symmetric
    # perturbation direction (the forward pass symmetrizes its input). Above 128 the rules'
    # products skip zero blocks (2 at 500).
    rs = _rs(M + 1)
    K = jnp.asarray(_spd(rs, 2, M))
    W1, W2 = jnp.asarray(rs.randn(2, M, M)), jnp.asarray(rs.randn(2, M, M))
    eye = jnp.broadcast_to(jnp.eye(M), K.shape)

    def ours(K):
        L = cholesky(K)
        return jnp.sum(W1 * L) + jnp.sum(W2 * jnp.tanh(triangular_inverse(L)))

    def reference(K):
        L = jnp.linalg.cholesky(K)
        return jnp.sum(W1 * L) + jnp.sum(W2 * jnp.tanh(scipy_solve_lower(L, eye)))

    np.testing.assert_allclose(np.asarray(cholesky(K)), np.linalg.cholesky(np.asarray(K)), rtol=1e-12, atol=1e-12)
    g, g_ref = jax.grad(ours)(K), jax.grad(reference)(K)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-9, atol=1e-12)
    dK = jnp.asarray(rs.randn(2, M, M))
    t, t_ref = jax.jvp(ours, (K,), (dK,))[1], jax.jvp(reference, (K,), (dK,))[1]
    np.testing.assert_allclose(float(t), float(t_ref), rtol=1e-9)


@pytest.mark.parametrize("M", [1, 7, 64, 65, 200, 500])  # 500 runs with --runslow
def test_inverse_cholesky_and_its_derivative_match_jax(M):
    # the one-rule derivative of L^{-1} against JAX's rules for the Cholesky factor and a
    # triangular solve, in both modes, for a batch of 2 and a non-symmetric direction (the
    # forward pass symmetrizes its input); above 128 the products skip zero blocks
    rs = _rs(M + 2)
    K = jnp.asarray(_spd(rs, 2, M))
    W = jnp.asarray(rs.randn(2, M, M))

    def reference(K):
        return _jax_factor_and_inverse(K)[1]

    value = np.asarray(inverse_cholesky(K))
    np.testing.assert_allclose(value, np.linalg.inv(np.linalg.cholesky(np.asarray(K))), rtol=1e-10, atol=1e-12)
    # the inverse the factorization's recursion builds: that of its factor to round-off
    np.testing.assert_allclose(value, np.asarray(triangular_inverse(cholesky(K))), rtol=1e-12, atol=1e-15)
    g = jax.grad(lambda K: jnp.sum(W * jnp.tanh(inverse_cholesky(K))))(K)
    g_ref = jax.grad(lambda K: jnp.sum(W * jnp.tanh(reference(K))))(K)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-9, atol=1e-12)
    dK = jnp.asarray(rs.randn(2, M, M))
    t, t_ref = jax.jvp(inverse_cholesky, (K,), (dK,))[1], jax.jvp(reference, (K,), (dK,))[1]
    np.testing.assert_allclose(np.asarray(t), np.asarray(t_ref), rtol=1e-9, atol=1e-11)
    assert np.all(np.triu(np.asarray(t), 1) == 0.0)


def test_inverse_cholesky_derivatives_finite_differences():
    # second order too (the rule is itself differentiable), against central differences
    from jax.test_util import check_grads

    rs = _rs(4)
    K = jnp.asarray(_spd(rs, 1, 6)[0])
    W = jnp.asarray(rs.randn(6, 6))
    check_grads(lambda K: jnp.sum(W * inverse_cholesky(K)), (K,), order=2, modes=["fwd", "rev"])


def test_inverse_cholesky_failure_is_nan_not_an_error():
    K = jnp.asarray(np.diag([1.0, -1.0, 2.0]))
    assert not np.all(np.isfinite(np.asarray(inverse_cholesky(K))))
    g = jax.grad(lambda K: jnp.sum(inverse_cholesky(K)))(K)
    assert g.shape == K.shape


@pytest.mark.parametrize("M", [1, 7, 64, 65, 200, 500])  # 500 runs with --runslow
def test_cholesky_and_inverse_pair_and_its_joint_derivative_match_jax(M):
    # (L, L^{-1}) with the joint rule (dL = L Phi, dL^{-1} = -Phi L^{-1}) against JAX's rules
    # for the factor and a triangular solve: values, a gradient through both outputs, and both
    # tangents, for a batch of 2 and a non-symmetric direction
    rs = _rs(M + 3)
    K = jnp.asarray(_spd(rs, 2, M))
    W1, W2 = jnp.asarray(rs.randn(2, M, M)), jnp.asarray(rs.randn(2, M, M))
    reference = _jax_factor_and_inverse

    def objective(pair):
        L, Linv = pair
        return jnp.sum(W1 * jnp.tanh(L)) + jnp.sum(W2 * jnp.tanh(Linv))

    L, Linv = map(np.asarray, cholesky_and_inverse(K))
    dense = np.linalg.cholesky(np.asarray(K))
    np.testing.assert_allclose(L, dense, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Linv, np.linalg.inv(dense), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(L, np.asarray(cholesky(K)))  # the same recursion's values
    np.testing.assert_array_equal(Linv, np.asarray(inverse_cholesky(K)))
    g = jax.grad(lambda K: objective(cholesky_and_inverse(K)))(K)
    g_ref = jax.grad(lambda K: objective(reference(K)))(K)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-9, atol=1e-11)
    dK = jnp.asarray(rs.randn(2, M, M))
    tangents = jax.jvp(cholesky_and_inverse, (K,), (dK,))[1]
    for t, t_ref in zip(tangents, jax.jvp(reference, (K,), (dK,))[1]):
        np.testing.assert_allclose(np.asarray(t), np.asarray(t_ref), rtol=1e-9, atol=1e-11)
        assert np.all(np.triu(np.asarray(t), 1) == 0.0)


@pytest.mark.parametrize("M", [6, 65])
def test_cholesky_and_inverse_pair_finite_differences(M):
    # against central differences; second order at M = 6 (the rule is itself differentiable),
    # first order at M = 65 (two leaves and the recursion between them), compiled
    from jax.test_util import check_grads

    rs = _rs(M)
    K = jnp.asarray(_spd(rs, 1, M)[0])
    W1, W2 = jnp.asarray(rs.randn(M, M)), jnp.asarray(rs.randn(M, M))

    def objective(K):
        L, Linv = cholesky_and_inverse(K)
        return jnp.sum(W1 * L) + jnp.sum(W2 * Linv)

    check_grads(jax.jit(objective), (K,), order=2 if M == 6 else 1, modes=["fwd", "rev"])


def test_cholesky_and_inverse_pair_failure_is_nan_not_an_error():
    K = jnp.asarray(np.diag([1.0, -1.0, 2.0]))
    assert all(not np.all(np.isfinite(np.asarray(part))) for part in cholesky_and_inverse(K))
    g = jax.grad(lambda K: sum(jnp.sum(part) for part in cholesky_and_inverse(K)))(K)
    assert g.shape == K.shape


def scipy_solve_lower(L, B):
    return jax.scipy.linalg.solve_triangular(L, B, lower=True)


@pytest.mark.parametrize("M", [6, 65])  # 65: the recursion of two leaves, its inverse in the rules
def test_cholesky_derivatives_finite_differences(M):
    # second order too (the rules are themselves differentiable), against central differences
    from jax.test_util import check_grads

    rs = _rs(3)
    K = jnp.asarray(_spd(rs, 1, M)[0])
    W = jnp.asarray(rs.randn(M, M))
    check_grads(lambda K: jnp.sum(W * triangular_inverse(cholesky(K))), (K,), order=2, modes=["fwd", "rev"])


def test_cholesky_failure_is_nan_not_an_error():
    K = jnp.asarray(np.diag([1.0, -1.0, 2.0]))
    assert not np.all(np.isfinite(np.asarray(cholesky(K))))
    g = jax.grad(lambda K: jnp.sum(cholesky(K)))(K)
    assert g.shape == K.shape


def test_default_jitter():
    assert default_jitter(jnp.float32) > default_jitter(jnp.float64) > 0
    assert default_jitter(np.float64) == default_jitter(jnp.float64)


# ======================================================================== quadrature


NORMAL_MOMENTS = {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 3.0, 5: 0.0, 6: 15.0, 7: 0.0, 8: 105.0, 9: 0.0}


@pytest.mark.parametrize("K", [1, 2, 3, 4, 5])
def test_gauss_hermite_exact_up_to_degree(K):
    nodes, weights = gauss_hermite(K)
    assert nodes.shape == weights.shape == (K,)
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-14)
    for deg in range(0, min(2 * K - 1, 9) + 1):
        np.testing.assert_allclose(
            np.sum(weights * nodes**deg), NORMAL_MOMENTS[deg], rtol=1e-10, atol=1e-10
        )
    # degree 2K is not integrated exactly (sanity check of the claim's sharpness)
    if 2 * K <= 8:
        assert abs(np.sum(weights * nodes ** (2 * K)) - NORMAL_MOMENTS[2 * K]) > 1e-3


def test_gauss_hermite_rejects_zero_points():
    with pytest.raises(ValueError):
        gauss_hermite(0)


def test_gauss_hermite_product_2d():
    K = 4
    nodes, weights = gauss_hermite_product(K, 2)
    assert nodes.shape == (K**2, 2) and weights.shape == (K**2,)
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-14)
    x, y = nodes[:, 0], nodes[:, 1]
    for a in range(0, 7):
        for b in range(0, 7):
            np.testing.assert_allclose(
                np.sum(weights * x**a * y**b),
                NORMAL_MOMENTS[a] * NORMAL_MOMENTS[b],
                rtol=1e-10,
                atol=1e-10,
            )
    # E[(x + 2 y)^2] = 5 (a rotated quadratic)
    np.testing.assert_allclose(np.sum(weights * (x + 2 * y) ** 2), 5.0, rtol=1e-12)


def _ref_log_normal(y, f, s2):
    return -0.5 * np.log(2 * np.pi * s2) - 0.5 * (y - f) ** 2 / s2


@pytest.mark.stochastic
def test_expected_log_normal_vs_gauss_hermite_and_monte_carlo():
    rs = _rs(50)
    n = 6
    y = rs.randn(n)
    m = rs.randn(n)
    v = 0.1 + rs.rand(n)
    s2 = 0.2 + rs.rand(n)
    out = np.asarray(
        expected_log_normal(jnp.asarray(y), jnp.asarray(m), jnp.asarray(v), jnp.asarray(s2))
    )
    assert out.shape == (n,)
    nodes, weights = np.polynomial.hermite_e.hermegauss(20)
    weights = weights / np.sqrt(2 * np.pi)
    f = m[:, None] + np.sqrt(v)[:, None] * nodes[None, :]
    gh = np.sum(weights * _ref_log_normal(y[:, None], f, s2[:, None]), axis=1)
    np.testing.assert_allclose(out, gh, rtol=1e-10, atol=1e-10)
    # Monte Carlo
    S = 200_000
    fs = m[:, None] + np.sqrt(v)[:, None] * rs.randn(n, S)
    vals = _ref_log_normal(y[:, None], fs, s2[:, None])
    est = vals.mean(1)
    se = vals.std(1, ddof=1) / np.sqrt(S)
    assert np.all(np.abs(out - est) < z_threshold(n) * se), (out, est, se)  # n comparisons


# ======================================================================== kmeans


BLOB_SD, BLOB_SIZE = 0.05, 100
# a blob's mean is within this of its center (6 coordinates, each with standard error sd / sqrt(n))
BLOB_ATOL = z_threshold(6) * BLOB_SD / np.sqrt(BLOB_SIZE)


def _blobs():
    rs = _rs(60)
    centers = np.array([[-5.0, 0.0], [0.0, 5.0], [5.0, -1.0]])
    X = np.concatenate([c + BLOB_SD * rs.randn(BLOB_SIZE, 2) for c in centers])
    # the exact blob means (what Lloyd's algorithm converges to)
    means = np.stack([X[i * 100:(i + 1) * 100].mean(0) for i in range(3)])
    return X, centers, means


def _sorted(C):
    C = np.asarray(C)
    return C[np.lexsort(C.T[::-1])]


_kmeans_jit = jax.jit(kmeans, static_argnums=2)


@pytest.mark.stochastic
def test_kmeans_recovers_blob_centres():
    # every key, not a lucky one: the start must not leave two centers in one blob
    X, centers, means = _blobs()
    for seed in range(20):
        C = _kmeans_jit(jax.random.PRNGKey(seed), jnp.asarray(X), 3)
        assert C.shape == (3, 2)
        np.testing.assert_allclose(_sorted(C), _sorted(centers), atol=BLOB_ATOL)
        np.testing.assert_allclose(_sorted(C), _sorted(means), atol=1e-10)


@pytest.mark.stochastic
def test_kmeans_eager_equals_jit():
    X, centers, _ = _blobs()
    C = kmeans(jax.random.PRNGKey(5), jnp.asarray(X), 3)
    np.testing.assert_allclose(_sorted(C), _sorted(centers), atol=BLOB_ATOL)
    C2 = _kmeans_jit(jax.random.PRNGKey(5), jnp.asarray(X), 3)
    np.testing.assert_allclose(np.asarray(C2), np.asarray(C), rtol=0, atol=1e-12)


def test_kmeans_too_many_clusters():
    X = jnp.asarray(_rs(61).randn(5, 2))
    with pytest.raises(ValueError, match="num_inducing"):
        kmeans(jax.random.PRNGKey(0), X, 6)


def test_kmeans_m_equals_n_returns_the_points():
    X = _rs(62).randn(6, 2)
    C = _kmeans_jit(jax.random.PRNGKey(1), jnp.asarray(X), 6)
    np.testing.assert_allclose(_sorted(C), _sorted(X), atol=1e-12)


# --- one collapsed sparse layer: FITC and VFE against the dense formulas -------------------


def _collapsed_problem(seed=0, N=12, M=5, P=2):
    rs, Kmm, Kmn, Knn, L = setup_problem(seed, M=M, N=N, D=2, jitter=1e-8)
    y = rs.randn(N, P)
    noise = 0.05 + 0.1 * rs.rand(N)  # per-point noise variances, shared by the outputs
    return Kmm, Kmn, Knn, L, y, noise


def _dense_collapsed(Kmm, Kmn, Knn, y, noise, method):
    """log N(y | 0, Q + Lambda) (minus Titsias' trace term for VFE) with dense N x N matrices,
    and the predictive mean and variance at the inducing-point cross-covariances ``K_*u``."""
    Q = Kmn.T @ np.linalg.solve(Kmm, Kmn)
    lam = np.diag(np.diag(Knn - Q)) + np.diag(noise) if method == "fitc" else np.diag(noise)
    C = Q + lam
    value = sum(multivariate_normal(np.zeros(len(noise)), C).logpdf(y[:, p]) for p in range(y.shape[1]))
    if method == "vfe":
        value -= y.shape[1] * 0.5 * np.sum(np.diag(Knn - Q) / noise)
    return value, C


@pytest.mark.parametrize("method", ["fitc", "vfe"])
def test_collapsed_log_marginal_equals_the_dense_formula(method):
    Kmm, Kmn, Knn, L, y, noise = _collapsed_problem()
    expected, _ = _dense_collapsed(Kmm, Kmn, Knn, y, noise, method)
    got = core.collapsed_log_marginal(L, Kmn, np.diag(Knn), y, noise, method=method)
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    # one output as a vector, and a scalar noise
    expected1, _ = _dense_collapsed(Kmm, Kmn, Knn, y[:, :1], np.full(len(noise), 0.1), method)
    np.testing.assert_allclose(core.collapsed_log_marginal(L, Kmn, np.diag(Knn), y[:, 0], 0.1, method=method),
                               expected1, rtol=1e-10)


@pytest.mark.parametrize("method", ["fitc", "vfe"])
@pytest.mark.parametrize("whiten", [True, False])
def test_collapsed_posterior_gives_the_dense_predictive(method, whiten):
    """mu_* = Q_*f (Q_ff + Lambda)^-1 y, Sigma_* = K_** - Q_*f (Q_ff + Lambda)^-1 Q_f* (the
    inverse of the same matrix in both: the corrected form)."""
    Kmm, Kmn, Knn, L, y, noise = _collapsed_problem(seed=1)
    _, C = _dense_collapsed(Kmm, Kmn, Knn, y, noise, method)
    X_star = np.random.RandomState(2).randn(6, 2) * 1.5
    Zs = _rs(1).randn(5, 2) * 1.5  # the inducing inputs of setup_problem(seed=1)
    K_su = rbf(X_star, Zs)
    Q_sf = K_su @ np.linalg.solve(Kmm, Kmn)
    mean_expected = Q_sf @ np.linalg.solve(C, y)
    var_expected = np.diag(rbf(X_star, X_star) - Q_sf @ np.linalg.solve(C, Q_sf.T))
    q_mean, q_sqrt = core.collapsed_posterior(L, Kmn, np.diag(Knn), y, noise, method=method, whiten=whiten)
    assert np.allclose(np.triu(np.asarray(q_sqrt), 1), 0), "q_sqrt must be lower triangular"
    mean, var = core.conditional(K_su.T, L, np.diag(rbf(X_star, X_star)), q_mean, q_sqrt, whiten=whiten)
    np.testing.assert_allclose(mean, mean_expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, np.broadcast_to(var_expected[:, None], var.shape), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["fitc", "vfe"])
def test_collapsed_log_marginal_takes_the_callers_inverse_factor(method):
    # a layer hands the L^{-1} its factorization built: the same bound, and one of another
    # shape is refused by name
    Kmm, Kmn, Knn, L, y, noise = _collapsed_problem()
    inverting = core.collapsed_log_marginal(L, Kmn, np.diag(Knn), y, noise, method=method)
    given = core.collapsed_log_marginal(L, Kmn, np.diag(Knn), y, noise, method=method,
                                        Kmm_chol_inv=np.linalg.inv(L) + np.triu(np.ones_like(L), 1))  # upper: not read
    np.testing.assert_allclose(given, inverting, rtol=1e-11)
    with pytest.raises(ValueError, match="Kmm_chol_inv must have Kmm_chol's shape"):
        core.collapsed_log_marginal(L, Kmn, np.diag(Knn), y, noise, method=method, Kmm_chol_inv=np.eye(4))


def test_collapsed_refuses_an_unknown_method():
    Kmm, Kmn, Knn, L, y, noise = _collapsed_problem()
    with pytest.raises(ValueError, match="method must be one of"):
        core.collapsed_log_marginal(L, Kmn, np.diag(Knn), y, noise, method="dtc")


def test_kmeans_on_a_bounded_subsample():
    # 300 points, at most 60 used: still the three blobs, and only the subsample is touched
    X, centers, _ = _blobs()
    C = kmeans(jax.random.PRNGKey(3), jnp.asarray(X), 3, max_points=60)
    np.testing.assert_allclose(_sorted(C), _sorted(centers), atol=5e-2)
    rows = {tuple(r) for r in np.asarray(X)}
    C1 = kmeans(jax.random.PRNGKey(3), jnp.asarray(X), 60, num_iters=0, max_points=60)
    assert all(tuple(r) in rows for r in np.asarray(C1)) and len({tuple(r) for r in np.asarray(C1)}) == 60
    # below the bound nothing changes
    np.testing.assert_array_equal(np.asarray(kmeans(jax.random.PRNGKey(3), jnp.asarray(X), 3, max_points=300)),
                                  np.asarray(kmeans(jax.random.PRNGKey(3), jnp.asarray(X), 3, max_points=None)))


@pytest.mark.parametrize("shape", [(1000, 8), (3, 4, 5), (1, 7), (6,), (2, 3, 1000)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_standard_normal_is_jax_s_draw_from_the_same_bits(shape, dtype):
    from numpyro_dgp.core import standard_normal

    for key in (jax.random.PRNGKey(4), jax.random.key(5)):
        ours = jax.jit(lambda k: standard_normal(k, shape, dtype))(key)
        theirs = jax.jit(lambda k: jax.random.normal(k, shape, dtype))(key)
        assert ours.shape == shape and ours.dtype == dtype
        # the same uniforms at every position (the counters are the flattened positions) ...
        flat = jax.random.uniform(key, (int(np.prod(shape)),), dtype).reshape(shape)
        np.testing.assert_array_equal(np.asarray(flat), np.asarray(jax.random.uniform(key, shape, dtype)))
        # ... so the normals agree up to the transform's last-bit rounding
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=4 * jnp.finfo(dtype).eps, atol=0)
