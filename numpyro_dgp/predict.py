"""Predictive mixtures, their metrics, and per-layer function samples.

A fitted DGP predicts with a mixture over ``S`` propagated samples: sample ``s`` gives each
test point a Gaussian ``N(m_s, v_s)`` for ``y`` (last layer's marginal variance plus the
likelihood noise). Mean and variance follow from the law of total variance; the test
log-likelihood is ``logsumexp_s log N(y | m_s, v_s) - log S``; CRPS uses the closed form for
Gaussian mixtures (notes/amortized.md, with ``erf(mu / (sqrt 2 s))`` as it must be).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import logsumexp, ndtr
from jax.scipy.stats import norm
from numpyro.handlers import replay, seed, substitute, trace

from numpyro_dgp.handlers import coherent_layers, marginalise_inducing
from numpyro_dgp.objectives import layers_by_u_site, marginal_trace, quadrature_rule

__all__ = [
    "Prediction",
    "predict",
    "predict_from_samples",
    "sample_layers",
    "log_likelihood",
    "gaussian_mixture_crps",
    "metrics",
]


class Prediction(NamedTuple):
    """Predictive mixture at ``N`` test points from ``S`` samples.

    :ivar mean: ``(N,)`` predictive mean of ``y``.
    :ivar variance: ``(N,)`` predictive variance of ``y`` (law of total variance).
    :ivar component_means: ``(S, N)`` mean of ``y`` in each mixture component.
    :ivar component_variances: ``(S, N)`` variance of ``y`` in each component (noise included).
    :ivar layers: ``{layer: (S, N, P)}`` one draw of every layer's output per sample.
    :ivar layer_means: ``{layer: (S, N, P)}`` each layer's marginal mean given the sample's inputs.
    :ivar layer_variances: ``{layer: (S, N, P)}`` the matching marginal variances.
    """

    mean: jax.Array
    variance: jax.Array
    component_means: jax.Array
    component_variances: jax.Array
    layers: dict
    layer_means: dict
    layer_variances: dict


def _check_guide_is_set_up(guide, caller):
    # AutoGuides build themselves on first call; inside jit/eval_shape that would leak
    # tracers, and on test inputs (y absent) it would treat y as a latent site.
    if getattr(guide, "prototype_trace", "absent") is None:
        raise ValueError(
            f"{caller}: the guide has not been set up. Run svi.init(...) / fit(...) with it, or "
            "call guide.setup(rng_key, X_train, y_train) on the training data (e.g. after load_params)"
        )


def _observation_site(model_trace, obs_site):
    tail = [n for n, s in model_trace.items() if s["type"] == "sample" and (s.get("infer") or {}).get("dgp_quadrature")]
    if obs_site is None:
        if len(tail) != 1:
            raise ValueError(
                f"predict: cannot tell the observation site; sample sites after the last layer: {tail}. "
                "Pass obs_site="
            )
        obs_site = tail[0]
    if obs_site not in tail:
        raise ValueError(f"predict: obs_site {obs_site!r} is not a sample site after the last GP layer ({tail})")
    return obs_site


def _normal_of(fn, name):
    while isinstance(fn, dist.Independent):
        fn = fn.base_dist
    if not isinstance(fn, dist.Normal):
        raise NotImplementedError(
            f"predict: observation site {name!r} has likelihood {type(fn).__name__}; predictive "
            "mixtures are implemented for Normal likelihoods"
        )
    return fn.loc, fn.scale


def _mixture_component(tr, moments, name, weights, layer_names, draw_key):
    """One mixture component from a run with quadrature nodes on the last layer: the
    predictive mean and variance of ``y`` (node-weighted moments of the observation site's
    Normal location, plus its noise), one draw of every layer, and the layers' moments."""
    last = layer_names[-1]
    loc, scale = _normal_of(tr[name]["fn"], name)
    w = jnp.asarray(weights, loc.dtype)
    loc = jnp.broadcast_to(loc, jnp.broadcast_shapes(jnp.shape(loc), jnp.shape(scale)))
    m = jnp.tensordot(w, loc, axes=(0, 0))
    v_f = jnp.tensordot(w, (loc - m) ** 2, axes=(0, 0))
    noise = jnp.broadcast_to(scale, loc.shape)[0] ** 2
    layers = {n: tr[n]["value"] for n in layer_names if n != last}
    mean_L, var_L = moments[last]
    layers[last] = mean_L + jnp.sqrt(jnp.maximum(var_L, 0)) * jax.random.normal(draw_key, mean_L.shape, mean_L.dtype)
    means = {n: moments[n][0] for n in layer_names}
    variances = {n: moments[n][1] for n in layer_names}
    return m, v_f + noise, layers, means, variances


def _mixture(comp_m, comp_v, layers, means, variances):
    """Equal-weight mixture of the components (law of total variance)."""
    mean = comp_m.mean(0)
    variance = (comp_v + comp_m**2).mean(0) - mean**2
    return Prediction(mean, variance, comp_m, comp_v, layers, means, variances)


def predict(model, guide, params, rng_key, X_new, *args, num_samples: int = 100, obs_site=None, **kwargs):
    """Predictive mixture of a fitted DGP at ``X_new``.

    Each sample propagates ``X_new`` through the inner layers' marginals ``q(f_l | f_{l-1})``
    (DSVI) and takes the last layer's marginal Gaussian analytically, mapped through the
    observation site's Normal likelihood (exact when the location is affine in the last
    layer, as in ``Normal(f[..., 0], sigma)``).

    :param model: the NumPyro model; called as ``model(X_new, *args, **kwargs)``.
    :param guide: the fitted guide.
    :param params: ``svi.get_params(state)`` / ``FitResult.params``.
    :param rng_key: PRNG key.
    :param X_new: ``(N, D)`` test inputs.
    :param num_samples: ``S``, mixture components.
    :param obs_site: name of the observation site (found automatically if there is one).
    :return: :class:`Prediction`.
    """
    if int(num_samples) < 1:
        raise ValueError(f"predict: num_samples must be >= 1, got {num_samples}")
    X_new = jnp.asarray(X_new)
    if X_new.ndim != 2:
        raise ValueError(f"predict: X_new must have shape (num_points, dim), got {X_new.shape}")
    if not bool(jnp.all(jnp.isfinite(X_new))):
        raise ValueError("predict: X_new contains NaN or inf values")
    _check_guide_is_set_up(guide, "predict")
    found = {}

    def probe():
        # abstract run (jax.eval_shape): finds the observation site and the layers, computes nothing
        run = marginal_trace(model, guide, params, rng_key, (X_new,) + args, kwargs, 3)
        found["name"] = _observation_site(run.model_trace, obs_site)
        found["layers"] = list(run.layer_order)
        return 0

    jax.eval_shape(probe)
    name, layer_names = found["name"], found["layers"]

    def one(key, params, X_new):
        run_key, draw_key = jax.random.split(key)
        # 3 Gauss-Hermite nodes give the exact mean and variance of an affine location
        run = marginal_trace(model, guide, params, run_key, (X_new,) + args, kwargs, 3)
        return _mixture_component(run.model_trace, run.moments, name, run.quadrature_weights, layer_names, draw_key)

    keys = jax.random.split(rng_key, int(num_samples))
    batched = jax.jit(jax.vmap(one, in_axes=(0, None, None)))
    return _mixture(*batched(keys, params, X_new))


def predict_from_samples(model, samples, rng_key, X_new, *args, obs_site=None, params=None, **kwargs):
    """Predictive mixture of a DGP over posterior samples (MCMC, :class:`~numpyro_dgp.infer.SGHMC`).

    Component ``s`` substitutes sample ``s`` into the model (the inducing values
    ``"<layer>.u"`` and every other latent or ``numpyro.param`` site the sample holds:
    kernel hyperparameters, noise, inducing inputs...), propagates ``X_new`` through the
    inner layers by sampling ``p(f_l | u_l, f_{l-1})``, and takes the last layer's
    conditional Gaussian given ``u_L`` analytically, mapped through the observation site's
    Normal likelihood: ``N(m_s, v_s + noise_s)`` per test point (exact when the location is
    affine in the last layer, as in ``Normal(f[..., 0], sigma)``). Sample sites the model does
    not have at ``X_new`` (e.g. deterministic layer outputs at training points) are ignored.

    :param model: the NumPyro model; called as ``model(X_new, *args, **kwargs)``.
    :param samples: ``{site: (S, ...)}``, e.g. ``mcmc.get_samples()`` (SGHMC records the
        params in force at every sample, so the dict covers them).
    :param rng_key: PRNG key (inner-layer draws, one key per component).
    :param X_new: ``(N, D)`` test inputs.
    :param obs_site: name of the observation site (found automatically if there is one).
    :param params: ``{param site: value}`` fixed for all components, for params the samples
        do not hold (e.g. fitted values substituted into a NUTS run); samples take precedence.
    :return: :class:`Prediction` with ``S`` components.
    """
    X_new = jnp.asarray(X_new)
    if X_new.ndim != 2:
        raise ValueError(f"predict_from_samples: X_new must have shape (num_points, dim), got {X_new.shape}")
    if not bool(jnp.all(jnp.isfinite(X_new))):
        raise ValueError("predict_from_samples: X_new contains NaN or inf values")
    if not isinstance(samples, dict) or not samples:
        raise ValueError("predict_from_samples: samples is empty; pass mcmc.get_samples() (a dict of (S, ...) arrays)")
    samples = {k: jnp.asarray(v) for k, v in samples.items()}
    sizes = {k: (v.shape[0] if v.ndim else None) for k, v in samples.items()}
    S_set = set(sizes.values())
    if None in S_set or len(S_set) != 1:
        raise ValueError(f"predict_from_samples: every sample array needs the same leading (sample) axis; got {sizes}")
    S = S_set.pop()
    if S < 1:
        raise ValueError("predict_from_samples: samples is empty (0 samples along the leading axis)")
    fixed = {k: jnp.asarray(v) for k, v in (params or {}).items()}

    def run(sample, key, quadrature):
        data = {**fixed, **sample}
        m = substitute(seed(model, key), data=data)
        if quadrature is not None:
            handler = marginalise_inducing(m, quadrature_layer=quadrature[0], quadrature_nodes=quadrature[1],
                                           quadrature_weights=quadrature[2])
        else:
            handler = marginalise_inducing(m)
        tr = trace(handler).get_trace(X_new, *args, **kwargs)
        return tr, handler.moments

    found = {}
    one_sample = {k: v[0] for k, v in samples.items()}

    def probe():
        tr, _ = run(one_sample, jax.random.PRNGKey(0), None)
        layers = [s["args"][0] for s in tr.values() if s["type"] == "dgp_layer"]
        if not layers:
            raise ValueError("predict_from_samples: the model runs no gp_layer")
        found["layers"] = [layer.name for layer in layers]
        found["u_sites"] = sorted(layers_by_u_site(tr))
        found["out_dim"] = layers[-1].out_dim
        found["sites"] = {n: s["type"] for n, s in tr.items() if s["type"] in ("sample", "param")}
        return 0

    jax.eval_shape(probe)
    missing = [u for u in found["u_sites"] if u not in samples]
    if missing:
        raise ValueError(
            f"predict_from_samples: samples lack the inducing-value site(s) {missing}; they hold "
            f"{sorted(samples)}. Pass the samples of an MCMC run on the model (its '<layer>.u' sites)"
        )
    unset = [n for n, t in found["sites"].items() if t == "param" and n not in samples and n not in fixed]
    if unset:
        raise ValueError(
            f"predict_from_samples: param site(s) {unset} are neither in the samples nor in params=; "
            "they would take their initial values (e.g. k-means on X_new). Pass params= (fitted values)"
        )
    last = found["layers"][-1]
    # 3 Gauss-Hermite nodes give the exact mean and variance of an affine location
    nodes, weights = quadrature_rule(found["out_dim"], 3)
    quad = (last, nodes, weights)

    def probe_tail():
        tr, _ = run(one_sample, jax.random.PRNGKey(0), quad)
        found["name"] = _observation_site(tr, obs_site)
        return 0

    jax.eval_shape(probe_tail)
    name = found["name"]
    # substitute the model's latent and param sites only (not deterministic layer outputs
    # recorded at training points, nor the observation site)
    keep = [k for k in samples if k in found["sites"] and k != name]
    samples = {k: samples[k] for k in keep}

    def one(sample, key):
        run_key, draw_key = jax.random.split(key)
        tr, moments = run(sample, run_key, quad)
        return _mixture_component(tr, moments, name, weights, found["layers"], draw_key)

    keys = jax.random.split(rng_key, S)
    return _mixture(*jax.jit(jax.vmap(one))(samples, keys))


def sample_layers(model, guide, params, rng_key, X, *args, num_samples: int = 25, coherent: bool = True, **kwargs):
    """Function samples of every layer at ``X``: ``{layer: (S, N, P)}``.

    Inducing values are drawn from the guide; with ``coherent=True`` each layer's output is
    drawn with its full covariance over the ``N`` points, so a sample is a smooth function
    (use a grid of a few hundred points).
    """
    _check_guide_is_set_up(guide, "sample_layers")

    def one(key, params, X):
        guide_key, model_key = jax.random.split(key)
        guide_trace = trace(substitute(seed(guide, guide_key), data=params)).get_trace(X, *args, **kwargs)
        m = substitute(replay(seed(model, model_key), guide_trace), data=params)
        if coherent:
            m = coherent_layers(m)
        tr = trace(m).get_trace(X, *args, **kwargs)
        names = [s["args"][0].name for s in tr.values() if s["type"] == "dgp_layer"]
        return {n: tr[n]["value"] for n in names}

    keys = jax.random.split(rng_key, int(num_samples))
    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))(keys, params, jnp.asarray(X))


def log_likelihood(prediction: Prediction, y):
    """Per-point mixture log-density ``logsumexp_s log N(y | m_s, v_s) - log S``, shape ``(N,)``."""
    y = jnp.asarray(y)
    lp = norm.logpdf(y, prediction.component_means, jnp.sqrt(prediction.component_variances))
    return logsumexp(lp, axis=0) - jnp.log(lp.shape[0])


def _crps_A(mu, var):
    s = jnp.sqrt(var)
    z = mu / s
    return 2 * s * norm.pdf(z) + mu * (2 * ndtr(z) - 1)


def gaussian_mixture_crps(y, means, variances, weights=None):
    """CRPS of an equally (or ``weights``-) weighted Gaussian mixture, per point.

    ``sum_s w_s A(y - mu_s, s_s^2) - 0.5 sum_ij w_i w_j A(mu_i - mu_j, s_i^2 + s_j^2)`` with
    ``A(mu, s2) = 2 s phi(mu / s) + mu (2 Phi(mu / s) - 1)``.

    :param y: ``(N,)``; :param means: ``(S, N)``; :param variances: ``(S, N)``.
    :return: ``(N,)``.
    """
    S = means.shape[0]
    w = jnp.full((S,), 1.0 / S, means.dtype) if weights is None else jnp.asarray(weights, means.dtype)

    def per_point(args):
        yi, mi, vi = args
        first = jnp.sum(w * _crps_A(yi - mi, vi))
        pair = _crps_A(mi[:, None] - mi[None, :], vi[:, None] + vi[None, :])
        return first - 0.5 * w @ pair @ w

    return jax.lax.map(per_point, (jnp.asarray(y), means.T, variances.T))


def metrics(prediction: Prediction, y, y_scale: float = 1.0) -> dict:
    """Test metrics of a prediction: mean log-likelihood, RMSE and CRPS.

    :param y_scale: the targets' standard deviation if the model saw standardised targets:
        metrics are then reported in original units (LL - log y_scale, RMSE and CRPS times y_scale).
    :return: ``{"log_likelihood", "rmse", "crps"}`` as Python floats.
    """
    y = jnp.asarray(y)
    if y.shape != prediction.mean.shape:
        raise ValueError(f"metrics: y has shape {y.shape}, predictions have {prediction.mean.shape}")
    ll = log_likelihood(prediction, y).mean() - jnp.log(y_scale)
    rmse = jnp.sqrt(jnp.mean((y - prediction.mean) ** 2)) * y_scale
    crps = gaussian_mixture_crps(y, prediction.component_means, prediction.component_variances).mean() * y_scale
    return {"log_likelihood": float(ll), "rmse": float(rmse), "crps": float(crps)}
