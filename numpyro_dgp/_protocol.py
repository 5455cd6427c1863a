"""How the primitive, the handlers, the guides and the objectives talk to each other.

``gp_layer`` sends two kinds of messages of its own through NumPyro's handler stack and tags
the sample sites it creates; handlers and guides tag sites and messages too. Every message
type and ``infer`` key of that protocol is defined here, once, with the type of its value:

* message :data:`LAYER_MESSAGE` (``"dgp_layer"``), named ``"<layer>.layer"``: ``args =
  (Layer, X, u)``, ``kwargs = {"rng_key", "full_cov"}``; its value is the layer's output;
* message :data:`ENCODER_INPUT_MESSAGE` (``"dgp_encoder_input"``), named
  ``"<layer>.encoder_input"``: what an amortized layer's encoder sees;
* message :data:`LATENT_MESSAGE` (``"dgp_latent"``), named ``"<site>.latent"``: ``args =
  (LatentSpec,)``, ``kwargs = {"rng_key"}``, sent by ``latent_input`` before its sample site;
* ``infer`` keys: :data:`INDUCING` on a layer's ``"<layer>.u"`` sample site
  (:class:`InducingTag`), :data:`GAUSSIAN` and :data:`CONDITIONAL` on a guide's inducing
  sites (the Gaussian structure it declares, see :mod:`numpyro_dgp.posteriors`),
  :data:`FLOW` and :data:`BRANCHES` on layer messages (set by the ``sde_flow`` and
  ``quadrature`` handlers), :data:`QUADRATURE_AXIS`, :data:`AMORTIZED_KL` and
  :data:`IMPORTANCE_LOG_WEIGHTS` on sample sites (set by the inducing-marginalization engine).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

__all__ = [
    "AMORTIZED_KL",
    "BRANCHES",
    "CONDITIONAL",
    "ENCODER_INPUT_MESSAGE",
    "FLOW",
    "GAUSSIAN",
    "IMPORTANCE_LOG_WEIGHTS",
    "INDUCING",
    "LATENT_MESSAGE",
    "LAYER_MESSAGE",
    "QUADRATURE_AXIS",
    "BranchTag",
    "FlowTag",
    "InducingTag",
    "amortized_layer_names",
    "get_tag",
    "inducing_site_names",
    "inducing_tag",
    "is_layer_message",
    "latent_specs",
    "message_layer",
    "quadrature_tail",
    "trace_layer_names",
    "trace_layers",
    "with_tag",
]

#: Message type sent by every ``gp_layer`` call (value: the layer's output).
LAYER_MESSAGE = "dgp_layer"
#: Message type giving an amortized layer's encoder input.
ENCODER_INPUT_MESSAGE = "dgp_encoder_input"
#: Message type announcing a latent input (``latent_input``): its spec and key.
LATENT_MESSAGE = "dgp_latent"

#: On a ``"<layer>.u"`` sample site: :class:`InducingTag`.
INDUCING = "dgp_inducing"
#: On a guide's inducing site: the structure the guide declares over several sites
#: (:class:`~numpyro_dgp.posteriors.ChainLink` or :class:`~numpyro_dgp.posteriors.JointBlock`).
GAUSSIAN = "dgp_gaussian"
#: On a guide's inducing site: its Gaussian given the guide's earlier samples
#: (``(loc, scale)`` or a one-site :class:`~numpyro_dgp.posteriors.JointBlock`).
CONDITIONAL = "dgp_conditional"
#: On a layer message: :class:`FlowTag` (the layer is an SDE flow).
FLOW = "dgp_flow"
#: On a layer message: :class:`BranchTag` (the layer's outputs branch at quadrature points).
BRANCHES = "dgp_branches"
#: On a sample site after the last layer: its value has the last layer's quadrature axis.
QUADRATURE_AXIS = "dgp_quadrature"
#: On a local site (an amortized ``"<layer>.u"``, a latent input): the per-point KL of its
#: ``q(. | p_n)`` against its prior, taken in closed form by the objectives.
AMORTIZED_KL = "dgp_amortized_kl"
#: On a latent input drawn ``K`` times per point: ``(K, B)`` ``log p(w) - log q(w)`` of the draws.
IMPORTANCE_LOG_WEIGHTS = "dgp_importance"


class InducingTag(NamedTuple):
    """What a ``"<layer>.u"`` sample site is (``infer[INDUCING]``).

    :ivar layer: the layer's name.
    :ivar whiten: whether the site is whitened (prior ``N(0, I)``).
    :ivar inducing: ``"global"``, ``"locations"`` or ``"amortized"``.
    :ivar encoder_input: ``(..., B, D)`` what the encoder of an amortized layer sees (else ``None``).
    """

    layer: str
    whiten: bool
    inducing: str
    encoder_input: jax.Array | None = None


class FlowTag(NamedTuple):
    """An ``sde_flow`` layer (``infer[FLOW]`` of its layer message).

    :ivar spec: the flow's settings (:class:`~numpyro_dgp.handlers.FlowSpec`).
    :ivar record: a dict the flow writes its recorded path into (key ``"path"``).
    """

    spec: Any
    record: dict


class BranchTag(NamedTuple):
    """A layer whose outputs branch (``infer[BRANCHES]`` of its layer message).

    :ivar points: ``(S, P)`` standard-normal points of the branches.
    :ivar log_weights: ``(S,)`` log branch weights.
    """

    points: jax.Array
    log_weights: jax.Array


def get_tag(site: dict, key: str, default: Any = None) -> Any:
    """``site["infer"][key]``, or ``default`` where the site has no such tag."""
    return (site.get("infer") or {}).get(key, default)


def with_tag(msg: dict, key: str, value: Any) -> None:
    """Tag ``msg`` (a copy of its ``infer`` dict, so shared dicts are never mutated)."""
    msg["infer"] = {**(msg.get("infer") or {}), key: value}


def inducing_tag(site: dict) -> InducingTag | None:
    """The :class:`InducingTag` of a layer's inducing site, ``None`` for any other site."""
    return get_tag(site, INDUCING) if site.get("type") == "sample" else None


def is_layer_message(msg: dict) -> bool:
    """Whether ``msg`` (a message or a trace site) is a ``gp_layer``'s :data:`LAYER_MESSAGE`."""
    return msg.get("type") == LAYER_MESSAGE


def message_layer(msg: dict) -> Any:
    """The :class:`~numpyro_dgp.layers.Layer` a :data:`LAYER_MESSAGE` carries (its first argument)."""
    return msg["args"][0]


def trace_layers(trace: dict) -> list:
    """The layers of a model trace, in execution order (from their :data:`LAYER_MESSAGE` sites)."""
    return [message_layer(site) for site in trace.values() if is_layer_message(site)]


def trace_layer_names(trace: dict) -> list[str]:
    """The names of the layers of a model trace, in execution order."""
    return [layer.name for layer in trace_layers(trace)]


def inducing_site_names(trace: dict) -> list[str]:
    """The ``"<layer>.u"`` sample sites of a model trace (tagged :data:`INDUCING`). Only for a
    trace of the model alone: ``replay`` on a guide trace replaces the sites' tags."""
    return [name for name, site in trace.items() if inducing_tag(site) is not None]


def quadrature_tail(trace: dict) -> list[str]:
    """The sample sites after the last layer of a marginalized run (tagged :data:`QUADRATURE_AXIS`)."""
    return [name for name, site in trace.items() if site.get("type") == "sample" and get_tag(site, QUADRATURE_AXIS)]


def latent_specs(trace: dict) -> dict:
    """``{site name: LatentSpec}`` of the latent inputs of a model trace (from their
    :data:`LATENT_MESSAGE` sites)."""
    return {site["args"][0].name: site["args"][0] for site in trace.values() if site.get("type") == LATENT_MESSAGE}


def amortized_layer_names(trace: dict) -> list[str]:
    """The layers of a trace with per-point inducing sets (``inducing="amortized"``), read off
    their inducing sites' tags (a model's trace or an autoguide's prototype trace)."""
    tags = [inducing_tag(site) for site in trace.values()]
    return [tag.layer for tag in tags if tag is not None and tag.inducing == "amortized"]
