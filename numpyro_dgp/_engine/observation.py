"""What the observation site after the last layer means to the objectives and to prediction.

An observation site is any NumPyro distribution whose parameters depend on the last layer's
output ``f``. The engine evaluates it with ``f`` at quadrature nodes (or Monte Carlo draws) of
the layer's Gaussian marginal, on a leading node axis, and this module reads the result:

* :func:`unwrap`: the distribution inside ``Independent`` / ``expand`` / ``mask`` wrappers;
* :func:`observation_kind`: how a predictive mixture component is summarized --
  ``"normal"`` (a Gaussian: exact when the location is affine in ``f`` and the scale does
  not depend on it), ``"bernoulli"`` and ``"categorical"`` (the node-averaged probabilities:
  exact, a mixture of Bernoulli/categorical distributions is one), or ``"general"`` (any other
  distribution of a scalar: the component is the node mixture of the distribution itself);
* :func:`likelihood_rule`: the nodes the objectives take the expectation with;
* :func:`closed_form_log_prob`: ``E_f[log p(y | f)]`` from the layer's mean and variance, for
  the likelihoods of :mod:`numpyro_dgp.likelihoods` that have one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from numpyro_dgp.core import gauss_hermite, gauss_hermite_product

__all__ = [
    "KINDS",
    "Rule",
    "Unwrapped",
    "closed_form_log_prob",
    "is_discrete",
    "likelihood_rule",
    "masked_value",
    "needs_closed_form",
    "observation_kind",
    "point_mask",
    "shared_rule",
    "spherical_rule",
    "unwrap",
]

#: the kinds of observation site (see the module docstring)
KINDS = ("normal", "bernoulli", "categorical", "general")

#: the most nodes a tensor-product Gauss-Hermite rule may have
MAX_NODES = 20_000


class Unwrapped(NamedTuple):
    """An observation distribution taken apart.

    :ivar base: the distribution inside the wrappers.
    :ivar shape: the wrapped distribution's batch + event shape (the base's parameters
        broadcast to it).
    :ivar event_ndims: batch dimensions of ``base`` reinterpreted as event dimensions.
    :ivar mask: the mask of a ``mask`` handler or ``.mask()`` (broadcastable to the base's
        batch shape), or ``None``.
    """

    base: dist.Distribution
    shape: tuple
    event_ndims: int
    mask: Any


def unwrap(fn: dist.Distribution) -> Unwrapped:
    """The distribution inside ``Independent``, ``ExpandedDistribution`` and
    ``MaskedDistribution`` wrappers (in any order), with what they add."""
    shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
    event_ndims, masks = 0, []
    while isinstance(fn, (dist.Independent, dist.ExpandedDistribution, dist.MaskedDistribution)):
        if isinstance(fn, dist.Independent):
            event_ndims += fn.reinterpreted_batch_ndims
        elif isinstance(fn, dist.MaskedDistribution) and fn._mask is not True:
            masks.append((fn._mask, event_ndims))
        fn = fn.base_dist
    mask = None
    for inner, outside in masks:
        # a mask covers its own batch shape: the dimensions an Independent inside it
        # reinterprets are trailing ones of the base's batch shape
        inner = jnp.reshape(inner, jnp.shape(inner) + (1,) * (event_ndims - outside))
        mask = inner if mask is None else mask & inner
    return Unwrapped(fn, shape, event_ndims, mask)


def masked_value(parts: Unwrapped, value: jax.Array) -> jax.Array:
    """``value`` with its masked-out entries replaced by a point of the base's support.

    A missing target is often NaN: ``jnp.where(mask, log_prob(NaN), 0)`` is finite but its
    gradient is ``0 * NaN``, so it must never reach the density (NumPyro's
    ``MaskedDistribution`` does the same).
    """
    if parts.mask is None:
        return value
    return jnp.where(point_mask(parts, value), value, parts.base.support.feasible_like(value))


def point_mask(parts: Unwrapped, value: jax.Array) -> jax.Array:
    """The site's mask per entry of ``value``: a mask that the engine broadcast over the
    leading node axis is the same at every node, and that axis is dropped."""
    mask = jnp.asarray(parts.mask)
    extra = mask.ndim - jnp.ndim(value)
    return mask[(0,) * extra] if extra > 0 else mask


def _varies_along_nodes(value: Any) -> bool:
    """Whether a parameter has the leading node axis (more than one value along it)."""
    return jnp.ndim(value) >= 1 and jnp.shape(value)[0] > 1


def observation_kind(fn: dist.Distribution, name: str, caller: str = "predict") -> str:
    """The kind of an observation site's distribution (one of :data:`KINDS`).

    :param fn: the site's distribution, evaluated at two or more of the last layer's nodes (a
        leading axis: a Normal scale that varies along it depends on the layer).
    :param name: the site's name (in error messages).
    :param caller: who asks (in error messages).
    :return: the kind.
    :raises NotImplementedError: for a distribution over vectors (other than categories).
    """
    base = unwrap(fn).base
    if isinstance(base, dist.Normal):
        return "general" if _varies_along_nodes(base.scale) else "normal"
    if isinstance(base, (dist.BernoulliProbs, dist.BernoulliLogits)):
        return "bernoulli"
    if isinstance(base, (dist.CategoricalProbs, dist.CategoricalLogits)):
        return "categorical"
    if tuple(base.event_shape) == ():
        return "general"
    raise NotImplementedError(
        f"{caller}: observation site {name!r} has a {type(base).__name__} likelihood over "
        f"vectors (event shape {tuple(base.event_shape)}); predictive mixtures take a "
        "distribution of scalars (one per point, or per point and column) or of categories. "
        "Observe each column in a plate instead of as one vector"
    )


class Rule(NamedTuple):
    """How the expectation over the last layer's ``P`` outputs is taken.

    :ivar nodes: ``(K, P)`` standard-normal nodes shared by every point, or ``None`` for ``K``
        independent standard-normal draws per point (Monte Carlo).
    :ivar weights: ``(K,)`` weights summing to one.
    """

    nodes: np.ndarray | None
    weights: np.ndarray


def spherical_rule(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``2 dim`` nodes ``+-sqrt(dim) e_i`` with weights ``1 / (2 dim)``: exact for every
    polynomial of degree up to 3 in ``xi ~ N(0, I_dim)`` (so for the expectation of a Gaussian
    log-density whose location is affine in the layer output).

    :param dim: ``P``.
    :return: ``(nodes (2 P, P), weights (2 P,))``.
    """
    eye = np.sqrt(dim) * np.eye(dim)
    return np.concatenate([eye, -eye]), np.full(2 * dim, 1.0 / (2 * dim))


def likelihood_rule(
    out_dim: int,
    kinds: list[str] | None = None,
    nodes_per_output: int | None = None,
    num_samples: int | None = None,
    caller: str = "DGPElbo",
) -> Rule:
    """The rule for ``E_f[...]`` over the last layer's ``P = out_dim`` outputs.

    * one output: ``nodes_per_output`` (default 20) Gauss-Hermite nodes;
    * several, with ``nodes_per_output`` given: the tensor-product Gauss-Hermite rule;
    * several, every observation site a Normal (``kinds`` all ``"normal"``): the ``2 P``-node
      rule of :func:`spherical_rule`, exact for a location affine in the outputs;
    * otherwise: ``num_samples`` (default 32) Monte Carlo draws per point.

    :param out_dim: ``P``.
    :param kinds: the observation sites' kinds (:func:`observation_kind`); ``None``: unknown.
    :param nodes_per_output: nodes per output.
    :param num_samples: Monte Carlo draws per point.
    :param caller: who asks (in error messages).
    :return: the :class:`Rule`.
    :raises ValueError: a tensor-product rule with more than 20,000 nodes.
    """
    if out_dim == 1:
        nodes, weights = gauss_hermite(20 if nodes_per_output is None else nodes_per_output)
        return Rule(nodes[:, None], weights)
    if nodes_per_output is not None:
        if nodes_per_output**out_dim > MAX_NODES:
            raise ValueError(
                f"{caller}: a tensor-product rule with num_quadrature={nodes_per_output} over "
                f"{out_dim} outputs has {nodes_per_output**out_dim} nodes; lower num_quadrature, "
                "or leave it None for Monte Carlo draws"
            )
        return Rule(*gauss_hermite_product(nodes_per_output, out_dim))
    if kinds and all(kind == "normal" for kind in kinds):
        return Rule(*spherical_rule(out_dim))
    num = 32 if num_samples is None else int(num_samples)
    return Rule(None, np.full(num, 1.0 / num))


def shared_rule(
    out_dim: int, kind: str, nodes_per_output: int, caller: str
) -> tuple[np.ndarray, np.ndarray]:
    """Nodes every point shares (no draws), for the deterministic predictions and bounds.

    * one output: ``nodes_per_output`` Gauss-Hermite nodes;
    * several, a Normal: the ``2 P`` nodes of :func:`spherical_rule` (exact for a location
      affine in the outputs);
    * several, another likelihood: the tensor-product rule with ``nodes_per_output`` nodes per
      output, fewer (at least 2) where that would pass 20,000 nodes.

    :param out_dim: ``P``.
    :param kind: the observation's kind (:func:`observation_kind`).
    :param nodes_per_output: nodes per output.
    :param caller: who asks (in error messages).
    :return: ``(nodes (K, P), weights (K,))``, standard-normal nodes.
    :raises ValueError: more outputs than a tensor-product rule of 2 nodes each can take.
    """
    if out_dim == 1:
        nodes, weights = gauss_hermite(nodes_per_output)
        return nodes[:, None], weights
    if kind == "normal":
        return spherical_rule(out_dim)
    per_output = min(nodes_per_output, int(MAX_NODES ** (1.0 / out_dim) + 1e-9))
    if per_output < 2:
        raise ValueError(
            f"{caller}: a deterministic rule over {out_dim} outputs of a {kind} likelihood "
            f"would need more than {MAX_NODES} nodes; use numpyro_dgp.predict (Monte Carlo "
            "draws per point)"
        )
    return gauss_hermite_product(per_output, out_dim)


def closed_form_log_prob(
    site: dict, last_output: Any, moments: tuple | None, correlated: bool
) -> jax.Array | None:
    """``E_f[log p(y | f)]`` of an observed site in closed form, per point (and branch), or
    ``None`` where there is none.

    A likelihood of :mod:`numpyro_dgp.likelihoods` with a method ``expected_log_prob(value,
    mean, var)`` gives it when it was built from the last layer's whole output (its ``latent``
    is that very array: the engine then knows the Gaussian ``N(mean, var)`` its argument
    follows) and the layer's outputs are independent given the run (a guide that correlates
    the layers couples several outputs at a point).

    :param site: the observed site (its distribution evaluated at the nodes).
    :param last_output: the last layer's value in the run (the nodes).
    :param moments: ``(mean, var)`` of the last layer, each ``(..., N, P)``.
    :param correlated: whether the layer's outputs are correlated at a point.
    :return: the log-densities with the site's mask applied and event dimensions summed,
        shape: the batch shape without the node axis; or ``None``.
    """
    parts = unwrap(site["fn"])
    expected = getattr(parts.base, "expected_log_prob", None)
    if (
        expected is None
        or moments is None
        or getattr(parts.base, "latent", None) is not last_output
    ):
        return None
    mean, var = moments
    if correlated and mean.shape[-1] > 1:
        return None
    lp = expected(masked_value(parts, site["value"]), mean, var)
    if parts.mask is not None:  # per point: the moments have no node axis
        lp = jnp.where(point_mask(parts, site["value"]), lp, 0.0)
    if parts.event_ndims:
        lp = jnp.sum(lp, axis=tuple(range(-parts.event_ndims, 0)))
    return lp


def needs_closed_form(site: dict) -> bool:
    """Whether the site's likelihood has no usable gradient at sampled ``f`` (it is piecewise
    constant in ``f``, as the robust max is) and so must take its closed form."""
    return bool(getattr(unwrap(site["fn"]).base, "requires_closed_form", False))


def is_discrete(base: dist.Distribution) -> bool:
    """Whether ``base`` lives on the integers (counts)."""
    return bool(base.support.is_discrete)
