"""Effect handlers that reinterpret ``"dgp_layer"`` messages.

* :class:`marginalise_inducing` -- propagate through ``q(f_l | f_{l-1}) = int p(f_l | f_{l-1}, u_l)
  q(u_l) du_l`` (DSVI) instead of through a sampled ``u_l``; for guides that correlate the
  layers (:class:`ChainLink`, :class:`JointBlock`), through the exact per-point recursion of
  notes/compositional.md §3b; optionally put Gauss-Hermite nodes of the last layer's
  marginal on a leading axis (exact Gaussian expectations). Used by
  :class:`numpyro_dgp.DGPElbo` and :func:`numpyro_dgp.predict`.
* :class:`layer_inputs` -- evaluate chosen layers at given inputs instead of the previous
  layer's output (each layer as a function of its own input, e.g. ``Var[f_2(h = 0)]``).
* :class:`coherent_layers` -- draw each layer's output with its full covariance over the
  points (smooth function samples for plots) instead of point by point.
* :class:`exact_layers` -- no inducing points: each layer's output at the data (and at grid
  points) is a latent site with the full GP prior, so NUTS samples the exact DGP posterior.
* :class:`latent_conditionals` -- the sparse model for MCMC: inducing values stay latent and
  each layer's output is a latent site drawn from ``p(f_l | u_l, f_{l-1})``.
* :class:`sde_flow` -- DiffGP (paper 004): a layer becomes the drift and diffusion of an
  Euler–Maruyama flow of its inputs.
* :class:`fast_subsample` -- draw plate subsamples with one ``top_k`` instead of NumPyro's
  sequential CPU shuffle (used by :class:`numpyro_dgp.DGPElbo`).
* :class:`data_parallel` -- split the data plate (the minibatch) across devices: every
  per-point computation runs sharded, the sums over points become cross-device reductions.
"""

from __future__ import annotations

import zlib
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.primitives import Messenger

from numpyro_dgp.core.chain import (
    block_diag_covariance,
    chain_transition,
    condition_on_output,
    output_moments,
    point_projection,
    sample_output,
)
from numpyro_dgp.core import euler_maruyama, jittered_cholesky, local_kl
from numpyro_dgp.core.linalg import cholesky
from numpyro_dgp.layers import layer_moments, sample_moments

__all__ = [
    "ChainLink",
    "JointBlock",
    "marginalise_inducing",
    "coherent_layers",
    "layer_inputs",
    "exact_layers",
    "latent_conditionals",
    "gaussian_parameters",
    "site_gaussian",
    "collapse_last_layer",
    "sde_flow",
    "FlowSpec",
    "AmortizedPosterior",
    "quadrature",
    "AMORTIZATION_RULES",
    "fast_subsample",
    "data_parallel",
]

#: Paper 003's amortization rules: what a layer's encoder sees and how branches are drawn.
AMORTIZATION_RULES = ("AR1", "AR2", "AR2P")


class AmortizedPosterior(NamedTuple):
    """An amortized guide's ``q(u_n | p_n)`` for one layer with per-point inducing sets.

    :ivar encode: ``p (..., D) -> (loc (..., P, M), scale)`` with ``scale`` ``(..., P, M)``
        standard deviations or ``(..., P, M, M)`` lower factors.
    :ivar rule: ``"AR1"`` (the encoder sees each branch's sample, one inducing set per
        branch), ``"AR2"`` / ``"AR2P"`` (it sees the weighted mean of the previous layer's
        branch means; one set shared by the branches).
    :ivar num_branches: ``S``.
    :ivar points: ``(S, P)`` standard-normal points that draw this layer's branches
        (``"AR2P"``: learned quadrature points), or ``None`` (Monte Carlo).
    :ivar log_weights: ``(S,)`` log branch weights.
    """

    encode: object
    rule: str
    num_branches: int
    points: jax.Array | None
    log_weights: jax.Array


class ChainLink(NamedTuple):
    """One factor ``q(u_l | u_parent) = N(mean + C vec(u_parent - parent_mean), D D^T)`` of a
    chain-structured guide, carried in the guide site's ``infer["dgp_gaussian"]``.

    :ivar parent: the parent's u-site name, or ``None`` for the first layer of the chain.
    :ivar mean: ``(P, M)`` marginal mean ``m_l``.
    :ivar scale_tril: ``(P, M, M)`` ``D_l``, one factor per output.
    :ivar parent_mean: ``(P', M')`` ``m_{l-1}`` (``None`` without parent).
    :ivar coupling: ``(P M, P' M')`` ``C_l`` (``None`` without parent).
    """

    parent: str | None
    mean: jax.Array
    scale_tril: jax.Array
    parent_mean: jax.Array | None = None
    coupling: jax.Array | None = None


class JointBlock(NamedTuple):
    """One Gaussian ``N(loc, L L^T)`` over the flattened inducing values of several sites, in
    order (``vec(u)`` output-major), carried in each site's ``infer["dgp_gaussian"]``.

    :ivar sites: u-site names in order.
    :ivar shapes: ``(P, M)`` per site.
    :ivar loc: ``(D,)``, ``D = sum P M``.
    :ivar scale_tril: ``(D, D)`` lower-triangular.
    """

    sites: tuple
    shapes: tuple
    loc: jax.Array
    scale_tril: jax.Array


def _unwrap(fn):
    while True:
        if isinstance(fn, dist.Independent):
            fn = fn.base_dist
        elif isinstance(fn, dist.ExpandedDistribution):
            fn = fn.base_dist
        else:
            return fn


def gaussian_parameters(fn, shape):
    """``(loc, scale)`` of a Gaussian site distribution over values of ``shape = (P, M)``.

    ``scale`` is ``(P, M, M)`` lower triangular for a multivariate normal over the last axis,
    ``(P, M)`` standard deviations for independent normals; ``None`` if ``fn`` is not
    Gaussian in that sense (e.g. a ``Delta``).
    """
    base = _unwrap(fn)
    P, M = shape
    if isinstance(base, dist.MultivariateNormal):
        if base.event_shape != (M,):
            return None
        loc = jnp.broadcast_to(base.loc, shape)
        scale = jnp.broadcast_to(base.scale_tril, (P, M, M))
        return loc, scale
    if isinstance(base, dist.Normal):
        return jnp.broadcast_to(base.loc, shape), jnp.broadcast_to(base.scale, shape)
    return None


def site_gaussian(name, fn, shape):
    """A site distribution over ``(P, M)`` inducing values as :func:`gaussian_parameters`'
    ``(loc, scale)``, or as a one-site :class:`JointBlock` when it is a multivariate normal
    over all ``P M`` values reshaped to ``(P, M)`` (outputs correlated); ``None`` otherwise."""
    params = gaussian_parameters(fn, shape)
    if params is not None:
        return params
    base = _unwrap(fn)
    P, M = shape
    if (
        isinstance(base, dist.TransformedDistribution)
        and len(base.transforms) == 1
        and isinstance(base.transforms[0], dist.transforms.ReshapeTransform)
        and isinstance(base.base_dist, dist.MultivariateNormal)
        and base.base_dist.event_shape == (P * M,)
        and base.base_dist.batch_shape == ()
    ):
        return JointBlock((name,), (tuple(shape),), base.base_dist.loc, base.base_dist.scale_tril)
    return None


def _top_k_subsample(size, subsample_size, rng_key=None):
    if rng_key is None:
        raise ValueError(
            "Missing random key to generate subsample indices: run the model under "
            "numpyro.handlers.seed (SVI does this); HMC/NUTS do not support subsampling"
        )
    # The positions of the subsample_size largest of size iid uniforms: a uniformly random
    # subset in random order, as NumPyro's Fisher-Yates shuffle gives.
    # float32 draws whatever the default precision: half the sort width; ties are harmless
    _, idx = jax.lax.top_k(jax.random.uniform(rng_key, (size,), jnp.float32), subsample_size)
    return idx.astype(jnp.arange(0).dtype)


class fast_subsample(Messenger):
    """Draw ``numpyro.plate(..., subsample_size=B)`` indices with one ``lax.top_k``.

    On CPU NumPyro shuffles with a sequential loop of ``B`` steps (a ``lax.scan`` of
    Fisher-Yates swaps), which costs a DGP training step about 1 ms at ``B = 1000``
    (benchmarks/README.md); ``top_k`` of ``N`` uniforms gives a subset with the same (uniform)
    distribution in a few vectorised passes. Subsamples that are already set (replayed from a
    guide, or substituted) are left alone.
    """

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["value"] is None and msg["fn"] is _NUMPYRO_SUBSAMPLE_FN:
            msg["fn"] = _top_k_subsample


_NUMPYRO_SUBSAMPLE_FN = getattr(numpyro.primitives, "_subsample_fn", None)


class data_parallel(Messenger):
    """Data-parallel training: shard the points of the plate ``plate_name`` across devices.

    The plate's indices (the minibatch drawn inside the step, or all points) get a sharding
    constraint over ``mesh`` (default: every device on one axis), so XLA's partitioner runs
    everything computed from them -- for a model that takes its inputs through the plate
    (``numpyro.subsample(X, event_dim=1)``, as :func:`numpyro_dgp.models.deep_gp_regression`
    does) the layer inputs, the per-point conditionals, the Monte Carlo draws and the
    likelihood -- on each device's share; a model that feeds the whole ``X`` to its layers
    outside the plate only gets its likelihood split. It replicates the small global parts
    (inducing values, kernel matrices, KL terms), and reduces the sums over points and their
    gradients across devices. The model is unchanged and so is the loss: JAX's partitionable
    random numbers give every point the same draw as on one device, so the sharded loss
    equals the single-device loss on the same minibatch up to the order of the reductions
    (tests/test_speed.py). Wrap the model (and the guide, if it has the plate) before
    building ``SVI``; use with :func:`numpyro_dgp.fit` as usual::

        svi = SVI(data_parallel(model), guide, optimizer, DGPElbo())

    On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` (set before JAX starts)
    gives two devices to test with; the speed-up is for several accelerators (see
    benchmarks/README.md for what it gives on a 2-core CPU).

    :param fn: the model or guide.
    :param mesh: a ``jax.sharding.Mesh``; default one axis over ``jax.devices()``.
    :param axis_name: the mesh axis the points are split over.
    :param plate_name: the plate whose points are split.
    """

    def __init__(self, fn=None, mesh=None, axis_name: str | None = None, plate_name: str = "data"):
        from jax.sharding import Mesh

        if mesh is None:
            axis_name = axis_name or "data"
            mesh = Mesh(np.asarray(jax.devices()), (axis_name,))
        elif axis_name is None:
            axis_name = mesh.axis_names[0]
        if axis_name not in mesh.axis_names:
            raise ValueError(f"data_parallel: axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}")
        self.mesh, self.axis_name, self.plate_name = mesh, axis_name, plate_name
        super().__init__(fn)

    def postprocess_message(self, msg):
        if msg["type"] == "plate" and msg["name"] == self.plate_name and msg["value"] is not None:
            from jax.sharding import NamedSharding, PartitionSpec

            sharding = NamedSharding(self.mesh, PartitionSpec(self.axis_name))
            msg["value"] = jax.lax.with_sharding_constraint(msg["value"], sharding)


class marginalise_inducing(Messenger):
    """Propagate each layer through its marginal ``q(f_l | f_{l-1})`` instead of a sampled ``u_l``.

    :param fn: the model.
    :param posteriors: ``{u-site name: posterior}`` where a posterior is the guide's Gaussian
        over that layer's inducing values: ``(loc (P, M), scale (P, M, M) or (P, M))`` for
        independent layers (DSVI marginals, point by point), or a :class:`ChainLink` /
        :class:`JointBlock` for guides that correlate layers (the exact per-point recursion
        of notes/compositional.md §3b: each point's outputs condition the belief over the
        inducing values of the layers still to come). Layers whose ``u`` site is not listed
        fall back to ``p(f | u)`` with the ``u`` value at hand.
    :param quadrature_layer: name of the layer whose output is replaced by quadrature nodes
        of its (Gaussian) marginal: value ``(K, N, P)``; every sample site after it is tagged
        ``infer["dgp_quadrature"] = True`` so an objective can weight the leading axis with
        :attr:`quadrature_weights`.
    :param quadrature_nodes: ``(K, P)`` standard-normal nodes.
    :param quadrature_weights: ``(K,)`` weights summing to one.

    After a run, :attr:`moments` maps layer names to ``(mean (N, P), var (N, P))`` and
    :attr:`layer_order` lists the layers in execution order.
    """

    def __init__(
        self,
        fn=None,
        posteriors=None,
        quadrature_layer=None,
        quadrature_nodes=None,
        quadrature_weights=None,
    ):
        posteriors = dict(posteriors or {})
        parents = {p.parent for p in posteriors.values() if isinstance(p, ChainLink) and p.parent is not None}
        # a chain factor with neither parent nor child is an independent Gaussian: DSVI path
        for name, post in list(posteriors.items()):
            if isinstance(post, ChainLink) and post.parent is None and name not in parents:
                posteriors[name] = (post.mean, post.scale_tril)
        self.posteriors = posteriors
        self._chain_parents = parents
        self.quadrature_layer = quadrature_layer
        self.quadrature_nodes = quadrature_nodes
        self.quadrature_weights = quadrature_weights
        if quadrature_layer is not None and quadrature_nodes is None:
            raise ValueError("marginalise_inducing: quadrature_layer needs quadrature_nodes")
        self._reset()
        super().__init__(fn)

    def _reset(self):
        self.moments = {}
        self.layer_order = []
        self._in_tail = False
        self._beliefs = {}  # chain: u-site -> per-point belief over its values given its output
        self._joint_states = {}  # joint group -> (next block index, per-point belief over the rest)
        self._amortized_q = {}  # u-site -> (loc, scale) of q(u_n | p_n) at the model's p
        self._branch_mean = None  # weighted mean of the last layer's branch means (AR2 / AR2P)
        self.branch_log_weights = None  # (S,) once a layer has branched the points

    def __enter__(self):
        self._reset()
        return super().__enter__()

    def process_message(self, msg):
        if msg["type"] == "sample":
            infer = dict(msg.get("infer") or {})
            if infer.get("inducing") == "amortized" and not msg["is_observed"]:
                self._amortized_site(msg, infer)
            elif msg["name"] in self.posteriors and not msg["is_observed"]:
                infer["dgp_marginalised"] = True
            if self._in_tail:
                infer["dgp_quadrature"] = True
            msg["infer"] = infer
            return
        if msg["type"] == "dgp_encoder_input":
            layer_name = msg["name"][: -len(".encoder_input")]
            post = self.posteriors.get(f"{layer_name}.u")
            if isinstance(post, AmortizedPosterior) and post.rule != "AR1" and self._branch_mean is not None:
                msg["value"] = self._branch_mean
            return
        if msg["type"] != "dgp_layer":
            return
        layer, X, u = msg["args"]
        full_cov = msg["kwargs"].get("full_cov", False)
        rng_key = msg["kwargs"]["rng_key"]
        post = self.posteriors.get(layer.u_site)
        self.layer_order.append(layer.name)
        flow = (msg.get("infer") or {}).get("dgp_flow")
        if flow is not None:
            msg["value"] = self._flow(layer, X, u, post, flow, rng_key)
            return
        if isinstance(post, (ChainLink, JointBlock)):
            if full_cov:
                raise NotImplementedError(
                    f"marginalise_inducing: layer {layer.name!r} has a guide that correlates layers; "
                    "its marginals are per point (full_cov=False). For coherent function samples "
                    "use numpyro_dgp.sample_layers, which samples the inducing values."
                )
            msg["value"] = self._correlated(layer, X, post, rng_key)
            return
        branch = None if layer.name == self.quadrature_layer else self._branch_spec(layer, msg, post)
        if layer.inducing == "amortized":
            if layer.u_site in self._amortized_q:
                mean, var = layer_moments(layer, X, *self._amortized_q[layer.u_site])
            else:
                mean, var = layer_moments(layer, X, u, None)
        elif post is not None:
            mean, var = layer_moments(layer, X, post[0], post[1], full_cov)
        else:
            mean, var = layer_moments(layer, X, u, None, full_cov)
        self.moments[layer.name] = (mean, var)
        if layer.name == self.quadrature_layer:
            if full_cov:
                raise ValueError("marginalise_inducing: quadrature needs full_cov=False")
            nodes = jnp.asarray(self.quadrature_nodes, mean.dtype)  # (K, P)
            std = jnp.sqrt(jnp.maximum(var, 0.0))
            nodes = nodes.reshape((nodes.shape[0],) + (1,) * (mean.ndim - 1) + nodes.shape[-1:])
            msg["value"] = mean[None] + std[None] * nodes
            self._in_tail = True
        elif branch is not None:
            msg["value"] = self._branch(mean, var, branch, rng_key)
        else:
            msg["value"] = sample_moments(rng_key, mean, var, full_cov, layer.jitter)

    # --- per-point inducing sets and branches (paper 003) ---

    def _amortized_site(self, msg, infer):
        """The ``u`` site of a layer with per-point inducing sets: evaluate the guide's encoder
        at the model's encoder input and record ``q(u_n | p_n)`` and its per-point KL."""
        post = self.posteriors.get(msg["name"])
        if not isinstance(post, AmortizedPosterior):
            return  # no amortized guide for this layer: the sampled value is used
        loc, scale = post.encode(infer["encoder_input"])
        base = _unwrap(msg["fn"])
        prior_mean, prior_chol = base.loc, base.scale_tril[..., 0, :, :]
        batch = loc.shape[:-2]
        flat = lambda a, k: a.reshape((-1,) + a.shape[-k:])  # noqa: E731
        kl = local_kl(
            flat(loc - prior_mean, 2), flat(scale, scale.ndim - len(batch)), flat(jnp.broadcast_to(prior_chol, batch + prior_chol.shape[-2:]), 2)
        ).reshape(batch)
        self._amortized_q[msg["name"]] = (loc, scale)
        msg["value"] = loc  # never used as a draw: the layer marginalises it
        infer["dgp_marginalised"] = True
        infer["dgp_amortized_kl"] = kl

    def _branch_spec(self, layer, msg, post):
        """``(points (S, P) or None, log_weights (S,))`` if this layer branches its outputs:
        from an :class:`AmortizedPosterior`, or from a :class:`quadrature` handler's tag."""
        if isinstance(post, AmortizedPosterior):
            spec = (post.points, post.log_weights)
        else:
            spec = (msg.get("infer") or {}).get("dgp_branches")
        if spec is None:
            if self.branch_log_weights is not None and msg["args"][1].ndim != 3:
                raise ValueError(
                    f"marginalise_inducing: layer {layer.name!r} runs on unbranched inputs after "
                    "another layer branched them"
                )
            return None
        if self.branch_log_weights is not None and spec[1].shape != self.branch_log_weights.shape:
            raise ValueError(
                f"marginalise_inducing: layer {layer.name!r} has {spec[1].shape[0]} branches, an "
                f"earlier layer {self.branch_log_weights.shape[0]}; every layer needs the same number"
            )
        return spec

    def _branch(self, mean, var, branch, rng_key):
        """``S`` branches of the layer's outputs, ``(S, B, P)``: ``mean + point * std`` per
        branch (learned points or fresh standard-normal draws)."""
        points, log_weights = branch
        if self.branch_log_weights is None:
            self.branch_log_weights = log_weights
        S = log_weights.shape[0]
        shape = (S,) + mean.shape[-2:]
        if points is None:
            eps = jax.random.normal(rng_key, shape, mean.dtype)
        else:
            eps = jnp.broadcast_to(jnp.asarray(points, mean.dtype)[:, None, :], shape)
        std = jnp.sqrt(jnp.maximum(var, 0.0))
        if mean.ndim == 2:
            mean, std = mean[None], std[None]
        weights = jax.nn.softmax(log_weights).astype(mean.dtype)
        # AR2 / AR2P: the next layer's encoder sees the weighted mean of these branch means
        self._branch_mean = jnp.tensordot(weights, jnp.broadcast_to(mean, shape), axes=(0, 0))
        return mean + std * eps

    def _flow(self, layer, X, u, post, flow, rng_key):
        """An :class:`sde_flow` layer: integrate with the guide's marginal moments (the
        ``"marginal"`` estimator) or with the sampled inducing values (``"ancestral"``)."""
        spec, box = flow
        if layer.name == self.quadrature_layer:
            raise ValueError(
                f"sde_flow: layer {layer.name!r} is the model's last gp_layer; a flow moves the "
                "inputs of a predictor layer, so a gp_layer must follow it"
            )
        if isinstance(post, (ChainLink, JointBlock)):
            raise NotImplementedError(
                f"sde_flow: layer {layer.name!r} has a guide that correlates layers; the flow "
                "supports guides with an independent Gaussian per layer (AutoFactorisedDGP, AutoNormal)"
            )
        if post is not None and spec.estimator == "marginal":
            q_mean, q_sqrt = post
        else:
            q_mean, q_sqrt = u, None
        value = _integrate_flow(spec, box, layer, X, q_mean, q_sqrt, rng_key)
        # the end state is one path per sample, not a Gaussian: its own value, zero variance
        self.moments[layer.name] = (value, jnp.zeros_like(value))
        return value

    # --- guides that correlate layers: per-point beliefs over the inducing values ---

    def _belief(self, layer, post, N):
        """The belief ``N(loc, cov)`` (``(N?, K)``, ``(N?, K, K)``) over this layer's inducing
        values (first) and those of later layers in its joint group, given earlier outputs."""
        name = layer.u_site
        if isinstance(post, ChainLink):
            if post.parent is None:
                return post.mean.reshape(-1), block_diag_covariance(post.scale_tril)
            if post.parent not in self._beliefs:
                raise ValueError(
                    f"marginalise_inducing: the guide chains {name!r} to {post.parent!r}, but layer "
                    f"{post.parent!r} has not run before it at these points"
                )
            loc, cov = self._beliefs.pop(post.parent)
            return chain_transition(
                loc, cov, post.parent_mean.reshape(-1), post.mean, post.coupling, post.scale_tril
            )
        k = post.sites.index(name)
        if k == 0:
            return post.loc, post.scale_tril @ post.scale_tril.T
        state = self._joint_states.get(post.sites)
        if state is None or state[0] != k:
            raise ValueError(
                f"marginalise_inducing: the guide's joint Gaussian orders the layers {post.sites}; "
                f"{name!r} ran out of that order"
            )
        return state[1]

    def _correlated(self, layer, X, post, rng_key):
        N = X.shape[0]
        P, M = layer.out_dim, layer.inducing_inputs.shape[0]
        loc, cov = self._belief(layer, post, N)
        if loc.ndim == 2 and loc.shape[0] != N:
            raise ValueError(
                f"marginalise_inducing: layer {layer.name!r} runs at {N} points but the layer before "
                f"it in the guide's chain ran at {loc.shape[0]}; a correlated guide needs each "
                "point's chain of layer outputs"
            )
        Z = layer.inducing_inputs
        alpha, base_var = point_projection(layer.kernel(Z, X), layer.Kmm_chol, layer.kernel.diag(X), layer.whiten)
        res_mean, out_cov, HB = output_moments(alpha, base_var, loc, cov, P)
        # the belief is over the inducing values themselves; the conditional needs their
        # residual about the prior mean (zero except for inducing="locations")
        res_mean = res_mean - alpha @ layer.prior_mean.T
        mean = res_mean + layer.mean_fn(X)
        var = jnp.diagonal(out_cov, axis1=-2, axis2=-1)
        self.moments[layer.name] = (mean, var)
        if layer.name == self.quadrature_layer:
            nodes = jnp.asarray(self.quadrature_nodes, mean.dtype)  # (K, P)
            self._in_tail = True
            return sample_output(mean, out_cov, nodes)
        eps = jax.random.normal(rng_key, mean.shape, mean.dtype)
        value = sample_output(mean, out_cov, eps)
        if isinstance(post, ChainLink):
            if layer.u_site in self._chain_parents:
                self._beliefs[layer.u_site] = condition_on_output(
                    loc, cov, HB, out_cov, value - mean
                )
        else:
            k = post.sites.index(layer.u_site)
            if k + 1 < len(post.sites):
                new_loc, new_cov = condition_on_output(loc, cov, HB, out_cov, value - mean)
                # this layer's block is used: keep the belief over the later blocks only
                self._joint_states[post.sites] = (k + 1, (new_loc[:, P * M :], new_cov[:, P * M :, P * M :]))
        return value


class coherent_layers(Messenger):
    """Draw every layer's output jointly over its input points (full covariance).

    Function samples drawn this way are smooth curves; the default point-by-point draw is
    enough for the ELBO but looks like noise when plotted. Cost ``O(N^3)`` per layer.
    """

    def process_message(self, msg):
        if msg["type"] == "dgp_layer":
            msg["kwargs"] = {**msg["kwargs"], "full_cov": True}


class layer_inputs(Messenger):
    """Evaluate the named layers at given inputs instead of the previous layer's output.

    A DGP layer is a function of its own input; ``layer_inputs(model, {"h2": H})`` runs
    ``model`` with layer ``h2`` evaluated at ``H``, so the moments a handler such as
    :class:`marginalise_inducing` records for ``h2`` are those of ``f_2(H)`` under the fitted
    ``q`` (paper 000's ``Var[f_2(0)]``). The rest of the run is unchanged: the layers before
    still draw their outputs (a guide that correlates layers conditions ``f_2``'s inducing
    values on them, so the law of total variance over runs gives ``f_2(H)``'s marginal), and
    the layers after see ``f_2(H)``.

    Enter it inside the handlers that should see the replaced input (wrap the model itself).

    :param fn: the model.
    :param inputs: ``{layer name: array}``; each array must broadcast to the shape of that
        layer's usual input (the number of points and the input width stay as they are).
    """

    def __init__(self, fn=None, inputs=None):
        if not isinstance(inputs, dict) or not inputs:
            raise ValueError(f"layer_inputs: inputs must be a non-empty dict {{layer name: array}}, got {inputs!r}")
        self.inputs = {name: jnp.asarray(value) for name, value in inputs.items()}
        self._seen = set()
        super().__init__(fn)

    def __enter__(self):
        self._seen = set()
        return super().__enter__()

    def __exit__(self, exc_type, exc_value, traceback):
        missing = sorted(set(self.inputs) - self._seen)
        result = super().__exit__(exc_type, exc_value, traceback)
        if exc_type is None and missing:
            raise ValueError(f"layer_inputs: the model has no layer named {missing} (inputs were given for them)")
        return result

    def process_message(self, msg):
        if msg["type"] != "dgp_layer":
            return
        layer, X, u = msg["args"]
        if layer.name not in self.inputs:
            return
        self._seen.add(layer.name)
        value = self.inputs[layer.name]
        try:
            value = jnp.broadcast_to(value.astype(X.dtype), X.shape)
        except ValueError:
            raise ValueError(
                f"layer_inputs: the input for layer {layer.name!r} has shape {value.shape}, which does not "
                f"broadcast to the layer's input shape {X.shape}"
            ) from None
        msg["args"] = (layer, value, u)


PARAMETERISATIONS = ("noncentred", "centred")


def _check_parameterisation(handler, parameterisation):
    if parameterisation not in PARAMETERISATIONS:
        raise ValueError(
            f"{handler}: parameterisation must be one of {PARAMETERISATIONS}, got {parameterisation!r}"
        )


def _layer_output_site(name, mean, scale, parameterisation):
    """Latent layer output ``f (n, P)`` with mean ``mean (n, P)``, as a NumPyro site.

    ``scale`` is ``(P, n, n)`` lower-triangular (points correlated, one factor per output) or
    ``(n, P)`` standard deviations (points independent). Non-centred: the site
    ``"<name>.f_white"`` holds ``eps (P, n) ~ N(0, I)`` and ``f = mean + scale eps`` (better
    for NUTS where the data constrain the layer weakly); centred: ``"<name>.f"`` holds
    ``f^T (P, n)`` itself.
    """
    dense = scale.ndim == 3
    if parameterisation == "noncentred":
        eps = numpyro.sample(f"{name}.f_white", dist.Normal(jnp.zeros(mean.shape[::-1], mean.dtype), 1.0).to_event(2))
        if dense:
            return mean + jnp.einsum("pnm,pm->np", scale, eps)
        return mean + scale * eps.T
    if dense:
        fn = dist.MultivariateNormal(mean.T, scale_tril=scale).to_event(1)
    else:
        fn = dist.Normal(mean.T, scale.T).to_event(2)
    return numpyro.sample(f"{name}.f", fn).T


def _last_layer_name(fn, args, kwargs, handler):
    """Name of the last ``gp_layer`` the model ``fn`` runs, found by an abstract run."""
    from numpyro.handlers import block, seed, trace

    found = {}

    def probe():
        # block: the probe's messages reach none of the handlers outside this one
        with block():
            tr = trace(seed(fn, 0)).get_trace(*args, **kwargs)
        names = [s["args"][0].name for s in tr.values() if s["type"] == "dgp_layer"]
        if not names:
            raise ValueError(f"{handler}: the model runs no gp_layer")
        found["last"] = names[-1]
        return 0

    jax.eval_shape(probe)
    return found["last"]


class _PerRunMessenger(Messenger):
    """A handler whose per-run state (layer order, grid outputs) is reset on every model run."""

    def __enter__(self):
        self._reset()
        return super().__enter__()

    def _reset(self):
        pass


class exact_layers(_PerRunMessenger):
    """The exact DGP: every layer's output is a latent site with the full GP prior.

    Under this handler a model built from :func:`numpyro_dgp.gp_layer` has no inducing
    points: the ``"<name>.u"`` sites and the k-means initialisation of the inducing inputs
    are removed, and layer ``l``'s output at its ``n`` input points is drawn from
    ``N(mean_l(f_{l-1}), K_l(f_{l-1}, f_{l-1}) + jitter I)`` per output. NUTS on the result
    samples the exact DGP posterior (``O(n^3)`` per layer and gradient: small data, ``n`` up
    to a few hundred).

    :param fn: the model.
    :param grid: ``(G, D)`` extra inputs of the first layer at which every layer's output is
        sampled jointly with the data (the posterior at the grid is not independent of the
        data rows, so it must be part of the chain). Layer ``l``'s grid inputs are layer
        ``l-1``'s grid outputs, so the layers must run as a chain (each takes the previous
        layer's output). Recorded as ``numpyro.deterministic("<name>.grid", (G, P))``.
    :param parameterisation: ``"noncentred"`` (default; site ``"<name>.f_white"`` holds the
        standard-normal ``eps (P, n)`` with ``f = mean + L eps``) or ``"centred"`` (site
        ``"<name>.f"`` holds ``f^T (P, n)``).
    :param jitter: diagonal jitter of the prior covariances (default: each layer's own).
    :param collapse_last: integrate the last layer out analytically (default ``False``). Its
        output at the data is then no latent site: the observation site after it (the first
        observed sample site, a ``Normal(f, s)`` with ``f`` the layer's output) scores ``y``
        with the exact marginal ``N(y | m_L, K_L(f_{L-1}, f_{L-1}) + jitter I + diag(s^2))``
        per output, and the layer's grid values are drawn from their exact conditional given
        ``y`` and the inner layers (non-centred: site ``"<name>.grid_white"``). The target of
        the remaining sites is the same posterior marginal, with one layer fewer to sample
        and without the near-deterministic coupling of ``f_L`` to ``y`` that makes NUTS
        crawl when the noise is small. Gaussian likelihoods only; the observations must be
        given.

    Kernel hyperparameters, noise and mean weights are whatever the model makes them:
    ``numpyro.param`` values stay fixed under MCMC (substitute fitted ones with
    ``numpyro.handlers.substitute``), hyperparameters with ``priors=`` are sampled. Data
    subsampling (``plate(..., subsample_size=...)``) is not meaningful here: NUTS needs the
    full data.
    """

    def __init__(
        self,
        fn=None,
        grid=None,
        parameterisation: str = "noncentred",
        jitter: float | None = None,
        collapse_last: bool = False,
    ):
        _check_parameterisation("exact_layers", parameterisation)
        if grid is not None:
            grid = jnp.asarray(grid)
            if grid.ndim != 2:
                raise ValueError(f"exact_layers: grid must have shape (num_grid, dim), got {grid.shape}")
            if not bool(jnp.all(jnp.isfinite(grid))):
                raise ValueError("exact_layers: grid contains NaN or inf values")
        if jitter is not None and not (jitter > 0):
            raise ValueError(f"exact_layers: jitter must be positive, got {jitter!r}")
        self.grid = grid
        self.parameterisation = parameterisation
        self.jitter = jitter
        self.collapse_last = bool(collapse_last)
        self._last_layer = None
        self._reset()
        super().__init__(fn)

    def _reset(self):
        self._grid_inputs = self.grid if hasattr(self, "grid") else None
        self.layer_order = []
        self._collapsed = None  # the collapsed layer's prior, until its observation site

    def __call__(self, *args, **kwargs):
        if self.collapse_last and self._last_layer is None:
            self._last_layer = _last_layer_name(self.fn, args, kwargs, "exact_layers")
        return super().__call__(*args, **kwargs)

    def __exit__(self, exc_type, exc_value, traceback):
        pending = self._collapsed
        result = super().__exit__(exc_type, exc_value, traceback)
        if exc_type is None and pending is not None:
            raise ValueError(
                f"exact_layers(collapse_last=True): no observed sample site followed layer "
                f"{pending.layer.name!r}; the collapsed layer is scored by the observations, so they must be given"
            )
        return result

    def process_message(self, msg):
        if self._collapsed is not None and msg["type"] == "sample" and msg["is_observed"]:
            self._score_collapsed(msg)
            return
        infer = msg.get("infer") or {}
        if msg["type"] == "param" and msg["name"].endswith(".inducing_inputs") and msg["value"] is None:
            # No inducing points in the exact model: skip the k-means initialisation. NumPyro
            # keeps a callable initialiser as the keyword default of the message's fn.
            init = (getattr(msg["fn"], "__kwdefaults__", None) or {}).get("init_value")
            if callable(init):
                shape = jax.eval_shape(init, jax.random.PRNGKey(0))
                msg["value"] = jnp.zeros(shape.shape, shape.dtype)
            return
        if msg["type"] == "sample" and "dgp_layer" in infer and not msg["is_observed"]:
            # the inducing values do not exist in the exact model: hide the site from the
            # handlers outside (trace, substitute, MCMC) and give it an inert value
            msg["value"] = jnp.zeros(msg["fn"].shape(), msg["fn"].mean.dtype) + msg["fn"].mean
            msg["stop"] = True
            return
        if msg["type"] == "dgp_layer":
            _refuse_flow(msg, "exact_layers")
            msg["fn"] = self._exact

    def _exact(self, layer, X, u, *, rng_key=None, full_cov=False):
        del u, rng_key, full_cov
        self.layer_order.append(layer.name)
        grid = self._grid_inputs
        if grid is not None and grid.shape[-1] != X.shape[-1]:
            raise ValueError(
                f"exact_layers: layer {layer.name!r} takes inputs of width {X.shape[-1]} but the grid "
                f"reaching it has width {grid.shape[-1]}; the layers must form a chain starting at "
                "the grid's input space"
            )
        A = X if grid is None else jnp.concatenate([X, jnp.asarray(grid, X.dtype)], axis=0)
        jitter = layer.jitter if self.jitter is None else self.jitter
        if self.collapse_last and layer.name == self._last_layer:
            return self._defer_collapsed(layer, X, A, jitter)
        L = jittered_cholesky(layer.kernel(A), jitter)
        L = jnp.broadcast_to(L, (layer.out_dim,) + L.shape)
        f = _layer_output_site(layer.name, layer.mean_fn(A), L, self.parameterisation)
        N = X.shape[0]
        if grid is not None:
            self._grid_inputs = f[N:]
            numpyro.deterministic(f"{layer.name}.grid", f[N:])
        return f[:N]

    def _defer_collapsed(self, layer, X, A, jitter):
        """The collapsed layer: keep its prior for the observation site, return its prior mean."""
        N = X.shape[0]
        mean = layer.mean_fn(A)
        grid_white = None
        if A.shape[0] > N:
            # the grid values' conditional depends on y, known only at the observation site;
            # their standard-normal noise is drawn here, in the layer's place in the run
            shape = (layer.out_dim, A.shape[0] - N)
            grid_white = numpyro.sample(
                f"{layer.name}.grid_white", dist.Normal(jnp.zeros(shape, A.dtype), 1.0).to_event(2)
            )
        self._collapsed = _CollapsedLayer(layer, N, layer.kernel(A), mean, jitter, grid_white)
        return mean[:N]

    def _score_collapsed(self, msg):
        state, self._collapsed = self._collapsed, None
        layer, N = state.layer, state.num_data
        base = _unwrap(msg["fn"])
        if not isinstance(base, dist.Normal):
            raise NotImplementedError(
                f"exact_layers(collapse_last=True): observation site {msg['name']!r} has likelihood "
                f"{type(base).__name__}; only a Normal likelihood can be integrated against layer {layer.name!r}"
            )
        y = jnp.asarray(msg["value"])
        P = layer.out_dim
        allowed = [(N, P)] + ([(N,)] if P == 1 else [])
        if y.shape not in allowed:
            raise ValueError(
                f"exact_layers(collapse_last=True): observation site {msg['name']!r} has shape {y.shape}; "
                f"layer {layer.name!r} puts {P} output(s) at {N} points, so it must be ({N}, {P})"
                + (f" or ({N},)" if P == 1 else "")
            )
        noise_var = jnp.broadcast_to(base.scale**2, y.shape).reshape(N, P)
        K_data = state.kernel[:N, :N] + state.jitter * jnp.eye(N, dtype=y.dtype)
        # one factor of C = K_dd + jitter I + diag(s^2) per output, shared by the score and
        # the grid conditional
        L = cholesky(K_data + jax.vmap(jnp.diag)(noise_var.T))  # (P, N, N)
        fn = _CollapsedNormal(state.mean[:N].reshape(y.shape), L)
        msg["fn"] = dist.Independent(fn, msg["fn"].event_dim) if msg["fn"].event_dim else fn
        if state.grid_white is None:
            return
        # exact conditional of the grid values given y: per output p,
        # m_g + K_gd C^-1 (y - m_d),  K_gg - K_gd C^-1 K_dg
        residual = (y.reshape(N, P) - state.mean[:N]).T  # (P, N)
        K_dg = state.kernel[:N, N:]
        V = solve_triangular(L, jnp.broadcast_to(K_dg, (P,) + K_dg.shape), lower=True)  # (P, N, G)
        alpha = solve_triangular(L, residual[..., None], lower=True)[..., 0]  # (P, N)
        G = K_dg.shape[1]
        cond_mean = state.mean[N:].T + jnp.einsum("png,pn->pg", V, alpha)
        cond_cov = state.kernel[N:, N:] - jnp.einsum("png,pnh->pgh", V, V)
        L_grid = jittered_cholesky(cond_cov, state.jitter)
        grid = cond_mean + jnp.einsum("pgh,ph->pg", L_grid, state.grid_white)
        numpyro.deterministic(f"{layer.name}.grid", grid.T.reshape(G, P))


class _CollapsedLayer(NamedTuple):
    layer: object
    num_data: int
    kernel: jax.Array  # (N + G, N + G), data rows first
    mean: jax.Array  # (N + G, P)
    jitter: float
    grid_white: jax.Array | None  # (P, G)


class _CollapsedNormal(dist.Distribution):
    """Observations of a collapsed GP layer: ``y[:, p] ~ N(loc[:, p], L_p L_p^T)`` with
    ``L_p`` the Cholesky factor of ``K + diag(noise_var[:, p])`` (``scale_tril (P, N, N)``).

    Batch shape ``(N,)`` or ``(N, P)`` like the Normal it replaces (so plates still match);
    the joint log density, which does not factorise over points, is spread evenly over the
    batch entries (their sum is exact; a single entry means nothing on its own). Scoring only:
    it stands in for an observed site.
    """

    support = dist.constraints.real
    reparametrized_params = []

    def __init__(self, loc, scale_tril, *, validate_args=None):
        self.loc, self.scale_tril = loc, scale_tril
        super().__init__(batch_shape=jnp.shape(loc), event_shape=(), validate_args=validate_args)

    @property
    def mean(self):
        return self.loc

    def log_prob(self, value):
        residual = (value - self.loc).reshape(value.shape[0], -1).T  # (P, N)
        alpha = solve_triangular(self.scale_tril, residual[..., None], lower=True)[..., 0]
        log_det = jnp.log(jnp.diagonal(self.scale_tril, axis1=-2, axis2=-1)).sum()
        total = -0.5 * jnp.sum(alpha**2) - log_det - 0.5 * alpha.size * jnp.log(2 * jnp.pi)
        return jnp.full(self.batch_shape, total / np.prod(self.batch_shape), dtype=total.dtype)


class latent_conditionals(_PerRunMessenger):
    """The sparse DGP for MCMC: inducing values latent, layer outputs latent given them.

    Each layer's output becomes a latent site drawn from the sparse conditional
    ``p(f_l | u_l, f_{l-1})``: point by point (``full_cov=False``, the DSVI model whose
    marginals every variational family here approximates) or jointly over the points
    (``full_cov=True``: the exact augmented prior ``N(mean + K_nm K_mm^-1 u, K_nn - Q_nn)``).
    The ``"<name>.u"`` sites stay latent with the model's prior, so NUTS samples
    ``p(u, f_1, ..., f_L | y)`` of the sparse model; the layer values at new inputs follow by
    running the model on them with the sampled ``u`` (see :func:`numpyro_dgp.diagnostics`).

    Inducing inputs and other ``numpyro.param`` values stay at their values; substitute fitted
    ones with ``numpyro.handlers.substitute`` (inner layers' default k-means runs on the
    propagated values and would otherwise move with the chain's state).

    :param parameterisation: ``"noncentred"`` (default, ``"<name>.f_white"``) or ``"centred"``
        (``"<name>.f"``), as in :class:`exact_layers`.
    :param full_cov: joint conditional over the points instead of point by point.
    """

    def __init__(self, fn=None, parameterisation: str = "noncentred", full_cov: bool = False):
        _check_parameterisation("latent_conditionals", parameterisation)
        self.parameterisation = parameterisation
        self.full_cov = bool(full_cov)
        self._reset()
        super().__init__(fn)

    def _reset(self):
        self.layer_order = []

    def process_message(self, msg):
        if msg["type"] == "dgp_layer":
            _refuse_flow(msg, "latent_conditionals")
            msg["fn"] = self._conditional

    def _conditional(self, layer, X, u, *, rng_key=None, full_cov=False):
        del rng_key, full_cov
        self.layer_order.append(layer.name)
        mean, var = layer_moments(layer, X, u, None, self.full_cov)
        if self.full_cov:
            scale = jittered_cholesky(var, layer.jitter)  # (P, n, n), one per output
        else:
            # the jitter keeps the scale (and its gradient) finite where the conditional
            # variance vanishes (inputs at inducing points)
            scale = jnp.sqrt(jnp.maximum(var, 0.0) + layer.jitter)
        return _layer_output_site(layer.name, mean, scale, self.parameterisation)


class collapse_last_layer(_PerRunMessenger):
    """Collapse the last GP layer given its inducing values: the likelihood of sghmc_dgp.

    Havasi et al. (2018) score the data with ``log N(y | m_L, v_L + s^2)``, where ``m_L, v_L``
    are the last layer's conditional mean and variance given its inducing values ``u_L``
    (and the sampled inner layers), instead of sampling ``f_L ~ p(f_L | u_L, f_{L-1})`` and
    scoring ``log N(y | f_L, s^2)``. Under this handler the collapsed layer's ``"dgp_layer"``
    message returns the conditional mean ``m_L`` (point by point), and the observation site
    after it (a Normal whose location is that layer's output: ``Normal(f[..., 0], s)`` for a
    one-output layer, or ``Normal(f, s)``) gets the scale ``sqrt(s^2 + v_L)``. Inner layers
    keep their default propagation (sampled given their ``u``).

    :param fn: the model.
    :param layer: name of the layer to collapse (default: the last ``gp_layer`` the model
        runs, found once by an abstract run of the model and cached).
    :param obs_site: name of the observation site (default: the first Normal sample site
        after the collapsed layer).

    After a run, :attr:`moments` holds ``(mean (N, P), var (N, P))`` of the collapsed layer.
    """

    def __init__(self, fn=None, layer=None, obs_site=None):
        self.layer = layer
        self.obs_site = obs_site
        self._found_last = None
        self._reset()
        super().__init__(fn)

    def _reset(self):
        self.moments = None
        self._pending = None  # var (N, P) of the collapsed layer until the observation site

    def __call__(self, *args, **kwargs):
        if self.layer is None and self._found_last is None:
            self._found_last = _last_layer_name(self.fn, args, kwargs, "collapse_last_layer")
        return super().__call__(*args, **kwargs)

    @property
    def target(self):
        return self.layer if self.layer is not None else self._found_last

    def process_message(self, msg):
        if msg["type"] == "dgp_layer":
            layer, X, u = msg["args"]
            if layer.name != self.target:
                return
            _refuse_flow(msg, "collapse_last_layer")
            mean, var = layer_moments(layer, X, u, None, False)
            var = jnp.maximum(var, 0.0)
            self.moments = (mean, var)
            self._pending = var
            msg["value"] = mean
            return
        if msg["type"] != "sample" or self._pending is None:
            return
        if self.obs_site is not None and msg["name"] != self.obs_site:
            return
        rebuilt = _add_normal_variance(msg["fn"], self._pending)
        if rebuilt is None:
            if self.obs_site is not None:
                raise NotImplementedError(
                    f"collapse_last_layer: observation site {msg['name']!r} has likelihood "
                    f"{type(msg['fn']).__name__}; only Normal likelihoods can absorb the layer's variance"
                )
            return
        msg["fn"] = rebuilt
        self._pending = None


def _add_normal_variance(fn, var):
    """``fn`` (a Normal, possibly wrapped in Independent / Expanded) with ``var`` added to its
    variance; ``var (N, P)`` is matched to the location ``(..., N)`` (``P = 1``) or ``(..., N, P)``.
    ``None`` if ``fn`` is not such a Normal."""
    if isinstance(fn, dist.Independent):
        inner = _add_normal_variance(fn.base_dist, var)
        return None if inner is None else dist.Independent(inner, fn.reinterpreted_batch_ndims)
    if isinstance(fn, dist.ExpandedDistribution):
        inner = _add_normal_variance(fn.base_dist, var)
        return None if inner is None else inner.expand(fn.batch_shape)
    if not isinstance(fn, dist.Normal):
        return None
    loc_shape = jnp.shape(fn.loc)
    if var.shape[-1] == 1 and loc_shape[-1:] == var.shape[:1]:
        extra = var[..., 0]
    elif loc_shape[-2:] == var.shape:
        extra = var
    else:
        raise ValueError(
            f"collapse_last_layer: cannot match the layer's variance {var.shape} to the "
            f"observation's location {loc_shape}; the location must be the layer's output "
            "(Normal(f[..., 0], s) for one output, Normal(f, s))"
        )
    return dist.Normal(fn.loc, jnp.sqrt(fn.scale**2 + extra))


# --- SDE flows (DiffGP, paper 004) ---

FLOW_ESTIMATORS = ("marginal", "ancestral")


class FlowSpec(NamedTuple):
    """Settings of an :class:`sde_flow` layer (carried in its message's ``infer["dgp_flow"]``).

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


def _refuse_flow(msg, handler):
    if msg["args"][0].inducing == "amortized":
        raise NotImplementedError(
            f"{handler}: layer {msg['args'][0].name!r} has per-point inducing sets "
            f"(inducing='amortized'), which {handler} does not support"
        )
    if (msg.get("infer") or {}).get("dgp_flow") is not None:
        raise NotImplementedError(
            f"{handler}: layer {msg['args'][0].name!r} is an sde_flow layer, which {handler} does not support"
        )


def _integrate_flow(spec, box, layer, X, q_mean, q_sqrt, rng_key):
    """Euler–Maruyama flow of ``X``'s state columns with drift and diffusion the layer's mean
    and marginal variance under ``u ~ N(q_mean, q_sqrt q_sqrt^T)`` (``q_sqrt=None``: given u)."""
    x0 = X[:, :-1] if spec.time_input else X

    def drift_diffusion(x, t):
        if spec.time_input:
            x = jnp.concatenate([x, jnp.full((x.shape[0], 1), t, x.dtype)], axis=-1)
        return layer_moments(layer, x, q_mean, q_sqrt, False)

    out = euler_maruyama(
        drift_diffusion, x0, spec.T, spec.num_steps, rng_key, diffusion=spec.diffusion, record=spec.record
    )
    if spec.record:
        out, box["path"] = out
    return out


def _flow_given_u(spec, box, layer, X, u, *, rng_key, full_cov=False):
    """Default handling of a flow layer's message: drift and diffusion given the sampled ``u``."""
    del full_cov  # the flow moves each point on its own
    return _integrate_flow(spec, box, layer, X, u, None, rng_key)


class sde_flow(_PerRunMessenger):
    """DiffGP (Hegde et al. 2019): reinterpret a GP layer as the vector field of an SDE flow.

    The named layer ``f: R^D -> R^D`` (input width = output width; mean ``"zero"`` as in the
    paper) no longer returns ``f(X)``: its output is the end state ``x_T`` of

        ``dx_t = mu(x_t) dt + sqrt(Sigma(x_t)) dW_t``,  ``x_0 = X``,

    integrated by Euler–Maruyama in ``num_steps`` steps of ``dt = T / num_steps``, with fresh
    noise per step, point, dimension and sample. The rest of the model is unchanged: the
    layer after it (the predictor) takes ``x_T``. ``T = 0`` returns ``X`` (an SVGP on top).

    Drift and diffusion (notes/diffgp.md):

    * ``estimator="marginal"`` (the paper's, default): ``mu``, ``Sigma`` are the layer's
      variational mean and marginal variance ``int p(f(x) | u) q(u) du``; function
      uncertainty is redrawn at every step and ``u`` is never sampled. This needs the guide's
      Gaussian over ``"<layer>.u"``, which :class:`numpyro_dgp.DGPElbo`, :func:`numpyro_dgp.predict`
      and :func:`numpyro_dgp.sde.flow_trajectories` supply (factorised guides:
      ``AutoFactorisedDGP``, ``AutoNormal``);
    * ``estimator="ancestral"``: ``u ~ q`` is sampled once per sample path, and ``mu``,
      ``Sigma`` are the conditional mean and variance given it (a different path law).
      Wherever the guide's Gaussian is not at hand (``Trace_ELBO``, ``Predictive``, MCMC over
      ``u``) the flow is driven by the sampled ``u`` this way.

    :param fn: the model.
    :param layer: name of the flow layer.
    :param T: flow time ``>= 0``.
    :param num_steps: Euler–Maruyama steps (paper: 20).
    :param estimator: ``"marginal"`` or ``"ancestral"``.
    :param diffusion: ``False`` gives the ODE flow ``dx = mu dt``.
    :param time_input: time-dependent vector field (the paper's "temporal DiffGP"): the
        layer's inputs carry one extra last column that the flow sets to the current time
        ``t_k``; build the layer on ``[X, 0]`` with a kernel over ``D + 1`` inputs (an ARD
        RBF over ``(x, t)`` is exactly the product ``k(x, x') k(t, t')``) and inducing inputs
        at a few times (:func:`numpyro_dgp.sde.temporal_inducing_inputs`).
    :param record: record the path ``(num_steps + 1, N, D)`` (see
        :func:`numpyro_dgp.sde.flow_trajectories`).
    """

    def __init__(
        self,
        fn=None,
        layer: str | None = None,
        T: float = 1.0,
        num_steps: int = 20,
        estimator: str = "marginal",
        diffusion: bool = True,
        time_input: bool = False,
        record: bool = False,
    ):
        if not isinstance(layer, str) or not layer:
            raise ValueError(f"sde_flow: layer must be the name of a gp_layer, got {layer!r}")
        try:
            T_value = float(T)
        except (TypeError, ValueError):
            raise ValueError(f"sde_flow: T must be a number, got {T!r}") from None
        if not (T_value >= 0 and T_value < float("inf")):
            raise ValueError(f"sde_flow: T must be finite and >= 0, got {T!r}")
        if not (isinstance(num_steps, int) and num_steps >= 1):
            raise ValueError(f"sde_flow: num_steps must be a positive integer, got {num_steps!r}")
        if estimator not in FLOW_ESTIMATORS:
            raise ValueError(f"sde_flow: estimator must be one of {FLOW_ESTIMATORS}, got {estimator!r}")
        self.spec = FlowSpec(layer, T_value, num_steps, estimator, bool(diffusion), bool(time_input), bool(record))
        self._reset()
        super().__init__(fn)

    def _reset(self):
        self.layers_seen = []

    def process_message(self, msg):
        if msg["type"] != "dgp_layer":
            return
        layer, X, _ = msg["args"]
        self.layers_seen.append(layer.name)
        if layer.name != self.spec.layer:
            return
        if layer.inducing == "amortized":
            raise NotImplementedError(
                f"sde_flow: layer {layer.name!r} has per-point inducing sets (inducing='amortized'); "
                "a flow layer needs global inducing points"
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
                f"sde_flow: layer {layer.name!r} maps {X.shape[-1]} inputs{extra} to {layer.out_dim} "
                f"outputs; a flow's vector field needs out_dim equal to the state width {state_dim}"
            )
        box = {}
        msg["infer"] = {**(msg.get("infer") or {}), "dgp_flow": (self.spec, box)}
        # the recorded path lands in the box, which the trace keeps in the site's infer dict
        msg["fn"] = partial(_flow_given_u, self.spec, box)

    def __exit__(self, exc_type, exc_value, traceback):
        result = super().__exit__(exc_type, exc_value, traceback)
        if exc_type is None and self.spec.layer not in self.layers_seen:
            raise ValueError(
                f"sde_flow: the model ran no gp_layer named {self.spec.layer!r} "
                f"(its layers: {self.layers_seen})"
            )
        return result


# --- branches over learned quadrature points (paper 003's AR2P, for any guide) ---

#: learned points live in (-POINT_BOUND, POINT_BOUND) (a scaled sigmoid, as in paper 003)
POINT_BOUND = 5.0


def quadrature_points(name: str, init, learnable: bool = True):
    """``(S, P)`` points as a ``numpyro.param`` ``name`` bounded to ``(-5, 5)`` by a scaled
    sigmoid (``xi = 10 sigmoid(a) - 5``), initialised at ``init`` (clipped into the box)."""
    init = jnp.asarray(init)
    if not learnable:
        return init
    inner = jnp.clip((init + POINT_BOUND) / (2 * POINT_BOUND), 1e-6, 1 - 1e-6)
    raw = numpyro.param(name, jnp.log(inner) - jnp.log1p(-inner))
    return 2 * POINT_BOUND * jax.nn.sigmoid(raw) - POINT_BOUND


def quadrature_log_weights(name: str, init, learnable: bool = True):
    """``(S,)`` log weights ``log softmax(logits)`` with ``logits`` a ``numpyro.param`` ``name``
    initialised at ``log init``."""
    logits = jnp.log(jnp.asarray(init))
    if learnable:
        logits = numpyro.param(name, logits)
    return jax.nn.log_softmax(logits)


class quadrature(Messenger):
    """Propagate ``S`` weighted branches through a DGP's inner layers: paper 003's AR2P
    rule for any guide.

    Every inner layer's output becomes ``S`` branches ``mean + xi_s * std`` (per point; a
    branch keeps its own path through the later layers) with points ``xi (S, P)`` per layer
    and weights ``w (S,)`` -- learnable (``numpyro.param``s ``"quadrature.<layer>.points"``,
    bounded to (-5, 5), and ``"quadrature.logits"``) or fixed. The objective is
    ``sum_s w_s E[log p(y | branch s)]`` (:class:`numpyro_dgp.DGPElbo`) or
    ``log sum_s w_s p(y | branch s)`` (:class:`numpyro_dgp.PredictiveObjective`), and
    :func:`numpyro_dgp.predict` returns the weighted mixture. With one inner output and the
    points fixed at Gauss-Hermite nodes with their weights this is Gauss-Hermite quadrature
    of the expectation over that layer. Used through :class:`marginalise_inducing` (the last
    layer is integrated by Gauss-Hermite as always, so its points are registered but unused);
    a plain run of the model (``Trace_ELBO``, ``Predictive``) does not branch.

    :param fn: the model.
    :param num_points: ``S``.
    :param points: initial points: ``{layer: (S, P)}``, one ``(S,)`` array for every layer
        (each output gets the same points), or ``None`` (standard-normal draws, a fixed key).
    :param weights: ``(S,)`` initial weights (default uniform).
    :param learnable: learn points and weights (else they stay fixed).
    """

    def __init__(self, fn=None, num_points: int = 32, points=None, weights=None, learnable: bool = True):
        if not (isinstance(num_points, int) and num_points >= 1):
            raise ValueError(f"quadrature: num_points must be a positive integer, got {num_points!r}")
        if weights is None:
            weights = np.full(num_points, 1.0 / num_points)
        weights = np.asarray(weights, float)
        if weights.shape != (num_points,) or np.any(weights <= 0):
            raise ValueError(f"quadrature: weights must be {num_points} positive numbers, got {weights!r}")
        self.num_points = num_points
        self.points = points
        self.weights = weights / weights.sum()
        self.learnable = bool(learnable)
        super().__init__(fn)

    def initial_points(self, layer: str, out_dim: int):
        """``(S, P)`` starting points of ``layer``."""
        S = self.num_points
        points = self.points
        if isinstance(points, dict):
            points = points.get(layer)
        if points is None:
            return jax.random.normal(jax.random.PRNGKey(zlib.crc32(layer.encode())), (S, out_dim))
        points = jnp.asarray(points)
        if points.ndim == 1:
            points = jnp.broadcast_to(points[:, None], (S, out_dim))
        if points.shape != (S, out_dim):
            raise ValueError(f"quadrature: points for layer {layer!r} must have shape ({S}, {out_dim}), got {points.shape}")
        return points

    def process_message(self, msg):
        if msg["type"] != "dgp_layer":
            return
        layer = msg["args"][0]
        if (msg.get("infer") or {}).get("dgp_flow") is not None:
            raise NotImplementedError(f"quadrature: layer {layer.name!r} is an sde_flow layer, which quadrature does not branch")
        # registered on every run (SVI's initial run is a plain model run); the last layer's
        # points go unused: marginalise_inducing integrates that layer by Gauss-Hermite
        points = quadrature_points(
            f"quadrature.{layer.name}.points", self.initial_points(layer.name, layer.out_dim), self.learnable
        )
        log_weights = quadrature_log_weights("quadrature.logits", self.weights, self.learnable)
        msg["infer"] = {**(msg.get("infer") or {}), "dgp_branches": (points, log_weights)}
