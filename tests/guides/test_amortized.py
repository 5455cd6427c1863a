"""Amortized DGP (paper 003): per-point inducing sets, AutoAmortizedDGP, AR rules, branches.

Known answers: one point and one layer is the per-point SVGP bound computed densely; the
KL is averaged over points (or summed); AR2P at fixed Hermite nodes is Gauss-Hermite
quadrature of the same expectation (and agrees with numerical integration); the
``quadrature`` handler does the same for a factorized guide; the predictive objective and
``predict`` are the weighted branch mixtures.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI, Trace_ELBO
from scipy import integrate
from scipy.stats import norm

import numpyro_dgp as dgp
from numpyro_dgp._engine.run import marginal_trace
from numpyro_dgp._protocol import LOCAL_KL, get_tag
from numpyro_dgp.core import gauss_hermite
from numpyro_dgp.guides import AutoAmortizedDGP, AutoFactorizedDGP
from numpyro_dgp.handlers import quadrature
from numpyro_dgp.kernels import RBF, Matern52

JITTER = 1e-6  # float64 default; amortized layers scale it by the set's prior variance


def matern52(A, B, variance, lengthscale):
    r = np.sqrt(np.maximum(((A[:, None, :] - B[None, :, :]) ** 2).sum(-1), 0)) / lengthscale
    return variance * (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)


def rbf(A, B, variance, lengthscale):
    return variance * np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1) / lengthscale**2)


def one_layer_model(kernel, num_inducing=3, noise=0.1, average_kl=True):
    def model(X, y=None, batch_size=None):
        with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
            x = numpyro.subsample(X, event_dim=1)
            yb = None if y is None else numpyro.subsample(y, event_dim=0)
            f = dgp.gp_layer("h1", x, kernel, num_inducing=num_inducing, inducing="amortized", average_kl=average_kl)
            numpyro.sample("y", dist.Normal(f[..., 0], noise**0.5), obs=yb)

    return model


def two_layer_model(kernel, num_inducing=3, noise=0.1):
    def model(X, y=None):
        with numpyro.plate("data", X.shape[0]):
            h = dgp.gp_layer("h1", X, kernel, num_inducing=num_inducing, inducing="amortized")
            f = dgp.gp_layer("h2", h, kernel, num_inducing=num_inducing, inducing="amortized")
            numpyro.sample("y", dist.Normal(f[..., 0], noise**0.5), obs=y)

    return model


def perturbed_params(model, guide, *args, seed=0, scale=0.3):
    """Initial parameters with every unconstrained entry moved at random (no special values)."""
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(seed), *args)
    raw = svi.optim.get_params(state.optim_state)
    keys = iter(jax.random.split(jax.random.PRNGKey(seed + 1), len(raw)))
    raw = {k: v + scale * jax.random.normal(next(keys), jnp.shape(v), jnp.result_type(v)) for k, v in raw.items()}
    return svi.constrain_fn(raw)


def dense_svgp_terms(x, y, Z, mu, S, variance, lengthscale, noise, kern=matern52):
    """Expected log-likelihood and KL of one point's SVGP, dense numpy float64."""
    K = kern(Z, Z, variance, lengthscale) + JITTER * variance * np.eye(len(Z))
    kxz = kern(x[None], Z, variance, lengthscale)[0]
    Kinv = np.linalg.inv(K)
    mean = kxz @ Kinv @ mu
    var = variance - kxz @ Kinv @ (K - S) @ Kinv @ kxz
    ell = -0.5 * np.log(2 * np.pi * noise) - 0.5 * ((y - mean) ** 2 + var) / noise
    M = len(Z)
    kl = 0.5 * (np.trace(Kinv @ S) + mu @ Kinv @ mu - M + np.linalg.slogdet(K)[1] - np.linalg.slogdet(S)[1])
    return ell, kl, mean, var


def encoder_output(model, guide, params, X, y, site="h1.u", p=None):
    run = marginal_trace(model, guide, params, jax.random.PRNGKey(0), (X, y), {})
    encode = run.posteriors[site].encode
    return [np.asarray(a) for a in encode(X if p is None else p)], run


def test_single_point_single_layer_equals_dense_svgp_bound():
    X = jnp.array([[0.3, -0.2]])
    y = jnp.array([0.7])
    model = one_layer_model(Matern52(ard=False))
    guide = AutoAmortizedDGP(model, covariance="full", num_hidden=1)
    params = perturbed_params(model, guide, X, y)
    elbo = -dgp.DGPElbo().loss(jax.random.PRNGKey(3), params, model, guide, X, y)

    (loc, tril), _ = encoder_output(model, guide, params, X, y)
    mu, L = loc[0, 0], tril[0, 0]
    W, b = np.asarray(params["h1.inducing_maps.weight"]), np.asarray(params["h1.inducing_maps.bias"])
    Z = np.einsum("mij,j->mi", W, np.asarray(X[0])) + b
    ell, kl, _, _ = dense_svgp_terms(
        np.asarray(X[0]), 0.7, Z, mu, L @ L.T,
        float(params["h1.kernel.variance"]), float(params["h1.kernel.lengthscale"]), 0.1,
    )
    np.testing.assert_allclose(elbo, ell - kl, rtol=1e-10, atol=1e-10)
    assert abs(kl) > 1e-2  # a non-trivial posterior


@pytest.mark.parametrize("average_kl", [True, False])
def test_kl_is_averaged_over_points_as_in_the_paper(average_kl):
    rng = np.random.RandomState(1)
    X = jnp.asarray(rng.uniform(-1, 1, (5, 2)))
    y = jnp.asarray(rng.randn(5))
    model = one_layer_model(Matern52(ard=False), average_kl=average_kl)
    guide = AutoAmortizedDGP(model, covariance="diagonal", num_hidden=1)
    params = perturbed_params(model, guide, X, y)
    parts = dgp.DGPElbo().components(jax.random.PRNGKey(0), params, model, guide, X, y)

    (loc, std), _ = encoder_output(model, guide, params, X, y)
    W, b = np.asarray(params["h1.inducing_maps.weight"]), np.asarray(params["h1.inducing_maps.bias"])
    kls, ells = [], []
    for n in range(5):
        Z = np.einsum("mij,j->mi", W, np.asarray(X[n])) + b
        ell, kl, _, _ = dense_svgp_terms(
            np.asarray(X[n]), float(y[n]), Z, loc[n, 0], np.diag(std[n, 0] ** 2),
            float(params["h1.kernel.variance"]), float(params["h1.kernel.lengthscale"]), 0.1,
        )
        kls.append(kl)
        ells.append(ell)
    expected_kl = np.mean(kls) if average_kl else np.sum(kls)
    np.testing.assert_allclose(parts["kl_inducing"], expected_kl, rtol=1e-10)
    np.testing.assert_allclose(parts["expected_log_likelihood"], np.sum(ells), rtol=1e-10)


def test_minibatch_scales_likelihood_by_N_over_B_and_kl_by_one_over_B():
    rng = np.random.RandomState(2)
    X = jnp.asarray(rng.uniform(-1, 1, (6, 2)))
    y = jnp.asarray(rng.randn(6))
    model = one_layer_model(Matern52(ard=False))
    guide = AutoAmortizedDGP(model, num_hidden=1)
    params = perturbed_params(model, guide, X, y)
    key = jax.random.PRNGKey(4)
    run = marginal_trace(model, guide, params, key, (X, y, 2), {})
    idx = np.asarray(run.model_trace["data"]["value"])
    parts = dgp.DGPElbo().components(key, params, model, guide, X, y, 2)
    full = dgp.DGPElbo().components(jax.random.PRNGKey(0), params, model, guide, X[idx], y[idx])
    # full batch of those two points: ELL summed, KL averaged over 2 points
    np.testing.assert_allclose(parts["expected_log_likelihood"], 3.0 * full["expected_log_likelihood"], rtol=1e-10)
    np.testing.assert_allclose(parts["kl_inducing"], full["kl_inducing"], rtol=1e-10)


def test_ar2p_at_hermite_nodes_is_gauss_hermite_quadrature():
    x, y = np.array([0.4]), 0.3
    X, Y = jnp.asarray(x[None]), jnp.array([y])
    kernel = RBF(ard=False)
    model = two_layer_model(kernel)

    def ell_with(num_nodes):
        nodes, weights = gauss_hermite(num_nodes)
        guide = AutoAmortizedDGP(model, rule="AR2P", num_branches=num_nodes, points={"h1": nodes[:, None]},
                                 weights=weights, learn_points=False, num_hidden=1)
        params = perturbed_params(model, guide, X, Y, scale=0.2)
        parts = dgp.DGPElbo().components(jax.random.PRNGKey(0), params, model, guide, X, Y)
        return guide, params, float(parts["expected_log_likelihood"])

    guide, params, ell20 = ell_with(20)
    hp = lambda layer: (float(params[f"{layer}.kernel.variance"]), float(params[f"{layer}.kernel.lengthscale"]))  # noqa: E731
    maps = lambda layer, p: np.einsum("mij,j->mi", np.asarray(params[f"{layer}.inducing_maps.weight"]), p) + np.asarray(params[f"{layer}.inducing_maps.bias"])  # noqa: E731

    # layer 1 densely
    (loc1, std1), run = encoder_output(model, guide, params, X, Y)
    Z1 = maps("h1", x)
    _, _, m1, v1 = dense_svgp_terms(x, y, Z1, loc1[0, 0], np.diag(std1[0, 0] ** 2), *hp("h1"), 0.1, kern=rbf)
    # layer 2's encoder sees the weighted mean of the branch means, i.e. m1 here
    p2 = np.array([m1])
    loc2, std2 = [np.asarray(a) for a in run.posteriors["h2.u"].encode(jnp.asarray(p2[None]))]
    Z2 = maps("h2", p2)

    def integrand(f1):
        ell, _, _, _ = dense_svgp_terms(np.array([f1]), y, Z2, loc2[0, 0], np.diag(std2[0, 0] ** 2), *hp("h2"), 0.1, kern=rbf)
        return ell

    nodes, weights = gauss_hermite(20)
    by_hand = sum(w * integrand(m1 + z * np.sqrt(v1)) for z, w in zip(nodes, weights))
    np.testing.assert_allclose(ell20, by_hand, rtol=1e-10)
    exact, _ = integrate.quad(lambda f: integrand(f) * norm.pdf(f, m1, np.sqrt(v1)), m1 - 12 * np.sqrt(v1), m1 + 12 * np.sqrt(v1), epsabs=1e-13, epsrel=1e-12)
    np.testing.assert_allclose(ell20, exact, rtol=1e-8)
    _, _, ell2 = ell_with(2)
    assert abs(ell2 - exact) > 1e-6  # two nodes are not enough: the check can fail


def test_quadrature_handler_gives_gauss_hermite_for_a_factorized_guide():
    rng = np.random.RandomState(3)
    X = jnp.asarray(rng.uniform(-1, 1, (4, 1)))
    y = jnp.asarray(rng.randn(4))
    nodes, weights = gauss_hermite(40)  # the layer-1 spread is wide against layer 2's lengthscale
    base = dgp.models.deep_gp_regression(2, num_inducing=3, hidden_width=1, kernel=RBF(), noise_init=0.1)
    model = quadrature(base, num_points=40, points=nodes, weights=weights, learnable=False)
    guide = AutoFactorizedDGP(model, inner_init="prior")
    params = perturbed_params(model, guide, X, y, scale=0.2)
    parts = dgp.DGPElbo().components(jax.random.PRNGKey(0), params, model, guide, X, y)

    run = marginal_trace(model, guide, params, jax.random.PRNGKey(0), (X, y), {})
    assert run.mixture_log_weights.shape == (40,)
    layers = {s["args"][0].name: s["args"][0] for s in run.model_trace.values() if s["type"] == "dgp_layer"}
    m1, v1 = [np.asarray(a)[:, 0] for a in run.moments["h1"]]
    post2 = run.posteriors["h2.u"]
    noise = float(params["noise"])

    def integrand(f1, n):
        m, v = dgp.layers.layer_moments(layers["h2"], jnp.array([[f1]]), post2[0], post2[1])
        m, v = float(m[0, 0]), float(v[0, 0])
        return -0.5 * np.log(2 * np.pi * noise) - 0.5 * ((float(y[n]) - m) ** 2 + v) / noise

    by_hand = sum(w * integrand(m1[n] + z * np.sqrt(v1[n]), n) for n in range(4) for z, w in zip(nodes, weights))
    np.testing.assert_allclose(parts["expected_log_likelihood"], by_hand, rtol=1e-12)
    exact = sum(
        integrate.quad(lambda f: integrand(f, n) * norm.pdf(f, m1[n], np.sqrt(v1[n])),
                       m1[n] - 12 * np.sqrt(v1[n]), m1[n] + 12 * np.sqrt(v1[n]), epsabs=1e-12)[0]
        for n in range(4)
    )
    np.testing.assert_allclose(parts["expected_log_likelihood"], exact, rtol=1e-6)  # 40 nodes: converged to 2e-7
    # learnable points and weights are parameters of the model, and they get gradients
    learnable = quadrature(base, num_points=5)
    guide = AutoFactorizedDGP(learnable)
    p = perturbed_params(learnable, guide, X, y)
    assert p["quadrature.h1.points"].shape == (5, 1) and p["quadrature.logits"].shape == (5,)
    grads = jax.grad(lambda q: dgp.DGPElbo().loss(jax.random.PRNGKey(0), q, learnable, guide, X, y))(p)
    assert np.all(np.abs(grads["quadrature.h1.points"]) > 0) and np.any(np.abs(grads["quadrature.logits"]) > 0)


def test_predictive_objective_and_predict_are_the_weighted_branch_mixture():
    rng = np.random.RandomState(4)
    X = jnp.asarray(rng.uniform(-1, 1, (6, 2)))
    y = jnp.asarray(rng.randn(6))
    model = two_layer_model(Matern52(ard=False))
    guide = AutoAmortizedDGP(model, rule="AR2P", num_branches=4, num_hidden=1)
    params = perturbed_params(model, guide, X, y)
    params = {**params, "auto.branch_logits": jnp.array([0.3, -0.2, 0.5, 0.0])}
    key = jax.random.PRNGKey(5)
    run = marginal_trace(model, guide, params, key, (X, y), {})
    m, v = [np.asarray(a)[..., 0] for a in run.moments["h2"]]  # (S, N)
    assert m.shape == (4, 6)
    w = np.asarray(jax.nn.softmax(run.mixture_log_weights))
    log_pred = np.log(np.sum(w[:, None] * norm.pdf(np.asarray(y), m, np.sqrt(v + 0.1)), axis=0)).sum()
    parts = dgp.PredictiveObjective(num_particles=1).components(key, params, model, guide, X, y)
    np.testing.assert_allclose(parts["log_predictive"], log_pred, rtol=1e-10)
    ell = np.sum(w[:, None] * (-0.5 * np.log(2 * np.pi * 0.1) - 0.5 * ((np.asarray(y) - m) ** 2 + v) / 0.1))
    elbo_parts = dgp.DGPElbo().components(key, params, model, guide, X, y)
    np.testing.assert_allclose(elbo_parts["expected_log_likelihood"], ell, rtol=1e-10)

    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(6), X, num_samples=3)
    assert pred.component_means.shape == (12, 6) and pred.weights.shape == (12,)
    np.testing.assert_allclose(pred.weights.sum(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(pred.weights[:4], w / 3, rtol=1e-10)
    lp = norm.logpdf(np.asarray(y), pred.component_means, np.sqrt(pred.component_variances))
    expected = np.log(np.sum(np.asarray(pred.weights)[:, None] * np.exp(lp), axis=0))
    np.testing.assert_allclose(dgp.log_likelihood(pred, y), expected, rtol=1e-10)
    np.testing.assert_allclose(pred.mean, np.asarray(pred.weights) @ np.asarray(pred.component_means), rtol=1e-10)
    # AR2P propagation is deterministic: every sample gives the same components
    np.testing.assert_allclose(pred.component_means[:4], pred.component_means[4:8], rtol=1e-12)


@pytest.mark.parametrize("rule", ["AR1", "AR2"])
def test_monte_carlo_rules_shapes_and_encoder_inputs(rule):
    rng = np.random.RandomState(5)
    X = jnp.asarray(rng.uniform(-1, 1, (6, 2)))
    y = jnp.asarray(rng.randn(6))
    model = two_layer_model(Matern52(ard=False))
    guide = AutoAmortizedDGP(model, rule=rule, num_branches=3, num_hidden=1)
    params = perturbed_params(model, guide, X, y)
    run = marginal_trace(model, guide, params, jax.random.PRNGKey(0), (X, y), {})
    p2 = run.model_trace["h2.encoder_input"]["value"]  # what the layer's encoder saw
    h1 = run.model_trace["h1.layer"]["value"]  # (S, N, 1) branches
    assert h1.shape == (3, 6, 1)
    if rule == "AR1":  # the encoder sees every branch; one inducing set per branch
        np.testing.assert_allclose(p2, h1)
        assert get_tag(run.model_trace["h2.u"], LOCAL_KL).shape == (3, 6)
    else:  # the mean of the branch means
        np.testing.assert_allclose(p2, run.moments["h1"][0], rtol=1e-12)
        assert get_tag(run.model_trace["h2.u"], LOCAL_KL).shape == (6,)
    loss = dgp.DGPElbo().loss(jax.random.PRNGKey(1), params, model, guide, X, y)
    assert np.isfinite(loss)


@pytest.mark.stochastic
def test_fit_and_predict_learns_a_function():
    rng = np.random.RandomState(6)
    X = jnp.asarray(rng.uniform(-1, 1, (80, 1)))
    y = jnp.asarray(np.sin(3 * np.asarray(X[:, 0])) + 0.05 * rng.randn(80))
    model = dgp.models.amortized_dgp(widths=(2, 1), num_inducing=(4, 4), noise_init=0.05)
    guide = AutoAmortizedDGP(model, rule="AR2P", num_branches=4)
    svi = SVI(model, guide, numpyro.optim.Adam(0.02), dgp.PredictiveObjective(num_particles=1))
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, 40, num_steps=600, chunk_size=300, progress_bar=False)
    assert result.num_skipped == 0
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), X, num_samples=1)
    scores = dgp.metrics(pred, y)
    assert scores["rmse"] < 0.25 * float(jnp.std(y)), scores


def test_errors():
    X = jnp.ones((4, 2))

    def outside_plate(X):
        dgp.gp_layer("h1", X, RBF(), num_inducing=2, inducing="amortized")

    with pytest.raises(ValueError, match="inside the data plate"):
        numpyro.handlers.seed(outside_plate, 0)(X)

    def whitened(X):
        with numpyro.plate("data", 4):
            dgp.gp_layer("h1", X, RBF(), num_inducing=2, inducing="amortized", whiten=True)

    with pytest.raises(ValueError, match="whiten"):
        numpyro.handlers.seed(whitened, 0)(X)

    model = one_layer_model(RBF())
    y = jnp.zeros(4)
    with pytest.raises(ValueError, match="AutoAmortizedDGP"):
        AutoFactorizedDGP(model).setup(jax.random.PRNGKey(0), X, y)
    with pytest.raises(ValueError, match="rule"):
        AutoAmortizedDGP(model, rule="AR3")
    with pytest.raises(ValueError, match="AutoAmortizedDGP: init_scale must be a finite positive"):
        AutoAmortizedDGP(model, init_scale=0.0)
    with pytest.raises(ValueError, match="AutoFactorizedDGP: init_scale must be a finite positive"):
        AutoFactorizedDGP(model, init_scale=-1.0)
    with pytest.raises(ValueError, match="no gp_layer with inducing='amortized'"):
        AutoAmortizedDGP(dgp.models.deep_gp_regression(1, num_inducing=2)).setup(jax.random.PRNGKey(0), X, y)
    guide = AutoAmortizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), X, y)
    with pytest.raises(NotImplementedError, match="DGPElbo"):
        svi.update(state, X, y)
    with pytest.raises(ValueError, match="weights"):
        quadrature(model, num_points=3, weights=[1.0, 0.0, 1.0])


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_per_point_jitter_is_relative_to_the_prior_variance(dtype):
    # A probit output layer's kernel variance grows to ~100 on the letters task; a fixed jitter
    # then falls below float32 round-off in K(Z_n, Z_n). The jitter scales with each set's
    # mean prior variance instead.
    variance, M, jitter = 100.0, 16, 1e-4
    rng = np.random.RandomState(0)
    X = jnp.asarray(rng.uniform(-1, 1, (50, 2)), dtype)

    def model(X):
        with numpyro.plate("data", X.shape[0]):
            dgp.gp_layer("h1", X, Matern52(variance=variance, lengthscale=2.0, ard=False), num_inducing=M,
                         inducing="amortized", jitter=jitter)

    # inducing inputs packed closely (bias scale 0.05): nearly singular K(Z_n, Z_n)
    bias = jnp.asarray(0.05 * rng.randn(M, 2), dtype)
    with numpyro.validation_enabled(False):
        tr = numpyro.handlers.trace(numpyro.handlers.substitute(
            numpyro.handlers.seed(model, 0), data={"h1.inducing_maps.bias": bias})).get_trace(X)
    layer = tr["h1.layer"]["args"][0]
    L = np.asarray(layer.Kmm_chol, np.float64)
    assert L.dtype == np.float64 and np.asarray(layer.Kmm_chol).dtype == dtype
    assert np.all(np.isfinite(L))
    Z = np.asarray(layer.inducing_inputs, np.float64)
    K = np.stack([matern52(z, z, variance, 2.0) for z in Z])
    expected = K + jitter * variance * np.eye(M)  # stationary kernel: mean diagonal = variance
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == jnp.float64 else dict(rtol=1e-5, atol=2e-3)
    np.testing.assert_allclose(L @ np.swapaxes(L, -1, -2), expected, **tol)
