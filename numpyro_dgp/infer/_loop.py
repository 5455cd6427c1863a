"""The training loop that :func:`~numpyro_dgp.fit` and :func:`~numpyro_dgp.fit_minibatches`
share: the guarded update, the host loop over chunks of steps (timing, losses, progress bar)
and the report of skipped updates.

The two drivers differ only in what a chunk is: ``fit`` runs a compiled ``lax.scan`` over its
steps (the data stay on the device); ``fit_minibatches`` dispatches one compiled update per
minibatch taken from an iterator. Both hand :meth:`TrainingLog.run` a function that runs the
next ``n`` steps and returns their losses and skip flags on the host.

"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import SVI
from numpyro.infer.svi import SVIState

from numpyro_dgp._validation import tree_all_finite
from numpyro_dgp.infer._checks import diagnosis

__all__ = ["TrainingLog", "guarded_update", "non_finite_params", "report_skipped"]


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
    why = diagnosis(svi, params, args, kwargs) if diagnose else ""
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
