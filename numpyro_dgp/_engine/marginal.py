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
  ``draw`` its outputs);
* per-point inducing sets: :class:`~numpyro_dgp.guides._amortized.EncodedSets` evaluates
  the guide's encoder at a layer's ``u`` site (``site``: ``q(u_n | p_n)`` and its KL, kept in
  ``local_q`` for the layer) and gives an AR2 / AR2P encoder the weighted mean of the branches
  (``encoder_input``, ``branched``);
* latent inputs: the draw from the guide's ``q(w_n)`` (``latent_draw`` and ``latent_kl`` in
  :mod:`numpyro_dgp.guides._base`);
* the importance-weighted bound: the ``importance`` plug-in
  (:class:`~numpyro_dgp.objectives._importance.ImportanceDraws`: ``num`` draws per point,
  their log weights, a layer's joint draws, its refusals);
* mixtures: the branches of a layer's outputs, asked of the guide's posterior (an encoder's
  ``mixture``) or of the layer's rule.

The guides' plug-ins come from :mod:`numpyro_dgp.guides` (exported beside its ``__all__``).

:class:`propagate_moments` integrates the inducing values out without sampling: it gives every
layer's message a value computed from the Gaussian its input carries (the first layer's inputs
are fixed; each later layer's input is the previous layer's output, whose per-point mean and
variance were recorded when it ran). Layer ``l``'s output moments under the guide's ``q(u_l)``
come from :func:`~numpyro_dgp.core.uncertain_input_moments`. Two modes:

* ``"bound"`` -- nested variational compression (Hensman & Lawrence 2014): an inner layer
  forwards ``N(mean, inducing_var + noise)`` and records the penalty
  ``(input_var + conditional_var) / (2 noise)`` summed over points and outputs (with
  ``propagate_inducing_variance=False`` it forwards ``N(mean, noise)`` and adds
  ``inducing_var / (2 noise)`` to the penalty); the last
  layer's output becomes Gauss-Hermite nodes of ``N(mean, inducing_var + input_var +
  conditional_var)`` on a leading axis (exact for a Gaussian likelihood);
* ``"predict"`` -- exact moment matching per point and output: every layer forwards its total
  variance (noise included), and the last layer's output becomes quadrature nodes.

:func:`~numpyro_dgp._engine.run.marginal_trace` and :func:`~numpyro_dgp._engine.run.moment_trace`
run a guide and then the model under these handlers and return both traces with what the
objectives need.

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from numpyro_dgp._compat import is_tracer
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
from numpyro_dgp.core import (
    output_at_nodes,
    standard_normal,
    uncertain_input_moments,
)
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
        condition its belief over the guide's draws of the layers still to come), or an
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
        self.last_layer, self.nodes, self.node_weights = last_layer, nodes, node_weights
        self.latent_mode, self.importance = latent_mode, importance
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
        return self._correlated.draw(layer, post, standard_normal(rng_key, mean.shape, mean.dtype))

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


_INSTEAD = "use DGPElbo (sampling propagation), which supports it"


class propagate_moments(PerRunMessenger):
    """Give each layer message its value from Gaussian moment propagation (see the module
    docstring).

    :param fn: the model.
    :param posteriors: ``{u-site name: (loc (P, M), scale (P, M, M) or (P, M))}``, the guide's
        independent Gaussian over each layer's inducing values.
    :param mode: ``"bound"`` or ``"predict"``.
    :param last_layer: name of the model's last ``gp_layer``.
    :param nodes: ``(K, P)`` standard-normal nodes for the last layer.
    :param caller: the name errors are reported under (``"<objective> with <guide>"``).
    :param propagate_inducing_variance: ``"bound"`` mode: forward each inner layer's inducing
        variance to the next layer (``True``) or pay for it in the penalty (``False``).

    After a run, :attr:`moments` maps layer names to the ``(mean (N, P), var (N, P))`` each
    forwarded (the last layer's: the variance its nodes spread), :attr:`penalties` lists the
    inner layers' penalties (``"bound"`` mode; unscaled by plates) and :attr:`layer_order`
    the layers in execution order.
    """

    def __init__(
        self,
        fn: Callable,
        posteriors: dict[str, Any],
        mode: str,
        last_layer: str,
        nodes: np.ndarray,
        caller: str,
        propagate_inducing_variance: bool,
    ) -> None:
        self.posteriors, self.mode, self.last_layer = posteriors, mode, last_layer
        self.nodes, self.caller = nodes, caller
        self.propagate_inducing_variance = propagate_inducing_variance
        super().__init__(fn)

    def _reset(self) -> None:
        self.moments: dict[str, tuple[jax.Array, jax.Array]] = {}
        self.penalties: list[jax.Array] = []
        self.layer_order: list[str] = []
        self._in_tail = False
        self._last_output: jax.Array | None = None

    def process_message(self, msg: dict) -> None:
        """Tag the sample sites after the last layer; give each layer message its value."""
        if msg["type"] == "sample" and self._in_tail:
            with_tag(msg, NODE_AXIS, True)
        elif msg["type"] == LAYER_MESSAGE:
            msg["value"] = self._layer(msg)

    def _refuse(self, layer: Layer, problem: str, instead: str = _INSTEAD) -> NoReturn:
        raise NotImplementedError(f"{self.caller}: layer {layer.name!r} {problem}; {instead}")

    def _input_moments(self, layer: Layer, X: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """``(mean, var)`` of the layer's input: fixed for the first layer (``var=None``), the
        recorded moments of the previous layer's output for the others."""
        if not self.layer_order[:-1]:
            return X, None
        last_output = self._last_output
        assert last_output is not None  # set by the layer before, which was not the last one
        if X is not last_output and not _same_values(X, last_output):
            self._refuse(
                layer,
                "does not take the previous layer's output as it was returned (moment propagation "
                "follows a chain of layers, each fed the previous layer's output unchanged)",
                "feed each gp_layer the previous one's output, or use DGPElbo",
            )
        return self.moments[self.layer_order[-2]]

    def _layer(self, msg: dict) -> jax.Array:
        """The layer message's value: the layer's output moments at its input's Gaussian, as
        the next layer's input or (the last layer) as quadrature nodes."""
        layer, X, _ = layer_call(msg)
        self.layer_order.append(layer.name)
        post = self.posteriors.get(layer.u_site)
        self._check_layer(msg, layer, X, post)
        if post is None:
            self._refuse(
                layer,
                f"has no per-layer Gaussian guide over {layer.u_site!r} (a Delta, a flow, one of "
                "NumPyro's latent-vector autoguides such as AutoDiagonalNormal, or no site); "
                "moment propagation needs an independent Gaussian per layer "
                "(AutoFactorizedDGP, AutoNormal)",
                "use DGPElbo or Trace_ELBO with this guide",
            )
        mean_in, var_in = self._input_moments(layer, X)
        last = layer.name == self.last_layer
        if var_in is not None and layer.mean_affine is None:
            self._refuse(
                layer,
                "has a callable mean function, whose expectation under a Gaussian input is unknown",
                "use mean='zero', 'identity' or 'linear', or DGPElbo",
            )
        weight, bias = layer.mean_affine if var_in is not None else (None, None)
        per_point = last or self.mode == "predict"
        parts = uncertain_input_moments(
            layer.kernel,
            layer.inducing_inputs,
            layer.Kmm_chol,
            post[0],
            post[1],
            mean_in,
            var_in,
            whiten=layer.whiten,
            mean_weight=weight,
            mean_bias=bias,
            per_point=per_point,
            per_point_inducing=per_point or self.propagate_inducing_variance,
            Kmm_chol_inv=layer.Kmm_chol_inv,
        )
        mean = parts.mean if var_in is not None else parts.mean + layer.mean_fn(X)
        var = self._forwarded_variance(layer, parts, last)
        self.moments[layer.name] = (mean, var)
        if last:
            nodes = jnp.asarray(self.nodes, mean.dtype)
            self._in_tail = True
            return mean[None] + jnp.sqrt(jnp.maximum(var, 0.0))[None] * nodes[:, None, :]
        self._last_output = mean + 0.0  # a new array: its identity marks the next layer's input
        return self._last_output

    def _check_layer(self, msg: dict, layer: Layer, X: jax.Array, post: Any) -> None:
        """Refuse a layer that moment propagation cannot take: per-point inducing sets, a flow
        or branches, branched inputs, or a guide that correlates its inducing values (``post``)
        with another layer's."""
        if layer.inducing != "global":
            self._refuse(
                layer,
                f"has inducing={layer.inducing!r}; only global inducing points propagate "
                "Gaussian moments",
            )
        if get_tag(msg, LAYER_RULE) is not None:
            self._refuse(layer, "is an sde_flow layer or branches at quadrature points")
        if X.ndim != 2:
            self._refuse(layer, f"takes branched inputs of shape {X.shape}")
        if CorrelatedRecursion.claims(post):
            self._refuse(
                layer,
                "has a guide that correlates layers; moment propagation needs an independent "
                "Gaussian per layer (AutoFactorizedDGP, AutoNormal)",
                "use DGPElbo with this guide",
            )

    def _forwarded_variance(self, layer: Layer, parts: Any, last: bool) -> jax.Array:
        """The variance the layer forwards (``parts``: its
        :class:`~numpyro_dgp.core.UncertainInputMoments`). In ``"bound"`` mode an inner layer
        appends its penalty to :attr:`penalties`, and a last layer with noise or an inner layer
        without it is refused (``NotImplementedError``)."""
        noise = layer.noise
        if self.mode == "bound":
            if last and noise is not None:
                self._refuse(
                    layer,
                    "is the last layer and has output noise; the Gaussian likelihood's noise plays "
                    "that part in nested variational compression",
                    "remove noise= from the last gp_layer",
                )
            if not last and noise is None:
                self._refuse(
                    layer,
                    "has no output noise; nested variational compression bounds every inner layer "
                    "with its noise precision",
                    "give it gp_layer(..., noise=...) (e.g. 1e-3), or use DGPElbo",
                )
            if not last:
                assert noise is not None  # an inner layer without noise is refused above
                spread = jnp.sum(parts.input_var) + layer.out_dim * parts.conditional_var
                if self.propagate_inducing_variance:
                    var = parts.inducing_var + noise
                else:
                    # every point and output forwards the same variance: the next layer's psi
                    # statistics are matrix products (numpyro_dgp.core.psi2)
                    spread = spread + jnp.sum(parts.inducing_var)
                    var = noise
                self.penalties.append(spread / (2.0 * noise))
                return var
        var = parts.inducing_var + parts.input_var + parts.conditional_var[:, None]
        # the last layer of a "bound" run has no noise (refused above)
        return var if noise is None else var + noise


def _same_values(X: jax.Array, output: jax.Array) -> bool:
    """Whether ``X`` holds the previous layer's output: in eager runs an array can come back as
    a copy (e.g. resharded by :class:`~numpyro_dgp.handlers.data_parallel`), so concrete values
    are compared; traced ones must be the same object (checked by the caller)."""
    if is_tracer(X) or is_tracer(output) or X.shape != output.shape:
        return False
    return bool(jnp.array_equal(X, output))
