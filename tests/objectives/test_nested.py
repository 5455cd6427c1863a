"""NestedCompressionElbo: the SVGP bound at one layer, the exact marginal likelihood above it at
two, its defining expectation by Monte Carlo, minibatch scaling, predictions and refusals."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoDelta, AutoNormal

import numpyro_dgp as dgp
from numpyro_dgp import core
from numpyro_dgp.guides import AutoChainDGP, AutoFactorizedDGP
from tests._two_devices import run_on_two_devices

NOISE = 0.1


def one_layer(X, y=None, batch_size=None, mean="zero", whiten=True):
    data = numpyro.plate("data", X.shape[0], subsample_size=batch_size)
    with data:
        Xb = numpyro.subsample(X, event_dim=1)
        yb = None if y is None else numpyro.subsample(y, event_dim=0)
    f = dgp.gp_layer("f", Xb, dgp.kernels.RBF(variance=1.2, lengthscale=0.7), num_inducing=6, mean=mean, whiten=whiten)
    noise = numpyro.param("noise", NOISE, constraint=dist.constraints.positive)
    with data:
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=yb)


def deep(X, y=None, batch_size=None, widths=(2,), noises=(0.05,), means=("identity",), last_noise=None,
         likelihood="normal"):
    data = numpyro.plate("data", X.shape[0], subsample_size=batch_size)
    with data:
        h = numpyro.subsample(X, event_dim=1)
        yb = None if y is None else numpyro.subsample(y, event_dim=0)
    for i, (width, noise, mean) in enumerate(zip(widths, noises, means)):
        h = dgp.gp_layer(f"h{i + 1}", h, dgp.kernels.RBF(), num_inducing=6, out_dim=width, mean=mean, noise=noise)
    f = dgp.gp_layer("f", h, dgp.kernels.RBF(), num_inducing=5, noise=last_noise)
    noise = numpyro.param("noise", NOISE, constraint=dist.constraints.positive)
    with data:
        if likelihood == "normal":
            numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=yb)
        else:
            numpyro.sample("y", dist.Bernoulli(logits=f[..., 0]), obs=yb)


@pytest.fixture(scope="module")
def data():
    rs = np.random.RandomState(0)
    X = rs.uniform(-2, 2, (20, 2))
    y = np.sin(1.5 * X[:, 0]) * np.cos(X[:, 1]) + 0.1 * rs.randn(20)
    return jnp.asarray(X), jnp.asarray(y)


def _params(model, guide, X, y, seed=0, perturb=0.3, **kw):
    """Initial parameters with the guide's means and factors moved off their start."""
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = dict(svi.get_params(svi.init(jax.random.PRNGKey(0), X, y, **kw)))
    rs = np.random.RandomState(seed)
    for k, v in params.items():
        if k.endswith(("_loc", "_scale_tril", "_scale")):
            bump = perturb * rs.randn(*v.shape)
            params[k] = v + (bump if k.endswith("_loc") else np.abs(bump) * (np.tril(np.ones(v.shape[-2:])) if v.ndim == 3 else 1))
    return params


def _bound(params, model, guide, *args, nvc=None, **kw):
    nvc = nvc or dgp.NestedCompressionElbo()
    return -float(nvc.loss(jax.random.PRNGKey(0), params, model, guide, *args, **kw))


@pytest.mark.parametrize("guide_cls,mean,whiten", [
    (AutoFactorizedDGP, "zero", True), (AutoFactorizedDGP, "linear", False), (AutoNormal, "identity", True),
])
def test_one_layer_equals_the_svgp_bound_of_dgpelbo(data, guide_cls, mean, whiten):
    X, y = data
    guide = guide_cls(one_layer)
    params = _params(one_layer, guide, X, y, mean=mean, whiten=whiten)
    svgp = -float(dgp.DGPElbo().loss(jax.random.PRNGKey(0), params, one_layer, guide, X, y, mean=mean, whiten=whiten))
    for propagate in (True, False):
        nvc = dgp.NestedCompressionElbo(propagate_inducing_variance=propagate)
        assert abs(_bound(params, one_layer, guide, X, y, nvc=nvc, mean=mean, whiten=whiten) - svgp) < 1e-8 * abs(svgp)
    # minibatches: the same indices for both (the same key), the same N / B scaling
    key = jax.random.PRNGKey(3)
    a = dgp.DGPElbo().loss(key, params, one_layer, guide, X, y, batch_size=7, mean=mean, whiten=whiten)
    b = dgp.NestedCompressionElbo().loss(key, params, one_layer, guide, X, y, batch_size=7, mean=mean, whiten=whiten)
    assert abs(float(a - b)) < 1e-8 * abs(float(a))


# --- two layers with a one-dimensional hidden layer ----------------------------------------

K1 = dgp.kernels.RBF(variance=1.0, lengthscale=0.8)
K2 = dgp.kernels.RBF(variance=0.8, lengthscale=1.2)
LIK_VAR = 0.1
X3 = jnp.array([[-1.0], [0.2], [1.1]])
Y3 = jnp.array([0.5, -0.3, 0.8])


def tiny(X, y=None):
    Z = jnp.linspace(-1.5, 1.5, 4)[:, None]
    h = dgp.gp_layer("h1", X, K1, inducing_inputs=Z, noise=0.05, learn_hyperparameters=False, learn_inducing=False)
    f = dgp.gp_layer("f", h, K2, inducing_inputs=Z, learn_hyperparameters=False, learn_inducing=False)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(LIK_VAR)), obs=y)


def exact_log_marginal(hidden_noise, num_nodes=40):
    """log p(y) of the exact two-layer DGP with a noisy hidden layer, by a tensor-product
    Gauss-Hermite rule over the three hidden values: h ~ N(0, K1 + noise I), y | h ~ N(0, K2(h) + s^2 I)."""
    N = X3.shape[0]
    L1 = np.linalg.cholesky(np.asarray(K1(X3)) + hidden_noise * np.eye(N))
    nodes, weights = core.gauss_hermite(num_nodes)
    grid = np.array(list(itertools.product(nodes, repeat=N))) @ L1.T  # (G, N)
    log_w = np.log(np.prod(np.array(list(itertools.product(weights, repeat=N))), axis=1))
    C = np.asarray(jax.vmap(lambda h: K2(h[:, None]))(jnp.asarray(grid))) + LIK_VAR * np.eye(N)
    _, logdet = np.linalg.slogdet(C)
    quad = np.einsum("gn,gn->g", np.linalg.solve(C, np.broadcast_to(np.asarray(Y3), grid.shape)[..., None])[..., 0],
                     np.broadcast_to(np.asarray(Y3), grid.shape))
    log_lik = -0.5 * (N * np.log(2 * np.pi) + logdet + quad)
    top = np.max(log_w + log_lik)
    return top + np.log(np.sum(np.exp(log_w + log_lik - top)))


@pytest.fixture(scope="module")
def tiny_fits():
    """Both NVC variants fitted on the tiny problem (q, the hidden noise)."""
    out = {}
    for propagate in (True, False):
        nvc = dgp.NestedCompressionElbo(propagate_inducing_variance=propagate)
        guide = AutoFactorizedDGP(tiny, inner_init="prior")
        svi = SVI(tiny, guide, numpyro.optim.Adam(0.02), nvc)
        result = dgp.fit(svi, jax.random.PRNGKey(0), X3, Y3, num_steps=800, progress_bar=False)
        out[propagate] = (nvc, guide, result.params)
    return out


@pytest.mark.parametrize("propagate", [True, False])
def test_two_layer_bound_is_below_the_exact_log_marginal_likelihood(tiny_fits, propagate):
    nvc, guide, params = tiny_fits[propagate]
    hidden_noise = float(params["h1.noise"])
    exact = exact_log_marginal(hidden_noise)
    assert abs(exact - exact_log_marginal(hidden_noise, 30)) < 1e-3  # the rule has converged
    bound = _bound(params, tiny, guide, X3, Y3, nvc=nvc)
    assert bound <= exact
    assert bound > exact - 5.0  # and a fitted bound is not vacuous


def _q(params, site, M):
    loc = np.asarray(params[f"{site}.u_auto_loc"])
    tril = np.asarray(params[f"{site}.u_auto_scale_tril"])
    return loc, tril


@pytest.mark.parametrize("propagate", [True, False])
@pytest.mark.stochastic
def test_two_layer_bound_equals_its_defining_expectation_by_monte_carlo(tiny_fits, propagate):
    """The bound is ``E[sum_n log N(y_n | k2(h_n, Z) K2^-1 u_2, s^2) - (k2(h_n, h_n) - q2(h_n)) / (2 s^2)]
    - (beta_1 / 2) sum_n (k1 - q1)(x_n) - KL_1 - KL_2`` over ``u_1, u_2 ~ q`` and ``h_n ~ N(A_n u_1,
    noise)`` (inducing variance propagated) or ``h_n ~ N(A_n m_1, noise)`` with the inducing
    variance paid as ``(beta_1 / 2) sum_n A_n S_1 A_n^T`` (penalized)."""
    nvc, guide, params = tiny_fits[propagate]
    Z = np.linspace(-1.5, 1.5, 4)[:, None]
    X = np.asarray(X3)
    noise = float(params["h1.noise"])
    L1 = np.linalg.cholesky(np.asarray(K1(Z)) + 1e-6 * np.eye(4))
    L2 = np.linalg.cholesky(np.asarray(K2(Z)) + 1e-6 * np.eye(4))
    (m1, S1), (m2, S2) = _q(params, "h1", 4), _q(params, "f", 4)
    A1 = np.linalg.solve(L1, np.asarray(K1(Z, X))).T  # (N, M): whitened projection
    cond1 = np.asarray(K1.diag(X)) - np.sum(A1**2, 1)
    rs = np.random.RandomState(11)
    S = 200_000
    v1 = m1[0][None] + rs.randn(S, 4) @ S1[0].T
    v2 = m2[0][None] + rs.randn(S, 4) @ S2[0].T
    if propagate:
        h = v1 @ A1.T + np.sqrt(noise) * rs.randn(S, 3)
        extra = 0.0
    else:
        h = np.broadcast_to(A1 @ m1[0], (S, 3)) + np.sqrt(noise) * rs.randn(S, 3)
        extra = np.sum((A1 @ S1[0]) ** 2) / (2 * noise)
    A2 = np.linalg.solve(L2, np.asarray(jax.vmap(lambda hs: K2(Z, hs[:, None]))(jnp.asarray(h))).transpose(1, 0, 2)
                         .reshape(4, -1)).reshape(4, S, 3)  # (M, S, N)
    f_mean = np.einsum("msn,sm->sn", A2, v2)
    cond2 = K2.variance - np.sum(A2**2, 0)
    y = np.asarray(Y3)
    terms = np.sum(-0.5 * np.log(2 * np.pi * LIK_VAR) - 0.5 * (y - f_mean) ** 2 / LIK_VAR - cond2 / (2 * LIK_VAR), axis=1)
    kl = float(core.gauss_kl(m1, S1) + core.gauss_kl(m2, S2))
    expected = terms.mean() - np.sum(cond1) / (2 * noise) - extra - kl
    se = terms.std() / np.sqrt(S)
    bound = _bound(params, tiny, guide, X3, Y3, nvc=nvc)
    assert abs(bound - expected) < 5 * se, (bound, expected, se)  # one comparison: above z = 4


def test_three_layers_assemble_the_core_moments(data):
    """The bound of a 3-layer chain (a linear mean on the layer with uncertain inputs) from
    uncertain_input_moments by hand: forwarded Gaussians, penalties, the last layer's term."""
    X, y = data
    kw = {"widths": (2, 1), "noises": (0.05, 0.02), "means": ("identity", "linear")}
    guide = AutoFactorizedDGP(deep)
    params = _params(deep, guide, X, y, **kw)
    nvc = dgp.NestedCompressionElbo()
    tr = numpyro.handlers.trace(numpyro.handlers.seed(numpyro.handlers.substitute(deep, params), 0)).get_trace(X, y, **kw)
    layers = {s["args"][0].name: s["args"][0] for s in tr.values() if s["type"] == "dgp_layer"}
    mean, var = np.asarray(X), None
    total = 0.0
    for name in ("h1", "h2", "f"):
        layer = layers[name]
        q = (params[f"{name}.u_auto_loc"], params[f"{name}.u_auto_scale_tril"])
        W, b = layer.mean_affine if var is not None else (None, None)
        last = name == "f"
        parts = core.uncertain_input_moments(layer.kernel, layer.inducing_inputs, layer.Kmm_chol, *q, mean, var,
                                             mean_weight=W, mean_bias=b)
        m = parts.mean + (layer.mean_fn(jnp.asarray(mean)) if var is None else 0.0)
        if last:
            v = parts.inducing_var + parts.input_var + parts.conditional_var[:, None]
            s2 = float(params["noise"])
            total += np.sum(-0.5 * np.log(2 * np.pi * s2) - ((np.asarray(y)[:, None] - m) ** 2 + v) / (2 * s2))
        else:
            noise = float(layer.noise)
            total -= (np.sum(parts.input_var) + layer.out_dim * np.sum(parts.conditional_var)) / (2 * noise)
            mean, var = np.asarray(m), np.asarray(parts.inducing_var) + noise
        total -= float(core.gauss_kl(*q))
    np.testing.assert_allclose(_bound(params, deep, guide, X, y, nvc=nvc, **kw), total, rtol=1e-10)


def test_minibatch_terms_are_scaled_by_n_over_b(data):
    X, y = data
    kw = {"widths": (2,), "noises": (0.05,), "means": ("identity",)}
    guide = AutoFactorizedDGP(deep)
    params = _params(deep, guide, X, y, **kw)
    idx = jnp.array([3, 11, 0, 17, 8])
    nvc = dgp.NestedCompressionElbo()
    key = jax.random.PRNGKey(0)
    fixed = numpyro.handlers.substitute(deep, data={"data": idx})
    batch = nvc.components(key, params, fixed, guide, X, y, batch_size=5, **kw)
    subset = nvc.components(key, params, deep, guide, X[idx], y[idx], **kw)
    scale = X.shape[0] / 5
    np.testing.assert_allclose(batch["expected_log_likelihood"], scale * subset["expected_log_likelihood"], rtol=1e-10)
    np.testing.assert_allclose(batch["inner_penalty"], scale * subset["inner_penalty"], rtol=1e-10)
    np.testing.assert_allclose(batch["kl_inducing"], subset["kl_inducing"], rtol=1e-12)
    assert float(batch["inner_penalty"]) > 0


@pytest.mark.parametrize("propagate", [True, False])
def test_gradient_is_the_same_eagerly_and_compiled(data, propagate):
    """Outside ``jit``, ``jax.grad`` traces the model with tracers that ``jnp.asarray`` copies;
    the layers must still see the previous layer's output (it was refused before)."""
    X, y = data
    kw = {"widths": (2,), "noises": (0.05,), "means": ("identity",)}
    guide = AutoFactorizedDGP(deep)
    params = _params(deep, guide, X, y, **kw)
    nvc = dgp.NestedCompressionElbo(propagate_inducing_variance=propagate)

    def loss(p):
        return nvc.loss(jax.random.PRNGKey(0), p, deep, guide, X, y, **kw)

    eager, compiled = jax.grad(loss)(params), jax.jit(jax.grad(loss))(params)
    for k in params:
        np.testing.assert_allclose(eager[k], compiled[k], rtol=1e-9, atol=1e-12 * float(jnp.max(jnp.abs(compiled[k]))))
    assert any(float(jnp.max(jnp.abs(eager[k]))) > 0 for k in params)


@pytest.mark.stochastic
def test_fit_predict_and_moment_matching(data):
    X, y = data
    kw = {"widths": (2,), "noises": (0.05,), "means": ("identity",)}
    model = lambda X, y=None, batch_size=None: deep(X, y, batch_size, **kw)  # noqa: E731
    guide = AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.NestedCompressionElbo())
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=200, batch_size=10, progress_bar=False)
    assert result.num_skipped == 0 and np.mean(result.losses[-20:]) < np.mean(result.losses[:20])
    X_new = X[:4]
    matched = dgp.predict_moment_matched(model, guide, result.params, X_new)
    assert matched.component_means.shape == (1, 4)
    # the hidden layer's marginal at fixed inputs is Gaussian, so moment matching the output
    # layer is exact: the sampled predictive converges to it
    S = 20_000
    sampled = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), X_new, num_samples=S)
    cm, cv = np.asarray(sampled.component_means), np.asarray(sampled.component_variances)
    se_mean = cm.std(0) / np.sqrt(S)
    np.testing.assert_array_less(np.abs(np.asarray(matched.mean) - cm.mean(0)), 5 * se_mean)
    second = cv + cm**2
    se_var = second.std(0) / np.sqrt(S) + 2 * np.abs(cm.mean(0)) * se_mean
    # 8 comparisons: 5 standard errors is above their Bonferroni z of 4.37 (false alarm < 1e-4)
    np.testing.assert_array_less(np.abs(np.asarray(matched.variance) - sampled.variance), 5 * se_var)


def test_one_layer_moment_matching_equals_predict(data):
    X, y = data
    guide = AutoFactorizedDGP(one_layer)
    params = _params(one_layer, guide, X, y)
    sampled = dgp.predict(one_layer, guide, params, jax.random.PRNGKey(0), X[:5], num_samples=3)
    matched = dgp.predict_moment_matched(one_layer, guide, params, X[:5])
    np.testing.assert_allclose(matched.mean, sampled.mean, rtol=1e-10)
    np.testing.assert_allclose(matched.variance, sampled.variance, rtol=1e-10)


# --- refusals --------------------------------------------------------------------------------


def _loss(model, guide, X, y, nvc=None, **kw):
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), nvc or dgp.NestedCompressionElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y, **kw)
    return svi.evaluate(state, X, y, **kw)


@pytest.mark.parametrize("case,match", [
    ("no inner noise", "has no output noise"),
    ("last layer noise", "is the last layer and has output noise"),
    ("bernoulli", "Gaussian likelihood only"),
    ("callable mean", "callable mean function"),
])
def test_refuses_models_it_cannot_bound_exactly(data, case, match):
    X, y = data
    kw = {"widths": (2,), "noises": (0.05,), "means": ("identity",)}
    if case == "no inner noise":
        kw["noises"] = (None,)
    elif case == "last layer noise":
        kw["last_noise"] = 0.01
    elif case == "bernoulli":
        kw["likelihood"] = "bernoulli"
        y = (y > 0).astype(y.dtype)
    elif case == "callable mean":
        kw = {"widths": (2, 2), "noises": (0.05, 0.05), "means": ("identity", lambda A: jnp.tanh(A))}
    with pytest.raises((NotImplementedError, ValueError), match=match):
        _loss(deep, AutoFactorizedDGP(deep), X, y, **kw)


def test_refuses_guides_and_layers_it_cannot_use(data):
    X, y = data
    kw = {"widths": (2,), "noises": (0.05,), "means": ("identity",)}
    with pytest.raises(NotImplementedError, match="correlates layers.*use DGPElbo"):
        _loss(deep, AutoChainDGP(deep), X, y, **kw)
    with pytest.raises(NotImplementedError, match="with AutoDelta: .*no per-layer Gaussian guide"):
        _loss(deep, AutoDelta(deep), X, y, **kw)

    def locations(X, y=None):
        h, hz = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=5, out_dim=2, inducing="locations", noise=0.05)
        f, _ = dgp.gp_layer("f", (h, hz), dgp.kernels.RBF(), inducing="locations")
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.3), obs=y)

    with pytest.raises(NotImplementedError, match="inducing='locations'"):
        _loss(locations, AutoFactorizedDGP(locations), X, y)

    def not_a_chain(X, y=None):
        h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=5, out_dim=2, noise=0.05, mean="identity")
        f = dgp.gp_layer("f", jnp.tanh(h), dgp.kernels.RBF(), num_inducing=5)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.3), obs=y)

    with pytest.raises(NotImplementedError, match="previous layer's output"):
        _loss(not_a_chain, AutoFactorizedDGP(not_a_chain), X, y)
    flow = dgp.models.diffgp(1.0, num_steps=2, num_inducing=5)
    with pytest.raises(NotImplementedError, match="sde_flow"):
        _loss(flow, AutoFactorizedDGP(flow), X, y)


_DATA_PARALLEL_SCRIPT = """
model = dgp.models.deep_gp_regression(2, num_inducing=8, hidden_width=3, inner_noise=0.05)
guide = dgp.guides.AutoFactorizedDGP(model)
out = {}
for propagate in (True, False):
    nvc = dgp.NestedCompressionElbo(propagate_inducing_variance=propagate)
    one = SVI(model, guide, numpyro.optim.Adam(0.01), nvc)
    two = SVI(data_parallel(model), guide, numpyro.optim.Adam(0.01), nvc)
    params = one.get_params(one.init(jax.random.PRNGKey(0), X, y, batch_size=32))
    two.init(jax.random.PRNGKey(0), X, y, batch_size=32)
    f = lambda svi: jax.jit(jax.value_and_grad(lambda p, k: svi.loss.loss(k, p, svi.model, svi.guide, X, y, batch_size=32)))
    (l1, g1), (l2, g2) = f(one)(params, jax.random.PRNGKey(5)), f(two)(params, jax.random.PRNGKey(5))
    eager = jax.grad(lambda p: two.loss.loss(jax.random.PRNGKey(5), p, two.model, guide, X, y, batch_size=32))(params)
    out[str(propagate)] = [float(abs(l1 - l2) / abs(l1)), gradient_difference(g1, g2), gradient_difference(g1, eager)]
print(json.dumps(out))
"""


@pytest.mark.slow  # a subprocess on two host devices compiles both variants twice: about a minute
def test_data_parallel_bound_equals_single_device_on_two_cpu_devices():
    out = run_on_two_devices(_DATA_PARALLEL_SCRIPT)
    for loss_diff, grad_diff, eager_diff in out.values():
        assert loss_diff < 1e-10 and grad_diff < 1e-8 and eager_diff < 1e-8, out


_PARTS = {"expected_log_likelihood": 5.0, "importance_weighted_log_likelihood": 4.0, "inner_penalty": 0.5,
          "kl_inducing": 2.0, "other": 0.25, "log_predictive": 3.0, "log_marginal": 7.0}


@pytest.mark.parametrize("objective, value", [
    (dgp.DGPElbo(), 5.0 - 2.0 + 0.25), (dgp.DGPElbo(num_particles=3), 5.0 - 2.0 + 0.25),
    (dgp.ImportanceWeightedElbo(num_particles=2), 4.0 - 2.0 + 0.25),
    (dgp.NestedCompressionElbo(), 5.0 - 0.5 - 2.0 + 0.25),
    (dgp.PredictiveObjective(beta=0.5), 3.0 - 0.5 * (2.0 - 0.25)), (dgp.CollapsedSparseGP(), 7.0 + 0.25)])
def test_every_objective_is_the_negative_combination_of_its_components(objective, value, monkeypatch):
    """The loss NumPyro reads is minus the objective's combination of its named parts, the same on
    every particle; the model's arguments reach ``components`` unchanged."""
    calls = []

    def components(self, key, *args, **kwargs):
        calls.append((args, kwargs))
        return {name: jnp.asarray(part) for name, part in _PARTS.items()}

    monkeypatch.setattr(type(objective), "components", components)
    loss = objective.loss_with_mutable_state(jax.random.PRNGKey(0), "params", "model", "guide", 1, y=2)
    assert loss["mutable_state"] is None
    np.testing.assert_allclose(loss["loss"], -value, rtol=1e-12)
    assert calls and all(call == (("params", "model", "guide", 1), {"y": 2}) for call in calls)
