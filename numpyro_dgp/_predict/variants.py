"""Predictives other than :func:`~numpyro_dgp.predict`'s sampled mixture under a guide.

* :func:`predict_from_samples`: a mixture over posterior samples (MCMC, SGHMC). Each sample is
  substituted into the model, and the mixture is formed as :func:`numpyro_dgp.predict` forms it
  from a guide (the observation site's likelihood by Gauss-Hermite quadrature on the last layer,
  a quadrature handler's branches mixed with their weights).
* Deterministic predictions: moment matching through the layers
  (:func:`predict_moment_matched`), and the FITC / VFE predictive (:func:`predict_collapsed`).
  Both return a :class:`~numpyro_dgp.Prediction` with one mixture component (a Gaussian per
  test point for a Normal likelihood), so :func:`~numpyro_dgp.metrics` scores them like a
  sampled prediction.

**References:**

* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
* Snelson, Ghahramani (2006). Sparse Gaussian processes using pseudo-inputs. NIPS.
* Titsias (2009). Variational learning of inducing variables in sparse Gaussian processes.
  AISTATS.
"""

from __future__ import annotations

from typing import Any, Callable, cast

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
from numpyro.handlers import seed, substitute, trace
from numpyro.primitives import Messenger

from numpyro_dgp._engine.marginal import marginalize_inducing
from numpyro_dgp._engine.observation import likelihood_rule, shared_rule, spherical_rule
from numpyro_dgp._engine.run import moment_trace
from numpyro_dgp._predict.mixture import (
    PREDICTION_NODES,
    component_of,
    mixture_fields,
    rule_arguments,
)
from numpyro_dgp._predict.prediction import (
    Prediction,
    abstract,
    check_guide_is_set_up,
    checked_test_inputs,
    observation_of,
    warn_if_not_finite,
)
from numpyro_dgp._protocol import abstract_read, trace_layers
from numpyro_dgp.core import collapsed_posterior
from numpyro_dgp.io import PREDICT_HINT, check_params_against
from numpyro_dgp.objectives._collapsed import CollapsedData, collapse_sparse_layer


def predict_from_samples(
    model: Callable,
    samples: dict,
    rng_key: jax.Array,
    X_new: ArrayLike,
    *args,
    obs_site: str | None = None,
    params: dict | None = None,
    strict: bool = True,
    **kwargs: Any,
) -> Prediction:
    """Predictive mixture of a DGP over posterior samples (MCMC, :class:`~numpyro_dgp.infer.SGHMC`).

    Component ``s`` substitutes sample ``s`` into the model (the inducing values
    ``"<layer>.u"`` and every other latent or ``numpyro.param`` site the sample holds:
    kernel hyperparameters, noise, inducing inputs...), propagates ``X_new`` through the
    inner layers by sampling ``p(f_l | u_l, f_{l-1})``, and takes the last layer's
    conditional Gaussian given ``u_L`` by Gauss-Hermite quadrature, mapped through the
    observation site's likelihood as :func:`~numpyro_dgp.predict` maps it: Normal, ``N(m_s, v_s +
    noise_s)`` per test point (exact when the location is affine in the last layer, as in
    ``Normal(f[..., 0], sigma)``), Bernoulli or categorical probabilities, or any other
    likelihood's distribution at the nodes. Sample sites the model does
    not have at ``X_new`` (e.g. deterministic layer outputs at training points) are ignored.

    :param model: the NumPyro model; called as ``model(X_new, *args, **kwargs)``.
    :param samples: ``{site: (S, ...)}``, e.g. ``mcmc.get_samples()`` (SGHMC records the
        params in force at every sample, so the dict covers them).
    :param rng_key: PRNG key (inner-layer draws, one key per component).
    :param X_new: ``(N, D)`` test inputs.
    :param args: further positional arguments of the model.
    :param obs_site: name of the observation site (found automatically if there is one).
    :param params: ``{param site: value}`` fixed for all components, for params the samples
        do not hold (e.g. fitted values substituted into a NUTS run); samples take precedence.
    :param strict: refuse entries of ``params`` that are not ``numpyro.param`` sites of the
        model (``False`` ignores them, e.g. a whole ``FitResult.params`` with its guide
        entries). The samples' and ``params``' shapes and dtypes are always checked against
        the model's sites at ``X_new``, and non-finite ``params`` refused.
    :param kwargs: keyword arguments of the model.
    :return: :class:`Prediction` with ``S`` components.
    :raises ~numpyro_dgp.ParameterMismatchError: samples or ``params`` that do not match the model.
    :raises ValueError: for invalid arguments (empty samples, a missing ``"<layer>.u"`` site, ...).
    """
    caller = "predict_from_samples"
    X_new = checked_test_inputs(X_new, caller, (samples, params))
    checked = _check_samples(model, samples, params, X_new, args, kwargs, strict)
    samples, fixed, (layers, out_dim, sites) = checked
    first = {k: v[0] for k, v in samples.items()}
    num_samples = len(next(iter(samples.values())))

    def run(sample, key, node_rule=()):
        # one run at X_new with the sample substituted, the layers marginalized (the last one at
        # the quadrature ``(layer, nodes, weights)``): trace, moments and branch log weights
        handler = marginalize_inducing(
            substitute(seed(model, key), data={**fixed, **sample}), None, *node_rule
        )
        tr = trace(handler).get_trace(X_new, *args, **kwargs)
        return tr, handler.moments, handler.mixture_log_weights

    def probe():  # the observation at the last layer's spherical nodes
        tr = run(first, jax.random.PRNGKey(0), (layers[-1], *spherical_rule(out_dim)))[0]
        return observation_of(tr, obs_site, caller)

    name, likelihood = abstract(probe)
    rule = likelihood_rule(out_dim, [likelihood], *rule_arguments(likelihood, out_dim), "predict")
    weights = rule[1]
    # substitute the model's latent and param sites only (not deterministic layer outputs
    # recorded at training points, nor the observation site)
    samples = {k: v for k, v in samples.items() if k in sites and k != name}

    def one(sample, key):
        run_key, draw_key = jax.random.split(key)
        tr, moments, log_weights = run(sample, run_key, (layers[-1], *rule))
        return component_of(tr, moments, name, likelihood, weights, layers, draw_key), log_weights

    def mixture(samples, keys):
        # log_weights: a weighted mixture (quadrature handler) of sample x branch components
        components, log_weights = jax.vmap(one)(samples, keys)
        return mixture_fields(likelihood, components, log_weights, weights)

    fields = jax.jit(mixture)(samples, jax.random.split(rng_key, num_samples))
    return warn_if_not_finite(Prediction(**fields, likelihood=likelihood), caller)


def _check_samples(model, samples, params, X_new, args, kwargs, strict):
    """``predict_from_samples``'s door: ``samples`` a non-empty dict of arrays that share one
    leading (sample) axis of length at least 1; then, from one abstract run of the model at
    ``X_new`` with the first sample and ``params`` substituted: every param site is given,
    ``params`` names only sites of the model and holds finite values, each latent site's samples
    have the shape of the site's distribution there (another ``out_dim``, or inducing values
    that do not match the inducing inputs, are reported by name), the model runs a ``gp_layer``
    and the samples hold every layer's inducing values.

    :return: ``(samples, params, (layer names, last layer's width, the model's latent and param
        sites))``, the samples and ``params`` as arrays.
    :raises ValueError: otherwise.
    """
    samples = {k: jnp.asarray(v) for k, v in samples.items()} if isinstance(samples, dict) else {}
    sizes = {k: (v.shape[0] if v.ndim else None) for k, v in samples.items()}
    if None in sizes.values() or len(set(sizes.values())) > 1:
        raise ValueError(
            "predict_from_samples: every sample array needs the same leading (sample) axis; "
            f"got {sizes}"
        )
    if not sizes or 0 in sizes.values():
        raise ValueError(
            "predict_from_samples: samples is empty (no sites, or 0 samples along the leading "
            "axis); pass mcmc.get_samples() (a dict of (S, ...) arrays)"
        )
    fixed = {k: jnp.asarray(v) for k, v in (params or {}).items()}
    data = {**fixed, **{k: v[0] for k, v in samples.items()}}

    def door(tr):
        found = {}
        for name, site in tr.items():
            if site["type"] == "param" or (site["type"] == "sample" and not site["is_observed"]):
                shape = site["fn"].shape() if site["type"] == "sample" else jnp.shape(site["value"])
                found[name] = jax.ShapeDtypeStruct(tuple(shape), jnp.result_type(site["value"]))
        check_params_against(
            {k: v for k, v in found.items() if k not in samples},
            fixed,
            "predict_from_samples (params)",
            allow_missing=True,
            allow_unexpected=not strict,
            require_finite=True,
            hint=PREDICT_HINT,
        )
        latent = {k: v for k, v in found.items() if k in samples}
        check_params_against(
            latent, {k: samples[k] for k in latent}, "predict_from_samples (samples)", leading=1
        )
        layers = trace_layers(tr)
        if not layers:
            raise ValueError("predict_from_samples: the model runs no gp_layer")
        missing = sorted(layer.u_site for layer in layers if layer.u_site not in samples)
        if missing:
            raise ValueError(
                f"predict_from_samples: samples lack the inducing-value site(s) {missing}; they "
                f"hold {sorted(samples)}. Pass the samples of an MCMC run on the model "
                "(its '<layer>.u' sites)"
            )
        return [layer.name for layer in layers], layers[-1].out_dim, set(found)

    substituted = _refuse_unset_params(substitute(seed(model, jax.random.PRNGKey(0)), data=data))
    return samples, fixed, abstract_read(substituted, (X_new, *args), kwargs, door)


class _refuse_unset_params(Messenger):
    """Refuse a run's first ``numpyro.param`` site that nothing substituted, before its initial
    value is computed (from the inputs at hand: k-means at fewer points than ``num_inducing``
    would fail, and at more would silently stand in for the fitted values).

    :raises ValueError: naming the site.
    """

    def process_message(self, msg: dict) -> None:
        if msg["type"] == "param" and msg["value"] is None:
            raise ValueError(
                f"predict_from_samples: param site {msg['name']!r} is neither in the samples nor "
                "in params=; it would take its initial value (e.g. k-means on X_new). Pass "
                "params= (the fitted values, or those the MCMC run used)"
            )


def _one_component(run: Callable, arrays: tuple, obs_site, caller: str, jit: bool) -> Prediction:
    """The prediction of a single (deterministic) component: ``run(*arrays, num_nodes, kind)``
    gives ``(trace, moments, node weights, layer names)`` of one run with nodes on the last
    layer; an abstract run at 3 Normal nodes finds the observation site, then one run (jitted
    with ``jit``, ``arrays`` its inputs) at the nodes its likelihood takes."""
    key = jax.random.PRNGKey(0)  # nothing is sampled: the component is deterministic

    def probe():
        tr, _, _, layers = run(*arrays, 3, "normal")
        return observation_of(tr, obs_site, caller), layers

    (name, likelihood), layers = abstract(probe)

    def component(*arrays):
        tr, moments, weights, _ = run(*arrays, PREDICTION_NODES[likelihood], likelihood)
        return component_of(tr, moments, name, likelihood, weights, layers, key), weights

    one, node_weights = (jax.jit(component) if jit else component)(*arrays)
    stacked = jax.tree_util.tree_map(lambda a: a[None], one)
    fields = mixture_fields(likelihood, stacked, None, node_weights)
    return warn_if_not_finite(Prediction(**fields, likelihood=likelihood), caller)


def predict_moment_matched(
    model: Callable,
    guide: Callable,
    params: dict,
    X_new: ArrayLike,
    *args,
    obs_site: str | None = None,
    **kwargs,
) -> Prediction:
    """Deterministic predictive of a fitted DGP by exact moment matching through the layers.

    Each layer's output at each test point is replaced by the Gaussian with its exact mean and
    variance under the Gaussian input the layer before hands on and the guide's ``q(u_l)``
    (psi statistics, :func:`~numpyro_dgp.core.uncertain_input_moments`): mean
    ``x^T W + b + Psi1_n K^-1 m`` and variance ``noise + psi0_n - tr(K^-1 Psi2_n) +
    tr(K^-1 Psi2_n K^-1 (m m^T + S)) - (Psi1_n K^-1 m)^2`` (plus a linear mean function's
    share), the outputs of a layer treated as independent. The last layer's Gaussian is mapped
    through the likelihood as :func:`~numpyro_dgp.predict` does. No sampling: one mixture
    component per test point. For models and guides
    :class:`~numpyro_dgp.objectives.NestedCompressionElbo` accepts (any noise on the layers, which
    the prediction includes); inner layers need not have noise here.

    :param model: the NumPyro model; called as ``model(X_new, *args, **kwargs)``.
    :param guide: the fitted guide (an independent Gaussian per layer).
    :param params: the fitted parameters (``FitResult.params``).
    :param X_new: ``(N, D)`` test inputs.
    :param args: further positional arguments of the model.
    :param obs_site: name of the observation site (found automatically if there is one).
    :param kwargs: keyword arguments of the model.
    :return: :class:`~numpyro_dgp.Prediction` with one component.
    :raises ValueError: for invalid ``X_new`` or a guide that has not been set up.
    :raises NotImplementedError: for what moment propagation cannot do (see
        :class:`~numpyro_dgp.objectives.NestedCompressionElbo`).
    """
    caller = "predict_moment_matched"
    check_guide_is_set_up(guide, caller)
    X_new = checked_test_inputs(X_new, caller, params, model, guide)
    key = jax.random.PRNGKey(0)  # the guide's draws are not used: the moments are deterministic

    def run(params, X_new, num_nodes, kind):
        inputs = (X_new,) + tuple(args)
        out = moment_trace(
            model, guide, params, key, inputs, kwargs, "predict", num_nodes, caller, kind=kind
        )
        return out.model_trace, out.moments, out.node_weights, list(out.layer_order)

    return _one_component(run, (params, X_new), obs_site, caller, jit=True)


def predict_collapsed(
    model: Callable,
    params: dict,
    X: ArrayLike,
    y: ArrayLike,
    X_new: ArrayLike,
    *args,
    method: str = "vfe",
    obs_site: str | None = None,
    **kwargs,
) -> Prediction:
    """The FITC or VFE predictive of a one-layer model fitted with
    :class:`~numpyro_dgp.objectives.CollapsedSparseGP`.

    The inducing values' Gaussian is the one the method implies given the training data
    (:func:`~numpyro_dgp.core.collapsed_posterior`: ``N(K Sigma K_uf Lambda^-1 y, K Sigma K)``,
    ``Sigma = (K + K_uf Lambda^-1 K_fu)^-1``, with ``Lambda = diag(K_ff - Q_ff) + sigma^2 I`` for
    FITC and ``sigma^2 I`` for VFE, the latter Titsias' optimal ``q(u)``), and the layer's
    marginal at ``X_new`` under it is mapped through the likelihood: for a Normal, mean
    ``K_*u Sigma K_uf Lambda^-1 y`` and variance ``K_** - Q_** + K_*u Sigma K_u* + sigma^2``.

    :param model: the model; called as ``model(X, y, *args, **kwargs)`` on the training data
        and ``model(X_new, *args, **kwargs)`` to predict.
    :param params: the fitted parameters.
    :param X: ``(N, D)`` training inputs.
    :param y: the training targets, as the model takes them.
    :param X_new: ``(N_new, D)`` test inputs.
    :param args: further positional arguments of the model.
    :param method: ``"vfe"`` or ``"fitc"``: the objective the model was fitted with.
    :param obs_site: name of the observation site (found automatically if there is one).
    :param kwargs: keyword arguments of the model.
    :return: :class:`~numpyro_dgp.Prediction` with one component.
    :raises ValueError: for invalid inputs or an unknown ``method``.
    :raises NotImplementedError: for models the collapsed objective does not take.
    """
    caller = "predict_collapsed"
    X_new = checked_test_inputs(X_new, caller, params)
    key = jax.random.PRNGKey(0)  # nothing is sampled: the u site's draw is replaced
    fitted = substitute(seed(model, key), data=params)
    handler = collapse_sparse_layer(fitted, method, caller)
    trace(handler).get_trace(jnp.asarray(X), y, *args, **kwargs)
    # None only for a model without a gp_layer, which fails at the first attribute as before
    data = cast(CollapsedData, handler.data)
    layer = data.layer
    q = collapsed_posterior(
        layer.Kmm_chol,
        layer.kernel(layer.inducing_inputs, data.X),
        layer.kernel.diag(data.X),
        data.residual,
        data.noise_var,
        method=method,
        whiten=layer.whiten,
    )

    def run(num_nodes, kind):
        nodes, weights = shared_rule(layer.out_dim, kind, num_nodes, caller)
        m = marginalize_inducing(fitted, {layer.u_site: q}, layer.name, nodes, weights)
        return trace(m).get_trace(X_new, *args, **kwargs), m.moments, weights, [layer.name]

    return _one_component(run, (), obs_site, caller, jit=False)
