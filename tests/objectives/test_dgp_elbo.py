"""DGPElbo against exact GP identities, NumPyro's own estimators and dense references."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from scipy.stats import multivariate_normal

import numpyro_dgp as dgp
from numpyro_dgp.models import deep_gp_regression
from tests._mc import paired_difference_and_se, z_threshold

RELATIVE_JITTER = 1e-8  # the layer's jitter, relative to its kernel variance (1.3) ...
JITTER = RELATIVE_JITTER * 1.3  # ... so K(Z, Z) gets this


NOISE = 0.05


def rbf(A, B, variance=1.3, lengthscale=0.4):
    d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
    return variance * np.exp(-0.5 * d2 / lengthscale**2)


def one_layer_model(X, y=None, batch_size=None, whiten=True, inducing_inputs=None):
    data = numpyro.plate("data", X.shape[0], subsample_size=batch_size)
    with data:
        Xb = numpyro.subsample(X, event_dim=1)
        yb = None if y is None else numpyro.subsample(y, event_dim=0)
    f = dgp.gp_layer(
        "f", Xb, dgp.kernels.RBF(variance=1.3, lengthscale=0.4),
        inducing_inputs=X if inducing_inputs is None else inducing_inputs,
        jitter=RELATIVE_JITTER, whiten=whiten,
    )
    noise = numpyro.param("noise", NOISE, constraint=dist.constraints.positive)
    with data:
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=yb)


def two_layer_model(X, y=None):
    h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=7, out_dim=2, mean="identity")
    f = dgp.gp_layer("h2", h, dgp.kernels.Matern52(), num_inducing=6, out_dim=1)
    noise = numpyro.param("noise", 0.1, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


@pytest.fixture(scope="module")
def data1d():
    rng = np.random.RandomState(0)
    X = np.sort(rng.uniform(-2, 2, 15))[:, None]
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.randn(15)
    return jnp.asarray(X), jnp.asarray(y)


def init_params(model, guide, X, y, **kw):
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    return svi.get_params(svi.init(jax.random.PRNGKey(0), X, y, **kw))


def titsias_bound(X, y, Z, s2):
    Knn = rbf(X, X)
    Kmm = rbf(Z, Z) + JITTER * np.eye(len(Z))
    Kmn = rbf(Z, X)
    Qnn = Kmn.T @ np.linalg.solve(Kmm, Kmn)
    N = len(y)
    return (multivariate_normal(np.zeros(N), Qnn + s2 * np.eye(N)).logpdf(y)
            - np.trace(Knn - Qnn) / (2 * s2))


def optimal_whitened_q(X, y, s2):
    """q(v) maximizing the whitened SVGP bound with Z = X: the exact posterior of v."""
    Kmm = rbf(X, X) + JITTER * np.eye(len(X))
    L = np.linalg.cholesky(Kmm)
    A = np.linalg.solve(L, rbf(X, X))  # L^{-1} Kmn
    S = np.linalg.inv(np.eye(len(X)) + A @ A.T / s2)
    m = S @ A @ y / s2
    return m, np.linalg.cholesky(S)


def elbo_value(params, model, guide, X, y, key=0, **kw):
    return -float(dgp.DGPElbo().loss(jax.random.PRNGKey(key), params, model, guide, X, y, **kw))


def dense_marginals(X, Z, m, S_chol):
    Kmm = rbf(Z, Z) + JITTER * np.eye(len(Z))
    L = np.linalg.cholesky(Kmm)
    A = np.linalg.solve(L, rbf(Z, X))
    mean = A.T @ m
    S = S_chol @ S_chol.T
    var = np.diag(rbf(X, X)) - (A**2).sum(0) + np.einsum("mn,mk,kn->n", A, S, A)
    return mean, var


def random_q(rng, M, scale=0.3):
    m = rng.randn(M)
    S = np.tril(scale * rng.randn(M, M), -1) + np.diag(rng.uniform(0.1, 0.5, M))
    return m, S


def perturbed_two_layer(X, y, inner_init="deterministic"):
    guide = dgp.guides.AutoFactorizedDGP(two_layer_model, inner_init=inner_init)
    params = init_params(two_layer_model, guide, X, y)
    rng = np.random.RandomState(7)
    out = dict(params)
    for k in ("h1.u_auto_loc", "h2.u_auto_loc"):
        out[k] = params[k] + 0.3 * jnp.asarray(rng.randn(*params[k].shape))
    out["h1.u_auto_scale_tril"] = 0.2 * jnp.broadcast_to(jnp.eye(7), (2, 7, 7))
    return guide, out


def estimates(elbo, params, guide, X, y, n=3000, seed=8):
    keys = jax.random.split(jax.random.PRNGKey(seed), n)
    return -np.asarray(jax.jit(jax.vmap(lambda k: elbo.loss(k, params, two_layer_model, guide, X, y)))(keys))


@pytest.fixture(scope="module")
def two_layer_estimates(data1d):
    """ELBO draws at one perturbed two-layer q, computed once per estimator (each
    ``jit(vmap(loss))`` compiles anew, so the estimators are shared between the tests)."""
    X, y = data1d
    guide, params = perturbed_two_layer(X, y)
    cache = {}

    def get(name, n=3000):
        if (name, n) not in cache:
            elbo = {"DGPElbo": dgp.DGPElbo(), "DGPElbo8": dgp.DGPElbo(num_particles=8),
                    "Trace_ELBO": Trace_ELBO(), "TraceMeanField_ELBO": TraceMeanField_ELBO()}[name]
            cache[name, n] = estimates(elbo, params, guide, X, y, n=n)
        return cache[name, n]

    return get


def _toy(N=40, D=2, seed_=0):
    rs = np.random.RandomState(seed_)
    X = rs.uniform(-1, 1, (N, D))
    y = np.sin(2 * X[:, 0]) + 0.1 * rs.randn(N)
    return jnp.asarray(X), jnp.asarray(y)




@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = np.sort(rng.uniform(-1, 1, 30))[:, None]
    y = np.where(X[:, 0] > 0, 1.0, -1.0) + 0.05 * rng.randn(30)
    return jnp.asarray(X), jnp.asarray(y)


def test_svgp_optimum_equals_exact_marginal_likelihood(data1d):
    X, y = data1d
    guide = dgp.guides.AutoFactorizedDGP(one_layer_model)
    params = init_params(one_layer_model, guide, X, y)
    m, S_chol = optimal_whitened_q(np.asarray(X), np.asarray(y), NOISE)
    params = {**params, "f.u_auto_loc": jnp.asarray(m)[None], "f.u_auto_scale_tril": jnp.asarray(S_chol)[None]}
    best = elbo_value(params, one_layer_model, guide, X, y)
    # the maximized uncollapsed bound is Titsias' collapsed bound ...
    np.testing.assert_allclose(best, titsias_bound(np.asarray(X), np.asarray(y), np.asarray(X), NOISE), rtol=0, atol=1e-7)
    # ... which, with Z = X, is the exact GP log marginal likelihood
    exact = multivariate_normal(np.zeros(len(y)), rbf(np.asarray(X), np.asarray(X)) + NOISE * np.eye(len(y))).logpdf(np.asarray(y))
    assert abs(best - exact) < 1e-3
    # and any other q gives a lower ELBO
    rng = np.random.RandomState(1)
    for _ in range(10):
        dm = 0.05 * rng.randn(*m.shape)
        dS = np.tril(0.05 * rng.randn(*S_chol.shape))
        other = {**params, "f.u_auto_loc": jnp.asarray(m + dm)[None], "f.u_auto_scale_tril": jnp.asarray(S_chol + dS)[None]}
        assert elbo_value(other, one_layer_model, guide, X, y) < best


def test_svi_reaches_the_exact_marginal_likelihood(data1d):
    X, y = data1d
    guide = dgp.guides.AutoFactorizedDGP(one_layer_model)
    # only q is learned; hyperparameters, Z (= X) and the noise stay at their initial values
    labels = lambda p: {k: ("train" if "u_auto" in k else "freeze") for k in p}  # noqa: E731
    schedule = optax.exponential_decay(0.05, transition_steps=500, decay_rate=0.5)
    optimizer = optax.multi_transform({"train": optax.adam(schedule), "freeze": optax.set_to_zero()}, labels)
    svi = SVI(one_layer_model, guide, numpyro.optim.optax_to_numpyro(optimizer), dgp.DGPElbo())
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=4000, progress_bar=False)
    exact = multivariate_normal(np.zeros(len(y)), rbf(np.asarray(X), np.asarray(X)) + NOISE * np.eye(len(y))).logpdf(np.asarray(y))
    final = elbo_value(result.params, one_layer_model, guide, X, y)
    assert final <= exact + 1e-6
    assert exact - final < 1e-3


@pytest.mark.stochastic
def test_expected_log_likelihood_closed_form_and_monte_carlo(data1d):
    X, y = data1d
    Z = np.asarray(X)[::2]
    model = lambda X, y=None: one_layer_model(X, y, inducing_inputs=jnp.asarray(Z))  # noqa: E731
    guide = dgp.guides.AutoFactorizedDGP(model)
    params = init_params(model, guide, X, y)
    m, S = random_q(np.random.RandomState(2), len(Z))
    params = {**params, "f.u_auto_loc": jnp.asarray(m)[None], "f.u_auto_scale_tril": jnp.asarray(S)[None]}
    ell = float(dgp.DGPElbo().components(jax.random.PRNGKey(0), params, model, guide, X, y)["expected_log_likelihood"])
    mean, var = dense_marginals(np.asarray(X), Z, m, S)
    yy = np.asarray(y)
    closed = np.sum(-0.5 * np.log(2 * np.pi * NOISE) - 0.5 * ((yy - mean) ** 2 + var) / NOISE)
    np.testing.assert_allclose(ell, closed, rtol=1e-10)
    rng = np.random.RandomState(3)
    f = mean + np.sqrt(var) * rng.randn(200_000, len(yy))
    per_draw = np.sum(-0.5 * np.log(2 * np.pi * NOISE) - 0.5 * (yy - f) ** 2 / NOISE, axis=1)
    se = per_draw.std() / np.sqrt(len(per_draw))
    assert abs(per_draw.mean() - ell) < z_threshold() * se


@pytest.mark.stochastic
def test_minibatch_elbo_is_unbiased(data1d):
    X, y = data1d
    guide = dgp.guides.AutoFactorizedDGP(one_layer_model)
    params = init_params(one_layer_model, guide, X, y)
    m, S = random_q(np.random.RandomState(4), X.shape[0])
    params = {**params, "f.u_auto_loc": jnp.asarray(m)[None], "f.u_auto_scale_tril": jnp.asarray(S)[None]}
    full = elbo_value(params, one_layer_model, guide, X, y)
    keys = jax.random.split(jax.random.PRNGKey(5), 4000)
    mini = -jax.jit(jax.vmap(lambda k: dgp.DGPElbo().loss(k, params, one_layer_model, guide, X, y, batch_size=4)))(keys)
    mini = np.asarray(mini)
    se = mini.std() / np.sqrt(len(mini))
    assert mini.std() > 0  # the minibatch estimate really is random
    assert abs(mini.mean() - full) < z_threshold() * se


def test_whitened_and_unwhitened_give_the_same_elbo(data1d):
    X, y = data1d
    Z = np.asarray(X)[::2]
    models = {w: (lambda X, y=None, w=w: one_layer_model(X, y, whiten=w, inducing_inputs=jnp.asarray(Z))) for w in (True, False)}
    m_v, S_v = random_q(np.random.RandomState(6), len(Z))
    L = np.linalg.cholesky(rbf(Z, Z) + JITTER * np.eye(len(Z)))
    q = {True: (m_v, S_v), False: (L @ m_v, L @ S_v)}  # u = L v
    values = {}
    for w, model in models.items():
        guide = dgp.guides.AutoFactorizedDGP(model)
        params = init_params(model, guide, X, y)
        params = {**params, "f.u_auto_loc": jnp.asarray(q[w][0])[None], "f.u_auto_scale_tril": jnp.asarray(q[w][1])[None]}
        values[w] = elbo_value(params, model, guide, X, y)
    np.testing.assert_allclose(values[True], values[False], rtol=1e-8)


@pytest.mark.parametrize("other", ["Trace_ELBO", "TraceMeanField_ELBO"])
@pytest.mark.stochastic
def test_dgp_elbo_agrees_with_numpyro_elbos_in_expectation(two_layer_estimates, other):
    ours = two_layer_estimates("DGPElbo")
    theirs = two_layer_estimates(other)
    diff, se = paired_difference_and_se(ours, theirs)  # the same keys: paired draws
    assert abs(diff) < z_threshold() * se, (ours.mean(), theirs.mean(), se)
    # analytic marginalization of u and quadrature at the output: lower variance
    assert ours.var() < theirs.var()


@pytest.mark.stochastic
def test_variance_ratio_is_large(two_layer_estimates):
    ours = two_layer_estimates("DGPElbo")
    theirs = two_layer_estimates("Trace_ELBO")
    assert theirs.var() / ours.var() > 3.0


@pytest.mark.stochastic
def test_num_particles_averages(two_layer_estimates):
    one = two_layer_estimates("DGPElbo")
    eight = two_layer_estimates("DGPElbo8", n=1000)
    # different numbers of keys split from one key: independent draws
    assert abs(one.mean() - eight.mean()) < z_threshold() * np.sqrt(one.var() / len(one) + eight.var() / len(eight))
    assert eight.var() < one.var() / 3


@pytest.mark.stochastic
def test_hyperparameter_priors_are_latent_sites_covered_by_the_guide(data1d):
    X, y = data1d

    def model(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=5,
                         priors={"lengthscale": dist.LogNormal(0.0, 0.5)})
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.3), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model)
    params = init_params(model, guide, X, y)
    assert any(k.startswith("f.kernel.lengthscale") for k in params) and "f.kernel.lengthscale" not in params
    assert "f.kernel.variance" in params  # no prior: still a param
    keys = jax.random.split(jax.random.PRNGKey(9), 3000)
    ours = -np.asarray(jax.jit(jax.vmap(lambda k: dgp.DGPElbo().loss(k, params, model, guide, X, y)))(keys))
    theirs = -np.asarray(jax.jit(jax.vmap(lambda k: Trace_ELBO().loss(k, params, model, guide, X, y)))(keys))
    diff, se = paired_difference_and_se(ours, theirs)  # the same keys: paired draws
    assert abs(diff) < z_threshold() * se
    post = guide.sample_posterior(jax.random.PRNGKey(0), params, X, sample_shape=(3,))
    assert post["f.kernel.lengthscale"].shape == (3, 1) and post["f.u"].shape == (3, 1, 5)
    # a fresh guide (new session) set up on the training data predicts with the same params
    fresh = dgp.guides.AutoFactorizedDGP(model).setup(jax.random.PRNGKey(3), X, y)
    a = dgp.predict(model, guide, params, jax.random.PRNGKey(4), X, num_samples=3)
    b = dgp.predict(model, fresh, params, jax.random.PRNGKey(4), X, num_samples=3)
    np.testing.assert_array_equal(a.mean, b.mean)


def test_guide_initialization_conventions(data1d):
    X, y = data1d
    for inner_init, inner_scale in (("deterministic", 1e-5), ("prior", 1.0)):
        guide = dgp.guides.AutoFactorizedDGP(two_layer_model, inner_init=inner_init)
        params = init_params(two_layer_model, guide, X, y)
        np.testing.assert_allclose(params["h1.u_auto_scale_tril"], inner_scale * np.broadcast_to(np.eye(7), (2, 7, 7)), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(params["h2.u_auto_scale_tril"], np.eye(6)[None], rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(params["h1.u_auto_loc"], 0.0)


@pytest.mark.stochastic
def test_median_and_quantiles(data1d):
    X, y = data1d
    guide, params = perturbed_two_layer(X, y)
    med = guide.median(params)
    q = guide.quantiles(params, [0.5, 0.8413447460685429])
    np.testing.assert_allclose(q["h1.u"][0], med["h1.u"], atol=1e-12)
    std = np.sqrt(np.sum(np.asarray(params["h1.u_auto_scale_tril"]) ** 2, -1))
    np.testing.assert_allclose(q["h1.u"][1], np.asarray(med["h1.u"]) + std, rtol=1e-8)
    draws = guide.sample_posterior(jax.random.PRNGKey(1), params, X, sample_shape=(4000,))
    assert draws["h1.u"].shape == (4000, 2, 7)
    # the sample sd of n Gaussian draws has standard error sd / sqrt(2 n); one comparison per element
    np.testing.assert_array_less(np.abs(np.asarray(draws["h1.u"]).std(0) - std),
                                 z_threshold(std.size) * std / np.sqrt(2 * 4000))


def test_dgp_elbo_step_has_no_sequential_shuffle():
    # NumPyro's CPU subsample is a lax.scan of Fisher-Yates swaps (a `scan` in the jaxpr);
    # DGPElbo's step draws the minibatch with fast_subsample instead. The same check on
    # Trace_ELBO shows the check can see the loop.
    X, y = _toy()
    model = deep_gp_regression(2, num_inducing=4, hidden_width=2)
    guide = dgp.guides.AutoFactorizedDGP(model)
    for loss, expect_loop in [(dgp.DGPElbo(), False), (Trace_ELBO(), True)]:
        svi = SVI(model, guide, numpyro.optim.Adam(0.01), loss)
        state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=10)
        jaxpr = str(jax.make_jaxpr(lambda s: svi.update(s, X, y, batch_size=10))(state))
        assert ("scan[" in jaxpr or "while[" in jaxpr) == expect_loop, type(loss).__name__


def test_dgp_elbo_checks_arguments_eagerly_and_skips_the_checks_only_while_tracing():
    import numpyro.distributions as dist
    from numpyro.distributions import distribution as dist_module

    X, y = _toy(N=12, D=1)
    seen = []
    noise_scale = {"value": 0.1}

    def model(X, y=None):
        seen.append(dist_module._VALIDATION_ENABLED)
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=4)
        numpyro.sample("y", dist.Normal(f[:, 0], noise_scale["value"]), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y)
    params = svi.get_params(state)
    elbo = dgp.DGPElbo()
    key = jax.random.PRNGKey(1)

    seen.clear()
    eager = elbo.loss(key, params, model, guide, X, y)
    assert seen and all(seen)  # eager: NumPyro's checks on
    seen.clear()
    jitted = jax.jit(lambda p: elbo.loss(key, p, model, guide, X, y))(params)
    assert seen and not any(seen)  # traced: off
    assert dist_module._VALIDATION_ENABLED  # and restored afterwards
    np.testing.assert_allclose(jitted, eager, rtol=1e-10)

    noise_scale["value"] = -1.0  # an invalid constant argument is still caught eagerly
    with pytest.raises(ValueError, match="Normal distribution got invalid scale"):
        elbo.loss(key, params, model, guide, X, y)


@pytest.mark.stochastic
def test_dgp_elbo_with_a_bernoulli_likelihood_uses_quadrature(data):
    """Gauss-Hermite expectation of a non-Gaussian likelihood against Monte Carlo."""
    X, y = data
    labels = (y > 0).astype(jnp.float64)

    def classifier(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), inducing_inputs=X[::5])
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=3 * f[..., 0]), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(classifier)
    svi = SVI(classifier, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, labels))
    params = {**params, "f.u_auto_loc": params["f.u_auto_loc"] + 0.7}
    ours = float(dgp.DGPElbo().components(jax.random.PRNGKey(0), params, classifier, guide, X, labels)["expected_log_likelihood"])
    keys = jax.random.split(jax.random.PRNGKey(1), 4000)
    tr = jax.vmap(lambda k: -Trace_ELBO().loss(k, params, classifier, guide, X, labels))(keys)
    kl = float(dgp.core.gauss_kl(params["f.u_auto_loc"], params["f.u_auto_scale_tril"]))
    mc = np.asarray(tr) + kl  # Trace_ELBO = E log p(y|f) - KL (KL estimated by sampling: add the exact one back in expectation)
    assert abs(mc.mean() - ours) < z_threshold() * mc.std() / np.sqrt(len(mc))


@pytest.mark.parametrize("first_whiten", [True, False])
def test_each_inducing_site_in_a_model_with_locations_has_the_kl_against_its_own_prior(first_whiten):
    """A global layer (whitened or not) before an inducing-locations layer: every site's KL is
    against the prior its model site states (N(0, I) whitened, N(0, K) not; N(mean(Z), K) for
    the locations layer), here read off the sites and solved with their factors; the objective
    whitens with each layer's own L^{-1} instead."""
    from numpyro import handlers

    from numpyro_dgp._engine.run import layers_by_u_site, site_posterior
    from numpyro_dgp.objectives._dsvi import inducing_kl
    from numpyro_dgp.posteriors import gaussian_parameters

    def model(X, y=None):
        h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=6, out_dim=2, whiten=first_whiten)
        f, _ = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=5, inducing="locations")
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.3), obs=y)

    rs = np.random.RandomState(11)
    X, y = jnp.asarray(rs.randn(30, 2)), jnp.asarray(rs.randn(30))
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
    # away from q(u) = p(u), where every KL is zero
    params = {k: v + 0.2 * jnp.asarray(rs.randn(*v.shape)) if k.endswith("u_auto_loc") else v for k, v in params.items()}
    guide_tr = handlers.trace(handlers.seed(handlers.substitute(guide, params), 1)).get_trace(X, y)
    model_tr = handlers.trace(handlers.replay(handlers.seed(handlers.substitute(model, params), 2), guide_tr)).get_trace(X, y)
    layers = layers_by_u_site(model_tr)
    for name in ("h1.u", "h2.u"):
        layer = layers[name]
        shape = (layer.out_dim, layer.inducing_inputs.shape[0])
        p_loc, p_scale = gaussian_parameters(model_tr[name]["fn"], shape)
        q_loc, q_scale = site_posterior(guide_tr[name], shape, structured=False)
        expected = dgp.core.gauss_kl(q_loc - p_loc, q_scale, p_scale[0])  # triangular solves
        got = inducing_kl(name, model_tr[name], guide_tr[name], layers, True, {})
        assert float(got) == pytest.approx(float(expected), rel=1e-9), name
    whitened_prior = gaussian_parameters(model_tr["h1.u"]["fn"], (2, 6))[1][0]
    assert np.allclose(whitened_prior, np.eye(6)) == first_whiten  # the case this test is about
