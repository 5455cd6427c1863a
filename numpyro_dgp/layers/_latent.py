"""Latent-variable inputs: a per-point latent ``w_n ~ N(0, I)`` concatenated to a layer's input.

A layer that sees ``[x_n, w_n]`` can represent conditional densities a GP alone cannot
(several modes, input-dependent noise of any shape): the latent-variable layer of Salimbeni,
Dutordoir, Hensman & Deisenroth (2019) and GPflux's ``LatentVariableLayer``::

    with numpyro.plate("data", N):
        h = latent_input("w", X, latent_dim=1)          # (N, D + 1)
    f = gp_layer("f", h, RBF(), num_inducing=50)

The library's guides give each point's ``q(w_n)``: free parameters per point, or an encoder
of ``encoder_input`` (default ``X``; pass ``[x_n, y_n]`` to let the targets inform it, as in the
paper). :class:`~numpyro_dgp.DGPElbo` takes the KL of ``q(w_n)`` in closed form;
:class:`~numpyro_dgp.ImportanceWeightedElbo` draws ``K`` latents per point and
importance-weights them; :func:`~numpyro_dgp.predict` draws the latents of new points from
their prior, so the predictive is a mixture over them (multimodal where the data are).

**References:**

* Salimbeni, Dutordoir, Hensman, Deisenroth (2019). Deep Gaussian processes with
  importance-weighted variational inference. ICML.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike

from numpyro_dgp._compat import active_plates
from numpyro_dgp._protocol import send_latent
from numpyro_dgp._validation import as_float_array, check_positive_int

__all__ = ["LatentSpec", "latent_input"]


class LatentSpec(NamedTuple):
    """A latent input as its :data:`~numpyro_dgp._protocol.LATENT_MESSAGE` carries it.

    :ivar name: the latent sample site.
    :ivar latent_dim: ``Q``, the latent dimensions per point.
    :ivar encoder_input: ``(B, E)`` what an amortized guide's encoder sees.
    """

    name: str
    latent_dim: int
    encoder_input: jax.Array


def latent_input(
    name: str, X: ArrayLike, latent_dim: int = 1, *, encoder_input: ArrayLike | None = None
) -> jax.Array:
    """Concatenate a latent ``w_n ~ N(0, I_Q)`` to every point's input: ``[x_n, w_n]``.

    Call it inside the data plate (``w`` is local: one per point, subsampled with the points);
    the sample site ``name`` holds ``w`` (``(B, Q)``).

    :param name: the latent site's name.
    :param X: ``(B, D)`` the points' inputs (the plate's ``B`` points).
    :param latent_dim: ``Q``.
    :param encoder_input: ``(B, E)`` what an amortized guide's encoder maps to ``q(w_n)``
        (default ``X``; e.g. ``jnp.concatenate([X, y[:, None]], -1)`` when ``y`` is given).
    :return: ``(B, D + Q)``; with ``K`` importance draws of ``w`` (an objective's),
        ``(K, B, D + Q)``.
    :raises ValueError: outside a data plate, or inputs of another shape than the plate's.
    :raises RuntimeError: without a random key (the model must run under ``seed``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"latent_input: name must be a non-empty string, got {name!r}")
    check_positive_int(latent_dim, "latent_dim", f"latent_input {name!r}")
    plates = [p for p in active_plates() if p.dim == -1]
    if not plates:
        raise ValueError(
            f"latent_input {name!r}: w is one latent per point; call it inside the data plate "
            "(with numpyro.plate('data', N): h = latent_input(...))"
        )
    B = plates[0].subsample_size
    X = as_float_array(X, "X", f"latent_input {name!r}")
    if X.ndim != 2 or X.shape[0] != B:
        raise ValueError(
            f"latent_input {name!r}: X must have shape ({B}, dim), the plate's {B} points; "
            f"got {X.shape}"
        )
    encoder_input = (
        X
        if encoder_input is None
        else as_float_array(encoder_input, "encoder_input", f"latent_input {name!r}")
    )
    if encoder_input.ndim != 2 or encoder_input.shape[0] != B:
        raise ValueError(
            f"latent_input {name!r}: encoder_input must have shape ({B}, features), got "
            f"{encoder_input.shape}"
        )
    rng_key = numpyro.prng_key()
    if rng_key is None:
        raise RuntimeError(
            f"latent_input {name!r} needs a random key: run the model under numpyro.handlers.seed"
        )
    send_latent(LatentSpec(name, int(latent_dim), encoder_input), rng_key)
    prior = dist.Normal(jnp.zeros((B, int(latent_dim)), X.dtype), 1.0).to_event(1)
    w = jnp.asarray(numpyro.sample(name, prior), X.dtype)
    return jnp.concatenate([jnp.broadcast_to(X, w.shape[:-1] + X.shape[-1:]), w], axis=-1)
