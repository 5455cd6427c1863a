"""Objectives that use the Gaussian a guide exposes over each layer's inducing values."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer.elbo import ELBO

from jax.scipy.linalg import block_diag
from jax.scipy.special import logsumexp

from numpyro_dgp.core import gauss_hermite, gauss_hermite_product, gauss_kl
from numpyro_dgp.core.chain import block_diag_covariance, chain_gauss_kl_term
from numpyro_dgp.handlers import (
    AmortizedPosterior,
    ChainLink,
    JointBlock,
    fast_subsample,
    gaussian_parameters,
    marginalise_inducing,
    site_gaussian,
)

__all__ = [
    "DGPElbo",
    "MarginalRun",
    "PredictiveObjective",
    "final_layer_name",
    "guide_posteriors",
    "marginal_trace",
    "quadrature_rule",
]


def guide_posteriors(guide_trace, model_u_sites, structured: bool = True):
    """The guide's Gaussian over every inducing site it samples.

    :param guide_trace: a trace of the guide.
    :param model_u_sites: ``{u-site name: value shape (P, M)}`` from the model.
    :param structured: use the structure a guide declares in ``infer["dgp_gaussian"]``
        (:class:`~numpyro_dgp.handlers.ChainLink`, :class:`~numpyro_dgp.handlers.JointBlock`:
        the marginal over the layers); otherwise read each site's distribution as it is (for
        a chain or joint guide that is the Gaussian *given* the sampled earlier layers).
    :return: ``{u-site name: posterior}`` for the sites whose guide distribution is Gaussian
        over the inducing values (others are left to sampling).
    """
    out = {}
    for name, shape in model_u_sites.items():
        site = guide_trace.get(name)
        if site is None or site["type"] != "sample":
            continue
        params = site_posterior(site, shape, structured)
        if params is not None:
            out[name] = params
    return out


def site_posterior(site, shape, structured: bool = True):
    """A guide site's Gaussian over its ``(P, M)`` inducing values: the structure it declares
    (``infer["dgp_gaussian"]``) if ``structured``, else its Gaussian given the earlier
    samples (``infer["dgp_conditional"]``, or the site distribution itself); ``None`` if
    neither is Gaussian."""
    infer = site.get("infer") or {}
    if structured and infer.get("dgp_gaussian") is not None:
        return infer["dgp_gaussian"]
    if infer.get("dgp_conditional") is not None:
        return infer["dgp_conditional"]
    return site_gaussian(site["name"], site["fn"], shape)


def quadrature_rule(out_dim: int, num_quadrature: int | None = None):
    """Nodes ``(K, P)`` and weights ``(K,)`` for the last layer's ``P``-dimensional marginal.

    One output: ``num_quadrature`` (default 20) Gauss-Hermite nodes. Several outputs: the
    tensor-product rule with ``num_quadrature`` (default 3) nodes per output. Both are exact
    for a Gaussian likelihood whose location is affine in the layer output (a quadratic
    log density needs degree 2, i.e. 2 nodes per axis).
    """
    if num_quadrature is None:
        num_quadrature = 20 if out_dim == 1 else 3
    if num_quadrature**out_dim > 20_000:
        raise ValueError(
            f"DGPElbo: a tensor-product rule with num_quadrature={num_quadrature} over "
            f"{out_dim} outputs has {num_quadrature ** out_dim} nodes; lower num_quadrature"
        )
    if out_dim == 1:
        nodes, weights = gauss_hermite(num_quadrature)
        return nodes[:, None], weights
    return gauss_hermite_product(num_quadrature, out_dim)


def layers_by_u_site(model_trace):
    """``{u-site name: Layer}`` from the ``"dgp_layer"`` messages of a model trace.

    (The ``infer`` tags of the ``u`` sites cannot be used: ``replay`` overwrites them with
    the guide's.)
    """
    return {s["args"][0].u_site: s["args"][0] for s in model_trace.values() if s["type"] == "dgp_layer"}


def uses_inducing_locations(model_trace) -> bool:
    """Whether any ``gp_layer`` of the trace has ``inducing="locations"``."""
    return any(layer.inducing == "locations" for layer in layers_by_u_site(model_trace).values())


def _model_u_sites(model_trace):
    return {
        name: (layer.out_dim, layer.inducing_inputs.shape[0])
        for name, layer in layers_by_u_site(model_trace).items()
    }


def final_layer_name(model_trace):
    """Name of the last ``gp_layer`` run in ``model_trace`` (execution order)."""
    names = [s["args"][0].name for s in model_trace.values() if s["type"] == "dgp_layer"]
    if not names:
        raise ValueError(
            "the model has no gp_layer: DGPElbo and predict need a model built with numpyro_dgp.gp_layer"
        )
    return names[-1]


class MarginalRun(NamedTuple):
    """A guide trace and the model trace run under :class:`marginalise_inducing`."""

    guide_trace: dict
    model_trace: dict
    posteriors: dict
    moments: dict
    layer_order: list
    quadrature_weights: np.ndarray
    branch_log_weights: jax.Array | None = None


def marginal_trace(model, guide, params, rng_key, args, kwargs, num_quadrature=None):
    """Run ``guide`` then ``model`` with inducing values marginalised and quadrature nodes on
    the last layer (see :class:`numpyro_dgp.handlers.marginalise_inducing`).

    :return: :class:`MarginalRun`.
    """
    with _validation_off_when_traced(params):
        return _marginal_trace(model, guide, params, rng_key, args, kwargs, num_quadrature)


def _validation_off_when_traced(params):
    """NumPyro's argument checks cannot act on traced values (a traced check is skipped, and
    the compiler drops it), yet tracing them costs about 0.2 s of every
    compilation of a DGP step; they stay on in eager runs (``svi.init`` runs the model so)."""
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(params))
    return numpyro.validation_enabled(False) if traced else contextlib.nullcontext()


def _marginal_trace(model, guide, params, rng_key, args, kwargs, num_quadrature):
    guide_key, model_key = jax.random.split(rng_key)
    seeded_guide = substitute(seed(fast_subsample(guide), guide_key), data=params)
    guide_trace = trace(seeded_guide).get_trace(*args, **kwargs)
    seeded_model = substitute(replay(seed(fast_subsample(model), model_key), guide_trace), data=params)

    # Which sites are inducing values and which layer is last: an abstract first pass
    # (jax.eval_shape), so it adds nothing to the compiled computation.
    found = {}

    def probe():
        tr = trace(marginalise_inducing(seeded_model)).get_trace(*args, **kwargs)
        last = final_layer_name(tr)
        found["u_sites"] = _model_u_sites(tr)
        found["last"] = last
        found["out_dim"] = tr[f"{last}.layer"]["args"][0].out_dim
        found["locations"] = uses_inducing_locations(tr)
        found["last_u_site"] = tr[f"{last}.layer"]["args"][0].u_site
        return 0

    # closing over args keeps static ones (subsample sizes) concrete
    jax.eval_shape(probe)
    last = found["last"]
    nodes, weights = quadrature_rule(found["out_dim"], num_quadrature)

    if found["locations"]:
        # Layer l's inducing inputs are layer l-1's inducing values: those must be the very
        # samples every point is propagated with, so the inner layers run on sampled u and only
        # the last layer is marginalised, given the samples (its guide site's own Gaussian).
        last_u = found["last_u_site"]
        posteriors = guide_posteriors(guide_trace, {last_u: found["u_sites"][last_u]}, structured=False)
    else:
        posteriors = guide_posteriors(guide_trace, found["u_sites"])
    posteriors.update(amortized_posteriors(guide_trace))
    handler = marginalise_inducing(
        seeded_model,
        posteriors=posteriors,
        quadrature_layer=last,
        quadrature_nodes=nodes,
        quadrature_weights=weights,
    )
    model_trace = trace(handler).get_trace(*args, **kwargs)
    return MarginalRun(
        guide_trace, model_trace, posteriors, handler.moments, handler.layer_order, weights, handler.branch_log_weights
    )


def amortized_posteriors(guide_trace):
    """``{u-site: AmortizedPosterior}`` from the placeholder sites of an amortized guide
    (:class:`numpyro_dgp.guides.AutoAmortizedDGP`)."""
    return {
        site["fn"].site: site["fn"].posterior
        for site in guide_trace.values()
        if site["type"] == "sample" and isinstance(getattr(site["fn"], "posterior", None), AmortizedPosterior)
    }


def _reduce_branches(x, plate_ndim, branch_log_weights):
    """Average a leading branch axis of ``x`` with the branch weights, if it is there."""
    if branch_log_weights is None or jnp.ndim(x) <= plate_ndim or jnp.shape(x)[0] != branch_log_weights.shape[0]:
        return x
    return jnp.tensordot(jax.nn.softmax(branch_log_weights).astype(x.dtype), x, axes=(0, 0))


def _plate_ndim(site):
    return max([-f.dim for f in site["cond_indep_stack"]] + [0])


def _has_quadrature_axis(site, lp, weights):
    """Whether ``lp`` (a site's log-density) carries the last layer's quadrature axis in front:
    sites after the last layer do when they depend on its output; one that does not has no
    such axis."""
    if not site["infer"].get("dgp_quadrature"):
        return False
    batch_ndim = max([-f.dim for f in site["cond_indep_stack"]] + [len(site["fn"].batch_shape) - 1, 0])
    return jnp.ndim(lp) > batch_ndim and jnp.shape(lp)[0] == len(weights)


def _weighted_log_prob(site, weights, branch_log_weights=None):
    """Site log-density summed over its plates, averaging the quadrature axis and then the
    branch axis (:class:`numpyro_dgp.handlers.quadrature`, amortized guides) if present."""
    lp = site["fn"].log_prob(site["value"])
    if _has_quadrature_axis(site, lp, weights):
        lp = jnp.tensordot(jnp.asarray(weights, lp.dtype), lp, axes=(0, 0))
        lp = _reduce_branches(lp, _plate_ndim(site), branch_log_weights)
    if site["scale"] is not None:
        lp = site["scale"] * lp
    return jnp.sum(lp)


def _prior_chol(layer):
    return None if layer.whiten else layer.Kmm_chol


def _dense_kl(loc, scale_tril, prior_blocks):
    """``KL[N(loc, L L^T) || N(0, blockdiag(prior_blocks))]``; ``prior_blocks`` of ``None``
    stand for identity blocks (whitened)."""
    if all(b is None for b, _ in prior_blocks):
        return gauss_kl(loc[None], scale_tril[None])
    eye = lambda m: jnp.eye(m, dtype=loc.dtype)  # noqa: E731
    chol = block_diag(*[eye(m) if b is None else b for b, m in prior_blocks])
    return gauss_kl(loc[None], scale_tril[None], chol)


def inducing_kl(name, model_site, guide_site, layers, locations, marginal_covs):
    """Closed-form KL term of one inducing site, or ``None`` if the guide's site is not Gaussian.

    * global inducing points: the exact ``KL[q(u) || p(u)]`` for the guide's structure --
      per site for independent layers, the chain decomposition for a :class:`ChainLink`
      (``marginal_covs`` carries each link's marginal covariance to its child), the whole
      dense KL at the first site of a :class:`JointBlock` (zero at the others);
    * inducing locations: ``KL[q(u_l | earlier samples) || p(u_l | u_{l-1})]`` given the
      sampled earlier layers, whose expectation is the ELBO's KL (notes/compositional.md §4).
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
        return gauss_kl(q[0] - p_loc, q[1], p_scale[0])
    q = site_posterior(guide_site, shape)
    if q is None:
        return None
    prior_chol = _prior_chol(layer)
    if isinstance(q, ChainLink):
        cov = block_diag_covariance(q.scale_tril)
        if q.parent is not None:
            if q.parent not in marginal_covs:
                raise ValueError(f"DGPElbo: the guide chains {name!r} to {q.parent!r}, which the model did not run before it")
            cov = cov + q.coupling @ marginal_covs[q.parent] @ q.coupling.T
        marginal_covs[name] = cov
        return chain_gauss_kl_term(q.mean - layer.prior_mean, q.scale_tril, cov, prior_chol)
    if isinstance(q, JointBlock):
        if name != q.sites[0]:
            return jnp.zeros((), q.loc.dtype)  # the group's KL was counted at its first site
        missing = [s for s in q.sites if s not in layers]
        if missing:
            raise ValueError(f"DGPElbo: the guide's joint Gaussian covers {missing}, which the model did not run")
        blocks = []
        for s, (Ps, Ms) in zip(q.sites, q.shapes):
            blocks += [(_prior_chol(layers[s]), Ms)] * Ps
        return _dense_kl(q.loc, q.scale_tril, blocks)
    return gauss_kl(q[0] - layer.prior_mean, q[1], prior_chol)


def objective_terms(run: MarginalRun):
    """The pieces of a bound from one :func:`marginal_trace` run: the observed sites
    ``{name: site}`` (log-densities still to be taken), the closed-form KL of the inducing
    sites (scaled by their plates), and ``log p - log q`` of the other latent sites (sampled,
    as in ``Trace_ELBO``)."""
    guide_trace, model_trace, weights = run.guide_trace, run.model_trace, run.quadrature_weights
    layers = layers_by_u_site(model_trace)
    locations = uses_inducing_locations(model_trace)
    observed = {}
    kl = 0.0
    other = 0.0
    marginal_covs = {}
    for name, site in model_trace.items():
        if site["type"] != "sample":
            continue
        infer = site.get("infer") or {}
        if site["is_observed"]:
            observed[name] = site
            continue
        site_kl = None
        if infer.get("dgp_amortized_kl") is not None:
            # per-point KLs of an amortized layer (branch axis first under rule AR1)
            per_point = _reduce_branches(infer["dgp_amortized_kl"], _plate_ndim(site), run.branch_log_weights)
            scale = site["scale"] if site["scale"] is not None else 1.0
            kl = kl + jnp.sum(scale * per_point)
            continue
        if name in layers and name in guide_trace:
            site_kl = inducing_kl(name, site, guide_trace[name], layers, locations, marginal_covs)
        if site_kl is not None:
            kl = kl + (site["scale"] if site["scale"] is not None else 1.0) * site_kl
        else:
            if infer.get("dgp_quadrature"):
                raise ValueError(
                    f"DGPElbo: latent site {name!r} comes after the last GP layer; "
                    "only observed sites may depend on the last layer's output. Use Trace_ELBO."
                )
            if name not in guide_trace:
                raise ValueError(f"DGPElbo: latent site {name!r} is not covered by the guide")
            branch = run.branch_log_weights
            other = other + _weighted_log_prob(site, weights, branch) - _weighted_log_prob(guide_trace[name], weights, branch)
    return observed, kl, other


def _normal_inside(fn):
    """``(Normal, wrapped shape)`` if ``fn`` is a Normal inside ``Independent``/``expand``
    wrappers, else ``(None, None)``."""
    shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
    reinterpreted = 0
    while isinstance(fn, (dist.Independent, dist.ExpandedDistribution)):
        if isinstance(fn, dist.Independent):
            reinterpreted += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    return (fn, shape, reinterpreted) if isinstance(fn, dist.Normal) else (None, None, None)


def _log_predictive(site, weights, branch_log_weights=None):
    """Per-point ``log E[p(y | f)]`` of an observed site over the last layer's marginal, with
    the site's plate scale; shape: the site's batch shape. With branches (a leading branch
    axis after the quadrature axis), ``log sum_s w_s E[p(y | f_s)]``.

    A Normal site's location is taken as affine in the layer output (``Normal(f[..., 0], s)``):
    ``log N(y | E[loc], Var[loc] + s^2)`` with the node-weighted moments, exact then; other
    likelihoods: ``log sum_k w_k p(y | node_k)`` (Gauss-Hermite)."""
    scale = site["scale"] if site["scale"] is not None else 1.0
    fn, value = site["fn"], site["value"]
    lp = fn.log_prob(value)
    if not _has_quadrature_axis(site, lp, weights):
        return lp, scale
    normal, shape, reinterpreted = _normal_inside(fn)
    if normal is not None:
        loc = jnp.broadcast_to(normal.loc, shape)
        w = jnp.reshape(jnp.asarray(weights, loc.dtype), (-1,) + (1,) * (loc.ndim - 1))
        mean = jnp.sum(w * loc, axis=0)
        var = jnp.sum(w * (loc - mean) ** 2, axis=0) + jnp.broadcast_to(normal.scale, shape)[0] ** 2
        lp = dist.Normal(mean, jnp.sqrt(var)).log_prob(value)
        if reinterpreted:
            lp = jnp.sum(lp, axis=tuple(range(-reinterpreted, 0)))
    else:
        w = jnp.reshape(jnp.asarray(weights, lp.dtype), (-1,) + (1,) * (lp.ndim - 1))
        lp = logsumexp(lp, axis=0, b=w)
    if branch_log_weights is not None and lp.ndim > _plate_ndim(site) and lp.shape[0] == branch_log_weights.shape[0]:
        log_w = jax.nn.log_softmax(branch_log_weights).astype(lp.dtype)
        lp = logsumexp(lp + log_w.reshape((-1,) + (1,) * (lp.ndim - 1)), axis=0)
    return lp, scale


class DGPElbo(ELBO):
    """The DSVI evidence lower bound with the inducing values marginalised analytically.

    For every layer whose inducing site the guide covers with a Gaussian (``AutoFactorisedDGP``,
    ``AutoNormal``, ...), the layer output is drawn from ``q(f_l | f_{l-1})`` point by point
    instead of through a sampled ``u_l``. Guides that correlate layers (``AutoChainDGP``,
    ``AutoJointDGP``) get the exact per-point recursion (each point's sampled outputs condition
    the belief over the later layers' inducing values, notes/compositional.md §3b). With
    ``inducing="locations"`` the inner layers run on sampled inducing values (they are the next
    layer's inputs) and the last layer is marginalised given them. KLs are computed in closed
    form (given the sampled locations, for inducing locations);
    and the expectation of the likelihood over the last layer's marginal is taken by
    Gauss-Hermite quadrature (exact for Gaussian likelihoods). Other latent sites
    (hyperparameters with priors) are estimated by sampling as in ``Trace_ELBO``.

    The bound is the same as ``Trace_ELBO``'s on the same model and guide; only the
    estimator's variance is lower.

    :param num_particles: Monte Carlo samples of the inner layers per step.
    :param num_quadrature: quadrature nodes per output of the last layer (see
        :func:`quadrature_rule`).
    :param vectorize_particles: ``jax.vmap`` over particles (else ``lax.map``).
    """

    def __init__(self, num_particles: int = 1, num_quadrature: int | None = None, vectorize_particles: bool = True):
        if int(num_particles) < 1:
            raise ValueError(f"DGPElbo: num_particles must be >= 1, got {num_particles}")
        self.num_quadrature = num_quadrature
        super().__init__(num_particles=num_particles, vectorize_particles=vectorize_particles)

    def elbo_components(self, rng_key, param_map, model, guide, *args, **kwargs):
        """One-particle ELBO split into ``{"expected_log_likelihood", "kl_inducing", "other"}``."""
        run = marginal_trace(model, guide, param_map, rng_key, args, kwargs, self.num_quadrature)
        observed, kl, other = objective_terms(run)
        ell = sum(
            _weighted_log_prob(site, run.quadrature_weights, run.branch_log_weights) for site in observed.values()
        )
        return {"expected_log_likelihood": ell, "kl_inducing": kl, "other": other}

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        def single_particle_elbo(key):
            parts = self.elbo_components(key, param_map, model, guide, *args, **kwargs)
            return parts["expected_log_likelihood"] - parts["kl_inducing"] + parts["other"]

        if self.num_particles == 1:
            elbo = single_particle_elbo(rng_key)
        else:
            keys = jax.random.split(rng_key, self.num_particles)
            elbo = jnp.mean(self.vectorize_particles_fn(single_particle_elbo, keys))
        return {"loss": -elbo, "mutable_state": None}



class PredictiveObjective(ELBO):
    """The predictive (DSPP / PPGPR) objective of Jankowiak et al. (2020), AR2PP in paper 003.

    ``sum_n log sum_s w_s p(y_n | x_n, s) - beta KL``, where particle ``s`` propagates the
    inputs through the inner layers (as :class:`DGPElbo` does, inducing values marginalised)
    and ``p(y_n | x_n, s) = E[p(y_n | f_L)]`` over the last layer's Gaussian marginal
    (Gauss-Hermite; for a Normal likelihood whose location is affine in the last layer, the
    exact ``N(y | m_s, v_s + noise)`` from the nodes' moments). The ``log`` sits
    outside the mixture over particles and the likelihood expectation, unlike the ELBO's
    ``E log``: it scores the predictive distribution directly and is no lower bound on the
    evidence. The KL terms (closed form, averaged over particles) act as a regulariser of
    weight ``beta``; latent sites other than inducing values (hyperparameter priors) enter
    as ``log p - log q`` like in ``Trace_ELBO``, also weighted by ``beta``.

    Plate subsampling rescales each point's log predictive by ``N / B``.

    :param num_particles: ``S`` propagated samples of the inner layers per step.
    :param beta: KL weight (paper 003 uses 1).
    :param num_quadrature: Gauss-Hermite nodes per output of the last layer (see
        :func:`quadrature_rule`).
    :param particle_weights: ``(S,)`` mixture weights ``w_s`` (default ``1/S``), e.g. the
        weights of a quadrature rule over a guide's sample space.
    """

    def __init__(self, num_particles: int = 8, beta: float = 1.0, num_quadrature: int | None = None,
                 particle_weights=None):
        if int(num_particles) < 1:
            raise ValueError(f"PredictiveObjective: num_particles must be >= 1, got {num_particles}")
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
        self.num_quadrature = num_quadrature
        self.particle_weights = particle_weights
        super().__init__(num_particles=num_particles, vectorize_particles=True)

    def components(self, rng_key, param_map, model, guide, *args, **kwargs):
        """``{"log_predictive", "kl_inducing", "other"}``: the objective is
        ``log_predictive - beta (kl_inducing - other)``."""

        def one(key):
            run = marginal_trace(model, guide, param_map, key, args, kwargs, self.num_quadrature)
            observed, kl, other = objective_terms(run)
            per_point = {}
            for name, site in observed.items():
                lp, scale = _log_predictive(site, run.quadrature_weights, run.branch_log_weights)
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
            mixture = logsumexp(lp + jnp.reshape(log_w.astype(lp.dtype), (-1,) + (1,) * (lp.ndim - 1)), axis=0)
            total = total + scale[0] * jnp.sum(mixture)
        if self.particle_weights is None:
            kl, other = jnp.mean(kl), jnp.mean(other)
        else:
            weights = jnp.asarray(self.particle_weights)
            kl, other = weights @ kl, weights @ other
        return {"log_predictive": total, "kl_inducing": kl, "other": other}

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        parts = self.components(rng_key, param_map, model, guide, *args, **kwargs)
        objective = parts["log_predictive"] - self.beta * (parts["kl_inducing"] - parts["other"])
        return {"loss": -objective, "mutable_state": None}
