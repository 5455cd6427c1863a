"""Latent inputs and the importance-weighted bound: the bound against the log marginal
likelihood by quadrature on a toy, its growth with K, a dense reference of its value, the joint
draws of a point's K latents through an inner layer, prediction from the prior, the guides'
q(w) and the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI, Trace_ELBO
from scipy.special import logsumexp
from scipy.stats import multivariate_normal, norm

import numpyro_dgp as dgp
from numpyro_dgp._engine.run import marginal_trace
from numpyro_dgp.objectives._importance import ImportanceDraws
from tests._mc import z_threshold

jax.config.update("jax_enable_x64", True)

# two points, one latent each: the evidence is a 2-D integral over (w_1, w_2)
X_TOY = np.array([[-0.5], [0.6]])
Y_TOY = np.array([0.8, -0.3])
NOISE, VARIANCE, LENGTHSCALE = 0.05, 1.0, np.array([0.7, 0.8])
Z_TOY = np.array([[x, w] for x in (-0.5, 0.6) for w in np.linspace(-3, 3, 12)])


def toy(X, y=None):
    with numpyro.plate("data", X.shape[0]):
        h = dgp.latent_input("w", X, 1)
    f = dgp.gp_layer("f", h, dgp.kernels.RBF(variance=VARIANCE, lengthscale=LENGTHSCALE), inducing_inputs=Z_TOY,
                     learn_inducing=False, learn_hyperparameters=False)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], np.sqrt(NOISE)), obs=y)


def kernel(A, B):
    return VARIANCE * np.exp(-0.5 * (((A[:, None] - B[None]) / LENGTHSCALE) ** 2).sum(-1))


def exact_log_evidence():
    """``log int N(y | 0, K([x, w]) + s^2 I) N(w | 0, I) dw`` by a 2-D 80-node Gauss-Hermite rule."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    log_w = np.log(weights / weights.sum())
    terms = []
    for a, la in zip(nodes, log_w):
        for b, lb in zip(nodes, log_w):
            H = np.array([[X_TOY[0, 0], a], [X_TOY[1, 0], b]])
            terms.append(la + lb + multivariate_normal(np.zeros(2), kernel(H, H) + NOISE * np.eye(2)).logpdf(Y_TOY))
    return logsumexp(terms)


@pytest.fixture(scope="module")
def toy_fit():
    """The toy's guide with a q(u) of a short fit and q(w) at the prior (a poor proposal, so
    importance weighting has much to gain)."""
    X, y = jnp.asarray(X_TOY), jnp.asarray(Y_TOY)
    guide = dgp.guides.AutoFactorizedDGP(toy)
    svi = SVI(toy, guide, numpyro.optim.Adam(0.03), dgp.ImportanceWeightedElbo(8))
    params = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=300, progress_bar=False).params
    params = {**params, "w_auto_loc": jnp.zeros((2, 1)), "w_auto_scale": jnp.ones((2, 1))}
    return guide, params


def bound_draws(guide, params, K, num):
    elbo = dgp.ImportanceWeightedElbo(K)
    one = lambda key: -elbo.loss(key, params, toy, guide, jnp.asarray(X_TOY), jnp.asarray(Y_TOY))  # noqa: E731
    return np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(K), num)))


@pytest.mark.stochastic
def test_the_bound_grows_with_k_and_stays_below_the_evidence(toy_fit):
    guide, params = toy_fit
    exact = exact_log_evidence()
    z = z_threshold(5)
    estimates = {}
    for K in (1, 4, 16):
        draws = bound_draws(guide, params, K, 3000)
        estimates[K] = (draws.mean(), draws.std(ddof=1) / np.sqrt(len(draws)))
        assert estimates[K][0] + z * estimates[K][1] < exact, (K, estimates[K], exact)
    for small, large in ((1, 4), (4, 16)):
        (a, sa), (b, sb) = estimates[small], estimates[large]
        assert b - a > z * np.sqrt(sa**2 + sb**2), estimates


@pytest.mark.stochastic
@pytest.mark.parametrize("proposal", ["prior", "shifted"])
def test_the_bound_is_the_dense_formula(toy_fit, proposal):
    """``sum_n E log mean_k exp(E_q(f)[log N(y_n | f, s^2)]) p(w_k) / q(w_k) - KL(q(u) || p(u))``
    with the marginal of f computed densely, by an independent Monte Carlo estimate; q(w) at the
    prior (weights 1) and away from it (the weights' formula at work)."""
    guide, params = toy_fit
    loc, scale = (np.zeros(2), np.ones(2)) if proposal == "prior" else (np.array([0.3, -0.4]), np.array([0.7, 1.3]))
    params = {**params, "w_auto_loc": jnp.asarray(loc[:, None]), "w_auto_scale": jnp.asarray(scale[:, None])}
    K, R = 4, 4000
    L = np.linalg.cholesky(kernel(Z_TOY, Z_TOY) + 1e-6 * VARIANCE * np.eye(len(Z_TOY)))
    m_u = np.asarray(params["f.u_auto_loc"])[0]
    S_u = np.asarray(params["f.u_auto_scale_tril"])[0]
    rng = np.random.default_rng(0)
    w = loc[:, None] + scale[:, None] * rng.normal(size=(R, 2, K))
    log_weights = norm.logpdf(w) - norm.logpdf(w, loc[:, None], scale[:, None])  # log p(w) - log q(w)
    total = np.zeros(R)
    for n in range(2):
        H = np.stack([np.full(w[:, n].size, X_TOY[n, 0]), w[:, n].ravel()], -1)
        A = np.linalg.solve(L, kernel(Z_TOY, H))
        mean = A.T @ m_u
        var = VARIANCE - (A**2).sum(0) + ((S_u.T @ A) ** 2).sum(0)
        ell = (-0.5 * np.log(2 * np.pi * NOISE) - 0.5 * ((Y_TOY[n] - mean) ** 2 + var) / NOISE).reshape(R, K)
        total += logsumexp(ell + log_weights[:, n], axis=1) - np.log(K)
    kl = 0.5 * (np.sum(S_u**2) + m_u @ m_u - len(m_u) - 2 * np.sum(np.log(np.abs(np.diag(S_u)))))
    dense = total - kl
    ours = bound_draws(guide, params, K, R)
    se = np.sqrt(ours.var(ddof=1) / R + dense.var(ddof=1) / R)
    assert abs(ours.mean() - dense.mean()) < z_threshold() * se, (ours.mean(), dense.mean(), se)


def two_layers(X, y=None):
    """A latent input, an inner layer, the last layer."""
    with numpyro.plate("data", X.shape[0]):
        h = dgp.latent_input("w", X, 1)
    g = dgp.gp_layer("g", h, dgp.kernels.RBF(lengthscale=0.8), inducing_inputs=jnp.asarray([[-1.0, 0.5], [0.5, -1.0]]))
    f = dgp.gp_layer("f", g, dgp.kernels.RBF(), inducing_inputs=jnp.asarray([[-1.0], [1.0]]))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)


@pytest.mark.stochastic
def test_a_point_s_draws_through_an_inner_layer_are_joint():
    """Between the latent input and the last layer, a point's K draws share the inducing values:
    their covariance across k is the layer's full covariance at the K inputs."""
    X = jnp.asarray([[0.2]])
    model = two_layers
    guide = dgp.guides.AutoFactorizedDGP(model, inner_init="prior")
    y = jnp.asarray([0.3])
    params = {**initial_params(model, guide, X, y), "w_auto_loc": jnp.zeros((1, 1)),
              "w_auto_scale": jnp.full((1, 1), 1e-9)}  # w = 0, for every k

    def draw(key):
        run = marginal_trace(model, guide, params, key, (X, y), {}, objective="ImportanceWeightedElbo",
                             importance=ImportanceDraws(2))
        return run.model_trace["g"]["value"][:, 0, 0]  # (K,): the inner layer at the same input twice

    draws = np.asarray(jax.vmap(draw)(jax.random.split(jax.random.PRNGKey(1), 4000)))
    # the same input: jointly drawn, the two draws coincide up to the jitter's spread
    assert np.abs(draws[:, 0] - draws[:, 1]).max() < 1e-2
    assert draws[:, 0].std() > 0.1  # and they do vary over keys


def test_predict_draws_new_points_latents_from_the_prior():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (200, 1))
    y = rng.choice([-1.0, 1.0], 200) * (0.5 + X[:, 0] ** 2) + 0.05 * rng.normal(size=200)

    def model(X, y=None):
        data = numpyro.plate("data", X.shape[0])
        with data:
            features = X if y is None else jnp.concatenate([X, y[:, None]], -1)
            h = dgp.latent_input("w", X, 1, encoder_input=features)
        f = dgp.gp_layer("f", h, dgp.kernels.RBF(), num_inducing=20)
        noise = numpyro.param("noise", 0.1, constraint=dist.constraints.positive)
        with data:
            numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model, latent_inputs="amortized", latent_hidden_width=16)
    svi = SVI(model, guide, numpyro.optim.Adam(0.02), dgp.ImportanceWeightedElbo(8))
    result = dgp.fit(svi, jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y), num_steps=800, progress_bar=False)
    assert result.num_skipped == 0
    Xs = jnp.asarray([[-0.6], [0.6]])
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), Xs, num_samples=300)
    # the conditional density has two modes, at +-(0.5 + x^2) = +-0.86, and less mass between them,
    # where a unimodal predictive (a GP on x alone) has its peak
    modes = np.asarray(dgp.log_likelihood(pred, jnp.asarray([0.86, -0.86])))
    middle = np.asarray(dgp.log_likelihood(pred, jnp.asarray([0.0, 0.0])))
    assert np.all(modes > middle + 0.2), (modes, middle)
    # one point, fewer points than inducing points, and windows
    assert dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), Xs[:1], num_samples=4).mean.shape == (1,)
    windowed = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), jnp.linspace(-1, 1, 7)[:, None],
                           num_samples=4, batch_size=3)
    assert windowed.mean.shape == (7,) and np.all(np.isfinite(windowed.mean))


def test_dgp_elbo_takes_the_latent_kl_in_closed_form():
    X, y = jnp.asarray(X_TOY), jnp.asarray(Y_TOY)
    guide = dgp.guides.AutoFactorizedDGP(toy)
    params = initial_params(toy, guide, X, y)
    loc, scale = np.array([[0.3], [-0.2]]), np.array([[0.5], [2.0]])
    params = {**params, "w_auto_loc": jnp.asarray(loc), "w_auto_scale": jnp.asarray(scale)}
    parts = dgp.DGPElbo().components(jax.random.PRNGKey(0), params, toy, guide, X, y)
    no_latent = {**params, "w_auto_loc": jnp.zeros((2, 1)), "w_auto_scale": jnp.ones((2, 1))}
    kl_u = float(dgp.DGPElbo().components(jax.random.PRNGKey(0), no_latent, toy, guide, X, y)["kl_inducing"])
    kl_w = np.sum(-np.log(scale) + 0.5 * (scale**2 + loc**2 - 1))
    np.testing.assert_allclose(float(parts["kl_inducing"]) - kl_u, kl_w, rtol=1e-10)


def test_latent_inputs_are_refused_where_they_cannot_work():
    X, y = jnp.asarray(X_TOY), jnp.asarray(Y_TOY)
    # outside the data plate
    with pytest.raises(ValueError, match="call it inside the data plate"):
        numpyro.handlers.seed(lambda: dgp.latent_input("w", X), 0)()
    with pytest.raises(ValueError, match=r"X must have shape \(2, dim\)"):
        numpyro.handlers.seed(lambda: _in_plate(lambda: dgp.latent_input("w", X[:1])), 0)()
    with pytest.raises(ValueError, match="latent_dim must be a positive integer"):
        numpyro.handlers.seed(lambda: _in_plate(lambda: dgp.latent_input("w", X, 0)), 0)()
    with pytest.raises(ValueError, match=r"encoder_input must have shape \(2, features\)"):
        numpyro.handlers.seed(lambda: _in_plate(lambda: dgp.latent_input("w", X, encoder_input=X[:1])), 0)()
    # the guide's q(w) lives in the model's run: NumPyro's Trace_ELBO cannot score it
    guide = dgp.guides.AutoFactorizedDGP(toy)
    svi = SVI(toy, guide, numpyro.optim.Adam(0.01), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), X, y)
    with pytest.raises(NotImplementedError, match=r"q\(w\) is evaluated inside the model's run"):
        svi.update(state, X, y)
    # the importance-weighted bound takes independent layers without handlers
    chain = dgp.guides.AutoChainDGP(two_layers)
    params = initial_params(two_layers, chain, X, y)
    with pytest.raises(ValueError, match="importance-weighted bound takes independent Gaussian layers"):
        dgp.ImportanceWeightedElbo(2).loss(jax.random.PRNGKey(0), params, two_layers, chain, X, y)
    quadrature = dgp.handlers.quadrature(toy, num_points=3)
    guide = dgp.guides.AutoFactorizedDGP(quadrature)
    params = initial_params(quadrature, guide, X, y)
    with pytest.raises(ValueError, match="importance-weighted bound takes independent Gaussian layers"):
        dgp.ImportanceWeightedElbo(2).loss(jax.random.PRNGKey(0), params, quadrature, guide, X, y)
    flow = dgp.handlers.sde_flow(flow_then_layer, "flow", T=1.0, num_steps=2)
    guide = dgp.guides.AutoFactorizedDGP(flow)
    params = initial_params(flow, guide, X, y)
    with pytest.raises(ValueError, match=r"layer 'flow' is an SDE flow"):
        dgp.ImportanceWeightedElbo(2).loss(jax.random.PRNGKey(0), params, flow, guide, X, y)
    for bad in (dict(num_importance=0), dict(num_particles=0)):
        with pytest.raises(ValueError, match="must be a positive integer"):
            dgp.ImportanceWeightedElbo(**bad)
    with pytest.raises(ValueError, match="latent_inputs must be one of"):
        dgp.guides.AutoFactorizedDGP(toy, latent_inputs="free")


def flow_then_layer(X, y=None):
    """A latent input, a layer as wide as its input (an SDE flow under the handler), the last layer."""
    with numpyro.plate("data", X.shape[0]):
        h = dgp.latent_input("w", X, 1)
    g = dgp.gp_layer("flow", h, dgp.kernels.RBF(), num_inducing=2, out_dim=2)
    f = dgp.gp_layer("f", g, dgp.kernels.RBF(), num_inducing=2)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)


def test_sites_scaled_differently_cannot_share_the_importance_average():
    # two observations of the same latent, one under a scale handler: the per-point average
    # of their joint likelihood has no single plate scale
    def model(X, y=None):
        with numpyro.plate("data", X.shape[0]):
            h = dgp.latent_input("w", X, 1)
        f = dgp.gp_layer("f", h, dgp.kernels.RBF(), num_inducing=2, out_dim=2)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)
            with numpyro.handlers.scale(scale=3.0):
                numpyro.sample("y2", dist.Normal(f[..., 1], 0.1), obs=y)

    X, y = jnp.asarray(X_TOY), jnp.asarray(Y_TOY)
    guide = dgp.guides.AutoFactorizedDGP(model)
    params = initial_params(model, guide, X, y)
    with pytest.raises(ValueError, match=r"depend on the latent inputs are scaled differently \({'y': 1.0, 'y2': 3.0}\)"):
        dgp.ImportanceWeightedElbo(2).loss(jax.random.PRNGKey(0), params, model, guide, X, y)


def test_a_guide_without_q_w_cannot_importance_weight():
    X, y = jnp.asarray(X_TOY), jnp.asarray(Y_TOY)
    guide = numpyro.infer.autoguide.AutoDelta(toy)
    params = initial_params(toy, guide, X, y, Trace_ELBO())
    with pytest.raises(ValueError, match=r"gives no Gaussian q\(w\)"):
        dgp.ImportanceWeightedElbo(2).loss(jax.random.PRNGKey(0), params, toy, guide, X, y)


def test_latent_inputs_beside_other_local_latents_are_refused():
    def model(X, y=None):
        with numpyro.plate("data", X.shape[0]):
            h = dgp.latent_input("w", X, 1)
            numpyro.sample("other", dist.Normal(0, 1))
        f = dgp.gp_layer("f", h, dgp.kernels.RBF(), num_inducing=2)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model)
    with pytest.raises(ValueError, match=r"other local latent sites \['other'\]"):
        guide.setup(jax.random.PRNGKey(0), jnp.asarray(X_TOY), jnp.asarray(Y_TOY))


def initial_params(model, guide, X, y, loss=None):
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), loss or dgp.DGPElbo())
    return svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))


def _in_plate(fn):
    with numpyro.plate("data", 2):
        return fn()
