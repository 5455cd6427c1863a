"""DiffGP (Hegde et al. 2019): a GP layer as the drift and diffusion of an SDE flow of its inputs.

**References:**

* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian
  process flows. AISTATS.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, cast

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from numpyro_dgp._protocol import LAYER_MESSAGE, LAYER_RULE, layer_call, with_tag
from numpyro_dgp._validation import check_choice, check_positive_int
from numpyro_dgp.core import euler_maruyama
from numpyro_dgp.handlers._base import PerRunMessenger, check_layer_supported
from numpyro_dgp.layers import Layer, layer_moments
from numpyro_dgp.posteriors import ChainLink, JointBlock

#: The values of ``sde_flow(..., estimator=...)``.
FLOW_ESTIMATORS = ("marginal", "ancestral")


class FlowSpec(NamedTuple):
    """Settings of an :class:`sde_flow` layer (carried by its layer message's rule).

    :ivar layer: the flow layer's name.
    :ivar T: flow time.
    :ivar num_steps: Euler–Maruyama steps.
    :ivar estimator: ``"marginal"`` or ``"ancestral"``.
    :ivar diffusion: whether the diffusion term is on.
    :ivar time_input: whether the layer's last input column is time.
    :ivar record: whether the path is recorded.
    """

    layer: str
    T: float
    num_steps: int
    estimator: str = "marginal"
    diffusion: bool = True
    time_input: bool = False
    record: bool = False


class _FlowRule:
    """The :class:`~numpyro_dgp._protocol.LayerRule` of an :class:`sde_flow` layer: the flow
    computes the layer, and writes its recorded path into ``record`` (key ``"path"``)."""

    what = "an sde_flow layer"
    computes_layer = True
    mixture = None

    def __init__(self, spec: FlowSpec, record: dict) -> None:
        self.spec = spec
        self.record = record

    def __call__(
        self,
        layer: Layer,
        X: jax.Array,
        q_mean: ArrayLike,
        q_sqrt: ArrayLike | None = None,
        *,
        rng_key: jax.Array,
        **_: Any,
    ) -> jax.Array:
        """Euler–Maruyama flow of ``X``'s state columns with drift and diffusion the layer's mean
        and marginal variance under ``u ~ N(q_mean, q_sqrt q_sqrt^T)``; the path is recorded
        in ``record["path"]`` with ``spec.record``. As the layer message's ``fn`` (a plain run)
        it is the flow given the sampled ``u`` (``full_cov`` is moot: the flow moves each point
        on its own).

        :param layer: the flow layer.
        :param X: ``(N, D)`` start states, or ``(N, D + 1)`` with a time column
            (``spec.time_input``).
        :param q_mean: ``(P, M)`` inducing values or their means.
        :param q_sqrt: ``(P, M, M)`` or ``(P, M)``, or ``None`` (the flow given ``u = q_mean``).
        :param rng_key: PRNG key of the Brownian increments.
        :return: ``(N, D)`` end states ``x_T``.
        """
        spec = self.spec
        x0 = X[:, :-1] if spec.time_input else X

        def drift_diffusion(x, t):
            if spec.time_input:
                x = jnp.concatenate([x, jnp.full((x.shape[0], 1), t, x.dtype)], axis=-1)
            return layer_moments(layer, x, q_mean, q_sqrt, False)

        out = euler_maruyama(
            drift_diffusion,
            x0,
            spec.T,
            spec.num_steps,
            rng_key,
            diffusion=spec.diffusion,
            record=spec.record,
        )
        if spec.record:
            end, self.record["path"] = out
            return end
        return cast(jax.Array, out)  # record=False: euler_maruyama returns the end state alone

    def marginal_value(
        self, layer: Layer, X: jax.Array, u: jax.Array, post: Any, rng_key: jax.Array, last: bool
    ) -> jax.Array:
        """The layer's value under marginalized inducing values: the flow with the guide's
        marginal moments (the ``"marginal"`` estimator) or the sampled inducing values
        (``"ancestral"``, or no Gaussian guide over them).

        :raises ValueError: for the model's last layer.
        :raises NotImplementedError: for a guide that correlates the layers.
        """
        if last:
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
        q_mean, q_sqrt = (u, None) if post is None or self.spec.estimator != "marginal" else post
        return self(layer, X, q_mean, q_sqrt, rng_key=rng_key)


class sde_flow(PerRunMessenger):
    """DiffGP (Hegde et al. 2019): reinterpret a GP layer as the vector field of an SDE flow.

    The named layer ``f: R^D -> R^D`` (input width = output width; mean ``"zero"`` as in
    Hegde et al.) no longer returns ``f(X)``: its output is the end state ``x_T`` of

        ``dx_t = mu(x_t) dt + sqrt(Sigma(x_t)) dW_t``,  ``x_0 = X``,

    integrated by Euler–Maruyama in ``num_steps`` steps of ``dt = T / num_steps``, with fresh
    noise per step, point, dimension and sample. The rest of the model is unchanged: the
    layer after it (the predictor) takes ``x_T``. ``T = 0`` returns ``X`` (an SVGP on top).

    Drift and diffusion:

    * ``estimator="marginal"`` (Hegde et al.'s, default): ``mu``, ``Sigma`` are the layer's
      variational mean and marginal variance ``int p(f(x) | u) q(u) du``; function
      uncertainty is redrawn at every step and ``u`` is never sampled. This needs the guide's
      Gaussian over ``"<layer>.u"``, which :class:`numpyro_dgp.DGPElbo`, :func:`numpyro_dgp.predict`
      and :func:`numpyro_dgp.sde.flow_trajectories` supply (factorized guides:
      ``AutoFactorizedDGP``, ``AutoNormal``);
    * ``estimator="ancestral"``: ``u ~ q`` is sampled once per sample path, and ``mu``,
      ``Sigma`` are the conditional mean and variance given it (a different path law).
      Wherever the guide's Gaussian is not at hand (``Trace_ELBO``, ``Predictive``, MCMC over
      ``u``) the flow is driven by the sampled ``u`` this way.

    :param fn: the model.
    :param layer: name of the flow layer.
    :param T: flow time ``>= 0``.
    :param num_steps: Euler–Maruyama steps (Hegde et al.: 20).
    :param estimator: ``"marginal"`` or ``"ancestral"``.
    :param diffusion: ``False`` gives the ODE flow ``dx = mu dt``.
    :param time_input: time-dependent vector field (the "temporal DiffGP" of Hegde et al.): the
        layer's inputs carry one extra last column that the flow sets to the current time
        ``t_k``; build the layer on ``[X, 0]`` with a kernel over ``D + 1`` inputs (an ARD
        RBF over ``(x, t)`` is exactly the product ``k(x, x') k(t, t')``) and inducing inputs
        at a few times (:func:`numpyro_dgp.sde.temporal_inducing_inputs`).
    :param record: record the path ``(num_steps + 1, N, D)`` (see
        :func:`numpyro_dgp.sde.flow_trajectories`).
    :raises ValueError: for an invalid setting; during a run, if the named layer is not a
        valid flow layer; on exit, if the model ran no layer of that name.
    """

    def __init__(
        self,
        fn: Callable | None = None,
        layer: str | None = None,
        T: float = 1.0,
        num_steps: int = 20,
        estimator: str = "marginal",
        diffusion: bool = True,
        time_input: bool = False,
        record: bool = False,
    ) -> None:
        if not isinstance(layer, str) or not layer:
            raise ValueError(f"sde_flow: layer must be the name of a gp_layer, got {layer!r}")
        try:
            T_value = float(T)
        except (TypeError, ValueError):
            raise ValueError(f"sde_flow: T must be a number, got {T!r}") from None
        if not (T_value >= 0 and T_value < float("inf")):
            raise ValueError(f"sde_flow: T must be finite and >= 0, got {T!r}")
        check_positive_int(num_steps, "num_steps", "sde_flow")
        check_choice(estimator, FLOW_ESTIMATORS, "estimator", "sde_flow")
        self.spec = FlowSpec(
            layer, T_value, num_steps, estimator, bool(diffusion), bool(time_input), bool(record)
        )
        super().__init__(fn)

    def _reset(self) -> None:
        self.layers_seen: list[str] = []

    def process_message(self, msg: dict) -> None:
        """Tag the flow layer's message with the flow's rule and make its default handling the
        flow given the sampled ``u``."""
        if msg["type"] != LAYER_MESSAGE:
            return
        layer, X, _ = layer_call(msg)
        self.layers_seen.append(layer.name)
        if layer.name != self.spec.layer:
            return
        check_layer_supported(msg, "sde_flow")
        if layer.noise is not None:
            raise ValueError(
                f"sde_flow: layer {layer.name!r} has output noise (gp_layer(..., noise=...)); a "
                "flow layer's mean and variance are the drift and diffusion of the SDE, so it "
                "takes no noise"
            )
        if msg["value"] is not None:
            raise ValueError(
                f"sde_flow: layer {layer.name!r} was already handled by another handler; sde_flow "
                "must wrap the model itself (innermost), e.g. DGPElbo on sde_flow(model, ...)"
            )
        state_dim = X.shape[-1] - (1 if self.spec.time_input else 0)
        if layer.out_dim != state_dim:
            extra = " plus the time column" if self.spec.time_input else ""
            raise ValueError(
                f"sde_flow: layer {layer.name!r} maps {X.shape[-1]} inputs{extra} to "
                f"{layer.out_dim} outputs; a flow's vector field needs out_dim equal to the state "
                f"width {state_dim}"
            )
        # the recorded path lands in the rule's record, which the trace keeps in the site's
        # infer dict
        rule = _FlowRule(self.spec, {})
        with_tag(msg, LAYER_RULE, rule)
        msg["fn"] = rule

    def _problem_after_run(self) -> str | None:
        if self.spec.layer not in self.layers_seen:
            return (
                f"sde_flow: the model ran no gp_layer named {self.spec.layer!r} (its layers: "
                f"{self.layers_seen})"
            )
        return None
