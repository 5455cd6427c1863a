"""Diagnostics: ArviZ trees, per-layer metrics, MCMC health, mode evidence."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.handlers import substitute
from numpyro.infer import MCMC, NUTS
from scipy import stats

import numpyro_dgp as dgp
from numpyro_dgp import diagnostics, kernels
from numpyro_dgp.handlers import exact_layers, latent_conditionals
from tests._mc import z_threshold

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


def _tree(draws_by_layer, grid, chains=1, **kw):
    return diagnostics.from_layer_samples(draws_by_layer, grid, num_chains=chains, **kw)


@pytest.mark.stochastic
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


@pytest.mark.stochastic
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
    # within z of the estimates' own standard errors (4 comparisons): the masses, the left weight
    # sigmoid(log Z_0 - log Z_1) by the delta method, and the pooled draws' share of the right mode
    z = z_threshold(4)
    se = np.asarray(ev.log_evidence_se)
    np.testing.assert_array_less(np.abs(ev.log_evidence - np.log([0.25, 0.75])), z * se)
    assert abs(ev.weights[0] - 0.25) < z * ev.weights[0] * ev.weights[1] * np.hypot(*se)
    assert 0.2 < ev.weights[0] < 0.3  # the standard errors are not vacuous
    grid = np.zeros((1, 1))
    tree = _tree({"h": samples["x"][..., :1, None]}, grid, chains=3)
    pooled = diagnostics.mode_mixture(tree, ev, jax.random.PRNGKey(1), num_draws=20000)
    share_right = float((np.asarray(pooled["posterior"]["h"].values) > 0).mean())
    w = float(ev.weights[1])  # a chain count would say 1/3
    assert abs(share_right - w) < z * np.sqrt(w * (1 - w) / 20000)
    with pytest.raises(ValueError, match="chains outside"):
        diagnostics.mode_evidence(bimodal, samples, [[0], [5]], jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="lack the model's latent sites"):
        diagnostics.mode_evidence(bimodal, {"z": samples["x"]}, [[0]], jax.random.PRNGKey(0))


def test_wasserstein_1d_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=300), rng.normal(0.4, 2.0, size=170)
    assert diagnostics.wasserstein_1d(a, b) == pytest.approx(stats.wasserstein_distance(a, b), rel=1e-12)
    assert diagnostics.wasserstein_1d(a, a + 0.3) == pytest.approx(0.3, rel=1e-12)


@pytest.mark.stochastic
def test_layer_metrics_on_known_gaussians():
    rng = np.random.default_rng(0)
    grid = np.linspace(-1, 1, 3)[:, None]
    S = 40000
    mc = _tree({"h1": rng.normal(size=(S, 3, 1)), "h2": rng.normal(1.0, 2.0, size=(S, 3, 1))}, grid, chains=4)
    vi = _tree({"h1": 0.5 * rng.normal(size=(S, 3, 1)), "h2": rng.normal(1.0, 2.0, size=(S, 3, 1))}, grid)
    table = diagnostics.layer_metrics(vi, mc, interval=0.9)
    h1, h2 = table[table.layer == "h1"], table[table.layer == "h2"]
    # Tolerances from each statistic's standard error with S draws a side, z for the 18 comparisons
    # below. A ratio of Gaussian sample variances: relative error sqrt(2 / S + 2 / S).
    z = z_threshold(18)
    rel = np.sqrt(4 / S)
    np.testing.assert_allclose(h1.variance_ratio, 0.25, rtol=z * rel)
    np.testing.assert_allclose(h2.variance_ratio, 1.0, rtol=z * rel)
    # Coverage: the binomial error of the MCMC fraction, plus the VI interval's estimated ends
    # (a quantile's error is sqrt(p (1 - p) / S) / pdf_VI at it; it moves the coverage by pdf_MCMC).
    for rows, sd_vi, sd_mc in ((h1, 0.5, 1.0), (h2, 2.0, 2.0)):
        end = 1.6449 * sd_vi
        cover = 2 * stats.norm.cdf(end / sd_mc) - 1  # h1: P(|z| < 0.82); h2: 0.9
        ratio = stats.norm.pdf(end, scale=sd_mc) / stats.norm.pdf(end, scale=sd_vi)
        se = np.sqrt(cover * (1 - cover) / S + 2 * ratio**2 * 0.05 * 0.95 / S)
        np.testing.assert_allclose(rows.coverage, cover, atol=z * se)
    # W1 between N(0, 0.25) and N(0, 1): E|Z| (1 - 0.5) = sqrt(2 / pi) / 2; its error is below that
    # of a difference of two sample means, sqrt((0.25 + 1) / S)
    np.testing.assert_allclose(h1.wasserstein, np.sqrt(2 / np.pi) * 0.5, atol=z * np.sqrt(1.25 / S))
    # KL of the moment-matched Gaussians, 0.5 (log(1 / r) + r - 1) at the variance ratio r = 0.25:
    # the delta method gives a standard error |0.5 (1 - 1 / r)| r rel
    np.testing.assert_allclose(h1.kl_gaussian, 0.5 * (np.log(4) + 0.25 - 1), atol=z * 1.5 * 0.25 * rel)
    assert (h2.wasserstein < 0.06).all()


@pytest.mark.stochastic
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
    # a difference of two means of 600 unit-variance draws
    assert means[1] - means[0] == pytest.approx(5.0, abs=z_threshold() * np.sqrt(2 / 600))


def test_trees_from_guide_and_from_mcmc_share_a_layout(data):
    X, y = data
    grid = jnp.linspace(-1, 1, 5)[:, None]
    guide = dgp.guides.AutoFactorizedDGP(two_layer)
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


def test_from_layer_samples_refuses_samples_that_do_not_split_into_the_chains():
    """Ten samples cannot be three equal chains: refused, naming both numbers."""
    layers = {"h1": np.zeros((10, 5, 1))}
    with pytest.raises(ValueError, match="10 samples do not split into num_chains=3"):
        diagnostics.from_layer_samples(layers, np.zeros((5, 1)), num_chains=3)
    assert diagnostics.from_layer_samples(layers, np.zeros((5, 1)), num_chains=2)["posterior"]["h1"].shape == (2, 5, 5, 1)


def test_layer_samples_refuses_samples_without_a_layers_inducing_values(data):
    """Samples that lack one layer's inducing values are refused, naming the site: drawing them
    from the prior instead would mix prior and posterior draws without a word."""
    X, _ = data
    samples = {"h1.u": jnp.zeros((3, 1, 4)), "h2.u": jnp.zeros((3, 1, 4))}
    grid = jnp.linspace(-1.0, 1.0, 5)[:, None]
    layers = diagnostics.layer_samples(two_layer, samples, jax.random.PRNGKey(0), grid)
    assert layers["h1"].shape == (3, 5, 1) and layers["h2"].shape == (3, 5, 1)
    for dropped in ("h1.u", "h2.u"):
        partial = {k: v for k, v in samples.items() if k != dropped}
        with pytest.raises(ValueError, match=rf"lack the inducing-value sites \['{dropped}'\]"):
            diagnostics.layer_samples(two_layer, partial, jax.random.PRNGKey(0), grid)


def test_layer_metrics_and_mode_evidence_refuse_bad_arguments():
    """The refusals of a central interval outside (0, 1), no modes, too few proposal draws and a
    mode of one draw (a Gaussian needs two)."""
    tree = _tree({"h": np.zeros((4, 2, 1))}, np.zeros((2, 1)))
    with pytest.raises(ValueError, match=r"interval must be in \(0, 1\), got 1.0"):
        diagnostics.layer_metrics(tree, tree, interval=1.0)

    def normal():
        numpyro.sample("x", dist.Normal(0.0, 1.0))

    samples, key = {"x": np.zeros((2, 3))}, jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="modes must be non-empty lists of chain indices"):
        diagnostics.mode_evidence(normal, samples, [], key)
    with pytest.raises(ValueError, match="num_draws must be at least 100, got 10"):
        diagnostics.mode_evidence(normal, samples, [[0]], key, num_draws=10)
    with pytest.raises(ValueError, match=r"mode \[0\] has 1 draw\(s\); at least 2 are needed"):
        diagnostics.mode_evidence(normal, {"x": np.zeros((2, 1))}, [[0]], key)
