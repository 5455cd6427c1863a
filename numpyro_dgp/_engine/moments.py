"""Gaussian moment propagation through a chain of ``gp_layer`` calls (psi statistics, no sampling).

:class:`propagate_moments` gives every layer's message a value computed from the Gaussian
its input carries: the first layer's inputs are fixed, and each later layer's input is the
previous layer's output, whose per-point mean and variance were recorded when it ran. Layer
``l``'s output moments under the guide's ``q(u_l)`` come from
:func:`~numpyro_dgp.core.uncertain_input_moments`. Two modes:

* ``"bound"`` -- nested variational compression (Hensman & Lawrence 2014): an inner layer
  forwards ``N(mean, inducing_var + noise)`` and records the penalty
  ``(input_var + conditional_var) / (2 noise)`` summed over points and outputs (with
  ``propagate_inducing_variance=False`` it forwards ``N(mean, noise)`` and adds
  ``inducing_var / (2 noise)`` to the penalty); the last
  layer's output becomes Gauss-Hermite nodes of ``N(mean, inducing_var + input_var +
  conditional_var)`` on a leading axis (exact for a Gaussian likelihood);
* ``"predict"`` -- exact moment matching per point and output: every layer forwards its total
  variance (noise included), and the last layer's output becomes quadrature nodes.

:func:`moment_trace` runs a guide and then the model under the handler (as
:func:`numpyro_dgp._engine.run.marginal_trace` does for the sampling engine).

**References:**

* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.handlers import trace

from numpyro_dgp._compat import innermost_guide, is_tracer
from numpyro_dgp._engine.observation import shared_rule
from numpyro_dgp._engine.run import (
    MarginalRun,
    guide_posteriors,
    guide_then_model,
    model_facts,
    validation_off_when_traced,
)
from numpyro_dgp._protocol import (
    LAYER_MESSAGE,
    LAYER_RULE,
    NODE_AXIS,
    abstract_read,
    get_tag,
    layer_call,
    with_tag,
)
from numpyro_dgp.core import uncertain_input_moments
from numpyro_dgp.guides import CorrelatedRecursion
from numpyro_dgp.handlers import PerRunMessenger
from numpyro_dgp.layers import Layer

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
        self.posteriors = posteriors
        self.mode = mode
        self.last_layer = last_layer
        self.nodes = nodes
        self.caller = caller
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
        if msg["type"] == "sample":
            if self._in_tail:
                with_tag(msg, NODE_AXIS, True)
            return
        if msg["type"] == LAYER_MESSAGE:
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
    """Run ``guide``, then ``model`` under :class:`propagate_moments`.

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
    :param propagate_inducing_variance: see :class:`propagate_moments`.
    :param kind: the observation's kind, which picks the rule over several outputs
        (:func:`~numpyro_dgp._engine.observation.shared_rule`).
    :return: :class:`~numpyro_dgp._engine.run.MarginalRun` with the inner layers' penalties
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
