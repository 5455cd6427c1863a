"""Guides that correlate the inducing values of different layers (Ustyuzhaninov et al. 2020,
Sec. 4.1).

* :class:`AutoJointDGP` -- one Gaussian over the inducing values of all layers (full
  ``D x D`` covariance, ``D = sum_l P_l M_l``).
* :class:`AutoChainDGP` -- ``q(u_1) prod_l q(u_l | u_{l-1})``: a block-tridiagonal precision
  with parameters linear in the number of layers.

Both sample ``u`` jointly with exact log-densities, so NumPyro's own ELBOs work
(``Trace_ELBO`` is estimator (a) of Ustyuzhaninov et al. (2020): sample ``u`` jointly,
propagate conditionally). Each site also declares the structure (its ``infer`` entry
:data:`~numpyro_dgp._protocol.GAUSSIAN`: :class:`~numpyro_dgp.posteriors.JointBlock` /
:class:`~numpyro_dgp.posteriors.ChainLink`), from which :class:`numpyro_dgp.DGPElbo`
marginalizes the inducing values exactly, point by point, with closed-form KLs.

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
"""

from __future__ import annotations

import os
import warnings
from functools import cache
from itertools import accumulate
from typing import Any

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.scipy.linalg import block_diag

from numpyro_dgp._compat import softplus_lower_cholesky
from numpyro_dgp._protocol import CONDITIONAL, GAUSSIAN
from numpyro_dgp.core import (
    Belief,
    block_diag_covariance,
    chain_cross,
    condition_on_output,
    output_moments,
    point_projection,
    sample_output,
)
from numpyro_dgp.guides._base import AutoFactorizedDGP, DGPGuide, InducingSite
from numpyro_dgp.layers import Layer
from numpyro_dgp.posteriors import ChainLink, JointBlock


class AutoJointDGP(DGPGuide):
    """One multivariate normal over the inducing values of every layer (Ustyuzhaninov et al. 2020,
    Sec. 4.1a).

    ``q(vec(u_1), ..., vec(u_L)) = N(loc, L L^T)`` with a full lower-triangular ``L``
    (softplus diagonal). Initialized with zero cross-layer covariance, i.e. exactly the
    factorized guide (:class:`~numpyro_dgp.guides.AutoFactorizedDGP`) with the same
    ``inner_init``. Cost ``O(D^3)`` for the KL and ``O(N D^2)`` per step for the exact
    marginalization, ``D = sum_l P_l M_l``.

    :param model: a model built with :func:`numpyro_dgp.gp_layer`.
    :param inner_init: ``"deterministic"`` (inner layers start at ``init_scale`` times their
        prior factor, the DSVI convention) or ``"prior"``.
    :param init_scale: the factor for ``"deterministic"``.
    :param prefix: parameters are ``"<prefix>_joint_loc"`` and ``"<prefix>_joint_scale_tril"``.
    """

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        super()._setup_prototype(*args, **kwargs)
        _warn_if_slow(self, own_dense=True)

    def _q(
        self, rng_key: jax.Array | None, args: tuple, kwargs: dict
    ) -> tuple[jax.Array, jax.Array]:
        sites = self.inducing_sites

        @cache  # computed once, when the first parameter is created
        def prior_moments():
            return [self._prior_moments(s, rng_key, args, kwargs) for s in sites]

        def init_loc():
            return jnp.concatenate([loc.reshape(-1) for loc, _ in prior_moments()])

        def init_tril():
            blocks = [
                block_diag(*self._initial_scale_tril(s, tril))
                for s, (_, tril) in zip(sites, prior_moments())
            ]
            return block_diag(*blocks)

        loc = self._lazy_param(f"{self.prefix}_joint_loc", init_loc)
        tril = self._lazy_param(
            f"{self.prefix}_joint_scale_tril", init_tril, constraint=softplus_lower_cholesky
        )
        return loc, tril

    def _sample_inducing(self, rng_key: jax.Array | None, args: tuple, kwargs: dict) -> dict:
        result = {}
        loc, tril = self._q(rng_key, args, kwargs)
        block = JointBlock(
            tuple(s.name for s in self.inducing_sites),
            tuple((s.out_dim, s.num_inducing) for s in self.inducing_sites),
            loc,
            tril,
        )
        # One standard-normal draw for all layers, u = loc + L z, and each site a Delta with the
        # log-density of its block (-log|L_kk|): the exact log q(u) without ever solving with
        # L, which becomes badly conditioned when a near-deterministic layer (1e-5 start) grows
        # cross-layer terms. The conditional N(loc_k + L[k, <k] z_<k, L_kk L_kk^T) of each block
        # given the earlier ones is declared for DGPElbo (inducing locations).
        z = _standard_normal(f"_{self.prefix}_joint_std_normal", loc)
        for site, block_slice in self._blocks():
            factor = tril[block_slice, block_slice]
            start = block_slice.start
            cond_loc = loc[block_slice] + tril[block_slice, :start] @ z[:start]
            value = (cond_loc + factor @ z[block_slice]).reshape(site.out_dim, site.num_inducing)
            conditional = JointBlock(
                (site.name,), ((site.out_dim, site.num_inducing),), cond_loc, factor
            )
            result[site.name] = _delta_site(site.name, value, factor, block, conditional)
        return result

    def covariance(self, params: dict) -> jax.Array:
        """The full covariance over all inducing values.

        :param params: the guide's parameter values.
        :return: ``(D, D)`` covariance, blocks in layer order.
        """
        tril = params[f"{self.prefix}_joint_scale_tril"]
        return tril @ tril.T

    def _blocks(self) -> list[tuple[InducingSite, slice]]:
        """Each inducing site with its slice of the joint vector, in layer order."""
        ends = accumulate(site.size for site in self.inducing_sites)
        return [(site, slice(end - site.size, end)) for site, end in zip(self.inducing_sites, ends)]

    def _locs(self, params: dict) -> dict[str, jax.Array]:
        loc = params[f"{self.prefix}_joint_loc"]
        return {s.name: loc[sl].reshape(s.out_dim, s.num_inducing) for s, sl in self._blocks()}

    def _stds(self, params: dict) -> dict[str, jax.Array]:
        std = jnp.sqrt(jnp.diagonal(self.covariance(params)))
        return {s.name: std[sl].reshape(s.out_dim, s.num_inducing) for s, sl in self._blocks()}


class AutoChainDGP(AutoFactorizedDGP):
    """Chain-structured Gaussian over the layers' inducing values (Ustyuzhaninov et al. 2020,
    Sec. 4.1b).

    ``q(u_1) = N(m_1, D_1 D_1^T)``, ``q(u_l | u_{l-1}) = N(m_l + C_l vec(u_{l-1} - m_{l-1}),
    D_l D_l^T)``: ``m_l`` is layer ``l``'s marginal mean, ``D_l`` one lower factor per output
    (as in the factorized guide) and ``C_l`` a ``(P_l M_l, P_{l-1} M_{l-1})`` coupling,
    initialized at zero (exactly the factorized guide, whose ``m_l``/``D_l`` parameters, names
    and ``median`` it shares). Layers are chained in execution order.

    :param model: a model built with :func:`numpyro_dgp.gp_layer`.
    :param inner_init: ``"deterministic"`` or ``"prior"`` (as for the factorized guide).
    :param init_scale: the factor for ``"deterministic"``.
    :param prefix: parameters are ``"<site>_<prefix>_loc"``, ``"<site>_<prefix>_scale_tril"``
        and (from the second layer on) ``"<site>_<prefix>_coupling"``.
    """

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        super()._setup_prototype(*args, **kwargs)
        _warn_if_slow(self, own_dense=False)

    def _sample_inducing(self, rng_key: jax.Array | None, args: tuple, kwargs: dict) -> dict:
        result = {}
        parent = parent_loc = None
        for site in self.inducing_sites:
            # m_l and D_l are the factorized guide's parameters
            loc, tril = self._q(site, rng_key, args, kwargs)
            if parent is None:
                cond_loc = loc
                link = ChainLink(None, loc, tril)
            else:
                coupling = numpyro.param(
                    f"{site.name}_{self.prefix}_coupling",
                    jnp.zeros((site.size, parent.size), loc.dtype),
                )
                assert parent_loc is not None  # set with the parent by the last step
                shift = coupling @ (result[parent.name] - parent_loc).reshape(-1)
                cond_loc = loc + shift.reshape(loc.shape)
                link = ChainLink(parent.name, loc, tril, parent_loc, coupling)
            # u = cond_loc + D z as a Delta with log-density -log|D|: exact log q without a
            # triangular solve against D, which a near-deterministic layer makes ill-conditioned
            z = _standard_normal(f"_{site.name}_{self.prefix}_std_normal", loc)
            value = cond_loc + jnp.einsum("pmk,pk->pm", tril, z)
            result[site.name] = _delta_site(site.name, value, tril, link, (cond_loc, tril))
            parent, parent_loc = site, loc
        return result

    def marginal_covariances(self, params: dict) -> dict[str, jax.Array]:
        """Marginal covariances ``S_l = C_l S_{l-1} C_l^T + D_l D_l^T``.

        :param params: the guide's parameter values.
        :return: ``{site: (P M, P M)}``.
        """
        out = {}
        prev = None
        for site in self.inducing_sites:
            cov = block_diag_covariance(params[f"{site.name}_{self.prefix}_scale_tril"])
            if prev is not None:
                C = params[f"{site.name}_{self.prefix}_coupling"]
                cov = cov + C @ out[prev] @ C.T
            out[site.name] = cov
            prev = site.name
        return out

    def _stds(self, params: dict) -> dict[str, jax.Array]:
        """The square roots of the diagonals of :meth:`marginal_covariances`."""
        covs = self.marginal_covariances(params)
        return {
            s.name: jnp.sqrt(jnp.diagonal(covs[s.name])).reshape(s.out_dim, s.num_inducing)
            for s in self.inducing_sites
        }


class CorrelatedRecursion:
    """The exact per-point recursion over the layers of a Gaussian that correlates their
    inducing values (:class:`~numpyro_dgp.posteriors.ChainLink` /
    :class:`~numpyro_dgp.posteriors.JointBlock`, declared by the guides above or read off
    NumPyro's ``AutoMultivariateNormal``): the inducing-marginalization engine's plug-in for
    such posteriors, one per run of the model.

    :meth:`output` gives a layer's per-point output Gaussian given the outputs the layers
    before it drew at each point; :meth:`draw` draws them and conditions each point's belief
    over the guide's standard-normal draws on them. Cost per layer ``O(N P M K)`` for the
    ``K`` draws of the layers before it, plus DSVI's ``O(N P M^2)`` for a chain's own draws
    (``O(N P^2 M^2)`` for a joint block's).

    :param posteriors: ``{u-site: posterior}`` of the run (:meth:`independent` already applied).
    """

    def __init__(self, posteriors: dict[str, Any]) -> None:
        self.parents = _chain_parents(posteriors)
        # chain: u-site -> (belief given its output, its cross, its own factors) for its child
        self._links: dict[str, tuple[Belief, jax.Array | None, jax.Array]] = {}
        # joint group -> (next block index, per-point belief over the draws so far)
        self._joint_states: dict[tuple, tuple[int, Belief]] = {}
        # what the layer just run needs to condition on its output
        self._last: tuple = ()

    @staticmethod
    def claims(posterior: Any) -> bool:
        """Whether ``posterior`` correlates its layer with others (the recursion's to run)."""
        return isinstance(posterior, (ChainLink, JointBlock))

    @staticmethod
    def independent(posteriors: dict[str, Any]) -> dict[str, Any]:
        """``posteriors`` with each chain factor that has neither parent nor child as the
        independent Gaussian ``(mean, scale_tril)`` it is (for the engine's DSVI marginals)."""
        parents = _chain_parents(posteriors)
        out = dict(posteriors)
        for name, post in posteriors.items():
            if isinstance(post, ChainLink) and post.parent is None and name not in parents:
                out[name] = (post.mean, post.scale_tril)
        return out

    @staticmethod
    def sampled(posteriors: dict[str, Any], conditionals: dict[str, Any]) -> dict[str, Any]:
        """What the engine marginalizes under the sampled estimator: each layer that a later
        layer's inducing values depend on runs on the guide's sampled inducing values (one draw
        shared by the points: ``p(f_l | f_{l-1}, u_l)``), and each layer that none depends on is
        marginalized over its Gaussian given those samples (``conditionals``, the guide's
        :data:`~numpyro_dgp._protocol.CONDITIONAL`; sampled too where the guide declares none).
        Ustyuzhaninov et al. (2020)'s estimator (a) with the last layer integrated out: the
        same bound as the exact recursion, its layers at DSVI's cost per point.

        :param posteriors: ``{u-site: posterior}`` (structured, as the exact recursion reads them).
        :param conditionals: ``{u-site: the guide's Gaussian given the earlier samples}``.
        :return: ``posteriors`` with the correlated sites replaced so.
        """
        parents = _chain_parents(posteriors)
        out = {}
        for name, post in CorrelatedRecursion.independent(posteriors).items():
            if not CorrelatedRecursion.claims(post):
                out[name] = post
            elif isinstance(post, ChainLink) and name in parents:
                continue  # a child depends on it: its sampled value
            elif isinstance(post, JointBlock) and name != post.sites[-1]:
                continue
            elif name in conditionals:
                out[name] = conditionals[name]
        return out

    def _parts(
        self, layer: Layer, post: ChainLink | JointBlock
    ) -> tuple[jax.Array, jax.Array, jax.Array | None, Belief | None]:
        """``(mean (P, M), own, cross, belief)`` of this layer's inducing values (see
        :func:`~numpyro_dgp.core.output_moments`), given the outputs of the layers before."""
        name = layer.u_site
        if isinstance(post, ChainLink):
            if post.parent is None:
                return post.mean, post.scale_tril, None, None
            if post.parent not in self._links:
                raise ValueError(
                    f"marginalize_inducing: the guide chains {name!r} to {post.parent!r}, but "
                    f"layer {post.parent!r} has not run before it at these points"
                )
            belief, parent_cross, parent_own = self._links.pop(post.parent)
            assert post.coupling is not None  # a chain factor with a parent has its coupling
            return (
                post.mean,
                post.scale_tril,
                chain_cross(post.coupling, parent_own, parent_cross),
                belief,
            )
        k = post.sites.index(name)
        state = self._joint_states.get(post.sites)
        if k and (state is None or state[0] != k):
            raise ValueError(
                f"marginalize_inducing: the guide's joint Gaussian orders the layers {post.sites}; "
                f"{name!r} ran out of that order"
            )
        start = sum(P * M for P, M in post.shapes[:k])
        block = slice(start, start + layer.out_dim * layer.inducing_inputs.shape[0])
        mean = post.loc[block].reshape(layer.out_dim, -1)
        cross = post.scale_tril[block, :start] if k else None
        return mean, post.scale_tril[block, block], cross, state[1] if k and state else None

    def output(
        self, layer: Layer, X: jax.Array, post: ChainLink | JointBlock
    ) -> tuple[jax.Array, jax.Array]:
        """``(mean (N, P), cov (N, P, P))`` of the layer's outputs at each point ``X (N, D)``,
        given the outputs the layers before drew at that point.

        :raises ValueError: if the layer runs at other points than the layer before it in the
            chain, or out of the order of the guide's joint Gaussian.
        """
        N = X.shape[0]
        P = layer.out_dim
        u_mean, own, cross, belief = self._parts(layer, post)
        if belief is not None and belief.weighted.shape[0] != N:
            raise ValueError(
                f"marginalize_inducing: layer {layer.name!r} runs at {N} points but the layer "
                f"before it in the guide's chain ran at {belief.weighted.shape[0]}; a correlated "
                "guide needs each point's chain of layer outputs"
            )
        alpha, base_var = point_projection(
            layer.kernel(layer.inducing_inputs, X),
            layer.Kmm_chol,
            layer.kernel.diag(X),
            layer.whiten,
            layer.Kmm_chol_inv,
        )
        res_mean, out_cov, gain = output_moments(alpha, base_var, u_mean, own, cross, belief)
        # the guide's values are the inducing values themselves; the conditional needs their
        # residual about the prior mean (zero except for inducing="locations")
        assert layer.prior_mean is not None  # gp_layer gives every layer its prior mean
        res_mean = res_mean - alpha @ layer.prior_mean.T
        mean = res_mean + layer.mean_fn(X)
        if layer.noise is not None:
            # the output is f + eps: eps adds to its variance, not to its covariance with u
            out_cov = out_cov + layer.noise * jnp.eye(P, dtype=out_cov.dtype)
        self._last = (belief, gain, out_cov, mean, cross, own)
        return mean, out_cov

    def draw(self, layer: Layer, post: ChainLink | JointBlock, eps: jax.Array) -> jax.Array:
        """The layer's outputs ``(N, P)`` drawn from :meth:`output`'s Gaussian with the
        standard-normal ``eps (N, P)``; where a later layer needs it, each point's belief over
        the draws so far is then conditioned on them."""
        belief, gain, out_cov, mean, cross, own = self._last
        independent = cross is None and own.ndim == 3  # one factor per output: S is diagonal
        if independent:
            value = mean + jnp.sqrt(jnp.maximum(jnp.diagonal(out_cov, axis1=-2, axis2=-1), 0)) * eps
        else:
            value = sample_output(mean, out_cov, eps)
        if isinstance(post, ChainLink):
            if layer.u_site in self.parents:
                given = condition_on_output(gain, out_cov, value - mean, belief, independent)
                self._links[layer.u_site] = (given, cross, own)
        else:
            k = post.sites.index(layer.u_site)
            if k + 1 < len(post.sites):
                given = condition_on_output(gain, out_cov, value - mean, belief)
                self._joint_states[post.sites] = (k + 1, given)
        return value


#: the exact recursion's per-point arithmetic over the factorized guide's above which a guide
#: warns when it is built: its step has taken 1.1x-2x that ratio of the factorized step's time
#: (benchmarks/results/correlated_costs_*.md), so a warned guide's step is over 3x
SLOW_FACTOR = 3.0
#: the folders of this package, NumPyro and JAX (a warning skips their frames)
_LIBRARY_FOLDERS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (numpyro.__file__, jax.__file__, os.path.dirname(__file__))
    if path
)


def _warn_if_slow(guide: DGPGuide, own_dense: bool) -> None:
    """Warn, once the sites are known, where DGPElbo's exact recursion costs much more per step
    than the factorized guide: per point, layer ``l`` costs ``P M K`` for the ``K`` inducing
    values of the layers before it and ``P M^2`` (``P (P + 1) M^2 / 2`` for a joint block,
    ``own_dense``: its blocks on and below the block diagonal) for its own, against DSVI's
    ``P M^2``."""
    if any(site.inducing == "locations" for site in guide.inducing_sites):
        return  # DGPElbo samples the inner layers of such a model: no recursion to pay for
    dsvi = exact = before = 0
    for site in guide.inducing_sites:
        P, M = site.out_dim, site.num_inducing
        dsvi += P * M * M
        exact += P * M * before + (P * (P + 1) // 2 if own_dense else P) * M * M
        before += P * M
    factor = exact / max(dsvi, 1)
    if factor > SLOW_FACTOR:
        warnings.warn(
            f"{type(guide).__name__}: with DGPElbo's exact recursion (the default) a training step "
            f"on this model does about {factor:.0f}x the per-point arithmetic of "
            "AutoFactorizedDGP, and takes at least that much longer. "
            "DGPElbo(correlated='sampled') integrates the same bound at about the factorized "
            "guide's cost per point where the last layer is narrow (a noisier estimate: see "
            "docs/limitations.md, Variational families)"
            + ("; AutoChainDGP correlates neighbouring layers for less" if own_dense else ""),
            UserWarning,
            # the user's line: the guide is set up deep inside NumPyro's (and JAX's) calls
            skip_file_prefixes=_LIBRARY_FOLDERS,
        )


def _standard_normal(name: str, like: jax.Array) -> jax.Array:
    """An auxiliary standard-normal site shaped like ``like``."""
    fn = dist.Normal(jnp.zeros_like(like), 1.0).to_event(like.ndim)
    return numpyro.sample(name, fn, infer={"is_auxiliary": True})


def _delta_site(
    name: str, value: jax.Array, factor: jax.Array, gaussian: Any, conditional: Any
) -> jax.Array:
    """The inducing site ``name`` at ``value = loc + factor z`` as a Delta with the log-density
    ``-log|factor|`` of the draw, tagged with the structure (:data:`GAUSSIAN`) and the site's
    conditional Gaussian (:data:`CONDITIONAL`)."""
    log_det = jnp.sum(jnp.log(jnp.diagonal(factor, axis1=-2, axis2=-1)))
    fn = dist.Delta(value, log_density=-log_det, event_dim=2)
    return numpyro.sample(name, fn, infer={GAUSSIAN: gaussian, CONDITIONAL: conditional})


def _chain_parents(posteriors: dict[str, Any]) -> set[str]:
    """The u-sites another chain factor of ``posteriors`` is chained to."""
    return {
        p.parent for p in posteriors.values() if isinstance(p, ChainLink) and p.parent is not None
    }
