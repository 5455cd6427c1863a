"""predict_from_samples (predictive mixture over posterior samples) and collapse_last_layer
(sghmc_dgp's likelihood) against dense NumPy computations; a tiny SGHMC run end to end."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import MCMC
from numpyro.infer.util import log_density
from scipy.stats import norm

from numpyro_dgp import predict_from_samples
from numpyro_dgp.handlers import collapse_last_layer
from numpyro_dgp.infer import SGHMC
from numpyro_dgp.models import deep_gp_regression

jax.config.update("jax_enable_x64", True)  # idempotent (conftest does it too)

JITTER = 1e-6  # float64 default of the layers
D, M1, M2, N_NEW = 2, 5, 4, 7


def rbf(A, B, variance, lengthscale):
    A, B = np.asarray(A) / lengthscale, np.asarray(B) / lengthscale
    sq = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
    return variance * np.exp(-0.5 * sq)


def svgp_given_u(X, Z, v, variance, lengthscale):
    """Whitened sparse GP given u = L v: mean K_xz L^-T v, var k_xx - diag(K_xz K_zz^-1 K_zx)."""
    L = np.linalg.cholesky(rbf(Z, Z, variance, lengthscale) + JITTER * np.eye(len(Z)))
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


def stack(samples):
    return {k: jnp.asarray(np.stack([s[k] for s in samples])) for k in samples[0]}


@pytest.fixture(scope="module")
def X_new():
    return jnp.asarray(np.random.RandomState(1).randn(N_NEW, D))


def test_single_sample_equals_dense_svgp(X_new):
    s = one_layer_sample(np.random.RandomState(0))
    samples = stack([s] * 3)  # all components the same
    pred = predict_from_samples(deep_gp_regression(1, num_inducing=M1), samples, jax.random.PRNGKey(0), X_new)
    m, v = svgp_given_u(X_new, s["h1.inducing_inputs"], s["h1.u"][0], s["h1.kernel.variance"],
                        s["h1.kernel.lengthscale"])
    np.testing.assert_allclose(pred.mean, m, atol=1e-8)
    np.testing.assert_allclose(pred.variance, v + s["noise"], atol=1e-8)
    np.testing.assert_allclose(pred.component_variances, np.broadcast_to(v + s["noise"], (3, N_NEW)), atol=1e-8)
    np.testing.assert_allclose(pred.layer_means["h1"][..., 0], np.broadcast_to(m, (3, N_NEW)), atol=1e-8)
    np.testing.assert_allclose(pred.layer_variances["h1"][..., 0], np.broadcast_to(v, (3, N_NEW)), atol=1e-8)


def test_mixture_is_law_of_total_variance(X_new):
    rng = np.random.RandomState(2)
    per = [one_layer_sample(rng) for _ in range(4)]
    pred = predict_from_samples(deep_gp_regression(1, num_inducing=M1), stack(per), jax.random.PRNGKey(0), X_new)
    ms, vs = [], []
    for s in per:
        m, v = svgp_given_u(X_new, s["h1.inducing_inputs"], s["h1.u"][0], s["h1.kernel.variance"],
                            s["h1.kernel.lengthscale"])
        ms.append(m)
        vs.append(v + s["noise"])
    ms, vs = np.array(ms), np.array(vs)
    np.testing.assert_allclose(pred.component_means, ms, atol=1e-8)
    np.testing.assert_allclose(pred.component_variances, vs, atol=1e-8)
    mean = ms.mean(0)
    np.testing.assert_allclose(pred.mean, mean, atol=1e-8)
    np.testing.assert_allclose(pred.variance, vs.mean(0) + (ms**2).mean(0) - mean**2, atol=1e-8)
    assert np.all(pred.variance > vs.min(0))  # the spread of the means adds variance


def test_two_layers_last_layer_analytic_given_sampled_inner(X_new):
    rng = np.random.RandomState(3)
    per = [two_layer_sample(rng) for _ in range(3)]
    samples = stack(per)
    # deterministic layer outputs recorded at training points (as MCMC returns them) are ignored
    samples["h1"] = jnp.zeros((3, 11, D))
    samples["h2"] = jnp.zeros((3, 11, 1))
    model = deep_gp_regression(2, num_inducing=M1)
    pred = predict_from_samples(model, samples, jax.random.PRNGKey(5), X_new)
    assert pred.layers["h1"].shape == (3, N_NEW, D) and pred.layers["h2"].shape == (3, N_NEW, 1)
    for k, s in enumerate(per):
        # inner layer: its draw lies in p(f_1 | u_1) (mean identity + conditional), check its moments
        m1 = np.stack([svgp_given_u(X_new, s["h1.inducing_inputs"], s["h1.u"][p], s["h1.kernel.variance"],
                                    s["h1.kernel.lengthscale"])[0] for p in range(D)], -1)
        np.testing.assert_allclose(pred.layer_means["h1"][k], np.asarray(X_new) + m1, atol=1e-8)
        h1 = np.asarray(pred.layers["h1"][k])
        m, v = svgp_given_u(h1, s["h2.inducing_inputs"], s["h2.u"][0], s["h2.kernel.variance"],
                            s["h2.kernel.lengthscale"])
        np.testing.assert_allclose(pred.component_means[k], m, atol=1e-8)
        np.testing.assert_allclose(pred.component_variances[k], v + s["noise"], atol=1e-8)
    cm, cv = np.asarray(pred.component_means), np.asarray(pred.component_variances)
    np.testing.assert_allclose(pred.variance, (cv + cm**2).mean(0) - cm.mean(0) ** 2, atol=1e-8)
    # different keys give different inner draws (sampling, not the inner mean)
    pred2 = predict_from_samples(model, samples, jax.random.PRNGKey(6), X_new)
    assert not np.allclose(pred.layers["h1"], pred2.layers["h1"])


def test_errors(X_new):
    model = deep_gp_regression(2, num_inducing=M1)
    s = stack([two_layer_sample(np.random.RandomState(4))] * 2)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="samples is empty"):
        predict_from_samples(model, {}, key, X_new)
    with pytest.raises(ValueError, match="0 samples"):
        predict_from_samples(model, {k: v[:0] for k, v in s.items()}, key, X_new)
    with pytest.raises(ValueError, match=r"lack the inducing-value site\(s\) \['h2.u'\]"):
        predict_from_samples(model, {k: v for k, v in s.items() if k != "h2.u"}, key, X_new)
    with pytest.raises(ValueError, match="noise"):
        predict_from_samples(model, {k: v for k, v in s.items() if k != "noise"}, key, X_new)
    # ... unless given as a fixed param
    pred = predict_from_samples(model, {k: v for k, v in s.items() if k != "noise"}, key, X_new,
                                params={"noise": jnp.asarray(0.1)})
    assert pred.mean.shape == (N_NEW,)
    with pytest.raises(ValueError, match="same leading"):
        predict_from_samples(model, {**s, "noise": s["noise"][:1]}, key, X_new)
    with pytest.raises(ValueError, match="X_new must have shape"):
        predict_from_samples(model, s, key, X_new[0])


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


def _sine_data():
    rng = np.random.RandomState(8)
    X = jnp.asarray(rng.uniform(-1, 1, (60, 1)))
    y = jnp.sin(3 * X[:, 0]) + 0.05 * jnp.asarray(rng.randn(60))
    return X, y


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


@pytest.mark.slow  # ~35 s of compilation (SGHMC step + prediction)
def test_sghmc_samples_end_to_end():
    X, y = _sine_data()
    model = deep_gp_regression(2, num_inducing=6, noise_init=0.05)
    kernel = SGHMC(collapse_last_layer(model), step_size=0.01, param_optimizer=optax.adam(0.01))
    mcmc = MCMC(kernel, num_warmup=30, num_samples=20, thinning=5, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), X, y, batch_size=20)
    samples = mcmc.get_samples()  # latents, params and deterministic layer outputs (minibatch shape)
    assert samples["h1.u"].shape == (4, 1, 6) and samples["noise"].shape == (4,)
    pred = predict_from_samples(model, samples, jax.random.PRNGKey(3), X[:5])
    assert pred.mean.shape == (5,) and bool(jnp.all(jnp.isfinite(pred.variance)))
    assert bool(jnp.all(pred.variance > 0))
