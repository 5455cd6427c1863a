"""The predictive (DSPP / PPGPR) objective: ``log`` of the predictive mixture over particles,
on the Gaussian a guide exposes over each layer's inducing values (the pieces it shares with
:class:`~numpyro_dgp.objectives.DGPElbo` come from ``_dsvi``).

**References:**

* Jankowiak, Pleiss, Gardner (2020). Deep sigma point processes. UAI.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import logsumexp
from jax.typing import ArrayLike

from numpyro_dgp._engine.observation import masked_value, observation_kind, unwrap
from numpyro_dgp._engine.run import marginal_trace
from numpyro_dgp._validation import check_positive_int
from numpyro_dgp.objectives._base import Objective
from numpyro_dgp.objectives._dsvi import (
    has_node_axis,
    objective_terms,
    plate_ndim,
    refuse_without_closed_form,
)

__all__ = ["PredictiveObjective"]


def _log_predictive(
    site: dict, weights: ArrayLike, mixture_log_weights: jax.Array | None = None
) -> tuple[jax.Array, ArrayLike]:
    """Per-point ``log E[p(y | f)]`` of an observed site over the last layer's marginal, with
    the site's plate scale; shape: the site's batch shape. With branches (a leading branch
    axis after the quadrature axis), ``log sum_s w_s E[p(y | f_s)]``.

    A Normal site whose scale does not depend on the layer has its location taken as affine in
    the layer output (``Normal(f[..., 0], s)``): ``log N(y | E[loc], Var[loc] + s^2)`` with the
    node-weighted moments, exact then; other likelihoods: ``log sum_k w_k p(y | node_k)``
    (Gauss-Hermite or Monte Carlo)."""
    scale = site["scale"] if site["scale"] is not None else 1.0
    fn, value = site["fn"], site["value"]
    lp = fn.log_prob(value)
    if not has_node_axis(site, lp, weights):
        return lp, scale
    refuse_without_closed_form(site, "PredictiveObjective")
    parts = unwrap(fn)
    if observation_kind(fn, site["name"], "PredictiveObjective") == "normal":
        loc = jnp.broadcast_to(parts.base.loc, parts.shape)
        w = jnp.reshape(jnp.asarray(weights, loc.dtype), (-1,) + (1,) * (loc.ndim - 1))
        mean = jnp.sum(w * loc, axis=0)
        var = (
            jnp.sum(w * (loc - mean) ** 2, axis=0)
            + jnp.broadcast_to(parts.base.scale, parts.shape)[0] ** 2
        )
        lp = dist.Normal(mean, jnp.sqrt(var)).log_prob(masked_value(parts, value))
        if parts.mask is not None:
            lp = jnp.where(jnp.broadcast_to(parts.mask, parts.shape)[0], lp, 0.0)
        if parts.event_ndims:
            lp = jnp.sum(lp, axis=tuple(range(-parts.event_ndims, 0)))
    else:
        w = jnp.reshape(jnp.asarray(weights, lp.dtype), (-1,) + (1,) * (lp.ndim - 1))
        lp = logsumexp(lp, axis=0, b=w)
    if (
        mixture_log_weights is not None
        and lp.ndim > plate_ndim(site)
        and lp.shape[0] == mixture_log_weights.shape[0]
    ):
        log_w = jax.nn.log_softmax(mixture_log_weights).astype(lp.dtype)
        lp = logsumexp(lp + log_w.reshape((-1,) + (1,) * (lp.ndim - 1)), axis=0)
    return lp, scale


class PredictiveObjective(Objective):
    """The predictive (DSPP / PPGPR) objective of Jankowiak et al. (2020), AR2PP in
    Meng & Zhang (2024).

    ``sum_n log sum_s w_s p(y_n | x_n, s) - beta KL``, where particle ``s`` propagates the
    inputs through the inner layers (as :class:`DGPElbo` does, inducing values marginalized)
    and ``p(y_n | x_n, s) = E[p(y_n | f_L)]`` over the last layer's Gaussian marginal (for a
    Normal likelihood whose location is affine in the last layer, the exact ``N(y | m_s, v_s +
    noise)`` from the nodes' moments; otherwise Gauss-Hermite for one output, and for several
    the average over Monte Carlo draws, whose ``log`` is then a downward-biased estimate, the
    bias falling as ``1 / num_likelihood_samples``). The ``log`` sits
    outside the mixture over particles and the likelihood expectation, unlike the ELBO's
    ``E log``: it scores the predictive distribution directly and is no lower bound on the
    evidence. The KL terms (closed form, averaged over particles) act as a regularizer of
    weight ``beta``; latent sites other than inducing values (hyperparameter priors) enter
    as ``log p - log q`` like in ``Trace_ELBO``, also weighted by ``beta``.

    Plate subsampling rescales each point's log predictive by ``N / B``.

    :param num_particles: ``S`` propagated samples of the inner layers per step.
    :param beta: KL weight (Meng & Zhang 2024 use 1).
    :param num_quadrature: Gauss-Hermite nodes per output of the last layer (default: 20 for
        one output; several outputs: as for :class:`DGPElbo`).
    :param particle_weights: ``(S,)`` mixture weights ``w_s`` (default ``1/S``), e.g. the
        weights of a quadrature rule over a guide's sample space.
    :param num_likelihood_samples: Monte Carlo draws of the last layer's outputs per point, where
        the expectation is sampled (as for :class:`DGPElbo`).
    :raises ValueError: if ``num_particles``, ``num_likelihood_samples`` or a given
        ``num_quadrature`` is not a positive integer, ``beta < 0``, or ``particle_weights`` are
        not ``num_particles`` non-negative weights summing to 1.
    """

    def __init__(
        self,
        num_particles: int = 8,
        beta: float = 1.0,
        num_quadrature: int | None = None,
        particle_weights: ArrayLike | None = None,
        num_likelihood_samples: int = 32,
    ) -> None:
        check_positive_int(num_particles, "num_particles", "PredictiveObjective")
        check_positive_int(num_likelihood_samples, "num_likelihood_samples", "PredictiveObjective")
        check_positive_int(num_quadrature, "num_quadrature", "PredictiveObjective", allow_none=True)
        if not (float(beta) >= 0):
            raise ValueError(f"PredictiveObjective: beta must be >= 0, got {beta}")
        if particle_weights is not None:
            w = np.asarray(particle_weights, float)
            if w.shape != (int(num_particles),) or np.any(w < 0) or not np.isclose(w.sum(), 1.0):
                raise ValueError(
                    "PredictiveObjective: particle_weights must be num_particles non-negative "
                    f"weights summing to 1, got {particle_weights!r}"
                )
        self.num_likelihood_samples = int(num_likelihood_samples)
        self.beta = float(beta)
        self.num_quadrature = num_quadrature
        self.particle_weights = particle_weights
        super().__init__(num_particles=num_particles, vectorize_particles=True)

    def components(
        self,
        rng_key: jax.Array,
        param_map: dict,
        model: Callable,
        guide: Callable,
        *args: Any,
        **kwargs: Any,
    ) -> dict[str, jax.Array | float]:
        """The objective's parts over ``num_particles`` particles (arguments as for
        :meth:`DGPElbo.components`).

        :return: ``{"log_predictive", "kl_inducing", "other"}``; the objective is
            ``log_predictive - beta (kl_inducing - other)``.
        """

        def one(key):
            rule = (self.num_quadrature, "PredictiveObjective", self.num_likelihood_samples)
            run = marginal_trace(model, guide, param_map, key, args, kwargs, *rule)
            observed, kl, other = objective_terms(run, "PredictiveObjective")
            per_point = {}
            for name, site in observed.items():
                lp, scale = _log_predictive(site, run.node_weights, run.mixture_log_weights)
                per_point[name] = (lp, jnp.asarray(scale, lp.dtype))
            return per_point, kl, other

        keys = jax.random.split(rng_key, self.num_particles)
        per_point, kl, other = jax.vmap(one)(keys)
        if self.particle_weights is None:
            log_w = jnp.full((self.num_particles,), -np.log(self.num_particles))
        else:
            log_w = jnp.log(jnp.asarray(self.particle_weights))
        total = 0.0
        for lp, scale in per_point.values():  # lp (S, batch...), scale (S,) (the same for all)
            mixture = logsumexp(
                lp + jnp.reshape(log_w.astype(lp.dtype), (-1,) + (1,) * (lp.ndim - 1)), axis=0
            )
            total = total + scale[0] * jnp.sum(mixture)
        if self.particle_weights is None:
            kl, other = jnp.mean(kl), jnp.mean(other)
        else:
            weights = jnp.asarray(self.particle_weights)
            kl, other = weights @ kl, weights @ other
        return {"log_predictive": total, "kl_inducing": kl, "other": other}

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """``log_predictive - beta (kl_inducing - other)``."""
        return parts["log_predictive"] - self.beta * (parts["kl_inducing"] - parts["other"])
