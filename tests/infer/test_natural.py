"""Natural gradients on q(u): one step of size 1 reaches the collapsed (Titsias) optimum of a
one-layer Gaussian model, whitened or not; the step-size ramp; the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI

import numpyro_dgp as dgp

jax.config.update("jax_enable_x64", True)

N, M, NOISE, VARIANCE, LENGTHSCALE = 30, 8, 0.05, 1.3, 0.4
Z = np.linspace(-1, 1, M)[:, None]


@pytest.fixture(scope="module")
def data():
    rs = np.random.RandomState(0)
    X = rs.uniform(-1, 1, (N, 1))
    return jnp.asarray(X), jnp.asarray(np.sin(3 * X[:, 0]) + 0.1 * rs.randn(N))


def one_layer(whiten):
    def model(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(variance=VARIANCE, lengthscale=LENGTHSCALE), inducing_inputs=Z,
                         jitter=1e-8, whiten=whiten)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], np.sqrt(NOISE)), obs=y)

    return model


def rbf(A, B):
    return VARIANCE * np.exp(-0.5 * ((A[:, None] - B[None]) ** 2).sum(-1) / LENGTHSCALE**2)


def titsias_optimum(X, y, whiten):
    """The optimal q(u) = N(mu, S) of the uncollapsed bound (Titsias 2009), in the guide's
    parameterization (whitened: of v = L^-1 u)."""
    K = rbf(Z, Z) + 1e-8 * VARIANCE * np.eye(M)
    Kzx = rbf(Z, X)
    if whiten:
        A = np.linalg.solve(np.linalg.cholesky(K), Kzx)  # f = A^T v
        S = np.linalg.inv(np.eye(M) + A @ A.T / NOISE)
        return S @ A @ y / NOISE, S
    B = np.linalg.solve(K, Kzx)  # f = B^T u
    S = np.linalg.inv(np.linalg.inv(K) + B @ B.T / NOISE)
    return S @ B @ y / NOISE, S


@pytest.mark.parametrize("whiten", [True, False])
def test_one_step_of_size_one_reaches_the_collapsed_optimum(data, whiten):
    X, y = data
    model = one_layer(whiten)
    guide = dgp.guides.AutoFactorizedDGP(model)
    # others=set_to_zero: only q(u) moves, so the step alone is tested
    svi = SVI(model, guide, dgp.infer.natural_gradients(guide, optax.set_to_zero(), step_size=1.0), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y)
    state, _ = svi.update(state, X, y)
    params = svi.get_params(state)
    mu, S = titsias_optimum(np.asarray(X), np.asarray(y), whiten)
    L = np.asarray(params["f.u_auto_scale_tril"])[0]
    np.testing.assert_allclose(np.asarray(params["f.u_auto_loc"])[0], mu, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(L @ L.T, S, rtol=1e-8, atol=1e-10)
    # at the optimum the natural gradient is zero: a second step stays
    again = svi.get_params(svi.update(state, X, y)[0])
    np.testing.assert_allclose(again["f.u_auto_loc"], params["f.u_auto_loc"], rtol=1e-8, atol=1e-10)


def test_natural_gradients_run_in_fit_beside_adam(data):
    X, y = data
    model = one_layer(True)
    guide = dgp.guides.AutoFactorizedDGP(model)
    optimizer = dgp.infer.natural_gradients(guide, optax.adam(0.01), step_size=dgp.infer.natural_gradient_ramp())
    result = dgp.fit(SVI(model, guide, optimizer, dgp.DGPElbo()), jax.random.PRNGKey(0), X, y, num_steps=40,
                     progress_bar=False)
    assert result.num_skipped == 0 and np.all(np.isfinite(result.losses))
    assert result.losses[-1] < result.losses[0] - 10
    # Adam moved the hyperparameters too (the noise is fixed; the kernel is learned)
    assert float(result.params["f.kernel.variance"]) != VARIANCE


def test_the_ramp_grows_log_linearly_then_stays():
    ramp = dgp.infer.natural_gradient_ramp(1e-4, 1e-1, num_steps=3)
    np.testing.assert_allclose([float(ramp(k)) for k in range(5)], [1e-4, 1e-3, 1e-2, 1e-1, 1e-1], rtol=1e-6)
    for bad in (dict(initial=0.0), dict(final=-1.0), dict(num_steps=0), dict(num_steps=2.5)):
        with pytest.raises(ValueError, match="natural_gradient_ramp"):
            dgp.infer.natural_gradient_ramp(**bad)


def test_natural_gradients_refuse_what_they_cannot_step(data):
    X, y = data
    model = one_layer(True)
    joint = dgp.guides.AutoJointDGP(model)
    svi = SVI(model, joint, dgp.infer.natural_gradients(joint), dgp.DGPElbo())
    with pytest.raises(TypeError, match="AutoFactorizedDGP"):
        svi.init(jax.random.PRNGKey(0), X, y)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, dgp.infer.natural_gradients(guide, layers=["g"]), dgp.DGPElbo())
    with pytest.raises(ValueError, match=r"layers must be .* \['f'\]; got \['g'\]"):
        svi.init(jax.random.PRNGKey(0), X, y)
    with pytest.raises(ValueError, match="step_size must be positive"):
        dgp.infer.natural_gradients(guide, step_size=0.0)
    with pytest.raises(ValueError, match="layers must be"):
        dgp.infer.natural_gradients(guide, layers="first")
    fresh = dgp.guides.AutoFactorizedDGP(model)
    with pytest.raises(ValueError, match="has not been set up"):
        dgp.infer.natural_gradients(fresh).init({"f.u_auto_loc": jnp.zeros((1, M))})
    stranger = dgp.guides.AutoFactorizedDGP(model, prefix="other")
    stranger.setup(jax.random.PRNGKey(0), X, y)
    with pytest.raises(ValueError, match=r"the parameters have no \['f.u_other_loc'"):
        dgp.infer.natural_gradients(stranger).init({"f.u_auto_loc": jnp.zeros((1, M))})


def test_natural_gradients_refuse_per_point_inducing_sets(data):
    X, y = data
    model = dgp.models.amortized_dgp(widths=(1,), num_inducing=(3,))
    guide = dgp.guides.AutoAmortizedDGP(model, num_branches=2)
    svi = SVI(model, guide, dgp.infer.natural_gradients(guide), dgp.DGPElbo())
    with pytest.raises(ValueError, match="per-point inducing sets have no global q"):
        svi.init(jax.random.PRNGKey(0), X, y)
