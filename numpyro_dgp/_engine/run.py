"""One run of a guide and then the model under
:class:`~numpyro_dgp._engine.marginal.marginalize_inducing` (or
:class:`~numpyro_dgp._engine.marginal.propagate_moments`), and the reading of both traces.

:func:`marginal_trace` finds the layers and the observation rule (an abstract first pass),
reads the guide's Gaussian over each inducing site (:func:`guide_posteriors`; for NumPyro's
``AutoContinuous`` guides, :func:`autocontinuous_posteriors`) and returns both traces with
what the objectives and ``predict`` need (:class:`MarginalRun`); :func:`moment_trace` does the
same for moment propagation.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer.autoguide import AutoContinuous

from numpyro_dgp._compat import autocontinuous_layout, innermost_guide, is_tracer
from numpyro_dgp._engine.marginal import marginalize_inducing, propagate_moments
from numpyro_dgp._engine.observation import likelihood_rule, observation_kind, shared_rule
from numpyro_dgp._protocol import (
    CONDITIONAL,
    GAUSSIAN,
    abstract_read,
    get_tag,
    latent_specs,
    node_tail,
    trace_layers,
)
from numpyro_dgp.guides import CorrelatedRecursion, EncodedSets
from numpyro_dgp.handlers import fast_subsample
from numpyro_dgp.layers import Layer
from numpyro_dgp.posteriors import (
    ChainLink,
    JointBlock,
    LatentPosterior,
    site_gaussian,
    unwrap_distribution,
)


class MarginalRun(NamedTuple):
    """A guide trace and the model trace run under :class:`marginalize_inducing`.

    :ivar guide_trace: the guide's trace.
    :ivar model_trace: the model's trace, replayed against the guide's.
    :ivar posteriors: ``{u-site name: posterior}`` the guide's Gaussians, as the KL reads them
        (the handler marginalized these, or under the sampled estimator what
        :meth:`~numpyro_dgp.guides.CorrelatedRecursion.sampled` makes of them).
    :ivar moments: ``{layer name: (mean, var)}`` of the layers' outputs.
    :ivar layer_order: layer names in execution order.
    :ivar node_weights: ``(K,)`` weights of the last layer's quadrature nodes.
    :ivar mixture_log_weights: ``(S,)`` log weights of the branches, if a layer branched.
    :ivar guide_name: the guide's class name (for error messages).
    :ivar last_output: the last layer's value at its nodes, ``(K, ..., N, P)``.
    :ivar correlated_outputs: whether the last layer's outputs are correlated at a point.
    :ivar penalties: the inner layers' penalties of a moment-propagation run
        (:func:`moment_trace`, ``"bound"`` mode).
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


def model_facts(model_trace: dict) -> dict:
    """What the engine needs to know of a model's trace: its last layer (``"last"`` and its
    ``"out_dim"``), ``"u_sites"`` (``{u-site: (P, M)}`` in execution order, the last layer's
    last), whether a layer uses inducing ``"locations"``, the ``"latents"`` (latent-input
    sites) and the ``"encoded"`` layers (per-point inducing sets).

    :raises ValueError: if the model ran no ``gp_layer``.
    """
    layers = trace_layers(model_trace)
    if not layers:
        raise ValueError(
            "the model has no gp_layer: DGPElbo and predict need a model built with "
            "numpyro_dgp.gp_layer"
        )
    return {
        "last": layers[-1].name,
        "out_dim": layers[-1].out_dim,
        "u_sites": {lay.u_site: (lay.out_dim, lay.inducing_inputs.shape[0]) for lay in layers},
        "locations": any(lay.inducing == "locations" for lay in layers),
        "latents": list(latent_specs(model_trace)),
        "encoded": [lay.name for lay in layers if lay.inducing == "amortized"],
    }


def layers_by_u_site(model_trace: dict) -> dict[str, Layer]:
    """``{u-site name: Layer}`` from the layer messages of a model trace (the ``infer`` tags of
    the ``u`` sites cannot be used: ``replay`` overwrites them with the guide's)."""
    return {layer.u_site: layer for layer in trace_layers(model_trace)}


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
    importance: Any = None,
    joint_draws: bool = False,
    correlated: str = "exact",
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
    :param importance: the importance-weighted bound's plug-in (``K`` draws of every latent
        input per point; see :class:`marginalize_inducing`), or ``None``.
    :param joint_draws: with several outputs, Monte Carlo draws whatever the observation (the
        ``2 P`` nodes a Normal takes are exact for its expected log-density, not for the density
        of a row under outputs correlated at a point).
    :param correlated: for a guide that correlates the layers, ``"exact"`` (each point's
        recursion) or ``"sampled"`` (the guide's sampled inducing values, shared by the points,
        the last layer marginalized given them; see
        :meth:`~numpyro_dgp.guides.CorrelatedRecursion.sampled`).
    :return: :class:`MarginalRun`. With ``objective="predict"``, latent inputs are drawn from
        their prior and the guide's plates are not replayed (new points).
    """
    predicting = objective == "predict"
    latent_mode = "prior" if predicting else "posterior"
    with validation_off_when_traced(params):
        guide_trace, seeded_model = guide_then_model(
            model, guide, params, rng_key, args, kwargs, replay_plates=not predicting
        )
        probed = marginalize_inducing(seeded_model, latent_mode=latent_mode)
        found = abstract_read(probed, args, kwargs, model_facts)
        kinds = None
        if found["out_dim"] > 1 and nodes_per_output is None and not joint_draws:
            kinds = _tail_kinds(seeded_model, found, args, kwargs, objective, latent_mode)
        nodes, weights = likelihood_rule(
            found["out_dim"], kinds, nodes_per_output, num_samples, objective
        )
        base_guide = innermost_guide(guide)
        _check_guide_fits_model(base_guide, found, importance, objective)
        if isinstance(base_guide, AutoContinuous):
            posteriors = autocontinuous_posteriors(
                base_guide, guide_trace, found["u_sites"], objective
            )
        elif found["locations"]:
            # Layer l's inducing inputs are layer l-1's inducing values: those must be the very
            # samples every point is propagated with, so the inner layers run on sampled u and only
            # the last layer is marginalized, given the samples (its guide site's own Gaussian).
            last_u = list(found["u_sites"])[-1]
            posteriors = guide_posteriors(
                guide_trace, {last_u: found["u_sites"][last_u]}, structured=False
            )
        else:
            posteriors = guide_posteriors(guide_trace, found["u_sites"])
        posteriors.update(EncodedSets.encoders(guide_trace))
        posteriors.update(latent_posteriors(guide_trace, found["latents"]))
        marginalized = posteriors
        if correlated == "sampled":
            conditionals = guide_posteriors(guide_trace, found["u_sites"], structured=False)
            marginalized = CorrelatedRecursion.sampled(posteriors, conditionals)
        handler = marginalize_inducing(
            seeded_model, marginalized, found["last"], nodes, weights, latent_mode, importance
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
    base_guide: Callable, found: dict, importance: Any, objective: str
) -> None:
    """Refuse per-point inducing sets without a guide that encodes them, what the importance
    plug-in refuses, and an ``AutoContinuous`` guide on a model with ``inducing="locations"``
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
    if importance is not None:
        importance.check_model(found["encoded"], objective)
    if isinstance(base_guide, AutoContinuous) and found["locations"]:
        raise ValueError(
            f"{objective} with {type(base_guide).__name__}: a model with inducing='locations' "
            "needs each layer's Gaussian given the sampled earlier layers; use "
            "numpyro_dgp.guides.AutoJointDGP (the same joint Gaussian family) or AutoFactorizedDGP"
        )


def _tail_kinds(
    seeded_model: Callable, found: dict, args: tuple, kwargs: dict, objective: str, latent_mode: str
) -> list[str]:
    """The kinds (:func:`~numpyro_dgp._engine.observation.observation_kind`) of the sample sites
    after the last layer (observed in training, not yet at prediction), from an abstract run with
    two nodes on it (so that a parameter that depends on the layer carries the node axis);
    ``found``: what :func:`marginal_trace`'s probe found."""
    nodes = np.stack([np.ones(found["out_dim"]), -np.ones(found["out_dim"])])
    last = found["last"]
    handler = marginalize_inducing(seeded_model, None, last, nodes, np.full(2, 0.5), latent_mode)

    def read(tr):
        kinds = []
        for name in node_tail(tr):
            try:
                kinds.append(observation_kind(tr[name]["fn"], name, objective))
            except NotImplementedError:
                # a likelihood over vectors (which predictive mixtures refuse) counts as
                # general: Monte Carlo draws train any likelihood
                kinds.append("general")
        return kinds

    return abstract_read(handler, args, kwargs, read)


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
    seeded_guide = substitute(seed(fast_subsample(guide), guide_key), data=params)
    guide_trace = trace(seeded_guide).get_trace(*args, **kwargs)
    replayed = guide_trace
    if not replay_plates:
        replayed = {k: v for k, v in guide_trace.items() if v["type"] != "plate"}
    seeded_model = substitute(replay(seed(fast_subsample(model), model_key), replayed), data=params)
    return guide_trace, seeded_model


def validation_off_when_traced(params: Any) -> contextlib.AbstractContextManager:
    """NumPyro's argument checks cannot act on traced values (a traced check is skipped, and
    the compiler drops it), yet tracing them adds to every compilation of a DGP step; they
    stay on in eager runs (``svi.init`` runs the model so)."""
    traced = any(is_tracer(x) for x in jax.tree_util.tree_leaves(params))
    return numpyro.validation_enabled(False) if traced else contextlib.nullcontext()


def _guide_samples(guide_trace: dict, names: Any) -> list[dict]:
    """The sample sites of a guide trace among ``names`` (in their order)."""
    sites = [guide_trace.get(name) for name in names]
    return [site for site in sites if site is not None and site["type"] == "sample"]


def latent_posteriors(guide_trace: dict, names: list[str]) -> dict[str, Any]:
    """``{site: q(w_n)}`` of the latent inputs ``names``, each a
    :class:`~numpyro_dgp.posteriors.LatentPosterior`: a library guide's, or the ``(loc, scale)``
    of a guide site that is a Normal (NumPyro's ``AutoNormal``); sites with neither are left
    out."""
    out: dict[str, Any] = {}
    for site in _guide_samples(guide_trace, names):
        posterior = getattr(site["fn"], "posterior", None)
        base = unwrap_distribution(site["fn"])
        if isinstance(posterior, LatentPosterior):
            out[site["name"]] = posterior
        elif isinstance(base, dist.Normal):
            out[site["name"]] = LatentPosterior(lambda _, q=(base.loc, base.scale): q)
    return out


def guide_posteriors(
    guide_trace: dict, u_sites: dict[str, tuple[int, int]], structured: bool = True
) -> dict[str, Any]:
    """The guide's Gaussian over every inducing site it samples (:func:`site_posterior` of
    each site of ``u_sites``, ``{u-site name: value shape (P, M)}``); the sites whose guide
    distribution is not Gaussian over the inducing values are left to sampling."""
    out = {}
    for site in _guide_samples(guide_trace, u_sites):
        posterior = site_posterior(site, u_sites[site["name"]], structured)
        if posterior is not None:
            out[site["name"]] = posterior
    return out


def site_posterior(
    site: dict, shape: tuple[int, int], structured: bool = True
) -> tuple[jax.Array, jax.Array] | ChainLink | JointBlock | None:
    """A guide site's Gaussian over its ``(P, M)`` inducing values.

    :param site: the guide's site.
    :param shape: ``(P, M)``.
    :param structured: prefer the structure the site declares (``infer[GAUSSIAN]``:
        :class:`~numpyro_dgp.posteriors.ChainLink`, :class:`~numpyro_dgp.posteriors.JointBlock`,
        the marginal over the layers).
    :return: the declared structure if ``structured``, else the site's Gaussian given the
        earlier samples (``infer[CONDITIONAL]``, or the site distribution itself); ``None`` if
        neither is Gaussian.
    """
    declared = get_tag(site, GAUSSIAN)
    if structured and declared is not None:
        return declared
    conditional = get_tag(site, CONDITIONAL)
    if conditional is not None:
        return conditional
    return site_gaussian(site["name"], site["fn"], shape)


def autocontinuous_posteriors(
    guide: AutoContinuous,
    guide_trace: dict,
    model_u_sites: dict[str, tuple[int, int]],
    objective: str,
) -> dict[str, Any]:
    """The Gaussian over the inducing sites of a run of NumPyro's ``AutoContinuous`` guide.

    Such a guide (``AutoDiagonalNormal``, ``AutoMultivariateNormal``,
    ``AutoLowRankMultivariateNormal``, ``AutoIAFNormal``, ``AutoBNAF``) draws one flat latent
    vector on an auxiliary site and hands each model site a ``Delta`` of its slice. A diagonal
    latent Gaussian gives each inducing site its own ``(loc (P, M), scale (P, M))``; a full or
    low-rank one gives one :class:`~numpyro_dgp.posteriors.JointBlock` over all inducing sites
    in the model's execution order (the order NumPyro packs them in).

    :param guide: the set-up guide.
    :param guide_trace: a trace of its run.
    :param model_u_sites: ``{u-site: (P, M)}`` of the model, in execution order.
    :param objective: the objective's name, for error messages.
    :return: ``{u-site: posterior}``.
    :raises ValueError: the latent vector holds sites other than inducing values (their
        correlation with the inducing values would be dropped), packs the inducing sites out of
        execution order, or its distribution is not Gaussian.
    """
    layout = autocontinuous_layout(guide)
    name = type(guide).__name__
    others = [s for s in layout if s not in model_u_sites]
    if others:
        raise ValueError(
            f"{objective} with {name}: the guide's latent vector also holds {others}, whose "
            f"correlation with the inducing values {objective} cannot integrate over. Use "
            "numpyro_dgp.guides.AutoJointDGP (a joint Gaussian over the inducing values; other "
            "latent sites get their own AutoNormal), or NumPyro's Trace_ELBO with this guide"
        )
    latent = unwrap_distribution(guide_trace[f"_{guide.prefix}_latent"]["fn"])
    sites = [s for s in model_u_sites if s in layout]
    if isinstance(latent, dist.Normal):
        loc, scale = jnp.broadcast_arrays(latent.loc, latent.scale)
        out: dict[str, Any] = {}
        for s in sites:
            start, stop, shape = layout[s]
            out[s] = (loc[start:stop].reshape(shape), scale[start:stop].reshape(shape))
        return out
    if not isinstance(latent, (dist.MultivariateNormal, dist.LowRankMultivariateNormal)):
        raise ValueError(
            f"{objective} with {name}: the guide's distribution over the inducing values is not "
            f"Gaussian ({type(latent).__name__}), so {objective} cannot integrate them out. Use "
            "NumPyro's Trace_ELBO with this guide, or a Gaussian guide "
            "(numpyro_dgp.guides.AutoFactorizedDGP, AutoJointDGP, NumPyro's AutoNormal, "
            "AutoMultivariateNormal) with this objective"
        )
    order = [layout[s][0] for s in sites]
    if order != sorted(order):
        raise ValueError(
            f"{objective} with {name}: the guide packs the inducing sites out of execution order"
        )
    block = JointBlock(
        tuple(sites), tuple(tuple(layout[s][2]) for s in sites), latent.loc, latent.scale_tril
    )
    return {s: block for s in sites}


def moment_trace(
    model: Callable,
    guide: Callable,
    params: dict,
    rng_key: jax.Array,
    args: tuple,
    kwargs: dict,
    mode: str,
    nodes_per_output: int,
    caller: str,
    propagate_inducing_variance: bool = True,
    kind: str = "normal",
) -> MarginalRun:
    """Run ``guide``, then ``model`` under
    :class:`~numpyro_dgp._engine.marginal.propagate_moments`.

    :param model: the model.
    :param guide: the guide (its inducing sites give the Gaussians; their sampled values are
        unused).
    :param params: parameter values substituted into both.
    :param rng_key: PRNG key (the guide's draws of sites other than the inducing values).
    :param args: positional arguments of the model and guide.
    :param kwargs: keyword arguments of the model and guide.
    :param mode: ``"bound"`` or ``"predict"``.
    :param nodes_per_output: Gauss-Hermite nodes per output of the last layer.
    :param caller: the name errors are reported under.
    :param propagate_inducing_variance: see
        :class:`~numpyro_dgp._engine.marginal.propagate_moments`.
    :param kind: the observation's kind, which picks the rule over several outputs
        (:func:`~numpyro_dgp._engine.observation.shared_rule`).
    :return: :class:`MarginalRun` with the inner layers' penalties
        (``"bound"`` mode).
    """
    with validation_off_when_traced(params):
        guide_trace, seeded_model = guide_then_model(model, guide, params, rng_key, args, kwargs)
        # the layers and which one is last, from an abstract run
        found = abstract_read(seeded_model, args, kwargs, model_facts)
        nodes, weights = shared_rule(found["out_dim"], kind, nodes_per_output, caller)
        posteriors = guide_posteriors(guide_trace, found["u_sites"])
        named = f"{caller} with {type(innermost_guide(guide)).__name__}"
        options = (nodes, named, propagate_inducing_variance)
        handler = propagate_moments(seeded_model, posteriors, mode, found["last"], *options)
        model_trace = trace(handler).get_trace(*args, **kwargs)
        return MarginalRun(
            guide_trace,
            model_trace,
            posteriors,
            handler.moments,
            handler.layer_order,
            weights,
            penalties=handler.penalties,
        )
