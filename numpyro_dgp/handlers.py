"""Effect handlers that reinterpret ``"dgp_layer"`` messages.

* :class:`marginalise_inducing` -- propagate through ``q(f_l | f_{l-1}) = int p(f_l | f_{l-1}, u_l)
  q(u_l) du_l`` (DSVI) instead of through a sampled ``u_l``; optionally put Gauss-Hermite
  nodes of the last layer's marginal on a leading axis (exact Gaussian expectations).
  Used by :class:`numpyro_dgp.DGPElbo` and :func:`numpyro_dgp.predict`.
* :class:`coherent_layers` -- draw each layer's output with its full covariance over the
  points (smooth function samples for plots) instead of point by point.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.primitives import Messenger

from numpyro_dgp.layers import layer_moments, sample_moments

__all__ = ["marginalise_inducing", "coherent_layers", "gaussian_parameters"]


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


class marginalise_inducing(Messenger):
    """Propagate each layer through its marginal ``q(f_l | f_{l-1})`` instead of a sampled ``u_l``.

    :param fn: the model.
    :param posteriors: ``{u-site name: (loc (P, M), scale (P, M, M) or (P, M))}``, the
        guide's Gaussian over each layer's inducing values. Layers whose ``u`` site is not
        listed fall back to ``p(f | u)`` with the ``u`` value at hand.
    :param quadrature_layer: name of the layer whose output is replaced by quadrature nodes
        of its (Gaussian, diagonal) marginal: value ``(K, N, P)``; every sample site after
        it is tagged ``infer["dgp_quadrature"] = True`` so an objective can weight the
        leading axis with :attr:`quadrature_weights`.
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
        self.posteriors = dict(posteriors or {})
        self.quadrature_layer = quadrature_layer
        self.quadrature_nodes = quadrature_nodes
        self.quadrature_weights = quadrature_weights
        if quadrature_layer is not None and quadrature_nodes is None:
            raise ValueError("marginalise_inducing: quadrature_layer needs quadrature_nodes")
        self.moments = {}
        self.layer_order = []
        self._in_tail = False
        super().__init__(fn)

    def __enter__(self):
        self.moments = {}
        self.layer_order = []
        self._in_tail = False
        return super().__enter__()

    def process_message(self, msg):
        if msg["type"] == "sample":
            infer = dict(msg.get("infer") or {})
            if msg["name"] in self.posteriors and not msg["is_observed"]:
                infer["dgp_marginalised"] = True
            if self._in_tail:
                infer["dgp_quadrature"] = True
            msg["infer"] = infer
            return
        if msg["type"] != "dgp_layer":
            return
        layer, X, u = msg["args"]
        full_cov = msg["kwargs"].get("full_cov", False)
        rng_key = msg["kwargs"]["rng_key"]
        if layer.u_site in self.posteriors:
            q_loc, q_scale = self.posteriors[layer.u_site]
            mean, var = layer_moments(layer, X, q_loc, q_scale, full_cov)
        else:
            mean, var = layer_moments(layer, X, u, None, full_cov)
        self.layer_order.append(layer.name)
        if layer.name == self.quadrature_layer:
            if full_cov:
                raise ValueError("marginalise_inducing: quadrature needs full_cov=False")
            nodes = jnp.asarray(self.quadrature_nodes, mean.dtype)  # (K, P)
            std = jnp.sqrt(jnp.maximum(var, 0.0))
            msg["value"] = mean[None] + std[None] * nodes[:, None, :]
            self._in_tail = True
            self.moments[layer.name] = (mean, var)
        else:
            msg["value"] = sample_moments(rng_key, mean, var, full_cov, layer.jitter)
            self.moments[layer.name] = (mean, var)


class coherent_layers(Messenger):
    """Draw every layer's output jointly over its input points (full covariance).

    Function samples drawn this way are smooth curves; the default point-by-point draw is
    enough for the ELBO but looks like noise when plotted. Cost ``O(N^3)`` per layer.
    """

    def process_message(self, msg):
        if msg["type"] == "dgp_layer":
            msg["kwargs"] = {**msg["kwargs"], "full_cov": True}

