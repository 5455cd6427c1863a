"""The DSVI evidence lower bound and the predictive (DSPP / PPGPR) objective on the Gaussian a
guide exposes over each layer's inducing values, and the pieces other objectives reuse: the
closed-form KL of the inducing sites, the plate- and quadrature-weighted log densities.

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
* Jankowiak, Pleiss, Gardner (2020). Deep sigma point processes. UAI.
* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.linalg import block_diag
from jax.scipy.special import logsumexp
from jax.typing import ArrayLike

from numpyro_dgp._engine.observation import (
    closed_form_log_prob,
    masked_log_prob,
    observation_kind,
    unwrap,
)
from numpyro_dgp._engine.run import (
    MarginalRun,
    layers_by_u_site,
    marginal_trace,
    site_posterior,
)
from numpyro_dgp._protocol import IMPORTANCE_LOG_WEIGHTS, LOCAL_KL, NODE_AXIS, get_tag
from numpyro_dgp._validation import check_choice, check_positive_int
from numpyro_dgp.core import (
    chain_cross,
    chain_gauss_kl_term,
    gauss_kl,
)
from numpyro_dgp.layers import Layer
from numpyro_dgp.objectives._base import Call, Objective
from numpyro_dgp.posteriors import ChainLink, JointBlock, gaussian_parameters, unwrap_distribution


def plate_ndim(site: dict) -> int:
    return max([-f.dim for f in site["cond_indep_stack"]] + [0])


def _leading(w: ArrayLike, like: jax.Array) -> jax.Array:
    """``w`` in ``like``'s dtype, shaped to broadcast along ``like``'s leading axis."""
    return jnp.reshape(jnp.asarray(w, like.dtype), (-1,) + (1,) * (like.ndim - 1))


def _log_mix(lp: jax.Array, log_w: jax.Array) -> jax.Array:
    """``log sum_s w_s exp(lp_s)`` over ``lp``'s leading axis."""
    return logsumexp(lp + _leading(log_w, lp), axis=0)


def _branched(x: jax.Array, site: dict, mixture_log_weights: jax.Array) -> bool:
    """Whether ``x`` (a site's per-point values) carries a leading branch axis."""
    return jnp.ndim(x) > plate_ndim(site) and jnp.shape(x)[0] == mixture_log_weights.shape[0]


def _reduce_mixture(x: jax.Array, site: dict, mixture_log_weights: jax.Array | None) -> jax.Array:
    """Average a leading branch axis of ``x`` with the branch weights, if it is there."""
    if mixture_log_weights is None or not _branched(x, site, mixture_log_weights):
        return x
    return jnp.tensordot(jax.nn.softmax(mixture_log_weights).astype(x.dtype), x, axes=(0, 0))


def has_node_axis(site: dict, lp: jax.Array, weights: ArrayLike) -> bool:
    """Whether ``lp`` (a site's log-density) carries the last layer's quadrature axis in front:
    sites after the last layer do when they depend on its output; one that does not has no
    such axis."""
    if not get_tag(site, NODE_AXIS):
        return False
    batch_ndim = max(plate_ndim(site), len(site["fn"].batch_shape) - 1)
    return jnp.ndim(lp) > batch_ndim and jnp.shape(lp)[0] == jnp.shape(weights)[0]


def _node_average(
    site: dict, weights: ArrayLike, mixture_log_weights: jax.Array | None = None
) -> jax.Array:
    """Site log-density per point, averaging the quadrature axis and then the branch axis
    (:class:`numpyro_dgp.handlers.quadrature`, amortized guides) if present."""
    lp = site["fn"].log_prob(site["value"])
    if has_node_axis(site, lp, weights):
        lp = jnp.tensordot(jnp.asarray(weights, lp.dtype), lp, axes=(0, 0))
        lp = _reduce_mixture(lp, site, mixture_log_weights)
    return lp


def _scaled_sum(site: dict, lp: jax.Array) -> jax.Array:
    """``lp`` times the site's plate scale, summed."""
    if site["scale"] is not None:
        lp = site["scale"] * lp
    return jnp.sum(lp)


def weighted_log_prob(
    site: dict, weights: ArrayLike, mixture_log_weights: jax.Array | None = None
) -> jax.Array:
    """Site log-density summed over its plates, averaging the quadrature axis and then the
    branch axis (:func:`_node_average`) if present."""
    return _scaled_sum(site, _node_average(site, weights, mixture_log_weights))


def _prior_chol(layer: Layer) -> jax.Array | None:
    return None if layer.whiten else layer.Kmm_chol


def _layer_prior_kl(layer: Layer, residual: jax.Array, scale: jax.Array) -> jax.Array:
    """``KL[N(residual, scale scale^T) || N(0, K)]`` against the layer's prior factor (``I``
    whitened, else its ``L``, whitened with its ``L^{-1}``: products, not triangular solves)."""
    if layer.whiten:
        return gauss_kl(residual, scale)
    return gauss_kl(residual, scale, layer.Kmm_chol, layer.Kmm_chol_inv)


def _dense_kl(loc: jax.Array, scale_tril: jax.Array, prior_blocks: list) -> jax.Array:
    """``KL[N(loc, L L^T) || N(0, blockdiag(prior_blocks))]``; ``prior_blocks`` of ``None``
    stand for identity blocks (whitened)."""
    if all(b is None for b, _ in prior_blocks):
        return gauss_kl(loc[None], scale_tril[None])
    chol = block_diag(*[jnp.eye(m, dtype=loc.dtype) if b is None else b for b, m in prior_blocks])
    return gauss_kl(loc[None], scale_tril[None], chol)


def inducing_kl(
    name: str,
    model_site: dict,
    guide_site: dict,
    layers: dict[str, Layer],
    locations: bool,
    chain_factors: dict[str, tuple[jax.Array | None, jax.Array]],
    posterior: Any = None,
    objective: str = "DGPElbo",
) -> jax.Array | None:
    """Closed-form KL term of one inducing site, or ``None`` if the guide's site is not Gaussian.

    * global inducing points: the exact ``KL[q(u) || p(u)]`` for the guide's structure --
      per site for independent layers, the chain decomposition for a :class:`ChainLink`
      (``chain_factors`` carries each link's factor in the guide's draws to its child), the whole
      dense KL at the first site of a :class:`JointBlock` (zero at the others);
    * inducing locations: ``KL[q(u_l | earlier samples) || p(u_l | u_{l-1})]`` given the
      sampled earlier layers, whose expectation is the ELBO's KL (inducing points as
      inducing locations, Ustyuzhaninov et al. 2020, Sec. 4.2).

    :param name: the u-site name.
    :param model_site: the model's u site.
    :param guide_site: the guide's u site.
    :param layers: ``{u-site name: Layer}`` of the model run.
    :param locations: whether the model uses inducing locations.
    :param chain_factors: ``{u-site name: (cross, own)}`` of the chain links seen so far, their
        inducing values' factor in the guide's draws (:func:`~numpyro_dgp.core.chain_cross`);
        updated in place.
    :param posterior: the site's Gaussian as the run read it (global inducing points; e.g.
        from a NumPyro autoguide's latent Gaussian), instead of reading it off ``guide_site``.
    :param objective: the objective's name (in error messages).
    :return: the scalar KL, or ``None``.
    :raises ValueError: if the guide chains or groups the site with layers the model did not
        run (before it, for a chain).
    """
    layer = layers[name]
    shape = (layer.out_dim, layer.inducing_inputs.shape[0])
    P, M = shape
    if locations:
        q = site_posterior(guide_site, shape, structured=False)
        p = gaussian_parameters(model_site["fn"], shape)
        if q is None or p is None:
            return None
        p_loc, p_scale = p
        if isinstance(q, JointBlock):
            return _dense_kl(q.loc - p_loc.reshape(-1), q.scale_tril, [(p_scale[0], M)] * P)
        assert not isinstance(q, ChainLink)  # structured=False: (loc, scale) or a JointBlock
        # the site's prior factor is its layer's (a locations layer, or a global layer beside
        # them, whitened or not)
        return _layer_prior_kl(layer, q[0] - p_loc, q[1])
    q = posterior if posterior is not None else site_posterior(guide_site, shape)
    if q is None:
        return None
    prior_mean = layer.prior_mean
    assert prior_mean is not None  # gp_layer gives every layer its prior mean
    if isinstance(q, ChainLink):
        return _chain_link_kl(name, q, prior_mean, layer, chain_factors, objective)
    if isinstance(q, JointBlock):
        if name != q.sites[0]:
            return jnp.zeros((), q.loc.dtype)  # the group's KL was counted at its first site
        missing = [s for s in q.sites if s not in layers]
        if missing:
            raise ValueError(
                f"{objective}: the guide's joint Gaussian covers {missing}, which the model did "
                "not run"
            )
        blocks = []
        for s, (Ps, Ms) in zip(q.sites, q.shapes):
            blocks += [(_prior_chol(layers[s]), Ms)] * Ps
        return _dense_kl(q.loc, q.scale_tril, blocks)
    return _layer_prior_kl(layer, q[0] - prior_mean, q[1])


def _chain_link_kl(
    name: str, q: ChainLink, mean: jax.Array, layer: Layer, chain_factors: dict, objective: str
) -> jax.Array:
    """One link's term of the chain decomposition of the KL (:func:`inducing_kl`) against the
    layer's prior (``mean``, its prior mean, and its factor); its factor in the guide's draws,
    ``(cross, own)``, is recorded in ``chain_factors`` for its child."""
    cross = None
    if q.parent is not None:
        if q.parent not in chain_factors:
            raise ValueError(
                f"{objective}: the guide chains {name!r} to {q.parent!r}, which the model did not "
                "run before it"
            )
        assert q.coupling is not None  # a chain factor with a parent has its coupling
        parent_cross, parent_own = chain_factors[q.parent]
        cross = chain_cross(q.coupling, parent_own, parent_cross)
    chain_factors[name] = (cross, q.scale_tril)
    return chain_gauss_kl_term(
        q.mean - mean, q.scale_tril, cross=cross, prior_chol=_prior_chol(layer)
    )


def objective_terms(
    run: MarginalRun, objective: str = "DGPElbo"
) -> tuple[dict[str, dict], jax.Array | float, jax.Array | float]:
    """The pieces of a bound from one :func:`marginal_trace` run.

    :param run: the run.
    :param objective: the objective's name (``"DGPElbo"``, ``"PredictiveObjective"`` or
        ``"NestedCompressionElbo"``), named in error messages.
    :return: ``(observed, kl, other)``: the observed sites ``{name: site}`` (log-densities
        still to be taken), the closed-form KL of the inducing sites (scaled by their plates),
        and ``log p - log q`` of the other latent sites (sampled, as in ``Trace_ELBO``).
    :raises ValueError: for a latent site the guide does not cover, or one after the last
        layer; for a site the guide draws through an auxiliary site whose density this
        objective does not score; for a point-mass ``q(u)`` under ``PredictiveObjective``.
    """
    guide_trace, model_trace, weights = run.guide_trace, run.model_trace, run.node_weights
    mixture = run.mixture_log_weights
    layers = layers_by_u_site(model_trace)
    locations = any(layer.inducing == "locations" for layer in layers.values())
    observed = {}
    kl: jax.Array | float = 0.0  # 0.0 where the model has no such site
    other: jax.Array | float = 0.0
    chain_factors: dict[str, tuple[jax.Array | None, jax.Array]] = {}
    for name, site in model_trace.items():
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            observed[name] = site
            continue
        if get_tag(site, IMPORTANCE_LOG_WEIGHTS) is not None:
            continue  # a latent input drawn K times: weighted inside the importance-weighted bound
        scale = site["scale"] if site["scale"] is not None else 1.0
        local_kl = get_tag(site, LOCAL_KL)
        if local_kl is not None:
            # per-point KLs of per-point inducing sets (mixture axis first under rule AR1)
            kl = kl + jnp.sum(scale * _reduce_mixture(local_kl, site, mixture))
            continue
        site_kl = None
        if name in layers and name in guide_trace:
            posterior = run.posteriors.get(name)  # read off the guide's site for locations
            q_site = guide_trace[name]
            site_kl = inducing_kl(
                name, site, q_site, layers, locations, chain_factors, posterior, objective
            )
        if site_kl is not None:
            kl = kl + scale * site_kl
        else:
            _check_other_site(name, site, guide_trace, name in layers, objective, run.guide_name)
            log_q = weighted_log_prob(guide_trace[name], weights, mixture)
            other = other + weighted_log_prob(site, weights, mixture) - log_q
    return observed, kl, other


def _check_other_site(
    name: str, site: dict, guide_trace: dict, inducing: bool, objective: str, guide_name: str
) -> None:
    """Refuse a latent site scored by its sampled value (``log p - log q``) that comes after the
    last layer, that the guide does not cover, or whose sampled score would be wrong.

    A guide that draws the site as a ``Delta`` of an auxiliary draw (NumPyro's
    ``AutoContinuous`` family) keeps the density on the auxiliary site, which these objectives
    do not score: ``log q`` would be missing. A ``Delta`` without auxiliary sites is a point
    estimate (``AutoDelta``): ``DGPElbo`` then gives NumPyro's MAP objective, as
    ``Trace_ELBO`` does; ``PredictiveObjective``'s KL to the prior has no value for it.

    :raises ValueError: naming the site.
    """
    if get_tag(site, NODE_AXIS):
        raise ValueError(
            f"{objective}: latent site {name!r} comes after the last GP layer; "
            "only observed sites may depend on the last layer's output. Use Trace_ELBO."
        )
    if name not in guide_trace:
        raise ValueError(f"{objective}: latent site {name!r} is not covered by the guide")
    if not isinstance(unwrap_distribution(guide_trace[name]["fn"]), dist.Delta):
        return
    auxiliary = [
        n
        for n, s in guide_trace.items()
        if s["type"] == "sample"
        and (s.get("infer") or {}).get("is_auxiliary")
        and not hasattr(getattr(s["fn"], "posterior", None), "mixture")  # an encoder's site
    ]
    if auxiliary:
        raise ValueError(
            f"{objective} with {guide_name}: site {name!r} is drawn through the auxiliary site(s) "
            f"{auxiliary}, whose density {objective} does not score, so its value would be wrong. "
            "Use NumPyro's Trace_ELBO with this guide, or a guide with a Gaussian over the "
            "inducing values and its own guide for other latent sites "
            "(numpyro_dgp.guides.AutoFactorizedDGP, AutoJointDGP, AutoChainDGP, NumPyro's "
            "AutoNormal)"
        )
    if inducing and objective == "PredictiveObjective":
        raise ValueError(
            f"PredictiveObjective with {guide_name}: q({name}) is a point mass, whose KL to the "
            "prior is infinite. Use a Gaussian guide (numpyro_dgp.guides.AutoFactorizedDGP, "
            "NumPyro's AutoNormal), or DGPElbo / Trace_ELBO, which give the MAP objective for a "
            "point mass"
        )


def expected_log_prob(site: dict, run: MarginalRun, objective: str) -> jax.Array:
    """``E_f[log p(y | f)]`` of an observed site per point, without its plate scale: its batch
    shape with the last layer's node axis averaged out, then the branch axis with the run's
    ``mixture_log_weights`` if it branched: in closed form where its likelihood has one
    (:func:`~numpyro_dgp._engine.observation.closed_form_log_prob`), else the node-weighted
    log-density (quadrature or Monte Carlo)."""
    last = run.layer_order[-1] if run.layer_order else None
    lp = closed_form_log_prob(site, run.last_output, run.moments.get(last), run.correlated_outputs)
    if lp is None:
        refuse_without_closed_form(site, objective)
        return _node_average(site, run.node_weights, run.mixture_log_weights)
    return _reduce_mixture(lp, site, run.mixture_log_weights)


def refuse_without_closed_form(site: dict, objective: str) -> None:
    """A likelihood that is piecewise constant in ``f`` (the robust max) has no gradient at
    nodes: without its closed form the objective would silently stop training the layers."""
    base = unwrap(site["fn"]).base
    if get_tag(site, NODE_AXIS) and getattr(base, "requires_closed_form", False):
        raise ValueError(
            f"{objective}: observation site {site['name']!r} "
            f"({type(base).__name__}) is piecewise constant in the last layer, "
            "so it trains only through its closed form, which needs the layer's whole output "
            "(robust_max(f), not a slice of it) and an independent Gaussian per layer "
            "(AutoFactorizedDGP, AutoNormal; not a guide that correlates the layers); "
            "PredictiveObjective does not take it"
        )


class MarginalObjective(Objective):
    """An objective on runs of the engine with the inducing values marginalized
    (:func:`~numpyro_dgp._engine.run.marginal_trace`): its particle, quadrature and
    likelihood-sample options, checked once here, and one run's terms."""

    _name: str  # the objective's name, in messages
    correlated = "exact"  # how a guide that correlates the layers is integrated (DGPElbo's option)

    def __init__(
        self,
        num_particles: int = 1,
        num_quadrature: int | None = None,
        num_likelihood_samples: int = 32,
    ) -> None:
        check_positive_int(num_particles, "num_particles", self._name)
        check_positive_int(num_likelihood_samples, "num_likelihood_samples", self._name)
        check_positive_int(num_quadrature, "num_quadrature", self._name, allow_none=True)
        self.num_quadrature = num_quadrature
        self.num_likelihood_samples = int(num_likelihood_samples)
        super().__init__(num_particles=num_particles)

    def _run(
        self, call: Call, importance: Any = None
    ) -> tuple[MarginalRun, dict[str, dict], jax.Array | float, jax.Array | float]:
        """One run at ``call`` and its :func:`objective_terms`: ``(run, observed, kl, other)``."""
        rule = (self.num_quadrature, self._name, self.num_likelihood_samples, importance)
        run = marginal_trace(*call, *rule, correlated=self.correlated)
        return (run, *objective_terms(run, self._name))


class DGPElbo(MarginalObjective):
    """The DSVI evidence lower bound with the inducing values marginalized analytically.

    For every layer whose inducing site the guide covers with a Gaussian (``AutoFactorizedDGP``,
    ``AutoNormal``, ...), the layer output is drawn from ``q(f_l | f_{l-1})`` point by point
    instead of through a sampled ``u_l``. Guides that correlate layers (``AutoChainDGP``,
    ``AutoJointDGP``) get the exact per-point recursion by default (each point's sampled outputs
    condition its belief over the guide's draws of the later layers' inducing values; the chain
    functions of :mod:`numpyro_dgp.core`), or the sampled estimator (``correlated``). With
    ``inducing="locations"`` the inner layers run on sampled inducing values (they are the next
    layer's inputs) and the last layer is marginalized given them. KLs are computed in closed
    form (given the sampled locations, for inducing locations); the expectation of the
    likelihood over the last layer's marginal as below.
    Other latent sites (hyperparameters with priors) are estimated by sampling as in
    ``Trace_ELBO``.

    The bound is the same as ``Trace_ELBO``'s on the same model and guide; only the
    estimator's variance is lower.

    The expectation of the log-likelihood over the last layer's marginal is taken in closed
    form where the likelihood gives one (:mod:`numpyro_dgp.likelihoods`: Poisson, heteroscedastic
    Gaussian, robust max), by Gauss-Hermite quadrature for one output, exactly for Gaussian
    likelihoods over several outputs (``2 P`` nodes), and by Monte Carlo draws otherwise (e.g. a
    softmax over ``C`` outputs).

    :param num_particles: Monte Carlo samples of the inner layers per step.
    :param num_quadrature: quadrature nodes per output of the last layer (default: 20
        Gauss-Hermite nodes for one output; several outputs: see above). Given with several
        outputs, a tensor-product rule with this many nodes per output.
    :param num_likelihood_samples: Monte Carlo draws of the last layer's outputs per point, where
        the expectation is sampled.
    :param correlated: how a guide that correlates the layers (``AutoJointDGP``,
        ``AutoChainDGP``, NumPyro's ``AutoMultivariateNormal``) is integrated: ``"exact"``, each
        point's own recursion (cost per layer ``O(N P M K)`` for the ``K`` inducing values it
        depends on), or ``"sampled"``, the guide's inducing values drawn once per particle and
        shared by the points, each layer no later layer depends on marginalized given them
        (Ustyuzhaninov et al. 2020's estimator (a) with the last layer integrated out: DSVI's
        cost per point, a noisier estimate; NumPyro's ``AutoMultivariateNormal`` declares no
        conditional Gaussian, so all its layers are sampled). The same bound either way; which
        gives more per second depends on the guide and the sizes (``docs/limitations.md``);
        guides that do not correlate layers ignore it.
    :raises ValueError: if ``num_particles``, ``num_likelihood_samples`` or a given
        ``num_quadrature`` is not a positive integer, or ``correlated`` is neither
        ``"exact"`` nor ``"sampled"``.
    """

    _name = "DGPElbo"

    def __init__(
        self,
        num_particles: int = 1,
        num_quadrature: int | None = None,
        num_likelihood_samples: int = 32,
        correlated: str = "exact",
    ) -> None:
        check_choice(correlated, ("exact", "sampled"), "correlated", "DGPElbo")
        self.correlated = correlated
        super().__init__(num_particles, num_quadrature, num_likelihood_samples)

    def _terms(self, call: Call) -> dict[str, jax.Array | float]:
        """One-particle ELBO split into its parts.

        :return: ``{"expected_log_likelihood", "kl_inducing", "other"}``; the ELBO is
            ``expected_log_likelihood - kl_inducing + other``.
        """
        run, observed, kl, other = self._run(call)
        ell = sum(
            _scaled_sum(site, expected_log_prob(site, run, self._name))
            for site in observed.values()
        )
        return {"expected_log_likelihood": ell, "kl_inducing": kl, "other": other}

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """``expected_log_likelihood - kl_inducing + other``."""
        return parts["expected_log_likelihood"] - parts["kl_inducing"] + parts["other"]


def _log_predictive(site: dict, run: MarginalRun) -> tuple[jax.Array, ArrayLike]:
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
    weights = run.node_weights
    if not has_node_axis(site, lp, weights):
        return lp, scale
    refuse_without_closed_form(site, "PredictiveObjective")
    parts = unwrap(fn)
    if observation_kind(fn, site["name"], "PredictiveObjective") == "normal":
        loc = jnp.broadcast_to(parts.base.loc, parts.shape)
        w = _leading(weights, loc)
        mean = jnp.sum(w * loc, axis=0)
        var = (
            jnp.sum(w * (loc - mean) ** 2, axis=0)
            + jnp.broadcast_to(parts.base.scale, parts.shape)[0] ** 2
        )
        lp = masked_log_prob(parts, value, dist.Normal(mean, jnp.sqrt(var)).log_prob)
    else:
        lp = logsumexp(lp, axis=0, b=_leading(weights, lp))
    mixture = run.mixture_log_weights
    if mixture is not None and _branched(lp, site, mixture):
        lp = _log_mix(lp, jax.nn.log_softmax(mixture))
    return lp, scale


class PredictiveObjective(MarginalObjective):
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

    _name = "PredictiveObjective"

    def __init__(
        self,
        num_particles: int = 8,
        beta: float = 1.0,
        num_quadrature: int | None = None,
        particle_weights: ArrayLike | None = None,
        num_likelihood_samples: int = 32,
    ) -> None:
        super().__init__(num_particles, num_quadrature, num_likelihood_samples)
        if not (float(beta) >= 0):
            raise ValueError(f"PredictiveObjective: beta must be >= 0, got {beta}")
        if particle_weights is not None:
            w = np.asarray(particle_weights, float)
            if w.shape != (int(num_particles),) or np.any(w < 0) or not np.isclose(w.sum(), 1.0):
                raise ValueError(
                    "PredictiveObjective: particle_weights must be num_particles non-negative "
                    f"weights summing to 1, got {particle_weights!r}"
                )
        self.beta = float(beta)
        self.particle_weights = particle_weights

    def _terms(self, call: Call) -> dict[str, jax.Array | float]:
        """The objective's parts over ``num_particles`` particles.

        :return: ``{"log_predictive", "kl_inducing", "other"}``; the objective is
            ``log_predictive - beta (kl_inducing - other)``.
        """

        def one(key):
            run, observed, kl, other = self._run(call._replace(rng_key=key))
            per_point = {}
            for name, site in observed.items():
                lp, scale = _log_predictive(site, run)
                per_point[name] = (lp, jnp.asarray(scale, lp.dtype))
            return per_point, kl, other

        keys = jax.random.split(call.rng_key, self.num_particles)
        per_point, kl, other = jax.vmap(one)(keys)
        if self.particle_weights is None:
            log_w = jnp.full((self.num_particles,), -np.log(self.num_particles))
            kl, other = jnp.mean(kl), jnp.mean(other)
        else:
            weights = jnp.asarray(self.particle_weights)
            log_w = jnp.log(weights)
            kl, other = weights @ kl, weights @ other
        total = 0.0
        for lp, scale in per_point.values():  # lp (S, batch...), scale (S,) (the same for all)
            total = total + scale[0] * jnp.sum(_log_mix(lp, log_w))
        return {"log_predictive": total, "kl_inducing": kl, "other": other}

    def average_particles(
        self, one_particle: Callable[[jax.Array], jax.Array], rng_key: jax.Array
    ) -> jax.Array:
        """The objective at ``rng_key``: :meth:`components` draws the particles."""
        return one_particle(rng_key)

    def combine(self, parts: dict[str, Any]) -> jax.Array:
        """``log_predictive - beta (kl_inducing - other)``."""
        return parts["log_predictive"] - self.beta * (parts["kl_inducing"] - parts["other"])
