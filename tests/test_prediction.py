"""predict, predict_from_samples, sample_layers and the metrics against dense references."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI, Predictive, Trace_ELBO
from scipy import integrate
from scipy.stats import norm

import numpyro_dgp as dgp
from numpyro_dgp import predict_from_samples
from numpyro_dgp.models import deep_gp_regression
from tests._compiles import compile_messages
from tests._mc import z_threshold

NOISE = 0.05


def one_layer(X, y=None):
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(variance=1.3, lengthscale=0.4), inducing_inputs=X[::3], jitter=1e-8)
    noise = numpyro.param("noise", NOISE, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = np.sort(rng.uniform(-1, 1, 30))[:, None]
    y = np.where(X[:, 0] > 0, 1.0, -1.0) + 0.05 * rng.randn(30)
    return jnp.asarray(X), jnp.asarray(y)


def make_svi(model, lr=0.01, elbo=None, **guide_kw):
    guide = dgp.guides.AutoFactorizedDGP(model, **guide_kw)
    return guide, SVI(model, guide, numpyro.optim.Adam(lr), elbo or dgp.DGPElbo())


def fitted_kernel(params):
    variance = float(params["f.kernel.variance"])
    lengthscale = np.asarray(params["f.kernel.lengthscale"])
    return lambda A, B: variance * np.exp(-0.5 * (((A[:, None, :] - B[None]) / lengthscale) ** 2).sum(-1))


def dense_one_layer_predictive(params, X, Xs):
    k = fitted_kernel(params)
    Z = np.asarray(params["f.inducing_inputs"])
    L = np.linalg.cholesky(k(Z, Z) + 1e-8 * float(params["f.kernel.variance"]) * np.eye(len(Z)))  # relative jitter
    A = np.linalg.solve(L, k(Z, Xs))
    m = np.asarray(params["f.u_auto_loc"])[0]
    S = np.asarray(params["f.u_auto_scale_tril"])[0]
    mean = A.T @ m
    var = float(params["f.kernel.variance"]) - (A**2).sum(0) + ((S.T @ A) ** 2).sum(0)
    return mean, var + float(params["noise"])


@pytest.fixture(scope="module")
def fitted(data):
    """A one-layer model fitted for a few steps (shared: compiling fit is the slow part)."""
    X, y = data
    guide, svi = make_svi(one_layer, lr=0.02)
    return guide, dgp.fit(svi, jax.random.PRNGKey(1), X, y, num_steps=200, progress_bar=False).params


def shifted(X, offset, y=None):
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(variance=1.3, lengthscale=0.4), inducing_inputs=X[::3], jitter=1e-8)
    noise = numpyro.param("noise", NOISE, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0] + offset, jnp.sqrt(noise)), obs=y)


jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)


JITTER = 1e-6  # float64 default of the layers, relative to the kernel variance


D, M1, M2, N_NEW = 2, 5, 4, 7


def rbf(A, B, variance, lengthscale):
    A, B = np.asarray(A) / lengthscale, np.asarray(B) / lengthscale
    sq = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
    return variance * np.exp(-0.5 * sq)


def svgp_given_u(X, Z, v, variance, lengthscale):
    """Whitened sparse GP given u = L v: mean K_xz L^-T v, var k_xx - diag(K_xz K_zz^-1 K_zx)."""
    L = np.linalg.cholesky(rbf(Z, Z, variance, lengthscale) + JITTER * variance * np.eye(len(Z)))
    A = np.linalg.solve(L, rbf(Z, X, variance, lengthscale))  # (M, N)
    mean = A.T @ np.asarray(v)
    var = variance - (A**2).sum(0)
    return mean, var


def one_layer_sample(rng):
    return {
        "h1.u": rng.randn(1, M1),
        "h1.kernel.variance": np.array(0.5 + rng.rand()),
        "h1.kernel.lengthscale": 0.5 + rng.rand(D),
        "h1.inducing_inputs": rng.randn(M1, D),
        "noise": np.array(0.01 + 0.1 * rng.rand()),
    }


def two_layer_sample(rng):
    s = one_layer_sample(rng)
    s["h1.u"] = rng.randn(D, M1)
    s.update({
        "h2.u": rng.randn(1, M2),
        "h2.kernel.variance": np.array(0.5 + rng.rand()),
        "h2.kernel.lengthscale": 0.5 + rng.rand(D),
        "h2.inducing_inputs": rng.randn(M2, D),
    })
    return s


def stack(samples):
    return {k: jnp.asarray(np.stack([s[k] for s in samples])) for k in samples[0]}


@pytest.fixture(scope="module")
def X_new():
    return jnp.asarray(np.random.RandomState(1).randn(N_NEW, D))


def test_predict_one_layer_matches_dense_svgp_predictive(data, fitted):
    X, y = data
    guide, params = fitted
    Xs = jnp.linspace(-1.5, 1.5, 17)[:, None]
    pred = dgp.predict(one_layer, guide, params, jax.random.PRNGKey(2), Xs, num_samples=4)
    mean, var = dense_one_layer_predictive(params, np.asarray(X), np.asarray(Xs))
    # K_ZZ's Cholesky with 1e-8 jitter amplifies round-off by about cond(K_ZZ) * eps, so the
    # two computations of an O(1) mean agree to ~1e-9 (how XLA fuses the ops moves it)
    np.testing.assert_allclose(pred.mean, mean, rtol=1e-8, atol=5e-9)
    np.testing.assert_allclose(pred.variance, var, rtol=1e-7)
    np.testing.assert_allclose(pred.component_variances, np.broadcast_to(var, (4, 17)), rtol=1e-7)
    ys = np.sin(np.asarray(Xs[:, 0]))
    # the mean's absolute round-off (5e-9 above) moves a log density by |y - mean| / var times it:
    # a relative tolerance alone fails where a log density is near 0
    logpdf_atol = 5e-9 * np.max(np.abs(ys - mean) / var)
    np.testing.assert_allclose(
        dgp.log_likelihood(pred, ys), norm.logpdf(ys, mean, np.sqrt(var)), rtol=1e-8, atol=logpdf_atol
    )
    m = dgp.metrics(pred, ys, y_scale=2.0)
    np.testing.assert_allclose(m["log_likelihood"], norm.logpdf(ys, mean, np.sqrt(var)).mean() - np.log(2.0), rtol=1e-8)
    np.testing.assert_allclose(m["rmse"], 2.0 * np.sqrt(np.mean((ys - mean) ** 2)), rtol=1e-8)


def test_predict_reuses_its_compiled_function_and_traces_array_arguments(data):
    X, y = data
    Xs = jnp.linspace(-1.5, 1.5, 17)[:, None]
    guide, svi = make_svi(shifted)
    state = svi.init(jax.random.PRNGKey(0), X, jnp.zeros(()), y)
    params = svi.get_params(state)
    key = jax.random.PRNGKey(3)
    with compile_messages() as messages:
        base = dgp.predict(shifted, guide, params, key, Xs, jnp.zeros(()), num_samples=4)
        moved = dgp.predict(shifted, guide, params, key, Xs, jnp.zeros(()) + 0.75, num_samples=4)
        dgp.predict(shifted, guide, params, key, Xs[:5], jnp.zeros(()), num_samples=4)  # new shape
    compiles = [m for m in messages if m.startswith("Finished XLA compilation") and "jit(predictive_mixture)" in m]
    # the offset is an argument of the compiled function, not a constant baked into it
    np.testing.assert_allclose(moved.mean, base.mean + 0.75, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(moved.variance, base.variance, rtol=1e-12)
    assert len(compiles) == 2, compiles  # one per input shape, none for the new offset


def test_predict_mixture_moments_follow_the_law_of_total_variance(data):
    X, y = data
    model = deep_gp_regression(2, num_inducing=6)
    guide, svi = make_svi(model, lr=0.02, inner_init="prior")
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
    params["h2.u_auto_loc"] = jnp.asarray(np.random.RandomState(1).randn(1, 6))
    Xs = jnp.linspace(-1, 1, 9)[:, None]
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(3), Xs, num_samples=400)
    assert set(pred.layers) == {"h1", "h2"} and pred.layers["h1"].shape == (400, 9, 1)
    # components differ across samples (the inner layer is random) ...
    assert float(pred.component_means.std(0).max()) > 1e-3
    # ... and the mixture moments are those of the equally weighted mixture of the components (the
    # law of total variance, exactly: no draws from the mixture needed)
    cm, cv = np.asarray(pred.component_means), np.asarray(pred.component_variances)
    np.testing.assert_allclose(pred.mean, cm.mean(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pred.variance, cv.mean(0) + cm.var(0), rtol=1e-10, atol=1e-12)
    # the last layer's recorded moments plus the noise are the components
    np.testing.assert_allclose(pred.layer_variances["h2"][..., 0] + params["noise"], cv, rtol=1e-6)


def test_gaussian_mixture_crps_matches_numerical_integration():
    means = jnp.array([[0.3], [-0.4], [1.1]])
    variances = jnp.array([[0.2], [0.5], [0.05]])
    y = 0.25
    crps = float(dgp.gaussian_mixture_crps(jnp.array([y]), means, variances)[0])
    cdf = lambda x: np.mean([norm.cdf(x, m, np.sqrt(v)) for m, v in zip(np.ravel(means), np.ravel(variances))])  # noqa: E731
    left, _ = integrate.quad(lambda x: cdf(x) ** 2, -20, y, limit=200)
    right, _ = integrate.quad(lambda x: (1 - cdf(x)) ** 2, y, 20, limit=200)
    np.testing.assert_allclose(crps, left + right, rtol=1e-7)


@pytest.mark.stochastic
def test_coherent_samples_have_the_full_marginal_covariance(data, fitted):
    X, y = data
    guide, params = fitted
    Xs = jnp.linspace(-0.8, 0.8, 5)[:, None]
    draws = dgp.sample_layers(one_layer, guide, params, jax.random.PRNGKey(4), Xs, num_samples=20_000)["f"][..., 0]
    k = fitted_kernel(params)
    Z = np.asarray(params["f.inducing_inputs"])
    L = np.linalg.cholesky(k(Z, Z) + 1e-8 * float(params["f.kernel.variance"]) * np.eye(len(Z)))
    A = np.linalg.solve(L, k(Z, np.asarray(Xs)))
    S = np.asarray(params["f.u_auto_scale_tril"])[0]
    cov = k(np.asarray(Xs), np.asarray(Xs)) - A.T @ A + (S.T @ A).T @ (S.T @ A)
    emp = np.cov(np.asarray(draws).T)
    # Gaussian draws: the sample covariance's standard error is sqrt((C_ii C_jj + C_ij^2) / S); 25
    # covariance entries and 5 variances below are compared
    num, z = draws.shape[0], z_threshold(30)
    d = np.diag(cov)
    np.testing.assert_array_less(np.abs(emp - cov), z * np.sqrt((np.outer(d, d) + cov**2) / num))
    # point-by-point draws (given u) have the same marginal variances
    indep = dgp.sample_layers(one_layer, guide, params, jax.random.PRNGKey(5), Xs, num_samples=20_000, coherent=False)["f"][..., 0]
    np.testing.assert_array_less(np.abs(np.asarray(indep).var(0) - d), z * d * np.sqrt(2 / num))


def test_predictive_returns_every_layer(data):
    X, y = data
    model = deep_gp_regression(3, num_inducing=5, hidden_width=2)
    guide, svi = make_svi(model, elbo=Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
    out = Predictive(model, guide=guide, params=params, num_samples=6)(jax.random.PRNGKey(1), X)
    assert out["h1"].shape == (6, 30, 2) and out["h2"].shape == (6, 30, 2) and out["h3"].shape == (6, 30, 1)
    assert out["y"].shape == (6, 30)


def test_save_load_round_trip_gives_identical_predictions(data, fitted, tmp_path):
    X, y = data
    guide, params = fitted
    path = tmp_path / "fitted.npz"
    dgp.save_params(path, params, metadata={"model": "one_layer"})
    loaded, meta = dgp.load_params(path, return_metadata=True)
    assert meta["model"] == "one_layer" and set(loaded) == set(params)
    for k in params:
        assert loaded[k].dtype == params[k].dtype
        np.testing.assert_array_equal(loaded[k], params[k])
    fresh_guide = dgp.guides.AutoFactorizedDGP(one_layer)
    with pytest.raises(ValueError, match="guide has not been set up"):
        dgp.predict(one_layer, fresh_guide, loaded, jax.random.PRNGKey(0), X, num_samples=3)
    fresh_guide.setup(jax.random.PRNGKey(9), X, y)
    a = dgp.predict(one_layer, guide, params, jax.random.PRNGKey(0), X, num_samples=3)
    b = dgp.predict(one_layer, fresh_guide, loaded, jax.random.PRNGKey(0), X, num_samples=3)
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.variance, b.variance)


def test_predict_rejects_unsupported_likelihoods_and_bad_inputs(data, fitted):
    X, y = data

    def simplex_model(X, y=None):  # a distribution over vectors: no predictive mixture of numbers
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=4, out_dim=3)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Dirichlet(jnp.exp(f)), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(simplex_model)
    shares = jnp.full((X.shape[0], 3), 1 / 3)
    svi = SVI(simplex_model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, shares))
    with pytest.raises(NotImplementedError, match="Dirichlet likelihood over vectors"):
        dgp.predict(simplex_model, guide, params, jax.random.PRNGKey(0), X, num_samples=2)
    g, p = fitted
    with pytest.raises(ValueError, match="X_new must have shape"):
        dgp.predict(one_layer, g, p, jax.random.PRNGKey(0), X[:, 0])
    with pytest.raises(ValueError, match="NaN"):
        dgp.predict(one_layer, g, p, jax.random.PRNGKey(0), X.at[0, 0].set(jnp.inf))


def test_predict_reports_non_finite_predictions(data, fitted):
    """A failed factorization (here: an inducing input so large that the kernel overflows) must
    not pass silently into the metrics: predict warns with the number of bad points. (NaN
    parameters never get that far: predict refuses them, naming the entry.)"""
    guide, params = fitted
    Xs = jnp.linspace(-1.5, 1.5, 17)[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error", dgp.NonFinitePredictionWarning)
        dgp.predict(one_layer, guide, params, jax.random.PRNGKey(2), Xs, num_samples=2)  # healthy: silent
    name = next(k for k in params if k.endswith("inducing_inputs"))
    with pytest.raises(dgp.ParameterMismatchError, match=rf"not finite.*{name}"):
        dgp.predict(one_layer, guide, {**params, name: params[name].at[0, 0].set(jnp.nan)}, jax.random.PRNGKey(2), Xs)
    broken = {**params, name: params[name].at[0, 0].set(1e200)}
    with pytest.warns(dgp.NonFinitePredictionWarning, match="17 of 17 test points"):
        pred = dgp.predict(one_layer, guide, broken, jax.random.PRNGKey(2), Xs, num_samples=2)
    assert np.isnan(dgp.metrics(pred, np.zeros(17))["log_likelihood"])


def test_single_sample_equals_dense_svgp(X_new):
    s = one_layer_sample(np.random.RandomState(0))
    samples = stack([s] * 3)  # all components the same
    pred = predict_from_samples(deep_gp_regression(1, num_inducing=M1), samples, jax.random.PRNGKey(0), X_new)
    m, v = svgp_given_u(X_new, s["h1.inducing_inputs"], s["h1.u"][0], s["h1.kernel.variance"],
                        s["h1.kernel.lengthscale"])
    np.testing.assert_allclose(pred.mean, m, atol=1e-8)
    np.testing.assert_allclose(pred.variance, v + s["noise"], atol=1e-8)
    np.testing.assert_allclose(pred.component_variances, np.broadcast_to(v + s["noise"], (3, N_NEW)), atol=1e-8)
    np.testing.assert_allclose(pred.layer_means["h1"][..., 0], np.broadcast_to(m, (3, N_NEW)), atol=1e-8)
    np.testing.assert_allclose(pred.layer_variances["h1"][..., 0], np.broadcast_to(v, (3, N_NEW)), atol=1e-8)


def test_mixture_is_law_of_total_variance(X_new):
    rng = np.random.RandomState(2)
    per = [one_layer_sample(rng) for _ in range(4)]
    pred = predict_from_samples(deep_gp_regression(1, num_inducing=M1), stack(per), jax.random.PRNGKey(0), X_new)
    ms, vs = [], []
    for s in per:
        m, v = svgp_given_u(X_new, s["h1.inducing_inputs"], s["h1.u"][0], s["h1.kernel.variance"],
                            s["h1.kernel.lengthscale"])
        ms.append(m)
        vs.append(v + s["noise"])
    ms, vs = np.array(ms), np.array(vs)
    np.testing.assert_allclose(pred.component_means, ms, atol=1e-8)
    np.testing.assert_allclose(pred.component_variances, vs, atol=1e-8)
    mean = ms.mean(0)
    np.testing.assert_allclose(pred.mean, mean, atol=1e-8)
    np.testing.assert_allclose(pred.variance, vs.mean(0) + (ms**2).mean(0) - mean**2, atol=1e-8)
    assert np.all(pred.variance > vs.min(0))  # the spread of the means adds variance


def test_two_layers_last_layer_analytic_given_sampled_inner(X_new):
    rng = np.random.RandomState(3)
    per = [two_layer_sample(rng) for _ in range(3)]
    samples = stack(per)
    # deterministic layer outputs recorded at training points (as MCMC returns them) are ignored
    samples["h1"] = jnp.zeros((3, 11, D))
    samples["h2"] = jnp.zeros((3, 11, 1))
    model = deep_gp_regression(2, num_inducing=M1)
    pred = predict_from_samples(model, samples, jax.random.PRNGKey(5), X_new)
    assert pred.layers["h1"].shape == (3, N_NEW, D) and pred.layers["h2"].shape == (3, N_NEW, 1)
    for k, s in enumerate(per):
        # inner layer: its draw lies in p(f_1 | u_1) (mean identity + conditional), check its moments
        m1 = np.stack([svgp_given_u(X_new, s["h1.inducing_inputs"], s["h1.u"][p], s["h1.kernel.variance"],
                                    s["h1.kernel.lengthscale"])[0] for p in range(D)], -1)
        np.testing.assert_allclose(pred.layer_means["h1"][k], np.asarray(X_new) + m1, atol=1e-8)
        h1 = np.asarray(pred.layers["h1"][k])
        m, v = svgp_given_u(h1, s["h2.inducing_inputs"], s["h2.u"][0], s["h2.kernel.variance"],
                            s["h2.kernel.lengthscale"])
        np.testing.assert_allclose(pred.component_means[k], m, atol=1e-8)
        np.testing.assert_allclose(pred.component_variances[k], v + s["noise"], atol=1e-8)
    cm, cv = np.asarray(pred.component_means), np.asarray(pred.component_variances)
    np.testing.assert_allclose(pred.variance, (cv + cm**2).mean(0) - cm.mean(0) ** 2, atol=1e-8)
    # different keys give different inner draws (sampling, not the inner mean)
    pred2 = predict_from_samples(model, samples, jax.random.PRNGKey(6), X_new)
    assert not np.allclose(pred.layers["h1"], pred2.layers["h1"])


def test_errors(X_new):
    model = deep_gp_regression(2, num_inducing=M1)
    s = stack([two_layer_sample(np.random.RandomState(4))] * 2)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="samples is empty"):
        predict_from_samples(model, {}, key, X_new)
    with pytest.raises(ValueError, match="0 samples"):
        predict_from_samples(model, {k: v[:0] for k, v in s.items()}, key, X_new)
    with pytest.raises(ValueError, match=r"lack the inducing-value site\(s\) \['h2.u'\]"):
        predict_from_samples(model, {k: v for k, v in s.items() if k != "h2.u"}, key, X_new)
    with pytest.raises(ValueError, match="noise"):
        predict_from_samples(model, {k: v for k, v in s.items() if k != "noise"}, key, X_new)
    # ... unless given as a fixed param
    pred = predict_from_samples(model, {k: v for k, v in s.items() if k != "noise"}, key, X_new,
                                params={"noise": jnp.asarray(0.1)})
    assert pred.mean.shape == (N_NEW,)
    with pytest.raises(ValueError, match="same leading"):
        predict_from_samples(model, {**s, "noise": s["noise"][:1]}, key, X_new)
    with pytest.raises(ValueError, match="X_new must have shape"):
        predict_from_samples(model, s, key, X_new[0])
