"""Minibatches from the host (HostMinibatches, memory-mapped .npy) and fit_minibatches."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp.infer import HostMinibatches, fit_minibatches


def _data(n=40):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


def _svi():
    model = dgp.models.deep_gp_regression(2, num_inducing=5)
    return SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())


def test_host_minibatches_read_rows_of_a_memory_map(tmp_path):
    X, y = _data()
    np.save(tmp_path / "X.npy", X)
    batches = HostMinibatches(np.load(tmp_path / "X.npy", mmap_mode="r"), y, 8, seed=3)
    replay = np.random.default_rng(3)
    for _ in range(3):
        Xb, yb = next(batches)
        idx = np.sort(replay.choice(40, 8, replace=False, shuffle=False))
        np.testing.assert_array_equal(Xb, X[idx])
        np.testing.assert_array_equal(yb, y[idx])
        assert type(Xb) is np.ndarray  # a copy of 8 rows, not a view of the map
    with pytest.raises(ValueError, match="batch_size=50 exceeds the 40 rows"):
        HostMinibatches(X, y, 50)
    with pytest.raises(ValueError, match="y has 39 rows"):
        HostMinibatches(X, y[:-1], 5)
    with pytest.raises(ValueError, match=r"HostMinibatches: X must be \(N, D\), got shape \(40,\)"):
        HostMinibatches(X[:, 0], y, 5)


def test_whole_data_batches_reproduce_fit():
    X, y = _data()

    def whole():
        while True:
            yield X, y

    streamed = fit_minibatches(_svi(), jax.random.PRNGKey(0), whole(), num_steps=12, num_data=40,
                               progress_bar=False)
    compiled = dgp.fit(_svi(), jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y), num_steps=12,
                       progress_bar=False)
    np.testing.assert_allclose(streamed.losses, compiled.losses, rtol=1e-9)
    for name, value in compiled.params.items():
        np.testing.assert_allclose(streamed.params[name], value, rtol=1e-8, atol=1e-10, err_msg=name)
    assert streamed.losses.shape == (12,) and streamed.num_skipped == 0


def test_fit_minibatches_reports_exhausted_batches():
    X, y = _data()
    with pytest.raises(ValueError, match="ran out"):
        fit_minibatches(_svi(), jax.random.PRNGKey(0), [(X[:8], y[:8])] * 3, num_steps=5, num_data=40,
                        progress_bar=False)
