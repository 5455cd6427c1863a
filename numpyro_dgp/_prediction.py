"""Predictive mixtures, their metrics, and per-layer function samples.

A fitted DGP predicts with a mixture over ``S`` propagated samples (as in the doubly
stochastic DGP of Salimbeni & Deisenroth, 2017): sample ``s`` gives each test point a Gaussian
``N(m_s, v_s)`` for ``y`` (last layer's marginal variance plus the likelihood noise). Mean and
variance follow from the law of total variance; the test log-likelihood is
``logsumexp_s log N(y | m_s, v_s) - log S``; the CRPS (Gneiting & Raftery, 2007) uses the
closed form for Gaussian mixtures (:func:`gaussian_mixture_crps`), in which
``2 Phi(mu / s) - 1 = erf(mu / (sqrt 2 s))``.

A Bernoulli observation site (classification, e.g. :func:`numpyro_dgp.likelihoods.bernoulli_probit`)
gives each component ``p_s = E[p(y = 1 | f)]`` over the last layer's marginal (20-node
Gauss-Hermite quadrature); the mixture's probability is ``mean_s p_s`` and its test
log-likelihood ``logsumexp_s log Bernoulli(y | p_s) - log S``.

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
* Gneiting, Raftery (2007). Strictly proper scoring rules, prediction, and estimation.
  Journal of the American Statistical Association.
"""

from __future__ import annotations

import warnings
import weakref
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.handlers import replay, seed, substitute, trace

from numpyro_dgp._cache import OwnerCache
from numpyro_dgp._marginal import marginal_trace
from numpyro_dgp._params import PREDICT_HINT, check_params_against, param_specs
from numpyro_dgp._protocol import quadrature_tail, trace_layer_names
from numpyro_dgp._validation import as_float_array, check_finite, warn_if_not_standardized
from numpyro_dgp.handlers import coherent_layers
from numpyro_dgp.infer._fit import _is_array

__all__ = [
    "NonFinitePredictionWarning",
    "Prediction",
    "predict",
    "sample_layers",
]


#: Observation-site likelihoods with predictive mixtures, and the Gauss-Hermite nodes (per
#: output of the last layer) each needs: 3 give the exact mean and variance of a Normal whose
#: location is affine in the layer; a Bernoulli probability is a smooth nonlinear function of it.
_QUADRATURE_NODES = {"normal": 3, "bernoulli": 20}


class NonFinitePredictionWarning(UserWarning):
    """Some predictions came out NaN or infinite (typically a Cholesky factorization that
    failed for those points); the metrics of such a prediction are NaN.

    Issued by :func:`predict` and :func:`predict_from_samples`.
    """


def _warn_if_not_finite(prediction, caller):
    """Report (never silently pass on) predictive means or variances that are NaN or infinite."""
    # on the host: eager jnp operations would each compile a program per shape
    bad = ~(np.isfinite(np.asarray(prediction.mean)) & np.isfinite(np.asarray(prediction.variance)))
    bad = bad.reshape(bad.shape[0], -1).any(axis=1) if bad.ndim > 1 else bad
    num_bad = int(np.sum(bad))
    if num_bad:
        first = [int(i) for i in np.flatnonzero(bad)[:5]]
        warnings.warn(
            f"{caller}: {num_bad} of {bad.shape[0]} test points have a NaN or infinite predictive mean or "
            f"variance (first: {first}); usually a Cholesky factorization failed for them (raise the "
            "layers' jitter, or use float64). Their metrics will be NaN.",
            NonFinitePredictionWarning,
            stacklevel=3,
        )
    return prediction


class Prediction(NamedTuple):
    """Predictive mixture at ``N`` test points from ``S`` samples.

    :ivar mean: ``(N,)`` predictive mean of ``y`` (Bernoulli: the probability of ``y = 1``).
    :ivar variance: ``(N,)`` predictive variance of ``y`` (law of total variance; Bernoulli:
        ``mean (1 - mean)``).
    :ivar component_means: ``(S, N)`` mean of ``y`` in each mixture component (Bernoulli:
        ``p_s``, the component's probability of ``y = 1``).
    :ivar component_variances: ``(S, N)`` variance of ``y`` in each component (noise included;
        Bernoulli: ``p_s (1 - p_s)``).
    :ivar layers: ``{layer: (S, N, P)}`` one draw of every layer's output per sample.
    :ivar layer_means: ``{layer: (S, N, P)}`` each layer's marginal mean given the sample's inputs.
    :ivar layer_variances: ``{layer: (S, N, P)}`` the matching marginal variances.
    :ivar likelihood: the observation site's likelihood, a key of ``_QUADRATURE_NODES``
        (``"normal"`` or ``"bernoulli"``).
    :ivar weights: ``(S,)`` component weights, or ``None`` for equal weights (with branches,
        :class:`~numpyro_dgp.handlers.quadrature` or an amortized guide, the components are
        sample x branch with the branch weights, and ``S`` counts both).
    """

    mean: jax.Array
    variance: jax.Array
    component_means: jax.Array
    component_variances: jax.Array
    layers: dict
    layer_means: dict
    layer_variances: dict
    likelihood: str = "normal"
    weights: jax.Array | None = None


def _test_inputs(X_new, caller):
    """``X_new`` at the door: a finite float ``(N, D)`` array (integers cast), a warning when its
    features are spread far beyond the unit scale kernels start at."""
    X_new = as_float_array(X_new, "X_new", caller, ndim=2)
    check_finite(X_new, "X_new", caller)
    warn_if_not_standardized(X_new, "X_new", caller, upper_only=True, stacklevel=4)
    return X_new


def _check_guide_is_set_up(guide, caller):
    # AutoGuides build themselves on first call; inside jit/eval_shape that would leak
    # tracers, and on test inputs (y absent) it would treat y as a latent site.
    if getattr(guide, "prototype_trace", "absent") is None:
        raise ValueError(
            f"{caller}: the guide has not been set up. Run svi.init(...) / fit(...) with it, or "
            "call guide.setup(rng_key, X_train, y_train) on the training data (e.g. after load_params)"
        )


def _observation_site(model_trace, obs_site):
    tail = quadrature_tail(model_trace)
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


def _base_distribution(fn):
    """The distribution inside ``Independent``/``expand`` wrappers and the wrapped one's full
    shape (batch + event), to which the inner parameters broadcast."""
    shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
    while isinstance(fn, (dist.Independent, dist.ExpandedDistribution)):
        fn = fn.base_dist
    return fn, shape


def _likelihood_of(fn, name):
    """The key of ``_QUADRATURE_NODES`` for an observation site's distribution ``fn``."""
    base, _ = _base_distribution(fn)
    if isinstance(base, dist.Normal):
        return "normal"
    if isinstance(base, (dist.BernoulliProbs, dist.BernoulliLogits)):
        return "bernoulli"
    raise NotImplementedError(
        f"predict: observation site {name!r} has likelihood {type(base).__name__}; predictive "
        "mixtures are implemented for Normal and Bernoulli (probs or logits) likelihoods"
    )


def _observation_moments(fn, name, weights):
    """Mean and variance of ``y`` in one component: the node-weighted average of the
    observation site's distribution over the quadrature axis (leading) of its parameters.

    Normal: ``E[loc]`` and ``Var[loc] + scale^2`` (exact for an affine location with 3 nodes).
    Bernoulli: ``p = E[probs]`` and ``p (1 - p)``.
    """
    kind = _likelihood_of(fn, name)
    base, shape = _base_distribution(fn)
    if kind == "bernoulli":
        probs = jnp.broadcast_to(base.probs, shape)
        p = jnp.tensordot(jnp.asarray(weights, probs.dtype), probs, axes=(0, 0))
        return p, p * (1 - p)
    loc = jnp.broadcast_to(base.loc, shape)
    w = jnp.asarray(weights, loc.dtype)
    m = jnp.tensordot(w, loc, axes=(0, 0))
    v_f = jnp.tensordot(w, (loc - m) ** 2, axes=(0, 0))
    noise = jnp.broadcast_to(base.scale, shape)[0] ** 2
    return m, v_f + noise


def _mixture_component(tr, moments, name, weights, layer_names, draw_key):
    """One mixture component from a run with quadrature nodes on the last layer: the
    predictive mean and variance of ``y`` (:func:`_observation_moments`), one draw of every
    layer, and the layers' moments."""
    last = layer_names[-1]
    m, v = _observation_moments(tr[name]["fn"], name, weights)
    layers = {n: tr[n]["value"] for n in layer_names if n != last}
    mean_L, var_L = moments[last]
    layers[last] = mean_L + jnp.sqrt(jnp.maximum(var_L, 0)) * jax.random.normal(draw_key, mean_L.shape, mean_L.dtype)
    means = {n: moments[n][0] for n in layer_names}
    variances = {n: moments[n][1] for n in layer_names}
    return m, v, layers, means, variances


def _mixture(likelihood, comp_m, comp_v, layers, means, variances, weights=None):
    """Mixture of the components, equally weighted or with ``weights (S,)`` (law of total
    variance; for Bernoulli components that is ``mean (1 - mean)``, computed as such)."""
    fields = _mixture_fields(likelihood, comp_m, comp_v, layers, means, variances, weights)
    return Prediction(*fields[:7], likelihood=likelihood, weights=fields[7])


def _mixture_fields(likelihood, comp_m, comp_v, layers, means, variances, weights=None):
    """The arrays of :func:`_mixture`'s :class:`Prediction`, in its field order."""
    average = (lambda a: a.mean(0)) if weights is None else (lambda a: jnp.tensordot(weights, a, axes=(0, 0)))  # noqa: E731
    mean = average(comp_m)
    if likelihood == "bernoulli":
        variance = mean * (1 - mean)
    else:
        variance = average(comp_v + comp_m**2) - mean**2
    return mean, variance, comp_m, comp_v, layers, means, variances, weights


def _flatten_branches(num_branches, comp_m, comp_v, layers, means, variances, log_weights):
    """Components ``(num_samples, S, N)`` with branch log weights ``(num_samples, S)`` as one
    mixture of ``num_samples * S`` components (weights ``w_s / num_samples``); layer arrays
    without a branch axis (layers before the first branch) are broadcast to it."""
    num_samples = comp_m.shape[0]

    def flat(a):
        if a.ndim == comp_m.ndim:  # (num_samples, N, P) before the first branching layer
            a = jnp.broadcast_to(a[:, None], (num_samples, num_branches) + a.shape[1:])
        return a.reshape((-1,) + a.shape[2:])

    tree = jax.tree_util.tree_map
    weights = (jax.nn.softmax(log_weights, axis=-1) / num_samples).reshape(-1)
    return (comp_m.reshape((-1,) + comp_m.shape[2:]), comp_v.reshape((-1,) + comp_v.shape[2:]),
            tree(flat, layers), tree(flat, means), tree(flat, variances), weights.astype(comp_m.dtype))


def predict(
    model: Callable,
    guide: Callable,
    params: dict,
    rng_key: jax.Array,
    X_new: ArrayLike,
    *args,
    num_samples: int = 100,
    obs_site: str | None = None,
    strict: bool = True,
    batch_size: int | None = None,
    keep_layers: bool = True,
    **kwargs: Any,
) -> Prediction:
    """Predictive mixture of a fitted DGP at ``X_new``.

    Each sample propagates ``X_new`` through the inner layers' marginals ``q(f_l | f_{l-1})``
    (DSVI) and takes the last layer's marginal Gaussian by Gauss-Hermite quadrature, mapped
    through the observation site's likelihood: Normal (3 nodes, exact when the location is
    affine in the last layer, as in ``Normal(f[..., 0], sigma)``) or Bernoulli (20 nodes per
    output: ``p_s(y = 1) = E[probs]``, e.g. ``Phi(m / sqrt(1 + v))`` for a plain probit).

    The compiled function is kept per guide: later calls with the same model, observation
    site, non-array arguments and input shapes (e.g. scoring a validation set after every
    epoch) run it without retracing; new ``params`` and array arguments are inputs to it.

    :param model: the NumPyro model; called as ``model(X_new, *args, **kwargs)``.
    :param guide: the fitted guide.
    :param params: ``svi.get_params(state)`` / ``FitResult.params``.
    :param rng_key: PRNG key.
    :param X_new: ``(N, D)`` test inputs.
    :param args: further positional arguments of the model.
    :param num_samples: ``S``, mixture components.
    :param obs_site: name of the observation site (found automatically if there is one).
    :param strict: refuse entries of ``params`` that the model and guide do not create
        (``False`` ignores them). Missing, mis-shaped and non-finite entries are always refused:
        ``params`` is checked against what the model and guide create at ``X_new`` (an abstract
        run, cached per guide), so parameters of another model (renamed layers, another
        ``num_inducing`` or width), a misspelt key or ``params={}`` raise instead of silently
        falling back to initial values.
    :param batch_size: predict ``batch_size`` points at a time, for working memory bounded by
        the batch instead of ``N``: each window of points is predicted as :func:`predict`
        predicts it alone (the last window ends at the last point and overlaps the one before,
        so every window has one shape and one compiled function serves all) and written into
        the preallocated outputs. Every window uses the same ``rng_key``; points are predicted
        independently, so a one-layer model gives the same numbers as without batches, and a
        deeper one other Monte Carlo draws of the same mixture. Only for models whose extra
        arguments do not depend on the points (``args``/``kwargs`` are passed to every window
        as they are).
    :param keep_layers: return every layer's draws and moments (``S x N x P`` numbers per
        layer and kind); ``False`` leaves ``layers``, ``layer_means`` and ``layer_variances``
        empty, so that a large ``N`` keeps only the ``S x N`` mixture components.
    :param kwargs: keyword arguments of the model.
    :return: :class:`Prediction` with ``S`` components (times the number of branches where
        the model or guide has them).
    :raises ~numpyro_dgp.ParameterMismatchError: ``params`` that do not match the model and guide.
    :raises ValueError: for invalid arguments (``X_new`` not ``(N, D)``, non-finite, ...).
    """
    if not (isinstance(num_samples, (int, np.integer)) and num_samples >= 1):
        raise ValueError(f"predict: num_samples must be a positive integer, got {num_samples!r}")
    if batch_size is not None and not (isinstance(batch_size, (int, np.integer)) and batch_size >= 1):
        raise ValueError(f"predict: batch_size must be a positive integer or None, got {batch_size!r}")
    X_new = _test_inputs(X_new, "predict")
    _check_guide_is_set_up(guide, "predict")
    N = X_new.shape[0]
    if batch_size is not None and batch_size < N:
        return _predict_in_batches(model, guide, params, rng_key, X_new, args, kwargs, num_samples, obs_site,
                                   strict, int(batch_size), keep_layers)
    found, fields = _predict_mixture(model, guide, params, rng_key, X_new, args, kwargs, num_samples, obs_site,
                                     strict, keep_layers)
    return _warn_if_not_finite(_as_prediction(found, fields), "predict")


def _as_prediction(found, fields):
    """The :class:`Prediction` of the predictor's arrays (:func:`_mixture_fields`)."""
    return Prediction(*fields[:7], likelihood=found["likelihood"], weights=fields[7])


def _predict_in_batches(model, guide, params, rng_key, X_new, args, kwargs, num_samples, obs_site, strict,
                        batch_size, keep_layers):
    """:func:`predict` over windows of ``batch_size`` points, written into preallocated outputs.

    Every window has the same shape (one compiled predictor): the last one is shifted back to
    end at the last point, so it overlaps the one before (those points are predicted again,
    independently, and the later values kept) instead of being padded. Each window's mixture is
    formed on its own and written in place into the outputs (a donated buffer), so that the
    memory is the outputs plus one window's working set, never the outputs twice.
    """
    N = X_new.shape[0]
    starts = sorted({min(start, N - batch_size) for start in range(0, N, batch_size)})
    out = weights = None
    for start in starts:
        found, fields = _predict_mixture(model, guide, params, rng_key, X_new[start:start + batch_size], args,
                                         kwargs, num_samples, obs_site, strict, keep_layers)
        along_points = fields[:7]  # weights (the last field) do not depend on the points
        if out is None:
            out, weights = _allocate_outputs(along_points, N), fields[7]
        out = _write_window(out, along_points, start)
    return _warn_if_not_finite(_as_prediction(found, out + (weights,)), "predict")


_LAYER_FIELDS = 4  # in a Prediction, the fields from here to the weights are {layer: (..., N, P)}


def _point_axis(field, array):
    return array.ndim - (2 if field >= _LAYER_FIELDS else 1)


@partial(jax.jit, static_argnums=1)
def _allocate_outputs(window, num_points):
    """Zero arrays shaped as ``window`` with ``num_points`` points."""
    def allocate(field, tree):
        def zeros(a):
            axis = _point_axis(field, a)
            return jnp.zeros(a.shape[:axis] + (num_points,) + a.shape[axis + 1:], a.dtype)
        return jax.tree_util.tree_map(zeros, tree)
    return tuple(allocate(field, tree) for field, tree in enumerate(window))


@partial(jax.jit, donate_argnums=0)
def _write_window(out, window, start):
    """``out`` with ``window`` written at point ``start`` (in place: ``out`` is donated)."""
    def write(field, out_tree, window_tree):
        def put(o, w):
            index = [0] * o.ndim
            index[_point_axis(field, o)] = start
            return jax.lax.dynamic_update_slice(o, w, index)
        return jax.tree_util.tree_map(put, out_tree, window_tree)
    return tuple(write(field, o, w) for field, (o, w) in enumerate(zip(out, window)))


def _predict_mixture(model, guide, params, rng_key, X_new, args, kwargs, num_samples, obs_site, strict,
                     keep_layers=True):
    """``(found, fields)`` of :func:`predict` at one block of test inputs: the parameters checked,
    the compiled predictor run; ``fields`` are the arrays of the :class:`Prediction` (mean,
    variance, components ``(S, N)``, layers ``(S, N, P)``, weights)."""
    specs = param_specs(model, guide, (X_new,) + tuple(args), kwargs)
    check_params_against(specs, params, "predict", allow_unexpected=not strict, require_finite=True,
                         hint=PREDICT_HINT)
    dyn_args = tuple(a if _is_array(a) else None for a in args)
    static_args = tuple(None if _is_array(a) else a for a in args)
    dyn_kwargs = {k: v for k, v in kwargs.items() if _is_array(v)}
    static_kwargs = tuple(sorted((k, v) for k, v in kwargs.items() if not _is_array(v)))
    found, predictor = _predictor(model, guide, params, rng_key, X_new, args, kwargs, obs_site,
                                  static_args, static_kwargs, keep_layers)
    return found, predictor(rng_key, params, X_new, dyn_args, dyn_kwargs, int(num_samples))


#: compiled predictors per guide (weakly keyed: they go when the guide goes)
_PREDICTORS = OwnerCache(max_entries=8)


def _predictor(model, guide, params, rng_key, X_new, args, kwargs, obs_site, static_args, static_kwargs,
               keep_layers=True):
    """``(found, batched)``: what the model's trace says (observation site, likelihood, layers,
    branches) and the jitted, vmapped mixture-component function.

    Both are cached per guide, keyed by the model, the observation site and the non-array
    arguments, and valid for the guide's prototype trace (its structure, built once), so
    repeated predictions (validation during training, plots) reuse one compiled executable
    per input shape instead of retracing; array arguments are traced, never baked in."""
    prototype = getattr(guide, "prototype_trace", None)
    key = (model, obs_site, static_args, static_kwargs, keep_layers)
    try:
        hash(key)
    except TypeError:  # unhashable static arguments: compile for this call only
        key = None
    entry = None if key is None else _PREDICTORS.get(guide, key)
    if entry is not None and entry[0] is prototype:
        return entry[1], entry[2]
    guide_ref = weakref.ref(guide)

    found = {}

    def probe():
        # abstract run (jax.eval_shape): finds the observation site and the layers, computes nothing
        run = marginal_trace(model, guide, params, rng_key, (X_new,) + tuple(args), kwargs, 3, objective="predict")
        found["name"] = _observation_site(run.model_trace, obs_site)
        found["likelihood"] = _likelihood_of(run.model_trace[found["name"]]["fn"], found["name"])
        found["layers"] = list(run.layer_order)
        found["branches"] = None if run.branch_log_weights is None else run.branch_log_weights.shape[0]
        return 0

    jax.eval_shape(probe)
    name, layer_names = found["name"], found["layers"]
    num_nodes = _QUADRATURE_NODES[found["likelihood"]]

    def one(key, params, X_new, dyn_args, dyn_kwargs):
        call_args = tuple(s if d is None else d for d, s in zip(dyn_args, static_args))
        call_kwargs = {**dict(static_kwargs), **dyn_kwargs}
        run_key, draw_key = jax.random.split(key)
        run = marginal_trace(model, guide_ref(), params, run_key, (X_new,) + call_args, call_kwargs, num_nodes,
                            objective="predict")
        component = _mixture_component(run.model_trace, run.moments, name, run.quadrature_weights, layer_names, draw_key)
        if not keep_layers:  # nothing computed for them in the compiled function
            component = component[:2] + ({}, {}, {})
        return component + ((run.branch_log_weights,) if found["branches"] else ())

    def predictive_mixture(rng_key, params, X_new, dyn_args, dyn_kwargs, num_samples):
        # the keys, the samples and their mixture in one program (eagerly, each small operation
        # on the components would compile on its own)
        keys = jax.random.split(rng_key, num_samples)
        components = jax.vmap(one, in_axes=(0, None, None, None, None))(keys, params, X_new, dyn_args, dyn_kwargs)
        if found["branches"]:
            components = _flatten_branches(found["branches"], *components)
        return _mixture_fields(found["likelihood"], *components)

    predictor = jax.jit(predictive_mixture, static_argnums=5)
    if key is not None:
        _PREDICTORS.put(guide, key, (prototype, found, predictor))
    return found, predictor


def sample_layers(
    model: Callable,
    guide: Callable,
    params: dict,
    rng_key: jax.Array,
    X: ArrayLike,
    *args,
    num_samples: int = 25,
    coherent: bool = True,
    **kwargs,
) -> dict[str, jax.Array]:
    """Function samples of every layer at ``X``: ``{layer: (S, N, P)}``.

    Inducing values are drawn from the guide; with ``coherent=True`` each layer's output is
    drawn with its full covariance over the ``N`` points, so a sample is a smooth function
    (use a grid of a few hundred points).

    :param model: the NumPyro model; called as ``model(X, *args, **kwargs)``.
    :param guide: the fitted guide (set up, e.g. by :func:`numpyro_dgp.fit`).
    :param params: ``svi.get_params(state)`` / ``FitResult.params``.
    :param rng_key: PRNG key.
    :param X: ``(N, D)`` inputs of the first layer.
    :param args: further positional arguments of the model.
    :param num_samples: ``S``, function samples.
    :param coherent: draw each layer jointly over the ``N`` points
        (:class:`~numpyro_dgp.handlers.coherent_layers`); ``False`` draws point by point.
    :param kwargs: keyword arguments of the model.
    :return: ``{layer: (S, N, P)}`` for every layer, in the order the model runs them.
    """
    _check_guide_is_set_up(guide, "sample_layers")

    def one(key, params, X):
        guide_key, model_key = jax.random.split(key)
        guide_trace = trace(substitute(seed(guide, guide_key), data=params)).get_trace(X, *args, **kwargs)
        m = substitute(replay(seed(model, model_key), guide_trace), data=params)
        if coherent:
            m = coherent_layers(m)
        tr = trace(m).get_trace(X, *args, **kwargs)
        names = trace_layer_names(tr)
        return {n: tr[n]["value"] for n in names}

    keys = jax.random.split(rng_key, int(num_samples))
    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))(keys, params, jnp.asarray(X))
