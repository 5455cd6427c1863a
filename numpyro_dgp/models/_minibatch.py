"""The factories' data plate: ``batch_size`` points of ``X`` drawn per call, or ``X`` itself
as a minibatch of ``num_data`` points."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro
from numpyro.primitives import Messenger

from numpyro_dgp._validation import check_positive_int

__all__ = ["subsample"]


class _plate_indices(Messenger):
    """Serve the subsample indices of the plate ``name`` (NumPyro would draw them)."""

    def __init__(self, name, indices):
        self.name, self.indices = name, indices
        super().__init__()

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] == self.name and msg["value"] is None:
            msg["value"] = self.indices


def _check_minibatch(batch_size: int | None, num_data: int | None, N: int, caller: str) -> None:
    """A model's ``batch_size`` (points drawn per call) or ``num_data`` (``X`` is a minibatch of
    that many).

    :raises ValueError: for a value that is not a positive integer, both given, or ``num_data``
        below ``N``.
    """
    check_positive_int(batch_size, "batch_size", caller, allow_none=True)
    if num_data is None:
        return
    check_positive_int(num_data, "num_data", caller)
    if batch_size is not None:
        raise ValueError(
            f"{caller}: give batch_size (draw minibatches of X) or num_data (X is a minibatch), "
            "not both"
        )
    if num_data < N:
        raise ValueError(
            f"{caller}: num_data={num_data} is below the {N} points of the minibatch X"
        )


def subsample(X, y, batch_size, caller, num_data, with_replacement_above):
    """The data plate and the minibatch: ``batch_size`` points of ``X`` (drawn here), or, with
    ``num_data``, ``X`` itself as a minibatch of a data set of ``num_data`` points (drawn by
    the caller, e.g. from host memory; the likelihood is scaled by ``num_data / len(X)``).
    Above ``with_replacement_above`` points (the factories pass
    :data:`numpyro_dgp.models.WITH_REPLACEMENT_ABOVE`) the indices are drawn with
    replacement; below, by NumPyro's function."""
    N = X.shape[0]
    _check_minibatch(batch_size, num_data, N, caller)
    if num_data is not None:
        with _plate_indices("data", jnp.arange(N)):
            data = numpyro.plate("data", int(num_data), subsample_size=N)
        return data, X, y
    subsample_size = batch_size if batch_size and batch_size < N else None
    key = numpyro.prng_key() if subsample_size and N > with_replacement_above else None
    if key is not None:
        with _plate_indices("data", jax.random.randint(key, (subsample_size,), 0, N)):
            data = numpyro.plate("data", N, subsample_size=subsample_size)
    else:
        data = numpyro.plate("data", N, subsample_size=subsample_size)
    with data:
        X_batch = numpyro.subsample(X, event_dim=1)
        y_batch = (
            None if y is None else numpyro.subsample(y, event_dim=y.ndim - 1)
        )  # (N,) or (N, T)
    return data, X_batch, y_batch
