"""Predictive mixtures over posterior samples (MCMC, SGHMC): :func:`predict_from_samples`.

Each sample is substituted into the model, and the mixture is formed as :func:`numpyro_dgp.predict`
forms it from a guide (the observation site's likelihood by Gauss-Hermite quadrature on the last
layer, a quadrature handler's branches mixed with their weights).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
from numpyro.handlers import seed, substitute, trace
from numpyro.primitives import Messenger

from numpyro_dgp._engine.marginal import marginalize_inducing
from numpyro_dgp._engine.observation import observation_kind, spherical_rule
from numpyro_dgp._engine.run import layers_by_u_site
from numpyro_dgp._predict.inputs import checked_test_inputs
from numpyro_dgp._predict.mixture import (
    component_of,
    flatten_mixture,
    mixture_fields,
    prediction_rule,
)
from numpyro_dgp._predict.prediction import (
    Prediction,
    observation_site,
    warn_if_not_finite,
)
from numpyro_dgp._protocol import trace_layers
from numpyro_dgp.io import PREDICT_HINT, check_params_against

__all__ = ["predict_from_samples"]


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
    X_new = checked_test_inputs(X_new, "predict_from_samples", (samples, params))
    samples, S = _check_sample_arrays(samples)
    fixed = _check_samples(model, samples, params, X_new, args, kwargs, strict)

    def run(sample, key, node_rule):
        data = {**fixed, **sample}
        return _marginalized_run(model, data, key, node_rule, X_new, args, kwargs)

    one_sample = {k: v[0] for k, v in samples.items()}
    layers, out_dim, sites = _model_layers(run, one_sample, samples)
    last = layers[-1]
    name, likelihood, mixed = _model_observation(run, one_sample, last, out_dim, obs_site)
    nodes, weights = prediction_rule(likelihood, out_dim)
    quad = (last, nodes, weights)
    # substitute the model's latent and param sites only (not deterministic layer outputs
    # recorded at training points, nor the observation site)
    keep = [k for k in samples if k in sites and k != name]
    samples = {k: samples[k] for k in keep}

    def one(sample, key):
        run_key, draw_key = jax.random.split(key)
        tr, moments, log_weights = run(sample, run_key, quad)
        return component_of(tr, moments, name, likelihood, weights, layers, draw_key), log_weights

    def mixture(samples, keys):
        components, log_weights = jax.vmap(one)(samples, keys)
        mixing = None
        if mixed:  # a weighted mixture (quadrature handler): sample x mixture components
            components, mixing = flatten_mixture(mixed, components, log_weights)
        return mixture_fields(likelihood, components, mixing, weights)

    keys = jax.random.split(rng_key, S)
    fields = jax.jit(mixture)(samples, keys)
    return warn_if_not_finite(Prediction(**fields, likelihood=likelihood), "predict_from_samples")


def _marginalized_run(
    model: Callable,
    data: dict,
    key: jax.Array,
    node_rule: tuple | None,
    X_new: jax.Array,
    args: tuple,
    kwargs: dict,
) -> tuple[dict, dict, jax.Array | None]:
    """``(trace, moments, branch log weights)`` of one run of the model at ``X_new`` with
    ``data`` substituted, under :class:`marginalize_inducing` (with the quadrature
    ``(layer, nodes, weights)``, or none)."""
    handler = marginalize_inducing(
        substitute(seed(model, key), data=data), None, *(node_rule or ())
    )
    tr = trace(handler).get_trace(X_new, *args, **kwargs)
    return tr, handler.moments, handler.mixture_log_weights


def _model_layers(
    run: Callable, one_sample: dict, samples: dict
) -> tuple[list[str], int, dict[str, str]]:
    """``(layer names, last layer's out_dim, {sample or param site: its type})`` from one
    abstract run with the first sample, the model's layers checked against the samples."""
    found: dict[str, Any] = {}

    def probe():
        tr, _, _ = run(one_sample, jax.random.PRNGKey(0), None)
        layers = trace_layers(tr)
        u_sites = sorted(layers_by_u_site(tr))
        _check_model_layers(layers, u_sites, samples)
        found["layers"] = [layer.name for layer in layers]
        found["out_dim"] = layers[-1].out_dim
        found["sites"] = {n: s["type"] for n, s in tr.items() if s["type"] in ("sample", "param")}
        return 0

    jax.eval_shape(probe)
    return found["layers"], found["out_dim"], found["sites"]


def _model_observation(
    run: Callable, one_sample: dict, last: str, out_dim: int, obs_site: str | None
) -> tuple[str, str, int | None]:
    """``(observation site, its likelihood kind, number of branches or None)`` from one
    abstract run with the first sample and the last layer at quadrature nodes."""
    found: dict[str, Any] = {}

    def probe_tail():
        tr, _, log_weights = run(
            one_sample, jax.random.PRNGKey(0), (last, *spherical_rule(out_dim))
        )
        found["name"] = observation_site(tr, obs_site)
        found["likelihood"] = observation_kind(
            tr[found["name"]]["fn"], found["name"], "predict_from_samples"
        )
        found["components"] = None if log_weights is None else log_weights.shape[0]
        return 0

    jax.eval_shape(probe_tail)
    return found["name"], found["likelihood"], found["components"]


def _check_sample_arrays(samples: Any) -> tuple[dict[str, jax.Array], int]:
    """``samples`` as arrays and their number ``S``: a non-empty dict of arrays that share one
    leading (sample) axis of length at least 1.

    :raises ValueError: otherwise.
    """
    if not isinstance(samples, dict) or not samples:
        raise ValueError(
            "predict_from_samples: samples is empty; pass mcmc.get_samples() "
            "(a dict of (S, ...) arrays)"
        )
    arrays = {k: jnp.asarray(v) for k, v in samples.items()}
    sizes = {k: (v.shape[0] if v.ndim else None) for k, v in arrays.items()}
    S_set = set(sizes.values())
    if None in S_set or len(S_set) != 1:
        raise ValueError(
            "predict_from_samples: every sample array needs the same leading (sample) axis; "
            f"got {sizes}"
        )
    S = S_set.pop()
    assert S is not None  # refused above
    if S < 1:
        raise ValueError(
            "predict_from_samples: samples is empty (0 samples along the leading axis)"
        )
    return arrays, S


def _check_model_layers(layers: list, u_sites: list[str], samples: dict) -> None:
    """Refuse a model without a ``gp_layer``, and samples without some layer's inducing values
    (``u_sites``, sorted), from the model's run at the test inputs.

    :raises ValueError: for either.
    """
    if not layers:
        raise ValueError("predict_from_samples: the model runs no gp_layer")
    missing = [u for u in u_sites if u not in samples]
    if missing:
        raise ValueError(
            f"predict_from_samples: samples lack the inducing-value site(s) {missing}; they hold "
            f"{sorted(samples)}. Pass the samples of an MCMC run on the model "
            "(its '<layer>.u' sites)"
        )


def _check_samples(model, samples, params, X_new, args, kwargs, strict):
    """``predict_from_samples``'s door, from one abstract run of the model at ``X_new`` with the
    first sample and ``params`` substituted: ``params`` names only sites of the model and holds
    finite values, and each latent site's samples have the shape of the site's distribution
    there (another ``out_dim``, or inducing values that do not match the inducing inputs, are
    reported by name). Returns ``params`` as arrays."""
    fixed = {k: jnp.asarray(v) for k, v in (params or {}).items()}
    data = {**fixed, **{k: v[0] for k, v in samples.items()}}
    _check_no_param_unset(model, data, X_new, args, kwargs)
    found = {}

    def run():
        tr = trace(substitute(seed(model, jax.random.PRNGKey(0)), data=data)).get_trace(
            X_new, *args, **kwargs
        )
        for name, site in tr.items():
            if site["type"] == "param" or (site["type"] == "sample" and not site["is_observed"]):
                shape = site["fn"].shape() if site["type"] == "sample" else jnp.shape(site["value"])
                found[name] = jax.ShapeDtypeStruct(tuple(shape), jnp.result_type(site["value"]))
        return 0

    jax.eval_shape(run)
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
    return fixed


class _UnsetParam(Exception):
    """Raised by :class:`_stop_at_unset_param` with the name of the first unset param site."""


class _stop_at_unset_param(Messenger):
    """Stop a run at the first ``numpyro.param`` site that nothing substituted, before its
    initial value is computed (from the inputs at hand: k-means at fewer points than
    ``num_inducing`` would fail, and at more would silently stand in for the fitted values)."""

    def process_message(self, msg: dict) -> None:
        if msg["type"] == "param" and msg["value"] is None:
            raise _UnsetParam(msg["name"])


def _check_no_param_unset(model, data, X_new, args, kwargs):
    def run():
        with _stop_at_unset_param():
            substitute(seed(model, jax.random.PRNGKey(0)), data=data)(X_new, *args, **kwargs)
        return 0

    try:
        jax.eval_shape(run)
    except _UnsetParam as unset:
        raise ValueError(
            f"predict_from_samples: param site {unset.args[0]!r} is neither in the samples nor "
            "in params=; it would take its initial value (e.g. k-means on X_new). Pass params= "
            "(the fitted values, or those the MCMC run used)"
        ) from None
