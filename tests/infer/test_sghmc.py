"""SGHMC kernel: exactness on conjugate models, MCMC/arviz plumbing, MW-MCEM, errors."""

import arviz
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, Predictive
from numpyro.infer.util import initialize_model
from scipy.optimize import minimize_scalar

import numpyro_dgp as dgp
from numpyro_dgp import predict_from_samples
from numpyro_dgp.handlers import collapse_last_layer
from numpyro_dgp.infer import SGHMC
from numpyro_dgp.models import deep_gp_regression
from tests._mc import z_threshold

jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)


N, D, SIGMA, TAU = 200, 3, 0.5, 1.0


# Allowed deviation in Monte Carlo standard errors (from the effective sample size): the
# Bonferroni z for a false-alarm rate below 1e-4 over a test's comparisons (at least 4), while a
# factor-2 error in the noise variance sits at > 6 standard errors.


@pytest.fixture(scope="module")
def linreg():
    rng = np.random.RandomState(0)
    X = rng.randn(N, D)
    y = X @ np.array([0.5, -1.0, 2.0]) + SIGMA * rng.randn(N)
    # Closed-form posterior of w ~ N(0, TAU^2 I), y ~ N(X w, SIGMA^2 I).
    cov = np.linalg.inv(X.T @ X / SIGMA**2 + np.eye(D) / TAU**2)
    mean = cov @ X.T @ y / SIGMA**2
    return jnp.asarray(X), jnp.asarray(y), mean, cov


def linreg_model(X, y=None, batch_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, TAU).expand([D]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, SIGMA), obs=None if y is None else y[idx])


def sigma_model(X, y, batch_size=None):
    """linreg_model with the noise scale a positive ``numpyro.param``, and a deterministic site."""
    w = numpyro.sample("w", dist.Normal(0.0, TAU).expand([D]).to_event(1))
    sigma = numpyro.param("sigma", 2.0, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size) as idx:
        # Deterministic sites make postprocessing replay the (possibly subsampled) model.
        mu = numpyro.deterministic("mu", X[idx] @ w)
        numpyro.sample("y", dist.Normal(mu, sigma), obs=None if y is None else y[idx])


def assert_matches(samples, mean, var):
    """Mean and variance of ``samples`` (chains, draws, ...) within z Monte Carlo errors.

    The variance's error uses the ESS of the squared deviations, i.e. of the statistic itself.
    """
    samples = np.asarray(samples)
    z = z_threshold(2 * samples[0, 0].size)  # a mean and a variance per component
    se_mean = np.sqrt(var / effective_sample_size(samples))
    np.testing.assert_array_less(np.abs(samples.mean((0, 1)) - mean), z * se_mean)
    sq = (samples - mean) ** 2 / var
    se_var = sq.std((0, 1)) / np.sqrt(effective_sample_size(sq))
    np.testing.assert_array_less(np.abs(sq.mean((0, 1)) - 1.0), z * se_var)
    # The test must be able to see a factor-2 error in the variance.
    assert np.all(se_var < 0.5 / 6)


jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)




def _sine_data():
    rng = np.random.RandomState(8)
    X = jnp.asarray(rng.uniform(-1, 1, (60, 1)))
    y = jnp.sin(3 * X[:, 0]) + 0.05 * jnp.asarray(rng.randn(60))
    return X, y


@pytest.mark.parametrize(
    "batch_size, step_size, mdecay, num_samples, thinning",
    [
        # Minibatch noise adds an O(step) variance bias (no noise correction, as in sghmc_dgp);
        # with B = N/2 and these settings it is a few percent, below the Monte Carlo error.
        (100, 0.03, 0.2, 20000, 10),
        (None, 0.05, 0.1, 10000, 5),
    ],
)
@pytest.mark.stochastic
def test_conjugate_posterior(linreg, batch_size, step_size, mdecay, num_samples, thinning):
    X, y, mean, cov = linreg
    kernel = SGHMC(linreg_model, step_size=step_size, mdecay=mdecay)
    mcmc = MCMC(kernel, num_warmup=2000, num_samples=num_samples, thinning=thinning, progress_bar=False)
    mcmc.run(jax.random.key(1), X, y, batch_size)
    assert kernel.num_data == N
    samples = mcmc.get_samples(group_by_chain=True)
    w = samples["w"]
    assert w.shape == (1, num_samples // thinning, D)
    assert_matches(w, mean, np.diag(cov))
    assert int(mcmc.last_state.num_skipped) == 0


def test_multiple_chains_and_arviz(linreg, capsys):
    X, y, _, _ = linreg
    runs = {}
    for chain_method in ["vectorized", "sequential"]:
        mcmc = MCMC(
            SGHMC(sigma_model, step_size=0.03),
            num_warmup=50,
            num_samples=40,
            thinning=2,
            num_chains=2,
            chain_method=chain_method,
            progress_bar=False,
        )
        mcmc.run(jax.random.key(0), X, y)
        runs[chain_method] = mcmc
        s = mcmc.get_samples(group_by_chain=True)
        assert s["w"].shape == (2, 20, D) and s["sigma"].shape == (2, 20) and s["mu"].shape == (2, 20, N)
        assert jnp.all(jnp.isfinite(s["w"]))
        assert not np.allclose(s["w"][0], s["w"][1])  # independent chains
        assert not np.allclose(s["sigma"][0], s["sigma"][1])  # each chain optimizes its own params
        assert mcmc.get_samples()["w"].shape == (40, D)
        assert mcmc.get_extra_fields(group_by_chain=True)["potential_energy"].shape == (2, 20)
    # Same per-chain keys, so both chain methods compute the same chains.
    for k in ["w", "sigma"]:
        np.testing.assert_allclose(runs["vectorized"].get_samples()[k], runs["sequential"].get_samples()[k], rtol=1e-6)
    mcmc = runs["vectorized"]
    mcmc.print_summary()
    out = capsys.readouterr().out
    assert "w[0]" in out and "sigma" in out and "mu" not in out  # deterministic sites excluded
    tree = arviz.from_numpyro(mcmc)
    post = tree["posterior"]
    assert "w" in post.data_vars and post["w"].shape[:2] == (2, 20) and "sigma" in post.data_vars
    assert "lp" in tree["sample_stats"].data_vars


def test_float32():
    # dtypes follow the latents: a float32 run stays float32.
    with jax.enable_x64(False):
        rng = np.random.RandomState(0)
        X = jnp.asarray(rng.randn(50, D), jnp.float32)
        y = jnp.asarray(rng.randn(50), jnp.float32)
        mcmc = MCMC(SGHMC(sigma_model), num_warmup=20, num_samples=20, progress_bar=False)
        mcmc.run(jax.random.key(0), X, y)
        s = mcmc.get_samples()
        assert s["w"].dtype == jnp.float32 and s["sigma"].dtype == jnp.float32
        assert mcmc.last_state.momentum.dtype == jnp.float32
        assert jnp.all(jnp.isfinite(s["w"]))


@pytest.mark.stochastic
def test_mw_mcem_finds_marginal_likelihood_maximum(linreg):
    X, y, _, _ = linreg
    Xn, yn = np.asarray(X), np.asarray(y)

    def neg_log_marginal(log_sigma):
        C = TAU**2 * Xn @ Xn.T + np.exp(2 * log_sigma) * np.eye(N)
        _, logdet = np.linalg.slogdet(C)
        return 0.5 * (logdet + yn @ np.linalg.solve(C, yn))

    sigma_ml = np.exp(minimize_scalar(neg_log_marginal, bounds=(-5, 2), method="bounded").x)

    mcmc = MCMC(SGHMC(sigma_model, step_size=0.03), num_warmup=1000, num_samples=500, progress_bar=False)
    mcmc.run(jax.random.key(2), X, y)
    samples = mcmc.get_samples()
    # Params come with the samples (constrained), one value per sample.
    assert samples["sigma"].shape == (500,) and jnp.all(samples["sigma"] > 0)
    assert samples["sigma"][-1] == pytest.approx(sigma_ml, rel=0.02)
    assert float(jnp.mean(samples["sigma"])) == pytest.approx(sigma_ml, rel=0.02)
    # Predictive substitutes param sites too, so it uses the per-sample sigma.
    pred = Predictive(sigma_model, {"w": samples["w"][:2], "sigma": jnp.array([1e-6, 1e-6])})
    y_pred = pred(jax.random.key(3), X, None)["y"]
    np.testing.assert_allclose(samples["mu"], samples["w"] @ X.T, rtol=1e-10)
    np.testing.assert_allclose(y_pred, samples["w"][:2] @ X.T, atol=1e-4)

    # param_optimizer=None leaves params at their init values.
    fixed = MCMC(SGHMC(sigma_model, param_optimizer=None), num_warmup=20, num_samples=20, progress_bar=False)
    fixed.run(jax.random.key(0), X, y)
    np.testing.assert_allclose(fixed.get_samples()["sigma"], 2.0, rtol=1e-12)


@pytest.mark.stochastic
def test_constrained_latent():
    # Gamma prior on a Normal precision: conjugate, so the posterior of the positive latent
    # (sampled as log(s), Jacobian included) is Gamma(A + n/2, B + sum(y^2)/2).
    A, B, n = 3.0, 2.0, 20
    y = jnp.asarray(np.random.RandomState(1).randn(n) * 0.7)

    def model(y):
        s = numpyro.sample("s", dist.Gamma(A, B))
        with numpyro.plate("data", n):
            numpyro.sample("y", dist.Normal(0.0, 1.0 / jnp.sqrt(s)), obs=y)

    post = dist.Gamma(A + n / 2, B + float(jnp.sum(y**2)) / 2)
    # 4000 kept draws: with 2000 the variance's standard error sat near the 1/12 the power check
    # allows (above it at one seed in ten)
    mcmc = MCMC(SGHMC(model, step_size=0.1), num_warmup=1000, num_samples=20000, thinning=5, progress_bar=False)
    mcmc.run(jax.random.key(4), y)
    s = mcmc.get_samples(group_by_chain=True)["s"]
    assert jnp.all(s > 0)
    assert_matches(s, float(post.mean), float(post.variance))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"step_size": 0.0}, "step_size"),
        ({"step_size": -1.0}, "step_size"),
        ({"mdecay": 0.0}, "mdecay"),
        ({"mdecay": 1.5}, "mdecay"),
        ({"window_size": 0}, "window_size"),
        ({"window_size": 2.5}, "window_size"),
        ({"num_data": 0}, "num_data"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SGHMC(linreg_model, **kwargs)


def test_bad_models():
    def no_latent(y):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    def discrete(y):
        k = numpyro.sample("k", dist.Bernoulli(0.5))
        numpyro.sample("y", dist.Normal(k, 1.0), obs=y)

    for model, match in [(no_latent, "no latent"), (discrete, "discrete.*'k'")]:
        mcmc = MCMC(SGHMC(model), num_warmup=1, num_samples=1, progress_bar=False)
        with pytest.raises(ValueError, match=match):
            mcmc.run(jax.random.key(0), jnp.ones(()))


def test_refuses_a_model_that_is_not_callable():
    for model in (None, "model"):
        with pytest.raises(ValueError, match="SGHMC: model must be a callable NumPyro model"):
            SGHMC(model)


def test_refuses_per_point_inducing_sets():
    model = dgp.models.amortized_dgp(widths=(1,), num_inducing=(2,))
    mcmc = MCMC(SGHMC(model), num_warmup=1, num_samples=1, progress_bar=False)
    X = jnp.linspace(-1.0, 1.0, 6)[:, None]
    with pytest.raises(ValueError, match=r"SGHMC: layer\(s\) \['h1'\] have per-point inducing .*"
                                         "use inducing='global'"):
        mcmc.run(jax.random.key(0), X, jnp.sin(X[:, 0]))


def _kinked(y):
    """A finite potential everywhere whose gradient is NaN for ``w < 0`` (``0 * inf`` in the
    derivative of ``sqrt(max(w, 0))``)."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0))
    numpyro.factor("kink", jnp.sqrt(jnp.maximum(w, 0.0)))
    numpyro.sample("y", dist.Normal(w, 1.0), obs=y)


@pytest.mark.parametrize("num_chains", [1, 3])
def test_init_searches_for_a_start_with_a_finite_gradient(num_chains):
    # One chain takes NumPyro's compiled search (a batch of one key), as several do: a first
    # start with a finite potential but a NaN gradient must be passed over, not kept (a chain
    # started there never moves: every step is rejected).
    seeds = range(8)
    keys = [jax.random.split(jax.random.key(s), num_chains) for s in seeds]
    keys = [k[0] if num_chains == 1 else k for k in keys]
    y = jnp.ones(())
    # the keys SGHMC.init starts its search from (the second of each key's split)
    init_key = lambda k: jax.vmap(jax.random.split)(jnp.atleast_1d(k))[:, 1].reshape(k.shape)  # noqa: E731
    first = [
        initialize_model(init_key(k), _kinked, model_args=(y,), validate_grad=False) for k in keys
    ]
    # the test sees the search: some keys' first starts are on the bad side
    assert any(bool(jnp.any(info.param_info.z["w"] < 0)) for info in first)
    for key in keys:
        state = SGHMC(_kinked).init(key, 10, None, (y,), {})
        assert state.z["w"].shape == (() if num_chains == 1 else (num_chains,))
        assert bool(jnp.all(state.z["w"] > 0))


def test_init_without_a_finite_gradient_raises():
    def flat_nan_gradient(y):  # potential finite everywhere, gradient NaN everywhere
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        numpyro.factor("nan_gradient", jnp.sqrt(jnp.abs(w) - jnp.abs(w)))
        numpyro.sample("y", dist.Normal(w, 1.0), obs=y)

    with pytest.raises(RuntimeError, match="Cannot find valid initial parameters"):
        SGHMC(flat_nan_gradient).init(jax.random.key(0), 10, None, (jnp.ones(()),), {})


@pytest.mark.filterwarnings("ignore:Out-of-support values")
def test_non_finite_gradient_is_skipped(linreg):
    X, y, _, _ = linreg
    kernel = SGHMC(sigma_model)
    args = (X, y, 100)  # the batch size of test_conjugate_posterior: reuses compiled ops
    state = kernel.init(jax.random.key(0), 10, None, args, {})
    sample = jax.jit(lambda state, y: kernel.sample(state, (X, y, 100), {}))  # batch size static
    first = sample(state, y)
    # a step returns the state's own types: its counters are not weakly typed ints that the step
    # turns into int32, so a compiled step takes its own output (it refused it before)
    kinds = lambda tree: jax.tree.map(lambda a: (a.dtype, getattr(a, "weak_type", False)), tree)  # noqa: E731
    assert kinds(first) == kinds(state)
    state = first
    bad = sample(state, jnp.full_like(y, jnp.nan))
    assert int(bad.num_skipped) == 1 and int(bad.i) == int(state.i) + 1
    for field in ["z", "momentum", "g2", "params", "opt_state", "window", "window_count"]:
        assert jax.tree.all(jax.tree.map(jnp.array_equal, getattr(bad, field), getattr(state, field)))
    assert "skipped=1" in kernel.get_diagnostics_str(bad)
    good = sample(bad, y)
    assert int(good.num_skipped) == 1 and not jnp.array_equal(good.z["w"], bad.z["w"])
    # Postprocessing replays the subsampled model (deterministic sites) and constrains params.
    post = jax.jit(kernel.postprocess_fn(args, {}))(good.position)
    assert post["mu"].shape == (100,) and post["sigma"] == jnp.exp(good.params["sigma"])


@pytest.mark.slow  # ~35 s of compilation (SGHMC step + prediction)
def test_sghmc_samples_end_to_end():
    X, y = _sine_data()
    model = deep_gp_regression(2, num_inducing=6, noise_init=0.05)
    kernel = SGHMC(collapse_last_layer(model), step_size=0.01, param_optimizer=optax.adam(0.01))
    mcmc = MCMC(kernel, num_warmup=30, num_samples=20, thinning=5, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), X, y, batch_size=20)
    samples = mcmc.get_samples()  # latents, params and deterministic layer outputs (minibatch shape)
    assert samples["h1.u"].shape == (4, 1, 6) and samples["noise"].shape == (4,)
    pred = predict_from_samples(model, samples, jax.random.PRNGKey(3), X[:5])
    assert pred.mean.shape == (5,) and bool(jnp.all(jnp.isfinite(pred.variance)))
    assert bool(jnp.all(pred.variance > 0))
