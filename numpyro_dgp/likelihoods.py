"""Observation distributions for the site after the last ``gp_layer``.

Any NumPyro distribution can follow the last layer. :class:`~numpyro_dgp.DGPElbo` takes its
expectation over the layer's Gaussian marginal in closed form where this module gives one
(the ``expected_log_prob`` method of :class:`PoissonLogLink`, :class:`HeteroscedasticNormal`
and :class:`RobustMax`, used when the distribution is built from the layer's whole output),
by Gauss-Hermite quadrature for one output, and by Monte Carlo draws otherwise
(:func:`numpyro_dgp._engine.observation.likelihood_rule`); :func:`~numpyro_dgp.predict` returns the
predictive distribution of the observation and :func:`~numpyro_dgp.metrics` its scores.

The recipes take the last layer's output ``f`` of shape ``(..., N, P)``; an output axis of
size one is dropped, so that one output gives one observation per point::

    f = gp_layer("f", h, RBF(), num_inducing=50, out_dim=1)
    with numpyro.plate("data", N):
        numpyro.sample("y", poisson(f), obs=counts)                   # y (N,)

    f = gp_layer("f", h, RBF(), num_inducing=50, out_dim=10)
    with numpyro.plate("data", N):
        numpyro.sample("y", softmax(f), obs=labels)                   # labels (N,) in 0..9

===============================  ==========================  =================================
recipe                           last layer                  ``E_f[log p(y | f)]`` in DGPElbo
===============================  ==========================  =================================
:func:`bernoulli_probit`         1 output (``f[..., 0]``)    Gauss-Hermite (20 nodes)
:func:`softmax`                  ``C`` outputs               Monte Carlo (32 draws per point)
:func:`robust_max`               ``C`` outputs               closed form up to a 1-D
                                                             Gauss-Hermite sum (GPflow's)
:func:`heteroscedastic_normal`   2 (mean, log-variance)      closed form
:func:`student_t`                1                           Gauss-Hermite (20 nodes)
:func:`poisson`                  1                           closed form
:func:`negative_binomial`        1                           Gauss-Hermite (20 nodes)
plain ``dist.Normal(f, s)``      any                         exact (Gauss-Hermite for one
                                                             output, 2P nodes for P)
===============================  ==========================  =================================

The closed forms need the layer's Gaussian per output: with a guide that correlates the
layers (:class:`~numpyro_dgp.guides.AutoChainDGP`, :class:`~numpyro_dgp.guides.AutoJointDGP`)
several outputs are coupled at a point and the quadrature or Monte Carlo rule is used instead.

**References:**

* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian
  process flows. AISTATS.
* Hernández-Lobato, Hernández-Lobato, Dupont (2011). Robust multi-class Gaussian process
  classification. NIPS. (The robust max.)
* Saul, Hensman, Vehtari, Lawrence (2016). Chained Gaussian processes. AISTATS.
  (Heteroscedastic and other likelihoods with a GP per parameter.)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.special import gammaln, ndtr
from jax.typing import ArrayLike

from numpyro_dgp._compat import is_tracer
from numpyro_dgp.core import gauss_hermite

__all__ = [
    "HeteroscedasticNormal",
    "PoissonLogLink",
    "RobustMax",
    "bernoulli_probit",
    "heteroscedastic_normal",
    "negative_binomial",
    "poisson",
    "robust_max",
    "softmax",
    "student_t",
]


def _check_number(value: Any, name: str, caller: str) -> float:
    """``value`` as a Python float.

    :raises TypeError: if it is not a number.
    """
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{caller}: {name} must be a number, got {value!r}") from None


def _check_outputs(f: ArrayLike, caller: str, minimum: int = 1) -> jax.Array:
    """``f`` as an array with an output axis of at least ``minimum`` entries.

    An array (or traced array) is kept as the same object: the engine recognizes a likelihood
    built from the last layer's output by identity (``jnp.asarray`` of a value traced for a
    gradient outside ``jit`` is a new object, and the closed form would be missed).

    :raises ValueError: for fewer outputs.
    """
    f = f if isinstance(f, jax.Array) else jnp.asarray(f)
    if f.ndim < 1 or f.shape[-1] < minimum:
        raise ValueError(
            f"{caller}: f must be the last layer's output (..., num_points, num_outputs) with "
            f"at least {minimum} output(s), got shape {f.shape}"
        )
    return f


def _squeeze_output(a: jax.Array) -> jax.Array:
    """Drop an output axis of size one (one observation per point)."""
    return a[..., 0] if a.shape[-1] == 1 else a


def bernoulli_probit(f: ArrayLike, squash: float = 1e-3) -> dist.BernoulliProbs:
    """Probit classification likelihood ``Bernoulli(squash + (1 - 2 squash) Phi(f))``.

    The squash keeps the probabilities in ``(squash, 1 - squash)`` so that ``log p(y | f)``
    stays finite at the far quadrature nodes (DiffGP, Hegde et al. 2019, uses ``1e-3``);
    ``squash=0`` gives the plain probit, whose predictive probability under ``f ~ N(m, v)`` is
    ``Phi(m / sqrt(1 + v))``.

    :param f: latent function values (e.g. ``f[..., 0]`` of the last layer), any shape.
    :param squash: ``0 <= squash < 0.5``.
    :return: ``dist.Bernoulli(probs=...)`` (a ``BernoulliProbs``) with the batch shape of
        ``f``.
    """
    value = _check_number(squash, "squash", "bernoulli_probit")
    if not 0.0 <= value < 0.5:
        raise ValueError(f"bernoulli_probit: squash must satisfy 0 <= squash < 0.5, got {squash!r}")
    f = jnp.asarray(f)
    return dist.Bernoulli(probs=value + (1.0 - 2.0 * value) * ndtr(f))


def softmax(f: ArrayLike) -> dist.CategoricalLogits:
    """Multi-class classification: ``Categorical(softmax(f))`` over the ``C`` outputs.

    :param f: ``(..., N, C)`` the last layer's output, ``C >= 2``.
    :return: ``dist.Categorical(logits=f)``, batch shape ``(..., N)``; labels in ``0..C-1``.
    """
    return dist.Categorical(logits=_check_outputs(f, "softmax", minimum=2))


class RobustMax(dist.CategoricalProbs):
    """The robust max (Hernández-Lobato et al. 2011; GPflow's ``RobustMax``): class ``c`` with
    probability ``1 - epsilon`` where ``f_c`` is the largest output, else ``epsilon / (C - 1)``.

    Its log-probability is piecewise constant in ``f``, so it trains only through
    :meth:`expected_log_prob` (:class:`~numpyro_dgp.DGPElbo` with an independent Gaussian per
    layer; the objectives refuse it otherwise). Under NumPyro's ``Trace_ELBO`` its gradient
    with respect to the layers is zero: use ``DGPElbo``.

    :param f: ``(..., N, C)`` the last layer's output.
    :param epsilon: the probability mass spread over the other classes, in ``(0, 1)``.
    """

    pytree_data_fields = ("latent",)
    pytree_aux_fields = ("epsilon",)
    #: piecewise constant in f: only the closed form gives gradients
    requires_closed_form = True

    def __init__(
        self, f: ArrayLike, epsilon: float = 1e-3, *, validate_args: bool | None = None
    ) -> None:
        f = _check_outputs(f, "robust_max", minimum=2)
        self.epsilon = _check_number(epsilon, "epsilon", "RobustMax")
        if not 0.0 < self.epsilon < 1.0:
            raise ValueError(f"RobustMax: epsilon must lie in (0, 1), got {epsilon!r}")
        self.latent = f
        C = f.shape[-1]
        largest = jax.nn.one_hot(jnp.argmax(f, axis=-1), C, dtype=f.dtype)
        probs = (1 - self.epsilon) * largest + self.epsilon / (C - 1) * (1 - largest)
        super().__init__(probs, validate_args=validate_args)

    def probability_largest(self, value: ArrayLike, mean: jax.Array, var: jax.Array) -> jax.Array:
        """``P(f_y is the largest output)`` under independent ``f_c ~ N(mean_c, var_c)``:
        ``int N(x | m_y, v_y) prod_{c != y} Phi((x - m_c) / s_c) dx`` by 20-node Gauss-Hermite.

        :param value: ``(..., N)`` labels.
        :param mean: ``(..., N, C)`` means of the outputs.
        :param var: ``(..., N, C)`` their variances.
        :return: ``(..., N)``.
        """
        nodes, weights = gauss_hermite(20)
        label = jnp.asarray(value).astype(jnp.int32)
        std = jnp.sqrt(jnp.maximum(var, jnp.finfo(var.dtype).tiny))
        m_y = jnp.take_along_axis(mean, label[..., None], axis=-1)
        s_y = jnp.take_along_axis(std, label[..., None], axis=-1)
        x = m_y[..., None] + s_y[..., None] * jnp.asarray(nodes, mean.dtype)  # (..., N, 1, K)
        cdf = ndtr((x - mean[..., None]) / std[..., None])  # (..., N, C, K)
        own = jax.nn.one_hot(label, mean.shape[-1], dtype=bool)[..., None]
        product = jnp.prod(jnp.where(own, 1.0, cdf), axis=-2)  # (..., N, K)
        return product @ jnp.asarray(weights, mean.dtype)

    def expected_log_prob(self, value: ArrayLike, mean: jax.Array, var: jax.Array) -> jax.Array:
        """``E_f[log p(y | f)] = P log(1 - epsilon) + (1 - P) log(epsilon / (C - 1))`` with
        ``P`` from :meth:`probability_largest`.

        :param value: ``(..., N)`` labels.
        :param mean: ``(..., N, C)`` the last layer's means.
        :param var: ``(..., N, C)`` its variances.
        :return: ``(..., N)``.
        """
        p = self.probability_largest(value, mean, var)
        C = mean.shape[-1]
        return p * np.log1p(-self.epsilon) + (1 - p) * np.log(self.epsilon / (C - 1))


#: Multi-class classification with the robust max: ``robust_max(f, epsilon=1e-3)``, ``f``
#: ``(..., N, C)`` with ``C >= 2`` (the class :class:`RobustMax`).
robust_max = RobustMax


class HeteroscedasticNormal(dist.Normal):
    """``Normal(f_mean, exp(f_logvar / 2))``: a Gaussian whose log-variance is a layer output.

    :param f: ``(..., N, 2 T)``: ``T`` means, then ``T`` log-variances (``T = 1``: one value
        per point).
    """

    pytree_data_fields = ("latent",)

    def __init__(self, f: ArrayLike, *, validate_args: bool | None = None) -> None:
        f = _check_outputs(f, "heteroscedastic_normal", minimum=2)
        if f.shape[-1] % 2:
            raise ValueError(
                "heteroscedastic_normal: f needs an even number of outputs (means, then "
                f"log-variances), got {f.shape[-1]}"
            )
        self.latent = f
        loc, log_var = self._split(f)
        super().__init__(loc, jnp.exp(0.5 * log_var), validate_args=validate_args)

    @staticmethod
    def _split(a: jax.Array) -> tuple[jax.Array, jax.Array]:
        half = a.shape[-1] // 2
        return _squeeze_output(a[..., :half]), _squeeze_output(a[..., half:])

    def expected_log_prob(self, value: ArrayLike, mean: jax.Array, var: jax.Array) -> jax.Array:
        """``E[log N(y | f_0, e^{f_1})]
        = -log(2 pi)/2 - m_1/2 - ((y - m_0)^2 + v_0) e^{-m_1 + v_1/2} / 2``
        for independent ``f_0 ~ N(m_0, v_0)``, ``f_1 ~ N(m_1, v_1)``.

        :param value: the observations.
        :param mean: ``(..., N, 2 T)`` the last layer's means.
        :param var: ``(..., N, 2 T)`` its variances.
        :return: the batch shape of ``value`` broadcast against the layer's.
        """
        (m0, m1), (v0, v1) = self._split(mean), self._split(var)
        log_normalizer = -0.5 * np.log(2 * np.pi) - 0.5 * m1
        return log_normalizer - 0.5 * ((value - m0) ** 2 + v0) * jnp.exp(-m1 + 0.5 * v1)

    def plain(self) -> dist.Normal:
        """The same distribution as a plain ``dist.Normal``."""
        return dist.Normal(self.loc, self.scale)


#: Heteroscedastic regression (Saul et al. 2016): ``heteroscedastic_normal(f)``, ``f``
#: ``(..., N, 2 T)``, the means then the log-variances (the class :class:`HeteroscedasticNormal`).
heteroscedastic_normal = HeteroscedasticNormal


def student_t(f: ArrayLike, df: ArrayLike, scale: ArrayLike) -> dist.StudentT:
    """Robust regression: ``StudentT(df, loc=f, scale)``.

    :param f: ``(..., N, 1)`` the last layer's output (or ``(..., N, T)`` for ``T`` columns).
    :param df: degrees of freedom (e.g. a positive ``numpyro.param``).
    :param scale: the scale (e.g. a positive ``numpyro.param``).
    :return: ``dist.StudentT``.
    """
    return dist.StudentT(df, _squeeze_output(_check_outputs(f, "student_t")), scale)


class PoissonLogLink(dist.Poisson):
    """``Poisson(exposure * exp(f))`` for counts, with ``E_f[log p]`` in closed form.

    :param f: ``(..., N, 1)`` (or ``(..., N, T)``) the last layer's output.
    :param exposure: a positive multiplier of the rate (e.g. the time or area counted over).
    """

    pytree_data_fields = ("latent", "exposure")

    def __init__(
        self, f: ArrayLike, exposure: ArrayLike = 1.0, *, validate_args: bool | None = None
    ) -> None:
        f = _check_outputs(f, "poisson")
        self.latent = f
        self.exposure = jnp.asarray(exposure, f.dtype)
        if not is_tracer(self.exposure) and not bool(jnp.all(self.exposure > 0)):
            raise ValueError(
                "poisson: exposure must be positive (the rate is exposure * exp(f)), got "
                f"{exposure!r}"
            )
        super().__init__(self.exposure * jnp.exp(_squeeze_output(f)), validate_args=validate_args)

    def expected_log_prob(self, value: ArrayLike, mean: jax.Array, var: jax.Array) -> jax.Array:
        """``E[log Poisson(y | a e^f)] = y (m + log a) - a e^{m + v/2} - log y!`` for
        ``f ~ N(m, v)``.

        :param value: the counts.
        :param mean: ``(..., N, P)`` the last layer's means.
        :param var: ``(..., N, P)`` its variances.
        :return: the batch shape of ``value`` broadcast against the layer's.
        """
        m, v = _squeeze_output(mean), _squeeze_output(var)
        a, y = self.exposure, jnp.asarray(value)
        log_factorial = gammaln(jnp.asarray(value, m.dtype) + 1)
        return y * (m + jnp.log(a)) - a * jnp.exp(m + 0.5 * v) - log_factorial

    def plain(self) -> dist.Poisson:
        """The same distribution as a plain ``dist.Poisson``."""
        return dist.Poisson(self.rate)


#: Counts: ``poisson(f, exposure=1.0)``, ``Poisson(exposure * exp(f))`` (the class
#: :class:`PoissonLogLink`).
poisson = PoissonLogLink


def negative_binomial(f: ArrayLike, concentration: ArrayLike) -> dist.NegativeBinomial2:
    """Over-dispersed counts: mean ``exp(f)``, variance ``mean + mean^2 / concentration``.

    :param f: ``(..., N, 1)`` the last layer's output (or ``(..., N, T)`` for ``T`` columns).
    :param concentration: the positive concentration (e.g. a ``numpyro.param``).
    :return: ``dist.NegativeBinomial2``.
    """
    return dist.NegativeBinomial2(
        jnp.exp(_squeeze_output(_check_outputs(f, "negative_binomial"))), concentration
    )
