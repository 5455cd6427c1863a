"""fit, predict, sample_layers, persistence and the ready-made model."""

import contextlib
import logging
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
from numpyro_dgp.models import deep_gp_regression

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
    guide = dgp.guides.AutoFactorisedDGP(model, **guide_kw)
    return guide, SVI(model, guide, numpyro.optim.Adam(lr), elbo or dgp.DGPElbo())


class _Counter:
    def __init__(self):
        self.n = 0


def test_fit_matches_a_plain_update_loop(data):
    X, y = data
    guide, svi = make_svi(one_layer)
    state = svi.init(jax.random.PRNGKey(0), X, y)
    # 3 chunks of 25, the last one only partly used (masked steps must not change anything)
    result = dgp.fit(svi, None, X, y, num_steps=60, chunk_size=25, init_state=state, progress_bar=False)
    update = jax.jit(svi.update)
    manual = []
    s = state
    for _ in range(60):
        s, loss = update(s, X, y)
        manual.append(float(loss))
    np.testing.assert_allclose(result.losses, manual, rtol=1e-8)
    for k, v in svi.get_params(s).items():
        np.testing.assert_allclose(result.params[k], v, rtol=1e-6, atol=1e-9)
    assert result.num_skipped == 0 and result.losses.shape == (60,)


def test_fit_averages_the_iterates_of_its_last_steps(data):
    X, y = data
    guide, svi = make_svi(one_layer, lr=0.05)
    state = svi.init(jax.random.PRNGKey(0), X, y)
    # the window (steps 38..60) starts inside the second chunk and ends in a partly used third
    result = dgp.fit(svi, None, X, y, num_steps=60, chunk_size=25, init_state=state, progress_bar=False,
                     average_from=37)
    update = jax.jit(svi.update)
    s, iterates = state, []
    for _ in range(60):
        s, _ = update(s, X, y)
        iterates.append(svi.optim.get_params(s.optim_state))
    # reference: plain mean of the unconstrained iterates after steps 38..60, then constrained
    window = iterates[37:]
    mean = {k: np.mean([it[k] for it in window], axis=0) for k in window[0]}
    expected = svi.constrain_fn(mean)
    for k, v in expected.items():
        np.testing.assert_allclose(result.averaged_params[k], v, rtol=1e-6, atol=1e-9)
    # the average differs from the last iterate (the optimiser is still moving)
    assert not np.allclose(result.averaged_params["f.u_auto_loc"], result.params["f.u_auto_loc"], atol=1e-4)
    # the last step alone is the final parameters; no averaging, no field
    last = dgp.fit(svi, None, X, y, num_steps=60, chunk_size=25, init_state=state, progress_bar=False,
                   average_from=59)
    for k, v in last.params.items():
        np.testing.assert_allclose(last.averaged_params[k], v, rtol=1e-6, atol=1e-9)
    plain = dgp.fit(svi, None, X, y, num_steps=60, chunk_size=25, init_state=state, progress_bar=False)
    assert plain.averaged_params is None
    for k, v in plain.params.items():  # averaging does not change the trajectory
        np.testing.assert_allclose(result.params[k], v, rtol=1e-8)
    for bad in (-1, 60, 2.5):
        with pytest.raises(ValueError, match="average_from"):
            dgp.fit(svi, None, X, y, num_steps=60, init_state=state, progress_bar=False, average_from=bad)


def test_fit_compiles_once(data):
    X, y = data
    counter = _Counter()

    def counted(X, y=None):
        counter.n += 1  # runs at trace time only under jit
        one_layer(X, y)

    guide, svi = make_svi(counted)
    state = svi.init(jax.random.PRNGKey(0), X, y)
    before = counter.n
    dgp.fit(svi, None, X, y, num_steps=50, chunk_size=10, init_state=state, progress_bar=False)
    traces_short = counter.n - before
    assert traces_short >= 1
    before = counter.n
    dgp.fit(svi, None, X, y, num_steps=200, chunk_size=10, init_state=state, progress_bar=False)
    assert counter.n - before == 0  # the same SVI: the compiled chunk is reused
    _, fresh = make_svi(counted)
    fresh_state = fresh.init(jax.random.PRNGKey(0), X, y)
    before = counter.n
    dgp.fit(fresh, None, X, y, num_steps=200, chunk_size=10, init_state=fresh_state, progress_bar=False)
    assert counter.n - before == traces_short  # 5 chunks or 20: the same number of traces


@contextlib.contextmanager
def compile_messages():
    """Collect JAX's compile-log messages (``jax.log_compiles``) issued inside the block."""
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect()
    logging.getLogger("jax").addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield messages
    finally:
        logging.getLogger("jax").removeHandler(handler)


def test_fit_times_compilation_apart_from_the_chunks_and_compiles_the_chunk_once(data):
    X, y = data
    guide, svi = make_svi(one_layer)
    state = svi.init(jax.random.PRNGKey(0), X, y)
    with compile_messages() as messages:
        first = dgp.fit(svi, None, X, y, num_steps=30, chunk_size=10, init_state=state, progress_bar=False)
        more = dgp.fit(svi, None, X, y, num_steps=30, chunk_size=10, init_state=first.state, progress_bar=False)
    # compiled ahead of the first chunk, and the jitted chunk calls reuse that executable
    compiles = [m for m in messages if m.startswith("Finished XLA compilation") and "run_chunk" in m]
    assert len(compiles) == 1, compiles
    assert first.compile_seconds > 0 and more.compile_seconds >= 0
    assert first.chunk_seconds.shape == (3,) and first.chunk_size == 10
    assert first.seconds_per_step == pytest.approx(np.median(first.chunk_seconds) / 10)


class NaNSometimes(dgp.DGPElbo):
    """An objective that is non-finite for about a third of the random keys."""

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        out = super().loss_with_mutable_state(rng_key, param_map, model, guide, *args, **kwargs)
        bad = jax.random.uniform(jax.random.fold_in(rng_key, 7)) < 0.33
        return {**out, "loss": jnp.where(bad, jnp.nan, out["loss"])}


def test_fit_skips_and_counts_non_finite_updates(data):
    X, y = data
    guide, svi = make_svi(one_layer, elbo=NaNSometimes())
    with pytest.warns(RuntimeWarning, match="skipped"):
        result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=300, progress_bar=False)
    assert result.num_skipped == int(np.sum(~np.isfinite(result.losses)))
    assert 50 < result.num_skipped < 150
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in result.params.values())
    finite = result.losses[np.isfinite(result.losses)]
    assert finite[-20:].mean() < finite[:20].mean()  # still learning


def test_fit_raises_when_every_update_fails(data):
    X, y = data

    class AlwaysNaN(dgp.DGPElbo):
        def loss_with_mutable_state(self, *a, **k):
            out = super().loss_with_mutable_state(*a, **k)
            return {**out, "loss": out["loss"] * jnp.nan}

    guide, svi = make_svi(one_layer, elbo=AlwaysNaN())
    with pytest.raises(FloatingPointError, match="every update"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=20, progress_bar=False)


def test_fit_rejects_bad_arguments(data):
    X, y = data
    guide, svi = make_svi(one_layer)
    with pytest.raises(ValueError, match=r"args\[1\] contains NaN"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y.at[3].set(jnp.nan), num_steps=5, progress_bar=False)
    with pytest.raises(ValueError, match="num_steps"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=0)


def test_minibatch_fit_with_static_batch_size(data):
    X, y = data
    model = deep_gp_regression(2, num_inducing=5)
    guide, svi = make_svi(model, lr=0.02)
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=150, batch_size=10, progress_bar=False)
    assert result.losses[-30:].mean() < result.losses[:30].mean()


def fitted_kernel(params):
    variance = float(params["f.kernel.variance"])
    lengthscale = np.asarray(params["f.kernel.lengthscale"])
    return lambda A, B: variance * np.exp(-0.5 * (((A[:, None, :] - B[None]) / lengthscale) ** 2).sum(-1))


def dense_one_layer_predictive(params, X, Xs):
    k = fitted_kernel(params)
    Z = np.asarray(params["f.inducing_inputs"])
    L = np.linalg.cholesky(k(Z, Z) + 1e-8 * np.eye(len(Z)))
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
    np.testing.assert_allclose(dgp.log_likelihood(pred, ys), norm.logpdf(ys, mean, np.sqrt(var)), rtol=1e-8)
    m = dgp.metrics(pred, ys, y_scale=2.0)
    np.testing.assert_allclose(m["log_likelihood"], norm.logpdf(ys, mean, np.sqrt(var)).mean() - np.log(2.0), rtol=1e-8)
    np.testing.assert_allclose(m["rmse"], 2.0 * np.sqrt(np.mean((ys - mean) ** 2)), rtol=1e-8)


def shifted(X, offset, y=None):
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(variance=1.3, lengthscale=0.4), inducing_inputs=X[::3], jitter=1e-8)
    noise = numpyro.param("noise", NOISE, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0] + offset, jnp.sqrt(noise)), obs=y)


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
    compiles = [m for m in messages if m.startswith("Finished XLA compilation") and "jit(one)" in m]
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
    # ... and the mixture moments agree with draws from the mixture
    rng = np.random.RandomState(0)
    cm, cv = np.asarray(pred.component_means), np.asarray(pred.component_variances)
    idx = rng.randint(0, 400, 200_000)
    draws = cm[idx, 0] + np.sqrt(cv[idx, 0]) * rng.randn(200_000)
    assert abs(draws.mean() - float(pred.mean[0])) < 4 * draws.std() / np.sqrt(len(draws))
    np.testing.assert_allclose(draws.var(), float(pred.variance[0]), rtol=0.02)
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


def test_coherent_samples_have_the_full_marginal_covariance(data, fitted):
    X, y = data
    guide, params = fitted
    Xs = jnp.linspace(-0.8, 0.8, 5)[:, None]
    draws = dgp.sample_layers(one_layer, guide, params, jax.random.PRNGKey(4), Xs, num_samples=20_000)["f"][..., 0]
    k = fitted_kernel(params)
    Z = np.asarray(params["f.inducing_inputs"])
    L = np.linalg.cholesky(k(Z, Z) + 1e-8 * np.eye(len(Z)))
    A = np.linalg.solve(L, k(Z, np.asarray(Xs)))
    S = np.asarray(params["f.u_auto_scale_tril"])[0]
    cov = k(np.asarray(Xs), np.asarray(Xs)) - A.T @ A + (S.T @ A).T @ (S.T @ A)
    emp = np.cov(np.asarray(draws).T)
    np.testing.assert_allclose(emp, cov, atol=0.05 * np.max(np.diag(cov)))
    # point-by-point draws (given u) have the same marginal variances
    indep = dgp.sample_layers(one_layer, guide, params, jax.random.PRNGKey(5), Xs, num_samples=20_000, coherent=False)["f"][..., 0]
    np.testing.assert_allclose(np.asarray(indep).var(0), np.diag(cov), rtol=0.05)


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
    fresh_guide = dgp.guides.AutoFactorisedDGP(one_layer)
    with pytest.raises(ValueError, match="guide has not been set up"):
        dgp.predict(one_layer, fresh_guide, loaded, jax.random.PRNGKey(0), X, num_samples=3)
    fresh_guide.setup(jax.random.PRNGKey(9), X, y)
    a = dgp.predict(one_layer, guide, params, jax.random.PRNGKey(0), X, num_samples=3)
    b = dgp.predict(one_layer, fresh_guide, loaded, jax.random.PRNGKey(0), X, num_samples=3)
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.variance, b.variance)


def test_predict_rejects_unsupported_likelihoods_and_bad_inputs(data, fitted):
    X, y = data

    def counts_model(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Poisson(jnp.exp(f[..., 0])), obs=y)

    guide = dgp.guides.AutoFactorisedDGP(counts_model)
    counts = (y > 0).astype(jnp.float64)
    svi = SVI(counts_model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, counts))
    with pytest.raises(NotImplementedError, match="Poisson"):
        dgp.predict(counts_model, guide, params, jax.random.PRNGKey(0), X, num_samples=2)
    g, p = fitted
    with pytest.raises(ValueError, match="X_new must have shape"):
        dgp.predict(one_layer, g, p, jax.random.PRNGKey(0), X[:, 0])
    with pytest.raises(ValueError, match="NaN"):
        dgp.predict(one_layer, g, p, jax.random.PRNGKey(0), X.at[0, 0].set(jnp.inf))


def test_dgp_elbo_with_a_bernoulli_likelihood_uses_quadrature(data):
    """Gauss-Hermite expectation of a non-Gaussian likelihood against Monte Carlo."""
    X, y = data
    labels = (y > 0).astype(jnp.float64)

    def classifier(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), inducing_inputs=X[::5])
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=3 * f[..., 0]), obs=y)

    guide = dgp.guides.AutoFactorisedDGP(classifier)
    svi = SVI(classifier, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, labels))
    params = {**params, "f.u_auto_loc": params["f.u_auto_loc"] + 0.7}
    ours = float(dgp.DGPElbo().elbo_components(jax.random.PRNGKey(0), params, classifier, guide, X, labels)["expected_log_likelihood"])
    keys = jax.random.split(jax.random.PRNGKey(1), 4000)
    tr = jax.vmap(lambda k: -Trace_ELBO().loss(k, params, classifier, guide, X, labels))(keys)
    kl = float(dgp.core.gauss_kl(params["f.u_auto_loc"], params["f.u_auto_scale_tril"]))
    mc = np.asarray(tr) + kl  # Trace_ELBO = E log p(y|f) - KL (KL estimated by sampling: add the exact one back in expectation)
    assert abs(mc.mean() - ours) < 4 * mc.std() / np.sqrt(len(mc))


def test_deep_gp_regression_validates(data):
    X, y = data
    with pytest.raises(ValueError, match="num_layers"):
        deep_gp_regression(0)
    model = deep_gp_regression(2, num_inducing=4)
    guide = dgp.guides.AutoFactorisedDGP(model)
    with pytest.raises(ValueError, match="y must have shape"):
        SVI(model, guide, numpyro.optim.Adam(0.1), dgp.DGPElbo()).init(jax.random.PRNGKey(0), X, y[:-1])


def test_demo_runs_and_the_dgp_beats_the_svgp(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from numpyro_dgp.experiments import run_demo

        runs = run_demo(jax.random.PRNGKey(0), num_steps=400, num_inducing=15, num_test_samples=20, output=tmp_path / "demo.png")
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert runs["dgp"].metrics["log_likelihood"] > runs["svgp"].metrics["log_likelihood"]


def test_predict_reports_non_finite_predictions(data, fitted):
    """A failed factorisation (here: an inducing input made NaN) must not pass silently into
    the metrics: predict warns with the number of bad points."""
    guide, params = fitted
    Xs = jnp.linspace(-1.5, 1.5, 17)[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error", dgp.NonFinitePredictionWarning)
        dgp.predict(one_layer, guide, params, jax.random.PRNGKey(2), Xs, num_samples=2)  # healthy: silent
    name = next(k for k in params if k.endswith("inducing_inputs"))
    broken = {**params, name: params[name].at[0, 0].set(jnp.nan)}
    with pytest.warns(dgp.NonFinitePredictionWarning, match="17 of 17 test points"):
        pred = dgp.predict(one_layer, guide, broken, jax.random.PRNGKey(2), Xs, num_samples=2)
    assert np.isnan(dgp.metrics(pred, np.zeros(17))["log_likelihood"])
