"""Elliptical slice sampling (infer.EllipticalSlice) of whitened layer outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

import numpyro_dgp as dgp
from numpyro_dgp import kernels
from numpyro_dgp.handlers import exact_layers, vecchia_layers
from numpyro_dgp.infer import EllipticalSlice
from tests._mc import mcmc_mean_and_se, mcmc_var_and_se, z_threshold

jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)

KERNEL = kernels.RBF(variance=1.0, lengthscale=0.5)


def one_layer(X, y=None):
    f = dgp.gp_layer("f", X, KERNEL, num_inducing=5)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


def _data():
    X = jnp.linspace(-1, 1, 12)[:, None]
    y = jnp.sin(3 * X[:, 0]) + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (12,))
    grid = jnp.array([[-1.4], [-0.3], [0.55], [1.2]])
    return X, y, grid


@pytest.mark.stochastic
@pytest.mark.parametrize("handler", ["exact", "vecchia"])
def test_elliptical_slice_samples_the_gp_posterior(handler):
    """ESS on a plain GP's whitened outputs (exact, and Vecchia with every earlier point as a
    neighbour, which is exact): grid means and variances of the closed-form posterior within
    Monte Carlo error; chains vectorized."""
    X, y, grid = _data()
    if handler == "exact":
        model = exact_layers(one_layer, grid=grid, jitter=1e-6)
    else:
        model = vecchia_layers(one_layer, num_neighbors=15, grid=grid, jitter=1e-6)
    mcmc = MCMC(
        EllipticalSlice(model),
        num_warmup=500,
        num_samples=4000,
        num_chains=4,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0), X, y)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["f.grid"][..., 0])  # (4, 4000, 4)
    K = np.asarray(KERNEL(X)) + 0.01 * np.eye(12)
    Ks = np.asarray(KERNEL(grid, X))
    mean = Ks @ np.linalg.solve(K, np.asarray(y))
    var = np.diag(np.asarray(KERNEL(grid)) + 1e-6 * np.eye(4) - Ks @ np.linalg.solve(K, Ks.T))
    z = z_threshold(8)
    m_hat, m_se = mcmc_mean_and_se(draws)
    v_hat, v_se = mcmc_var_and_se(draws)
    np.testing.assert_array_less(np.abs(m_hat - mean), z * m_se)
    np.testing.assert_array_less(np.abs(v_hat - var), z * v_se)
    evals = np.asarray(mcmc.get_extra_fields()["num_evaluations"])
    assert evals.min() >= 1 and evals.mean() < 20


def test_elliptical_slice_refuses_sites_that_are_not_standard_normal():
    X, y, _ = _data()

    def with_prior(X, y=None):
        kern = kernels.RBF(variance=1.0, lengthscale=0.5)
        f = dgp.gp_layer(
            "f", X, kern, num_inducing=5, priors={"lengthscale": dist.LogNormal(0.0, 1.0)}
        )
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)

    for model, site in (
        (exact_layers(with_prior), "f.kernel.lengthscale"),
        (exact_layers(one_layer, parameterization="centered"), "f.f"),
    ):
        mcmc = MCMC(EllipticalSlice(model), num_warmup=1, num_samples=1, progress_bar=False)
        with pytest.raises(
            ValueError, match=f"latent site '{site}' has prior .*not a standard normal"
        ):
            mcmc.run(jax.random.PRNGKey(0), X, y)

    def no_latent(X, y=None):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises(ValueError, match="no latent sample sites"):
        MCMC(EllipticalSlice(no_latent), num_warmup=1, num_samples=1, progress_bar=False).run(
            jax.random.PRNGKey(0), X, y
        )


def with_lengthscale_prior(X, y=None):
    kern = kernels.RBF(variance=1.0, lengthscale=0.5)
    f = dgp.gp_layer("f", X, kern, num_inducing=5, priors={"lengthscale": dist.LogNormal(-0.5, 0.3)})
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


@pytest.mark.stochastic
def test_elliptical_slice_within_gibbs_agrees_with_nuts_when_hyperparameters_are_sampled():
    """NUTS on the lengthscale with elliptical slice steps on the layer (HMCGibbs) against NUTS
    on both: the posterior means and variances of the grid values and the lengthscale agree
    within the two runs' combined Monte Carlo error."""
    from numpyro.infer import NUTS, HMCGibbs

    from numpyro_dgp.infer import elliptical_slice_gibbs

    X, y, grid = _data()
    model = exact_layers(with_lengthscale_prior, grid=grid, jitter=1e-6)
    sites = ["f.f_white"]
    gibbs = HMCGibbs(NUTS(model), gibbs_fn=elliptical_slice_gibbs(model, sites, X, y), gibbs_sites=sites)
    runs = []
    for kernel, draws in ((gibbs, 3000), (NUTS(model), 1000)):
        mcmc = MCMC(kernel, num_warmup=500, num_samples=draws, num_chains=2, chain_method="sequential",
                    progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), X, y)
        samples = mcmc.get_samples(group_by_chain=True)
        runs.append(np.concatenate([np.asarray(samples["f.grid"][..., 0]),
                                    np.asarray(samples["f.kernel.lengthscale"]).reshape(2, draws, 1)], axis=-1))
    (m1, se1), (m2, se2) = (mcmc_mean_and_se(r) for r in runs)
    (v1, sv1), (v2, sv2) = (mcmc_var_and_se(r) for r in runs)
    z = z_threshold(10)
    np.testing.assert_array_less(np.abs(m1 - m2), z * np.hypot(se1, se2))
    np.testing.assert_array_less(np.abs(v1 - v2), z * np.hypot(sv1, sv2))


def test_elliptical_slice_gibbs_refuses_sites_it_cannot_update():
    from numpyro_dgp.infer import elliptical_slice_gibbs

    X, y, _ = _data()
    model = exact_layers(with_lengthscale_prior)
    with pytest.raises(ValueError, match=r"elliptical_slice_gibbs: \['f.u'\] are not latent sample sites"):
        elliptical_slice_gibbs(model, ["f.u"], X, y)
    with pytest.raises(ValueError, match="elliptical_slice_gibbs: latent site 'f.kernel.lengthscale' has prior"):
        elliptical_slice_gibbs(model, ["f.kernel.lengthscale"], X, y)


def test_elliptical_slice_takes_initial_values_for_one_chain_and_refuses_non_finite_ones():
    X, y, _ = _data()
    model = exact_layers(one_layer, jitter=1e-6)
    start = {"f.f_white": jnp.full((1, 12), 0.3)}
    mcmc = MCMC(EllipticalSlice(model), num_warmup=0, num_samples=3, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y, init_params=start)
    assert mcmc.get_samples()["f.f_white"].shape == (3, 1, 12)
    kernel = EllipticalSlice(model)
    state = kernel.init(jax.random.PRNGKey(0), 0, start, (X, y), {})
    assert state.z["f.f_white"].shape == (1, 12) and state.log_likelihood.shape == ()
    with pytest.raises(ValueError, match="log density is not finite at the initial values"):
        EllipticalSlice(model).init(jax.random.PRNGKey(0), 0, {"f.f_white": jnp.full((1, 12), 1e200)},
                                    (X, y), {})


def test_a_step_that_cannot_reach_its_level_keeps_the_current_state():
    """A level no point of the ellipse reaches (the kept likelihood above every value: round-off
    between it and its recomputation can do this) ends after MAX_SHRINKS shrinks, state unchanged."""
    from numpyro_dgp.infer._elliptical import MAX_SHRINKS, EllipticalSliceState, _step

    z = {"a": jnp.arange(3.0)}
    state = EllipticalSliceState(z, jnp.asarray(jnp.inf), jnp.int32(1), jax.random.PRNGKey(0))
    new = jax.jit(lambda s: _step(s, lambda v: -jnp.sum(v["a"] ** 2)))(state)
    np.testing.assert_array_equal(new.z["a"], z["a"])
    assert int(new.num_evaluations) == MAX_SHRINKS + 1 and new.log_likelihood == jnp.inf
