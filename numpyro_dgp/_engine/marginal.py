"""The inducing-marginalization engine shared by the objectives and ``predict``.

:class:`marginalize_inducing` propagates each layer through its marginal
``q(f_l | f_{l-1}) = int p(f_l | f_{l-1}, u_l) q(u_l) du_l`` (DSVI) instead of through a sampled
``u_l`` (the base case: a layer's Gaussian marginals under a Gaussian ``q(u_l)``), and
optionally puts Gauss-Hermite nodes of the last layer's marginal on a leading axis (exact
Gaussian expectations). The features beyond the base case plug in through small interfaces
and live in the modules that own them:

* a handler's :class:`~numpyro_dgp._protocol.LayerRule` on a layer message (SDE flows,
  quadrature branches): a rule computes the layer (``marginal_value``) or makes its outputs a
  weighted mixture (``mixture``);
* guides that correlate the layers (:class:`~numpyro_dgp.posteriors.ChainLink`,
  :class:`~numpyro_dgp.posteriors.JointBlock`): the per-point recursion of
  :class:`~numpyro_dgp.guides._correlated.CorrelatedRecursion` (``output`` per layer, then
  ``condition`` on the drawn outputs);
* per-point inducing sets: :class:`~numpyro_dgp.guides._amortized.EncodedSets` evaluates
  the guide's encoder at a layer's ``u`` site (``site``: ``q(u_n | p_n)`` and its KL, kept in
  ``local_q`` for the layer) and gives an AR2 / AR2P encoder the weighted mean of the branches
  (``encoder_input``, ``branched``);
* latent inputs: the draw from the guide's ``q(w_n)`` (``latent_draw`` and ``latent_kl`` in
  :mod:`numpyro_dgp.guides._latent`);
* the importance-weighted bound: the ``importance`` plug-in
  (:class:`~numpyro_dgp.objectives._importance.ImportanceDraws`: ``num`` draws per point,
  their log weights, a layer's joint draws, its refusals);
* mixtures: the branches of a layer's outputs, asked of the guide's posterior (an encoder's
  ``mixture``) or of the layer's rule.

The guides' plug-ins come from :mod:`numpyro_dgp.guides` (exported beside its ``__all__``).

:func:`~numpyro_dgp._engine.run.marginal_trace` runs a guide and then the model under that
handler and returns both traces with what the objectives need.

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from numpyro_dgp._protocol import (
    ENCODER_INPUT_MESSAGE,
    IMPORTANCE_LOG_WEIGHTS,
    LATENT_MESSAGE,
    LAYER_MESSAGE,
    LAYER_RULE,
    LOCAL_KL,
    NODE_AXIS,
    get_tag,
    layer_call,
    message_latent_spec,
    message_rng_key,
    wants_full_cov,
    with_tag,
)
from numpyro_dgp.core import output_at_nodes, sample_output, standard_normal
from numpyro_dgp.guides import CorrelatedRecursion, EncodedSets, latent_draw, latent_kl
from numpyro_dgp.handlers import PerRunMessenger
from numpyro_dgp.layers import Layer, layer_moments, sample_moments


class marginalize_inducing(PerRunMessenger):
    """Propagate each layer through its marginal ``q(f_l | f_{l-1})`` instead of a sampled ``u_l``.

    :param fn: the model.
    :param posteriors: ``{u-site name: posterior}`` where a posterior is the guide's Gaussian
        over that layer's inducing values: ``(loc (P, M), scale (P, M, M) or (P, M))`` for
        independent layers (DSVI marginals, point by point), a ``ChainLink`` / ``JointBlock``
        for guides that correlate layers (:class:`CorrelatedRecursion`: each point's outputs
        condition the belief over the inducing values of the layers still to come), or an
        encoder of
        per-point inducing sets (anything with ``encode(encoder_input) -> (loc, scale)``, a
        ``mixture`` and ``sees_mixture_mean``, as
        :class:`~numpyro_dgp.posteriors.AmortizedPosterior`). Layers whose ``u`` site is not
        listed fall back to ``p(f | u)`` with the ``u`` value at hand.
    :param last_layer: name of the layer whose output is replaced by nodes of its (Gaussian)
        marginal: value ``(K, N, P)``; every sample site after it is tagged
        ``infer[NODE_AXIS] = True`` so an objective can weight the leading axis with
        ``node_weights``.
    :param nodes: ``(K, P)`` standard-normal nodes, or ``None`` for ``K`` Monte Carlo draws per
        point (``K`` the length of ``node_weights``; drawn with the layer's key).
    :param node_weights: ``(K,)`` weights summing to one (needed with ``last_layer``).
    :param latent_mode: how latent inputs (:func:`~numpyro_dgp.latent_input`) are drawn:
        ``"posterior"`` (from the guide's ``q(w_n)`` in ``posteriors`` when it is there: one draw
        per point, its KL to the prior tagged :data:`LOCAL_KL`; or ``importance.num`` draws,
        their log weights tagged :data:`IMPORTANCE_LOG_WEIGHTS`) or ``"prior"`` (new points:
        ``N(0, I)``).
    :param importance: the importance-weighted bound's plug-in (``num``: ``K`` draws of every
        latent input per point, a leading axis; ``latent_log_weights``, ``layer_value``,
        ``check_layer``, ``missing_latent``), or ``None`` for one draw.

    A layer whose message carries a :class:`~numpyro_dgp._protocol.LayerRule` is handled as
    the rule says: a rule that computes the layer gives its value (``marginal_value``), a
    rule with a ``mixture`` makes the layer's outputs a weighted mixture at its points.

    After a run, :attr:`moments` maps layer names to ``(mean (N, P), var (N, P))``,
    :attr:`layer_order` lists the layers in execution order, :attr:`last_output` is the
    last layer's value (its nodes), :attr:`mixture_log_weights` the ``(S,)`` log weights of
    the mixture a layer made (or ``None``) and :attr:`correlated_outputs` says whether the
    last layer's outputs are correlated at a point (a guide that correlates the layers).

    """

    def __init__(
        self,
        fn: Callable | None = None,
        posteriors: dict[str, Any] | None = None,
        last_layer: str | None = None,
        nodes: ArrayLike | None = None,
        node_weights: ArrayLike | None = None,
        latent_mode: str = "posterior",
        importance: Any = None,
    ) -> None:
        self.posteriors = CorrelatedRecursion.independent(posteriors or {})
        self.last_layer = last_layer
        self.nodes = nodes
        self.node_weights = node_weights
        self.latent_mode = latent_mode
        self.importance = importance
        super().__init__(fn)

    def _reset(self) -> None:
        self.moments: dict[str, tuple[jax.Array, jax.Array]] = {}
        self.layer_order: list[str] = []
        self._in_tail = False
        self._correlated = CorrelatedRecursion(self.posteriors)
        self._encoded = EncodedSets(self.posteriors)
        # latent-input site -> (LatentSpec, key) from its announcing message
        self._latents: dict[str, tuple[Any, jax.Array]] = {}
        self.mixture_log_weights: jax.Array | None = None
        self.last_output: jax.Array | None = None
        self.correlated_outputs = False

    def process_message(self, msg: dict) -> None:
        """Record per-point ``q(u_n | p_n)``, tag the sites after the last layer, and give each
        layer message its value from the layer's marginal (or nodes, a mixture, a rule)."""
        if msg["type"] == "sample":
            self._sample_site(msg)
        elif msg["type"] == LATENT_MESSAGE:
            spec = message_latent_spec(msg)
            self._latents[spec.name] = (spec, message_rng_key(msg))
        elif msg["type"] == ENCODER_INPUT_MESSAGE:
            self._encoded.encoder_input(msg)
        elif msg["type"] == LAYER_MESSAGE:
            self._layer_message(msg)

    def _sample_site(self, msg: dict) -> None:
        """A sample site: the ``u`` site of a layer with per-point inducing sets, a latent
        input's site, or a site after the last layer (tagged with :data:`NODE_AXIS`)."""
        self._encoded.site(msg)
        if msg["name"] in self._latents and not msg["is_observed"]:
            self._latent_site(msg, *self._latents[msg["name"]])
        if self._in_tail:
            with_tag(msg, NODE_AXIS, True)

    def _layer_message(self, msg: dict) -> None:
        """A layer message: its value from the layer's marginal (or nodes, a mixture, a rule
        that computes the layer, the per-point recursion of a guide that correlates the
        layers)."""
        layer, X, u = layer_call(msg)
        full_cov = wants_full_cov(msg)
        rng_key = message_rng_key(msg)
        post = self.posteriors.get(layer.u_site)
        self.layer_order.append(layer.name)
        rule = get_tag(msg, LAYER_RULE)
        last = layer.name == self.last_layer
        self._check_layer(layer, rule, post, full_cov)
        if rule is not None and rule.computes_layer:
            value = rule.marginal_value(layer, X, u, post, rng_key, last)
            # the end state is one path per sample, not a Gaussian: its own value, no variance
            self.moments[layer.name] = (value, jnp.zeros_like(value))
            msg["value"] = value
            return
        if CorrelatedRecursion.claims(post):
            msg["value"] = self._correlated_value(layer, X, post, rng_key)
            return
        if layer.inducing == "amortized":
            q_mean, q_sqrt = self._encoded.local_q.get(layer.u_site, (u, None))
            mean, var = layer_moments(layer, X, q_mean, q_sqrt)
        else:
            q_mean, q_sqrt = (u, None) if post is None else post
            mean, var = layer_moments(layer, X, q_mean, q_sqrt, full_cov)
        self.moments[layer.name] = (mean, var)
        if last:
            if full_cov:
                raise ValueError("marginalize_inducing: quadrature needs full_cov=False")
            std = jnp.sqrt(jnp.maximum(var, 0.0))
            self.last_output = mean[None] + std[None] * self._nodes(mean, rng_key)
            self._in_tail = True
            msg["value"] = self.last_output
            return
        mixture = self._mixture(layer, X, post, rule)
        if mixture is not None:
            msg["value"] = self._mix(mean, var, mixture, rng_key)
        elif self.importance is not None and X.ndim == 3 and not full_cov:
            # the importance plug-in refuses per-point inducing sets: q is the layer's own
            msg["value"] = self.importance.layer_value(layer, X, q_mean, q_sqrt, rng_key)
        else:
            msg["value"] = sample_moments(rng_key, mean, var, full_cov, layer.jitter)

    def _nodes(self, mean: jax.Array, rng_key: jax.Array) -> jax.Array:
        """The standard-normal nodes for the last layer, broadcastable against
        ``(K,) + mean.shape``: the shared rule's, or fresh draws per point (Monte Carlo)."""
        if self.nodes is None:
            assert self.node_weights is not None  # given with last_layer
            K = jnp.shape(self.node_weights)[0]
            return standard_normal(rng_key, (K,) + mean.shape, mean.dtype)
        nodes = jnp.asarray(self.nodes, mean.dtype)  # (K, P)
        return nodes.reshape((nodes.shape[0],) + (1,) * (mean.ndim - 1) + nodes.shape[-1:])

    def postprocess_message(self, msg: dict) -> None:
        """Record the encoder input of a layer with per-point inducing sets (its message's
        final value)."""
        if msg["type"] == ENCODER_INPUT_MESSAGE:
            self._encoded.record_input(msg)

    def _latent_site(self, msg: dict, spec: Any, rng_key: jax.Array) -> None:
        """A latent input's site: draw ``w`` from the prior (new points), or from the guide's
        ``q(w_n)`` (once, its KL to the prior tagged; or ``importance.num`` times, the draws'
        log weights ``log p(w) - log q(w)`` tagged)."""
        K = None if self.importance is None else self.importance.num
        shape = ((K,) if K else ()) + (spec.encoder_input.shape[0], spec.latent_dim)
        dtype = spec.encoder_input.dtype
        eps = standard_normal(rng_key, shape, dtype)
        if self.latent_mode == "prior":
            msg["value"] = eps
            return
        post = self.posteriors.get(msg["name"])
        if post is None:
            if self.importance is not None:
                self.importance.missing_latent(msg["name"])
            return  # the guide's (or the prior's) draw is used
        w, loc, scale = latent_draw(post, spec.encoder_input, eps)
        if self.importance is not None:
            with_tag(msg, IMPORTANCE_LOG_WEIGHTS, self.importance.latent_log_weights(w, eps, scale))
        else:
            with_tag(msg, LOCAL_KL, latent_kl(loc, scale))
        msg["value"] = w

    # --- mixtures: an encoder's branches (Meng & Zhang 2024) or a rule's ---

    def _mixture(self, layer: Layer, X: jax.Array, post: Any, rule: Any) -> tuple | None:
        """``(points (S, P) or None, log_weights (S,))`` if this layer's outputs become a
        weighted mixture: asked of the guide's encoder, else of the layer's rule."""
        mixture = getattr(post, "mixture", None) or getattr(rule, "mixture", None)
        earlier = self.mixture_log_weights
        if mixture is None:
            if earlier is not None and X.ndim != 3:
                raise ValueError(
                    f"marginalize_inducing: layer {layer.name!r} runs on unbranched inputs after "
                    "another layer branched them"
                )
            return None
        if earlier is not None and mixture[1].shape != earlier.shape:
            raise ValueError(
                f"marginalize_inducing: layer {layer.name!r} has {mixture[1].shape[0]} branches, "
                f"an earlier layer {earlier.shape[0]}; every layer needs the same number"
            )
        return mixture

    def _mix(
        self, mean: jax.Array, var: jax.Array, mixture: tuple, rng_key: jax.Array
    ) -> jax.Array:
        """The ``S`` components of the layer's outputs, ``(S, B, P)``: ``mean + point * std`` per
        component (learned points or fresh standard-normal draws)."""
        points, log_weights = mixture
        if self.mixture_log_weights is None:
            self.mixture_log_weights = log_weights
        S = log_weights.shape[0]
        shape = (S,) + mean.shape[-2:]
        if points is None:
            eps = standard_normal(rng_key, shape, mean.dtype)
        else:
            eps = jnp.broadcast_to(jnp.asarray(points, mean.dtype)[:, None, :], shape)
        std = jnp.sqrt(jnp.maximum(var, 0.0))
        if mean.ndim == 2:
            mean, std = mean[None], std[None]
        # AR2 / AR2P: the next layer's encoder sees the weighted mean of these component means
        self._encoded.branched(log_weights, mean, shape)
        return mean + std * eps

    def _correlated_value(
        self, layer: Layer, X: jax.Array, post: Any, rng_key: jax.Array
    ) -> jax.Array:
        """A layer under a guide that correlates the layers: its outputs drawn from their
        Gaussian given each point's earlier outputs (:class:`CorrelatedRecursion`), or the last
        layer's nodes."""
        mean, out_cov = self._correlated.output(layer, X, post)
        var = jnp.diagonal(out_cov, axis1=-2, axis2=-1)
        self.moments[layer.name] = (mean, var)
        if layer.name == self.last_layer:
            self._in_tail = True
            self.correlated_outputs = layer.out_dim > 1
            if self.nodes is None:
                nodes = self._nodes(mean, rng_key)
            else:
                nodes = jnp.asarray(self.nodes, mean.dtype)
            self.last_output = output_at_nodes(mean, out_cov, nodes)
            return self.last_output
        eps = standard_normal(rng_key, mean.shape, mean.dtype)
        value = sample_output(mean, out_cov, eps)
        self._correlated.condition(layer, post, value)
        return value

    def _check_layer(self, layer: Layer, rule: Any, post: Any, full_cov: bool) -> None:
        """Refuse what the importance plug-in refuses (a layer with a rule, a guide that
        correlates the layers), and ``full_cov`` for a layer of a guide that correlates them.

        :raises NotImplementedError: for the second.
        """
        correlated = CorrelatedRecursion.claims(post)
        if self.importance is not None:
            self.importance.check_layer(layer, rule, correlated)
        if correlated and full_cov and not (rule is not None and rule.computes_layer):
            raise NotImplementedError(
                f"marginalize_inducing: layer {layer.name!r} has a guide that correlates "
                "layers; its marginals are per point (full_cov=False). For coherent "
                "function samples use numpyro_dgp.sample_layers, which samples the inducing "
                "values."
            )
