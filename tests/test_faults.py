"""Fault tests: what goes wrong mid-fit or in the parameters is reported, never silently used.

* a NaN injected into minibatches mid-fit: the step is skipped, counted, reported, and never
  written into the parameters;
* a Cholesky failure forced by a near-singular ``K(Z, Z)``: reported with the layer's name and
  what to do (raise the jitter, float64), during the fit and at initialization;
* predicting with non-finite parameters raises, naming the entries.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp._compat import is_tracer


@pytest.fixture(scope="module")
def data():
    rs = np.random.RandomState(0)
    X = jnp.asarray(rs.uniform(-1, 1, (30, 1)))
    return X, jnp.asarray(np.sin(3 * X[:, 0]) + 0.1 * rs.randn(30))


def poisoned_model(X, y=None):
    """A 2-layer DGP on minibatches of 10 whose training steps see a NaN target whenever point 7
    is in the batch (only inside the compiled steps: initialization sees clean data)."""
    h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=4, out_dim=1, mean="identity")
    f = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=4)
    noise = numpyro.param("noise", 0.1, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0], subsample_size=10) as idx:
        y_batch = numpyro.subsample(y, event_dim=0)
        if y_batch is not None and is_tracer(y_batch):
            y_batch = jnp.where(idx == 7, jnp.nan, y_batch)
        numpyro.sample("y", dist.Normal(f[idx, 0], jnp.sqrt(noise)), obs=y_batch)


def test_a_nan_in_a_minibatch_is_skipped_reported_and_never_applied(data):
    X, y = data
    guide = dgp.guides.AutoFactorizedDGP(poisoned_model)
    svi = SVI(poisoned_model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    with pytest.warns(RuntimeWarning, match=r"skipped (\d+) of 40 updates") as record:
        result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=40, chunk_size=15, progress_bar=False)
    message = str(record[0].message)
    assert "Every layer's K(Z, Z) factorizes" in message and "NaN or inf in a minibatch" in message
    bad = ~np.isfinite(result.losses)
    assert 0 < result.num_skipped == bad.sum() < 40  # about a third of the batches hold point 7
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in result.params.values())
    # the skipped updates were not applied: the optimizer counted only the others
    assert int(result.state.optim_state[0]) == 40 - result.num_skipped


def two_layers(X, y=None):
    h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=4, out_dim=1, mean="identity")
    # a tiny jitter: nothing keeps K(Z, Z) factorizable when inducing inputs nearly coincide
    f = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=4, jitter=1e-300)
    noise = numpyro.param("noise", 0.1, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


def test_a_cholesky_failure_is_reported_with_the_layer_name(data):
    X, y = data
    svi = SVI(two_layers, dgp.guides.AutoFactorizedDGP(two_layers), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    near = jnp.asarray([[0.1], [0.1 + 1e-12], [0.1 + 2e-12], [0.1 + 3e-12]])  # K(Z, Z) of rank one
    fitted = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=3, progress_bar=False)
    # a state whose inducing inputs have moved together (NumPyro's validation, on by default,
    # would refuse the layer's NaN output while building it)
    with numpyro.validation_enabled(False):
        state = svi.init(jax.random.PRNGKey(0), X, y, init_params={**fitted.params, "h2.inducing_inputs": near})
    with pytest.raises(FloatingPointError, match=r"every update.*fails in layer 'h2'.*jitter.*float64"):
        dgp.fit(svi, None, X, y, num_steps=5, progress_bar=False, init_state=state)
    # from initialization on (the compiled initialization does not stop at the NaN layer output,
    # so the first updates fail): the same diagnosis
    with pytest.raises((ValueError, FloatingPointError), match=r"fails in layer 'h2'.*jitter"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=5, progress_bar=False,
                init_params={"h2.inducing_inputs": near}, strict=False)
    # healthy inducing inputs: the same model fits without skipping
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=5, progress_bar=False)
    assert result.num_skipped == 0


def test_a_model_that_cannot_be_initialized_names_the_layer(data):
    X, y = data

    def degenerate(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), inducing_inputs=jnp.full((3, 1), 0.5), jitter=1e-300)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)

    svi = SVI(degenerate, dgp.guides.AutoFactorizedDGP(degenerate), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    # the compiled initialization runs through; the updates fail and the diagnosis names the layer
    with pytest.raises((ValueError, FloatingPointError), match=r"fails in layer 'f'.*jitter"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=5, progress_bar=False)


def test_predicting_with_non_finite_parameters_raises_naming_them(data):
    X, y = data
    model = dgp.models.deep_gp_regression(1, num_inducing=4)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=3, progress_bar=False).params
    broken = {**params, "noise": jnp.asarray(jnp.inf),
              "h1.u_auto_loc": params["h1.u_auto_loc"].at[0, 1].set(jnp.nan)}
    with pytest.raises(dgp.ParameterMismatchError, match=r"not finite.*\['h1.u_auto_loc', 'noise'\]") as err:
        dgp.predict(model, guide, broken, jax.random.PRNGKey(1), X[:5])
    assert err.value.non_finite == ["h1.u_auto_loc", "noise"]
    samples = {"h1.u": params["h1.u_auto_loc"][None]}
    with pytest.raises(dgp.ParameterMismatchError, match=r"not finite.*\['noise'\]"):
        dgp.predict_from_samples(model, samples, jax.random.PRNGKey(1), X[:5],
                                 params={k: v for k, v in broken.items() if not k.startswith("h1.u")})
