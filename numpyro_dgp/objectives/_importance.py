"""The importance-weighted bound of Salimbeni, Dutordoir, Hensman & Deisenroth (2019) for DGPs
with latent inputs (:func:`~numpyro_dgp.latent_input`).

Each point's latents are drawn ``K`` times from the guide, ``w_n^k ~ q(w_n)``, and weighted::

    L_K = sum_n E log (1/K) sum_k exp(E_q(f_n^k)[log p(y_n | f_n^k)]) p(w_n^k) / q(w_n^k)
          - KL[q(U) || p(U)]

with the inducing values integrated out as in DSVI. Between the latent input and the last
layer, a point's ``K`` draws are taken jointly (their ``K x K`` covariance under ``q``): they
share the inducing values, as the bound requires; the last layer's expectation sits inside the
average, taken over its marginal (in closed form or by quadrature). Since the log-mean-exp is
convex, this is below the bound with the inducing values shared explicitly, hence below the
evidence (Salimbeni et al.'s construction). ``K = 1`` is the ELBO with a sampled latent; the
bound grows with ``K``.

**References:**

* Salimbeni, Dutordoir, Hensman, Deisenroth (2019). Deep Gaussian processes with
  importance-weighted variational inference. ICML.
* Burda, Grosse, Salakhutdinov (2016). Importance weighted autoencoders. ICLR.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from numpyro_dgp._compat import is_tracer
from numpyro_dgp._protocol import IMPORTANCE_LOG_WEIGHTS, get_tag
from numpyro_dgp._validation import check_positive_int
from numpyro_dgp.layers import Layer, layer_moments, sample_moments
from numpyro_dgp.objectives._base import Call
from numpyro_dgp.objectives._dsvi import MarginalObjective, expected_log_prob, plate_ndim

_NAME = "ImportanceWeightedElbo"


class ImportanceDraws(NamedTuple):
    """How the inducing-marginalization engine draws under the importance-weighted bound: its
    ``importance`` plug-in (:class:`~numpyro_dgp._engine.marginal.marginalize_inducing`).

    Every latent input is drawn ``num`` times per point (a leading axis), the draws' log
    weights ``log p(w) - log q(w)`` tagged :data:`~numpyro_dgp._protocol.IMPORTANCE_LOG_WEIGHTS`
    (:meth:`latent_log_weights`); a layer between the latent input and the last layer draws a
    point's ``num`` outputs jointly (:meth:`layer_value`). The bound takes independent
    Gaussian layers only (:meth:`check_model`, :meth:`check_layer`).

    :ivar num: ``K``, the draws per point.
    """

    num: int

    def check_model(self, encoded: list[str], objective: str) -> None:
        """Refuse layers with per-point inducing sets (``encoded``).

        :raises ValueError: if there are some.
        """
        if encoded:
            raise ValueError(
                f"{objective}: layers {encoded} have per-point inducing sets, which the "
                "importance-weighted bound does not take; use DGPElbo"
            )

    def check_layer(self, layer: Any, rule: Any, correlated: bool) -> None:
        """Refuse a layer with a rule (a flow, a mixture) or a guide that correlates the layers.

        :raises ValueError: for either.
        """
        if rule is not None or correlated:
            raise ValueError(
                f"ImportanceWeightedElbo: layer {layer.name!r} is an SDE flow, has branches or a "
                "guide that correlates the layers; the importance-weighted bound takes "
                "independent Gaussian layers (AutoFactorizedDGP, AutoNormal) without handlers"
            )

    def missing_latent(self, name: str) -> NoReturn:
        """Refuse a latent input whose ``q(w_n)`` the guide does not give.

        :raises ValueError: always.
        """
        raise ValueError(
            f"ImportanceWeightedElbo: the guide gives no Gaussian q({name}) to draw the "
            "latent input from; use a numpyro_dgp.guides guide (or NumPyro's AutoNormal)"
        )

    def latent_log_weights(self, w: jax.Array, eps: jax.Array, scale: jax.Array) -> jax.Array:
        """``(K, B)`` ``log N(w | 0, I) - log N(w | loc, scale)`` of the draws
        ``w = loc + scale eps``."""
        log_ratio = -0.5 * w**2 + 0.5 * eps**2 + jnp.log(scale)
        return jnp.sum(log_ratio, axis=-1)

    def layer_value(
        self, layer: Layer, X: jax.Array, q_mean: Any, q_sqrt: Any, rng_key: jax.Array
    ) -> jax.Array:
        """The layer's outputs at a point's ``K`` draws ``X (K, B, D)``, drawn jointly (their
        ``K x K`` covariance under the layer's marginal at ``q(u) = (q_mean, q_sqrt)``): the
        draws share the inducing values, as the bound needs."""

        def at_point(X_n, key):  # (K, D) -> (K, P)
            mean, cov = layer_moments(layer, X_n, q_mean, q_sqrt, full_cov=True)
            return sample_moments(key, mean, cov, True, layer.jitter)

        keys = jax.random.split(rng_key, X.shape[1])
        return jnp.swapaxes(jax.vmap(at_point, in_axes=(1, 0))(X, keys), 0, 1)


def _common_scale(scales: dict) -> Any:
    """The one plate scale of the sites inside the importance average (their sum per draw is
    one joint likelihood per point, so they must be scaled alike)."""
    first = next(iter(scales.values()))
    concrete = {
        name: float(s) for name, s in scales.items() if not is_tracer(s) and np.ndim(s) == 0
    }
    if len(set(concrete.values())) > 1:
        raise ValueError(
            f"ImportanceWeightedElbo: the observed sites that depend on the latent inputs are "
            f"scaled differently ({concrete}); their likelihoods are averaged together per point, "
            "so observe them in one plate with one subsample and no scale handler between them"
        )
    return first


class ImportanceWeightedElbo(MarginalObjective):
    """The importance-weighted evidence lower bound for DGPs with latent inputs
    (Salimbeni et al. 2019; see the module docstring).

    Use it with :class:`~numpyro_dgp.guides.AutoFactorizedDGP` (its ``q(w_n)`` per point or
    amortized, ``latent_inputs=``) or NumPyro's ``AutoNormal``; the KLs of ``q(U)`` are taken in
    closed form.

    :param num_importance: ``K``, latent draws per point.
    :param num_particles: draws of the inducing values per step (the bound averaged over them).
    :param num_quadrature: Gauss-Hermite nodes per output of the last layer (see
        :class:`~numpyro_dgp.DGPElbo`).
    :param num_likelihood_samples: Monte Carlo draws of the last layer's outputs per point and
        latent draw, where the likelihood's expectation is sampled (as for
        :class:`~numpyro_dgp.DGPElbo`).
    :raises ValueError: if ``num_importance``, ``num_particles``, ``num_likelihood_samples`` or
        a given ``num_quadrature`` is not a positive integer.
    """

    _name = _NAME

    def __init__(
        self,
        num_importance: int = 8,
        num_particles: int = 1,
        num_quadrature: int | None = None,
        num_likelihood_samples: int = 32,
    ) -> None:
        check_positive_int(num_importance, "num_importance", _NAME)
        self.num_importance = int(num_importance)
        super().__init__(num_particles, num_quadrature, num_likelihood_samples)

    def _terms(self, call: Call) -> dict[str, jax.Array | float]:
        """One particle's bound split into its parts.

        :return: ``{"importance_weighted_log_likelihood", "kl_inducing", "other"}``; the bound is
            ``importance_weighted_log_likelihood - kl_inducing + other``.
        """
        K = self.num_importance
        run, observed, kl, other = self._run(call, ImportanceDraws(K))
        log_weights = sum(
            get_tag(site, IMPORTANCE_LOG_WEIGHTS)
            for site in run.model_trace.values()
            if get_tag(site, IMPORTANCE_LOG_WEIGHTS) is not None
        )
        # per point, the observed sites that depend on the latents are summed inside the
        # importance average (one joint likelihood per draw); the others outside it
        inside: jax.Array | float = 0.0
        outside: jax.Array | float = 0.0
        scales: dict[str, Any] = {}
        for site in observed.values():
            lp = expected_log_prob(site, run, _NAME)  # (K, B) with latent inputs, else (B,)
            scale = site["scale"] if site["scale"] is not None else 1.0
            if jnp.ndim(lp) > plate_ndim(site):
                inside, scales[site["name"]] = inside + lp, scale
            else:
                outside = outside + jnp.sum(scale * lp)
        bound = outside
        if scales:
            per_point = logsumexp(inside + log_weights, axis=0) - np.log(K)
            bound = bound + jnp.sum(_common_scale(scales) * per_point)
        return {"importance_weighted_log_likelihood": bound, "kl_inducing": kl, "other": other}

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """``importance_weighted_log_likelihood - kl_inducing + other``."""
        return parts["importance_weighted_log_likelihood"] - parts["kl_inducing"] + parts["other"]

    def average_particles(
        self, one_particle: Callable[[jax.Array], jax.Array], rng_key: jax.Array
    ) -> jax.Array:
        """The bound averaged over ``num_particles`` independent keys."""
        return jnp.mean(jax.vmap(one_particle)(jax.random.split(rng_key, self.num_particles)))
