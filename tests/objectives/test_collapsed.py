"""CollapsedSparseGP and predict_collapsed: the dense FITC / VFE formulas through a model, VFE's
optimum against DGPElbo's SVGP bound, refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI
from scipy.stats import multivariate_normal

import numpyro_dgp as dgp
from numpyro_dgp import core
from numpyro_dgp.guides import AutoFactorizedDGP

RELATIVE_JITTER = 1e-8  # the layer's jitter, relative to its kernel variance (1.3) ...
JITTER = RELATIVE_JITTER * 1.3  # ... so K(Z, Z) gets this
NOISE = 0.05
Z = np.linspace(-2, 2, 5)[:, None]


def rbf(A, B, variance=1.3, lengthscale=0.6):
    return variance * np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1) / lengthscale**2)


def model(X, y=None, whiten=True, layer_noise=None, batch_size=None):
    data = numpyro.plate("data", X.shape[0], subsample_size=batch_size)
    with data:
        Xb = numpyro.subsample(X, event_dim=1)
        yb = None if y is None else numpyro.subsample(y, event_dim=0)
    f = dgp.gp_layer("f", Xb, dgp.kernels.RBF(variance=1.3, lengthscale=0.6), inducing_inputs=Z, jitter=RELATIVE_JITTER,
                     whiten=whiten, mean="linear", noise=layer_noise)
    noise = numpyro.param("noise", NOISE, constraint=dist.constraints.positive)
    with data:
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=yb)


def no_guide(*args, **kwargs):
    return None


@pytest.fixture(scope="module")
def data():
    rs = np.random.RandomState(0)
    X = np.concatenate([rs.uniform(-2, -0.5, 10), rs.uniform(0.8, 2, 8)])[:, None]  # a gap
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 0] + 0.2 * rs.randn(len(X))
    return jnp.asarray(X), jnp.asarray(y)


def _params(X, y, **kw):
    svi = SVI(model, no_guide, numpyro.optim.Adam(0.01), dgp.CollapsedSparseGP())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), X, y, **kw)))
    params["f.mean.weight"] = jnp.array([[0.4]])  # a mean function that is not zero
    params["f.mean.bias"] = jnp.array([0.1])
    return params


def _dense(X, y, params, method, extra_noise=0.0):
    X = np.asarray(X)
    Kmm = rbf(Z, Z) + JITTER * np.eye(len(Z))
    Kmn, Knn = rbf(Z, X), rbf(X, X)
    Q = Kmn.T @ np.linalg.solve(Kmm, Kmn)
    s2 = NOISE + extra_noise
    lam = np.diag(np.diag(Knn - Q)) + s2 * np.eye(len(X)) if method == "fitc" else s2 * np.eye(len(X))
    residual = np.asarray(y) - (X @ np.asarray(params["f.mean.weight"]) + np.asarray(params["f.mean.bias"]))[:, 0]
    value = multivariate_normal(np.zeros(len(X)), Q + lam).logpdf(residual)
    if method == "vfe":
        value -= 0.5 * np.trace(Knn - Q) / s2
    return value, Q + lam, residual


@pytest.mark.parametrize("method", ["vfe", "fitc"])
@pytest.mark.parametrize("whiten", [True, False])
def test_objective_and_predictive_equal_the_dense_formulas(data, method, whiten):
    X, y = data
    params = _params(X, y, whiten=whiten)
    expected, C, residual = _dense(X, y, params, method)
    objective = dgp.CollapsedSparseGP(method)
    got = -float(objective.loss(jax.random.PRNGKey(0), params, model, no_guide, X, y, whiten=whiten))
    assert abs(got - expected) < 1e-10 * abs(expected)
    X_new = np.linspace(-3, 3, 7)[:, None]
    Q_sf = rbf(X_new, Z) @ np.linalg.solve(rbf(Z, Z) + JITTER * np.eye(len(Z)), rbf(Z, np.asarray(X)))
    mean_f = Q_sf @ np.linalg.solve(C, residual) + (X_new @ np.asarray(params["f.mean.weight"]) + np.asarray(params["f.mean.bias"]))[:, 0]
    var_f = np.diag(rbf(X_new, X_new) - Q_sf @ np.linalg.solve(C, Q_sf.T))
    pred = dgp.predict_collapsed(model, params, X, y, jnp.asarray(X_new), method=method, whiten=whiten)
    np.testing.assert_allclose(pred.mean, mean_f, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pred.variance, var_f + NOISE, rtol=1e-10, atol=1e-12)


def test_layer_noise_adds_to_the_likelihood_noise(data):
    X, y = data
    params = _params(X, y, layer_noise=0.02)
    expected, _, _ = _dense(X, y, params, "fitc", extra_noise=float(params["f.noise"]))
    got = -float(dgp.CollapsedSparseGP("fitc").loss(jax.random.PRNGKey(0), params, model, no_guide, X, y, layer_noise=0.02))
    assert abs(got - expected) < 1e-10 * abs(expected)


def test_vfe_equals_the_svgp_bound_at_its_optimal_q(data):
    """Titsias' collapsed bound is the uncollapsed SVGP bound (DGPElbo) at the optimal q(u)."""
    X, y = data
    params = _params(X, y)
    vfe = -float(dgp.CollapsedSparseGP("vfe").loss(jax.random.PRNGKey(0), params, model, no_guide, X, y))
    guide = AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    full = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), X, y)))
    full.update(params)
    tr = numpyro.handlers.trace(numpyro.handlers.seed(numpyro.handlers.substitute(model, params), 0)).get_trace(X, y)
    layer = tr["f.layer"]["args"][0]
    residual = y - layer.mean_fn(X)[:, 0]
    q_mean, q_sqrt = core.collapsed_posterior(layer.Kmm_chol, layer.kernel(layer.inducing_inputs, X),
                                              layer.kernel.diag(X), residual, NOISE, method="vfe")
    full["f.u_auto_loc"], full["f.u_auto_scale_tril"] = q_mean, q_sqrt
    svgp = -float(dgp.DGPElbo().loss(jax.random.PRNGKey(0), full, model, guide, X, y))
    assert abs(vfe - svgp) < 1e-8 * abs(vfe)
    # any other q is worse
    full["f.u_auto_loc"] = q_mean + 0.1
    assert -float(dgp.DGPElbo().loss(jax.random.PRNGKey(0), full, model, guide, X, y)) < svgp


def test_refusals(data):
    X, y = data
    params = _params(X, y)
    objective = dgp.CollapsedSparseGP()
    with pytest.raises(ValueError, match="method must be one of"):
        dgp.CollapsedSparseGP("dtc")
    with pytest.raises(NotImplementedError, match="needs the full data"):
        objective.loss(jax.random.PRNGKey(0), params, model, no_guide, X, y, batch_size=5)
    with pytest.raises(ValueError, match="samples the inducing values"):
        guide = AutoFactorizedDGP(model)
        objective.loss(jax.random.PRNGKey(0), {**params, **_guide_params(guide, X, y)}, model, guide, X, y)

    def two_layers(X, y=None):
        h = dgp.gp_layer("h", X, dgp.kernels.RBF(), num_inducing=4)
        f = dgp.gp_layer("f", h, dgp.kernels.RBF(), num_inducing=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)

    with pytest.raises(NotImplementedError, match="more than one gp_layer"):
        svi = SVI(two_layers, no_guide, numpyro.optim.Adam(0.01), objective)
        svi.evaluate(svi.init(jax.random.PRNGKey(0), X, y), X, y)

    def classifier(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=f[..., 0]), obs=y)

    with pytest.raises(NotImplementedError, match="Gaussian likelihood"):
        svi = SVI(classifier, no_guide, numpyro.optim.Adam(0.01), objective)
        svi.evaluate(svi.init(jax.random.PRNGKey(0), X, (y > 0).astype(y.dtype)), X, (y > 0).astype(y.dtype))


def _guide_params(guide, X, y):
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    return svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))


def test_fit_with_a_guide_for_no_latent_sites(data):
    X, y = data
    svi = SVI(model, no_guide, numpyro.optim.Adam(0.02), dgp.CollapsedSparseGP("fitc"))
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=100, progress_bar=False)
    assert result.num_skipped == 0 and result.losses[-1] < result.losses[0]
    pred = dgp.predict_collapsed(model, result.params, X, y, X[:3], method="fitc")
    assert pred.mean.shape == (3,) and np.all(np.asarray(pred.variance) > 0)
