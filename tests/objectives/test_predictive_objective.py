"""PredictiveObjective (DSPP / PPGPR, the AR2PP objective of Meng & Zhang 2024) against dense references."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from scipy.stats import norm

import numpyro_dgp as dgp
from numpyro_dgp._engine.run import marginal_trace
from numpyro_dgp.guides import AutoFactorizedDGP
from numpyro_dgp.kernels import RBF
from numpyro_dgp.objectives import PredictiveObjective
from tests._mc import z_threshold

NOISE = 0.09


Z = np.linspace(-1, 1, 5)[:, None]


def rbf(A, B):
    return np.exp(-0.5 * (A[:, None, 0] - B[None, :, 0]) ** 2)


def svgp(X, y=None, likelihood="normal", batch_size=None):
    f = dgp.gp_layer("f", X, RBF(), inducing_inputs=jnp.asarray(Z))
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
        f_batch = numpyro.subsample(f[..., 0], event_dim=0)
        y_batch = None if y is None else numpyro.subsample(y, event_dim=0)
        if likelihood == "normal":
            numpyro.sample("y", dist.Normal(f_batch, np.sqrt(NOISE)), obs=y_batch)
        else:
            numpyro.sample("y", dgp.bernoulli_probit(f_batch, squash=0.0), obs=y_batch)


def two_layer(X, y=None):
    h = dgp.gp_layer("h", X, RBF(), num_inducing=5, mean="identity")
    f = dgp.gp_layer("f", h, RBF(), num_inducing=5)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], np.sqrt(NOISE)), obs=y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = np.sort(rng.uniform(-1.5, 1.5, 15))[:, None]
    y = np.sin(2 * X[:, 0]) + 0.3 * rng.randn(15)
    return jnp.asarray(X), jnp.asarray(y)


def random_params(model, X, y, seed=1, **kwargs):
    guide = AutoFactorizedDGP(model, inner_init="prior")
    svi = numpyro.infer.SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), X, y, **kwargs)))
    rng = np.random.RandomState(seed)
    for k, v in list(params.items()):
        if k.endswith("_loc"):
            params[k] = v + 0.5 * jnp.asarray(rng.randn(*v.shape))
        if k.endswith("_scale_tril"):
            A = np.tril(0.3 * rng.randn(*v.shape[-2:]), -1) + np.diag(0.5 + 0.2 * np.abs(rng.randn(v.shape[-1])))
            params[k] = jnp.broadcast_to(jnp.asarray(A), v.shape)
    return guide, params


def components(objective, key, params, model, guide, X, y, **kwargs):
    # compiled: eager op-by-op tracing of the whole model is far slower in a test
    return jax.jit(lambda p: objective.components(key, p, model, guide, X, y, **kwargs))(params)


def neg_loss(objective, key, params, model, guide, X, y):
    return -float(jax.jit(lambda p: objective.loss(key, p, model, guide, X, y))(params))


def dense_svgp_moments(X, params):
    """Whitened SVGP marginal moments and KL, in NumPy."""
    L = np.linalg.cholesky(rbf(Z, Z) + dgp.core.default_jitter(jnp.float64) * np.eye(len(Z)))
    A = np.linalg.solve(L, rbf(Z, np.asarray(X)))
    m_q = np.asarray(params["f.u_auto_loc"])[0]
    L_S = np.asarray(params["f.u_auto_scale_tril"])[0]
    mean = A.T @ m_q
    var = 1.0 - np.sum(A**2, 0) + np.sum((L_S.T @ A) ** 2, 0)
    S = L_S @ L_S.T
    kl = 0.5 * (np.trace(S) + m_q @ m_q - len(Z) - np.linalg.slogdet(S)[1])
    return mean, var, kl


def test_one_layer_gaussian_is_the_dense_ppgpr_objective(data):
    X, y = data
    guide, params = random_params(svgp, X, y)
    parts = components(PredictiveObjective(num_particles=3), jax.random.PRNGKey(0), params, svgp, guide, X, y)
    mean, var, kl = dense_svgp_moments(X, params)
    log_pred = norm.logpdf(np.asarray(y), mean, np.sqrt(var + NOISE)).sum()
    np.testing.assert_allclose(parts["log_predictive"], log_pred, rtol=1e-10)
    np.testing.assert_allclose(parts["kl_inducing"], kl, rtol=1e-10)
    key = jax.random.PRNGKey(0)
    value = neg_loss(PredictiveObjective(num_particles=3, beta=0.5), key, params, svgp, guide, X, y)
    np.testing.assert_allclose(value, log_pred - 0.5 * kl, rtol=1e-10)
    # Jensen: log E p >= E log p, so the objective is above the ELBO at the same parameters
    elbo = neg_loss(dgp.DGPElbo(), key, params, svgp, guide, X, y)
    assert neg_loss(PredictiveObjective(num_particles=1), key, params, svgp, guide, X, y) > elbo


def test_one_layer_probit_is_the_closed_form_integral(data):
    X, y = data
    labels = (y > 0).astype(jnp.float64)
    model = lambda X, y=None: svgp(X, y, likelihood="probit")  # noqa: E731
    guide, params = random_params(model, X, labels)
    parts = components(PredictiveObjective(num_particles=1), jax.random.PRNGKey(0), params, model, guide, X, labels)
    mean, var, _ = dense_svgp_moments(X, params)
    p1 = norm.cdf(mean / np.sqrt(1 + var))  # int Phi(f) N(f | m, v) df
    ref = np.sum(np.where(np.asarray(labels) == 1, np.log(p1), np.log1p(-p1)))
    np.testing.assert_allclose(parts["log_predictive"], ref, rtol=1e-8)


def test_two_layers_mix_the_particles_inside_the_log(data):
    X, y = data
    guide, params = random_params(two_layer, X, y)
    S, key = 4, jax.random.PRNGKey(3)
    parts = components(PredictiveObjective(num_particles=S), key, params, two_layer, guide, X, y)

    @jax.jit
    def reference(k, params):
        run = marginal_trace(two_layer, guide, params, k, (X, y), {})
        kl = dgp.DGPElbo().components(k, params, two_layer, guide, X, y)["kl_inducing"]
        return run.moments["f"], kl

    per_particle, kls = [], []
    for k in jax.random.split(key, S):
        (m, v), kl = reference(k, params)
        per_particle.append(norm.logpdf(np.asarray(y), np.asarray(m[:, 0]), np.sqrt(np.asarray(v[:, 0]) + NOISE)))
        kls.append(float(kl))
    per_particle = np.array(per_particle)  # (S, N)
    ref = np.sum(np.logaddexp.reduce(per_particle, axis=0) - np.log(S))
    np.testing.assert_allclose(parts["log_predictive"], ref, rtol=1e-9)
    np.testing.assert_allclose(parts["kl_inducing"], np.mean(kls), rtol=1e-10)
    # the mixture is not the average of per-particle log-likelihoods (the particles differ)
    assert parts["log_predictive"] > per_particle.mean(0).sum() + 1e-6
    # weighted particles
    w = np.arange(1, S + 1) / np.sum(np.arange(1, S + 1))
    weighted = components(PredictiveObjective(num_particles=S, particle_weights=w), key, params, two_layer, guide, X, y)
    ref_w = np.sum(np.logaddexp.reduce(per_particle + np.log(w)[:, None], axis=0))
    np.testing.assert_allclose(weighted["log_predictive"], ref_w, rtol=1e-9)


@pytest.mark.stochastic
def test_minibatch_estimate_is_unbiased(data):
    X, y = data
    guide, params = random_params(svgp, X, y)
    objective = PredictiveObjective(num_particles=1)
    full = neg_loss(objective, jax.random.PRNGKey(0), params, svgp, guide, X, y)
    keys = jax.random.split(jax.random.PRNGKey(5), 3000)
    mini = -np.asarray(jax.jit(jax.vmap(lambda k: objective.loss(k, params, svgp, guide, X, y, batch_size=4)))(keys))
    se = mini.std() / np.sqrt(len(mini))
    assert mini.std() > 0
    assert abs(mini.mean() - full) < z_threshold() * se


@pytest.mark.stochastic
def test_fit_with_the_predictive_objective(data):
    X, y = data
    guide = AutoFactorizedDGP(two_layer)
    svi = numpyro.infer.SVI(two_layer, guide, numpyro.optim.Adam(0.02), PredictiveObjective(num_particles=4))
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=200, progress_bar=False)
    assert result.num_skipped == 0
    assert result.losses[-30:].mean() < result.losses[:30].mean() - 1.0


def test_errors():
    with pytest.raises(ValueError, match="num_particles"):
        PredictiveObjective(num_particles=0)
    with pytest.raises(ValueError, match="beta"):
        PredictiveObjective(beta=-1.0)
    with pytest.raises(ValueError, match="particle_weights"):
        PredictiveObjective(num_particles=2, particle_weights=[0.3, 0.3])
