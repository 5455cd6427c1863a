"""Why a fit skipped steps: an eager diagnostic run that finds the layer whose ``K(Z, Z)``
cannot be factorized.

A failed Cholesky factorization inside the compiled training step gives NaN, which
:func:`~numpyro_dgp.fit` detects and skips; on its own that says nothing about where. After a
fit that skipped steps, one eager run of the guide and the model at the final (last accepted)
parameters checks every layer's ``Kmm_chol``, stopping at the first that is not finite.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
import numpyro
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.primitives import Messenger

from numpyro_dgp._protocol import LAYER_MESSAGE, message_layer

__all__ = ["diagnose_layers", "failed_layer"]


class _Stop(Exception):
    """Ends the diagnostic run at the first failed layer."""


class _check_factors(Messenger):
    """Records the first layer whose ``Kmm_chol`` holds NaN or inf, and stops the run there."""

    def __init__(self, fn: Callable | None = None) -> None:
        self.failed: str | None = None
        super().__init__(fn)

    def process_message(self, msg: dict) -> None:
        if msg["type"] != LAYER_MESSAGE:
            return
        layer = message_layer(msg)
        if not np.all(np.isfinite(np.asarray(layer.Kmm_chol))):
            self.failed = layer.name
            raise _Stop


def failed_layer(
    model: Callable,
    guide: Callable | None,
    params: dict,
    args: tuple,
    kwargs: dict,
    rng_key: jax.Array,
) -> tuple[str | None, str | None]:
    """``(layer, error)``: the first layer whose ``K(Z, Z)`` factor is not finite at ``params``
    (``None`` if every layer's is), and the error that stopped the check early, if any."""
    model_run = substitute(seed(model, rng_key), data=params)
    with numpyro.validation_enabled(False):
        if guide is not None:
            try:
                guide_trace = trace(
                    substitute(seed(guide, jax.random.fold_in(rng_key, 1)), data=params)
                ).get_trace(*args, **kwargs)
                model_run = replay(model_run, guide_trace)
            except Exception:  # noqa: BLE001
                # the guide itself may fail at these values: check the model alone
                pass
        checker = _check_factors(model_run)
        try:
            checker(*args, **kwargs)
        except _Stop:
            pass
        except Exception as err:  # noqa: BLE001 - report, do not mask the fit's own message
            return checker.failed, f"{type(err).__name__}: {err}"
    return checker.failed, None


def diagnose_layers(svi: Any, state: Any, args: tuple, kwargs: dict) -> str:
    """A sentence for :func:`~numpyro_dgp.fit`'s warning or error about skipped steps: the layer
    whose ``K(Z, Z)`` cannot be factorized at the final parameters, with what to do, or that
    every layer's can."""
    layer, error = failed_layer(
        svi.model,
        svi.guide,
        svi.get_params(state),
        args,
        {**kwargs, **svi.static_kwargs},
        jax.random.PRNGKey(0),
    )
    if layer is not None:
        return (
            f" The Cholesky factorization of K(Z, Z) fails in layer {layer!r} at the final "
            "parameters (a near-singular K(Z, Z): inducing inputs too close for the kernel's "
            "lengthscale, or too small a jitter): raise that layer's jitter "
            f"(gp_layer({layer!r}, ..., jitter=...)) or use float64 "
            "(jax.config.update('jax_enable_x64', True))."
        )
    if error is not None:
        return f" (Checking each layer's K(Z, Z) at the final parameters failed: {error}.)"
    return (
        " Every layer's K(Z, Z) factorizes at the final parameters, so the non-finite values came "
        "from elsewhere: a NaN or inf in a minibatch, the likelihood or the objective, or too "
        "large a learning rate."
    )
