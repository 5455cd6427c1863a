"""One run of a guide and then the model under
:class:`~numpyro_dgp._engine.marginal.marginalize_inducing`: :func:`marginal_trace` finds the layers
and the observation rule (an abstract first pass), reads the guide's posteriors and returns both
traces with what the objectives and ``predict`` need (:class:`MarginalRun`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer.autoguide import AutoContinuous

from numpyro_dgp._compat import innermost_guide, is_tracer
from numpyro_dgp._engine.autoguides import autocontinuous_posteriors
from numpyro_dgp._engine.marginal import marginalize_inducing
from numpyro_dgp._engine.observation import likelihood_rule, observation_kind
from numpyro_dgp._engine.traces import (
    final_layer_name,
    guide_posteriors,
    model_u_sites,
    uses_inducing_locations,
)
from numpyro_dgp._protocol import latent_specs, message_layer, node_tail, trace_layers
from numpyro_dgp.handlers import fast_subsample
from numpyro_dgp.posteriors import LatentPosterior, unwrap_distribution

__all__ = [
    "MarginalRun",
    "encoder_posteriors",
    "guide_then_model",
    "latent_posteriors",
    "marginal_trace",
]


class MarginalRun(NamedTuple):
    """A guide trace and the model trace run under :class:`marginalize_inducing`.

    :ivar guide_trace: the guide's trace.
    :ivar model_trace: the model's trace, replayed against the guide's.
    :ivar posteriors: ``{u-site name: posterior}`` the handler marginalized.
    :ivar moments: ``{layer name: (mean, var)}`` of the layers' outputs.
    :ivar layer_order: layer names in execution order.
    :ivar node_weights: ``(K,)`` weights of the last layer's quadrature nodes.
    :ivar mixture_log_weights: ``(S,)`` log weights of the branches, if a layer branched.
    :ivar guide_name: the guide's class name (for error messages).
    :ivar last_output: the last layer's value at its nodes, ``(K, ..., N, P)``.
    :ivar correlated_outputs: whether the last layer's outputs are correlated at a point.
    :ivar penalties: the inner layers' penalties of a moment-propagation run
        (:func:`~numpyro_dgp._engine.moments.moment_trace`, ``"bound"`` mode).
    """

    guide_trace: dict
    model_trace: dict
    posteriors: dict
    moments: dict
    layer_order: list
    node_weights: np.ndarray
    mixture_log_weights: jax.Array | None = None
    guide_name: str = "the guide"
    last_output: Any = None
    correlated_outputs: bool = False
    penalties: list | tuple = ()


def marginal_trace(
    model: Callable,
    guide: Callable,
    params: dict,
    rng_key: jax.Array,
    args: tuple,
    kwargs: dict,
    nodes_per_output: int | None = None,
    objective: str = "DGPElbo",
    num_samples: int | None = None,
    num_importance: int | None = None,
    joint_draws: bool = False,
) -> MarginalRun:
    """Run ``guide`` then ``model`` with inducing values marginalized and quadrature nodes on
    the last layer (see :class:`marginalize_inducing`).

    :param model: the model.
    :param guide: the guide.
    :param params: parameter values ``{name: value}`` substituted into both.
    :param rng_key: PRNG key.
    :param args: positional arguments of the model and guide.
    :param kwargs: keyword arguments of the model and guide.
    :param nodes_per_output: nodes per output of the last layer (see
        :func:`~numpyro_dgp._engine.observation.likelihood_rule`).
    :param objective: who asks (named in error messages).
    :param num_samples: Monte Carlo draws per point where the rule draws (several outputs and
        an observation that is not Gaussian).
    :param num_importance: ``K`` draws of every latent input per point (importance weighting;
        see :class:`marginalize_inducing`).
    :param joint_draws: with several outputs, Monte Carlo draws whatever the observation (the
        ``2 P`` nodes a Normal takes are exact for its expected log-density, not for the density
        of a row under outputs correlated at a point).
    :return: :class:`MarginalRun`. With ``objective="predict"``, latent inputs are drawn from
        their prior and the guide's plates are not replayed (new points).
    """
    predicting = objective == "predict"
    with validation_off_when_traced(params):
        guide_trace, seeded_model = guide_then_model(
            model, guide, params, rng_key, args, kwargs, replay_plates=not predicting
        )

        # Which sites are inducing values and which layer is last: an abstract first pass
        # (jax.eval_shape), so it adds nothing to the compiled computation.
        found = {}

        latent_mode = "prior" if predicting else "posterior"

        def probe():
            tr = trace(marginalize_inducing(seeded_model, latent_mode=latent_mode)).get_trace(
                *args, **kwargs
            )
            last = final_layer_name(tr)
            found["u_sites"] = model_u_sites(tr)
            found["last"] = last
            found["out_dim"] = message_layer(tr[f"{last}.layer"]).out_dim
            found["locations"] = uses_inducing_locations(tr)
            found["last_u_site"] = message_layer(tr[f"{last}.layer"]).u_site
            found["latents"] = list(latent_specs(tr))
            found["encoded"] = [
                layer.name for layer in trace_layers(tr) if layer.inducing == "amortized"
            ]
            return 0

        # closing over args keeps static ones (subsample sizes) concrete
        jax.eval_shape(probe)  # an abstract run: it computes nothing
        last = found["last"]
        kinds = None
        if found["out_dim"] > 1 and nodes_per_output is None and not joint_draws:
            kinds = _tail_kinds(
                seeded_model, last, found["out_dim"], args, kwargs, objective, latent_mode
            )
        nodes, weights = likelihood_rule(
            found["out_dim"], kinds, nodes_per_output, num_samples, objective
        )

        base_guide = innermost_guide(guide)
        _check_guide_fits_model(base_guide, found, num_importance, objective)
        if isinstance(base_guide, AutoContinuous):
            posteriors = autocontinuous_posteriors(
                base_guide, guide_trace, found["u_sites"], objective
            )
        elif found["locations"]:
            # Layer l's inducing inputs are layer l-1's inducing values: those must be the very
            # samples every point is propagated with, so the inner layers run on sampled u and only
            # the last layer is marginalized, given the samples (its guide site's own Gaussian).
            last_u = found["last_u_site"]
            posteriors = guide_posteriors(
                guide_trace, {last_u: found["u_sites"][last_u]}, structured=False
            )
        else:
            posteriors = guide_posteriors(guide_trace, found["u_sites"])
        posteriors.update(encoder_posteriors(guide_trace))
        posteriors.update(latent_posteriors(guide_trace, found["latents"]))
        handler = marginalize_inducing(
            seeded_model, posteriors, last, nodes, weights, latent_mode, num_importance
        )
        model_trace = trace(handler).get_trace(*args, **kwargs)
        return MarginalRun(
            guide_trace,
            model_trace,
            posteriors,
            handler.moments,
            handler.layer_order,
            weights,
            handler.mixture_log_weights,
            type(base_guide).__name__,
            handler.last_output,
            handler.correlated_outputs,
        )


def _check_guide_fits_model(
    base_guide: Callable, found: dict, num_importance: int | None, objective: str
) -> None:
    """Refuse per-point inducing sets without a guide that encodes them or under importance
    weighting, and an ``AutoContinuous`` guide on a model with ``inducing="locations"``
    (``found``: what :func:`marginal_trace`'s probe found).

    Per-point inducing sets are encoded by :class:`~numpyro_dgp.guides.AutoAmortizedDGP` only
    (a guide says so by ``encodes_inducing_sets``); another autoguide (NumPyro's draw them as
    free local latents, whose Gaussian the engine cannot read) is refused by name.

    :raises ValueError: for any of them.
    """
    set_up = getattr(base_guide, "prototype_trace", None) is not None  # an autoguide
    if found["encoded"] and set_up and not getattr(base_guide, "encodes_inducing_sets", False):
        raise ValueError(
            f"{objective} with {type(base_guide).__name__}: layer(s) {found['encoded']} have "
            "per-point inducing sets (inducing='amortized'), which only an encoder describes; "
            "use numpyro_dgp.guides.AutoAmortizedDGP"
        )
    if num_importance and found["encoded"]:
        raise ValueError(
            f"{objective}: layers {found['encoded']} have per-point inducing sets, which the "
            "importance-weighted bound does not take; use DGPElbo"
        )
    if isinstance(base_guide, AutoContinuous) and found["locations"]:
        raise ValueError(
            f"{objective} with {type(base_guide).__name__}: a model with inducing='locations' "
            "needs each layer's Gaussian given the sampled earlier layers; use "
            "numpyro_dgp.guides.AutoJointDGP (the same joint Gaussian family) or AutoFactorizedDGP"
        )


def _tail_kinds(
    seeded_model: Callable,
    last: str,
    out_dim: int,
    args: tuple,
    kwargs: dict,
    objective: str,
    latent_mode: str,
) -> list[str]:
    """The kinds (:func:`~numpyro_dgp._engine.observation.observation_kind`) of the sample sites
    after the last layer (observed in training, not yet at prediction), from an abstract run with
    two nodes on it (so that a parameter that depends on the layer carries the node axis)."""
    found = {}
    nodes = np.stack([np.ones(out_dim), -np.ones(out_dim)])

    def probe():
        handler = marginalize_inducing(
            seeded_model, None, last, nodes, np.full(2, 0.5), latent_mode
        )
        tr = trace(handler).get_trace(*args, **kwargs)
        found["kinds"] = [_training_kind(tr[name]["fn"], name, objective) for name in node_tail(tr)]
        return 0

    jax.eval_shape(probe)
    return found["kinds"]


def _training_kind(fn: Any, name: str, objective: str) -> str:
    """:func:`~numpyro_dgp._engine.observation.observation_kind`, a likelihood over vectors (which
    predictive mixtures refuse) counting as general: Monte Carlo draws train any likelihood."""
    try:
        return observation_kind(fn, name, objective)
    except NotImplementedError:
        return "general"


def guide_then_model(
    model: Callable,
    guide: Callable,
    params: dict,
    rng_key: jax.Array,
    args: tuple,
    kwargs: dict,
    replay_plates: bool = True,
) -> tuple[dict, Callable]:
    """The guide's trace (run with ``params`` under one half of ``rng_key``) and the model
    seeded with the other half, replaying that trace, with ``params`` substituted: the start of
    every objective and prediction that runs the guide before the model.

    With ``replay_plates=False`` the model draws its own plates' subsamples (prediction at new
    points: a guide's plate over the training points must not choose them)."""
    guide_key, model_key = jax.random.split(rng_key)
    guide_trace = trace(substitute(seed(fast_subsample(guide), guide_key), data=params)).get_trace(
        *args, **kwargs
    )
    replayed = (
        guide_trace
        if replay_plates
        else {k: v for k, v in guide_trace.items() if v["type"] != "plate"}
    )
    seeded_model = substitute(replay(seed(fast_subsample(model), model_key), replayed), data=params)
    return guide_trace, seeded_model


def validation_off_when_traced(params: Any) -> contextlib.AbstractContextManager:
    """NumPyro's argument checks cannot act on traced values (a traced check is skipped, and
    the compiler drops it), yet tracing them costs about 0.2 s of every
    compilation of a DGP step; they stay on in eager runs (``svi.init`` runs the model so)."""
    traced = any(is_tracer(x) for x in jax.tree_util.tree_leaves(params))
    return numpyro.validation_enabled(False) if traced else contextlib.nullcontext()


def latent_posteriors(guide_trace: dict, names: list[str]) -> dict[str, Any]:
    """``{site: q(w_n)}`` of the latent inputs ``names``: a library guide's
    :class:`~numpyro_dgp.posteriors.LatentPosterior`, or ``(loc, scale)`` of a guide site that is
    a Normal (NumPyro's ``AutoNormal``); sites with neither are left out.

    :param guide_trace: a trace of the guide.
    :param names: the latent inputs' site names.
    """
    out: dict[str, Any] = {}
    for name in names:
        site = guide_trace.get(name)
        if site is None or site["type"] != "sample":
            continue
        posterior = getattr(site["fn"], "posterior", None)
        base = unwrap_distribution(site["fn"])
        if isinstance(posterior, LatentPosterior):
            out[name] = posterior
        elif isinstance(base, dist.Normal):
            out[name] = (base.loc, base.scale)
    return out


def encoder_posteriors(guide_trace: dict) -> dict[str, Any]:
    """``{u-site: encoder}`` from the placeholder sites of a guide that encodes per-point
    inducing sets (:class:`~numpyro_dgp.guides.AutoAmortizedDGP`: the site's distribution
    carries a ``posterior`` with ``encode`` and a ``mixture``).

    :param guide_trace: a trace of the guide.
    """
    return {
        site["fn"].site: site["fn"].posterior
        for site in guide_trace.values()
        if site["type"] == "sample" and hasattr(getattr(site["fn"], "posterior", None), "mixture")
    }
