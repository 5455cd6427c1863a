"""MCMC on the same model: exact_layers, latent_conditionals, and the diagnostics layer."""

import warnings

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

import numpyro_dgp as dgp
from numpyro_dgp import diagnostics, kernels
from numpyro_dgp.handlers import exact_layers, latent_conditionals

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


def test_exact_layers_density_is_the_dense_dgp_prior(data):
    X, y = data
    grid = jnp.array([[-0.5], [0.25], [1.3]])
    model = exact_layers(two_layer, grid=grid, parameterisation="centred", jitter=1e-6)
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


def test_exact_layers_noncentred_matches_centred(data):
    X, y = data
    nc = exact_layers(two_layer, parameterisation="noncentred")
    tr = trace(seed(nc, 1)).get_trace(X, y)
    eps1, eps2 = tr["h1.f_white"]["value"], tr["h2.f_white"]["value"]
    f1 = tr["h1"]["value"]
    L = np.linalg.cholesky(np.asarray(K1(X)) + 1e-6 * np.eye(8))
    np.testing.assert_allclose(np.asarray(f1[:, 0]), np.asarray(X[:, 0]) + L @ np.asarray(eps1[0]), rtol=1e-10)
    assert eps2.shape == (1, 8)


def test_latent_conditionals_density_is_the_sparse_model(data):
    X, y = data
    for full_cov in (False, True):
        model = latent_conditionals(two_layer, parameterisation="centred", full_cov=full_cov)
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
            Kmm = np.asarray(kern(Z)) + 1e-6 * np.eye(4)
            Lm = np.linalg.cholesky(Kmm)
            Kmn = np.asarray(kern(Z, inputs))
            A = np.linalg.solve(Lm, Kmn)  # whitened: f = mean + A^T v
            m = mean + A.T @ values[f"{name}.u"][0]
            C = np.asarray(kern(inputs)) - A.T @ A
            f = values[f"{name}.f"][0]
            if full_cov:
                expected += _mvn_logpdf(f, m, C + 1e-6 * np.eye(8))
            else:
                expected += stats.norm(m, np.sqrt(np.diag(C) + 1e-6)).logpdf(f).sum()
            inputs = f[:, None]
        expected += stats.norm(values["h2.f"][0], 0.1).logpdf(np.asarray(y)).sum()
        np.testing.assert_allclose(float(lp), expected, rtol=1e-9)


def test_handler_errors(data):
    X, y = data
    with pytest.raises(ValueError, match="parameterisation"):
        exact_layers(two_layer, parameterisation="whitened")
    with pytest.raises(ValueError, match="grid must have shape"):
        exact_layers(two_layer, grid=jnp.zeros(3))
    with pytest.raises(ValueError, match="grid contains NaN"):
        exact_layers(two_layer, grid=jnp.array([[jnp.nan]]))
    with pytest.raises(ValueError, match="jitter"):
        exact_layers(two_layer, jitter=0.0)
    with pytest.raises(ValueError, match="width 2"):
        trace(seed(exact_layers(two_layer, grid=jnp.zeros((3, 2))), 0)).get_trace(X, y)
    with pytest.raises(ValueError, match="parameterisation"):
        latent_conditionals(two_layer, parameterisation="x")


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
    ess = np.asarray(numpyro.diagnostics.effective_sample_size(draws))
    flat = draws.reshape(-1, 4)
    # mean: MC standard error sd / sqrt(ESS); variance: sd of a sample variance ~ var sqrt(2 / ESS)
    np.testing.assert_array_less(np.abs(flat.mean(0) - mean), 4 * np.sqrt(var / ess))
    np.testing.assert_array_less(np.abs(flat.var(0) - var), 4 * var * np.sqrt(2 / ess))


# --- collapse_last: the last layer integrated out ---


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
    full = exact_layers(two_layer, parameterisation="centred", jitter=1e-6)
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
    # centred h1 density vs non-centred white: differ by the Jacobian log|det L1|
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


def test_nuts_collapsed_and_uncollapsed_agree():
    """The same posterior by two samplers: NUTS on the collapsed and on the full exact model give the
    same first-layer and last-layer grid moments (within Monte Carlo error) on an easy problem."""
    X = jnp.linspace(-1, 1, 8)[:, None]
    y = jnp.sin(2.5 * X[:, 0])
    grid = jnp.array([[-0.75], [0.1], [0.8]])
    draws = {}
    for collapse in (False, True):
        mcmc = MCMC(NUTS(exact_layers(two_layer, grid=grid, collapse_last=collapse, jitter=1e-6), dense_mass=True),
                    num_warmup=400, num_samples=1500, num_chains=2, chain_method="sequential", progress_bar=False)
        mcmc.run(jax.random.PRNGKey(2), X, y)
        s = mcmc.get_samples(group_by_chain=True)
        draws[collapse] = {n: np.asarray(s[f"{n}.grid"][..., 0]) for n in ("h1", "h2")}
    for name in ("h1", "h2"):
        a, b = draws[False][name], draws[True][name]
        ess = np.minimum(numpyro.diagnostics.effective_sample_size(a), numpyro.diagnostics.effective_sample_size(b))
        a, b = a.reshape(-1, 3), b.reshape(-1, 3)
        sd = np.sqrt(0.5 * (a.var(0) + b.var(0)))
        np.testing.assert_array_less(np.abs(a.mean(0) - b.mean(0)), 5 * sd * np.sqrt(2 / ess))
        np.testing.assert_array_less(np.abs(np.log(a.var(0) / b.var(0))), 5 * np.sqrt(4 / ess))


# --- mode evidence ---


def test_mode_evidence_is_the_gp_marginal_likelihood():
    """A plain GP under exact_layers: the posterior over the whitened values is Gaussian, its mass
    is the marginal likelihood log N(y | 0, K + s^2 I); mode_evidence recovers it from exact draws."""
    X = jnp.linspace(-1, 1, 10)[:, None]
    y = jnp.sin(3 * X[:, 0])
    kern = kernels.RBF(variance=1.0, lengthscale=0.5)
    K = np.asarray(kern(X)) + 1e-6 * np.eye(10)
    L = np.linalg.cholesky(K)
    precision = np.eye(10) + L.T @ L / 0.01
    cov = np.linalg.inv(precision)
    mean = cov @ L.T @ np.asarray(y) / 0.01
    rng = np.random.default_rng(0)
    draws = rng.multivariate_normal(mean, cov, size=(2, 2000))[:, :, None, :]  # (chain, draw, P, N)
    model = exact_layers(one_layer, jitter=1e-6)
    ev = diagnostics.mode_evidence(model, {"f.f_white": draws}, [[0, 1]], jax.random.PRNGKey(0), X, y)
    expected = _mvn_logpdf(np.asarray(y), np.zeros(10), K + 0.01 * np.eye(10))
    assert abs(ev.log_evidence[0] - expected) < max(5 * ev.log_evidence_se[0], 0.02)
    assert ev.khat[0] < 0.7 and ev.weights[0] == 1.0


def test_mode_evidence_weighs_separated_modes_by_their_mass():
    """A two-component mixture in 3-D with weights 0.25 / 0.75: chains that each stay in one
    component get the components' weights back, and the mixture pools their draws by them."""

    def bimodal():
        numpyro.sample("x", dist.MixtureSameFamily(
            dist.Categorical(probs=jnp.array([0.25, 0.75])),
            dist.MultivariateNormal(jnp.array([[-6.0, 0.0, 1.0], [6.0, 1.0, -1.0]]), jnp.eye(3) * jnp.array([1.0, 0.5])[:, None, None])))

    rng = np.random.default_rng(1)
    left = rng.multivariate_normal([-6.0, 0.0, 1.0], np.eye(3), size=(2, 1500))
    right = rng.multivariate_normal([6.0, 1.0, -1.0], 0.5 * np.eye(3), size=(1, 1500))
    samples = {"x": np.concatenate([left, right])}  # chains 0, 1 in the left mode, 2 in the right
    ev = diagnostics.mode_evidence(bimodal, samples, [[0, 1], [2]], jax.random.PRNGKey(0))
    np.testing.assert_allclose(ev.weights, [0.25, 0.75], atol=0.01)
    np.testing.assert_allclose(ev.log_evidence, np.log([0.25, 0.75]), atol=0.03)
    grid = np.zeros((1, 1))
    tree = _tree({"h": samples["x"][..., :1, None]}, grid, chains=3)
    pooled = diagnostics.mode_mixture(tree, ev, jax.random.PRNGKey(1), num_draws=20000)
    share_right = float((np.asarray(pooled["posterior"]["h"].values) > 0).mean())
    assert abs(share_right - 0.75) < 0.015  # a chain count would say 1/3
    with pytest.raises(ValueError, match="chains outside"):
        diagnostics.mode_evidence(bimodal, samples, [[0], [5]], jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="lack the model's latent sites"):
        diagnostics.mode_evidence(bimodal, {"z": samples["x"]}, [[0]], jax.random.PRNGKey(0))


# --- diagnostics ---


def test_wasserstein_1d_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=300), rng.normal(0.4, 2.0, size=170)
    assert diagnostics.wasserstein_1d(a, b) == pytest.approx(stats.wasserstein_distance(a, b), rel=1e-12)
    assert diagnostics.wasserstein_1d(a, a + 0.3) == pytest.approx(0.3, rel=1e-12)


def _tree(draws_by_layer, grid, chains=1, **kw):
    return diagnostics.from_layer_samples(draws_by_layer, grid, num_chains=chains, **kw)


def test_layer_metrics_on_known_gaussians():
    rng = np.random.default_rng(0)
    grid = np.linspace(-1, 1, 3)[:, None]
    S = 40000
    mc = _tree({"h1": rng.normal(size=(S, 3, 1)), "h2": rng.normal(1.0, 2.0, size=(S, 3, 1))}, grid, chains=4)
    vi = _tree({"h1": 0.5 * rng.normal(size=(S, 3, 1)), "h2": rng.normal(1.0, 2.0, size=(S, 3, 1))}, grid)
    table = diagnostics.layer_metrics(vi, mc, interval=0.9)
    h1, h2 = table[table.layer == "h1"], table[table.layer == "h2"]
    np.testing.assert_allclose(h1.variance_ratio, 0.25, rtol=0.03)
    np.testing.assert_allclose(h2.variance_ratio, 1.0, rtol=0.03)
    # VI interval +-1.645 * 0.5 covers P(|z| < 0.82) of the MCMC mass
    np.testing.assert_allclose(h1.coverage, 2 * stats.norm.cdf(0.5 * 1.6449) - 1, atol=0.01)
    np.testing.assert_allclose(h2.coverage, 0.9, atol=0.01)
    # W1 between N(0, 0.25) and N(0, 1): E|Z| (1 - 0.5) = sqrt(2 / pi) / 2
    np.testing.assert_allclose(h1.wasserstein, np.sqrt(2 / np.pi) * 0.5, rtol=0.03)
    np.testing.assert_allclose(h1.kl_gaussian, 0.5 * (np.log(4) + 0.25 - 1), rtol=0.03)
    assert (h2.wasserstein < 0.06).all()


def test_mcmc_health_flags_chains_in_different_modes():
    rng = np.random.default_rng(1)
    grid = np.zeros((2, 1))
    good = rng.normal(size=(4, 600, 2, 1))
    health = diagnostics.mcmc_health(_tree({"h1": good}, grid), warn=True)
    assert not health.multimodal and health.modes == [[0, 1, 2, 3]]
    assert health.table.max_rhat[0] < 1.01 and health.table.ok[0]
    split = good.copy()
    split[[1, 3]] += 5.0  # two chains stuck in a mirrored composition
    with pytest.warns(diagnostics.MultimodalityWarning, match=r"2 different modes \[\[0, 2\], \[1, 3\]\]"):
        health = diagnostics.mcmc_health(_tree({"h1": split}, grid))
    assert health.multimodal and health.table.max_rhat[0] > 1.5 and not health.table.ok[0]
    means = health.chain_means.query("grid == 0").set_index("chain")["mean"]
    assert means[1] - means[0] == pytest.approx(5.0, abs=0.2)


def test_trees_from_guide_and_from_mcmc_share_a_layout(data):
    X, y = data
    grid = jnp.linspace(-1, 1, 5)[:, None]
    guide = dgp.guides.AutoFactorisedDGP(two_layer)
    svi = numpyro.infer.SVI(two_layer, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=20, progress_bar=False)
    vi = diagnostics.from_guide(two_layer, guide, result.params, jax.random.PRNGKey(1), grid, num_samples=50, label="dsvi")
    assert diagnostics.layer_names(vi) == ["h1", "h2"]
    assert vi["posterior"]["h1"].shape == (1, 50, 5, 1)
    # sparse-model MCMC: u sampled, layers re-run on the grid
    fixed = {k: v for k, v in result.params.items() if "inducing_inputs" in k or ".mean." in k}
    model = substitute(latent_conditionals(two_layer), data=fixed)
    mcmc = MCMC(NUTS(model, max_tree_depth=3), num_warmup=10, num_samples=20, num_chains=2,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), X, y)
    with pytest.raises(ValueError, match="pass model= and rng_key="):
        diagnostics.from_mcmc(mcmc, grid)
    mc = diagnostics.from_mcmc(mcmc, grid, model=two_layer, params=result.params, rng_key=jax.random.PRNGKey(3))
    assert mc["posterior"]["h2"].shape == (2, 20, 5, 1)
    assert "diverging" in mc["sample_stats"]
    # exact model: grid sites used as they are
    mcmc = MCMC(NUTS(exact_layers(two_layer, grid=grid), max_tree_depth=3), num_warmup=10, num_samples=20,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), X, y)
    exact = diagnostics.from_mcmc(mcmc, grid)
    with pytest.raises(ValueError, match="grid has 5 points"):
        diagnostics.from_mcmc(mcmc, grid[:3])
    np.testing.assert_array_equal(exact["posterior"]["h1"].values[0], np.asarray(mcmc.get_samples()["h1.grid"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", diagnostics.MultimodalityWarning)
        comp = diagnostics.compare({"dsvi": vi}, exact, points=[1, 2, 3])
    assert set(comp.summary.layer) == {"h1", "h2"} and len(comp.table) == 10
    assert set(comp.figures) == {"layers", "marginals"}
    with pytest.raises(ValueError, match="different grids"):
        diagnostics.layer_metrics(vi, diagnostics.from_layer_samples({"h1": np.zeros((4, 5, 1)), "h2": np.zeros((4, 5, 1))}, grid + 1))
