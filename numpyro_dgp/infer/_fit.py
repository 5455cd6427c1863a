"""``fit``: a compiled SVI loop (``lax.scan`` over chunks of steps) with a host progress bar.

**References:**

* Izmailov, Podoprikhin, Garipov, Vetrov, Wilson (2018). Averaging weights leads to wider
  optima and better generalization. UAI.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import SVI
from numpyro.infer.svi import SVIState

from numpyro_dgp._cache import OwnerCache

__all__ = ["FitResult", "fit"]

#: compiled chunk functions per SVI object
_CHUNK_RUNNERS = OwnerCache(max_entries=16)


class FitResult(NamedTuple):
    """What :func:`fit` returns.

    :ivar params: constrained parameters (``svi.get_params(state)``), ``{site: array}``.
    :ivar losses: ``(num_steps,)`` loss per step (non-finite where the step was skipped).
    :ivar state: the final ``SVIState`` (pass back as ``init_state`` to continue).
    :ivar num_skipped: steps whose loss or new parameters were not finite (not applied).
    :ivar chunk_seconds: ``(num_chunks,)`` wall time of each compiled chunk (compilation
        excluded).
    :ivar chunk_size: steps per chunk.
    :ivar compile_seconds: time to trace, lower and compile the chunk function before the
        first chunk (near 0 when ``svi`` already has it compiled for these shapes).
    :ivar averaged_params: with ``fit(..., average_from=k)``, the averaged parameters
        (constrained); ``None`` otherwise.
    """

    params: dict
    losses: np.ndarray
    state: SVIState
    num_skipped: int
    chunk_seconds: np.ndarray
    chunk_size: int
    compile_seconds: float
    averaged_params: dict | None = None

    @property
    def seconds_per_step(self) -> float:
        """Time per step: median over the chunks (compilation is not in them)."""
        return float(np.median(self.chunk_seconds) / self.chunk_size)


def _is_array(x):
    return isinstance(x, (jax.Array, np.ndarray))


def _check_finite_args(args, kwargs):
    for where, value in [(f"args[{i}]", a) for i, a in enumerate(args)] + [
        (f"{k}=", v) for k, v in kwargs.items()
    ]:
        if _is_array(value) and jnp.issubdtype(value.dtype, jnp.floating):
            if not bool(jnp.all(jnp.isfinite(value))):
                raise ValueError(f"fit: model argument {where} contains NaN or inf values")


def _all_finite(tree):
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _chunk_runner(svi, chunk, static_args, static_kwargs, average=False):
    """The jitted ``lax.scan`` over ``chunk`` SVI steps, cached per ``svi`` and static arguments.

    With ``average`` the carry also holds a running mean of the unconstrained parameters over
    the steps with index ``>= average_start`` (relative to the chunk's first step).
    """
    try:
        key = (chunk, average, static_args, tuple(sorted(static_kwargs.items())))
        hash(key)
    except TypeError:  # unhashable static arguments: compile for this call only
        key = None
    # Kept per svi (weakly): fit(..., init_state=result.state) and repeated fits reuse the
    # compilation, and it goes when svi goes. The step holds svi weakly for the same reason.
    if key is not None:
        cached = _CHUNK_RUNNERS.get(svi, key)
        if cached is not None:
            return cached
    svi_ref = weakref.ref(svi)

    def merge(dyn_a, dyn_kw):
        full = [d if s is None else s for d, s in zip(dyn_a, static_args)]
        return full, {**static_kwargs, **dyn_kw}

    def step(carry, step_index, num_remaining, dyn_a, dyn_kw, average_start):
        state, mean, count = carry
        a, kw = merge(dyn_a, dyn_kw)
        svi = svi_ref()
        new_state, loss = svi.update(state, *a, **kw)
        finite = jnp.isfinite(loss) & _all_finite(new_state.optim_state)
        active = step_index < num_remaining
        accept = finite & active
        kept = jax.tree_util.tree_map(lambda n, o: jnp.where(accept, n, o), new_state.optim_state, state.optim_state)
        kept_mutable = new_state.mutable_state if new_state.mutable_state is None else jax.tree_util.tree_map(
            lambda n, o: jnp.where(accept, n, o), new_state.mutable_state, state.mutable_state)
        # the key always advances so a skipped step is not retried with the same draw
        state = new_state._replace(optim_state=kept, mutable_state=kept_mutable)
        if average:
            # a skipped update still counts, with the parameters it left unchanged
            include = active & (step_index >= average_start)
            count = count + include
            current = svi.optim.get_params(state.optim_state)
            mean = jax.tree_util.tree_map(
                lambda m, p: jnp.where(include, m + (p - m) / jnp.maximum(count, 1), m), mean, current)
        return (state, mean, count), (loss, active & ~finite)

    @jax.jit
    def run_chunk(state, num_remaining, dyn_a, dyn_kw, mean, count, average_start):
        def body(carry, i):
            return step(carry, i, num_remaining, dyn_a, dyn_kw, average_start)
        return jax.lax.scan(body, (state, mean, count), jnp.arange(chunk))

    if key is not None:
        _CHUNK_RUNNERS.put(svi, key, run_chunk)
    return run_chunk


def fit(
    svi: SVI,
    rng_key: jax.Array,
    *args,
    num_steps: int,
    chunk_size: int = 100,
    progress_bar: bool = True,
    init_state: SVIState | None = None,
    init_params: dict | None = None,
    average_from: int | None = None,
    **kwargs,
) -> FitResult:
    """Run ``num_steps`` SVI updates compiled as a ``lax.scan`` over chunks of ``chunk_size``.

    The chunk function is compiled once per ``svi`` (and chunk size and static arguments) and
    reused by later calls, e.g. ``fit(..., init_state=result.state)``; between chunks the host
    updates a progress bar (the only host synchronization). An update whose loss or new
    parameters are not finite is not applied (the random key still advances) and is counted
    in ``num_skipped``.
    Minibatching comes from the model's ``numpyro.plate(..., subsample_size=...)``.

    :param svi: a ``numpyro.infer.SVI`` (any NumPyro or optax optimizer, any ELBO).
    :param rng_key: PRNG key for initialization (ignored when ``init_state`` is given).
    :param args: model arguments; arrays are passed to the compiled function, other
        values are treated as static.
    :param num_steps: number of optimization steps.
    :param chunk_size: steps per compiled chunk (progress-bar granularity).
    :param progress_bar: show a tqdm progress bar.
    :param init_state: continue from a previous ``FitResult.state``.
    :param init_params: initial constrained parameter values for ``svi.init``.
    :param average_from: also return, as ``FitResult.averaged_params``, the mean of the
        parameters after each of the steps ``average_from + 1, ..., num_steps`` of this call
        (iterate averaging, as in stochastic weight averaging: Izmailov et al., 2018). The mean
        is taken over the unconstrained values the optimizer updates, so it is valid for every
        constraint, and mapped back through the constraints. A skipped update counts with the
        unchanged parameters. ``None`` (default): no averaging.
    :param kwargs: model keyword arguments, split into traced arrays and static values as
        ``args`` are.
    :return: :class:`FitResult`.
    """
    if not (isinstance(num_steps, (int, np.integer)) and num_steps >= 1):
        raise ValueError(f"fit: num_steps must be a positive integer, got {num_steps!r}")
    if not (isinstance(chunk_size, (int, np.integer)) and chunk_size >= 1):
        raise ValueError(f"fit: chunk_size must be a positive integer, got {chunk_size!r}")
    if average_from is not None and not (
            isinstance(average_from, (int, np.integer)) and 0 <= average_from < num_steps):
        raise ValueError(f"fit: average_from must be an integer in [0, num_steps) = [0, {num_steps}), "
                         f"got {average_from!r}")
    _check_finite_args(args, kwargs)

    if init_state is None:
        from numpyro_dgp.infer._init import init  # a sibling that imports the guides

        state = init(svi, rng_key, *args, init_params=init_params, **kwargs)
    else:
        state = init_state
    params0 = svi.get_params(state)
    if not bool(_all_finite(params0)):
        bad = [k for k, v in params0.items() if not bool(jnp.all(jnp.isfinite(v)))]
        raise FloatingPointError(f"fit: initial parameters are not finite: {bad}")

    # Arrays are traced arguments; everything else (ints used as subsample sizes, flags) is static.
    dyn_args = [a if _is_array(a) else None for a in args]
    static_args = tuple(None if _is_array(a) else a for a in args)
    dyn_kwargs = {k: v for k, v in kwargs.items() if _is_array(v)}
    static_kwargs = {k: v for k, v in kwargs.items() if not _is_array(v)}
    chunk = min(int(chunk_size), int(num_steps))
    average = average_from is not None
    run_chunk = _chunk_runner(svi, chunk, static_args, static_kwargs, average)
    # without averaging the mean is an empty placeholder carried through the scan
    mean = svi.optim.get_params(state.optim_state) if average else {}
    count = jnp.zeros((), jnp.int32)

    # Compiled ahead of the first chunk so that compilation is timed on its own (the jitted
    # call below reuses this executable); cheap when svi already has it for these shapes.
    start = time.perf_counter()
    run_chunk.lower(state, jnp.asarray(num_steps), dyn_args, dyn_kwargs, mean, count, jnp.asarray(0)).compile()
    compile_seconds = time.perf_counter() - start

    num_chunks = math.ceil(num_steps / chunk)
    losses = np.empty(num_chunks * chunk)
    num_skipped = 0
    chunk_seconds = []
    bar = None
    if progress_bar:
        from tqdm import tqdm  # plain text: no ipywidgets needed in notebooks

        bar = tqdm(total=num_steps, desc="fit", unit="step")
    try:
        for c in range(num_chunks):
            remaining = num_steps - c * chunk
            start = time.perf_counter()
            average_start = jnp.asarray((average_from if average else 0) - c * chunk)
            (state, mean, count), (chunk_losses, skipped) = run_chunk(
                state, jnp.asarray(remaining), dyn_args, dyn_kwargs, mean, count, average_start)
            chunk_losses = np.asarray(chunk_losses)  # the host sync that ends the chunk
            chunk_seconds.append(time.perf_counter() - start)
            losses[c * chunk:(c + 1) * chunk] = chunk_losses
            num_skipped += int(np.sum(np.asarray(skipped)))
            if bar is not None:
                done = min(chunk, remaining)
                finite = chunk_losses[:done][np.isfinite(chunk_losses[:done])]
                bar.set_postfix(loss=f"{finite.mean():.4g}" if finite.size else "nan", skipped=num_skipped)
                bar.update(done)
    finally:
        if bar is not None:
            bar.close()
    losses = losses[:num_steps]
    if num_skipped == num_steps:
        raise FloatingPointError(
            "fit: every update produced a non-finite loss or parameters; check the data scale, "
            "the jitter (numpyro_dgp.core.default_jitter) and the learning rate"
        )
    if num_skipped:
        warnings.warn(
            f"fit: skipped {num_skipped} of {num_steps} updates with non-finite loss or parameters",
            RuntimeWarning,
            stacklevel=2,
        )
    averaged = svi.constrain_fn(mean) if average else None
    return FitResult(svi.get_params(state), losses, state, num_skipped, np.asarray(chunk_seconds), chunk,
                     compile_seconds, averaged)
