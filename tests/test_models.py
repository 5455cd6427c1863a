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


def _trace(model, *args, **kwargs):
    from numpyro import handlers

    return handlers.trace(handlers.seed(model, 0)).get_trace(*args, **kwargs)


def test_num_data_scales_a_given_minibatch(data):
    X, y = data
    model = deep_gp_regression(2, num_inducing=4)
    tr = _trace(model, X[:10], y[:10], num_data=300)
    assert tr["y"]["scale"] == pytest.approx(30.0)
    np.testing.assert_array_equal(tr["y"]["value"], y[:10])
    assert tr["data"]["args"] == (300, 10)
    with pytest.raises(ValueError, match="not both"):
        _trace(model, X, y, batch_size=5, num_data=300)
    with pytest.raises(ValueError, match="num_data=5 is below the 30 points"):
        _trace(model, X, y, num_data=5)


def test_large_data_draw_minibatches_with_replacement(data, monkeypatch):
    from numpyro_dgp import models

    X, y = data
    model = deep_gp_regression(1, num_inducing=4)
    default = _trace(model, X, y, batch_size=8)
    monkeypatch.setattr(models, "WITH_REPLACEMENT_ABOVE", 20)  # 30 points are "large" now
    drawn = _trace(model, X, y, batch_size=8)
    idx = np.asarray(drawn["data"]["value"])
    assert idx.shape == (8,) and idx.min() >= 0 and idx.max() < 30
    assert drawn["y"]["scale"] == default["y"]["scale"] == pytest.approx(30 / 8)
    np.testing.assert_array_equal(drawn["y"]["value"], np.asarray(y)[idx])


def test_probit_regression_model(data):
    X, y = data
    model = deep_gp_regression(1, num_inducing=4, likelihood="probit")
    tr = _trace(model, X, (y > 0).astype(jnp.int32))
    assert type(tr["y"]["fn"]).__name__ in ("BernoulliProbs", "ExpandedDistribution")
    with pytest.raises(NotImplementedError, match="likelihood"):
        deep_gp_regression(likelihood="nope")
