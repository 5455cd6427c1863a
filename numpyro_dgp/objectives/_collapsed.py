"""One sparse GP layer with a Gaussian likelihood and ``q(u)`` integrated out: VFE and FITC.

**References:**

* Titsias (2009). Variational learning of inducing variables in sparse Gaussian processes.
  AISTATS.
* Snelson, Ghahramani (2006). Sparse Gaussian processes using pseudo-inputs. NIPS.
* Quiñonero-Candela, Rasmussen (2005). A unifying view of sparse approximate Gaussian process
  regression. JMLR.
* Bauer, van der Wilk, Rasmussen (2016). Understanding probabilistic sparse Gaussian process
  approximations. NeurIPS.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
from numpyro.handlers import trace

from numpyro_dgp._engine.run import guide_then_model
from numpyro_dgp._engine.traces import layers_by_u_site
from numpyro_dgp._protocol import LAYER_MESSAGE, LAYER_RULE, get_tag, layer_call
from numpyro_dgp._validation import check_choice
from numpyro_dgp.core import COLLAPSED_METHODS, collapsed_log_marginal
from numpyro_dgp.handlers import (
    PerRunMessenger,
    SpreadTotal,
    check_layer_supported,
    gaussian_observation,
    replace_observation,
)
from numpyro_dgp.layers import Layer
from numpyro_dgp.objectives._base import Objective

__all__ = ["CollapsedData", "CollapsedSparseGP", "collapse_sparse_layer"]


class CollapsedData(NamedTuple):
    """What the collapsed layer's observation site left after a run.

    :ivar layer: the layer.
    :ivar X: ``(N, D)`` its inputs.
    :ivar residual: ``(N, P)`` observations minus the likelihood's location (the prior mean).
    :ivar noise_var: ``(N, P)`` the likelihood's variance plus the layer's output noise.
    """

    layer: Layer
    X: jax.Array
    residual: jax.Array
    noise_var: jax.Array


class _SpreadTotal(SpreadTotal):
    """The collapsed objective ``total`` as the observed site's log density (its batch shape)."""

    def __init__(self, total: jax.Array, batch_shape: tuple) -> None:
        self.total = total
        super().__init__(batch_shape=batch_shape, event_shape=())

    def total_log_prob(self, value: ArrayLike) -> jax.Array:
        return self.total


class collapse_sparse_layer(PerRunMessenger):
    """Score a one-layer model's Gaussian observations with VFE's or FITC's collapsed objective.

    The layer's message returns the layer's prior mean at its inputs; the first observed sample
    site after it (a ``Normal`` whose location is the layer's output, ``Normal(f[..., 0], s)``
    or ``Normal(f, s)``) gets the whole collapsed objective as its log density, and
    :attr:`data` records what it was computed from (:class:`CollapsedData`).

    :param fn: the model.
    :param method: ``"vfe"`` or ``"fitc"``.
    :param caller: the name errors are reported under.
    """

    def __init__(
        self, fn: Callable | None = None, method: str = "vfe", caller: str = "collapse_sparse_layer"
    ) -> None:
        check_choice(method, COLLAPSED_METHODS, "method", caller)
        self.method = method
        self.caller = caller
        super().__init__(fn)

    def _reset(self) -> None:
        self.data: CollapsedData | None = None
        self._pending: tuple[Layer, jax.Array] | None = None
        self._layers = 0

    def _problem_after_run(self) -> str | None:
        if self._pending is not None:
            return (
                f"{self.caller}: no observed sample site followed layer "
                f"{self._pending[0].name!r}; the collapsed objective is a function of the "
                "observations, so they must be given"
            )
        return None

    def process_message(self, msg: dict) -> None:
        """Take the layer's message; score the observation site after it."""
        if msg["type"] == LAYER_MESSAGE:
            layer, X, _ = layer_call(msg)
            self._layers += 1
            if self._layers > 1:
                raise NotImplementedError(
                    f"{self.caller}: the model runs more than one gp_layer ({layer.name!r} is the "
                    "second); the collapsed objective is for one layer; for deep models use "
                    "DGPElbo or NestedCompressionElbo"
                )
            check_layer_supported(msg, self.caller)
            if layer.inducing != "global" or get_tag(msg, LAYER_RULE) is not None or X.ndim != 2:
                raise NotImplementedError(
                    f"{self.caller}: layer {layer.name!r} has inducing={layer.inducing!r}, "
                    "branches or branched inputs; the collapsed objective needs global inducing "
                    "points and (N, D) inputs"
                )
            self._pending = (layer, X)
            msg["value"] = layer.mean_fn(X)
            return
        if msg["type"] == "sample" and msg["is_observed"] and self._pending is not None:
            self._score(msg)

    def _score(self, msg: dict) -> None:
        pending, self._pending = self._pending, None
        assert pending is not None  # process_message scores a site only with a layer pending
        layer, X = pending
        if msg["scale"] is not None and not _is_one(msg["scale"]):
            raise NotImplementedError(
                f"{self.caller}: observation site {msg['name']!r} is scaled by {msg['scale']} (a "
                "subsampled plate?); the collapsed objective couples all points and needs the full "
                "data in every step; use DGPElbo for minibatches"
            )
        N, P = X.shape[0], layer.out_dim
        refusal = (
            "the collapsed objective integrates q(u) out against a Gaussian likelihood; use DGPElbo"
        )
        base, y, noise_var = gaussian_observation(msg, layer, N, self.caller, refusal)
        loc = jnp.broadcast_to(base.loc, y.shape).reshape(N, P)
        if layer.noise is not None:
            noise_var = noise_var + layer.noise
        residual = y.reshape(N, P) - loc
        self.data = CollapsedData(layer, X, residual, noise_var)
        total = collapsed_log_marginal(
            layer.Kmm_chol,
            layer.kernel(layer.inducing_inputs, X),
            layer.kernel.diag(X),
            residual,
            noise_var,
            method=self.method,
            Kmm_chol_inv=layer.Kmm_chol_inv,
        )
        replace_observation(
            msg, _SpreadTotal(total, tuple(base.batch_shape) if base.batch_shape else y.shape)
        )


def _is_one(scale: Any) -> bool:
    try:
        return float(scale) == 1.0
    except (TypeError, jax.errors.ConcretizationTypeError):
        return False


class CollapsedSparseGP(Objective):
    """One sparse GP layer with a Gaussian likelihood, ``q(u)`` optimal and integrated out.

    For a model with one :func:`~numpyro_dgp.gp_layer` followed by a Gaussian likelihood
    (``Normal(f[..., 0], sigma)``), the objective is, with ``Q_ff = K_fu K^-1 K_uf``:

    * ``method="vfe"``: Titsias' (2009) collapsed bound ``log N(y | m, Q_ff + sigma^2 I) -
      tr(K_ff - Q_ff) / (2 sigma^2)``, a lower bound on the log marginal likelihood, equal to
      the uncollapsed SVGP bound (:class:`~numpyro_dgp.DGPElbo`) at its optimal ``q(u)``;
    * ``method="fitc"``: the FITC log marginal likelihood ``log N(y | m, Q_ff + Lambda)``,
      ``Lambda = diag(K_ff - Q_ff) + sigma^2 I`` (Snelson & Ghahramani 2006). **Not a bound**:
      it is the exact marginal likelihood of a different model, which tends to under-estimate
      the noise and over-fit (Bauer, van der Wilk & Rasmussen 2016).

    Computed in ``O(N M^2)`` without ``N x N`` matrices
    (:func:`~numpyro_dgp.core.collapsed_log_marginal`); the layer's output noise, if any, adds to
    ``sigma^2``. Every point is in every step: a subsampled data plate is refused. The guide covers
    the model's other latent sites (none for plain hyperparameters, which are ``numpyro.param``
    sites: pass ``guide = lambda *args, **kwargs: None``), and must not sample the inducing values;
    those sites are ``log p - log q`` as in ``Trace_ELBO``. Predict with
    :func:`numpyro_dgp.predict_collapsed` (the FITC or VFE predictive).

    :param method: ``"vfe"`` or ``"fitc"``.
    :raises ValueError: for an unknown ``method``.
    """

    def __init__(self, method: str = "vfe") -> None:
        check_choice(method, COLLAPSED_METHODS, "method", "CollapsedSparseGP")
        self.method = method
        super().__init__(num_particles=1)

    def components(
        self,
        rng_key: jax.Array,
        param_map: dict,
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, jax.Array | float]:
        """The collapsed objective's parts.

        :param rng_key: PRNG key (for the guide's latent sites, if any).
        :param param_map: parameter values ``{name: value}``.
        :param model: the model.
        :param guide: the guide of the latent sites other than the inducing values.
        :param args: the model's and guide's positional arguments.
        :param kwargs: their keyword arguments.
        :return: ``{"log_marginal", "other"}``: the observed sites' collapsed log density, and
            ``log p - log q`` of the other latent sites; the objective is their sum.
        :raises ValueError: if the guide samples the inducing values or misses a latent site.
        """
        guide_trace, seeded = guide_then_model(model, guide, param_map, rng_key, args, kwargs)
        handler = collapse_sparse_layer(seeded, self.method, "CollapsedSparseGP")
        model_trace = trace(handler).get_trace(*args, **kwargs)
        u_sites = set(layers_by_u_site(model_trace))
        log_marginal: jax.Array | float = 0.0
        other: jax.Array | float = 0.0
        for name, site in model_trace.items():
            if site["type"] != "sample":
                continue
            scale = 1.0 if site["scale"] is None else site["scale"]
            if site["is_observed"]:
                log_marginal = log_marginal + scale * jnp.sum(site["fn"].log_prob(site["value"]))
                continue
            if name in u_sites:
                if name in guide_trace:
                    raise ValueError(
                        f"CollapsedSparseGP: the guide samples the inducing values {name!r}, "
                        "which the objective integrates out; give a guide for the other latent "
                        "sites only (lambda *args, **kwargs: None when there are none)"
                    )
                continue
            if name not in guide_trace:
                raise ValueError(
                    f"CollapsedSparseGP: latent site {name!r} is not covered by the guide"
                )
            log_p = scale * jnp.sum(site["fn"].log_prob(site["value"]))
            q_site = guide_trace[name]
            q_scale = 1.0 if q_site["scale"] is None else q_site["scale"]
            other = other + log_p - q_scale * jnp.sum(q_site["fn"].log_prob(q_site["value"]))
        return {"log_marginal": log_marginal, "other": other}

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """``log_marginal + other``."""
        return parts["log_marginal"] + parts["other"]
