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
* the attribute :data:`MODEL_CONFIG` (``"dgp_config"``) of a model built by a factory of
  :mod:`numpyro_dgp.models`: ``{"factory", "arguments"}``;
* ``infer`` keys: :data:`INDUCING` on a layer's ``"<layer>.u"`` sample site
  (:class:`InducingTag`), :data:`GAUSSIAN` and :data:`CONDITIONAL` on a guide's inducing
  sites (the Gaussian structure it declares, see :mod:`numpyro_dgp.posteriors`),
  :data:`LAYER_RULE` on layer messages (a :class:`LayerRule` set by a handler such as
  ``sde_flow`` or ``quadrature``), :data:`NODE_AXIS`, :data:`LOCAL_KL` and
  :data:`IMPORTANCE_LOG_WEIGHTS` on sample sites (set by the inducing-marginalization engine).

The messages are sent (:func:`send_layer`, :func:`send_encoder_input`, :func:`send_latent`) and
read (:func:`layer_call`, :func:`message_rng_key`, ...) only through the functions below, so
that the layout of a message (its ``args`` and ``kwargs``) is written down in this module alone.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

import jax
from numpyro import handlers

from numpyro_dgp._compat import apply_stack

#: Message type sent by every ``gp_layer`` call (value: the layer's output).
LAYER_MESSAGE = "dgp_layer"
#: Message type giving an amortized layer's encoder input.
ENCODER_INPUT_MESSAGE = "dgp_encoder_input"
#: Message type announcing a latent input (``latent_input``): its spec and key.
LATENT_MESSAGE = "dgp_latent"

#: Attribute of a model built by a factory of :mod:`numpyro_dgp.models`:
#: ``{"factory", "arguments"}``.
MODEL_CONFIG = "dgp_config"

#: On a ``"<layer>.u"`` sample site: :class:`InducingTag`.
INDUCING = "dgp_inducing"
#: On a guide's inducing site: the structure the guide declares over several sites
#: (:class:`~numpyro_dgp.posteriors.ChainLink` or :class:`~numpyro_dgp.posteriors.JointBlock`).
GAUSSIAN = "dgp_gaussian"
#: On a guide's inducing site: its Gaussian given the guide's earlier samples
#: (``(loc, scale)`` or a one-site :class:`~numpyro_dgp.posteriors.JointBlock`).
CONDITIONAL = "dgp_conditional"
#: On a layer message: the :class:`LayerRule` a handler gave the layer.
LAYER_RULE = "dgp_layer_rule"
#: On a sample site after the last layer: its value has the last layer's node axis.
NODE_AXIS = "dgp_quadrature"
#: On a local site (a per-point ``"<layer>.u"``, a latent input): the per-point KL of its
#: ``q(. | p_n)`` against its prior, taken in closed form by the objectives.
LOCAL_KL = "dgp_amortized_kl"
#: On a latent input drawn ``K`` times per point: ``(K, B)`` ``log p(w) - log q(w)`` of the draws.
IMPORTANCE_LOG_WEIGHTS = "dgp_importance"


class InducingTag(NamedTuple):
    """What a ``"<layer>.u"`` sample site is (``infer[INDUCING]``).

    :ivar layer: the layer's name.
    :ivar whiten: whether the site is whitened (prior ``N(0, I)``).
    :ivar inducing: ``"global"``, ``"locations"`` or ``"amortized"``.
    :ivar encoder_input: ``(..., B, D)`` what the encoder of an amortized layer sees (else
        ``None``).
    """

    layer: str
    whiten: bool
    inducing: str
    encoder_input: jax.Array | None = None


class LayerRule(Protocol):
    """What a handler's rule for one layer (``infer[LAYER_RULE]`` of its layer message) tells
    the engine and the other handlers, so that none of them needs to know the handler.

    :ivar what: the rule in words, for refusals (``"an sde_flow layer"``).
    :ivar computes_layer: whether the rule replaces the layer's own computation (a handler
        that computes the layer itself must refuse it).
    :ivar mixture: ``(points (S, P) or None, log_weights (S,))`` where the layer's outputs
        branch into a weighted mixture (the engine draws them), else ``None``.

    A rule that computes the layer has ``marginal_value(layer, X, u, posterior, rng_key,
    last)``: the layer's value where the engine marginalizes the inducing values
    (``posterior``: the guide's Gaussian over them, or ``None``; ``last``: whether the layer
    is the model's last).
    """

    what: str
    computes_layer: bool
    mixture: tuple | None


class LayerCall(NamedTuple):
    """What a :data:`LAYER_MESSAGE` carries (its ``args``).

    :ivar layer: the :class:`~numpyro_dgp.layers.Layer`.
    :ivar inputs: ``(..., B, D)`` the layer's inputs.
    :ivar inducing: the layer's inducing values ``u`` (its ``"<layer>.u"`` sample).
    """

    layer: Any
    inputs: jax.Array
    inducing: jax.Array


def _send(msg_type: str, name: str, fn: Callable, args: tuple, **kwargs: Any) -> Any:
    """Send a non-sample message through the handler stack; handlers may set its value, else
    ``fn(*args, **kwargs)`` gives it."""
    msg = {
        "type": msg_type,
        "name": name,
        "fn": fn,
        "args": args,
        "kwargs": kwargs,
        "value": None,
        "scale": None,
        "is_observed": False,
        "intermediates": [],
        "cond_indep_stack": [],
        "infer": {},
    }
    return apply_stack(msg)["value"]


def send_layer(call: LayerCall, rng_key: jax.Array, propagate: Callable) -> Any:
    """Send a layer's :data:`LAYER_MESSAGE`; its value (default ``propagate(*call, rng_key=,
    full_cov=False)``) is the layer's output."""
    return _send(
        LAYER_MESSAGE,
        f"{call.layer.name}.layer",
        propagate,
        tuple(call),
        rng_key=rng_key,
        full_cov=False,
    )


def send_encoder_input(layer_name: str, inputs: jax.Array, default: Callable) -> Any:
    """Send an amortized layer's :data:`ENCODER_INPUT_MESSAGE`; its value (default
    ``default(inputs)``) is what the layer's encoder sees."""
    return _send(ENCODER_INPUT_MESSAGE, f"{layer_name}.encoder_input", default, (inputs,))


def encoder_input_layer(msg: dict) -> str:
    """The name of the layer an :data:`ENCODER_INPUT_MESSAGE` belongs to."""
    return msg["name"][: -len(".encoder_input")]


def send_latent(spec: Any, rng_key: jax.Array) -> None:
    """Announce a latent input (:data:`LATENT_MESSAGE`, ``spec`` a ``LatentSpec``) before its
    sample site."""
    _send(LATENT_MESSAGE, f"{spec.name}.latent", _spec_itself, (spec,), rng_key=rng_key)


def _spec_itself(spec: Any, rng_key: jax.Array) -> Any:
    return spec


def layer_call(msg: dict) -> LayerCall:
    """The layer, inputs and inducing values of a :data:`LAYER_MESSAGE`."""
    return LayerCall(*msg["args"])


def replace_layer_inputs(msg: dict, inputs: jax.Array) -> None:
    """Evaluate a :data:`LAYER_MESSAGE`'s layer at ``inputs`` instead."""
    msg["args"] = tuple(layer_call(msg)._replace(inputs=inputs))


def message_rng_key(msg: dict) -> jax.Array:
    """The random key a :data:`LAYER_MESSAGE` or :data:`LATENT_MESSAGE` was sent with."""
    return msg["kwargs"]["rng_key"]


def wants_full_cov(msg: dict) -> bool:
    """Whether a :data:`LAYER_MESSAGE` asks for a joint draw over its inputs."""
    return bool(msg["kwargs"].get("full_cov", False))


def request_full_cov(msg: dict) -> None:
    """Ask a :data:`LAYER_MESSAGE` for a joint draw over its inputs."""
    msg["kwargs"] = {**msg["kwargs"], "full_cov": True}


def message_latent_spec(msg: dict) -> Any:
    """The ``LatentSpec`` a :data:`LATENT_MESSAGE` (message or trace site) carries."""
    return msg["args"][0]


def attach_model_config[F: Callable](model: F, factory: str, arguments: dict) -> F:
    """Record on ``model`` the factory of :mod:`numpyro_dgp.models` that built it and its
    arguments (attribute :data:`MODEL_CONFIG`), so that :func:`numpyro_dgp.save_model` can
    write it and :func:`numpyro_dgp.load_model` rebuild it; returns ``model``."""
    setattr(model, MODEL_CONFIG, {"factory": factory, "arguments": dict(arguments)})
    return model


def model_config(model: Any) -> dict | None:
    """``{"factory", "arguments"}`` of a model built by a factory of :mod:`numpyro_dgp.models`,
    ``None`` for any other model."""
    return getattr(model, MODEL_CONFIG, None)


def abstract_read(model: Callable, args: tuple, kwargs: dict, read: Callable) -> Any:
    """``read(trace)`` of one abstract run of ``model`` (``jax.eval_shape``: it computes
    nothing, so it adds nothing to the compiled computation). Closing over ``args`` keeps
    static ones (subsample sizes) concrete."""
    found = []

    def probe():
        found.append(read(handlers.trace(model).get_trace(*args, **kwargs)))
        return 0

    jax.eval_shape(probe)
    return found[0]


def get_tag(site: dict, key: str, default: Any = None) -> Any:
    """``site["infer"][key]``, or ``default`` where the site has no such tag."""
    return (site.get("infer") or {}).get(key, default)


def with_tag(msg: dict, key: str, value: Any) -> None:
    """Tag ``msg`` (a copy of its ``infer`` dict, so shared dicts are never mutated)."""
    msg["infer"] = {**(msg.get("infer") or {}), key: value}


def inducing_tag(site: dict) -> InducingTag | None:
    """The :class:`InducingTag` of a layer's inducing site, ``None`` for any other site."""
    return get_tag(site, INDUCING) if site.get("type") == "sample" else None


def message_layer(msg: dict) -> Any:
    """The :class:`~numpyro_dgp.layers.Layer` a :data:`LAYER_MESSAGE` carries (its first
    argument)."""
    return layer_call(msg).layer


def trace_layers(trace: dict) -> list:
    """The layers of a model trace, in execution order (from their :data:`LAYER_MESSAGE` sites)."""
    return [message_layer(site) for site in trace.values() if site.get("type") == LAYER_MESSAGE]


def trace_layer_names(trace: dict) -> list[str]:
    """The names of the layers of a model trace, in execution order."""
    return [layer.name for layer in trace_layers(trace)]


def inducing_site_names(trace: dict) -> list[str]:
    """The ``"<layer>.u"`` sample sites of a model trace (tagged :data:`INDUCING`). Only for a
    trace of the model alone: ``replay`` on a guide trace replaces the sites' tags."""
    return [name for name, site in trace.items() if inducing_tag(site) is not None]


def node_tail(trace: dict) -> list[str]:
    """The sample sites after the last layer of a marginalized run (tagged :data:`NODE_AXIS`)."""
    return [
        name
        for name, site in trace.items()
        if site.get("type") == "sample" and get_tag(site, NODE_AXIS)
    ]


def latent_specs(trace: dict) -> dict:
    """``{site name: LatentSpec}`` of the latent inputs of a model trace (from their
    :data:`LATENT_MESSAGE` sites)."""
    specs = [
        message_latent_spec(site) for site in trace.values() if site.get("type") == LATENT_MESSAGE
    ]
    return {spec.name: spec for spec in specs}


def amortized_layer_names(trace: dict) -> list[str]:
    """The layers of a trace with per-point inducing sets (``inducing="amortized"``), read off
    their inducing sites' tags (a model's trace or an autoguide's prototype trace)."""
    tags = [inducing_tag(site) for site in trace.values()]
    return [tag.layer for tag in tags if tag is not None and tag.inducing == "amortized"]
