"""``CholeskyNormal``: its draws (one program when run eagerly, NumPyro's operations when
traced) and its log-density at its own draws against the dense multivariate normal."""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
import pytest  # noqa: E402

from numpyro_dgp.posteriors import CholeskyNormal  # noqa: E402


def _factor(rs, shape, dtype):
    L = np.tril(rs.randn(*shape, shape[-1]))
    diagonal = np.arange(shape[-1])
    L[..., diagonal, diagonal] = np.abs(L[..., diagonal, diagonal]) + 0.5
    return jnp.asarray(L, dtype)


def test_log_density_at_its_draws_is_the_dense_multivariate_normal():
    rs = np.random.RandomState(0)
    loc, L = jnp.asarray(rs.randn(3, 6)), _factor(rs, (3, 6), np.float64)
    d = CholeskyNormal(loc, L)
    x, intermediates = d.sample_with_intermediates(jax.random.PRNGKey(1), (4,))
    dense = dist.MultivariateNormal(loc, scale_tril=L).log_prob(x)
    np.testing.assert_allclose(d.log_prob(x, intermediates), dense, rtol=1e-12)
    np.testing.assert_allclose(d.log_prob(x), dense, rtol=1e-12)  # no intermediates: a solve
