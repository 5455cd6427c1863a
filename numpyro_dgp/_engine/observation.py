"""The observation site after the last layer: what it means to the objectives and to
prediction, and the one the model factories build (:class:`Observation`).

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
  the likelihoods of :mod:`numpyro_dgp.likelihoods` that have one;
* :class:`Observation`: a factory's likelihood by name (:data:`LIKELIHOODS`), the shape and
  checks of its targets, and its site ``"y"``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from numpyro_dgp import likelihoods
from numpyro_dgp._validation import (
    as_float_array,
    check_choice,
    check_finite,
    check_positive_int,
    concrete,
    warn_if_target_not_standardized,
)
from numpyro_dgp.core import gauss_hermite, gauss_hermite_product

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


def masked_log_prob(parts: Unwrapped, value: jax.Array, log_prob: Callable) -> jax.Array:
    """``log_prob(value)`` with the site's mask applied and its event dimensions summed.

    A missing target is often NaN: ``jnp.where(mask, log_prob(NaN), 0)`` is finite but its
    gradient is ``0 * NaN``, so masked-out entries are replaced by a point of the base's support
    before ``log_prob`` sees them (NumPyro's ``MaskedDistribution`` does the same). A mask that
    the engine broadcast over the leading node axis is the same at every node: that axis is
    dropped.
    """
    mask = None if parts.mask is None else jnp.asarray(parts.mask)
    if mask is not None:
        extra = mask.ndim - jnp.ndim(value)
        mask = mask[(0,) * extra] if extra > 0 else mask
        value = jnp.where(mask, value, parts.base.support.feasible_like(value))
    lp = log_prob(value)
    if mask is not None:
        lp = jnp.where(mask, lp, 0.0)
    if parts.event_ndims:
        lp = jnp.sum(lp, axis=tuple(range(-parts.event_ndims, 0)))
    return lp


def observation_kind(fn: dist.Distribution, name: str, caller: str = "predict") -> str:
    """The kind of an observation site's distribution (see the module docstring).

    :param fn: the site's distribution, evaluated at two or more of the last layer's nodes (a
        leading axis: a Normal scale that varies along it depends on the layer).
    :param name: the site's name (in error messages).
    :param caller: who asks (in error messages).
    :return: the kind.
    :raises NotImplementedError: for a distribution over vectors (other than categories).
    """
    base = unwrap(fn).base
    if isinstance(base, dist.Normal):  # a scale with more than one value along the node axis
        varies = jnp.ndim(base.scale) >= 1 and jnp.shape(base.scale)[0] > 1
        return "general" if varies else "normal"
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
) -> tuple[np.ndarray | None, np.ndarray]:
    """The rule for ``E_f[...]`` over the last layer's ``P = out_dim`` outputs: ``(nodes,
    weights)``, ``(K, P)`` standard-normal nodes shared by every point (``None`` for ``K``
    independent standard-normal draws per point, Monte Carlo) and ``(K,)`` weights summing to
    one.

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
    :return: ``(nodes, weights)``.
    :raises ValueError: a tensor-product rule with more than 20,000 nodes.
    """
    if out_dim == 1:
        nodes, weights = gauss_hermite(20 if nodes_per_output is None else nodes_per_output)
        return nodes[:, None], weights
    if nodes_per_output is not None:
        if nodes_per_output**out_dim > MAX_NODES:
            raise ValueError(
                f"{caller}: a tensor-product rule with num_quadrature={nodes_per_output} over "
                f"{out_dim} outputs has {nodes_per_output**out_dim} nodes; lower num_quadrature, "
                "or leave it None for Monte Carlo draws"
            )
        return gauss_hermite_product(nodes_per_output, out_dim)
    if kinds and all(kind == "normal" for kind in kinds):
        return spherical_rule(out_dim)
    num = 32 if num_samples is None else int(num_samples)
    return None, np.full(num, 1.0 / num)


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
    latent = getattr(parts.base, "latent", None)
    if expected is None or moments is None or latent is not last_output:
        return None
    mean, var = moments
    if correlated and mean.shape[-1] > 1:
        return None
    return masked_log_prob(parts, site["value"], lambda value: expected(value, mean, var))


def is_discrete(base: dist.Distribution) -> bool:
    """Whether ``base`` lives on the integers (counts)."""
    return bool(base.support.is_discrete)


#: The factories' likelihoods (:mod:`numpyro_dgp.likelihoods`): what their targets ``y`` hold
#: (real numbers, 0/1 labels, class labels ``0..C-1`` or counts) and the recipe of their
#: distribution given the last layer's output
_TABLE: dict[str, tuple[str, Any]] = {
    "gaussian": ("real", None),
    "probit": ("labels", likelihoods.bernoulli_probit),
    "softmax": ("classes", likelihoods.softmax),
    "robust_max": ("classes", likelihoods.robust_max),
    "student_t": ("real", likelihoods.student_t),
    "poisson": ("counts", likelihoods.poisson),
    "negative_binomial": ("counts", likelihoods.negative_binomial),
    "heteroscedastic": ("real", likelihoods.heteroscedastic_normal),
}
#: The factories' likelihoods by name
LIKELIHOODS = tuple(_TABLE)
#: the values of ``missing_targets``
MISSING_TARGETS = ("raise", "mask")


class Observation(NamedTuple):
    """A factory's observation site: the likelihood and the shape of its targets.

    :ivar likelihood: one of :data:`LIKELIHOODS`.
    :ivar num_outputs: ``T``, target columns (``y`` is ``(N,)`` for one, ``(N, T)``).
    :ivar num_classes: ``C`` for ``"softmax"`` and ``"robust_max"``.
    :ivar noise_init: initial noise variance (``"gaussian"``; ``"student_t"``: the squared scale).
    :ivar missing_targets: ``"raise"`` (NaN targets are refused) or ``"mask"`` (entries of
        ``y`` that are NaN are left out of the likelihood).
    """

    likelihood: str = "gaussian"
    num_outputs: int = 1
    num_classes: int | None = None
    noise_init: float = 0.01
    missing_targets: str = "raise"

    @property
    def continuous(self) -> bool:
        """Whether the targets are real numbers (not class labels or counts)."""
        return _TABLE[self.likelihood][0] == "real"

    @property
    def width(self) -> int:
        """The last layer's number of outputs."""
        if _TABLE[self.likelihood][0] == "classes":
            return int(cast(int, self.num_classes))  # given for these likelihoods (see check)
        return 2 * self.num_outputs if self.likelihood == "heteroscedastic" else self.num_outputs

    def check(self, caller: str) -> None:
        """Check the options when the model is built (naming the argument).

        :raises NotImplementedError: an unknown likelihood.
        :raises ValueError: a bad ``num_outputs``, ``num_classes`` or ``missing_targets``.
        """
        check_choice(self.likelihood, LIKELIHOODS, "likelihood", caller, error=NotImplementedError)
        check_positive_int(self.num_outputs, "num_outputs", caller)
        # num_classes: an integer >= 2 for the class likelihoods (one column of labels), else absent
        likelihood, num_classes = self.likelihood, self.num_classes
        classes = _TABLE[likelihood][0] == "classes"
        if classes and not (
            isinstance(num_classes, (int, np.integer))
            and not isinstance(num_classes, bool)
            and num_classes >= 2
        ):
            raise ValueError(
                f"{caller}: likelihood={likelihood!r} needs num_classes, an integer >= 2, got "
                f"{num_classes!r}"
            )
        if classes and self.num_outputs != 1:
            raise ValueError(
                f"{caller}: likelihood={likelihood!r} takes one column of labels; got "
                f"num_outputs={self.num_outputs}"
            )
        if not classes and num_classes is not None:
            raise ValueError(
                f"{caller}: num_classes is for likelihood='softmax' or 'robust_max', not "
                f"{likelihood!r}"
            )
        check_choice(self.missing_targets, MISSING_TARGETS, "missing_targets", caller)

    def targets(
        self, y: ArrayLike | None, num_points: int, dtype: Any, caller: str
    ) -> jax.Array | None:
        """``y`` at the door: ``(N,)`` (``(N, 1)`` squeezed) or ``(N, T)``; continuous targets cast
        to ``dtype`` (and, when concrete, a :class:`~numpyro_dgp.TargetScaleWarning` if far from
        standardized); NaN or infinities refused (naming ``y``; NaN entries pass when masked);
        concrete labels and counts checked.

        :raises ValueError: for another shape, non-finite values or invalid labels or counts.
        """
        if y is None:
            return None
        value = concrete(y) if self.continuous else None  # before the cast: NumPy targets too
        if value is not None:
            warn_if_target_not_standardized(np.asarray(value, np.float64), "y", caller, 5)
        y = jnp.asarray(y)
        T = self.num_outputs
        expected = (num_points,) if T == 1 else (num_points, T)
        if T == 1 and y.shape == (num_points, 1):
            y = y[:, 0]
        if y.shape != expected:
            also = f" (or ({num_points}, 1))" if T == 1 else ""
            raise ValueError(
                f"{caller}: y must have shape {expected}{also} to match the {num_points} input "
                f"points of X{'' if T == 1 else f' and its {T} target columns'}, got shape "
                f"{tuple(y.shape)}"
            )
        masked = self.missing_targets == "mask"
        if self.continuous or masked:
            y = as_float_array(y, "y", caller).astype(dtype)
        if not masked:
            check_finite(y, "y", caller)
        elif (value := concrete(y)) is not None and np.isinf(value).any():
            raise ValueError(
                f"{caller}: y contains infinite values (NaN entries are masked, infinities are not)"
            )
        if not self.continuous:
            _check_discrete_targets(y, self, caller)
        return y

    def observe(self, f: jax.Array, y: jax.Array | None, data: Any, dtype: Any) -> None:
        """The observation site ``"y"`` in the plate ``data``, given the last layer's output
        ``f``."""
        fn = self._distribution(f, dtype)
        if y is not None and self.missing_targets == "mask":
            present = ~jnp.isnan(y)
            fn = fn.mask(present)
            y = jnp.where(present, y, 0.0)
            if not self.continuous:
                y = y.astype(jnp.int32)
        if self.num_outputs > 1:
            fn = fn.to_event(1)
        with data:
            numpyro.sample("y", fn, obs=y)

    def _distribution(self, f: jax.Array, dtype: Any) -> dist.Distribution:
        name = self.likelihood
        if name in ("gaussian", "probit") and self.num_outputs == 1:
            f = f[..., 0]
        if name == "gaussian":
            noise = self._param("noise", self.noise_init, constraints.positive, dtype)
            return dist.Normal(f, jnp.sqrt(noise))
        recipe = _TABLE[name][1]
        if name == "student_t":
            df = self._param("df", 4.0, constraints.greater_than(1.0), dtype)
            scale = self._param("scale", np.sqrt(self.noise_init), constraints.positive, dtype)
            return recipe(f, df, scale)
        if name == "negative_binomial":
            concentration = self._param("concentration", 1.0, constraints.positive, dtype)
            return recipe(f, concentration)
        return recipe(f)

    def _param(self, name: str, init: Any, constraint: Any, dtype: Any) -> jax.Array:
        """A learned parameter of the likelihood: one per target column."""
        shape = () if self.num_outputs == 1 else (self.num_outputs,)
        return numpyro.param(name, jnp.full(shape, init, dtype), constraint=constraint)


def _check_discrete_targets(y: jax.Array, observation: Observation, caller: str) -> None:
    """Refuse concrete labels outside ``0..C-1`` (0/1 for probit) and counts that are not
    non-negative integers (NaN entries pass when they are masked)."""
    value = concrete(y)
    if value is None:
        return
    value = value[~np.isnan(value)] if np.issubdtype(value.dtype, np.inexact) else value.ravel()
    if _TABLE[observation.likelihood][0] == "counts":
        bad = (value < 0) | (value != np.round(value))
        what = "non-negative integer counts"
    else:
        num_classes = 2 if observation.likelihood == "probit" else observation.num_classes
        assert num_classes is not None  # Observation.check: the class likelihoods have it
        bad = ~np.isin(value, np.arange(num_classes))
        what = "0/1 labels" if num_classes == 2 else f"class labels in 0..{num_classes - 1}"
    if bad.any():
        raise ValueError(
            f"{caller}: y must hold {what} for likelihood={observation.likelihood!r}; got "
            f"{int(bad.sum())} other value(s), e.g. {value[bad][0].item()!r}"
        )
