"""Predictive mixtures: one component per propagated sample, summarized by the observation's kind.

A component is the observation site's distribution averaged over the last layer's marginal given the
sample (its quadrature nodes or Monte Carlo draws, with their weights). How it is kept depends on
the kind of the observation (:func:`~numpyro_dgp._engine.observation.observation_kind`):

* ``"normal"``: a Gaussian ``N(m_s, v_s)`` (node-weighted mean and variance of the location
  plus the noise): exact for a location affine in the layer;
* ``"bernoulli"`` / ``"categorical"``: the node-averaged probabilities (a mixture of
  Bernoulli or categorical distributions is one, so this is exact);
* ``"general"``: the distribution itself at every node (its *atoms*, ``(S, K, N, ...)``,
  with the node weights), and its mean and variance by the law of total variance.

The components are then mixed with equal weights (or a branching layer's weights).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpyro.distributions as dist

from numpyro_dgp._engine.observation import unwrap
from numpyro_dgp.core import standard_normal

#: Gauss-Hermite nodes per component for a one-output last layer, by kind: 3 give the exact
#: moments of a location affine in the layer; probabilities and other likelihoods are smooth
#: nonlinear functions of it (a likelihood much narrower than the layer's spread, a large
#: count under a wide marginal, is the hard case: 20 nodes keep such a density to ~1e-2)
PREDICTION_NODES = {"normal": 3, "bernoulli": 20, "categorical": 20, "general": 20}
#: Monte Carlo draws per point and component for a last layer of several outputs (a Normal
#: takes the exact ``2 P``-node rule instead).
PREDICTION_DRAWS = {"normal": 16, "bernoulli": 16, "categorical": 16, "general": 8}


def rule_arguments(kind: str, out_dim: int) -> tuple[int | None, int]:
    """``(num_quadrature, num_samples)`` of a prediction of this ``kind`` for
    :func:`~numpyro_dgp._engine.run.marginal_trace` and
    :func:`~numpyro_dgp._engine.observation.likelihood_rule`: Gauss-Hermite nodes for a one-output
    last layer, else Monte Carlo draws (a Normal takes the exact ``2 P``-node rule instead)."""
    return (PREDICTION_NODES[kind] if out_dim == 1 else None), PREDICTION_DRAWS[kind]


def _node_average(weights: jax.Array, values: jax.Array) -> jax.Array:
    return jnp.tensordot(jnp.asarray(weights, values.dtype), values, axes=(0, 0))


def summarize(
    fn: dist.Distribution, kind: str, weights: jax.Array
) -> tuple[jax.Array, jax.Array, Any]:
    """``(mean, variance, atoms)`` of ``y`` in one component, from the observation distribution
    ``fn`` evaluated at the last layer's nodes (leading axis) and the nodes' ``weights``.

    :param fn: the site's distribution, batch shape ``(K, ...)``.
    :param kind: its kind (:func:`~numpyro_dgp._engine.observation.observation_kind`).
    :param weights: ``(K,)`` node weights.
    :return: the component's mean and variance (the node axis averaged out) and, for the
        ``"general"`` kind, the atoms (``fn``'s distribution with every parameter broadcast to
        its batch shape), else ``None``.
    """
    base, shape = unwrap(fn)[:2]
    if kind == "normal":
        loc = jnp.broadcast_to(base.loc, shape)
        mean = _node_average(weights, loc)
        noise = jnp.broadcast_to(base.scale, shape)[0] ** 2
        return mean, _node_average(weights, (loc - mean) ** 2) + noise, None
    if kind in ("bernoulli", "categorical"):
        probs = base.probs
        probs = jnp.broadcast_to(probs, shape + probs.shape[len(base.batch_shape) :])
        p = _node_average(weights, probs)
        return p, p * (1 - p), None
    mean_k = jnp.broadcast_to(base.mean, shape)
    second = jnp.broadcast_to(base.variance, shape) + mean_k**2
    mean = _node_average(weights, mean_k)
    # the atoms: base (plain: a recipe of numpyro_dgp.likelihoods as its NumPyro parent) with
    # every parameter broadcast to the batch shape, so that they can be stacked, sliced and
    # written along the point axis like any array
    plain = base.plain() if hasattr(base, "plain") else base
    atoms = rebuild(plain, lambda a: jnp.broadcast_to(a, shape))
    return mean, _node_average(weights, second) - mean**2, atoms


def rebuild(d: dist.Distribution, transform: Any) -> dist.Distribution:
    """A fresh distribution of ``d``'s class from its parameters (the names of its
    ``arg_constraints``), each passed through ``transform`` (broadcast, sliced, gathered): unlike
    a map over its pytree leaves, the result's batch shape (and that of any distribution it
    holds inside) follows the new parameters.

    :raises NotImplementedError: a class whose constructor does not take its parameters by name.
    """
    names = list(d.arg_constraints)
    try:
        return type(d)(
            **{name: transform(jnp.asarray(getattr(d, name))) for name in names},
            validate_args=False,
        )
    except (TypeError, AttributeError) as err:
        raise NotImplementedError(
            f"predict: a {type(d).__name__} observation cannot be rebuilt from its parameters "
            f"{names} ({err}); predictive mixtures need a distribution whose constructor takes "
            "them by name"
        ) from None


def component_of(
    trace: dict,
    moments: dict,
    name: str,
    kind: str,
    weights: jax.Array,
    layer_names: list,
    draw_key: jax.Array,
) -> dict:
    """One mixture component from a run with nodes on the last layer: the observation
    summarized (:func:`summarize`), one draw of every layer, and the layers' moments.

    :return: the component's fields, named as the :class:`~numpyro_dgp.Prediction`'s (stacked,
        with a leading component axis): ``component_means`` and ``component_variances`` of
        ``y`` (``(N,)``, ``(N, T)`` for columns, ``(N, C)`` class probabilities), ``layers``
        (``{layer: (N, P)}`` one draw of every layer), ``layer_means`` and
        ``layer_variances`` (their marginal moments), and ``atoms`` (``"general"`` kind: the
        observation distribution at the nodes, batch shape ``(K, N, ...)``; else ``None``).
    """
    last = layer_names[-1]
    mean, variance, atoms = summarize(trace[name]["fn"], kind, weights)
    layers = {n: trace[n]["value"] for n in layer_names if n != last}
    mean_L, var_L = moments[last]
    layers[last] = mean_L + jnp.sqrt(jnp.maximum(var_L, 0)) * standard_normal(
        draw_key, mean_L.shape, mean_L.dtype
    )
    return {
        "component_means": mean,
        "component_variances": variance,
        "layers": layers,
        "layer_means": {n: moments[n][0] for n in layer_names},
        "layer_variances": {n: moments[n][1] for n in layer_names},
        "atoms": atoms,
    }


def _flatten(components: dict, log_weights: jax.Array) -> tuple[dict, jax.Array]:
    """Components ``(num_samples, B, ...)`` with branch log weights ``(num_samples, B)`` as one
    mixture of ``num_samples * B`` components (weights ``w_b / num_samples``); layer arrays
    without a branch axis (layers before the first branch) are broadcast to it."""
    num_samples, num_branches = log_weights.shape

    def flat(a: jax.Array) -> jax.Array:
        return a.reshape((-1,) + a.shape[2:])

    def flat_layer(a: jax.Array) -> jax.Array:
        if a.ndim == 3:  # (num_samples, N, P) before the first branching layer
            a = jnp.broadcast_to(a[:, None], (num_samples, num_branches) + a.shape[1:])
        return flat(a)

    weights = (jax.nn.softmax(log_weights, axis=-1) / num_samples).reshape(-1)
    flattened = {
        field: jax.tree_util.tree_map(flat_layer if field.startswith("layer") else flat, value)
        for field, value in components.items()
    }
    return flattened, weights.astype(components["component_means"].dtype)


def mixture_fields(
    kind: str, components: dict, log_weights: jax.Array | None, atom_weights: Any
) -> dict:
    """The arrays of the :class:`~numpyro_dgp.Prediction` of stacked ``components`` (leading
    axis ``S``), mixed with equal weights, or, with branches (a quadrature handler, an
    amortized guide), ``(S, B)`` components with the branch ``log_weights (S, B)`` as one mixture
    of ``S B`` (:func:`_flatten`): the mean, and the variance by the law of total variance
    (``mean (1 - mean)`` for probabilities).

    :return: ``{field: value}`` for every array field of the prediction.
    """
    average = lambda a: jnp.mean(a, axis=0)  # noqa: E731
    weights = None
    if log_weights is not None:
        components, weights = _flatten(components, log_weights)
        average = lambda a: jnp.tensordot(weights, a, axes=(0, 0))  # noqa: E731
    means = components["component_means"]
    mean = average(means)
    if kind in ("bernoulli", "categorical"):
        variance = mean * (1 - mean)
    else:
        variance = average(components["component_variances"] + means**2) - mean**2
    fields = {**components, "mean": mean, "variance": variance, "weights": weights}
    if components["atoms"] is None:
        return {**fields, "atom_weights": None}
    # rebuilt: a distribution mapped over (vmap, tree_map) keeps the batch shape it had
    atoms = rebuild(components["atoms"], lambda a: a)
    return {**fields, "atoms": atoms, "atom_weights": jnp.asarray(atom_weights, mean.dtype)}
