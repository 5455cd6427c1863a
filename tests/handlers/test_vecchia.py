"""The Vecchia DGP for MCMC (handlers.vecchia_layers) and its numerical core (core._vecchia)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import initialize_model, log_density
from scipy import stats

import numpyro_dgp as dgp
from numpyro_dgp import kernels
from numpyro_dgp.core import (
    nearest_previous_neighbors,
    vecchia_factors,
    vecchia_log_density,
    vecchia_sample,
)
from numpyro_dgp.handlers import exact_layers, vecchia_layers
from tests._mc import mcmc_mean_and_se, mcmc_var_and_se, z_threshold

jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)

K1 = kernels.RBF(variance=1.0, lengthscale=0.6)
K2 = kernels.RBF(variance=0.8, lengthscale=0.9)
N, G = 12, 3


def two_layer(X, y=None):
    h = dgp.gp_layer("h1", X, K1, num_inducing=4, out_dim=2, mean="identity")
    f = dgp.gp_layer("h2", h, K2, num_inducing=4)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


def noisy_layers(X, y=None):
    h = dgp.gp_layer("h1", X, K1, num_inducing=4, out_dim=2, mean="identity", noise=0.05)
    f = dgp.gp_layer("h2", h, K2, num_inducing=4, noise=0.02)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.uniform(-1.0, 1.0, (N, 2)))
    y = jnp.sin(2.5 * X[:, 0]) * X[:, 1]
    grid = jnp.asarray(rng.uniform(-1.0, 1.0, (G, 2)))
    return X, y, grid


def _latent_values(model, X, y, seed_):
    tr = trace(seed(model, seed_)).get_trace(X, y)
    return {n: s["value"] for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]}


# -- the numerical core against dense float64 --------------------------------------------------


def test_nearest_previous_neighbors_are_the_brute_force_ones():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3))
    neighbors, mask = nearest_previous_neighbors(X, 5, block_size=7)  # blocks do not divide n
    # float32 far from the origin: the distance expansion must not lose the digits that differ
    far, far_mask = nearest_previous_neighbors(np.float32(X + 1000.0), 5)
    for k in range(40):
        order = np.argsort(((X[:k] - X[k]) ** 2).sum(1))
        np.testing.assert_array_equal(np.asarray(neighbors[k])[np.asarray(mask[k])], order[:5])
        assert set(np.asarray(far[k])[np.asarray(far_mask[k])]) == set(order[:5])
    assert np.asarray(mask).sum(1).tolist() == [min(k, 5) for k in range(40)]
    # more neighbours than points: padded, masked
    few, few_mask = nearest_previous_neighbors(X[:3], 5)
    assert few.shape == (3, 5) and np.asarray(few_mask).sum() == 0 + 1 + 2


def test_full_neighbor_sets_give_the_dense_density_and_its_cholesky_draw():
    rng = np.random.default_rng(2)
    n = 25
    X = rng.normal(size=(n, 2))
    K = np.asarray(K1(X)) + np.diag(1e-6 + 0.1 * rng.uniform(size=n))
    L = np.linalg.cholesky(K)
    neighbors, mask = nearest_previous_neighbors(X, n - 1)
    factors = vecchia_factors(K1, X, neighbors, mask, np.diag(K) - np.diag(np.asarray(K1(X))))
    f = L @ rng.normal(size=(n, 3))
    expected = [stats.multivariate_normal(np.zeros(n), K).logpdf(f[:, j]) for j in range(3)]
    np.testing.assert_allclose(vecchia_log_density(factors, f.T), expected, rtol=1e-10)
    eps = rng.normal(size=(3, n))
    np.testing.assert_allclose(vecchia_sample(factors, eps), (L @ eps.T).T, rtol=1e-9, atol=1e-12)


def _dense_sequential_pass(neighbors, coef, scale, eps, given):
    """vecchia_sample as one dense solve: (I - B) f = rhs, B (n, n) from the coefficients."""
    P, start = given.shape
    n = start + eps.shape[1]
    rows = jnp.broadcast_to(jnp.arange(n)[:, None], neighbors.shape)
    # only earlier points count (a padded entry of point 0 names point 0 itself)
    used = (jnp.arange(n) >= start)[None, :, None] & (neighbors < rows)
    B = jnp.zeros((P, n, n)).at[:, rows, neighbors].add(jnp.where(used, coef, 0.0))
    rhs = jnp.concatenate([given, scale[:, start:] * eps], axis=1)
    return jnp.linalg.solve(jnp.eye(n) - B, rhs[..., None])[..., 0]


@pytest.mark.parametrize("start", [0, 4])
def test_vecchia_sample_and_its_gradient_are_the_dense_solves(start):
    """The sequential pass and its hand-written reverse pass against a dense solve and its
    autodiff gradient: m < n, masked (padded) sets, a given head, per-output coefficients."""
    rng = np.random.default_rng(7)
    n, m, P = 15, 6, 2
    # any earlier points, repeats included; padded entries (index 0) on some drawn rows
    neighbors = jnp.asarray([rng.integers(0, max(k, 1), m) for k in range(n)], jnp.int32)
    mask = jnp.asarray(rng.uniform(size=(n, m)) < 0.8) & (jnp.arange(n) > 0)[:, None]
    neighbors = jnp.where(mask, neighbors, 0)
    coef = jnp.asarray(rng.normal(size=(P, n, m)) * 0.5)  # nonzero on padded entries too
    scale = jnp.asarray(rng.uniform(0.5, 1.5, size=(P, n)))
    eps = jnp.asarray(rng.normal(size=(P, n - start)))
    given = jnp.asarray(rng.normal(size=(P, start)))
    weights = jnp.asarray(rng.normal(size=(P, n)))

    def loss(sample, coef, scale, eps, given):
        return jnp.sum(weights * jnp.sin(sample(coef, scale, eps, given)))

    def ours(coef, scale, eps, given):
        factors = dgp.core.VecchiaFactors(neighbors, mask, coef, scale)
        return vecchia_sample(factors, eps, given if start else None)

    def dense(coef, scale, eps, given):
        return _dense_sequential_pass(neighbors, coef, scale, eps, given)

    args = (coef, scale, eps, given)
    np.testing.assert_allclose(ours(*args), dense(*args), rtol=1e-12, atol=1e-12)
    got = jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2, 3))(*args)
    want = jax.grad(lambda *a: loss(dense, *a), argnums=(0, 1, 2, 3))(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    # a shared (n, m) coefficient array: its gradient sums over the outputs
    def shared_loss(shared_coef):
        factors = dgp.core.VecchiaFactors(neighbors, mask, shared_coef, scale)
        return jnp.sum(weights * jnp.sin(vecchia_sample(factors, eps, given if start else None)))

    shared = jax.grad(shared_loss)(coef[0])
    shared_dense = jax.grad(lambda c: loss(dense, jnp.broadcast_to(c, coef.shape), *args[1:]))
    np.testing.assert_allclose(shared, shared_dense(coef[0]), rtol=1e-10, atol=1e-12)
    # float32 values with float64 factors, compiled: cotangents in each argument's dtype
    grads = jax.jit(jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2, 3)))(
        coef, scale, eps.astype(jnp.float32), given.astype(jnp.float32)
    )
    assert [g.dtype for g in grads] == [jnp.float64, jnp.float64, jnp.float32, jnp.float32]
    np.testing.assert_allclose(grads[0], got[0], rtol=1e-4, atol=1e-4)


def test_vecchia_log_density_approaches_the_exact_one_as_m_grows():
    """The KL from the exact prior to the Vecchia one, E_exact[log p - log p_V], in closed form
    from the sparse inverse factor: it falls as m grows (nested neighbour sets; Guinness 2018) and
    vanishes at m = n - 1 (to the round-off of ||U L||^2, about n eps cond(K) = 3e-8 here)."""
    rng = np.random.default_rng(3)
    n = 60
    X = rng.uniform(-2, 2, size=(n, 2))
    K = np.asarray(K1(X)) + 1e-6 * np.eye(n)
    L = np.linalg.cholesky(K)
    kls = []
    for m in (1, 2, 4, 8, 16, 32, n - 1):
        neighbors, mask = nearest_previous_neighbors(X, m)
        F = vecchia_factors(K1, X, neighbors, mask, np.full(n, 1e-6))
        # U = (I - B) / d row by row: p_V = N(0, (U^T U)^-1)
        B = np.zeros((n, n))
        for k in range(n):
            np.add.at(B[k], np.asarray(F.neighbors[k]), np.asarray(F.coef[k]))  # masked: 0 at 0
        U = (np.eye(n) - B) / np.asarray(F.scale)[:, None]  # lower triangular, diagonal 1 / d
        # KL = (tr(Q K) - n - log det(Q K)) / 2 with Q = U^T U, in factors (no n x n inverse)
        kl = 0.5 * (np.sum((U @ L) ** 2) - n) - np.log(np.diag(L)).sum()
        kl += np.log(np.asarray(F.scale)).sum()
        kls.append(kl)
    assert all(a >= b - 1e-6 for a, b in zip(kls, kls[1:])), kls
    assert kls[0] > 1.0 and abs(kls[-1]) < 1e-6, kls  # 42.6, ..., 0.99 (m = 32), 0


# -- the handler against exact_layers -----------------------------------------------------------


@pytest.mark.parametrize("parameterization", ["noncentered", "centered"])
@pytest.mark.parametrize("ordering", ["random", "given"])
def test_vecchia_with_all_neighbors_is_exact_layers(data, parameterization, ordering):
    X, y, grid = data
    exact = exact_layers(two_layer, grid=grid, parameterization="centered", jitter=1e-6)
    values = _latent_values(exact, X, y, 0)  # a prior draw: centered values of the exact model
    vecchia = vecchia_layers(
        two_layer,
        num_neighbors=N + G - 1,
        grid=grid,
        parameterization=parameterization,
        jitter=1e-6,
        ordering=ordering,
    )
    lp_exact, tr_exact = log_density(seed(exact, 0), (X, y), {}, values)
    if parameterization == "centered":
        lp, tr = log_density(seed(vecchia, 0), (X, y), {}, values)
        np.testing.assert_allclose(float(lp), float(lp_exact), rtol=1e-10)
    else:
        # the same values by the non-centered map: the densities differ by log|det| of it,
        # the sum of the log conditional scales (log det of the Cholesky factor)
        tr_v = trace(seed(vecchia, 1)).get_trace(X, y)
        f_white = {n: tr_v[n]["value"] for n in ("h1.f_white", "h2.f_white")}
        lp, tr = log_density(seed(vecchia, 0), (X, y), {}, f_white)
        centered = {"h1.f": tr["h1"]["value"].T, "h2.f": tr["h2"]["value"].T}
        centered["h1.f"] = jnp.concatenate([centered["h1.f"], tr["h1.grid"]["value"].T], axis=1)
        centered["h2.f"] = jnp.concatenate([centered["h2.f"], tr["h2.grid"]["value"].T], axis=1)
        lp_exact, tr_exact = log_density(seed(exact, 0), (X, y), {}, centered)
        A = np.concatenate([np.asarray(X), np.asarray(grid)])
        H = np.asarray(centered["h1.f"]).T
        log_det = (
            2 * np.log(np.diag(np.linalg.cholesky(np.asarray(K1(A)) + 1e-6 * np.eye(N + G)))).sum()
        )
        log_det += np.log(
            np.diag(np.linalg.cholesky(np.asarray(K2(H)) + 1e-6 * np.eye(N + G)))
        ).sum()
        np.testing.assert_allclose(float(lp), float(lp_exact) + log_det, rtol=1e-10)
    for name in ("h1.grid", "h2.grid"):
        np.testing.assert_allclose(tr[name]["value"], tr_exact[name]["value"], rtol=1e-9)


@pytest.mark.parametrize("model", [two_layer, noisy_layers])
def test_vecchia_collapsed_with_all_neighbors_is_the_exact_collapsed_density(data, model):
    """With every earlier observation a neighbour the collapsed density is the exact handler's
    (centered inner layer, any order), and the grid values, drawn in order each given all earlier
    observations and grid values, are the exact handler's draw from the joint conditional (and a
    dense one: the conditional's mean plus its Cholesky factor times the grid's noise)."""
    X, y, grid = data
    exact = exact_layers(
        model, grid=grid, parameterization="centered", collapse_last=True, jitter=1e-6
    )
    vecchia = vecchia_layers(
        model,
        num_neighbors=N + G,
        grid=grid,
        parameterization="centered",
        collapse_last=True,
        jitter=1e-6,
    )
    values = _latent_values(exact, X, y, 2)
    lp_exact, tr_exact = log_density(seed(exact, 0), (X, y), {}, values)
    lp, tr = log_density(seed(vecchia, 0), (X, y), {}, values)
    np.testing.assert_allclose(float(lp), float(lp_exact), rtol=1e-10)
    # the grid rows are drawn jointly, in their order: the exact conditional's Cholesky draw
    np.testing.assert_allclose(
        tr["h2.grid"]["value"], tr_exact["h2.grid"]["value"], rtol=1e-7, atol=1e-9
    )
    noise2 = 0.02 if model is noisy_layers else 0.0
    H = np.asarray(values["h1.f"]).T  # (N + G, 2)
    K = np.asarray(K2(H)) + (1e-6 + noise2) * np.eye(N + G)
    C = K[:N, :N] + 0.01 * np.eye(N)
    mean = K[N:, :N] @ np.linalg.solve(C, np.asarray(y))
    cov = K[N:, N:] - K[N:, :N] @ np.linalg.solve(C, K[:N, N:])
    expected = mean + np.linalg.cholesky(cov) @ np.asarray(values["h2.grid_white"][0])
    np.testing.assert_allclose(np.asarray(tr["h2.grid"]["value"][:, 0]), expected, rtol=1e-8)


def test_vecchia_noncentered_given_order_is_the_exact_noncentered_model(data):
    """In the given order with all neighbours, the non-centered map is the exact handler's
    ``mean + L eps``: the same white values give the same layers and the same log density."""
    X, y, grid = data
    exact = exact_layers(two_layer, grid=grid, collapse_last=True, jitter=1e-6)
    vecchia = vecchia_layers(
        two_layer,
        num_neighbors=N + G,
        grid=grid,
        collapse_last=True,
        jitter=1e-6,
        ordering="given",
    )
    values = {"h1.f_white": np.random.default_rng(5).normal(size=(2, N + G))}
    values["h2.grid_white"] = np.zeros((1, G))
    lp_exact, tr_exact = log_density(seed(exact, 0), (X, y), {}, values)
    lp, tr = log_density(seed(vecchia, 0), (X, y), {}, values)
    np.testing.assert_allclose(float(lp), float(lp_exact), rtol=1e-10)
    np.testing.assert_allclose(tr["h1"]["value"], tr_exact["h1"]["value"], rtol=1e-9)
    np.testing.assert_allclose(tr["h2.grid"]["value"], tr_exact["h2.grid"]["value"], rtol=1e-8)


def _dense_vecchia_precision(X, kernel, m, jitter):
    """``Q = U^T U`` of the Vecchia prior in the given order, by brute force (dense NumPy):
    row ``k`` of ``U`` is ``(e_k - b_k) / d_k`` with ``b, d`` the regression on the ``m`` nearest
    earlier points."""
    n = len(X)
    K = np.asarray(kernel(X)) + jitter * np.eye(n)
    U = np.zeros((n, n))
    for k in range(n):
        S = np.argsort(((X[:k] - X[k]) ** 2).sum(1))[:m]
        b = np.linalg.solve(K[np.ix_(S, S)], K[S, k]) if len(S) else np.zeros(0)
        d = np.sqrt(K[k, k] - K[k, S] @ b)
        U[k, k] = 1 / d
        U[k, S] = -b / d
    return U.T @ U


@pytest.mark.stochastic
def test_nuts_on_a_one_layer_vecchia_model_is_the_vecchia_gp_posterior():
    """NUTS + vecchia_layers (m = 2, an approximation) on a plain GP: the grid's posterior means and
    variances are those of the Vecchia prior times the Gaussian likelihood, in closed form from the
    dense precision (an independent brute-force construction), within Monte Carlo error."""
    kern = kernels.RBF(variance=1.0, lengthscale=0.5)

    def one_layer(X, y=None):
        f = dgp.gp_layer("f", X, kern, num_inducing=5)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)

    X = jnp.linspace(-1, 1, 12)[:, None]
    y = jnp.sin(3 * X[:, 0]) + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (12,))
    grid = jnp.array([[-1.4], [-0.3], [0.55], [1.2]])
    handler = vecchia_layers(one_layer, num_neighbors=2, grid=grid, ordering="given", jitter=1e-6)
    mcmc = MCMC(
        NUTS(handler),
        num_warmup=400,
        num_samples=1500,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), X, y)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["f.grid"][..., 0])  # (2, 1500, 4)
    A = np.concatenate([np.asarray(X), np.asarray(grid)])
    Q = _dense_vecchia_precision(A, kern, 2, 1e-6)
    precision = Q + np.diag(np.r_[np.full(12, 100.0), np.zeros(4)])
    cov = np.linalg.inv(precision)
    mean = cov @ np.r_[100.0 * np.asarray(y), np.zeros(4)]
    z = z_threshold(8)
    m_hat, m_se = mcmc_mean_and_se(draws)
    v_hat, v_se = mcmc_var_and_se(draws)
    np.testing.assert_array_less(np.abs(m_hat - mean[12:]), z * m_se)
    np.testing.assert_array_less(np.abs(v_hat - np.diag(cov)[12:]), z * v_se)


@pytest.mark.parametrize("with_grid", [False, True])
@pytest.mark.parametrize("collapse_last", [False, True])
def test_the_neighbour_search_is_not_part_of_the_potential(data, with_grid, collapse_last):
    """With concrete data and grid, the O(n^2) search runs once while tracing, not inside every
    log density and gradient (a grid once made it part of the compiled potential)."""
    X, y, grid = data
    handler = vecchia_layers(
        two_layer, num_neighbors=3, grid=grid if with_grid else None, collapse_last=collapse_last
    )
    info = initialize_model(jax.random.PRNGKey(0), handler, model_args=(X, y))
    potential = str(jax.make_jaxpr(jax.grad(info.potential_fn))(info.param_info.z))
    assert "top_k" not in potential


def test_vecchia_layers_at_any_size_and_dtype():
    """One point, fewer points than neighbours, float32 inputs: finite densities, the layer
    shapes, and prior draws of the centered site of the right shape."""
    for n, dtype in ((1, jnp.float64), (3, jnp.float32), (40, jnp.float32)):
        X = jnp.linspace(-1, 1, n, dtype=dtype)[:, None] * jnp.ones((1, 2), dtype)
        y = jnp.sin(X[:, 0])
        for parameterization in ("noncentered", "centered"):
            model = vecchia_layers(two_layer, num_neighbors=5, parameterization=parameterization)
            tr = trace(seed(model, 0)).get_trace(X, y)
            assert tr["h1"]["value"].shape == (n, 2) and tr["h2"]["value"].shape == (n, 1)
            values = {k: v for k, v in _latent_values(model, X, y, 1).items()}
            lp, _ = log_density(seed(model, 0), (X, y), {}, values)
            assert np.isfinite(float(lp)), (n, dtype, parameterization)


def test_neighbor_inputs_choose_a_layers_sets(data):
    """A layer's neighbour sets from points you give: the data inputs given explicitly are the
    default; other points give another density (m < n), rows that do not match are refused."""
    X, y, grid = data
    values = _latent_values(vecchia_layers(two_layer, num_neighbors=3), X, y, 0)

    def lp(**kwargs):
        model = vecchia_layers(two_layer, num_neighbors=3, **kwargs)
        return float(log_density(seed(model, 0), (X, y), {}, values)[0])

    assert lp(neighbor_inputs={"h2": X}) == pytest.approx(lp(), rel=1e-12)
    assert lp(neighbor_inputs={"h2": -(X[:, ::-1] ** 3)}) != pytest.approx(lp(), rel=1e-6)
    with pytest.raises(
        ValueError, match=r"neighbor_inputs\['h2'\] has 15 rows, but the layer has 12"
    ):
        lp(neighbor_inputs={"h2": jnp.concatenate([X, grid])})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_neighbors": 0}, "num_neighbors must be a positive integer, got 0"),
        ({"num_neighbors": 2.5}, "num_neighbors must be a positive integer, got 2.5"),
        ({"num_neighbors": True}, "num_neighbors must be a positive integer, got True"),
        ({"ordering": "maximin"}, "ordering must be one of"),
        ({"parameterization": "whitened"}, "parameterization must be one of"),
        ({"neighbor_inputs": {"h1": np.zeros(4)}}, r"neighbor_inputs\['h1'\] must be a finite"),
        ({"neighbor_inputs": {"h1": np.full((4, 1), np.nan)}}, "with NaN or inf values"),
        ({"jitter": -1.0}, "jitter must be positive"),
        ({"grid": np.zeros(3)}, "grid must have shape"),
    ],
)
def test_vecchia_layers_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        vecchia_layers(two_layer, **kwargs)


def test_vecchia_collapse_refuses_a_non_gaussian_likelihood_and_substituted_values(data):
    X, y, _ = data

    def probit(X, y=None):
        f = dgp.gp_layer("f", X, K1, num_inducing=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=f[:, 0]), obs=y)

    with pytest.raises(NotImplementedError, match="only a Normal likelihood"):
        trace(seed(vecchia_layers(probit, collapse_last=True), 0)).get_trace(X, (y > 0) * 1.0)
    model = vecchia_layers(two_layer, num_neighbors=3)
    with pytest.raises(ValueError, match="latent layer output 'h1.f_white' has shape"):
        trace(substitute(seed(model, 0), {"h1.f_white": np.zeros((2, 5))})).get_trace(X, y)


def _brute_force_vecchia_log_density(A, residual, kernel, diag, order, m, choose):
    """Sum over the points in ``order`` of log N(r_k | b^T r_S, d^2), S the m earlier points nearest
    in ``choose`` (brute force, dense NumPy), covariances K(A) + diag(diag) (points' own order)."""
    K = np.asarray(kernel(A)) + np.diag(diag)
    total = 0.0
    for pos, k in enumerate(order):
        earlier = order[:pos]
        S = earlier[np.argsort(((choose[earlier] - choose[k]) ** 2).sum(1))[:m]]
        b = np.linalg.solve(K[np.ix_(S, S)], K[S, k]) if len(S) else np.zeros(0)
        var = K[k, k] - K[k, S] @ b
        total += stats.norm(residual[S] @ b, np.sqrt(var)).logpdf(residual[k])
    return total


def test_vecchia_density_with_few_neighbors_in_a_random_order_is_the_brute_force_one(data):
    """m = 3 < n, the handler's random order, a noisy two-output layer then a collapsed one with a
    different noise at every point: the log density against a brute-force construction."""
    X, y, _ = data
    rng = np.random.default_rng(7)

    def noisy_model(X, y=None):
        h = dgp.gp_layer("h1", X, K1, num_inducing=4, out_dim=2, mean="identity", noise=0.05)
        f = dgp.gp_layer("h2", h, K2, num_inducing=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[:, 0], jnp.linspace(0.1, 0.3, X.shape[0])), obs=y)

    order = np.asarray(jax.random.permutation(jax.random.PRNGKey(0), N))
    A = np.asarray(X)
    for collapse in (False, True):
        model = vecchia_layers(
            noisy_model,
            num_neighbors=3,
            parameterization="centered",
            collapse_last=collapse,
            jitter=1e-6,
        )
        values = {"h1.f": A.T + 0.3 * rng.normal(size=(2, N))}
        if not collapse:
            values["h2.f"] = rng.normal(size=(1, N))
        lp, _ = log_density(seed(model, 0), (X, y), {}, values)
        expected = sum(
            _brute_force_vecchia_log_density(
                A, values["h1.f"][p] - A[:, p], K1, np.full(N, 1e-6 + 0.05), order, 3, A
            )
            for p in range(2)
        )
        H = values["h1.f"].T
        noise = np.linspace(0.1, 0.3, N) ** 2
        if collapse:
            expected += _brute_force_vecchia_log_density(
                H,
                np.asarray(y),
                K2,
                1e-6 + noise,
                order,
                3,
                A,  # every layer: the data's sets
            )
        else:
            expected += _brute_force_vecchia_log_density(
                H, values["h2.f"][0], K2, np.full(N, 1e-6), order, 3, A
            )
            expected += stats.norm(values["h2.f"][0], np.sqrt(noise)).logpdf(np.asarray(y)).sum()
        np.testing.assert_allclose(float(lp), expected, rtol=1e-10)


def test_a_one_layer_collapsed_model_with_a_grid_and_given_neighbor_points(data):
    """The collapsed layer is the first: its sets from the points given for it; with all earlier
    points as neighbours, the exact handler's density and grid draw; a misspelled layer name in
    neighbor_inputs is refused after the run."""
    X, y, grid = data

    def one_layer(X, y=None):
        f = dgp.gp_layer("f", X, K1, num_inducing=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)

    points = np.concatenate([np.asarray(X), np.asarray(grid)])[:, ::-1] ** 3  # other sets
    exact = exact_layers(one_layer, grid=grid, collapse_last=True, jitter=1e-6)
    vecchia = vecchia_layers(
        one_layer,
        num_neighbors=N + G,
        grid=grid,
        collapse_last=True,
        jitter=1e-6,
        neighbor_inputs={"f": points},
    )
    values = {"f.grid_white": np.random.default_rng(8).normal(size=(1, G))}
    lp_exact, tr_exact = log_density(seed(exact, 0), (X, y), {}, values)
    lp, tr = log_density(seed(vecchia, 0), (X, y), {}, values)
    np.testing.assert_allclose(float(lp), float(lp_exact), rtol=1e-10)
    np.testing.assert_allclose(
        tr["f.grid"]["value"], tr_exact["f.grid"]["value"], rtol=1e-7, atol=1e-9
    )
    misspelled = vecchia_layers(one_layer, num_neighbors=3, neighbor_inputs={"F": X})
    with pytest.raises(
        ValueError, match=r"neighbor_inputs names \['F'\], which the model did not run"
    ):
        trace(seed(misspelled, 0)).get_trace(X, y)
