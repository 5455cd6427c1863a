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
log-likelihood ``logsumexp_s log Bernoulli(y | p_s) - log S``. A categorical site
(:func:`~numpyro_dgp.likelihoods.softmax`, :func:`~numpyro_dgp.likelihoods.robust_max`) gives
class probabilities the same way, and any other likelihood (Student-t, Poisson, negative
binomial, heteroscedastic Gaussian, ...) keeps the distribution at every node of every component
(:mod:`numpyro_dgp._predict.mixture`).

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
from jax.typing import ArrayLike
from numpyro.handlers import trace

from numpyro_dgp._cache import OwnerCache
from numpyro_dgp._engine.observation import observation_kind
from numpyro_dgp._engine.run import guide_then_model, marginal_trace
from numpyro_dgp._predict.mixture import component_of, mixture_fields, rebuild, rule_arguments
from numpyro_dgp._protocol import node_tail, trace_layer_names
from numpyro_dgp._validation import (
    as_float_array,
    check_finite,
    check_positive_int,
    hashable,
    split_traced,
    warn_if_not_standardized,
)
from numpyro_dgp.handlers import coherent_layers
from numpyro_dgp.io import PREDICT_HINT, check_params_against, param_specs, training_arguments


class NonFinitePredictionWarning(UserWarning):
    """Some predictions came out NaN or infinite (typically a Cholesky factorization that
    failed for those points); the metrics of such a prediction are NaN.

    Issued by :func:`predict` and :func:`predict_from_samples`.
    """


def warn_if_not_finite(prediction, caller):
    """Report (never silently pass on) predictive means or variances that are NaN or infinite."""
    # on the host: eager jnp operations would each compile a program per shape
    bad = ~(np.isfinite(np.asarray(prediction.mean)) & np.isfinite(np.asarray(prediction.variance)))
    bad = bad.reshape(bad.shape[0], -1).any(axis=1) if bad.ndim > 1 else bad
    num_bad = int(np.sum(bad))
    if num_bad:
        first = [int(i) for i in np.flatnonzero(bad)[:5]]
        warnings.warn(
            f"{caller}: {num_bad} of {bad.shape[0]} test points have a NaN or infinite "
            f"predictive mean or variance (first: {first}); usually a Cholesky factorization "
            "failed for them (raise the layers' jitter, or use float64). Their metrics will be "
            "NaN.",
            NonFinitePredictionWarning,
            stacklevel=3,
        )
    return prediction


def checked_test_inputs(
    X_new: ArrayLike,
    caller: str,
    values: Any = None,
    model: Callable | None = None,
    guide: Callable | None = None,
) -> jax.Array:
    """``X_new`` at the door: a finite float ``(N, D)`` array with at least one row (integers
    cast), in the dtype the model was fitted in (a model predicts so whatever the inputs' dtype,
    since default jitters follow the inputs' dtype): the training inputs' where ``guide`` recorded
    them for ``model``, else that of the fitted ``values`` (parameters or samples); with the
    training inputs' number of columns; a warning when its features are spread far beyond the
    unit scale kernels start at.

    :raises ValueError: no rows, NaN or inf, or another number of columns than the training
        inputs had.
    """
    X_new = as_float_array(X_new, "X_new", caller, ndim=2)
    if X_new.shape[0] == 0:
        raise ValueError(f"{caller}: X_new has no rows (shape {tuple(X_new.shape)})")
    check_finite(X_new, "X_new", caller)
    training = None if guide is None or model is None else training_arguments(model, guide)
    X_train: Any = training[0][0] if training is not None and training[0] else None
    D = X_train.shape[-1] if getattr(X_train, "ndim", 0) == 2 else X_new.shape[-1]
    if D != X_new.shape[-1]:
        raise ValueError(
            f"{caller}: X_new has {X_new.shape[-1]} columns; the model was fitted on inputs with "
            f"{D} (X_new must be (N, {D}), its columns in the training order)"
        )
    floating = [
        leaf.dtype
        for leaf in jax.tree_util.tree_leaves(values)
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)
    ]
    if getattr(X_train, "ndim", 0) == 2 and jnp.issubdtype(X_train.dtype, jnp.floating):
        X_new = X_new.astype(X_train.dtype)  # the inputs it was fitted on, where the guide knows
    elif floating:
        X_new = X_new.astype(jnp.result_type(*floating))
    warn_if_not_standardized(X_new, "X_new", caller, upper_only=True, stacklevel=4)
    return X_new


def check_guide_is_set_up(guide: Callable, caller: str) -> None:
    # AutoGuides build themselves on first call; inside jit/eval_shape that would leak
    # tracers, and on test inputs (y absent) it would treat y as a latent site.
    if getattr(guide, "prototype_trace", "absent") is None:
        raise ValueError(
            f"{caller}: the guide has not been set up. Run svi.init(...) / fit(...) with it, or "
            "call guide.setup(rng_key, X_train, y_train) on the training data "
            "(e.g. after load_params)"
        )


class Prediction(NamedTuple):
    """Predictive mixture at ``N`` test points from ``S`` samples.

    The shapes below are for one observation per point; a site with ``T`` columns (e.g.
    ``Normal(f, noise).to_event(1)`` on a ``T``-output last layer) adds a trailing ``T`` to the
    means and variances, and a categorical site a trailing ``C`` (its class probabilities).

    :ivar mean: ``(N,)`` predictive mean of ``y`` (Bernoulli: the probability of ``y = 1``;
        categorical: ``(N, C)`` the class probabilities).
    :ivar variance: ``(N,)`` predictive variance of ``y`` (law of total variance; Bernoulli and
        categorical: ``mean (1 - mean)``).
    :ivar component_means: ``(S, N)`` mean of ``y`` in each mixture component (Bernoulli:
        ``p_s``, the component's probability of ``y = 1``; categorical: ``(S, N, C)``).
    :ivar component_variances: ``(S, N)`` variance of ``y`` in each component (noise included;
        Bernoulli: ``p_s (1 - p_s)``).
    :ivar layers: ``{layer: (S, N, P)}`` one draw of every layer's output per sample.
    :ivar layer_means: ``{layer: (S, N, P)}`` each layer's marginal mean given the sample's inputs.
    :ivar layer_variances: ``{layer: (S, N, P)}`` the matching marginal variances.
    :ivar likelihood: the kind of the observation site: ``"normal"``, ``"bernoulli"``,
        ``"categorical"`` or ``"general"`` (any other distribution of a scalar: Student-t,
        Poisson, negative binomial, a Gaussian whose scale depends on the layer, ...).
    :ivar weights: ``(S,)`` component weights, or ``None`` for equal weights (with branches,
        :class:`~numpyro_dgp.handlers.quadrature` or an amortized guide, the components are
        sample x branch with the branch weights, and ``S`` counts both).
    :ivar atoms: ``"general"`` only: the observation distribution at the ``K`` quadrature
        nodes (or draws) of every component, a NumPyro distribution of batch shape
        ``(S, K, N)``: component ``s`` is the mixture of its ``K`` atoms; ``None`` otherwise.
    :ivar atom_weights: ``"general"`` only: ``(K,)`` the nodes' weights.
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
    atoms: Any = None
    atom_weights: jax.Array | None = None


def observation_of(model_trace: dict, obs_site: str | None, caller: str = "predict") -> tuple:
    """``(name, kind)`` of the observation site of a marginalized run: ``obs_site`` (or the only
    sample site after the last layer), checked to be a sample site after the last layer, and its
    kind (:func:`~numpyro_dgp._engine.observation.observation_kind`).

    :raises ValueError: several sites after the last layer and no ``obs_site``, or an ``obs_site``
        that is not one of them.
    """
    tail = node_tail(model_trace)
    if obs_site is None:
        if len(tail) != 1:
            raise ValueError(
                "predict: cannot tell the observation site; sample sites after the last layer: "
                f"{tail}. Pass obs_site="
            )
        obs_site = tail[0]
    if obs_site not in tail:
        raise ValueError(
            f"predict: obs_site {obs_site!r} is not a sample site after the last GP layer ({tail})"
        )
    return obs_site, observation_kind(model_trace[obs_site]["fn"], obs_site, caller)


def abstract(fn: Callable[[], Any]) -> Any:
    """What ``fn()`` returns (names, kinds, shapes: no arrays), from an abstract run
    (``jax.eval_shape``: nothing is computed)."""
    out = []
    jax.eval_shape(lambda: out.append(fn()))
    return out[0]


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
    (DSVI) and maps the last layer's marginal Gaussian through the observation site's
    likelihood. One output: Gauss-Hermite nodes, 3 for a Normal (exact when the location is
    affine in the layer, as in ``Normal(f[..., 0], sigma)``), 20 for a Bernoulli (``p_s(y = 1) =
    E[probs]``, e.g. ``Phi(m / sqrt(1 + v))`` for a plain probit), a categorical (``E[probs]``)
    or any other likelihood of a number (the component is the mixture of the likelihood at the
    nodes, kept as :attr:`Prediction.atoms`). Several outputs: the ``2 P`` exact nodes for a
    Normal, else Monte Carlo draws per point and sample (16; 8 atoms for a likelihood kept as
    atoms). Under a guide that correlates the layers, a Normal over several outputs is kept
    at 8 joint draws per sample (atoms), so that the joint density of a row keeps the
    outputs' correlation.

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
    check_positive_int(num_samples, "num_samples", "predict")
    check_positive_int(batch_size, "batch_size", "predict", allow_none=True)
    check_guide_is_set_up(guide, "predict")
    X_new = checked_test_inputs(X_new, "predict", params, model, guide)
    inputs = (X_new,) + tuple(args)
    check_params_against(
        param_specs(model, guide, inputs, kwargs),
        params,
        "predict",
        allow_unexpected=not strict,
        require_finite=True,
        hint=PREDICT_HINT,
    )
    dyn_args, static_args, dyn_kwargs, static_kwargs = split_traced(args, kwargs)
    static = (static_args, static_kwargs, keep_layers)
    found, predictor = _predictor(model, guide, params, rng_key, inputs, kwargs, obs_site, static)

    def window(X):
        return predictor(rng_key, params, X, dyn_args, dyn_kwargs, int(num_samples))

    if batch_size is None or batch_size >= X_new.shape[0]:
        fields = window(X_new)
    else:
        fields = _in_windows(window, X_new, int(batch_size))
    prediction = Prediction(**_with_atoms(fields), likelihood=found["likelihood"])
    return warn_if_not_finite(prediction, "predict")


def _in_windows(window: Callable, X_new: jax.Array, size: int) -> dict:
    """The fields of ``window`` (the compiled predictor at some points) over ``X_new``, ``size``
    points at a time, written into preallocated outputs.

    Every window has the same shape (one compiled predictor): the last one is shifted back to
    end at the last point, so it overlaps the one before (those points are predicted again,
    independently, and the later values kept) instead of being padded. Each window is written
    in place into the outputs (a donated buffer), so that the memory is the outputs plus one
    window's working set, never the outputs twice.
    """
    N = X_new.shape[0]
    out: Any = None
    for start in sorted({min(start, N - size) for start in range(0, N, size)}):
        fields = window(X_new[start : start + size])
        out = _write_window(_allocate_outputs(fields, N) if out is None else out, fields, start)
    return out


#: the axis of the points in each field of a :class:`Prediction` that has one
_POINT_AXIS = {
    "mean": 0,
    "variance": 0,
    "component_means": 1,
    "component_variances": 1,
    "layers": 1,
    "layer_means": 1,
    "layer_variances": 1,
    "atoms": 2,
}


def _along_points(fn: Callable, fields: dict, *more: dict) -> dict:
    """``fields`` (a prediction's, as a dict) with ``fn(axis, array, *the same array of more)``
    in place of every array that has a point axis."""
    out = dict(fields)
    for field, axis in _POINT_AXIS.items():
        more_arrays = [m[field] for m in more]
        out[field] = jax.tree_util.tree_map(partial(fn, axis), fields[field], *more_arrays)
    return out


def _with_atoms(fields: dict) -> dict:
    """``fields`` with the atoms (if any) rebuilt for the batch shape of their new arrays."""
    if fields["atoms"] is not None:
        fields["atoms"] = rebuild(fields["atoms"], lambda a: a)
    return fields


@partial(jax.jit, static_argnums=1)
def _allocate_outputs(fields: dict, num_points: int) -> dict:
    """Zero arrays shaped as ``fields`` with ``num_points`` points."""

    def zeros(axis, a):
        return jnp.zeros(a.shape[:axis] + (num_points,) + a.shape[axis + 1 :], a.dtype)

    return _along_points(zeros, fields)


@partial(jax.jit, donate_argnums=0)
def _write_window(out: dict, fields: dict, start: int) -> dict:
    """``out`` with ``fields`` written at point ``start`` (in place: ``out`` is donated); the
    other fields (weights) are ``fields``'."""

    def write(axis, f, o):
        return jax.lax.dynamic_update_slice_in_dim(o, f, start, axis)

    return _along_points(write, fields, out)


def take_points(prediction: Prediction, index: ArrayLike) -> Prediction:
    """The prediction at the points ``index`` (integers), every field that has a point axis
    taken along it."""
    index = jnp.asarray(index, jnp.int32)
    take = lambda axis, a: jnp.take(a, index, axis=axis)  # noqa: E731
    return Prediction(**_with_atoms(_along_points(take, prediction._asdict())))


#: compiled predictors per guide (weakly keyed: they go when the guide goes)
_PREDICTORS = OwnerCache(max_entries=8)


def _predictor(model, guide, params, rng_key, inputs, kwargs, obs_site, static):
    """``(found, predictor)``: what the model's trace says (:func:`_probe`) and the jitted,
    vmapped mixture-component function.

    Both are cached per guide, keyed by the model, the observation site and ``static`` (the
    non-array arguments, ``keep_layers``), and valid for the guide's prototype trace (its
    structure, built once), so repeated predictions (validation during training, plots) reuse
    one compiled executable per input shape instead of retracing; array arguments are traced,
    never baked in."""
    prototype = getattr(guide, "prototype_trace", None)
    key = (model, obs_site, static)
    key = key if hashable(key) else None  # unhashable static arguments: compile for this call only
    entry = None if key is None else _PREDICTORS.get(guide, key)
    if entry is not None and entry[0] is prototype:
        return entry[1], entry[2]
    found = abstract(partial(_probe, model, guide, params, rng_key, inputs, kwargs, obs_site))
    mixture = _mixture_function(model, weakref.ref(guide), found, *static)
    predictor = jax.jit(mixture, static_argnums=5)
    if key is not None:
        _PREDICTORS.put(guide, key, (prototype, found, predictor))
    return found, predictor


def _probe(model, guide, params, rng_key, inputs, kwargs, obs_site) -> dict:
    """What a marginal run of the model says (observation site, likelihood, layers, last
    layer's width, correlated outputs); run abstractly."""
    run = marginal_trace(model, guide, params, rng_key, inputs, kwargs, None, "predict", 2)
    name, likelihood = observation_of(run.model_trace, obs_site)
    if run.correlated_outputs and likelihood == "normal":
        # a guide that correlates the layers correlates the last layer's outputs at a point:
        # a component's per-column moments would drop that from a row's joint density, atoms
        # at joint draws keep it (the 2 P nodes exact for the moments are not for the density)
        likelihood = "general"
    return {
        "name": name,
        "likelihood": likelihood,
        "layers": list(run.layer_order),
        "out_dim": run.moments[run.layer_order[-1]][0].shape[-1],
        "correlated": run.correlated_outputs,
    }


def _mixture_function(model, guide_ref, found, static_args, static_kwargs, keep_layers):
    """The mixture of ``num_samples`` components at ``X_new`` (to be jitted): each component
    one vmapped run of the model under the guide (``guide_ref``, a weak reference), mapped
    through the observation site's likelihood (``found``)."""
    joint_draws = found["correlated"] and found["likelihood"] == "general"
    name, layer_names, kind = found["name"], found["layers"], found["likelihood"]
    num_nodes, num_draws = rule_arguments(kind, found["out_dim"])

    def one(key, params, X_new, dyn_args, dyn_kwargs):
        inputs = (X_new,) + tuple(s if d is None else d for d, s in zip(dyn_args, static_args))
        call_kwargs = {**dict(static_kwargs), **dyn_kwargs}
        run_key, draw_key = jax.random.split(key)
        rule = dict(num_samples=num_draws, joint_draws=joint_draws)
        run = marginal_trace(
            model, guide_ref(), params, run_key, inputs, call_kwargs, num_nodes, "predict", **rule
        )
        component = component_of(
            run.model_trace, run.moments, name, kind, run.node_weights, layer_names, draw_key
        )
        if not keep_layers:  # nothing computed for them in the compiled function
            component = {**component, "layers": {}, "layer_means": {}, "layer_variances": {}}
        return component, run.mixture_log_weights, run.node_weights

    def predictive_mixture(rng_key, params, X_new, dyn_args, dyn_kwargs, num_samples):
        # the keys, the samples and their mixture in one program (eagerly, each small operation
        # on the components would compile on its own)
        keys = jax.random.split(rng_key, num_samples)
        components, log_weights, node_weights = jax.vmap(one, in_axes=(0, None, None, None, None))(
            keys, params, X_new, dyn_args, dyn_kwargs
        )
        return mixture_fields(kind, components, log_weights, node_weights[0])

    return predictive_mixture


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
    check_guide_is_set_up(guide, "sample_layers")

    def one(key, params, X):
        seeded_model = guide_then_model(model, guide, params, key, (X, *args), kwargs)[1]
        return layer_outputs(seeded_model, coherent, (X, *args), kwargs)

    keys = jax.random.split(rng_key, int(num_samples))
    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))(keys, params, jnp.asarray(X))


def layer_outputs(model: Callable, coherent: bool, args: tuple, kwargs: dict) -> dict:
    """``{layer: output}`` of one run of ``model`` (a seeded one), every layer drawn jointly
    over the points with ``coherent`` (:class:`~numpyro_dgp.handlers.coherent_layers`)."""
    if coherent:
        model = coherent_layers(model)
    tr = trace(model).get_trace(*args, **kwargs)
    return {n: tr[n]["value"] for n in trace_layer_names(tr)}
