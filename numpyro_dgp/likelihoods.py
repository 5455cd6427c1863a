"""Observation distributions for the site after the last ``gp_layer``.

Any NumPyro distribution can follow the last layer: :class:`~numpyro_dgp.DGPElbo` takes its
expectation over the layer's Gaussian marginal by Gauss-Hermite quadrature. This module holds
the non-Gaussian ones the package also predicts with (:func:`~numpyro_dgp.predict`)::

    f = gp_layer("f", X, RBF(), num_inducing=20)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", bernoulli_probit(f[..., 0]), obs=y)

**References:**

* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian
  process flows. AISTATS.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro.distributions as dist
from jax.scipy.special import ndtr
from jax.typing import ArrayLike

__all__ = ["bernoulli_probit"]


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
    try:
        value = float(squash)
    except (TypeError, ValueError):
        raise TypeError(f"bernoulli_probit: squash must be a number, got {squash!r}") from None
    if not 0.0 <= value < 0.5:
        raise ValueError(f"bernoulli_probit: squash must satisfy 0 <= squash < 0.5, got {squash!r}")
    f = jnp.asarray(f)
    return dist.Bernoulli(probs=value + (1.0 - 2.0 * value) * ndtr(f))
