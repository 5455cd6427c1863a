"""gp_layer: sites, options (mean functions, fixed/learned parameters, k-means) and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp._protocol import inducing_tag
from tests._mc import z_threshold


def run_layer(X, seed=0, **kwargs):
    def model():
        return dgp.gp_layer("h", X, kwargs.pop("kernel", dgp.kernels.RBF()), **kwargs)

    return handlers.trace(handlers.seed(model, seed)).get_trace()


def test_sites_and_shapes():
    X = jnp.asarray(np.random.RandomState(0).randn(20, 3))
    tr = run_layer(X, num_inducing=6, out_dim=2)
    assert tr["h.u"]["type"] == "sample" and tr["h.u"]["value"].shape == (2, 6)
    assert inducing_tag(tr["h.u"]).layer == "h"
    assert tr["h.layer"]["type"] == "dgp_layer"
    assert tr["h"]["type"] == "deterministic" and tr["h"]["value"].shape == (20, 2)
    assert tr["h.inducing_inputs"]["value"].shape == (6, 3)
    assert tr["h.kernel.lengthscale"]["value"].shape == (3,)  # ARD by default
    assert tr["h.kernel.variance"]["type"] == "param"


@pytest.mark.stochastic
def test_default_propagation_is_the_conditional_given_u():
    """Draws of the layer output given u have the conditional mean and variance of p(f | u)."""
    X = jnp.linspace(-1, 1, 4)[:, None]
    Z = jnp.linspace(-1, 1, 3)[:, None]
    k = dgp.kernels.RBF(variance=0.7, lengthscale=0.5)
    u = jnp.array([[0.3, -1.0, 0.5]])

    def model():
        return dgp.gp_layer("h", X, k, inducing_inputs=Z, jitter=1e-9)

    draws = jax.vmap(lambda key: handlers.seed(handlers.condition(model, {"h.u": u}), key)())(
        jax.random.split(jax.random.PRNGKey(0), 40_000))[..., 0]
    Kzz = np.asarray(k(Z)) + 1e-9 * np.eye(3)
    L = np.linalg.cholesky(Kzz)
    A = np.linalg.solve(L, np.asarray(k(Z, X)))
    mean = A.T @ np.asarray(u[0])  # whitened: u - mu(Z) = L v
    var = 0.7 - (A**2).sum(0)
    # 8 comparisons; the sample variance of Gaussian draws has standard error var sqrt(2 / S), and
    # where X meets Z the variance is at round-off level
    z, S = z_threshold(8), draws.shape[0]
    np.testing.assert_array_less(np.abs(np.asarray(draws).mean(0) - mean), z * np.sqrt(var / S) + 1e-6)
    np.testing.assert_array_less(np.abs(np.asarray(draws).var(0) - var), z * var * np.sqrt(2 / S) + 1e-6)


@pytest.mark.parametrize("num_points, options", [
    (9, {}),
    (10, {"whiten": False}),
    (11, {"inducing": "locations", "mean": "linear"}),
    (12, {"noise": 0.05, "mean": "linear", "out_dim": 2}),
    (13, {"mean": "identity", "out_dim": 3}),
    (14, {"mean": "identity", "out_dim": 2}),
    (1, {}),
])
def test_eager_layer_draw_is_the_traced_layer_s_draw(num_points, options):
    """Run eagerly (svi.init) or traced (a training step), the same key gives the same draw of
    f(X) | u, for every named mean, whitened or not, inducing locations, a noisy layer, one
    point."""
    X = jnp.asarray(np.random.RandomState(4).randn(num_points, 3))  # a shape per case

    def model():
        out = dgp.gp_layer("h", X, dgp.kernels.RBF(), num_inducing=5, **options)
        return out[0] if isinstance(out, tuple) else out

    eager = handlers.seed(model, 3)()
    traced = jax.jit(lambda: handlers.seed(model, 3)())()
    np.testing.assert_allclose(eager, traced, rtol=1e-10, atol=1e-12)


def test_a_kernel_with_an_array_setting_runs_eagerly_again_and_trains():
    """A user's kernel whose static setting is an array cannot be an argument of the kernels'
    compiled Gram function (JAX fails comparing it with a compiled program's, the second time),
    so it is evaluated operation by operation: it runs eagerly twice with the same values, gives
    the values of a traced run, and trains."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class ScaledRBF(dgp.kernels.RBF):
        scales: np.ndarray = dataclasses.field(default_factory=lambda: np.array([1.0, 2.0]))

        def _scaled_sqdist(self, X1, X2):
            return super()._scaled_sqdist(X1 * self.scales, X2 * self.scales)

    assert not dgp.kernels.is_jit_argument(ScaledRBF())
    assert dgp.kernels.is_jit_argument(dgp.kernels.RBF() + dgp.kernels.Linear())
    X = jnp.asarray(np.random.RandomState(6).randn(16, 2))
    y = jnp.sin(X[:, 0])

    def model(X, y=None):
        # a new kernel (a new array) in every run, as a model builds it
        f = dgp.gp_layer("h", X, ScaledRBF(), num_inducing=4)
        numpyro.sample("y", dist.Normal(f[:, 0], 0.1), obs=y)

    runs = [handlers.trace(handlers.seed(model, 0)).get_trace(X, y)["h"]["value"] for _ in range(2)]
    np.testing.assert_array_equal(runs[0], runs[1])
    traced = jax.jit(lambda: handlers.trace(handlers.seed(model, 0)).get_trace(X, y)["h"]["value"])()
    np.testing.assert_allclose(runs[0], traced, rtol=1e-9, atol=1e-12)  # the step's route
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=3, progress_bar=False)
    assert np.all(np.isfinite(result.losses))


@pytest.mark.stochastic
def test_kmeans_initialization_finds_clusters():
    rng = np.random.RandomState(1)
    centers = np.array([[-3.0, 0.0], [0.0, 3.0], [3.0, -1.0]])
    sd, n = 0.05, 30
    X = jnp.asarray(np.concatenate([c + sd * rng.randn(n, 2) for c in centers]))
    Z = np.asarray(run_layer(X, num_inducing=3)["h.inducing_inputs"]["value"])
    found = Z[np.argsort(Z[:, 0])]
    # the blob means: 6 coordinates, each with standard error sd / sqrt(n)
    np.testing.assert_allclose(found, centers, atol=z_threshold(6) * sd / np.sqrt(n))


def test_fewer_points_than_inducing_points_start_from_the_points_and_draws_around_them():
    """A layer that sees fewer points than M at initialization (a minibatch smaller than M):
    the points themselves, then distinct draws (k-means would refuse: it has no M centers)."""
    X = jnp.linspace(0, 1, 8)[:, None]
    tr = run_layer(X, num_inducing=50)
    Z = np.asarray(tr["h.inducing_inputs"]["value"])
    assert Z.shape == (50, 1) and np.all(np.isfinite(Z))
    np.testing.assert_array_equal(Z[:8], np.asarray(X))
    assert np.min(np.diff(np.sort(Z[:, 0]))) > 0  # no two coincide: K(Z, Z) invertible
    layer = tr["h.layer"]["args"][0]
    assert np.all(np.isfinite(np.asarray(layer.Kmm_chol)))
    assert tr["h.u"]["value"].shape == (1, 50) and np.all(np.isfinite(np.asarray(tr["h"]["value"])))


@pytest.mark.stochastic
def test_gaussian_draws_have_the_points_mean_and_covariance():
    from numpyro_dgp.layers._parts import points_and_gaussian_draws

    rng = np.random.RandomState(4)
    points = rng.randn(30, 3) @ np.array([[2.0, 0.0, 0.0], [1.0, 0.5, 0.0], [0.0, -0.3, 0.2]]) + 5.0
    K = 40_000
    Z = np.asarray(points_and_gaussian_draws(jnp.asarray(points), 30 + K))
    np.testing.assert_array_equal(Z[:30], points)
    draws = Z[30:]
    mean, cov = points.mean(0), np.cov(points.T)
    cov = cov + dgp.core.default_jitter(np.float64) * np.trace(cov) / 3 * np.eye(3)
    sd = np.sqrt(np.diag(cov))
    # 3 means and 6 covariance entries, each against its Monte Carlo standard error
    z = z_threshold(9)
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), z * sd / np.sqrt(K))
    rows, cols = np.triu_indices(3)
    se = np.sqrt((cov[rows, rows] * cov[cols, cols] + cov[rows, cols] ** 2) / K)
    np.testing.assert_array_less(np.abs(np.cov(draws.T)[rows, cols] - cov[rows, cols]), z * se)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gaussian_draws_from_degenerate_points_stay_distinct(dtype):
    from numpyro_dgp.layers._parts import points_and_gaussian_draws

    ridge = dgp.core.default_jitter(dtype)
    # identical points: a unit covariance around them
    same = np.asarray(points_and_gaussian_draws(jnp.full((3, 2), 7.0, dtype), 2003))[3:]
    np.testing.assert_allclose(same.var(0), 1.0, atol=z_threshold(2) * np.sqrt(2 / 2000))
    # two points in 4-D: the draws lie along their line, off it only by the ridge's spread
    ends = np.array([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 0.0, 3.0]])
    Z = np.asarray(points_and_gaussian_draws(jnp.asarray(ends, dtype), 200), np.float64)
    direction = (ends[1] - ends[0]) / np.linalg.norm(ends[1] - ends[0])
    offset = Z - ends[0]
    across = offset - np.outer(offset @ direction, direction)
    scale = np.trace(np.cov(ends.T)) / 4
    assert 0 < np.max(np.linalg.norm(across, axis=1)) < 10 * np.sqrt(ridge * scale)
    gaps = np.linalg.norm(Z[:, None] - Z[None], axis=-1)[np.triu_indices(200, 1)]
    assert np.all(np.isfinite(Z)) and gaps.min() > 0
    # 5 points in 90 dimensions: a covariance of rank 4, whose round-off the ridge outweighs
    few = np.random.RandomState(5).randn(5, 90).astype(dtype)
    assert np.all(np.isfinite(np.asarray(points_and_gaussian_draws(jnp.asarray(few), 50))))


def test_mean_functions():
    rng = np.random.RandomState(2)
    X = jnp.asarray(rng.randn(40, 5) * np.array([5.0, 2.0, 1.0, 0.5, 0.1]))
    # wider input than output: the PCA projection of the (uncentered) inputs, fixed
    tr = run_layer(X, num_inducing=4, out_dim=2, mean="identity")
    W = np.asarray(tr["h.mean.weight"]["value"])
    _, _, Vt = np.linalg.svd(np.asarray(X), full_matrices=False)
    np.testing.assert_allclose(np.abs(W), np.abs(Vt[:2].T), atol=1e-10)
    # narrower input than output: zero padding
    tr = run_layer(X[:, :2], num_inducing=4, out_dim=3, mean="identity")
    np.testing.assert_array_equal(tr["h.mean.weight"]["value"], np.eye(2, 3))
    # linear: learnable weight and bias
    tr = run_layer(X, num_inducing=4, out_dim=2, mean="linear")
    assert "h.mean.bias" in tr and tr["h.mean.weight"]["value"].shape == (5, 2)
    # same width: no parameter, and a zero-variance layer returns its input
    tr = run_layer(X[:, :2], num_inducing=4, out_dim=2, mean="identity")
    assert "h.mean.weight" not in tr
    # callable
    tr = run_layer(X[:, :1], num_inducing=3, mean=lambda A: 2 * A, kernel=dgp.kernels.RBF(variance=1e-12))
    np.testing.assert_allclose(tr["h"]["value"], 2 * np.asarray(X[:, :1]), atol=1e-4)


def test_fixed_inducing_inputs_hyperparameters_and_identity_mean_do_not_move():
    rng = np.random.RandomState(3)
    X = jnp.asarray(rng.randn(25, 3))
    y = jnp.asarray(rng.randn(25))

    def model(X, y=None):
        h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=5, out_dim=2, mean="identity",
                         learn_inducing=False, learn_hyperparameters=False)
        f = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=5)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.3), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.05), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y)
    before = svi.get_params(state)
    after = dgp.fit(svi, None, X, y, num_steps=30, init_state=state, progress_bar=False).params
    for fixed in ("h1.inducing_inputs", "h1.kernel.variance", "h1.kernel.lengthscale", "h1.mean.weight"):
        np.testing.assert_array_equal(after[fixed], before[fixed])
    for learned in ("h2.inducing_inputs", "h2.kernel.lengthscale", "h1.u_auto_loc"):
        assert not np.allclose(after[learned], before[learned])


def test_inducing_inputs_argument():
    X = jnp.linspace(0, 1, 10)[:, None]
    Z = jnp.array([[0.1], [0.5], [0.9]])
    tr = run_layer(X, inducing_inputs=Z)
    np.testing.assert_array_equal(tr["h.inducing_inputs"]["value"], Z)
    with pytest.raises(ValueError, match=r"inducing_inputs must have shape \(M, 1\)"):
        run_layer(X, inducing_inputs=jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="disagrees"):
        run_layer(X, inducing_inputs=Z, num_inducing=4)
    with pytest.raises(ValueError, match="inducing_inputs contains NaN"):
        run_layer(X, inducing_inputs=Z.at[0, 0].set(jnp.nan))


def _unchecked(kernel, *values):
    """``kernel`` with these hyperparameter values, bypassing the constructor's checks."""
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(kernel), values)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(X=jnp.ones(5), num_inducing=2), ValueError, r"X must have shape \(num_points, dim\)"),
        (dict(X=jnp.ones((5, 1)).at[2, 0].set(jnp.nan), num_inducing=2), ValueError, "X contains NaN"),
        # kernels refuse such values at construction; built as pytrees they reach the layer's own check
        (dict(num_inducing=2, kernel=_unchecked(dgp.kernels.RBF(), -1.0, 1.0)), ValueError, "'variance' must be positive"),
        (dict(num_inducing=2, kernel=_unchecked(dgp.kernels.Matern32(), 1.0, 0.0)), ValueError,
         "'lengthscale' must be positive"),
        (dict(num_inducing=2, jitter=0.0), ValueError, "jitter must be a finite positive"),
        (dict(num_inducing=2, jitter=float("nan")), ValueError, "jitter"),
        (dict(), ValueError, "give num_inducing"),
        (dict(num_inducing=2, out_dim=0), ValueError, "out_dim must be a positive integer"),
        (dict(num_inducing=2, mean="quadratic"), ValueError, "mean must be one of"),
        (dict(num_inducing=2, priors={"period": dist.LogNormal()}), ValueError, "not a hyperparameter"),
        (dict(num_inducing=2, inducing="per_batch"), NotImplementedError, "inducing='per_batch'"),
        (dict(num_inducing=2, inducing="amortized"), ValueError, "inside the data plate"),
        (dict(num_inducing=2, inducing="locations", whiten=True), ValueError, "whiten"),
        (dict(num_inducing=2, kernel="rbf"), TypeError, "kernel must be"),
        (dict(num_inducing=2, priors={"variance": 1.0}), TypeError, r"priors\['variance'\] must be a Distribution"),
        (dict(X=(jnp.ones((4, 1)), jnp.ones((2, 1)))), ValueError, "only inducing='locations' takes"),
        (dict(X=(jnp.ones((4, 1)),) * 3, inducing="locations"), ValueError, "or the pair \\(X, Z\\); got 3 items"),
        (dict(X=(jnp.ones((4, 1)), jnp.ones((2, 1))), inducing="locations", inducing_inputs=jnp.ones((2, 1))),
         ValueError, "do not also pass inducing_inputs"),
        (dict(num_inducing=2, inducing="amortized", inducing_inputs=jnp.ones((2, 1))), ValueError,
         "inducing_inputs cannot be given"),
        (dict(num_inducing=2, inducing="amortized", priors={"variance": dist.LogNormal()}), ValueError,
         "priors are not available"),
    ],
)
def test_bad_input_names_the_argument(kwargs, error, match):
    X = kwargs.pop("X", jnp.linspace(0, 1, 8)[:, None])
    with pytest.raises(error, match=match):
        run_layer(X, **kwargs)


def test_guides_refuse_models_they_cannot_handle():
    def no_layers(X, y=None):
        numpyro.sample("y", dist.Normal(X[:, 0], 1.0), obs=y)

    X = jnp.ones((4, 1))
    with pytest.raises(ValueError, match="no gp_layer"):
        handlers.seed(dgp.guides.AutoFactorizedDGP(no_layers), 0)(X)

    def layer_in_plate(X, y=None):
        with numpyro.plate("data", X.shape[0]):
            f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=2)
            numpyro.sample("y", dist.Normal(f[..., 0], 1.0), obs=y)

    with pytest.raises(ValueError, match=r"'f' is called inside plate\(s\) \['data'\]"):
        handlers.seed(dgp.guides.AutoFactorizedDGP(layer_in_plate), 0)(jnp.linspace(0, 1, 4)[:, None])
    with pytest.raises(ValueError, match="inner_init"):
        dgp.guides.AutoFactorizedDGP(no_layers, inner_init="zero")


def test_model_without_seed_explains_itself():
    with pytest.raises(RuntimeError, match="needs a random key"):
        dgp.gp_layer("h", jnp.ones((3, 1)), dgp.kernels.RBF(), inducing_inputs=jnp.ones((1, 1)))


def test_float32_layer_uses_float32_jitter():
    X = jnp.linspace(0, 1, 50, dtype=jnp.float32)[:, None]
    tr = run_layer(X, num_inducing=10)
    assert tr["h"]["value"].dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(tr["h"]["value"])))
    assert tr["h.layer"]["args"][0].jitter == dgp.core.default_jitter(jnp.float32)


# --- output noise: gp_layer(..., noise=...) ---------------------------------------------------


def test_noise_is_a_positive_learned_param_and_checked():
    X = jnp.asarray(np.random.RandomState(0).randn(10, 2))
    tr = run_layer(X, num_inducing=4, noise=0.03)
    assert tr["h.noise"]["type"] == "param" and float(tr["h.noise"]["value"]) == pytest.approx(0.03)
    assert tr["h.layer"]["args"][0].noise is not None
    assert "h.noise" not in run_layer(X, num_inducing=4)  # default: a noiseless layer, as before
    for bad in (0.0, -1.0, float("nan"), [0.1, 0.2]):
        with pytest.raises(ValueError, match="noise must be a finite positive scalar"):
            run_layer(X, num_inducing=4, noise=bad)


def test_a_substituted_hyperparameter_that_is_not_positive_names_its_layer():
    """A value given for a hyperparameter site (e.g. loaded parameters) is checked by the kernel;
    the error names the layer and its sites."""
    X = jnp.asarray(np.random.RandomState(0).randn(10, 2))

    def model():
        return dgp.gp_layer("h", X, dgp.kernels.RBF(), num_inducing=4)

    bad = handlers.substitute(model, data={"h.kernel.lengthscale": jnp.asarray(-1.0)})
    with pytest.raises(ValueError, match=r"gp_layer 'h': .*lengthscale.*site 'h.kernel.\*'"):
        handlers.seed(bad, 0)()


@pytest.mark.stochastic
def test_noisy_layer_propagates_the_conditional_variance_plus_its_noise():
    """Draws of a noisy layer's output given u have the conditional mean and variance of
    p(f | u) plus the noise variance (default propagation; layer_moments; full covariance)."""
    X = jnp.linspace(-1, 1, 4)[:, None]
    Z = jnp.linspace(-1, 1, 3)[:, None]
    k = dgp.kernels.RBF(variance=0.7, lengthscale=0.5)
    u = jnp.array([[0.3, -1.0, 0.5]])
    noise = 0.2

    def model():
        return dgp.gp_layer("h", X, k, inducing_inputs=Z, jitter=1e-9, noise=noise)

    S = 100_000
    draws = np.asarray(jax.vmap(lambda key: handlers.seed(handlers.condition(model, {"h.u": u}), key)())(
        jax.random.split(jax.random.PRNGKey(0), S))[..., 0])
    L = np.linalg.cholesky(np.asarray(k(Z)) + 1e-9 * 0.7 * np.eye(3))  # jitter relative to the variance
    A = np.linalg.solve(L, np.asarray(k(Z, X)))
    mean, var = A.T @ np.asarray(u[0]), 0.7 - (A**2).sum(0) + noise
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), 5 * np.sqrt(var / S))
    # the sample variance's standard error is var sqrt(2 / S) for Gaussian draws
    np.testing.assert_array_less(np.abs(draws.var(0) - var), 5 * var * np.sqrt(2 / S))
    layer = handlers.trace(handlers.seed(model, 0)).get_trace()["h.layer"]["args"][0]
    m, v = dgp.layers.layer_moments(layer, X, u)
    np.testing.assert_allclose(v[:, 0], var, rtol=1e-10)
    _, cov = dgp.layers.layer_moments(layer, X, u, full_cov=True)
    np.testing.assert_allclose(np.diagonal(cov[0]), var, rtol=1e-10)
    np.testing.assert_allclose(cov[0] - np.diag(np.diagonal(cov[0])),
                               (np.asarray(k(X)) - A.T @ A) - np.diag(np.diag(np.asarray(k(X)) - A.T @ A)), atol=1e-12)


def _locations_model(M):
    def model(X, y=None):
        h, hz = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=M, out_dim=2, mean="identity", inducing="locations")
        f, _ = dgp.gp_layer("h2", (h, hz), dgp.kernels.RBF(), inducing="locations")
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.3), obs=y)

    return model


@pytest.mark.parametrize(
    "guide_class, kind",
    [
        ("AutoFactorizedDGP", "whitened"),
        ("AutoChainDGP", "whitened"),
        ("AutoFactorizedDGP", "unwhitened"),
        ("AutoChainDGP", "unwhitened"),
        ("AutoFactorizedDGP", "locations"),
    ],
)
def test_layers_carry_the_inverse_factor_and_the_loss_and_gradient_are_unchanged(guide_class, kind, monkeypatch):
    """Every layer with shared inducing inputs carries L^{-1} built beside L (a whitened one's
    differentiated by inverse_cholesky's rule, a non-whitened one's and inducing locations',
    whose priors read L too, together with L by cholesky_and_inverse's), and the loss and its
    gradient at fixed parameters are those of the route that inverts L: through the
    conditional (factorized guide) and through the correlated guides' projection (chain).
    M = 65: two LAPACK leaves and the recursion between them."""
    M = 65
    rs = np.random.RandomState(M)
    X, y = jnp.asarray(rs.randn(80, 2)), jnp.asarray(rs.randn(80))
    if kind == "locations":
        model = _locations_model(M)
    else:
        model = dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=2, whiten=kind == "whitened")
    guide = getattr(dgp.guides, guide_class)(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))

    def moved(name, value):  # away from the initial q(u) = prior, where K's gradients vanish
        noise = jnp.asarray(rs.randn(*value.shape))
        if name.endswith("u_auto_scale_tril"):
            return jnp.tril(0.3 * noise) + 0.5 * jnp.eye(value.shape[-1])
        moved_names = ("u_auto_loc", "u_auto_coupling", "inducing_inputs")
        return value + 0.3 * noise if name.endswith(moved_names) else value

    params = {name: moved(name, value) for name, value in params.items()}
    tr = handlers.trace(handlers.seed(handlers.substitute(model, params), 0)).get_trace(X, y)
    for name in ("h1.layer", "h2.layer"):
        layer = tr[name]["args"][0]
        # an inverse carries eps cond(L) of its largest entry (cond(L) ~ 4.9e3 here)
        inv, cond_L = np.linalg.inv(layer.Kmm_chol), np.linalg.cond(layer.Kmm_chol)
        np.testing.assert_allclose(layer.Kmm_chol_inv, inv, rtol=0,
                                   atol=10 * np.finfo(np.float64).eps * cond_L * np.max(np.abs(inv)))

    def loss_and_grad():
        return jax.jit(jax.value_and_grad(lambda p: dgp.DGPElbo().loss(jax.random.PRNGKey(1), p, model, guide, X, y)))(params)

    value, grad = loss_and_grad()
    from numpyro_dgp.layers import _parts

    def inverting(kernel, Z, jitter, reads_factor=True):  # the factor alone: the conditional inverts it
        L, _, absolute = _parts.inducing_factor(kernel, Z, jitter, False)  # L = cholesky(K + jI)
        return L, None, absolute

    monkeypatch.setattr("numpyro_dgp.layers.inducing_factor", inverting)
    value_ref, grad_ref = loss_and_grad()
    # Tolerances from the round-off the two routes can have, relative to the largest term (10x
    # the first-order bound; not from one JAX release's bits). The loss of a whitened layer reads
    # L^{-1} alone: eps cond(L). A non-whitened one reads K^{-1} = L^{-T} L^{-1}: eps cond(K),
    # cond(K) = cond(L)^2 (~2.4e7 here). Every gradient runs through the factorization's adjoint,
    # L^{-T} Phi(L^T dL) L^{-1}, whichever factor the loss reads: eps cond(K) for every kind.
    # Measured: values up to 0.16 (whitened) and 24 (not) eps cond(L), gradients up to 1.2 eps
    # cond(K) here and 2.4 on another CPU (JAX 0.12.1); a wrong derivative rule is off by O(1).
    eps = np.finfo(np.float64).eps
    cond = max(np.linalg.cond(tr[n]["args"][0].Kmm_chol) for n in ("h1.layer", "h2.layer"))
    value_rel = 10 * eps * (cond if kind == "whitened" else cond**2)
    assert float(value) == pytest.approx(float(value_ref), rel=value_rel)
    for name in grad:
        assert np.max(np.abs(grad[name])) > 1e-2, name  # a gradient that can tell the rules apart
        scale = np.max(np.abs(grad_ref[name]))
        np.testing.assert_allclose(grad[name], grad_ref[name], rtol=0, atol=10 * eps * cond**2 * scale, err_msg=name)


def test_dgpelbo_with_a_noisy_last_layer_is_the_closed_form():
    """One noisy layer under a Gaussian likelihood: E over h = f + eps of log N(y | h, s^2) is
    -1/2 log 2 pi s^2 - ((y - m)^2 + v + noise) / (2 s^2) per point, minus the KL."""
    rs = np.random.RandomState(1)
    X, y = jnp.asarray(rs.randn(12, 1)), jnp.asarray(rs.randn(12))
    s2, noise = 0.1, 0.05

    def model(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=4, noise=noise)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], np.sqrt(s2)), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0), X, y))
    elbo = -float(dgp.DGPElbo().loss(jax.random.PRNGKey(0), params, model, guide, X, y))
    tr = handlers.trace(handlers.seed(handlers.substitute(model, params), 0)).get_trace(X, y)
    layer = tr["f.layer"]["args"][0]
    q = (params["f.u_auto_loc"], params["f.u_auto_scale_tril"])
    m, v = dgp.layers.layer_moments(layer, X, *q)  # noise included
    expected = np.sum(-0.5 * np.log(2 * np.pi * s2) - ((np.asarray(y) - m[:, 0]) ** 2 + v[:, 0]) / (2 * s2))
    expected -= float(dgp.core.gauss_kl(*q))
    assert abs(elbo - expected) < 1e-9 * abs(expected)


