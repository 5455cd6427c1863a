"""The inducing-marginalization engine shared by the objectives and ``predict``.

:class:`marginalize_inducing` propagates each layer through its marginal
``q(f_l | f_{l-1}) = int p(f_l | f_{l-1}, u_l) q(u_l) du_l`` (DSVI) instead of through a sampled
``u_l``; for guides that correlate the layers (:class:`~numpyro_dgp.posteriors.ChainLink`,
:class:`~numpyro_dgp.posteriors.JointBlock`) it runs the exact per-point recursion (each
point's sampled outputs condition the belief over the later layers' inducing values); it
evaluates amortized encoders inside the model's run, branches layers at quadrature points,
integrates SDE-flow layers, and optionally puts Gauss-Hermite nodes of the last layer's
marginal on a leading axis (exact Gaussian expectations).

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
from numpyro.primitives import Messenger

from numpyro_dgp._engine.marginal_checks import (
    check_correlated_full_cov,
    check_importance_layer,
    check_marginalize_options,
)
from numpyro_dgp._protocol import (
    AMORTIZED_KL,
    BRANCHES,
    ENCODER_INPUT_MESSAGE,
    FLOW,
    IMPORTANCE_LOG_WEIGHTS,
    LATENT_MESSAGE,
    LAYER_MESSAGE,
    QUADRATURE_AXIS,
    encoder_input_layer,
    get_tag,
    layer_call,
    message_latent_spec,
    message_rng_key,
    wants_full_cov,
    with_tag,
)
from numpyro_dgp.core import (
    Belief,
    block_covariances,
    chain_transition,
    condition_on_output,
    joint_covariance,
    local_kl,
    output_at_nodes,
    output_moments,
    point_projection,
    sample_output,
    standard_normal,
)
from numpyro_dgp.handlers import FlowSpec
from numpyro_dgp.handlers._sde_flow import (
    integrate_flow,
)  # the handler's own integrator, run under marginalization
from numpyro_dgp.layers import Layer, layer_moments, sample_moments
from numpyro_dgp.posteriors import (
    AmortizedPosterior,
    ChainLink,
    JointBlock,
    LatentPosterior,
    unwrap_distribution,
)

__all__ = ["marginalize_inducing"]


def _marginal_moments(
    layer: Layer,
    X: jax.Array,
    u: jax.Array,
    post: Any,
    full_cov: bool,
    amortized_q: dict[str, tuple[jax.Array, jax.Array]],
) -> tuple[jax.Array, jax.Array]:
    """The layer's marginal ``(mean, var)``: under the amortized ``q(u_n | p_n)``, the guide's
    Gaussian, or ``p(f | u)`` with the ``u`` value at hand."""
    if layer.inducing == "amortized":
        if layer.u_site in amortized_q:
            mean, var = layer_moments(layer, X, *amortized_q[layer.u_site])
        else:
            mean, var = layer_moments(layer, X, u, None)
    elif post is not None:
        mean, var = layer_moments(layer, X, post[0], post[1], full_cov)
    else:
        mean, var = layer_moments(layer, X, u, None, full_cov)
    return mean, var


class marginalize_inducing(Messenger):
    """Propagate each layer through its marginal ``q(f_l | f_{l-1})`` instead of a sampled ``u_l``.

    :param fn: the model.
    :param posteriors: ``{u-site name: posterior}`` where a posterior is the guide's Gaussian
        over that layer's inducing values: ``(loc (P, M), scale (P, M, M) or (P, M))`` for
        independent layers (DSVI marginals, point by point), or a :class:`ChainLink` /
        :class:`JointBlock` for guides that correlate layers (the exact per-point recursion
        of :mod:`numpyro_dgp.core`'s chain functions: each point's outputs condition the
        belief over the inducing values of the layers still to come). Layers whose ``u`` site
        is not listed fall back to ``p(f | u)`` with the ``u`` value at hand.
    :param quadrature_layer: name of the layer whose output is replaced by quadrature nodes
        of its (Gaussian) marginal: value ``(K, N, P)``; every sample site after it is tagged
        ``infer[QUADRATURE_AXIS] = True`` so an objective can weight the leading axis with
        :attr:`quadrature_weights`.
    :param quadrature_nodes: ``(K, P)`` standard-normal nodes, or ``None`` for ``K`` Monte Carlo
        draws per point (``K`` the length of ``quadrature_weights``; drawn with the layer's key).
    :param quadrature_weights: ``(K,)`` weights summing to one.
    :param latent_mode: how latent inputs (:func:`~numpyro_dgp.latent_input`) are drawn:
        ``"posterior"`` (from the guide's ``q(w_n)`` in ``posteriors`` when it is there: one draw
        per point, its KL to the prior tagged :data:`AMORTIZED_KL`; or ``num_importance`` draws,
        their log weights tagged :data:`IMPORTANCE_LOG_WEIGHTS`) or ``"prior"`` (new points:
        ``N(0, I)``).
    :param num_importance: ``K`` draws of every latent input per point (a leading axis), or
        ``None`` for one.

    After a run, :attr:`moments` maps layer names to ``(mean (N, P), var (N, P))``,
    :attr:`layer_order` lists the layers in execution order, :attr:`last_output` is the
    quadrature layer's value (its nodes) and :attr:`correlated_outputs` says whether that
    layer's outputs are correlated at a point (a guide that correlates the layers).

    :raises ValueError: if ``quadrature_layer`` is given without nodes or weights.
    """

    def __init__(
        self,
        fn: Callable | None = None,
        posteriors: dict[str, Any] | None = None,
        quadrature_layer: str | None = None,
        quadrature_nodes: ArrayLike | None = None,
        quadrature_weights: ArrayLike | None = None,
        latent_mode: str = "posterior",
        num_importance: int | None = None,
    ) -> None:
        check_marginalize_options(quadrature_layer, quadrature_weights, latent_mode)
        posteriors = dict(posteriors or {})
        parents = {
            p.parent
            for p in posteriors.values()
            if isinstance(p, ChainLink) and p.parent is not None
        }
        # a chain factor with neither parent nor child is an independent Gaussian: DSVI path
        for name, post in list(posteriors.items()):
            if isinstance(post, ChainLink) and post.parent is None and name not in parents:
                posteriors[name] = (post.mean, post.scale_tril)
        self.posteriors = posteriors
        self._chain_parents = parents
        self.quadrature_layer = quadrature_layer
        self.quadrature_nodes = quadrature_nodes
        self.quadrature_weights = quadrature_weights
        self.latent_mode = latent_mode
        self.num_importance = num_importance
        self._reset()
        super().__init__(fn)

    def _reset(self) -> None:
        self.moments: dict[str, tuple[jax.Array, jax.Array]] = {}
        self.layer_order: list[str] = []
        self._in_tail = False
        # chain: u-site -> per-point belief over its values given its output
        self._beliefs: dict[str, Belief] = {}
        # joint group -> (next block index, per-point belief over the rest)
        self._joint_states: dict[tuple, tuple[int, Belief]] = {}
        # u-site -> (loc, scale) of q(u_n | p_n) at the model's p
        self._amortized_q: dict[str, tuple[jax.Array, jax.Array]] = {}
        self._encoder_inputs: dict[
            str, jax.Array
        ] = {}  # u-site -> the encoder input p of its amortized layer
        # latent-input site -> (LatentSpec, key) from its announcing message
        self._latents: dict[str, tuple[Any, jax.Array]] = {}
        # weighted mean of the last layer's branch means (AR2 / AR2P)
        self._branch_mean: jax.Array | None = None
        self.branch_log_weights: jax.Array | None = (
            None  # (S,) once a layer has branched the points
        )
        self.last_output: jax.Array | None = None  # the quadrature layer's value (its nodes)
        self.correlated_outputs = False

    def __enter__(self) -> marginalize_inducing:
        """Reset the per-run state and push the handler on the stack."""
        self._reset()
        super().__enter__()
        return self

    def process_message(self, msg: dict) -> None:
        """Record amortized ``q(u_n | p_n)``, tag the sites after the last layer, and give each
        layer message its value from the layer's marginal (or quadrature nodes, branches, a
        flow)."""
        if msg["type"] == "sample":
            self._sample_site(msg)
            return
        if msg["type"] == LATENT_MESSAGE:
            spec = message_latent_spec(msg)
            self._latents[spec.name] = (spec, message_rng_key(msg))
            return
        if msg["type"] == ENCODER_INPUT_MESSAGE:
            self._encoder_input(msg)
            return
        if msg["type"] != LAYER_MESSAGE:
            return
        self._layer_message(msg)

    def _sample_site(self, msg: dict) -> None:
        """A sample site: an amortized layer's ``u`` site, a latent input's site, or a site
        after the quadrature layer (tagged with :data:`QUADRATURE_AXIS`)."""
        # an amortized layer's u site follows its encoder-input message (found by name: the
        # guide's placeholder site of the same name replaces the site's infer tags)
        if msg["name"] in self._encoder_inputs and not msg["is_observed"]:
            self._amortized_site(msg, self._encoder_inputs[msg["name"]])
        if msg["name"] in self._latents and not msg["is_observed"]:
            self._latent_site(msg, *self._latents[msg["name"]])
        if self._in_tail:
            with_tag(msg, QUADRATURE_AXIS, True)

    def _encoder_input(self, msg: dict) -> None:
        """An encoder-input message: after a layer branched the points, an AR2 / AR2P encoder
        sees the weighted mean of the branch means."""
        layer_name = encoder_input_layer(msg)
        post = self.posteriors.get(f"{layer_name}.u")
        if (
            isinstance(post, AmortizedPosterior)
            and post.rule != "AR1"
            and self._branch_mean is not None
        ):
            msg["value"] = self._branch_mean

    def _layer_message(self, msg: dict) -> None:
        """A layer message: its value from the layer's marginal (or quadrature nodes, branches,
        a flow, the per-point recursion of a guide that correlates the layers)."""
        layer, X, u = layer_call(msg)
        full_cov = wants_full_cov(msg)
        rng_key = message_rng_key(msg)
        post = self.posteriors.get(layer.u_site)
        self.layer_order.append(layer.name)
        flow = get_tag(msg, FLOW)
        check_importance_layer(self.num_importance, layer, post, flow, msg)
        if flow is not None:
            msg["value"] = self._flow(layer, X, u, post, flow, rng_key)
            return
        if isinstance(post, (ChainLink, JointBlock)):
            check_correlated_full_cov(layer, full_cov)
            msg["value"] = self._correlated(layer, X, post, rng_key)
            return
        branch = (
            None if layer.name == self.quadrature_layer else self._branch_spec(layer, msg, post)
        )
        mean, var = _marginal_moments(layer, X, u, post, full_cov, self._amortized_q)
        self.moments[layer.name] = (mean, var)
        msg["value"] = self._marginal_value(layer, X, u, post, mean, var, branch, full_cov, rng_key)

    def _marginal_value(
        self,
        layer: Layer,
        X: jax.Array,
        u: jax.Array,
        post: Any,
        mean: jax.Array,
        var: jax.Array,
        branch: tuple | None,
        full_cov: bool,
        rng_key: jax.Array,
    ) -> jax.Array:
        """The layer's value from its marginal ``(mean, var)``: quadrature nodes (the
        quadrature layer, which also records :attr:`last_output` and enters the tail of the
        model), branches, ``K`` importance draws, or one sample."""
        if layer.name == self.quadrature_layer:
            if full_cov:
                raise ValueError("marginalize_inducing: quadrature needs full_cov=False")
            std = jnp.sqrt(jnp.maximum(var, 0.0))
            self.last_output = mean[None] + std[None] * self._nodes(mean, rng_key)
            self._in_tail = True
            return self.last_output
        if branch is not None:
            return self._branch(mean, var, branch, rng_key)
        if self.num_importance and X.ndim == 3 and not full_cov:
            return self._importance_draw(layer, X, u, post, rng_key)
        return sample_moments(rng_key, mean, var, full_cov, layer.jitter)

    def _nodes(self, mean: jax.Array, rng_key: jax.Array) -> jax.Array:
        """The standard-normal nodes for the quadrature layer, broadcastable against
        ``(K,) + mean.shape``: the shared rule's, or fresh draws per point (Monte Carlo)."""
        if self.quadrature_nodes is None:
            weights = self.quadrature_weights
            assert weights is not None  # a quadrature layer without weights is refused by __init__
            return standard_normal(rng_key, (jnp.shape(weights)[0],) + mean.shape, mean.dtype)
        nodes = jnp.asarray(self.quadrature_nodes, mean.dtype)  # (K, P)
        return nodes.reshape((nodes.shape[0],) + (1,) * (mean.ndim - 1) + nodes.shape[-1:])

    def postprocess_message(self, msg: dict) -> None:
        """Record the encoder input of an amortized layer (its message's final value)."""
        if msg["type"] == ENCODER_INPUT_MESSAGE:
            self._encoder_inputs[f"{msg['name'][: -len('.encoder_input')]}.u"] = msg["value"]

    # --- per-point inducing sets and branches (Meng & Zhang 2024) ---

    def _amortized_site(self, msg: dict, encoder_input: jax.Array) -> None:
        """The ``u`` site of a layer with per-point inducing sets: evaluate the guide's encoder
        at the model's encoder input and record ``q(u_n | p_n)`` and its per-point KL."""
        post = self.posteriors.get(msg["name"])
        if not isinstance(post, AmortizedPosterior):
            shape = msg["fn"].shape()
            if msg["value"] is not None and jnp.shape(msg["value"]) != shape:
                # the guide's placeholder, replayed into an abstract first pass that knows no
                # posteriors yet (marginal_trace's probe): any value of the right shape serves
                msg["value"] = jnp.zeros(shape, jnp.result_type(msg["value"]))
            return  # no amortized guide for this layer: the sampled value is used
        loc, scale = post.encode(encoder_input)
        base = unwrap_distribution(msg["fn"])
        prior_mean, prior_chol = base.loc, base.scale_tril[..., 0, :, :]
        batch = loc.shape[:-2]
        flat = lambda a, k: a.reshape((-1,) + a.shape[-k:])  # noqa: E731
        kl = local_kl(
            flat(loc - prior_mean, 2),
            flat(scale, scale.ndim - len(batch)),
            flat(jnp.broadcast_to(prior_chol, batch + prior_chol.shape[-2:]), 2),
        ).reshape(batch)
        self._amortized_q[msg["name"]] = (loc, scale)
        msg["value"] = loc  # never used as a draw: the layer marginalizes it
        with_tag(msg, AMORTIZED_KL, kl)

    def _latent_site(self, msg: dict, spec: Any, rng_key: jax.Array) -> None:
        """A latent input's site: draw ``w`` from the prior (new points), or from the guide's
        ``q(w_n)`` (once, its KL to the prior tagged; or ``num_importance`` times, the draws'
        log weights ``log p(w) - log q(w)`` tagged)."""
        K = self.num_importance
        shape = ((K,) if K else ()) + (spec.encoder_input.shape[0], spec.latent_dim)
        dtype = spec.encoder_input.dtype
        eps = standard_normal(rng_key, shape, dtype)
        if self.latent_mode == "prior":
            msg["value"] = eps
            return
        post = self.posteriors.get(msg["name"])
        if post is None:
            if K:
                raise ValueError(
                    f"ImportanceWeightedElbo: the guide gives no Gaussian q({msg['name']}) "
                    "to draw the "
                    "latent input from; use a numpyro_dgp.guides guide (or NumPyro's AutoNormal)"
                )
            return  # the guide's (or the prior's) draw is used
        loc, scale = post.encode(spec.encoder_input) if isinstance(post, LatentPosterior) else post
        loc, scale = jnp.asarray(loc, dtype), jnp.asarray(scale, dtype)
        w = loc + scale * eps
        if K:
            log_ratio = (
                -0.5 * w**2 + 0.5 * eps**2 + jnp.log(scale)
            )  # log N(w | 0, I) - log N(w | loc, scale)
            with_tag(msg, IMPORTANCE_LOG_WEIGHTS, jnp.sum(log_ratio, axis=-1))
        else:
            kl = -jnp.log(scale) + 0.5 * (scale**2 + loc**2 - 1.0)
            with_tag(msg, AMORTIZED_KL, jnp.sum(kl, axis=-1))
        msg["value"] = w

    def _importance_draw(
        self, layer: Layer, X: jax.Array, u: jax.Array, post: Any, rng_key: jax.Array
    ) -> jax.Array:
        """The layer's outputs at a point's ``K`` importance draws ``X (K, B, D)``, drawn jointly
        (their ``K x K`` covariance under the layer's marginal): the draws share the inducing
        values, as the importance-weighted bound needs."""
        q_mean, q_sqrt = post if post is not None else (u, None)

        def at_point(X_n, key):  # (K, D) -> (K, P)
            mean, cov = layer_moments(layer, X_n, q_mean, q_sqrt, full_cov=True)
            return sample_moments(key, mean, cov, True, layer.jitter)

        keys = jax.random.split(rng_key, X.shape[1])
        return jnp.swapaxes(jax.vmap(at_point, in_axes=(1, 0))(X, keys), 0, 1)

    def _branch_spec(
        self, layer: Layer, msg: dict, post: Any
    ) -> tuple[jax.Array | None, jax.Array] | None:
        """``(points (S, P) or None, log_weights (S,))`` if this layer branches its outputs:
        from an :class:`AmortizedPosterior`, or from a :class:`quadrature` handler's tag."""
        if isinstance(post, AmortizedPosterior):
            spec = (post.points, post.log_weights)
        else:
            spec = get_tag(msg, BRANCHES)
        if spec is None:
            if self.branch_log_weights is not None and layer_call(msg).inputs.ndim != 3:
                raise ValueError(
                    f"marginalize_inducing: layer {layer.name!r} runs on unbranched inputs after "
                    "another layer branched them"
                )
            return None
        if self.branch_log_weights is not None and spec[1].shape != self.branch_log_weights.shape:
            raise ValueError(
                f"marginalize_inducing: layer {layer.name!r} has {spec[1].shape[0]} branches, an "
                f"earlier layer {self.branch_log_weights.shape[0]}; every layer needs the same "
                "number"
            )
        return spec

    def _branch(
        self, mean: jax.Array, var: jax.Array, branch: tuple, rng_key: jax.Array
    ) -> jax.Array:
        """``S`` branches of the layer's outputs, ``(S, B, P)``: ``mean + point * std`` per
        branch (learned points or fresh standard-normal draws)."""
        points, log_weights = branch
        if self.branch_log_weights is None:
            self.branch_log_weights = log_weights
        S = log_weights.shape[0]
        shape = (S,) + mean.shape[-2:]
        if points is None:
            eps = standard_normal(rng_key, shape, mean.dtype)
        else:
            eps = jnp.broadcast_to(jnp.asarray(points, mean.dtype)[:, None, :], shape)
        std = jnp.sqrt(jnp.maximum(var, 0.0))
        if mean.ndim == 2:
            mean, std = mean[None], std[None]
        weights = jax.nn.softmax(log_weights).astype(mean.dtype)
        # AR2 / AR2P: the next layer's encoder sees the weighted mean of these branch means
        self._branch_mean = jnp.tensordot(weights, jnp.broadcast_to(mean, shape), axes=(0, 0))
        return mean + std * eps

    def _flow(
        self,
        layer: Layer,
        X: jax.Array,
        u: jax.Array,
        post: Any,
        flow: tuple[FlowSpec, dict],
        rng_key: jax.Array,
    ) -> jax.Array:
        """An :class:`sde_flow` layer: integrate with the guide's marginal moments (the
        ``"marginal"`` estimator) or with the sampled inducing values (``"ancestral"``)."""
        spec, box = flow
        if layer.name == self.quadrature_layer:
            raise ValueError(
                f"sde_flow: layer {layer.name!r} is the model's last gp_layer; a flow moves the "
                "inputs of a predictor layer, so a gp_layer must follow it"
            )
        if isinstance(post, (ChainLink, JointBlock)):
            raise NotImplementedError(
                f"sde_flow: layer {layer.name!r} has a guide that correlates layers; the flow "
                "supports guides with an independent Gaussian per layer "
                "(AutoFactorizedDGP, AutoNormal)"
            )
        if post is not None and spec.estimator == "marginal":
            q_mean, q_sqrt = post
        else:
            q_mean, q_sqrt = u, None
        value = integrate_flow(spec, box, layer, X, q_mean, q_sqrt, rng_key)
        # the end state is one path per sample, not a Gaussian: its own value, zero variance
        self.moments[layer.name] = (value, jnp.zeros_like(value))
        return value

    # --- guides that correlate layers: per-point beliefs over the inducing values ---

    def _belief(self, layer: Layer, post: ChainLink | JointBlock) -> Belief:
        """The belief over this layer's inducing values (first) and those of later layers in
        its joint group, given the outputs of the layers before."""
        name = layer.u_site
        if isinstance(post, ChainLink):
            if post.parent is None:
                # the first link's covariance is block-diagonal: kept as its blocks
                return Belief(post.mean.reshape(-1), block_covariances(post.scale_tril))
            if post.parent not in self._beliefs:
                raise ValueError(
                    f"marginalize_inducing: the guide chains {name!r} to {post.parent!r}, "
                    "but layer "
                    f"{post.parent!r} has not run before it at these points"
                )
            parent_mean, coupling = post.parent_mean, post.coupling
            assert (
                parent_mean is not None and coupling is not None
            )  # a chain factor with a parent has both
            return chain_transition(
                self._beliefs.pop(post.parent),
                parent_mean.reshape(-1),
                post.mean,
                coupling,
                post.scale_tril,
            )
        k = post.sites.index(name)
        if k == 0:
            return Belief(post.loc, joint_covariance(post.scale_tril))
        state = self._joint_states.get(post.sites)
        if state is None or state[0] != k:
            raise ValueError(
                f"marginalize_inducing: the guide's joint Gaussian orders the layers {post.sites}; "
                f"{name!r} ran out of that order"
            )
        return state[1]

    def _correlated(
        self, layer: Layer, X: jax.Array, post: ChainLink | JointBlock, rng_key: jax.Array
    ) -> jax.Array:
        N = X.shape[0]
        P, M = layer.out_dim, layer.inducing_inputs.shape[0]
        belief = self._belief(layer, post)
        if belief.loc.ndim == 2 and belief.loc.shape[0] != N:
            raise ValueError(
                f"marginalize_inducing: layer {layer.name!r} runs at {N} points but the layer "
                f"before it in the guide's chain ran at {belief.loc.shape[0]}; a correlated guide "
                "needs each "
                "point's chain of layer outputs"
            )
        Z = layer.inducing_inputs
        alpha, base_var = point_projection(
            layer.kernel(Z, X),
            layer.Kmm_chol,
            layer.kernel.diag(X),
            layer.whiten,
            layer.Kmm_chol_inv,
        )
        res_mean, out_cov, HB = output_moments(alpha, base_var, belief, P)
        # the belief is over the inducing values themselves; the conditional needs their
        # residual about the prior mean (zero except for inducing="locations")
        assert layer.prior_mean is not None  # gp_layer gives every layer its prior mean
        res_mean = res_mean - alpha @ layer.prior_mean.T
        mean = res_mean + layer.mean_fn(X)
        if layer.noise is not None:
            # the output is f + eps: eps adds to its variance, not to its covariance with u
            out_cov = out_cov + layer.noise * jnp.eye(P, dtype=out_cov.dtype)
        var = jnp.diagonal(out_cov, axis1=-2, axis2=-1)
        self.moments[layer.name] = (mean, var)
        if layer.name == self.quadrature_layer:
            self._in_tail = True
            self.correlated_outputs = P > 1
            shared = self.quadrature_nodes is not None
            nodes = (
                jnp.asarray(self.quadrature_nodes, mean.dtype)
                if shared
                else self._nodes(mean, rng_key)
            )
            self.last_output = output_at_nodes(mean, out_cov, nodes)
            return self.last_output
        eps = standard_normal(rng_key, mean.shape, mean.dtype)
        value = sample_output(mean, out_cov, eps)
        if isinstance(post, ChainLink):
            if layer.u_site in self._chain_parents:
                self._beliefs[layer.u_site] = condition_on_output(belief, HB, out_cov, value - mean)
        else:
            k = post.sites.index(layer.u_site)
            if k + 1 < len(post.sites):
                # this layer's block is used: keep the belief over the later blocks only
                given = condition_on_output(belief, HB, out_cov, value - mean)
                self._joint_states[post.sites] = (k + 1, given.tail(P * M))
        return value
