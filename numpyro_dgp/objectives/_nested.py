"""Nested variational compression (Hensman & Lawrence 2014): a deterministic DGP bound.

**References:**

* Hensman, Lawrence (2014). Nested variational compression in deep Gaussian processes.
  arXiv:1412.1370.
* Titsias (2009). Variational learning of inducing variables in sparse Gaussian processes.
  AISTATS.
* Titsias, Lawrence (2010). Bayesian Gaussian process latent variable model. AISTATS.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from numpyro_dgp._engine.moments import moment_trace
from numpyro_dgp._protocol import NODE_AXIS, get_tag
from numpyro_dgp.objectives._base import Objective
from numpyro_dgp.objectives._dsvi import objective_terms, weighted_log_prob
from numpyro_dgp.posteriors import unwrap_distribution

__all__ = ["NestedCompressionElbo"]

_NAME = "NestedCompressionElbo"


def _tail_scale(observed: dict) -> Any:
    """The plate scale shared by the observation sites after the last layer (``N / B`` when the
    data plate subsamples): the inner layers' penalties are sums over the same points."""
    tail = {name: site for name, site in observed.items() if get_tag(site, NODE_AXIS)}
    if not tail:
        raise ValueError(
            f"{_NAME}: no observed sample site follows the last gp_layer; the bound needs the "
            "observations (pass y to the model)"
        )
    for name, site in tail.items():
        base = unwrap_distribution(site["fn"])
        if not isinstance(base, dist.Normal):
            raise NotImplementedError(
                f"{_NAME}: observation site {name!r} has likelihood {type(base).__name__}; nested "
                "variational compression is exact for a Gaussian likelihood only; use DGPElbo"
            )
    scales = [site["scale"] for site in tail.values()]
    try:
        distinct = {None if s is None else float(s) for s in scales}
    except (TypeError, jax.errors.ConcretizationTypeError):
        distinct = {0}  # traced scales: cannot compare them here
    if len(distinct) > 1:
        raise ValueError(
            f"{_NAME}: the observation sites after the last layer {sorted(tail)} are scaled "
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
    :param num_particles: must be 1 (the bound is deterministic; kept for NumPyro's interface).
    :raises ValueError: if ``num_particles != 1``.
    """

    def __init__(self, propagate_inducing_variance: bool = True, num_particles: int = 1) -> None:
        if int(num_particles) != 1:
            raise ValueError(
                f"{_NAME}: the bound is deterministic; num_particles must be 1, got {num_particles}"
            )
        self.propagate_inducing_variance = bool(propagate_inducing_variance)
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
        """The bound split into its parts.

        :param rng_key: PRNG key (used only by latent sites other than the inducing values).
        :param param_map: parameter values ``{name: value}``.
        :param model: the model.
        :param guide: the guide.
        :param args: the model's and guide's positional arguments.
        :param kwargs: their keyword arguments.
        :return: ``{"expected_log_likelihood", "inner_penalty", "kl_inducing", "other"}``; the
            bound is ``expected_log_likelihood - inner_penalty - kl_inducing + other``.
        """
        options = ("bound", 2, _NAME, self.propagate_inducing_variance)
        run = moment_trace(model, guide, param_map, rng_key, args, kwargs, *options)
        observed, kl, other = objective_terms(run, _NAME)
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
