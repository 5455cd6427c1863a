"""``CholeskyNormal``: its draws (one program when run eagerly, NumPyro's operations when
traced) and its log-density at its own draws against the dense multivariate normal."""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
import pytest  # noqa: E402

from numpyro_dgp.posteriors import CholeskyNormal, _cholesky_normal_draw  # noqa: E402


def _factor(rs, shape, dtype):
    L = np.tril(rs.randn(*shape, shape[-1]))
    diagonal = np.arange(shape[-1])
    L[..., diagonal, diagonal] = np.abs(L[..., diagonal, diagonal]) + 0.5
    return jnp.asarray(L, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, sample_shape", [((3, 5), ()), ((1, 4), (2,)), ((6,), ()), ((2, 3, 4), (5, 1))])
def test_eager_draw_is_numpyros_and_the_traced_one(dtype, shape, sample_shape):
    rs = np.random.RandomState(len(shape) + shape[-1])
    d = CholeskyNormal(jnp.asarray(rs.randn(*shape), dtype), _factor(rs, shape, dtype))
    key = jax.random.PRNGKey(3)
    before = _cholesky_normal_draw._cache_size()
    x, intermediates = d.sample_with_intermediates(key, sample_shape)
    assert _cholesky_normal_draw._cache_size() == before + 1  # eagerly: its one program
    x_numpyro, intermediates_numpyro = dist.TransformedDistribution.sample_with_intermediates(d, key, sample_shape)
    np.testing.assert_array_equal(x, x_numpyro)
    np.testing.assert_array_equal(intermediates[0][0], intermediates_numpyro[0][0])
    x_traced, _ = jax.jit(lambda k: d.sample_with_intermediates(k, sample_shape))(key)
    np.testing.assert_array_equal(x, x_traced)
    np.testing.assert_array_equal(d.sample(key, sample_shape), x)
    np.testing.assert_array_equal(d.log_prob(x, intermediates), d.log_prob(x_numpyro, intermediates_numpyro))


def test_log_density_at_its_draws_is_the_dense_multivariate_normal():
    rs = np.random.RandomState(0)
    loc, L = jnp.asarray(rs.randn(3, 6)), _factor(rs, (3, 6), np.float64)
    d = CholeskyNormal(loc, L)
    x, intermediates = d.sample_with_intermediates(jax.random.PRNGKey(1), (4,))
    dense = dist.MultivariateNormal(loc, scale_tril=L).log_prob(x)
    np.testing.assert_allclose(d.log_prob(x, intermediates), dense, rtol=1e-12)
    np.testing.assert_allclose(d.log_prob(x), dense, rtol=1e-12)  # no intermediates: a solve
