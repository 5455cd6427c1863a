"""Bernoulli likelihoods: bernoulli_probit, DGPElbo's expected log-likelihood, predict and
predict_from_samples for classification, log_likelihood and metrics -- against closed forms,
scipy quadrature and dense NumPy sparse-GP moments."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI
from scipy import integrate
from scipy.special import expit
from scipy.stats import norm

import numpyro_dgp as dgp
from numpyro_dgp import bernoulli_probit
from numpyro_dgp.kernels import RBF
from tests._mc import z_threshold

jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)

JITTER = 1e-6  # float64 default of the layers, relative to the kernel variance
M, N, N_NEW = 5, 12, 9


# ---------------------------------------------------------------- dense references


def rbf(A, B, variance, lengthscale):
    A, B = np.asarray(A) / lengthscale, np.asarray(B) / lengthscale
    return variance * np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))


def svgp_moments(X, Z, variance, lengthscale, q_mean, q_scale_tril=None):
    """Whitened sparse GP marginal at X: mean A^T m, var k_xx - sum A^2 + sum (S^T A)^2 with
    A = L^-1 K_zx (q_scale_tril None: given u = L m, no posterior spread)."""
    L = np.linalg.cholesky(rbf(Z, Z, variance, lengthscale) + JITTER * variance * np.eye(len(Z)))
    A = np.linalg.solve(L, rbf(Z, X, variance, lengthscale))
    mean = A.T @ np.asarray(q_mean)
    var = variance - (A**2).sum(0)
    if q_scale_tril is not None:
        var = var + ((np.asarray(q_scale_tril).T @ A) ** 2).sum(0)
    return mean, var


def moments_from_params(params, X):
    return svgp_moments(
        X, np.asarray(params["f.inducing_inputs"]), float(params["f.kernel.variance"]),
        np.asarray(params["f.kernel.lengthscale"]), np.asarray(params["f.u_auto_loc"])[0],
        np.asarray(params["f.u_auto_scale_tril"])[0],
    )


def gauss_expectation(g, m, v, num=200):
    """E[g(f)], f ~ N(m, v) elementwise, by a dense (200-node) Gauss-Hermite rule in NumPy."""
    x, w = np.polynomial.hermite_e.hermegauss(num)
    w = w / w.sum()
    return (w * g(np.asarray(m)[..., None] + np.sqrt(np.asarray(v))[..., None] * x)).sum(-1)


# ---------------------------------------------------------------- models


def probit_model(squash):
    def model(X, y=None):
        f = dgp.gp_layer("f", X, RBF(), num_inducing=M)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", bernoulli_probit(f[..., 0], squash=squash), obs=y)

    return model


def logit_event_model(X, y=None):
    # logits, and the data axis as an event dimension (Independent) instead of a plate
    f = dgp.gp_layer("f", X, RBF(), num_inducing=M)
    numpyro.sample("y", dist.Bernoulli(logits=f[..., 0]).to_event(1), obs=y)


def vector_model(X, y=None):
    f = dgp.gp_layer("f", X, RBF(), num_inducing=M, out_dim=2)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(f, scale_tril=0.3 * jnp.eye(2)), obs=y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = np.sort(rng.uniform(-2, 2, N))[:, None]
    y = (X[:, 0] + 0.3 * rng.randn(N) > 0).astype(np.float64)
    return jnp.asarray(X), jnp.asarray(y)


def perturbed_guide(model, data, seed=0):
    """An AutoFactorizedDGP set up by svi.init with DGPElbo, its q(u) moved away from the prior."""
    X, y = data
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), X, y)))
    rng = np.random.RandomState(seed)
    params["f.u_auto_loc"] = jnp.asarray(rng.randn(1, M))
    tril = np.tril(0.2 * rng.randn(M, M), -1) + np.diag(0.3 + 0.5 * rng.rand(M))
    params["f.u_auto_scale_tril"] = jnp.asarray(tril[None])
    params["f.kernel.variance"] = jnp.asarray(1.4)
    params["f.kernel.lengthscale"] = jnp.full_like(params["f.kernel.lengthscale"], 0.8)
    return guide, params


# ---------------------------------------------------------------- (a) bernoulli_probit


def test_bernoulli_probit_probabilities_and_squash():
    f = np.linspace(-9.0, 9.0, 41)
    plain = bernoulli_probit(jnp.asarray(f), squash=0.0)
    assert isinstance(plain, dist.BernoulliProbs) and plain.batch_shape == (41,)
    np.testing.assert_allclose(plain.probs, norm.cdf(f), rtol=1e-12, atol=1e-300)
    squashed = bernoulli_probit(jnp.asarray(f))  # default 1e-3
    np.testing.assert_allclose(squashed.probs, 1e-3 + (1 - 2e-3) * norm.cdf(f), rtol=1e-12)
    p = np.asarray(bernoulli_probit(jnp.asarray([-40.0, 0.0, 40.0]), squash=0.01).probs)
    np.testing.assert_allclose(p, [0.01, 0.5, 0.99], rtol=1e-12)
    assert np.all((p >= 0.01) & (p <= 0.99))
    # log-probabilities stay finite at the far tails with the squash
    lp = squashed.log_prob(jnp.zeros(41)) + squashed.log_prob(jnp.ones(41))
    assert bool(jnp.all(jnp.isfinite(lp))) and float(lp.min()) > 2 * np.log(1e-3) - 1e-9


@pytest.mark.parametrize("squash", [-0.1, 0.5, 0.7, float("nan")])
def test_bernoulli_probit_rejects_bad_squash(squash):
    with pytest.raises(ValueError, match="bernoulli_probit: squash must satisfy 0 <= squash < 0.5"):
        bernoulli_probit(jnp.zeros(3), squash=squash)


def test_bernoulli_probit_rejects_non_numeric_squash():
    with pytest.raises(TypeError, match="squash must be a number"):
        bernoulli_probit(jnp.zeros(3), squash="small")


# ---------------------------------------------------------------- (b) predict


def test_predict_probit_is_the_closed_form_probit_gaussian_integral(data):
    X, y = data
    model = probit_model(squash=0.0)
    guide, params = perturbed_guide(model, data)
    Xs = jnp.linspace(-2.5, 2.5, N_NEW)[:, None]
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(1), Xs, num_samples=3)
    assert pred.likelihood == "bernoulli"
    m, v = moments_from_params(params, np.asarray(Xs))
    # the last layer's moments are the dense SVGP marginal (one layer: every component alike)
    np.testing.assert_allclose(pred.layer_means["f"][..., 0], np.broadcast_to(m, (3, N_NEW)), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(pred.layer_variances["f"][..., 0], np.broadcast_to(v, (3, N_NEW)), rtol=1e-8)
    assert float(v.min()) > 0.1 and float(np.abs(m).max()) > 0.5  # a real integral, not a point mass
    p = norm.cdf(m / np.sqrt(1 + v))
    np.testing.assert_allclose(pred.component_means, np.broadcast_to(p, (3, N_NEW)), atol=1e-6)
    # ... which is not Phi(m): the averaging over f matters
    assert float(np.abs(norm.cdf(m) - p).max()) > 0.02
    np.testing.assert_allclose(pred.component_variances, pred.component_means * (1 - pred.component_means), rtol=1e-12)
    np.testing.assert_allclose(pred.mean, p, atol=1e-6)
    np.testing.assert_allclose(pred.variance, pred.mean * (1 - pred.mean), rtol=1e-12)
    # the per-component moments agree with the layer moments the prediction reports
    lm, lv = np.asarray(pred.layer_means["f"][..., 0]), np.asarray(pred.layer_variances["f"][..., 0])
    np.testing.assert_allclose(pred.component_means, norm.cdf(lm / np.sqrt(1 + lv)), atol=1e-6)


def test_predict_logits_wrapped_in_independent(data):
    X, y = data
    guide, params = perturbed_guide(logit_event_model, data, seed=1)
    Xs = jnp.linspace(-2.5, 2.5, N_NEW)[:, None]
    pred = dgp.predict(logit_event_model, guide, params, jax.random.PRNGKey(1), Xs, num_samples=2)
    assert pred.likelihood == "bernoulli"
    m, v = moments_from_params(params, np.asarray(Xs))
    np.testing.assert_allclose(pred.mean, gauss_expectation(expit, m, v), atol=1e-6)


def test_predict_gaussian_prediction_is_labelled_normal(data):
    X, y = data

    def regression(X, y=None):
        f = dgp.gp_layer("f", X, RBF(), num_inducing=M)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)

    guide, params = perturbed_guide(regression, data)
    pred = dgp.predict(regression, guide, params, jax.random.PRNGKey(1), X, num_samples=2)
    assert pred.likelihood == "normal"
    m, v = moments_from_params(params, np.asarray(X))
    np.testing.assert_allclose(pred.variance, v + 0.01, rtol=1e-8)


# ---------------------------------------------------------------- (c) DGPElbo


@pytest.mark.parametrize("squash", [0.0, 1e-3])
def test_dgp_elbo_expected_log_likelihood_matches_scipy_quadrature(data, squash):
    X, y = data
    model = probit_model(squash)
    guide, params = perturbed_guide(model, data, seed=2)
    parts = dgp.DGPElbo().components(jax.random.PRNGKey(3), params, model, guide, X, y)
    m, v = moments_from_params(params, np.asarray(X))

    def log_p(f, label):
        if squash == 0.0:
            return norm.logcdf(f) if label == 1 else norm.logcdf(-f)
        p = squash + (1 - 2 * squash) * norm.cdf(f)
        return np.log(p) if label == 1 else np.log1p(-p)

    reference = 0.0
    for mn, vn, yn in zip(m, v, np.asarray(y)):
        sd = np.sqrt(vn)
        integrand = lambda f: norm.pdf(f, mn, sd) * log_p(f, yn)  # noqa: E731
        value, _ = integrate.quad(integrand, mn - 12 * sd, mn + 12 * sd, epsabs=1e-13, epsrel=1e-12, limit=200)
        reference += value
    np.testing.assert_allclose(float(parts["expected_log_likelihood"]), reference, rtol=1e-6)


def test_dgp_elbo_loss_is_finite_with_the_plain_probit(data):
    # squash=0: the far quadrature nodes give probabilities that round to 0 or 1
    X, y = data
    guide, params = perturbed_guide(probit_model(0.0), data)
    loss = dgp.DGPElbo().loss(jax.random.PRNGKey(0), params, probit_model(0.0), guide, X, y)
    assert np.isfinite(float(loss))


# ---------------------------------------------------------------- (d) log_likelihood, metrics


def bernoulli_prediction(component_probs):
    p = jnp.asarray(component_probs, jnp.float64)
    mean = p.mean(0)
    return dgp.Prediction(mean, mean * (1 - mean), p, p * (1 - p), {}, {}, {}, "bernoulli")


def test_bernoulli_log_likelihood_and_metrics_by_hand():
    # two components, four points
    pred = bernoulli_prediction([[0.9, 0.2, 0.5, 0.6], [0.7, 0.4, 1.0, 0.7]])
    y = np.array([1, 0, 1, 0])
    # per point: log mean_s p_s^y (1 - p_s)^(1 - y)
    expected = np.log([(0.9 + 0.7) / 2, (0.8 + 0.6) / 2, (0.5 + 1.0) / 2, (0.4 + 0.3) / 2])
    np.testing.assert_allclose(dgp.log_likelihood(pred, y), expected, rtol=1e-12)
    np.testing.assert_allclose(dgp.log_likelihood(pred, y.astype(bool)), expected, rtol=1e-12)
    out = dgp.metrics(pred, y)
    assert set(out) == {"log_likelihood", "accuracy", "error_rate", "brier", "ece"}
    np.testing.assert_allclose(out["log_likelihood"], expected.mean(), rtol=1e-12)
    # mixture probabilities 0.8, 0.3, 0.75, 0.65: only the last point is misclassified
    assert out["error_rate"] == 0.25
    np.testing.assert_allclose(out["brier"], np.mean([0.2**2, 0.3**2, 0.25**2, 0.65**2]), rtol=1e-12)


def test_bernoulli_log_likelihood_is_finite_for_saturated_components():
    # every component says p = 1 (or 0) where the label disagrees: clipped, not -inf
    pred = bernoulli_prediction([[1.0, 0.0, 1.0], [1.0, 0.0, 0.5]])
    ll = np.asarray(dgp.log_likelihood(pred, np.array([0, 1, 0])))
    assert np.all(np.isfinite(ll)) and ll[0] < -30 and ll[1] < -30
    np.testing.assert_allclose(ll[2], np.log(0.25), rtol=1e-12)  # (0 + 0.5) / 2: the sure component adds ~0
    # a single component far from saturation is log p exactly
    np.testing.assert_allclose(dgp.log_likelihood(bernoulli_prediction([[1e-200]]), np.array([1])),
                               [np.log(1e-200)], rtol=1e-12)


def test_bernoulli_metrics_validate_labels():
    pred = bernoulli_prediction([[0.9, 0.2, 0.5]])
    with pytest.raises(ValueError, match=r"metrics: y must hold only 0/1 labels .* 1 other value\(s\), e.g. -1"):
        dgp.metrics(pred, np.array([1.0, -1.0, 0.0]))
    with pytest.raises(ValueError, match="log_likelihood: y must hold only 0/1"):
        dgp.log_likelihood(pred, np.array([1.0, 0.5, 0.0]))
    with pytest.raises(ValueError, match="metrics: y has shape"):
        dgp.metrics(pred, np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="y_scale applies to regression predictions"):
        dgp.metrics(pred, np.array([1.0, 0.0, 0.0]), y_scale=2.0)


# ---------------------------------------------------------------- (e) predict_from_samples


def test_predict_from_samples_bernoulli_components(data):
    X, y = data
    rng = np.random.RandomState(4)
    S = 3
    samples = {
        "f.u": rng.randn(S, 1, M),
        "f.kernel.variance": 0.8 + rng.rand(S),
        "f.kernel.lengthscale": 0.5 + rng.rand(S, 1),
        "f.inducing_inputs": rng.uniform(-2, 2, (S, M, 1)),
    }
    Xs = np.linspace(-2.5, 2.5, N_NEW)[:, None]
    model = probit_model(squash=0.0)
    pred = dgp.predict_from_samples(model, {k: jnp.asarray(v) for k, v in samples.items()},
                                    jax.random.PRNGKey(0), jnp.asarray(Xs))
    assert pred.likelihood == "bernoulli" and pred.component_means.shape == (S, N_NEW)
    expected = []
    for s in range(S):
        m, v = svgp_moments(Xs, samples["f.inducing_inputs"][s], samples["f.kernel.variance"][s],
                            samples["f.kernel.lengthscale"][s], samples["f.u"][s, 0])
        np.testing.assert_allclose(pred.layer_means["f"][s, :, 0], m, atol=1e-8)
        np.testing.assert_allclose(pred.layer_variances["f"][s, :, 0], v, atol=1e-8)
        expected.append(norm.cdf(m / np.sqrt(1 + v)))
    expected = np.array(expected)
    np.testing.assert_allclose(pred.component_means, expected, atol=1e-6)
    assert float(np.abs(expected - expected.mean(0)).max()) > 0.05  # the components differ
    np.testing.assert_allclose(pred.mean, expected.mean(0), atol=1e-6)
    np.testing.assert_allclose(pred.variance, pred.mean * (1 - pred.mean), rtol=1e-12)
    # fixed params= instead of per-sample values
    fixed = {"f.kernel.variance": jnp.asarray(1.1), "f.kernel.lengthscale": jnp.asarray([0.7])}
    part = {k: jnp.asarray(v) for k, v in samples.items() if k not in fixed}
    pred2 = dgp.predict_from_samples(model, part, jax.random.PRNGKey(0), jnp.asarray(Xs), params=fixed)
    m, v = svgp_moments(Xs, samples["f.inducing_inputs"][0], 1.1, np.array([0.7]), samples["f.u"][0, 0])
    np.testing.assert_allclose(pred2.component_means[0], norm.cdf(m / np.sqrt(1 + v)), atol=1e-6)


# ---------------------------------------------------------------- (f) unsupported likelihoods


def test_unsupported_likelihood_raises_naming_the_site(data):
    # a distribution over vectors: its predictive mixture is not one number per point or class
    X, y = data
    vectors = jnp.asarray(np.random.RandomState(0).randn(N, 2))
    guide = dgp.guides.AutoFactorizedDGP(vector_model)
    svi = SVI(vector_model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, vectors))
    with pytest.raises(NotImplementedError, match=r"'y' has a MultivariateNormal likelihood over vectors"):
        dgp.predict(vector_model, guide, params, jax.random.PRNGKey(1), X, num_samples=2)
    samples = {"f.u": jnp.zeros((2, 2, M)), "f.kernel.variance": jnp.ones(2),
               "f.kernel.lengthscale": jnp.ones((2, 1)), "f.inducing_inputs": jnp.zeros((2, M, 1))}
    with pytest.raises(NotImplementedError, match=r"predict_from_samples: observation site 'y' has a MultivariateNormal"):
        dgp.predict_from_samples(vector_model, samples, jax.random.PRNGKey(1), X)


@pytest.mark.stochastic
def test_a_likelihood_over_vectors_trains_by_monte_carlo_draws(data):
    # predictions refuse it (above), the objectives take it: E_f[log N(y | f, S)] by draws of f,
    # unbiased for the tensor-product rule (exact: the log density is quadratic in f)
    X, _ = data
    vectors = jnp.asarray(np.random.RandomState(0).randn(N, 2))
    guide = dgp.guides.AutoFactorizedDGP(vector_model)
    svi = SVI(vector_model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, vectors)
    params = svi.get_params(state)
    exact = float(dgp.DGPElbo(num_quadrature=2).loss(jax.random.PRNGKey(0), params, vector_model, guide, X, vectors))
    draws = np.array([float(dgp.DGPElbo().loss(jax.random.PRNGKey(k), params, vector_model, guide, X, vectors))
                      for k in range(12)])
    se = draws.std(ddof=1) / np.sqrt(draws.size)
    assert se > 0 and abs(draws.mean() - exact) < z_threshold() * se, (draws.mean(), exact, se)
    _, loss = svi.update(state, X, vectors)
    assert np.isfinite(float(loss))


# ---------------------------------------------------------------- (g) end to end


@pytest.mark.stochastic
def test_fit_probit_classifier_end_to_end():
    rng = np.random.RandomState(5)
    X = jnp.asarray(np.sort(rng.uniform(-3, 3, 60))[:, None])
    y = (X[:, 0] > 0).astype(jnp.float64)
    model = probit_model(squash=1e-3)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.05), dgp.DGPElbo())
    # about 5 s: compiling fit dominates (0 errors after 100 steps)
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=200, progress_bar=False)
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), X, num_samples=2)
    assert result.num_skipped == 0
    assert result.losses[-20:].mean() < result.losses[:20].mean()
    out = dgp.metrics(pred, y)
    assert out["error_rate"] <= 0.1, out
    assert out["log_likelihood"] > np.log(0.5), out  # better than a coin
