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
