"""The compositional-uncertainty driver: per-layer variances against plain sampling."""

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest

import numpyro_dgp as dgp
from numpyro_dgp.compositional import (
    FAMILIES,
    composed_gp,
    elbo_estimate,
    family_samples,
    fit_family,
    layer_variances,
    plot_compositions,
)

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


@pytest.mark.parametrize("family", ["joint", "locations"])
def test_layer_variances_agree_with_sampling_the_guide(fitted, family):
    """Law of total variance over exact per-layer moments vs. the plain variance of values
    propagated from sampled inducing values (two estimators of the same quantity)."""
    model, guide, result = fitted(family)
    x0 = jnp.array([[0.0], [0.5]])
    ours = layer_variances(model, guide, result.params, x0, jax.random.PRNGKey(1), num_samples=4000)
    draws = dgp.sample_layers(model, guide, result.params, jax.random.PRNGKey(2), x0, num_samples=20000, coherent=False)
    for name in ("h1", "h2"):
        mc = np.asarray(draws[name][..., 0]).var(0)
        np.testing.assert_allclose(ours[name], mc, rtol=0.1)


def test_global_first_layer_variance_is_the_analytic_marginal(fitted):
    model, guide, result = fitted("factorised")
    x0 = jnp.array([[0.0]])
    var = layer_variances(model, guide, result.params, x0, jax.random.PRNGKey(1), num_samples=10)
    run = dgp.objectives.marginal_trace(model, guide, result.params, jax.random.PRNGKey(3), (x0,), {})
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
