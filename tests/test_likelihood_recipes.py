"""The likelihood recipes of numpyro_dgp.likelihoods: DGPElbo's expected log-likelihood against
dense references (closed forms to 1e-8 and better; quadrature rules applied exactly; Monte Carlo
within its standard error), and predict / metrics for every kind of observation site."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI
from scipy import integrate
from scipy.special import gammaln, logsumexp
from scipy.special import softmax as np_softmax
from scipy.stats import norm, poisson
from scipy.stats import t as student

import numpyro_dgp as dgp
from numpyro_dgp import likelihoods
from tests._mc import z_threshold

jax.config.update("jax_enable_x64", True)

N, M, VARIANCE, LENGTHSCALE = 6, 4, 1.3, 0.6
RELATIVE_JITTER = 1e-6  # the layers' float64 default, relative to the kernel variance


def rbf(A, B):
    A, B = np.asarray(A) / LENGTHSCALE, np.asarray(B) / LENGTHSCALE
    return VARIANCE * np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1))


@pytest.fixture(scope="module")
def X():
    return jnp.asarray(np.linspace(-1.0, 1.0, N)[:, None])


Z = np.linspace(-1.2, 1.2, M)[:, None]


def one_layer(observe, out_dim):
    """A one-layer model ``y ~ observe(f)`` with fixed kernel and inducing inputs."""

    def model(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(variance=VARIANCE, lengthscale=LENGTHSCALE), inducing_inputs=Z,
                         out_dim=out_dim, learn_inducing=False, learn_hyperparameters=False)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", observe(f), obs=y)

    model.observe = observe
    return model


def params_for(model, X, y, out_dim, seed=0, spread=1.0):
    """The guide set up and given a random ``q(u)`` per output (whitened; ``spread`` scales its
    factor: below 1, the narrower marginals of a fitted model)."""
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
    rng = np.random.RandomState(seed)
    loc = 0.8 * rng.randn(out_dim, M)
    tril = spread * (np.tril(0.3 * rng.randn(out_dim, M, M), -1) + np.stack([np.diag(0.2 + 0.5 * rng.rand(M))] * out_dim))
    params = {**params, "f.u_auto_loc": jnp.asarray(loc), "f.u_auto_scale_tril": jnp.asarray(tril)}
    return guide, params


def dense_moments(params, X):
    """``(mean, var)``, each ``(N, P)``: the whitened sparse GP's marginal at ``X`` per output."""
    L = np.linalg.cholesky(rbf(Z, Z) + RELATIVE_JITTER * VARIANCE * np.eye(M))
    A = np.linalg.solve(L, rbf(Z, np.asarray(X)))  # (M, N)
    loc, tril = np.asarray(params["f.u_auto_loc"]), np.asarray(params["f.u_auto_scale_tril"])
    mean = (loc @ A).T
    var = VARIANCE - (A**2).sum(0)[:, None] + np.stack([((S.T @ A) ** 2).sum(0) for S in tril], axis=1)
    return mean, var


def gauss_hermite_expectation(g, m, v, num):
    """``E[g(f)]``, ``f ~ N(m, v)`` elementwise, with ``num`` Gauss-Hermite nodes (NumPy)."""
    x, w = np.polynomial.hermite_e.hermegauss(num)
    w = w / w.sum()
    return (w * g(np.asarray(m)[..., None] + np.sqrt(np.asarray(v))[..., None] * x)).sum(-1)


def ell(model, guide, params, X, y, key=0, **kwargs):
    parts = dgp.DGPElbo(**kwargs).components(jax.random.PRNGKey(key), params, model, guide, X, jnp.asarray(y))
    return float(parts["expected_log_likelihood"])


# ---------------------------------------------------------------- closed forms


def test_poisson_expected_log_likelihood_is_the_closed_form(X):
    counts = np.array([0, 1, 3, 0, 2, 7])
    model = one_layer(likelihoods.poisson, 1)
    guide, params = params_for(model, X, counts, 1)
    m, v = dense_moments(params, X)
    m, v = m[:, 0], v[:, 0]
    closed = counts * m - np.exp(m + v / 2) - gammaln(counts + 1)
    # the closed form is the Gaussian expectation of the Poisson log-density (200 nodes: exact here)
    reference = gauss_hermite_expectation(lambda f: poisson.logpmf(counts[:, None], np.exp(f)), m, v, 200)
    np.testing.assert_allclose(closed, reference, rtol=1e-10)
    np.testing.assert_allclose(ell(model, guide, params, X, counts), closed.sum(), rtol=1e-10)
    # exposure multiplies the rate
    exposed = one_layer(lambda f: likelihoods.poisson(f, exposure=2.5), 1)
    np.testing.assert_allclose(ell(exposed, guide, params, X, counts), (closed + counts * np.log(2.5)).sum()
                               - ((2.5 - 1) * np.exp(m + v / 2)).sum(), rtol=1e-10)


def test_heteroscedastic_expected_log_likelihood_is_the_closed_form(X):
    y = np.array([0.3, -1.2, 0.5, 2.0, -0.1, 0.9])
    model = one_layer(likelihoods.heteroscedastic_normal, 2)
    guide, params = params_for(model, X, y, 2)
    m, v = dense_moments(params, X)
    x, w = np.polynomial.hermite_e.hermegauss(60)
    w = w / w.sum()
    f0 = m[:, 0, None, None] + np.sqrt(v[:, 0, None, None]) * x[None, :, None]
    f1 = m[:, 1, None, None] + np.sqrt(v[:, 1, None, None]) * x[None, None, :]
    dense = (w[:, None] * w[None, :] * norm.logpdf(y[:, None, None], f0, np.exp(f1 / 2))).sum((1, 2))
    np.testing.assert_allclose(ell(model, guide, params, X, y), dense.sum(), rtol=1e-10)


def test_robust_max_expected_log_likelihood_integrates_the_largest_output(X):
    labels = np.array([0, 2, 1, 1, 0, 2])
    epsilon = 0.01
    model = one_layer(lambda f: likelihoods.robust_max(f, epsilon), 3)
    guide, params = params_for(model, X, labels, 3)
    m, v = dense_moments(params, X)
    s = np.sqrt(v)
    expected = 0.0
    for n, c in enumerate(labels):
        others = [j for j in range(3) if j != c]

        def largest(x, n=n, c=c, others=others):
            return norm.pdf(x, m[n, c], s[n, c]) * np.prod([norm.cdf((x - m[n, j]) / s[n, j]) for j in others])

        p, _ = integrate.quad(largest, -np.inf, np.inf, epsabs=1e-13, epsrel=1e-13)
        expected += p * np.log1p(-epsilon) + (1 - p) * np.log(epsilon / 2)
    # a 20-node Gauss-Hermite sum over the labelled output's value (GPflow's RobustMax): the
    # integral to 1e-6 here
    np.testing.assert_allclose(ell(model, guide, params, X, labels), expected, rtol=1e-6)
    x, w = np.polynomial.hermite_e.hermegauss(20)
    w = w / w.sum()
    s_all = np.sqrt(v)
    p20 = np.array([sum(w[k] * np.prod([norm.cdf((m[n, c] + s_all[n, c] * x[k] - m[n, j]) / s_all[n, j])
                                        for j in range(3) if j != c]) for k in range(20))
                    for n, c in enumerate(labels)])
    rule = np.sum(p20 * np.log1p(-epsilon) + (1 - p20) * np.log(epsilon / 2))
    np.testing.assert_allclose(ell(model, guide, params, X, labels), rule, rtol=1e-12)  # that very sum


def test_robust_max_refuses_a_run_without_its_closed_form(X):
    labels = np.array([0, 2, 1, 1, 0, 2])
    sliced = one_layer(lambda f: likelihoods.robust_max(f[..., :3] + 0.0), 3)  # not the layer's own output
    guide, params = params_for(sliced, X, labels, 3)
    with pytest.raises(ValueError, match=r"'y' \(RobustMax\) is piecewise constant .*\(robust_max\(f\)"):
        ell(sliced, guide, params, X, labels)
    model = one_layer(likelihoods.robust_max, 3)
    guide, params = params_for(model, X, labels, 3)
    with pytest.raises(ValueError, match="PredictiveObjective does not take it"):
        dgp.PredictiveObjective(num_particles=1).loss(jax.random.PRNGKey(0), params, model, guide, X, jnp.asarray(labels))


# ---------------------------------------------------------------- quadrature and Monte Carlo


@pytest.mark.parametrize("name", ["student_t", "negative_binomial"])
def test_one_output_likelihoods_take_twenty_gauss_hermite_nodes(X, name):
    y = np.array([0.0, 1.0, 3.0, 0.0, 2.0, 7.0]) if name == "negative_binomial" else np.array([0.3, -1.2, 0.5, 2.0, -0.1, 0.9])
    if name == "student_t":
        model = one_layer(lambda f: likelihoods.student_t(f, 3.5, 0.4), 1)
        log_p = lambda f: student.logpdf(y[:, None], 3.5, f, 0.4)  # noqa: E731
    else:
        model = one_layer(lambda f: likelihoods.negative_binomial(f, 2.5), 1)

        def log_p(f):  # mean e^f, concentration r = 2.5: NB(y | r, p = e^f / (r + e^f)) in log space
            r, k = 2.5, y[:, None]
            log_one_plus = np.logaddexp(0.0, f - np.log(r))  # log(1 + e^f / r)
            return (gammaln(k + r) - gammaln(r) - gammaln(k + 1) - r * log_one_plus
                    + k * (f - np.log(r) - log_one_plus))
    guide, params = params_for(model, X, y, 1)
    m, v = dense_moments(params, X)
    # the rule itself, on the distribution's own log-density (NumPyro's negative binomial
    # evaluates it to ~1e-7 of scipy's: JAX's log-beta function)
    x, w = np.polynomial.hermite_e.hermegauss(20)
    nodes = jnp.asarray(m[:, :1] + np.sqrt(v[:, :1]) * x[None])
    own = np.asarray(model_site_log_prob(model, nodes, y))  # (N, 20)
    np.testing.assert_allclose(ell(model, guide, params, X, y), (own @ (w / w.sum())).sum(), rtol=1e-12)
    # and twenty nodes are enough: the expectation to 1e-4 of a 150-node rule's (a Student-t's
    # heavy tails are the harder case)
    np.testing.assert_allclose(ell(model, guide, params, X, y),
                               gauss_hermite_expectation(log_p, m[:, 0], v[:, 0], 150).sum(), rtol=1e-4)


def model_site_log_prob(model, f_nodes, y):
    """The observation's log-density at ``f (N, K)`` through the model's own likelihood."""
    observe = model.observe
    return observe(f_nodes[..., None]).log_prob(jnp.asarray(y)[:, None])


@pytest.mark.stochastic
def test_softmax_expected_log_likelihood_is_monte_carlo_within_its_error(X):
    labels = np.array([0, 2, 1, 1, 0, 2])
    model = one_layer(likelihoods.softmax, 3)
    guide, params = params_for(model, X, labels, 3)
    m, v = dense_moments(params, X)
    x, w = np.polynomial.hermite_e.hermegauss(30)
    w = w / w.sum()
    grid = np.stack(np.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)
    weights = np.prod(np.stack(np.meshgrid(w, w, w, indexing="ij"), -1).reshape(-1, 3), axis=1)
    f = m[:, None, :] + np.sqrt(v)[:, None, :] * grid[None]  # (N, K, 3)
    log_softmax = f - logsumexp(f, axis=-1, keepdims=True)
    dense = (weights * np.take_along_axis(log_softmax, labels[:, None, None], axis=-1)[..., 0]).sum()
    estimates = np.array([ell(model, guide, params, X, labels, key=k) for k in range(40)])
    # each estimate averages 32 draws per point; the spread of 40 estimates gives the error
    se = estimates.std(ddof=1) / np.sqrt(len(estimates))
    assert abs(estimates.mean() - dense) < z_threshold() * se, (estimates.mean(), dense, se)
    assert se > 0  # sampled, not a fixed rule


# ---------------------------------------------------------------- predict and metrics


@pytest.mark.stochastic
def test_softmax_prediction_gives_class_probabilities(X):
    labels = np.array([0, 2, 1, 1, 0, 2])
    model = one_layer(likelihoods.softmax, 3)
    guide, params = params_for(model, X, labels, 3)
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(1), X, num_samples=300)
    assert pred.likelihood == "categorical" and pred.mean.shape == (N, 3) and pred.component_means.shape == (300, N, 3)
    np.testing.assert_allclose(pred.mean.sum(-1), 1.0, rtol=1e-12)
    m, v = dense_moments(params, X)
    x, w = np.polynomial.hermite_e.hermegauss(30)
    w = w / w.sum()
    grid = np.stack(np.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)
    weights = np.prod(np.stack(np.meshgrid(w, w, w, indexing="ij"), -1).reshape(-1, 3), axis=1)
    dense = np.einsum("k,nkc->nc", weights, np_softmax(m[:, None] + np.sqrt(v)[:, None] * grid[None], axis=-1))
    se = np.asarray(pred.component_means).std(0, ddof=1) / np.sqrt(300)
    np.testing.assert_array_less(np.abs(np.asarray(pred.mean) - dense), z_threshold(3 * N) * se)
    scores = dgp.metrics(pred, labels)
    assert set(scores) == {"log_likelihood", "accuracy", "error_rate", "brier", "ece"}
    np.testing.assert_allclose(scores["log_likelihood"], np.mean(np.log(np.asarray(pred.mean)[np.arange(N), labels])))
    np.testing.assert_allclose(scores["accuracy"], np.mean(np.asarray(pred.mean).argmax(-1) == labels))
    with pytest.raises(ValueError, match=r"labels in 0..2 .* e.g. 3"):
        dgp.metrics(pred, np.array([0, 1, 2, 3, 0, 1]))
    with pytest.raises(ValueError, match="predictive_quantiles: needs a regression prediction .* 'categorical'"):
        dgp.predictive_quantiles(pred, [0.5])


def test_poisson_prediction_is_the_node_mixture(X):
    counts = np.array([0, 1, 3, 0, 2, 7])
    model = one_layer(likelihoods.poisson, 1)
    guide, params = params_for(model, X, counts, 1, spread=0.3)  # a fitted model's narrower q(u)
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(1), X, num_samples=2)
    assert pred.likelihood == "general" and pred.atoms.batch_shape == (2, 20, N) and pred.atom_weights.shape == (20,)
    m, v = dense_moments(params, X)
    m, v = m[:, 0], v[:, 0]
    # one layer: every component is the last layer's marginal; 20 nodes integrate exp(f) to 1e-10
    rate_mean = np.exp(m + v / 2)
    rate_var = (np.exp(v) - 1) * np.exp(2 * m + v)
    np.testing.assert_allclose(pred.mean, rate_mean, rtol=1e-10)
    np.testing.assert_allclose(pred.variance, rate_mean + rate_var, rtol=1e-10)
    # the density of a count is a peaked function of f: 20 nodes give it to 1e-6 here
    expected = np.log(gauss_hermite_expectation(lambda f: poisson.pmf(counts[:, None], np.exp(f)), m, v, 150))
    np.testing.assert_allclose(dgp.log_likelihood(pred, counts), expected, rtol=1e-6)
    # quantiles are counts: the smallest whose distribution function reaches the level
    q = np.asarray(dgp.predictive_quantiles(pred, [0.1, 0.5, 0.9]))
    cdf = lambda k: gauss_hermite_expectation(lambda f: poisson.cdf(k[:, None], np.exp(f)), m, v, 200)  # noqa: E731
    for level, row in zip([0.1, 0.5, 0.9], q):
        assert np.all(row == np.round(row)) and np.all(row >= 0)
        assert np.all(cdf(row) >= level - 1e-6) and np.all((row == 0) | (cdf(row - 1) < level + 1e-6))
    with pytest.raises(ValueError, match="y_scale applies to continuous targets"):
        dgp.metrics(pred, counts, y_scale=2.0)
    # the distribution function accumulated over blocks of counts is the one-table answer,
    # and a level the counts scanned do not reach is NaN, not the last count
    from numpyro_dgp._predict import metrics as _quantiles

    arrays = {k: getattr(pred, k) for k in ("component_means", "component_variances", "weights", "atoms",
                                            "atom_weights")}
    levels = jnp.asarray([0.1, 0.5, 0.9])
    whole = _quantiles._count_quantiles.__wrapped__(levels, arrays, 60)
    np.testing.assert_array_equal(whole, q)
    _quantiles._COUNT_TABLE_ENTRIES, entries = 3 * 2 * 20, _quantiles._COUNT_TABLE_ENTRIES  # blocks of 3 counts
    try:
        np.testing.assert_array_equal(_quantiles._count_quantiles.__wrapped__(levels, arrays, 60), whole)
        short = np.asarray(_quantiles._count_quantiles.__wrapped__(levels, arrays, 0))  # P(y = 0) only
    finally:
        _quantiles._COUNT_TABLE_ENTRIES = entries
    with pytest.raises(ValueError, match=r"quantiles must lie in \(0, 1\), got \[0.0, 0.5\]"):
        dgp.predictive_quantiles(pred, [0.0, 0.5])
    reached = cdf(np.zeros(N)) >= levels[:, None]
    assert np.all(np.where(reached, short == 0, np.isnan(short))) and not np.all(reached)


@pytest.mark.stochastic
def test_student_t_crps_is_the_integral_of_the_squared_distribution_function_gap(X):
    y = np.array([0.3, -1.2, 0.5, 2.0, -0.1, 0.9])
    model = one_layer(lambda f: likelihoods.student_t(f, 3.5, 0.4), 1)
    guide, params = params_for(model, X, y, 1)
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(1), X, num_samples=2)
    grid = np.linspace(-25, 25, 40001)
    atoms_loc = np.asarray(pred.atoms.loc)[0]  # (K, N): one layer, both components alike
    cdf = (np.asarray(pred.atom_weights)[:, None, None]
           * student.cdf(grid[None, None, :], 3.5, atoms_loc[..., None], 0.4)).sum(0)  # (N, G)
    dense = np.trapezoid((cdf - (grid[None] >= y[:, None])) ** 2, grid, axis=1).mean()
    estimates = [dgp.metrics(pred, y, rng_key=jax.random.PRNGKey(k))["crps"] for k in range(8)]
    se = np.std(estimates, ddof=1) / np.sqrt(len(estimates))
    assert abs(np.mean(estimates) - dense) < z_threshold() * se + 1e-6, (np.mean(estimates), dense, se)
    # the median is where the mixture's distribution function crosses 1/2
    median = np.asarray(dgp.predictive_quantiles(pred, [0.5]))[0]
    mixture_cdf = (np.asarray(pred.atom_weights)[:, None] * student.cdf(median[None], 3.5, atoms_loc, 0.4)).sum(0)
    np.testing.assert_allclose(mixture_cdf, 0.5, atol=1e-9)


def test_a_normal_whose_scale_depends_on_the_layer_is_not_read_as_gaussian(X):
    # heteroscedastic written by hand: its components are node mixtures, not N(E loc, Var loc + scale[0]^2)
    y = np.array([0.3, -1.2, 0.5, 2.0, -0.1, 0.9])
    by_hand = one_layer(lambda f: dist.Normal(f[..., 0], jnp.exp(f[..., 1] / 2)), 2)
    recipe = one_layer(likelihoods.heteroscedastic_normal, 2)
    guide, params = params_for(recipe, X, y, 2)
    a = dgp.predict(by_hand, guide, params, jax.random.PRNGKey(1), X, num_samples=50)
    b = dgp.predict(recipe, guide, params, jax.random.PRNGKey(1), X, num_samples=50)
    assert a.likelihood == b.likelihood == "general"
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12)
    np.testing.assert_allclose(dgp.log_likelihood(a, y), dgp.log_likelihood(b, y), rtol=1e-12)
    m, v = dense_moments(params, X)
    # E[y] = E[f0]; Var[y] = E[f0 var] + E[e^{f1}] with MC draws of the two outputs (16 per component)
    np.testing.assert_allclose(np.asarray(b.mean), m[:, 0], atol=6 * np.sqrt(v[:, 0].max() / (50 * 16)))


# ---------------------------------------------------------------- the case


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_categorical_three_output_dgp_trains_with_dgp_elbo_and_predicts_classes(dtype):
    """A plain ``Categorical(logits=f)`` on a 3-output two-layer DGP: no skipped update, no
    non-finite loss (float32 ended on NaN before the jitter became relative), and (N, 3) class
    probabilities from which metrics scores the accuracy."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2)).astype(dtype)
    labels = np.argmax(np.stack([X[:, 0], X[:, 1], -X[:, 0] - X[:, 1]], 1) + 0.3 * rng.normal(size=(200, 3)), 1)

    def model(X, y=None):
        h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=15, out_dim=2, mean="identity")
        f = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=15, out_dim=3)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Categorical(logits=f), obs=y)

    with jax.enable_x64(dtype == "float64"):
        guide = dgp.guides.AutoFactorizedDGP(model)
        svi = SVI(model, guide, numpyro.optim.Adam(0.05), dgp.DGPElbo())
        result = dgp.fit(svi, jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(labels), num_steps=300,
                         progress_bar=False)
        assert result.num_skipped == 0 and np.all(np.isfinite(result.losses))
        pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), jnp.asarray(X[:50]), num_samples=20)
        assert pred.likelihood == "categorical" and pred.mean.shape == (50, 3) and pred.mean.dtype == dtype
        assert dgp.metrics(pred, labels[:50])["accuracy"] > 0.8


def test_a_large_kernel_variance_factorizes_in_float32():
    """The cause of the issue's NaN: a classifier's output layer grows its kernel variance (to
    ~170 there) with a long lengthscale and close inducing inputs; an absolute 1e-4 jitter falls
    below float32 round-off of K(Z, Z), a jitter relative to the variance does not."""
    rng = np.random.default_rng(1)
    Z = jnp.asarray(rng.uniform(-1, 1, (50, 2)).astype(np.float32))

    def model():
        return dgp.gp_layer("f", Z, dgp.kernels.RBF(variance=170.0, lengthscale=[5.0, 6.0]), inducing_inputs=Z)

    with jax.enable_x64(False):
        layer = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace()["f.layer"]["args"][0]
        assert layer.Kmm_chol.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(layer.Kmm_chol)))
        np.testing.assert_allclose(float(layer.jitter), 1e-4 * 170.0, rtol=1e-5)
        K = dgp.kernels.RBF(variance=170.0, lengthscale=[5.0, 6.0])(Z)
        assert not bool(jnp.all(jnp.isfinite(jnp.linalg.cholesky(K + 1e-4 * jnp.eye(50)))))  # the old jitter
