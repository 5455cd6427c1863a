"""SDE flows (DiffGP): the Euler–Maruyama core and the ``sde_flow`` handler.

Known answers: T = 0 is the SVGP on top; a linear drift without diffusion is the ODE
``x' = a x`` (first-order convergence to ``exp(a T) x0``); zero drift with constant
diffusion gives ``Var[x_T - x_0] = sigma^2 T``; the marginal estimator with ``S = 0`` is
the ancestral estimator given ``u = m``; a time-dependent field equals a hand-written loop.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import Trace_ELBO

import numpyro_dgp as dgp
from numpyro_dgp._engine.run import marginal_trace
from numpyro_dgp.core import euler_maruyama
from numpyro_dgp.guides import AutoChainDGP, AutoFactorizedDGP
from numpyro_dgp.handlers import exact_layers, sde_flow
from numpyro_dgp.kernels import RBF, Linear
from numpyro_dgp.layers import layer_moments
from numpyro_dgp.models import diffgp
from tests._mc import z_threshold

NOISE = 0.05


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = jnp.asarray(rng.uniform(-1, 1, (12, 2)))
    y = jnp.asarray(np.sin(3 * np.asarray(X[:, 0])) + 0.1 * rng.randn(12))
    return X, y


def init_params(model, guide, X, y, **kwargs):
    svi = numpyro.infer.SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    return svi.get_params(svi.init(jax.random.PRNGKey(0), X, y, **kwargs))


# --- the numerical core ---


def test_linear_ode_converges_at_first_order():
    a, T = -1.3, 2.0
    x0 = jnp.array([[0.7, -1.1]])
    errors = []
    for K in (20, 40, 80, 160):
        xT = euler_maruyama(lambda x, t: (a * x, jnp.zeros_like(x)), x0, T, K, jax.random.PRNGKey(0), diffusion=False)
        # Euler's exact iterate, and the distance to the ODE solution
        np.testing.assert_allclose(xT, (1 + a * T / K) ** K * x0, rtol=1e-12)
        errors.append(float(jnp.max(jnp.abs(xT - jnp.exp(a * T) * x0))))
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    np.testing.assert_allclose(ratios, 2.0, atol=0.1)  # halving dt halves the error


@pytest.mark.stochastic
def test_constant_diffusion_end_variance_is_sigma2_T():
    sigma2, T, n = 0.3, 2.5, 40_000
    x0 = jnp.zeros((n, 2))
    xT = euler_maruyama(lambda x, t: (jnp.zeros_like(x), jnp.full_like(x, sigma2)), x0, T, 10, jax.random.PRNGKey(1))
    v = np.asarray(xT).ravel()
    se = sigma2 * T * np.sqrt(2.0 / (v.size - 1))  # standard error of a Gaussian sample variance
    z = z_threshold(2)
    assert abs(v.var() - sigma2 * T) < z * se
    assert abs(v.mean()) < z * np.sqrt(sigma2 * T / v.size)


def test_zero_time_is_the_identity_with_finite_gradients():
    x0 = jnp.array([[0.3, 0.2], [-1.0, 2.0]])

    def end(scale):
        return euler_maruyama(lambda x, t: (scale * x, scale * jnp.ones_like(x)), x0, 0.0, 5, jax.random.PRNGKey(2)).sum()

    assert float(end(1.0)) == float(x0.sum())
    assert np.isfinite(float(jax.grad(end)(1.0)))


def test_record_and_fresh_noise_per_step_and_element():
    x0 = jnp.zeros((3, 2))
    xT, path = euler_maruyama(lambda x, t: (jnp.zeros_like(x), jnp.ones_like(x)), x0, 1.0, 4,
                              jax.random.PRNGKey(3), record=True)
    assert path.shape == (5, 3, 2)
    np.testing.assert_array_equal(path[0], x0)
    np.testing.assert_array_equal(path[-1], xT)
    increments = np.asarray(jnp.diff(path, axis=0)).ravel()
    assert len(np.unique(increments)) == increments.size  # independent draws everywhere
    with pytest.raises(ValueError, match="num_steps"):
        euler_maruyama(lambda x, t: (x, x), x0, 1.0, 0, jax.random.PRNGKey(0))


# --- the handler ---


def svgp_model(X, y=None):
    f = dgp.gp_layer("g", X, RBF(), num_inducing=5)
    noise = numpyro.param("noise", jnp.asarray(NOISE))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


def test_zero_flow_time_is_the_svgp(data):
    X, y = data
    flow_model = diffgp(0.0, num_inducing=5, noise_init=NOISE)
    flow_guide = AutoFactorizedDGP(flow_model)
    params = init_params(flow_model, flow_guide, X, y)
    rng = np.random.RandomState(1)
    params = {k: (v + 0.2 * jnp.asarray(rng.randn(*v.shape)) if k.endswith("_loc") else v) for k, v in params.items()}
    svgp_guide = AutoFactorizedDGP(svgp_model)
    init_params(svgp_model, svgp_guide, X, y)
    svgp_params = {k: v for k, v in params.items() if k.startswith("g.") or k == "noise"}
    key = jax.random.PRNGKey(4)
    # compiled: eager op-by-op tracing of the models is far slower
    ours = jax.jit(lambda p: dgp.DGPElbo().components(key, p, flow_model, flow_guide, X, y))(params)
    ref = jax.jit(lambda p: dgp.DGPElbo().components(key, p, svgp_model, svgp_guide, X, y))(svgp_params)
    np.testing.assert_allclose(ours["expected_log_likelihood"], ref["expected_log_likelihood"], rtol=1e-12)
    # the flow's own KL is the only difference
    flow_loc = params["flow.u_auto_loc"]
    flow_tril = params["flow.u_auto_scale_tril"]
    flow_kl = dgp.core.gauss_kl(flow_loc, flow_tril)
    np.testing.assert_allclose(ours["kl_inducing"], ref["kl_inducing"] + flow_kl, rtol=1e-12)
    p_flow = dgp.predict(flow_model, flow_guide, params, key, X, num_samples=3)
    p_svgp = dgp.predict(svgp_model, svgp_guide, svgp_params, key, X, num_samples=3)
    np.testing.assert_allclose(p_flow.mean, p_svgp.mean, rtol=1e-12)
    np.testing.assert_allclose(p_flow.variance, p_svgp.variance, rtol=1e-12)


def linear_flow_model(T, num_steps, diffusion=False):
    """A 1-D flow whose drift is exactly linear: a Linear kernel with one inducing point at 1."""

    def model(X, y=None):
        h = dgp.gp_layer("flow", X, Linear(variance=2.0), inducing_inputs=jnp.ones((1, 1)), mean="zero")
        f = dgp.gp_layer("g", h, RBF(), num_inducing=3)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)

    return sde_flow(model, "flow", T=T, num_steps=num_steps, diffusion=diffusion)


def test_handler_ode_with_linear_drift_matches_the_analytic_solution():
    X = jnp.array([[0.5], [-1.5], [2.0]])
    y = jnp.zeros(3)
    T, c = 1.5, -0.4
    errors = []
    for K in (20, 40):
        model = linear_flow_model(T, K)
        guide = AutoFactorizedDGP(model)
        params = init_params(model, guide, X, y)
        params = {**params, "flow.u_auto_loc": jnp.full((1, 1), c), "flow.u_auto_scale_tril": jnp.zeros((1, 1, 1))}
        # whitened drift: k(x, z) L^-T v = 2 x / sqrt(2 + 2 jitter) * c (the jitter is relative to k(z, z) = 2)
        a = 2.0 * c / np.sqrt(2.0 * (1 + dgp.core.default_jitter(jnp.float64)))
        paths = dgp.sde.flow_trajectories(model, guide, params, jax.random.PRNGKey(0), X, num_samples=2)
        xT = paths[:, -1]
        np.testing.assert_allclose(xT[0], xT[1], rtol=0, atol=0)  # no diffusion: deterministic
        np.testing.assert_allclose(xT[0], (1 + a * T / K) ** K * X, rtol=1e-10)
        errors.append(float(jnp.max(jnp.abs(xT[0] - jnp.exp(a * T) * X))))
    np.testing.assert_allclose(errors[0] / errors[1], 2.0, atol=0.1)  # first order in dt


@pytest.mark.stochastic
def test_handler_prior_field_diffuses_with_variance_sigma2_T(data):
    X, y = data
    sigma2, T = 0.04, 3.0
    model = diffgp(T, num_steps=8, num_inducing=5, flow_kernel=RBF(variance=sigma2, lengthscale=0.5))
    guide = AutoFactorizedDGP(model)
    params = init_params(model, guide, X, y)
    # q(u_f) = p(u_f) (whitened N(0, I)): drift 0 and marginal variance k(x, x) = sigma2 everywhere
    params = {**params, "flow.u_auto_loc": jnp.zeros_like(params["flow.u_auto_loc"]),
              "flow.u_auto_scale_tril": jnp.broadcast_to(jnp.eye(5), params["flow.u_auto_scale_tril"].shape)}
    paths = dgp.sde.flow_trajectories(model, guide, params, jax.random.PRNGKey(5), X, num_samples=2000)
    assert paths.shape == (2000, 9, 12, 2)
    moved = np.asarray(paths[:, -1] - X[None]).ravel()
    se = sigma2 * T * np.sqrt(2.0 / (moved.size - 1))
    z = z_threshold(2)
    assert abs(moved.var() - sigma2 * T) < z * se
    assert abs(moved.mean()) < z * np.sqrt(sigma2 * T / moved.size)


def perturbed(model, guide, X, y, scale=0.5):
    params = init_params(model, guide, X, y)
    rng = np.random.RandomState(2)
    out = {}
    for k, v in params.items():
        if k.endswith("_loc"):
            v = v + scale * jnp.asarray(rng.randn(*v.shape))
        out[k] = v
    return out


def test_marginal_estimator_with_zero_covariance_is_the_ancestral_one(data):
    X, y = data
    marginal = diffgp(2.0, num_steps=6, num_inducing=5, flow_kernel=RBF(variance=0.3))
    ancestral = diffgp(2.0, num_steps=6, num_inducing=5, flow_kernel=RBF(variance=0.3), estimator="ancestral")
    guide = AutoFactorizedDGP(marginal)
    params = perturbed(marginal, guide, X, y)
    params["flow.u_auto_scale_tril"] = jnp.zeros_like(params["flow.u_auto_scale_tril"])  # u = m exactly
    key = jax.random.PRNGKey(6)
    a = dgp.sde.flow_trajectories(marginal, guide, params, key, X, num_samples=3)
    b = dgp.sde.flow_trajectories(ancestral, guide, params, key, X, num_samples=3)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    # with a real covariance the two path laws differ
    params["flow.u_auto_scale_tril"] = 0.7 * jnp.broadcast_to(jnp.eye(5), params["flow.u_auto_scale_tril"].shape)
    a = dgp.sde.flow_trajectories(marginal, guide, params, key, X, num_samples=3)
    b = dgp.sde.flow_trajectories(ancestral, guide, params, key, X, num_samples=3)
    assert float(jnp.max(jnp.abs(a - b))) > 1e-3


def test_marginal_flow_is_a_hand_written_euler_maruyama_loop(data):
    """The handler's path equals a loop over layer_moments with the guide's Gaussian, including
    a time-dependent field whose last input column is the current time."""
    X, y = data
    T, K = 1.2, 5
    times = jnp.linspace(0.0, T, 3)
    Zf = dgp.sde.temporal_inducing_inputs(X, 4, times)
    assert Zf.shape == (12, 3)
    model = diffgp(T, num_steps=K, flow_kernel=RBF(variance=0.5, lengthscale=jnp.array([0.7, 0.9, 0.4])),
                   num_inducing=5, flow_inducing_inputs=Zf, time_input=True)
    guide = AutoFactorizedDGP(model)
    params = perturbed(model, guide, X, y)
    params["flow.u_auto_scale_tril"] = 0.3 * jnp.broadcast_to(jnp.eye(12), params["flow.u_auto_scale_tril"].shape)
    key = jax.random.PRNGKey(7)
    paths = dgp.sde.flow_trajectories(model, guide, params, key, X, num_samples=1)[0]

    # the reference: the same random numbers, the layer evaluated at [x_k, t_k]
    run = marginal_trace(sde_flow(model.fn, **{**model.spec._asdict(), "record": True}), guide, params,
                         jax.random.split(key, 1)[0], (X,), {}, 3)
    msg = run.model_trace["flow.layer"]
    layer = msg["args"][0]
    q = run.posteriors["flow.u"]
    noise_keys = jax.random.split(msg["kwargs"]["rng_key"], K)
    dt = T / K
    x = X
    for k in range(K):
        inp = jnp.concatenate([x, jnp.full((x.shape[0], 1), k * dt)], axis=-1)
        mean, var = layer_moments(layer, inp, q[0], q[1])
        x = x + mean * dt + jnp.sqrt(var) * np.sqrt(dt) * jax.random.normal(noise_keys[k], x.shape)
        np.testing.assert_allclose(paths[k + 1], x, rtol=1e-10, atol=1e-12)
    # the time column matters: the same loop with the clock stuck at t = 0 ends elsewhere
    x0 = X
    for k in range(K):
        mean, var = layer_moments(layer, jnp.concatenate([x0, jnp.zeros((x0.shape[0], 1))], axis=-1), q[0], q[1])
        x0 = x0 + mean * dt + jnp.sqrt(var) * np.sqrt(dt) * jax.random.normal(noise_keys[k], x0.shape)
    assert float(jnp.max(jnp.abs(x0 - paths[-1]))) > 1e-3


@pytest.mark.stochastic
def test_dgp_elbo_and_trace_elbo_agree_for_the_ancestral_flow(data):
    """With the ancestral estimator both objectives target the same bound: DGPElbo only
    marginalizes the predictor's inducing values."""
    X, y = data
    model = diffgp(1.0, num_steps=4, num_inducing=5, flow_kernel=RBF(variance=0.3), estimator="ancestral",
                   noise_init=0.1)
    guide = AutoFactorizedDGP(model, inner_init="prior")
    params = perturbed(model, guide, X, y, scale=0.3)
    keys = jax.random.split(jax.random.PRNGKey(8), 2000)

    def estimates(elbo):
        return -np.asarray(jax.jit(jax.vmap(lambda k: elbo.loss(k, params, model, guide, X, y)))(keys))

    ours, theirs = estimates(dgp.DGPElbo()), estimates(Trace_ELBO())
    se = np.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < z_threshold() * se, (ours.mean(), theirs.mean(), se)
    assert ours.var() < theirs.var()


@pytest.mark.stochastic
def test_fit_predict_and_classification(data):
    X, y = data
    model = diffgp(2.0, num_steps=5, num_inducing=5)
    guide = AutoFactorizedDGP(model)
    svi = numpyro.infer.SVI(model, guide, numpyro.optim.Adam(0.02), dgp.DGPElbo(num_particles=2))
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=200, progress_bar=False, chunk_size=100)
    assert result.num_skipped == 0
    assert result.losses[-20:].mean() < result.losses[:20].mean()
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), X, num_samples=7)
    assert pred.mean.shape == (12,) and pred.layers["flow"].shape == (7, 12, 2)
    np.testing.assert_array_equal(pred.layer_variances["flow"], 0.0)
    assert np.all(np.isfinite(pred.variance)) and np.all(pred.variance > 0)

    labels = (y > 0).astype(jnp.float64)
    clf = diffgp(1.0, num_steps=4, num_inducing=5, likelihood="probit")
    clf_guide = AutoFactorizedDGP(clf)
    clf_params = init_params(clf, clf_guide, X, labels)  # (fitting a classifier: tutorial 05)
    pred = dgp.predict(clf, clf_guide, clf_params, jax.random.PRNGKey(1), X, num_samples=5)
    assert pred.likelihood == "bernoulli"
    assert np.all((pred.mean > 0) & (pred.mean < 1))


def test_minibatched_flow_model(data):
    X, y = data
    model = diffgp(1.0, num_steps=3, num_inducing=5)
    guide = AutoFactorizedDGP(model)
    params = init_params(model, guide, X, y, batch_size=8)
    loss = dgp.DGPElbo().loss(jax.random.PRNGKey(0), params, model, guide, X, y, batch_size=8)
    assert np.isfinite(float(loss))


def test_errors(data):
    X, y = data
    with pytest.raises(ValueError, match="T must be finite and >= 0"):
        sde_flow(svgp_model, "g", T=-1.0)
    with pytest.raises(ValueError, match="estimator"):
        sde_flow(svgp_model, "g", estimator="exact")
    with pytest.raises(ValueError, match="num_steps"):
        sde_flow(svgp_model, "g", num_steps=0)
    with pytest.raises(ValueError, match="layer must be"):
        sde_flow(svgp_model, None)
    seeded = numpyro.handlers.seed(sde_flow(svgp_model, "nope"), 0)
    with pytest.raises(ValueError, match="no gp_layer named 'nope'"):
        seeded(X, y)
    # the flow layer must map D -> D
    with pytest.raises(ValueError, match="out_dim equal to the state width 2"):
        numpyro.handlers.seed(sde_flow(svgp_model, "g"), 0)(X, y)

    def last_is_flow(X, y=None):
        h = dgp.gp_layer("flow", X, RBF(), num_inducing=4, out_dim=2)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(h[..., 0], 0.1), obs=y)

    model = sde_flow(last_is_flow, "flow")
    guide = AutoFactorizedDGP(model)
    params = init_params(model, guide, X, y)  # sampling u: a valid model, but no quadrature on a flow
    with pytest.raises(ValueError, match="a gp_layer must follow it"):
        dgp.DGPElbo().loss(jax.random.PRNGKey(0), params, model, guide, X, y)

    flow = diffgp(1.0, num_inducing=4)
    with pytest.raises(NotImplementedError, match="exact_layers"):
        numpyro.handlers.seed(exact_layers(flow), 0)(X, y)
    chain = AutoChainDGP(flow)
    params = init_params(flow, chain, X, y)
    with pytest.raises(NotImplementedError, match="correlates layers"):
        dgp.DGPElbo().loss(jax.random.PRNGKey(0), params, flow, chain, X, y)
    with pytest.raises(ValueError, match="flow_inducing_inputs"):
        diffgp(1.0, time_input=True)
    with pytest.raises(NotImplementedError, match="likelihood"):
        diffgp(1.0, likelihood="nope")
    with pytest.raises(TypeError, match="sde_flow-wrapped"):
        dgp.sde.flow_trajectories(svgp_model, None, {}, jax.random.PRNGKey(0), X)
