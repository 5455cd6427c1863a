"""The ready-made models."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer import SVI
import numpyro_dgp as dgp
from numpyro_dgp.models import deep_gp_regression


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = np.sort(rng.uniform(-1, 1, 30))[:, None]
    y = np.where(X[:, 0] > 0, 1.0, -1.0) + 0.05 * rng.randn(30)
    return jnp.asarray(X), jnp.asarray(y)


def test_deep_gp_regression_validates(data):
    X, y = data
    with pytest.raises(ValueError, match="num_layers"):
        deep_gp_regression(0)
    model = deep_gp_regression(2, num_inducing=4)
    guide = dgp.guides.AutoFactorizedDGP(model)
    with pytest.raises(ValueError, match="y must have shape"):
        SVI(model, guide, numpyro.optim.Adam(0.1), dgp.DGPElbo()).init(jax.random.PRNGKey(0), X, y[:-1])
