"""Several target columns and missing targets: the factories' likelihoods, the bound against
dense references, masking as leaving the entries out, per-column metrics, and the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI
from scipy.special import gammaln

import numpyro_dgp as dgp
from numpyro_dgp.models import deep_gp_regression
from tests._mc import z_threshold

jax.config.update("jax_enable_x64", True)

N, M = 12, 4


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = rng.uniform(-1, 1, (N, 2))
    Y = np.stack([np.sin(2 * X[:, 0]), np.cos(X[:, 1])], 1) + 0.1 * rng.randn(N, 2)
    return jnp.asarray(X), jnp.asarray(Y)


def init(model, guide, X, y, **kwargs):
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    return svi.get_params(svi.init(jax.random.PRNGKey(0), X, y, **kwargs))


def elbo_parts(model, guide, params, X, y):
    return dgp.DGPElbo().components(jax.random.PRNGKey(3), params, model, guide, X, jnp.asarray(y))


def last_layer_moments(model, guide, params, X, layer="h1"):
    """The last layer's (mean, var) ``(N, T)`` from the engine (checked against dense algebra
    elsewhere), at a one-layer model: no sampling."""
    from numpyro_dgp._engine.run import marginal_trace

    run = marginal_trace(model, guide, params, jax.random.PRNGKey(0), (X,), {}, objective="predict")
    return [np.asarray(a) for a in run.moments[layer]]


def test_two_columns_are_two_outputs_of_the_last_layer(data):
    X, Y = data
    model = deep_gp_regression(1, num_inducing=M, num_outputs=2, noise_init=0.05)
    guide = dgp.guides.AutoFactorizedDGP(model)
    params = init(model, guide, X, Y)
    assert params["noise"].shape == (2,) and params["h1.u_auto_loc"].shape == (2, M)
    params = {**params, "noise": jnp.asarray([0.05, 0.2])}
    mean, var = last_layer_moments(model, guide, params, X)
    noise = np.array([0.05, 0.2])
    dense = np.sum(-0.5 * np.log(2 * np.pi * noise) - 0.5 * ((np.asarray(Y) - mean) ** 2 + var) / noise)
    # a Gaussian over several outputs takes the exact 2P-node rule
    np.testing.assert_allclose(float(elbo_parts(model, guide, params, X, Y)["expected_log_likelihood"]), dense,
                               rtol=1e-10)
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(1), X, num_samples=3)
    assert pred.mean.shape == (N, 2) and pred.component_means.shape == (3, N, 2)
    np.testing.assert_allclose(pred.mean, mean, rtol=1e-10)
    np.testing.assert_allclose(pred.variance, var + noise, rtol=1e-10)
    # the joint log density of a row is the sum of its columns' (one component)
    columns = dgp.log_likelihood(pred, Y, per_column=True)
    np.testing.assert_allclose(dgp.log_likelihood(pred, Y), np.asarray(columns).sum(1), rtol=1e-10)
    per_column = dgp.metrics(pred, Y, per_column=True)
    np.testing.assert_allclose(per_column["rmse"], np.sqrt(((np.asarray(Y) - mean) ** 2).mean(0)), rtol=1e-10)
    np.testing.assert_allclose(per_column["log_likelihood"], np.asarray(columns).mean(0), rtol=1e-10)
    overall = dgp.metrics(pred, Y, y_scale=np.array([2.0, 3.0]))
    np.testing.assert_allclose(overall["log_likelihood"], float(np.asarray(columns).sum(1).mean()) - np.log(6.0))


def test_masked_targets_are_left_out_of_the_bound(data):
    X, Y = data
    y = np.asarray(Y[:, 0]).copy()
    missing = np.array([1, 4, 5, 9])
    y[missing] = np.nan
    model = deep_gp_regression(1, num_inducing=M, missing_targets="mask")
    guide = dgp.guides.AutoFactorizedDGP(model)
    params = init(model, guide, X, y)
    parts = elbo_parts(model, guide, params, X, y)
    # the same model on the observed rows only: the same KL, the same expected log-likelihood
    keep = np.setdiff1d(np.arange(N), missing)
    plain = deep_gp_regression(1, num_inducing=M)
    params_plain = {**params}
    subset = elbo_parts(plain, guide, params_plain, X[keep], y[keep])
    np.testing.assert_allclose(float(parts["expected_log_likelihood"]), float(subset["expected_log_likelihood"]),
                               rtol=1e-10)
    np.testing.assert_allclose(float(parts["kl_inducing"]), float(subset["kl_inducing"]), rtol=1e-12)
    # fit takes the NaN targets of such a model; the default refuses them, naming y
    result = dgp.fit(SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo()), jax.random.PRNGKey(0), X, y,
                     num_steps=3, progress_bar=False)
    assert np.all(np.isfinite(result.losses))
    with pytest.raises(ValueError, match=r"y contains 4 NaN or inf values"):
        numpyro.handlers.seed(plain, 0)(X, y)
    with pytest.raises(ValueError, match=r"args\[1\] contains NaN .* allow_missing=True"):
        dgp.fit(SVI(plain, dgp.guides.AutoFactorizedDGP(plain), numpyro.optim.Adam(0.01), dgp.DGPElbo()),
                jax.random.PRNGKey(0), X, y, num_steps=2, progress_bar=False)
    with pytest.raises(ValueError, match="infinite values"):
        numpyro.handlers.seed(model, 0)(X, np.where(np.isnan(y), np.inf, y))


def test_a_masked_column_of_several(data):
    X, Y = data
    Y = np.asarray(Y).copy()
    Y[[0, 3], 1] = np.nan
    model = deep_gp_regression(1, num_inducing=M, num_outputs=2, missing_targets="mask", noise_init=0.05)
    guide = dgp.guides.AutoFactorizedDGP(model)
    params = init(model, guide, X, Y)
    mean, var = last_layer_moments(model, guide, params, X)
    present = ~np.isnan(Y)
    terms = -0.5 * np.log(2 * np.pi * 0.05) - 0.5 * ((np.nan_to_num(Y) - mean) ** 2 + var) / 0.05
    np.testing.assert_allclose(float(elbo_parts(model, guide, params, X, Y)["expected_log_likelihood"]),
                               terms[present].sum(), rtol=1e-10)
    # metrics leave the missing targets out, per column and in each row's joint density
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(1), X, num_samples=2)
    rmse = dgp.metrics(pred, Y, per_column=True)["rmse"]
    np.testing.assert_allclose(rmse[1], np.sqrt(((Y[present[:, 1], 1] - mean[present[:, 1], 1]) ** 2).mean()), rtol=1e-10)
    rows = np.asarray(dgp.log_likelihood(pred, Y))
    full = np.asarray(dgp.log_likelihood(pred, np.nan_to_num(Y), per_column=True))
    np.testing.assert_allclose(rows[[0, 3]], full[[0, 3], 0], rtol=1e-10)
    assert np.isnan(np.asarray(dgp.log_likelihood(pred, Y, per_column=True))[0, 1])


def test_user_models_mask_their_own_targets_with_allow_missing(data):
    X, Y = data
    y = np.asarray(Y[:, 0]).copy()
    y[2] = np.nan

    def model(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=M)
        with numpyro.plate("data", X.shape[0]):
            present = None if y is None else ~jnp.isnan(y)
            with numpyro.handlers.mask(mask=True if y is None else present):
                numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=None if y is None else jnp.nan_to_num(y))

    guide = dgp.guides.AutoFactorizedDGP(model)
    result = dgp.fit(SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo()), jax.random.PRNGKey(0), X, y,
                     num_steps=3, progress_bar=False, allow_missing=True)
    assert np.all(np.isfinite(result.losses))
    with pytest.raises(ValueError, match=r"args\[0\] contains NaN"):
        dgp.fit(SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo()), jax.random.PRNGKey(0),
                X.at[0, 0].set(jnp.nan), y, num_steps=2, progress_bar=False, allow_missing=True)


@pytest.mark.parametrize("objective", ["closed form", "predictive"])
def test_raw_nan_targets_under_a_mask_give_finite_gradients(data, objective):
    # jnp.where(mask, log_prob(NaN), 0) is finite, its gradient 0 * NaN is not: the engine must
    # replace the missing values before the density sees them, as NumPyro's masks do
    X, Y = data
    counts = jnp.asarray(np.random.RandomState(1).poisson(2.0, N), jnp.float64).at[3].set(jnp.nan)
    y = counts if objective == "closed form" else Y[:, 0].at[3].set(jnp.nan)

    def model(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=M)
        with numpyro.plate("data", X.shape[0]), numpyro.handlers.mask(mask=~jnp.isnan(y)):
            fn = dgp.likelihoods.poisson(f) if objective == "closed form" else dist.Normal(f[..., 0], 0.3)
            numpyro.sample("y", fn, obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model)
    elbo = dgp.DGPElbo() if objective == "closed form" else dgp.PredictiveObjective(num_particles=2)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), elbo)
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
    loss, grads = jax.value_and_grad(lambda p: elbo.loss(jax.random.PRNGKey(1), p, model, guide, X, y))(params)
    assert np.isfinite(float(loss)) and all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))
    if objective == "closed form":  # one layer in closed form, no draws: the missing entry adds nothing
        keep = np.arange(N) != 3
        without = elbo.loss(jax.random.PRNGKey(1), params, model, guide, X[keep], y[keep])
        np.testing.assert_allclose(float(loss), float(without), rtol=1e-10)


def test_a_mask_outside_to_event_masks_rows(data):
    # mask(Independent(Poisson (B, T), 1)): the (B,) mask leaves out rows; with B == T a mask
    # misaligned to the columns would leave out other entries and give another number
    X, _ = data
    X4 = X[:4]
    counts = jnp.asarray(np.random.RandomState(2).poisson(2.0, (4, 4)), jnp.float64)
    rows = jnp.asarray([True, False, True, True])

    def model(X, y=None, mask=True):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=2, out_dim=4)
        with numpyro.plate("data", X.shape[0]), numpyro.handlers.mask(mask=mask):
            numpyro.sample("y", dgp.likelihoods.poisson(f).to_event(1), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model)
    params = init(model, guide, X4, counts)
    masked = dgp.DGPElbo().components(jax.random.PRNGKey(3), params, model, guide, X4, counts, mask=rows)
    full = dgp.DGPElbo().components(jax.random.PRNGKey(3), params, model, guide, X4, counts)
    mean, var = last_layer_moments(model, guide, params, X4, "f")
    per_entry = np.asarray(counts) * mean - np.exp(mean + var / 2) - gammaln(np.asarray(counts) + 1)
    np.testing.assert_allclose(float(full["expected_log_likelihood"]), per_entry.sum(), rtol=1e-10)
    np.testing.assert_allclose(float(masked["expected_log_likelihood"]), per_entry[np.asarray(rows)].sum(),
                               rtol=1e-10)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(num_outputs=0), ValueError, "num_outputs must be a positive integer"),
    (dict(likelihood="softmax"), ValueError, "needs num_classes, an integer >= 2"),
    (dict(likelihood="softmax", num_classes=1), ValueError, "needs num_classes"),
    (dict(likelihood="softmax", num_classes=3, num_outputs=2), ValueError, "takes one column of labels"),
    (dict(num_classes=3), ValueError, "num_classes is for likelihood='softmax' or 'robust_max'"),
    (dict(missing_targets="impute"), ValueError, "missing_targets must be one of"),
    (dict(likelihood="logistic"), NotImplementedError, "likelihood must be one of"),
])
def test_factories_refuse_bad_target_options(kwargs, error, match):
    for factory in (deep_gp_regression, dgp.models.diffgp, dgp.models.amortized_dgp):
        with pytest.raises(error, match=match):
            factory(**kwargs)


@pytest.mark.parametrize(("likelihood", "extra", "y", "match"), [
    ("softmax", dict(num_classes=3), [0, 1, 3], r"class labels in 0..2 .* e.g. 3"),
    ("probit", {}, [0, 2, 1], r"0/1 labels .* e.g. 2"),
    ("poisson", {}, [0, -1, 2], r"non-negative integer counts .* e.g. -1"),
    ("negative_binomial", {}, [0, 1.5, 2], r"non-negative integer counts .* e.g. 1.5"),
])
def test_models_refuse_targets_their_likelihood_cannot_take(likelihood, extra, y, match):
    model = deep_gp_regression(1, num_inducing=2, likelihood=likelihood, **extra)
    with pytest.raises(ValueError, match=match):
        numpyro.handlers.seed(model, 0)(jnp.zeros((3, 1)), jnp.asarray(y))


def test_amortized_factory_takes_the_likelihood_s_width():
    with pytest.raises(ValueError, match=r"the last width the likelihood's 3 output\(s\)"):
        dgp.models.amortized_dgp(widths=(4, 1), num_inducing=(3, 3), likelihood="softmax", num_classes=3)
    model = dgp.models.amortized_dgp(widths=(4, 3), num_inducing=(3, 3), likelihood="softmax", num_classes=3)
    tr = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(jnp.zeros((5, 2)), jnp.zeros(5, jnp.int32))
    assert type(tr["y"]["fn"]).__name__ == "CategoricalLogits"


@pytest.mark.stochastic
def test_a_row_s_joint_density_keeps_the_outputs_correlation_under_a_joint_guide(data):
    # q(u) of AutoJointDGP ties output 1's inducing values to output 0's (u_1 = u_0 up to 1e-4):
    # f_0 = f_1 at every point, so y_0 and y_1 share their f; a row's density is the bivariate
    # Normal with covariance [[v + s2, v], [v, v + s2]], far from the product of the marginals
    X, Y = data
    noise = 0.05

    def model(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=M, out_dim=2)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f, np.sqrt(noise)).to_event(1), obs=y)

    # at the inducing inputs themselves, f has no variance beyond that of u (up to the jitter)
    X, Y = X[:M], Y[:M]
    guide = dgp.guides.AutoJointDGP(model)
    params = {**init(model, guide, X, Y), "f.inducing_inputs": X}
    A = 0.5 * np.eye(M)
    tril = np.block([[A, np.zeros((M, M))], [A, 1e-4 * np.eye(M)]])
    loc = np.tile(np.linspace(-1.0, 1.0, M), 2)
    params = {**params, "auto_joint_scale_tril": jnp.asarray(tril), "auto_joint_loc": jnp.asarray(loc)}
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(1), X, num_samples=400)
    assert pred.likelihood == "general"  # kept at joint draws
    mean, var = last_layer_moments(model, guide, params, X, "f")  # one layer: every sample's marginal
    np.testing.assert_allclose(mean[:, 1], mean[:, 0], atol=1e-3)
    np.testing.assert_allclose(var[:, 1], var[:, 0], rtol=1e-3)
    m, v = mean[:, 0], var[:, 0]
    rows = np.stack([m + np.sqrt(v), m - np.sqrt(v)], 1)  # y_0 != y_1: unlikely when f_0 = f_1
    # the estimate is the average over the atoms of the row's joint density at each; the S
    # samples of u are independent (the draws within one share its u: at Z they coincide)
    loc_atoms = np.asarray(pred.atoms.loc)  # (S, K, N, 2)
    dens = np.prod(np.exp(-0.5 * (rows - loc_atoms) ** 2 / noise) / np.sqrt(2 * np.pi * noise), axis=-1)
    per_sample = dens.mean(1)  # (S, N)
    estimate = per_sample.mean(0)
    np.testing.assert_allclose(np.asarray(dgp.log_likelihood(pred, rows)), np.log(estimate), rtol=1e-10)
    se = per_sample.std(0, ddof=1) / np.sqrt(per_sample.shape[0])
    cov = np.stack([np.stack([v + noise, v], -1), np.stack([v, v + noise], -1)], -2)  # (N, 2, 2)
    diff = rows - m[:, None]
    exact = np.exp(-0.5 * np.einsum("ni,nij,nj->n", diff, np.linalg.inv(cov), diff)) / (
        2 * np.pi * np.sqrt(np.linalg.det(cov)))
    assert np.all(np.abs(estimate - exact) < z_threshold(M) * se), (estimate, exact, se)
    independent = np.prod(np.exp(-0.5 * diff**2 / (v + noise)[:, None]) / np.sqrt(2 * np.pi * (v + noise))[:, None], 1)
    assert np.all(np.abs(independent - exact) > 10 * z_threshold(M) * se)  # the test tells the two apart
