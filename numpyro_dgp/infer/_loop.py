"""The training loop that :func:`~numpyro_dgp.fit` and :func:`~numpyro_dgp.fit_minibatches`
share: the guarded update, the host loop over chunks of steps (timing, losses, progress bar)
and the report of skipped updates.

The two drivers differ only in what a chunk is: ``fit`` runs a compiled ``lax.scan`` over its
steps (the data stay on the device); ``fit_minibatches`` dispatches one compiled update per
minibatch taken from an iterator. Both hand :meth:`TrainingLog.run` a function that runs the
next ``n`` steps and returns their losses and skip flags on the host.

A failed Cholesky factorization inside the compiled step gives NaN, which the guarded update
skips; on its own that says nothing about where. After a fit that skipped steps, one eager run
of the guide and the model at the final (last accepted) parameters checks every layer's
``Kmm_chol`` and names the first that is not finite (:func:`failed_layer`).
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer import SVI
from numpyro.infer.svi import SVIState
from numpyro.primitives import Messenger

from numpyro_dgp._protocol import LAYER_MESSAGE, message_layer
from numpyro_dgp._validation import tree_all_finite

__all__ = ["TrainingLog", "failed_layer", "guarded_update", "non_finite_params", "report_skipped"]


def select(flag: jax.Array | bool, new: Any, old: Any) -> Any:
    """``new`` where ``flag``, else ``old``, leaf by leaf."""
    return jax.tree_util.tree_map(lambda n, o: jnp.where(flag, n, o), new, old)


def guarded_update(
    svi: SVI,
    state: SVIState,
    args: tuple,
    kwargs: dict,
    active: jax.Array | bool = True,
    barrier: bool = True,
) -> tuple[SVIState, jax.Array, jax.Array]:
    """One SVI update, applied only where its loss and new parameters are finite.

    A skipped update still advances the key (it is not retried with the same draw). An
    inactive step (``active`` false: padding a chunk) leaves the whole state as it was, key
    included, so that a run does not depend on how its steps are cut into chunks.

    ``barrier`` materializes the finiteness check and the new state before selecting with them:
    otherwise XLA fuses every select with the reduction over all parameters, and a scan over
    the steps of a large model compiles 3-4x longer. The fusion it prevents changes round-off,
    so a run with and without it differs in the last digits (and a chaotic optimization then
    further).

    :return: ``(state, loss, skipped)``; ``skipped`` is ``active & ~finite``.
    """
    new_state, loss = svi.update(state, *args, **kwargs)
    finite = jnp.isfinite(loss) & tree_all_finite(new_state.optim_state)
    new_optim_state = new_state.optim_state
    if barrier:
        finite, new_optim_state = jax.lax.optimization_barrier((finite, new_optim_state))
    accept = finite & active
    mutable = new_state.mutable_state
    if mutable is not None:
        mutable = select(accept, mutable, state.mutable_state)
    rng_key = (
        new_state.rng_key if active is True else select(active, new_state.rng_key, state.rng_key)
    )
    state = new_state._replace(
        optim_state=select(accept, new_optim_state, state.optim_state),
        mutable_state=mutable,
        rng_key=rng_key,
    )
    return state, loss, active & ~finite


class TrainingLog:
    """The host's record of a run: losses, skipped updates, chunk times, progress bar.

    :param caller: the driver's name (messages).
    :param num_steps: steps of the whole run.
    :param losses: losses of the steps already done (a resumed run).
    :param num_skipped: skipped updates among them.
    :param progress_bar: show a tqdm progress bar (plain text: no ipywidgets needed in notebooks).
    """

    def __init__(
        self,
        caller: str,
        num_steps: int,
        losses: np.ndarray | None = None,
        num_skipped: int = 0,
        progress_bar: bool = True,
    ) -> None:
        self.caller, self.num_steps = caller, int(num_steps)
        self.done = 0 if losses is None else len(losses)
        self.num_skipped = int(num_skipped)
        self.losses = np.empty(num_steps)
        self.losses[: self.done] = [] if losses is None else losses
        self.chunk_seconds: list[float] = []
        self.progress_bar = progress_bar

    def run(
        self,
        run_chunk: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        chunk_length: Callable[[int], int],
        after_chunk: Callable[[int], None] = lambda done: None,
    ) -> None:
        """Run chunks until every step is done: ``run_chunk(done, n)`` runs the
        ``n = chunk_length(done)`` steps after the ``done`` steps so far and returns their losses
        and skip flags on the host (the synchronization that ends the chunk);
        ``after_chunk(steps done)`` follows each chunk."""
        from tqdm import tqdm

        bar = tqdm(
            total=self.num_steps,
            initial=self.done,
            desc="fit",
            unit="step",
            disable=not self.progress_bar,
        )
        with bar:
            while self.done < self.num_steps:
                n = chunk_length(self.done)
                start = time.perf_counter()
                losses, skipped = map(np.asarray, run_chunk(self.done, n))
                self.chunk_seconds.append(time.perf_counter() - start)
                self.losses[self.done : self.done + n] = losses
                self.num_skipped += int(np.sum(skipped))
                self.done += n
                finite = losses[np.isfinite(losses)]
                loss = f"{finite.mean():.4g}" if finite.size else "nan"
                bar.set_postfix(loss=loss, skipped=self.num_skipped)
                bar.update(n)
                after_chunk(self.done)


def non_finite_params(params: dict) -> list[str]:
    """Names of the entries of ``params`` holding NaN or inf (checked on the host)."""
    return [
        k
        for k, v in params.items()
        if np.issubdtype(np.asarray(v).dtype, np.inexact) and not np.all(np.isfinite(np.asarray(v)))
    ]


def report_skipped(
    log: TrainingLog, svi: SVI, params: dict, args: tuple, kwargs: dict, diagnose: bool = True
) -> None:
    """Warn about skipped updates; raise when the run diverged: every update skipped, or final
    (constrained) parameters ``params`` that are not finite, which no model can be loaded or
    predict with. With ``diagnose``, an eager run at the final parameters names the layer whose
    ``K(Z, Z)`` fails."""
    bad = non_finite_params(params)
    if not (log.num_skipped or bad):
        return
    why = _diagnosis(svi, params, args, kwargs) if diagnose else ""
    if log.num_skipped == log.num_steps:
        raise FloatingPointError(
            f"{log.caller}: every update produced a non-finite loss or parameters; check the data "
            "scale, the jitter (numpyro_dgp.core.default_jitter) and the learning rate." + why
        )
    if bad:
        first = np.flatnonzero(~np.isfinite(log.losses))
        at = " at its last step"
        if first.size:
            at = (
                f" at step {first[0] + 1} (the first whose loss was not finite; "
                f"{log.num_skipped} of {log.num_steps} updates skipped)"
            )
        raise FloatingPointError(
            f"{log.caller}: the fit diverged{at}: the final parameters {bad} are not finite. "
            "Lower the learning rate or clip the updates (optax.clip_by_global_norm), and check "
            "the data scale." + why
        )
    warnings.warn(
        f"{log.caller}: skipped {log.num_skipped} of {log.num_steps} updates with non-finite loss "
        "or parameters (not applied)." + why,
        RuntimeWarning,
        stacklevel=3,
    )


class _Stop(Exception):
    """Ends the diagnostic run at the first failed layer."""


class _check_factors(Messenger):
    """Records the first layer whose ``Kmm_chol`` holds NaN or inf, and stops the run there."""

    failed: str | None = None

    def process_message(self, msg: dict) -> None:
        if msg["type"] != LAYER_MESSAGE:
            return
        layer = message_layer(msg)
        if not np.all(np.isfinite(np.asarray(layer.Kmm_chol))):
            self.failed = layer.name
            raise _Stop


def failed_layer(
    model: Callable, guide: Callable | None, params: dict, args: tuple, kwargs: dict
) -> tuple[str | None, str | None]:
    """``(layer, error)``: the first layer whose ``K(Z, Z)`` factor is not finite at ``params``
    (``None`` if every layer's is), and the error that stopped the check early, if any."""
    rng_key = jax.random.PRNGKey(0)
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


def _diagnosis(svi: Any, params: dict, args: tuple, kwargs: dict) -> str:
    """A sentence for the warning or error about skipped steps: the layer whose ``K(Z, Z)``
    cannot be factorized at the final parameters, with what to do, or that every layer's can."""
    model_kwargs = {**kwargs, **svi.static_kwargs}
    layer, error = failed_layer(svi.model, svi.guide, params, args, model_kwargs)
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
