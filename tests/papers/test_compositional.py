"""The compositional-uncertainty driver: per-layer variances against plain sampling."""

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
from papers.compositional import (
    FAMILIES,
    composed_gp,
    elbo_estimate,
    family_samples,
    fit_family,
    layer_variances,
    plot_compositions,
)

import numpyro_dgp as dgp
from numpyro_dgp._engine.run import marginal_trace
from tests._mc import z_threshold

matplotlib.use("Agg")

KERNELS = [dgp.kernels.RBF(lengthscale=0.5), dgp.kernels.Periodic(lengthscale=0.7, period=2.0)]


@pytest.fixture(scope="module")
def data():
    X = jnp.linspace(-1.0, 1.0, 12)[:, None]
    return X, jnp.cos(jnp.pi * X[:, 0])


@pytest.fixture(scope="module")
def fitted(data):
    """Each family fitted once (compiling a fit is the slow part), shared by the tests below."""
    X, y = data
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = fit_family(family, KERNELS, X, y, rng_key=jax.random.PRNGKey(0), num_steps=150,
                                       num_inducing=5, noise=1e-2, jitter=1e-4, inner_init="prior")
        return cache[family]

    return get


def _variance_tolerance(draws, num_samples_ours, num_comparisons):
    """z times the standard error of (our estimate - the draws' sample variance). The sample
    variance's error comes from the draws (the squared deviations' spread: the composed layers are
    not Gaussian). Ours averages exact conditional moments over ``num_samples_ours`` propagated
    samples (Rao-Blackwellized), so its error is at most the sample variance's at that many draws."""
    draws = np.asarray(draws)
    sq = (draws - draws.mean(0)) ** 2
    se_draws = sq.std(0) / np.sqrt(len(draws))
    se_ours = sq.std(0) / np.sqrt(num_samples_ours)
    return z_threshold(num_comparisons) * np.hypot(se_draws, se_ours)


@pytest.mark.parametrize("family", ["joint", "locations"])
@pytest.mark.stochastic
def test_layer_variances_agree_with_sampling_the_guide(fitted, family):
    """Law of total variance over exact per-layer moments vs. the plain variance of values
    propagated from sampled inducing values (two estimators of the same quantity)."""
    model, guide, result = fitted(family)
    x0 = jnp.array([[0.0], [0.5]])
    ours = layer_variances(model, guide, result.params, x0, jax.random.PRNGKey(1), num_samples=4000)
    draws = dgp.sample_layers(model, guide, result.params, jax.random.PRNGKey(2), x0, num_samples=20000, coherent=False)
    for name in ("h1", "h2"):
        np.testing.assert_array_less(np.abs(ours[name] - np.asarray(draws[name][..., 0]).var(0)),
                                     _variance_tolerance(draws[name][..., 0], 4000, num_comparisons=4))


def test_global_first_layer_variance_is_the_analytic_marginal(fitted):
    model, guide, result = fitted("factorized")
    x0 = jnp.array([[0.0]])
    var = layer_variances(model, guide, result.params, x0, jax.random.PRNGKey(1), num_samples=10)
    run = marginal_trace(model, guide, result.params, jax.random.PRNGKey(3), (x0,), {})
    np.testing.assert_allclose(var["h1"], np.asarray(run.moments["h1"][1][:, 0]), rtol=1e-12)


def test_elbo_estimate_and_plots(data, fitted):
    X, y = data
    grid = jnp.linspace(-1, 1, 20)[:, None]
    samples = {}
    for family in FAMILIES:
        model, guide, result = fitted(family)
        elbo, se = elbo_estimate(model, guide, result.params, X, y, jax.random.PRNGKey(1), 20)
        assert np.isfinite(elbo) and se >= 0
        samples[family] = family_samples(model, guide, result.params, grid, jax.random.PRNGKey(2), num_samples=3)
        assert samples[family]["h2"].shape == (3, 20)
    fig = plot_compositions(samples, grid, X, y)
    assert len(fig.axes) == 4 * 3


def test_bad_arguments(data):
    X, y = data
    with pytest.raises(ValueError, match="family must be one of"):
        fit_family("mean-field", KERNELS, X, y, rng_key=jax.random.PRNGKey(0), num_steps=1, num_inducing=3)
    with pytest.raises(ValueError, match="noise must be positive"):
        composed_gp(KERNELS, num_inducing=3, noise=0.0)
    with pytest.raises(ValueError, match="at least one layer"):
        composed_gp([], num_inducing=3)


def _dense_svgp_variance(layer, loc, scale_tril, x):
    """``Var f(x)`` of one layer from its inducing Gaussian, written out densely (float64)."""
    Z = np.asarray(layer.inducing_inputs, np.float64)
    x = np.asarray(x, np.float64)
    Kzz = np.asarray(layer.kernel(Z, Z)) + layer.jitter * np.eye(Z.shape[0])
    kxz = np.asarray(layer.kernel(x, Z))
    kxx = np.asarray(layer.kernel(x, x))
    S = np.asarray(scale_tril[0]) @ np.asarray(scale_tril[0]).T
    if layer.whiten:
        A = np.linalg.solve(np.linalg.cholesky(Kzz), kxz.T).T  # k(x, Z) L^-T
    else:
        A = np.linalg.solve(Kzz, kxz.T).T  # k(x, Z) K^-1
    return np.diag(kxx - kxz @ np.linalg.solve(Kzz, kxz.T) + A @ S @ A.T)


def test_own_input_variance_of_a_factorized_layer_is_its_dense_svgp_marginal(fitted):
    """``own_input=True``: layer 2 evaluated at its own input h = 0 (paper 000's Var[f2(0)]),
    not at f1(0); with a factorized guide it does not depend on layer 1 at all."""
    model, guide, result = fitted("factorized")
    x0 = jnp.array([[0.0], [0.3]])
    var = layer_variances(model, guide, result.params, x0, jax.random.PRNGKey(1), num_samples=10, own_input=True)
    run = marginal_trace(model, guide, result.params, jax.random.PRNGKey(3), (x0,), {})
    layer2 = run.model_trace["h2.layer"]["args"][0]
    loc, scale_tril = run.posteriors["h2.u"]
    np.testing.assert_allclose(var["h2"], _dense_svgp_variance(layer2, loc, scale_tril, x0), rtol=1e-10)
    composed = layer_variances(model, guide, result.params, x0, jax.random.PRNGKey(1), num_samples=10)
    np.testing.assert_allclose(var["h1"], composed["h1"], rtol=1e-12)  # layer 1's input is x either way
    assert not np.allclose(var["h2"], composed["h2"], rtol=1e-3)


@pytest.mark.parametrize("family", ["joint", "locations"])
@pytest.mark.stochastic
def test_own_input_variances_agree_with_sampling_the_guide(fitted, family):
    """Correlated guides and inducing locations: ``f2(h)``'s marginal depends on what layer 1
    drew; the analytic estimator agrees with sampling under the same ``layer_inputs``."""
    model, guide, result = fitted(family)
    x0 = jnp.array([[0.0], [0.5]])
    ours = layer_variances(model, guide, result.params, x0, jax.random.PRNGKey(1), num_samples=4000, own_input=True)
    shifted = dgp.handlers.layer_inputs(model, {"h2": x0})
    draws = dgp.sample_layers(shifted, guide, result.params, jax.random.PRNGKey(2), x0, num_samples=20000, coherent=False)
    np.testing.assert_array_less(np.abs(ours["h2"] - np.asarray(draws["h2"][..., 0]).var(0)),
                                 _variance_tolerance(draws["h2"][..., 0], 4000, num_comparisons=2))


def test_layer_inputs_refuses_unknown_layers_and_bad_shapes(fitted):
    model, guide, result = fitted("factorized")
    x0 = jnp.array([[0.0], [0.5]])
    with pytest.raises(ValueError, match="no layer named \\['h9'\\]"):
        dgp.sample_layers(dgp.handlers.layer_inputs(model, {"h9": x0}), guide, result.params,
                          jax.random.PRNGKey(2), x0, num_samples=2)
    with pytest.raises(ValueError, match="layer 'h2'.*does not broadcast"):
        dgp.sample_layers(dgp.handlers.layer_inputs(model, {"h2": jnp.zeros((3, 1))}), guide, result.params,
                          jax.random.PRNGKey(2), x0, num_samples=2)
    with pytest.raises(ValueError, match="non-empty dict"):
        dgp.handlers.layer_inputs(model, {})
