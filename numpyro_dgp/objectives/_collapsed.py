"""Bounds for a Gaussian likelihood without sampling the layers: one sparse GP layer with
``q(u)`` integrated out (VFE and FITC), and nested variational compression (Hensman & Lawrence
2014), a deterministic DGP bound.

**References:**

* Titsias (2009). Variational learning of inducing variables in sparse Gaussian processes.
  AISTATS.
* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
* Titsias, Lawrence (2010). Bayesian Gaussian process latent variable model. AISTATS.
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
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.handlers import trace

from numpyro_dgp._engine.run import guide_then_model, layers_by_u_site, moment_trace
from numpyro_dgp._protocol import LAYER_MESSAGE, LAYER_RULE, NODE_AXIS, get_tag, layer_call
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
from numpyro_dgp.objectives._base import Call, Objective
from numpyro_dgp.objectives._dsvi import objective_terms, weighted_log_prob
from numpyro_dgp.posteriors import unwrap_distribution

_NVC = "NestedCompressionElbo"  # nested variational compression, in messages


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

    def __init__(self, fn: Callable, method: str, caller: str) -> None:
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


def _scaled_log_prob(site: dict) -> jax.Array:
    """A site's log-density summed, times its plate scale."""
    scale = 1.0 if site["scale"] is None else site["scale"]
    return scale * jnp.sum(site["fn"].log_prob(site["value"]))


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

    def _terms(self, call: Call) -> dict[str, jax.Array | float]:
        """The collapsed objective's parts (the PRNG key serves the guide's latent sites, if any).

        :return: ``{"log_marginal", "other"}``: the observed sites' collapsed log density, and
            ``log p - log q`` of the other latent sites; the objective is their sum.
        :raises ValueError: if the guide samples the inducing values or misses a latent site.
        """
        guide_trace, seeded = guide_then_model(*call)
        handler = collapse_sparse_layer(seeded, self.method, "CollapsedSparseGP")
        model_trace = trace(handler).get_trace(*call.args, **call.kwargs)
        u_sites = set(layers_by_u_site(model_trace))
        log_marginal: jax.Array | float = 0.0
        other: jax.Array | float = 0.0
        for name, site in model_trace.items():
            if site["type"] != "sample":
                continue
            if site["is_observed"]:
                log_marginal = log_marginal + _scaled_log_prob(site)
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
            other = other + _scaled_log_prob(site) - _scaled_log_prob(guide_trace[name])
        return {"log_marginal": log_marginal, "other": other}

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """``log_marginal + other``."""
        return parts["log_marginal"] + parts["other"]


def _tail_scale(observed: dict) -> Any:
    """The plate scale shared by the observation sites after the last layer (``N / B`` when the
    data plate subsamples): the inner layers' penalties are sums over the same points."""
    tail = {name: site for name, site in observed.items() if get_tag(site, NODE_AXIS)}
    if not tail:
        raise ValueError(
            f"{_NVC}: no observed sample site follows the last gp_layer; the bound needs the "
            "observations (pass y to the model)"
        )
    for name, site in tail.items():
        base = unwrap_distribution(site["fn"])
        if not isinstance(base, dist.Normal):
            raise NotImplementedError(
                f"{_NVC}: observation site {name!r} has likelihood {type(base).__name__}; nested "
                "variational compression is exact for a Gaussian likelihood only; use DGPElbo"
            )
    scales = [site["scale"] for site in tail.values()]
    try:
        distinct = {None if s is None else float(s) for s in scales}
    except (TypeError, jax.errors.ConcretizationTypeError):
        distinct = {0}  # traced scales: cannot compare them here
    if len(distinct) > 1:
        raise ValueError(
            f"{_NVC}: the observation sites after the last layer {sorted(tail)} are scaled "
            "differently; the inner layers' penalties need one plate over the same points"
        )
    return 1.0 if scales[0] is None else scales[0]


class NestedCompressionElbo(Objective):
    """The nested variational compression bound of Hensman & Lawrence (2014), for the same
    ``gp_layer`` models and guides with an independent Gaussian ``q(u_l) = N(m_l, S_l)`` per
    layer (:class:`~numpyro_dgp.guides.AutoFactorizedDGP`, NumPyro's ``AutoNormal``).

    The model must be a chain ``h_l = f_l(h_{l-1}) + eps_l`` (``h_0 = X``) whose inner layers
    have output noise ``eps_l ~ N(0, beta_l^-1)`` (``gp_layer(..., noise=...)``), followed by a
    Gaussian likelihood ``y ~ N(h_L, beta_L^-1)``. Instead of sampling the inner layers, every
    layer's output is a Gaussian per point whose moments come from psi statistics
    (:func:`~numpyro_dgp.core.uncertain_input_moments`), and the bound is, for any depth,

    ``L = - sum_l KL[q(u_l) || p(u_l)]
    - sum_{l < L} (beta_l / 2) sum_{n, p} (input_var + conditional_var)_l
    - sum_{n, p} (1 / 2) log(2 pi / beta_L)
    - (beta_L / 2) sum_{n, p} [(y - mean_L)^2 + inducing_var_L + input_var_L + conditional_var_L]``,

    where layer ``l``'s moments are taken under the Gaussian ``N(mean_{l-1}, beta_{l-1}^-1 +
    inducing_var_{l-1})`` the layer before forwards (layer 1 under the fixed inputs), the
    variance parts are those of :class:`~numpyro_dgp.core.UncertainInputMoments` (the
    ``conditional_var`` terms are Titsias' ``psi0 - tr(K^-1 Psi2)``, the ``input_var`` terms
    ``tr((Psi2 - Psi1^T Psi1) K^-1 (m m^T + S) K^-1)`` plus a linear mean function's share).
    Each inner layer's Titsias bound ``log p(h_l | u_l, h_{l-1}) >= log N(h_l | mean, beta_l^-1)
    - (beta_l / 2) tr(K_ff - Q_ff)`` is averaged over its Gaussian input (Jensen's inequality),
    which leaves a normalized Gaussian in ``h_l`` times a factor free of ``h_l``, and the next
    layer sees a Gaussian again. With one layer the bound is the uncollapsed SVGP bound
    (Hensman et al. 2013), equal to :class:`~numpyro_dgp.DGPElbo`'s for the same ``q(u)``.

    Every term is a sum over points, so the data plate's minibatches work as for DGPElbo
    (data terms scaled by ``N / B``), and so does :class:`~numpyro_dgp.handlers.data_parallel`.
    No sampling: the gradient has no Monte Carlo noise (only latent sites other than the
    inducing values, e.g. hyperparameters with priors, are sampled as in ``Trace_ELBO``). The
    cost per layer with uncertain inputs is one ``(B, M (M + 1) / 2)`` matrix of exponentials
    (squared exponential kernel; other kernels fall back to Gauss-Hermite, see
    :mod:`numpyro_dgp.core`). Predict with :func:`numpyro_dgp.predict` (sampling from the
    learned ``q(u)``) or :func:`numpyro_dgp.predict_moment_matched` (deterministic).

    ``propagate_inducing_variance=False`` gives a second bound, valid for any depth as well: each
    inner layer forwards only its noise, ``N(mean_l, beta_l^-1)``, and pays for the variance
    its inducing values add in the penalty, ``(beta_l / 2) sum_{n, p} inducing_var_l`` (Jensen's
    inequality over ``q(u_l)`` inside the bound on ``p(h_l)``, instead of integrating
    ``q(u_l)`` out exactly). The next layer's inputs then share one variance, so its psi
    statistics are matrix products (``O(B M^2)`` flops and ``O(B M)`` exponentials, like a
    DSVI step) instead of the ``B M (M + 1) / 2`` exponentials of per-point variances. It is
    looser where the inner layers' ``q(u)`` keep much variance. Both are equal with one layer.
    Forwarding the inducing variance costs what a one-sample DGPElbo step spends on the inner
    layers' variances, plus those exponentials: several DGPElbo steps; the looser bound about
    one.

    Refused, with the objective to use instead: guides that correlate layers, guides without a
    Gaussian over some layer's inducing values, inducing locations, amortized layers, SDE
    flows and quadrature branches, non-Gaussian likelihoods, inner layers without noise, a last
    layer with noise, layers that are not fed the previous layer's output unchanged, and
    callable mean functions on layers with uncertain inputs.

    :param propagate_inducing_variance: forward each inner layer's inducing variance to the
        next layer (``True``, the bound above) or pay for it in the penalty (``False``).
    """

    def __init__(self, propagate_inducing_variance: bool = True) -> None:
        self.propagate_inducing_variance = bool(propagate_inducing_variance)
        super().__init__(num_particles=1)

    def _terms(self, call: Call) -> dict[str, jax.Array | float]:
        """The bound split into its parts (the PRNG key serves only latent sites other than the
        inducing values).

        :return: ``{"expected_log_likelihood", "inner_penalty", "kl_inducing", "other"}``; the
            bound is ``expected_log_likelihood - inner_penalty - kl_inducing + other``.
        """
        options = ("bound", 2, _NVC, self.propagate_inducing_variance)
        run = moment_trace(*call, *options)
        observed, kl, other = objective_terms(run, _NVC)
        scale = _tail_scale(observed)
        ell = sum(weighted_log_prob(site, run.node_weights) for site in observed.values())
        penalty = (
            scale * sum(run.penalties) if run.penalties else jnp.zeros((), jnp.result_type(ell))
        )
        return {
            "expected_log_likelihood": ell,
            "inner_penalty": penalty,
            "kl_inducing": kl,
            "other": other,
        }

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """``expected_log_likelihood - inner_penalty - kl_inducing + other``."""
        return (
            parts["expected_log_likelihood"]
            - parts["inner_penalty"]
            - parts["kl_inducing"]
            + parts["other"]
        )
