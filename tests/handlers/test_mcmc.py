"""MCMC handlers on the same model: exact_layers, latent_conditionals, collapse_last_layer."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import MCMC, NUTS
from numpyro.infer.util import log_density
from scipy import stats
from scipy.stats import norm

import numpyro_dgp as dgp
from numpyro_dgp import kernels
from numpyro_dgp.handlers import collapse_last_layer, exact_layers, latent_conditionals
from numpyro_dgp.models import deep_gp_regression
from tests._mc import mcmc_mean_and_se, mcmc_var_and_se, z_threshold

K1 = kernels.RBF(variance=1.0, lengthscale=0.6)


K2 = kernels.RBF(variance=0.8, lengthscale=0.9)


def two_layer(X, y=None):
    h = dgp.gp_layer("h1", X, K1, num_inducing=4, mean="identity")
    f = dgp.gp_layer("h2", h, K2, num_inducing=4)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


def one_layer(X, y=None):
    f = dgp.gp_layer("f", X, kernels.RBF(variance=1.0, lengthscale=0.5), num_inducing=5)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


@pytest.fixture(scope="module")
def data():
    X = jnp.linspace(-1.0, 1.0, 8)[:, None]
    y = jnp.sin(2.5 * X[:, 0])
    return X, y


def _mvn_logpdf(x, mean, cov):
    return stats.multivariate_normal(mean, cov).logpdf(x)


jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)


JITTER = 1e-6  # float64 default of the layers, relative to the kernel variance


D, M1, M2, N_NEW = 2, 5, 4, 7


def rbf(A, B, variance, lengthscale):
    A, B = np.asarray(A) / lengthscale, np.asarray(B) / lengthscale
    sq = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
    return variance * np.exp(-0.5 * sq)


def svgp_given_u(X, Z, v, variance, lengthscale):
    """Whitened sparse GP given u = L v: mean K_xz L^-T v, var k_xx - diag(K_xz K_zz^-1 K_zx)."""
    L = np.linalg.cholesky(rbf(Z, Z, variance, lengthscale) + JITTER * variance * np.eye(len(Z)))
    A = np.linalg.solve(L, rbf(Z, X, variance, lengthscale))  # (M, N)
    mean = A.T @ np.asarray(v)
    var = variance - (A**2).sum(0)
    return mean, var


def one_layer_sample(rng):
    return {
        "h1.u": rng.randn(1, M1),
        "h1.kernel.variance": np.array(0.5 + rng.rand()),
        "h1.kernel.lengthscale": 0.5 + rng.rand(D),
        "h1.inducing_inputs": rng.randn(M1, D),
        "noise": np.array(0.01 + 0.1 * rng.rand()),
    }


def two_layer_sample(rng):
    s = one_layer_sample(rng)
    s["h1.u"] = rng.randn(D, M1)
    s.update({
        "h2.u": rng.randn(1, M2),
        "h2.kernel.variance": np.array(0.5 + rng.rand()),
        "h2.kernel.lengthscale": 0.5 + rng.rand(D),
        "h2.inducing_inputs": rng.randn(M2, D),
    })
    return s


def _sine_data():
    rng = np.random.RandomState(8)
    X = jnp.asarray(rng.uniform(-1, 1, (60, 1)))
    y = jnp.sin(3 * X[:, 0]) + 0.05 * jnp.asarray(rng.randn(60))
    return X, y


def test_exact_layers_density_is_the_dense_dgp_prior(data):
    X, y = data
    grid = jnp.array([[-0.5], [0.25], [1.3]])
    model = exact_layers(two_layer, grid=grid, parameterization="centered", jitter=1e-6)
    tr = trace(seed(model, 0)).get_trace(X, y)
    latent = [n for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]]
    assert latent == ["h1.f", "h2.f"]  # no inducing values in the exact model
    assert tr["h1.grid"]["value"].shape == (3, 1) and tr["h2.grid"]["value"].shape == (3, 1)
    # a prior draw: random values would make the ill-conditioned K's density round-off bound
    f1, f2 = np.asarray(tr["h1.f"]["value"]), np.asarray(tr["h2.f"]["value"])
    lp, _ = log_density(seed(model, 0), (X, y), {}, {"h1.f": f1, "h2.f": f2})
    A = np.concatenate([np.asarray(X), np.asarray(grid)])
    K = np.asarray(K1(A)) + 1e-6 * np.eye(11)
    expected = _mvn_logpdf(f1[0], A[:, 0], K)  # identity mean
    H = f1[0][:, None]
    expected += _mvn_logpdf(f2[0], np.zeros(11), np.asarray(K2(H)) + 1e-6 * np.eye(11))
    expected += stats.norm(f2[0, :8], 0.1).logpdf(np.asarray(y)).sum()
    np.testing.assert_allclose(float(lp), expected, rtol=1e-10)


def test_exact_layers_noncentered_matches_centered(data):
    X, y = data
    nc = exact_layers(two_layer, parameterization="noncentered")
    tr = trace(seed(nc, 1)).get_trace(X, y)
    eps1, eps2 = tr["h1.f_white"]["value"], tr["h2.f_white"]["value"]
    f1 = tr["h1"]["value"]
    L = np.linalg.cholesky(np.asarray(K1(X)) + 1e-6 * np.eye(8))
    np.testing.assert_allclose(np.asarray(f1[:, 0]), np.asarray(X[:, 0]) + L @ np.asarray(eps1[0]), rtol=1e-10)
    assert eps2.shape == (1, 8)


def test_latent_conditionals_density_is_the_sparse_model(data):
    X, y = data
    for full_cov in (False, True):
        model = latent_conditionals(two_layer, parameterization="centered", full_cov=full_cov)
        tr = trace(seed(model, 0)).get_trace(X, y)
        latent = [n for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]]
        assert latent == ["h1.u", "h1.f", "h2.u", "h2.f"]
        rng = np.random.default_rng(1)
        values = {"h1.u": rng.normal(size=(1, 4)), "h2.u": rng.normal(size=(1, 4)),
                  "h1.f": rng.normal(size=(1, 8)), "h2.f": rng.normal(size=(1, 8))}
        lp, tr2 = log_density(seed(model, 0), (X, y), {}, values)
        expected = stats.norm().logpdf(values["h1.u"]).sum() + stats.norm().logpdf(values["h2.u"]).sum()
        inputs = np.asarray(X)
        for name, kern, mean in (("h1", K1, inputs[:, 0]), ("h2", K2, np.zeros(8))):
            Z = np.asarray(tr2[f"{name}.inducing_inputs"]["value"])
            jitter = 1e-6 * float(kern.variance)  # the layer's jitter is relative to its variance
            Kmm = np.asarray(kern(Z)) + jitter * np.eye(4)
            Lm = np.linalg.cholesky(Kmm)
            Kmn = np.asarray(kern(Z, inputs))
            A = np.linalg.solve(Lm, Kmn)  # whitened: f = mean + A^T v
            m = mean + A.T @ values[f"{name}.u"][0]
            C = np.asarray(kern(inputs)) - A.T @ A
            f = values[f"{name}.f"][0]
            if full_cov:
                expected += _mvn_logpdf(f, m, C + jitter * np.eye(8))
            else:
                expected += stats.norm(m, np.sqrt(np.diag(C) + jitter)).logpdf(f).sum()
            inputs = f[:, None]
        expected += stats.norm(values["h2.f"][0], 0.1).logpdf(np.asarray(y)).sum()
        np.testing.assert_allclose(float(lp), expected, rtol=1e-9)


def test_handler_errors(data):
    X, y = data
    with pytest.raises(ValueError, match="parameterization"):
        exact_layers(two_layer, parameterization="whitened")
    with pytest.raises(ValueError, match="grid must have shape"):
        exact_layers(two_layer, grid=jnp.zeros(3))
    with pytest.raises(ValueError, match="grid contains NaN"):
        exact_layers(two_layer, grid=jnp.array([[jnp.nan]]))
    with pytest.raises(ValueError, match="jitter"):
        exact_layers(two_layer, jitter=0.0)
    with pytest.raises(ValueError, match="width 2"):
        trace(seed(exact_layers(two_layer, grid=jnp.zeros((3, 2))), 0)).get_trace(X, y)
    with pytest.raises(ValueError, match="parameterization"):
        latent_conditionals(two_layer, parameterization="x")


@pytest.mark.stochastic
def test_nuts_on_a_one_layer_model_is_the_exact_gp_posterior():
    """NUTS + exact_layers on a plain GP: means and variances at the grid within MC error."""
    X = jnp.linspace(-1, 1, 12)[:, None]
    y = jnp.sin(3 * X[:, 0]) + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (12,))
    grid = jnp.array([[-1.4], [-0.3], [0.55], [1.2]])
    mcmc = MCMC(NUTS(exact_layers(one_layer, grid=grid)), num_warmup=400, num_samples=1500,
                num_chains=2, chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["f.grid"][..., 0])  # (2, 1500, 4)
    kern = kernels.RBF(variance=1.0, lengthscale=0.5)
    K = np.asarray(kern(X)) + 0.01 * np.eye(12)
    Ks = np.asarray(kern(grid, X))
    mean = Ks @ np.linalg.solve(K, np.asarray(y))
    var = np.diag(np.asarray(kern(grid)) - Ks @ np.linalg.solve(K, Ks.T))
    # standard errors from the effective sample sizes; 8 comparisons (a mean and a variance per point)
    z = z_threshold(8)
    m_hat, m_se = mcmc_mean_and_se(draws)
    v_hat, v_se = mcmc_var_and_se(draws)
    np.testing.assert_array_less(np.abs(m_hat - mean), z * m_se)
    np.testing.assert_array_less(np.abs(v_hat - var), z * v_se)


def test_collapse_last_density_is_the_dense_marginal(data):
    """With the first layer fixed, the collapsed model scores y with N(0, K2(h1) + jitter I + s^2 I)
    (dense float64), and its log density is the uncollapsed joint with f2 integrated out."""
    X, y = data
    grid = jnp.array([[-0.5], [0.25], [1.3]])
    model = exact_layers(two_layer, grid=grid, collapse_last=True, jitter=1e-6)
    tr = trace(seed(model, 0)).get_trace(X, y)
    latent = [n for n, s in tr.items() if s["type"] == "sample" and not s["is_observed"]]
    assert latent == ["h1.f_white", "h2.grid_white"]
    rng = np.random.default_rng(3)
    values = {"h1.f_white": rng.normal(size=(1, 11)), "h2.grid_white": rng.normal(size=(1, 3))}
    lp, tr2 = log_density(seed(model, 0), (X, y), {}, values)
    A = np.concatenate([np.asarray(X), np.asarray(grid)])
    L1 = np.linalg.cholesky(np.asarray(K1(A)) + 1e-6 * np.eye(11))
    h1 = A[:, 0] + L1 @ values["h1.f_white"][0]
    K2_all = np.asarray(K2(h1[:, None])) + 1e-6 * np.eye(11)
    C = K2_all[:8, :8] + 0.01 * np.eye(8)
    expected = stats.norm().logpdf(values["h1.f_white"]).sum() + stats.norm().logpdf(values["h2.grid_white"]).sum()
    expected += _mvn_logpdf(np.asarray(y), np.zeros(8), C)
    np.testing.assert_allclose(float(lp), expected, rtol=1e-10)
    # the grid values: the exact conditional of f2 at the grid given y and h1
    Kgd = K2_all[8:, :8]
    mean = Kgd @ np.linalg.solve(C, np.asarray(y))
    cov = K2_all[8:, 8:] - Kgd @ np.linalg.solve(C, Kgd.T)
    expected_grid = mean + np.linalg.cholesky(cov) @ values["h2.grid_white"][0]  # the prior jitter, once
    np.testing.assert_allclose(np.asarray(tr2["h2.grid"]["value"][:, 0]), expected_grid, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(tr2["h1.grid"]["value"][:, 0]), h1[8:], rtol=1e-9)


def test_collapse_last_equals_the_uncollapsed_joint_integrated_over_f2(data):
    """Integrating the uncollapsed joint over the last layer's values (Gaussian, done in closed form
    via the identity p(y | h1) = p(f2, y | h1) / p(f2 | y, h1) at any f2) gives the collapsed density."""
    X, y = data
    full = exact_layers(two_layer, parameterization="centered", jitter=1e-6)
    collapsed = exact_layers(two_layer, collapse_last=True, jitter=1e-6)
    rng = np.random.default_rng(5)
    f1 = np.asarray(X[:, 0]) + 0.3 * rng.normal(size=8)
    L1 = np.linalg.cholesky(np.asarray(K1(X)) + 1e-6 * np.eye(8))
    white = np.linalg.solve(L1, f1 - np.asarray(X[:, 0]))[None]
    lp_c, _ = log_density(seed(collapsed, 0), (X, y), {}, {"h1.f_white": white})
    K = np.asarray(K2(f1[:, None])) + 1e-6 * np.eye(8)
    post_cov = K - K @ np.linalg.solve(K + 0.01 * np.eye(8), K)
    post_mean = K @ np.linalg.solve(K + 0.01 * np.eye(8), np.asarray(y))
    f2 = post_mean + 0.05 * rng.normal(size=8)  # any value: the identity holds pointwise
    lp_joint, _ = log_density(seed(full, 0), (X, y), {}, {"h1.f": f1[None], "h2.f": f2[None]})
    # centered h1 density vs non-centered white: differ by the Jacobian log|det L1|
    lp_joint = float(lp_joint) + np.log(np.diag(L1)).sum()
    expected = lp_joint - _mvn_logpdf(f2, post_mean, post_cov)
    np.testing.assert_allclose(float(lp_c), expected, rtol=1e-7)


def test_collapse_last_refuses_what_it_cannot_integrate(data):
    X, y = data

    def probit(X, y=None):
        h = dgp.gp_layer("h1", X, K1, num_inducing=4, mean="identity")
        f = dgp.gp_layer("h2", h, K2, num_inducing=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(probs=jax.scipy.stats.norm.cdf(f[:, 0])), obs=y)

    with pytest.raises(NotImplementedError, match="only a Normal likelihood"):
        trace(seed(exact_layers(probit, collapse_last=True), 0)).get_trace(X, (y > 0).astype(float))
    with pytest.raises(ValueError, match="observations, so they must be given"):
        trace(seed(exact_layers(two_layer, collapse_last=True), 0)).get_trace(X, None)


# A first layer that stays near the identity. With two_layer's K1 the posterior is bimodal (the
# last layer's stationary kernel cannot tell h1 from a flipped -h1, only the identity mean can), and
# NUTS chains on the uncollapsed model sit in either mode, so their moments are not comparable.
K1_NEAR_IDENTITY = kernels.RBF(variance=0.05, lengthscale=0.6)


def near_identity_two_layer(X, y=None):
    h = dgp.gp_layer("h1", X, K1_NEAR_IDENTITY, num_inducing=4, mean="identity")
    f = dgp.gp_layer("h2", h, K2, num_inducing=4)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


@pytest.mark.stochastic
def test_nuts_collapsed_and_uncollapsed_agree():
    """The same posterior by two samplers: NUTS on the collapsed and on the full exact model give the
    same first-layer and last-layer grid moments (within Monte Carlo error) on an easy problem."""
    X = jnp.linspace(-1, 1, 8)[:, None]
    y = jnp.sin(2.5 * X[:, 0])
    grid = jnp.array([[-0.75], [0.1], [0.8]])
    draws = {}
    for collapse in (False, True):
        mcmc = MCMC(NUTS(exact_layers(near_identity_two_layer, grid=grid, collapse_last=collapse, jitter=1e-6), dense_mass=True),
                    num_warmup=400, num_samples=1500, num_chains=2, chain_method="sequential", progress_bar=False)
        mcmc.run(jax.random.PRNGKey(2), X, y)
        s = mcmc.get_samples(group_by_chain=True)
        draws[collapse] = {n: np.asarray(s[f"{n}.grid"][..., 0]) for n in ("h1", "h2")}
    # Standard errors from each sampler's effective sample sizes (the variance's from those of the
    # squared deviations, which mix more slowly than the draws); 12 comparisons: a mean and a
    # variance at 3 grid points of 2 layers.
    z = z_threshold(12)
    # The comparison is not vacuous: the collapsed sampler mixes everywhere (thousands of effective
    # draws), the uncollapsed one at most grid points; where one of its chains lingers (a few
    # seeds in ten), the effective sample size there drops and widens that point's tolerance.
    ess = {c: np.concatenate([np.ravel(numpyro.diagnostics.effective_sample_size(draws[c][n])) for n in ("h1", "h2")])
           for c in (False, True)}
    assert ess[True].min() > 200 and np.median(ess[False]) > 200, ess
    for name in ("h1", "h2"):
        a, b = draws[False][name], draws[True][name]
        for estimate in (mcmc_mean_and_se, mcmc_var_and_se):
            (ea, sa), (eb, sb) = estimate(a), estimate(b)
            np.testing.assert_array_less(np.abs(ea - eb), z * np.sqrt(sa**2 + sb**2))


@pytest.mark.parametrize("layer", [None, "h2"])
def test_collapse_last_layer_log_density(layer):
    rng = np.random.RandomState(7)
    s = two_layer_sample(rng)
    X = jnp.asarray(rng.randn(9, D))
    y = jnp.asarray(rng.randn(9))
    model = deep_gp_regression(2, num_inducing=M1)
    params = {k: jnp.asarray(v) for k, v in s.items() if k not in ("h1.u", "h2.u")}
    latents = {"h1.u": jnp.asarray(s["h1.u"]), "h2.u": jnp.asarray(s["h2.u"])}
    collapsed = substitute(seed(collapse_last_layer(model, layer=layer), jax.random.PRNGKey(0)), data=params)
    lp, tr = log_density(collapsed, (X, y), {}, latents)
    h1 = np.asarray(tr["h1"]["value"])  # the sampled inner layer
    m, v = svgp_given_u(h1, s["h2.inducing_inputs"], s["h2.u"][0], s["h2.kernel.variance"],
                        s["h2.kernel.lengthscale"])
    np.testing.assert_allclose(tr["h2"]["value"][:, 0], m, atol=1e-10)  # the layer returns its mean
    expected = norm.logpdf(np.asarray(y), m, np.sqrt(v + s["noise"])).sum()
    expected += norm.logpdf(s["h1.u"]).sum() + norm.logpdf(s["h2.u"]).sum()  # whitened priors
    np.testing.assert_allclose(float(lp), expected, rtol=1e-10, atol=1e-8)
    # without the handler the last layer is sampled and scored with the noise alone
    plain = substitute(seed(model, jax.random.PRNGKey(0)), data=params)
    lp_plain, _ = log_density(plain, (X, y), {}, latents)
    assert abs(float(lp_plain) - expected) > 1e-3


def test_collapse_last_layer_minibatch():
    X, y = _sine_data()
    wrapped = collapse_last_layer(deep_gp_regression(2, num_inducing=6, noise_init=0.05))
    # minibatched: the variance is added per subsampled point
    tr = trace(seed(wrapped, jax.random.PRNGKey(1))).get_trace(X, y, batch_size=10)
    assert tr["y"]["fn"].scale.shape == (10,)
    assert np.all(np.asarray(tr["y"]["fn"].scale) > np.sqrt(0.05))
    assert wrapped.moments[1].shape == (10, 1)
    with pytest.raises(ValueError, match="no gp_layer"):
        collapse_last_layer(lambda: None)()


def _noisy_two_layer(X, y=None):
    h = dgp.gp_layer("h1", X, K1, num_inducing=4, mean="identity", noise=0.04)
    f = dgp.gp_layer("h2", h, K2, num_inducing=4)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)


def test_mcmc_handlers_add_a_layers_noise_to_its_output_variance(data):
    """exact_layers: K + noise I; latent_conditionals: the conditional variance plus the noise
    (point by point and jointly); collapse_last_layer: the collapsed variance plus the noise."""
    X, y = data
    tr = trace(seed(exact_layers(_noisy_two_layer, parameterization="centered", jitter=1e-6), 0)).get_trace(X, y)
    L = tr["h1.f"]["fn"].base_dist.scale_tril[0]
    np.testing.assert_allclose(np.asarray(L @ L.T), np.asarray(K1(X)) + (0.04 + 1e-6) * np.eye(8), rtol=1e-10)
    for full_cov in (False, True):
        model = latent_conditionals(_noisy_two_layer, parameterization="centered", full_cov=full_cov)
        tr = trace(seed(model, 0)).get_trace(X, y)
        layer, u = tr["h1.layer"]["args"][0], tr["h1.u"]["value"]
        _, var = dgp.layers.layer_moments(layer, X, u, None, full_cov)
        noiseless = layer._replace(noise=None)
        _, var0 = dgp.layers.layer_moments(noiseless, X, u, None, full_cov)
        base = tr["h1.f"]["fn"].base_dist
        if full_cov:
            cov = np.asarray(base.scale_tril[0] @ base.scale_tril[0].T)
            np.testing.assert_allclose(cov, np.asarray(var0[0]) + (0.04 + 1e-6) * np.eye(8), rtol=1e-9)
        else:
            np.testing.assert_allclose(np.asarray(base.scale[0]) ** 2, np.asarray(var0[:, 0]) + 0.04 + 1e-6, rtol=1e-10)
        diag = (lambda a: np.diagonal(np.asarray(a[0]))) if full_cov else (lambda a: np.asarray(a[:, 0]))
        np.testing.assert_allclose(diag(var), diag(var0) + 0.04, rtol=1e-10)  # layer_moments adds it

    def noisy_last(X, y=None):
        f = dgp.gp_layer("f", X, K1, num_inducing=4, noise=0.04)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)

    handler = collapse_last_layer(noisy_last)
    tr = trace(seed(handler, 0)).get_trace(X, y)
    layer, u = tr["f.layer"]["args"][0], tr["f.u"]["value"]
    _, var0 = dgp.layers.layer_moments(layer._replace(noise=None), X, u)
    np.testing.assert_allclose(np.asarray(tr["y"]["fn"].scale) ** 2, 0.01 + np.asarray(var0[:, 0]) + 0.04, rtol=1e-10)


def test_sde_flow_refuses_a_noisy_flow_layer(data):
    X, y = data

    def model(X, y=None):
        h = dgp.gp_layer("flow", X, K1, num_inducing=4, noise=0.01)
        f = dgp.gp_layer("g", h, K2, num_inducing=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)

    with pytest.raises(ValueError, match="takes no noise"):
        trace(seed(dgp.handlers.sde_flow(model, "flow", T=1.0, num_steps=2), 0)).get_trace(X, y)
