"""Psi statistics and layer moments at Gaussian inputs against Monte Carlo (float64).

Every expectation is checked against 2e5 draws with a tolerance of five Monte Carlo standard
errors computed from the draws themselves (fixed seeds); zero input variance against the
kernel; the blocked, shared-variance and hand-differentiated paths against the plain ones;
gradients by ``jax.test_util.check_grads``.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from numpyro_dgp import core, kernels  # noqa: E402
from numpyro_dgp.core import _gauss_sums, _psi  # noqa: E402
from tests._mc import z_threshold  # noqa: E402

NUM_DRAWS = 200_000
N, M, D = 4, 5, 2


def _kernels():
    return {
        "rbf": kernels.RBF(variance=1.3, lengthscale=jnp.array([0.8, 1.4])),
        "linear": kernels.Linear(variance=0.7),
        # no closed form: the Gauss-Hermite fallback (20 nodes per dimension, 400 per point)
        "matern32": kernels.Matern32(variance=1.1, lengthscale=jnp.array([1.2, 0.9])),
    }


GH_POINTS = {"rbf": 10, "linear": 10, "matern32": 20}


@pytest.fixture(scope="module")
def inputs():
    rs = np.random.RandomState(0)
    mean = rs.randn(N, D)
    var = 0.05 + 0.5 * rs.rand(N, D)
    Z = rs.randn(M, D)
    x = mean[None] + np.sqrt(var)[None] * rs.randn(NUM_DRAWS, N, D)  # (S, N, D)
    return mean, var, Z, x


class _MonteCarloChecks:
    """Collects ``closed`` vs the mean of ``draws`` (leading axis: draws) comparisons and checks them
    all at once, each within z standard errors, z set by the total number of elements compared
    (Bonferroni) for a false-alarm rate below 1e-4 over the whole test."""

    def __init__(self):
        self.checks = []

    def __call__(self, closed, draws, what):
        draws = np.asarray(draws)
        estimate = draws.mean(0)
        se = draws.std(0) / np.sqrt(draws.shape[0])
        roundoff = 1e-10 * (1 + np.abs(estimate))  # of summing the draws
        self.checks.append((what, np.abs(np.asarray(closed) - estimate), se, roundoff))

    def verify(self):
        z = z_threshold(sum(err.size for _, err, _, _ in self.checks))
        for what, err, se, roundoff in self.checks:
            assert np.all(err <= z * se + roundoff), \
                f"{what}: max error / se = {np.max(err / (se + 1e-300)):.2f} > {z:.2f}"


def _kernel_draws(kernel, x, Z):
    return np.stack([np.asarray(kernel(x[:, n], Z)) for n in range(x.shape[1])], axis=1)  # (S, N, M)


@pytest.mark.parametrize("name", ["rbf", "linear", "matern32"])
@pytest.mark.stochastic
def test_psi_statistics_match_monte_carlo(inputs, name):
    mean, var, Z, x = inputs
    kernel = _kernels()[name]
    close_to_mc = _MonteCarloChecks()
    gh = {"num_points": GH_POINTS[name]}
    Kx = _kernel_draws(kernel, x, Z)
    close_to_mc(core.psi0(kernel, mean, var, **gh),
                 np.stack([np.asarray(kernel.diag(x[:, n])) for n in range(N)], axis=1), "psi0")
    close_to_mc(core.psi1(kernel, mean, var, Z, **gh), Kx, "psi1")
    per_point_draws = Kx[:, :, :, None] * Kx[:, :, None, :]
    close_to_mc(core.psi2(kernel, mean, var, Z, per_point=True, **gh), per_point_draws, "psi2 per point")
    close_to_mc(core.psi2(kernel, mean, var, Z, **gh), per_point_draws.sum(1), "psi2 summed")
    close_to_mc(core.expected_input_kernel(kernel, mean, var, Z, **gh), Kx[..., None] * x[:, :, None, :],
                 "E[x k(x, z)]")
    A = np.random.RandomState(1).randn(3, M, M)
    close_to_mc(core.psi2_traces(kernel, mean, var, Z, A, **gh),
                 np.einsum("snm,jkm,snk->snj", Kx, A, Kx), "tr(Psi2_n A)")
    close_to_mc.verify()


@pytest.mark.parametrize("name", ["rbf", "linear", "matern32"])
def test_zero_input_variance_gives_the_kernel(inputs, name):
    mean, _, Z, _ = inputs
    kernel = _kernels()[name]
    zero = np.zeros_like(mean)
    K = np.asarray(kernel(mean, Z))
    np.testing.assert_allclose(core.psi0(kernel, mean, zero), kernel.diag(mean), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(core.psi1(kernel, mean, zero, Z), K, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(core.psi2(kernel, mean, zero, Z, per_point=True), K[:, :, None] * K[:, None, :],
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(core.psi2(kernel, mean, zero, Z), K.T @ K, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(core.expected_input_kernel(kernel, mean, zero, Z), K[..., None] * mean[:, None, :],
                               rtol=1e-12, atol=1e-12)


#: ``(_BLOCK_ENTRIES, _MOST_CENTERS)`` of the blocked sums: with ``M = 5`` (15 centre pairs) and
#: ``N = 4`` points, blocks of 1 and 3 points, each over all centres, over 4 chunks of 4 centres
#: (the last padded with a copy of the first centre) or 3 chunks of 5.
_BLOCKINGS = ((15, 1024), (45, 1024), (4, 4), (12, 4), (15, 5))


def test_centre_chunks_are_nearly_equal_and_bounded(monkeypatch):
    for most, size in ((1024, 15), (4, 4), (5, 5), (14, 8)):
        monkeypatch.setattr(_gauss_sums, "_MOST_CENTERS", most)
        assert _gauss_sums._chunk_size(15) == size


def test_shared_variance_and_blocked_paths_equal_the_plain_ones(inputs, monkeypatch):
    mean, var, Z, _ = inputs
    kernel = _kernels()["rbf"]
    A = np.random.RandomState(2).randn(2, M, M)
    shared = var[0]
    per_point_shared = np.broadcast_to(shared, mean.shape)
    # the separable form (a variance shared by the points) against the per-point form
    np.testing.assert_allclose(core.psi2(kernel, mean, shared, Z), core.psi2(kernel, mean, per_point_shared, Z), rtol=1e-12)
    np.testing.assert_allclose(core.psi2_traces(kernel, mean, shared, Z, A),
                               core.psi2_traces(kernel, mean, per_point_shared, Z, A), rtol=1e-12)
    plain = (core.psi2(kernel, mean, var, Z), core.psi2_traces(kernel, mean, var, Z, A))
    per_point = core.psi2(kernel, mean, var, Z, per_point=True)
    np.testing.assert_allclose(plain[0], per_point.sum(0), rtol=1e-12)
    np.testing.assert_allclose(plain[1], np.einsum("nmk,jkm->nj", per_point, A), rtol=1e-12)
    # blocks of 1 and 3 points (the last one padded), over all 15 centres or chunks of 4 (the
    # last one padded) and 5
    for entries, most_centers in _BLOCKINGS:
        monkeypatch.setattr(_gauss_sums, "_BLOCK_ENTRIES", entries)
        monkeypatch.setattr(_gauss_sums, "_MOST_CENTERS", most_centers)
        np.testing.assert_allclose(core.psi2(kernel, mean, var, Z), plain[0], rtol=1e-12)
        np.testing.assert_allclose(core.psi2_traces(kernel, mean, var, Z, A), plain[1], rtol=1e-12)
    monkeypatch.setattr(_psi, "_BLOCK_ENTRIES", 150)  # the Gauss-Hermite sum in blocks
    matern = _kernels()["matern32"]
    np.testing.assert_allclose(core.psi2(matern, mean, var, Z, num_points=5),
                               core.psi2(matern, mean, var, Z, num_points=5, per_point=True).sum(0), rtol=1e-12)
    monkeypatch.setattr(_psi, "_BLOCK_ENTRIES", 375)  # blocks of 3 points, the last one padded
    np.testing.assert_allclose(core.psi2(matern, mean, var, Z, num_points=5),
                               core.psi2(matern, mean, var, Z, num_points=5, per_point=True).sum(0), rtol=1e-12)


def _rbf(ls):
    return kernels.RBF(variance=1.3, lengthscale=ls)


_LS = jnp.array([0.8, 1.4])
_GRAD_CASES = {
    "psi1": lambda m, v, z, ls, a: core.psi1(_rbf(ls), m, v, z),
    "E[x k]": lambda m, v, z, ls, a: core.expected_input_kernel(_rbf(ls), m, v, z),
    "psi0 linear": lambda m, v, z, ls, a: core.psi0(kernels.Linear(0.7), m, v),
    "psi2": lambda m, v, z, ls, a: core.psi2(_rbf(ls), m, v, z),
    "psi2 traces": lambda m, v, z, ls, a: core.psi2_traces(_rbf(ls), m, v, z, a),
    "psi2 shared variance": lambda m, v, z, ls, a: core.psi2(_rbf(ls), m, v[0], z),
    "psi2 linear": lambda m, v, z, ls, a: core.psi2(kernels.Linear(0.7), m, v, z),
    "psi1 Gauss-Hermite": lambda m, v, z, ls, a: core.psi1(_kernels()["matern32"], m, v, z, num_points=4),
}


@pytest.mark.parametrize("case", sorted(_GRAD_CASES))
def test_gradients_of_the_psi_statistics(inputs, case, monkeypatch):
    mean, var, Z, _ = inputs
    A = np.random.RandomState(3).randn(2, M, M)
    opts = {"order": 1, "modes": ["rev"], "atol": 1e-6, "rtol": 1e-6}
    # one block, and the hand-written gradient over blocks of points and chunks of centres
    blockings = ((10**6, 1024),) + (_BLOCKINGS if case in ("psi2", "psi2 traces") else ())
    for entries, most_centers in blockings:
        monkeypatch.setattr(_gauss_sums, "_BLOCK_ENTRIES", entries)
        monkeypatch.setattr(_gauss_sums, "_MOST_CENTERS", most_centers)
        check_grads(_GRAD_CASES[case], (mean, var, Z, _LS, A), **opts)


def test_gauss_sums_gradients_in_every_blocking(monkeypatch):
    """Both sums' hand-written gradients, the point weights' included (``psi2`` passes ones and
    never differentiates them), over blocks of points and chunks of centres with padding."""
    rs = np.random.RandomState(5)
    mean, scale = rs.randn(4, 2), 0.5 + rs.rand(4, 2)
    log_weight, centers = 0.1 * rs.randn(4), rs.randn(15, 2)
    point_weight, W = rs.rand(4), rs.randn(3, 15)
    opts = {"order": 1, "modes": ["rev"], "atol": 1e-6, "rtol": 1e-6}
    for entries, most_centers in ((10**6, 1024),) + _BLOCKINGS:
        monkeypatch.setattr(_gauss_sums, "_BLOCK_ENTRIES", entries)
        monkeypatch.setattr(_gauss_sums, "_MOST_CENTERS", most_centers)
        check_grads(_gauss_sums.gauss_sums_over_points, (mean, scale, log_weight, centers, point_weight), **opts)
        check_grads(_gauss_sums.gauss_sums_per_point, (mean, scale, log_weight, centers, W), **opts)


def test_gauss_sums_without_centers():
    rs = np.random.RandomState(6)
    mean, scale, log_weight = rs.randn(4, 2), 0.5 + rs.rand(4, 2), rs.randn(4)
    no_centers = np.zeros((0, 2))
    assert _gauss_sums.gauss_sums_over_points(mean, scale, log_weight, no_centers, np.ones(4)).shape == (0,)
    np.testing.assert_array_equal(
        _gauss_sums.gauss_sums_per_point(mean, scale, log_weight, no_centers, np.zeros((3, 0))), np.zeros((4, 3)))


def test_psi_statistics_refuse_bad_inputs(inputs):
    mean, var, Z, _ = inputs
    kernel = _kernels()["rbf"]
    with pytest.raises(ValueError, match="mean must have shape"):
        core.psi1(kernel, mean[0], var, Z)
    with pytest.raises(ValueError, match="Z must have shape"):
        core.psi1(kernel, mean, var, Z[:, :1])
    with pytest.raises(ValueError, match="num_points"):
        core.psi1(_kernels()["matern32"], np.zeros((2, 6)), 0.1, np.zeros((3, 6)), num_points=10)
    with pytest.raises(ValueError, match=r"matrices must have shape \(J, 5, 5\)"):
        core.psi2_traces(kernel, mean, var, Z, np.zeros((5, 5)))


# --- a layer's output moments at Gaussian inputs ------------------------------------------


def _layer(seed, whiten, diag, P=2):
    rs = np.random.RandomState(seed)
    kernel = kernels.RBF(variance=1.1, lengthscale=jnp.array([0.9, 1.3]))
    Z = rs.randn(M, D)
    L = np.linalg.cholesky(np.asarray(kernel(Z)) + 1e-6 * np.eye(M))
    q_mean = rs.randn(P, M) * 0.7
    q_sqrt = 0.3 + 0.3 * rs.rand(P, M) if diag else np.tril(rs.randn(P, M, M)) * 0.3 + 0.3 * np.eye(M)
    W, b = rs.randn(D, P), rs.randn(P)
    return kernel, Z, L, q_mean, q_sqrt, W, b


@pytest.mark.parametrize("whiten,diag", [(True, False), (False, True)])
@pytest.mark.stochastic
def test_uncertain_input_moments_match_monte_carlo(inputs, whiten, diag):
    """Mean, total variance, the variance the GP keeps given ``u`` and the expected squared
    error of ``f(x) = x^T W + b + g(x)`` with ``x`` Gaussian, ``u ~ q``, ``g | u`` the sparse
    conditional, against draws of all three."""
    mean, var, _, _ = inputs
    kernel, Z, L, q_mean, q_sqrt, W, b = _layer(4, whiten, diag)
    parts = core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, var, whiten=whiten,
                                         mean_weight=W, mean_bias=b)
    rs = np.random.RandomState(5)
    close_to_mc = _MonteCarloChecks()
    S, P = 100_000, q_mean.shape[0]
    x = mean[None] + np.sqrt(var)[None] * rs.randn(S, N, D)
    eps = rs.randn(S, P, M)
    v = q_mean[None] + (q_sqrt[None] * eps if diag else np.einsum("pmk,spk->spm", q_sqrt, eps))
    u = v @ L.T if whiten else v  # (S, P, M)
    alpha = np.linalg.solve(L @ L.T, np.swapaxes(u, 1, 2))  # (S, M, P): K^-1 u
    Kx = _kernel_draws(kernel, x, Z)  # (S, N, M)
    g_mean = np.einsum("snm,smp->snp", Kx, alpha) + x @ W + b  # E[f | x, u]
    K_inv_k = np.linalg.solve(L @ L.T, np.swapaxes(Kx, 1, 2))  # (S, M, N)
    g_var = kernel.variance - np.einsum("snm,smn->sn", Kx, K_inv_k)  # Var[f | x, u]
    f = g_mean + np.sqrt(np.maximum(g_var, 0))[..., None] * rs.randn(S, N, P)
    close_to_mc(parts.mean, f, "mean")
    total = parts.inducing_var + parts.input_var + parts.conditional_var[:, None]
    close_to_mc(total, (f - f.mean(0)) ** 2 * S / (S - 1), "total variance")
    close_to_mc(parts.conditional_var, g_var, "conditional variance")
    close_to_mc(parts.inducing_var + parts.input_var, (g_mean - g_mean.mean(0)) ** 2 * S / (S - 1),
                 "variance of E[f | x, u]")
    y = np.random.RandomState(6).randn(N, P)
    close_to_mc((y - parts.mean) ** 2 + total, (y[None] - f) ** 2, "expected squared error")
    close_to_mc.verify()
    # the summed form (summed Psi2) equals the per-point one summed
    summed = core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, var, whiten=whiten,
                                          mean_weight=W, mean_bias=b, per_point=False)
    np.testing.assert_allclose(summed.input_var, parts.input_var.sum(0), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(summed.conditional_var, parts.conditional_var.sum(), rtol=1e-10)
    lumped = core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, var, whiten=whiten,
                                          mean_weight=W, mean_bias=b, per_point=False, per_point_inducing=False)
    np.testing.assert_allclose(lumped.inducing_var, parts.inducing_var.sum(0), rtol=1e-10)
    np.testing.assert_allclose(lumped.input_var, parts.input_var.sum(0), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("deterministic", [True, False])
def test_uncertain_input_moments_take_the_callers_inverse_factor(inputs, whiten, deterministic):
    """A layer hands the L^{-1} its factorization built: the same moments as inverting L, and
    one of another shape is refused by name."""
    mean, var, _, _ = inputs
    var = None if deterministic else var
    kernel, Z, L, q_mean, q_sqrt, W, b = _layer(8, whiten, diag=False)
    inverting = core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, var, whiten=whiten,
                                             mean_weight=W, mean_bias=b)
    given = core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, var, whiten=whiten,
                                         mean_weight=W, mean_bias=b,
                                         Kmm_chol_inv=np.linalg.inv(L) + np.triu(np.ones((M, M)), 1))  # upper: not read
    for got, expected in zip(given, inverting):
        scale = np.max(np.abs(np.asarray(expected)))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9 * scale)
    with pytest.raises(ValueError, match="Kmm_chol_inv must have Kmm_chol's shape"):
        core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, var, Kmm_chol_inv=np.eye(M + 1))


def test_uncertain_input_moments_refuse_bad_options(inputs):
    """A ``q_sqrt`` of neither shape, and per-point variances without the per-point inducing
    part they are built from, are refused by name (not a shape error deep inside)."""
    mean, var, _, _ = inputs
    kernel, Z, L, q_mean, q_sqrt, _, _ = _layer(9, True, diag=False)
    with pytest.raises(ValueError, match=r"q_sqrt must be \(P, M, M\) or \(P, M\)"):
        core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt[0, 0], mean, var)
    with pytest.raises(ValueError, match="per_point=True needs per_point_inducing=True"):
        core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, var, per_point_inducing=False)


@pytest.mark.parametrize("whiten", [True, False])
def test_deterministic_inputs_give_the_sparse_conditional(inputs, whiten):
    mean, _, _, _ = inputs
    kernel, Z, L, q_mean, q_sqrt, _, _ = _layer(7, whiten, diag=False)
    parts = core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, None, whiten=whiten)
    m, v = core.conditional(kernel(Z, mean), L, kernel.diag(mean), q_mean, q_sqrt, whiten=whiten)
    np.testing.assert_allclose(parts.mean, m, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(parts.inducing_var + parts.conditional_var[:, None], v, rtol=1e-10, atol=1e-12)
    assert np.all(np.asarray(parts.input_var) == 0)
    # zero input variance through the psi statistics gives the same
    zero = core.uncertain_input_moments(kernel, Z, L, q_mean, q_sqrt, mean, np.zeros_like(mean), whiten=whiten)
    for a, b in zip(zero, parts):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)
