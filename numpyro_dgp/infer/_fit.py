"""``fit``: a compiled SVI loop (``lax.scan`` over chunks of steps) with a host progress bar.

The loop here is shared with :func:`~numpyro_dgp.fit_minibatches`: the guarded update (an
update whose loss or new parameters are not finite is not applied) and the host loop over
chunks of steps (:class:`TrainingLog`: timing, losses, progress bar). The two drivers differ
only in what a chunk is: ``fit`` runs a compiled ``lax.scan`` over its steps (the data stay on
the device); ``fit_minibatches`` dispatches one compiled update per minibatch taken from an
iterator. Checkpointing (``Checkpoints``) is an optional piece run after each chunk.

Both start from :func:`initial_state`: the guide set up under a key of its own, ``init_params``
checked, then :func:`init`, ``svi.init`` compiled as one program. NumPyro's ``svi.init`` runs
the guide and the model eagerly, and JAX compiles every operation outside a jitted function on
its first use: a two-layer DGP's initialization (k-means of the inducing inputs, kernel
matrices, Cholesky factors, the guide's draws) compiles dozens of small programs, seconds of a
fresh process. :func:`init` reads the guide's structure from one abstract run (nothing
compiled) and runs ``svi.init`` inside ``jax.jit``: one program, the same initial values.

**References:**

* Izmailov, Podoprikhin, Garipov, Vetrov, Wilson (2018). Averaging weights leads to wider
  optima and better generalization. UAI.
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import SVI
from numpyro.infer.svi import SVIState

from numpyro_dgp._compat import innermost_guide
from numpyro_dgp._validation import check_positive_int, hashable, split_traced, tree_all_finite
from numpyro_dgp.guides import DGPGuide
from numpyro_dgp.infer._checks import (
    Checkpoints,
    check_data,
    check_observed,
    check_start,
    failed_layer,
    non_finite_params,
    report_skipped,
)
from numpyro_dgp.io import ParameterMismatchError, check_against_model, set_up_guide

#: ``fold_in`` data of the key that sets up the guide (apart from the key ``svi.init`` gets)
_SETUP_STREAM = 0x5E7

#: XLA options of the initialization's program, which runs once per shape: without XLA's
#: optimization passes it compiles in about half the time, rounded alike up to fused arithmetic
ONE_SHOT_OPTIONS = {"xla_backend_optimization_level": 0}


def init(
    svi: SVI, rng_key: jax.Array, *args: Any, init_params: dict | None = None, **kwargs: Any
) -> SVIState:
    """The initial ``SVIState`` of ``svi``: ``svi.init`` compiled as one program.

    The same state as ``svi.init(rng_key, *args, init_params=init_params, **kwargs)``, for the
    library's guides (``AutoFactorizedDGP``, ``AutoJointDGP``, ``AutoChainDGP``,
    ``AutoAmortizedDGP``) without latent hyperparameters; other guides run ``svi.init`` as it
    is. Array arguments are inputs of the compiled program; other arguments (a batch size)
    are static. JAX keeps the program per ``svi`` and argument shapes: a second initialization
    (another key, other data of the same shapes) does not compile again.
    :func:`numpyro_dgp.fit` initializes with it.

    Checks that NumPyro's distributions make on concrete values are skipped in the compiled
    run; :func:`numpyro_dgp.fit` checks its data for NaN and inf first.

    :param svi: a ``numpyro.infer.SVI``.
    :param rng_key: PRNG key (as for ``svi.init``).
    :param args: the model's positional arguments.
    :param init_params: initial constrained values of some parameters.
    :param kwargs: the model's keyword arguments.
    :return: the initial ``SVIState``.
    """
    guide = innermost_guide(svi.guide)
    if isinstance(guide, DGPGuide) and guide.prototype_trace is None:
        guide._setup_prototype(*args, **kwargs)
    dyn_args, static_args, dyn_kwargs, static_kwargs = split_traced(args, kwargs)
    # svi.init runs inside jit for the library's guides, whose structure is read abstractly, and
    # that own no NumPyro sub-guide (an AutoNormal for latent hyperparameters builds its
    # structure from concrete values on its first call)
    compilable = isinstance(guide, DGPGuide) and guide._other_guide is None
    statics = (svi, static_args, static_kwargs)
    # unhashable static arguments: as svi.init does
    if not (compilable and hashable(statics)):
        return svi.init(rng_key, *args, init_params=init_params, **kwargs)
    return _compiled_init(statics, rng_key, dyn_args, dyn_kwargs, init_params)


@partial(jax.jit, static_argnums=0, compiler_options=ONE_SHOT_OPTIONS)
def _compiled_init(
    statics: tuple, rng_key: jax.Array, dyn_args: tuple, dyn_kwargs: dict, init_params: dict | None
) -> SVIState:
    """``svi.init`` of ``statics = (svi, static_args, static_kwargs)`` and the traced arguments."""
    svi, static_args, static_kwargs = statics
    call_args = tuple(s if d is None else d for d, s in zip(dyn_args, static_args))
    model_kwargs = {**dict(static_kwargs), **dyn_kwargs}
    return svi.init(rng_key, *call_args, init_params=init_params, **model_kwargs)


def initial_state(svi, rng_key, args, kwargs, init_params=None, strict=True):
    """``svi.init`` (compiled: :func:`numpyro_dgp.infer.init`) after setting up the guide (see
    :func:`numpyro_dgp.io.set_up_guide`) and checking ``init_params``; when the model
    cannot be initialized (NaN from a layer), name the layer whose ``K(Z, Z)`` fails."""
    model_kwargs = {**kwargs, **svi.static_kwargs}
    try:
        set_up_guide(svi.guide, jax.random.fold_in(rng_key, _SETUP_STREAM), args, model_kwargs)
        if init_params is not None:
            checked = (svi.model, svi.guide, init_params, args, model_kwargs, strict)
            check_against_model(*checked, "fit (init_params)", require_finite=True)
        return init(svi, rng_key, *args, init_params=init_params, **kwargs)
    except (ValueError, RuntimeError) as err:
        if isinstance(err, ParameterMismatchError):
            raise
        layer, _ = failed_layer(svi.model, None, dict(init_params or {}), args, model_kwargs)
        if layer is None:
            raise
        raise type(err)(
            "fit: the model cannot be initialized: the Cholesky factorization of K(Z, Z) fails in "
            f"layer {layer!r} at its initial values; raise that layer's jitter "
            f"(gp_layer({layer!r}, ..., jitter=...)), use float64 "
            f"(jax.config.update('jax_enable_x64', True)) or spread its inducing inputs. ({err})"
        ) from err


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
    the steps of a large model compiles several times longer. The fusion it prevents changes
    round-off, so a run with and without it differs in the last digits (and a chaotic
    optimization then further).

    :return: ``(state, loss, skipped)``; ``skipped`` is ``active & ~finite``.
    """
    new_state, loss = svi.update(state, *args, **kwargs)
    finite = jnp.isfinite(loss) & tree_all_finite(new_state.optim_state)
    new_optim_state = new_state.optim_state
    if barrier:
        finite, new_optim_state = jax.lax.optimization_barrier((finite, new_optim_state))
    accept = finite & active
    state = new_state._replace(
        optim_state=select(accept, new_optim_state, state.optim_state),
        mutable_state=select(accept, new_state.mutable_state, state.mutable_state),
        rng_key=select(active, new_state.rng_key, state.rng_key),
    )
    return state, loss, active & ~finite


def timed_compile(jitted: Any, *args: Any) -> tuple[Any, float]:
    """``jitted`` compiled for ``args`` ahead of its first call, so that compilation is timed on
    its own, and the seconds that took."""
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - start


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
        losses: np.ndarray = np.empty(0),
        num_skipped: int = 0,
        progress_bar: bool = True,
    ) -> None:
        self.caller, self.num_steps = caller, int(num_steps)
        self.done, self.num_skipped = len(losses), int(num_skipped)
        self.losses = np.empty(num_steps)
        self.losses[: self.done] = losses
        self.chunk_seconds: list[float] = []
        self.progress_bar = progress_bar

    def run(
        self,
        run_chunk: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        chunk_length: Callable[[int], int],
        after_chunk: Callable[[TrainingLog], None] = lambda log: None,
    ) -> None:
        """Run chunks until every step is done: ``run_chunk(done, n)`` runs the
        ``n = chunk_length(done)`` steps after the ``done`` steps so far and returns their losses
        and skip flags on the host (the synchronization that ends the chunk);
        ``after_chunk(self)`` follows each chunk."""
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
                after_chunk(self)

    def result(
        self, svi, params, state, args, kwargs, chunk_size, compile_seconds, averaged=None, **how
    ) -> FitResult:
        """The :class:`FitResult` of the finished run, after reporting its skipped updates
        (``how``: :func:`report_skipped`'s options)."""
        report_skipped(self, svi, params, args, kwargs, **how)
        timing = np.asarray(self.chunk_seconds), chunk_size, compile_seconds
        return FitResult(params, self.losses, state, self.num_skipped, *timing, averaged)


class _Unhashable(tuple):
    """A chunk's statics holding a model argument that cannot be hashed: compiled for this fit
    alone (compared by identity)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def _cache_key(statics: tuple) -> tuple:
    """``statics`` as they are, or compared by identity when they cannot be hashed."""
    return statics if hashable(statics) else _Unhashable(statics)


@partial(jax.jit, static_argnums=0)
def _run_chunk(statics, carry, num_active, average_start, dyn_args, dyn_kwargs):
    """A ``lax.scan`` over ``chunk`` SVI steps; the steps with index ``>= num_active`` are
    inactive (they change nothing). ``statics`` is ``(svi, chunk, average, static_args,
    static_kwargs)``: JAX keeps the program per ``svi``, chunk size and static arguments, so
    ``fit(..., init_state=result.state)`` and repeated fits reuse it.

    ``carry`` is ``(state, mean, count)``: with ``average``, a running mean of the unconstrained
    parameters over the steps with index ``>= average_start`` (relative to the chunk's first
    step) and its number of steps.
    """
    svi, chunk, average, static_args, static_kwargs = statics
    args = [d if s is None else s for d, s in zip(dyn_args, static_args)]
    kwargs = {**dict(static_kwargs), **dyn_kwargs}

    def step(carry, step_index):
        state, mean, count = carry
        active = step_index < num_active
        state, loss, skipped = guarded_update(svi, state, args, kwargs, active)
        if average:
            # a skipped update still counts, with the parameters it left unchanged
            include = active & (step_index >= average_start)
            count = count + include
            current = svi.optim.get_params(state.optim_state)
            mean = jax.tree_util.tree_map(
                lambda m, p: jnp.where(include, m + (p - m) / jnp.maximum(count, 1), m),
                mean,
                current,
            )
        return (state, mean, count), (loss, skipped)

    carry, per_step = jax.lax.scan(step, carry, jnp.arange(chunk))
    # the constrained parameters come out of the same program: a separate jitted get_params
    # would be one more compilation before the first step can finish
    return carry, per_step, svi.get_params(carry[0])


def fit(
    svi: SVI,
    rng_key: jax.Array | None,
    *args: Any,
    num_steps: int,
    chunk_size: int = 100,
    progress_bar: bool = True,
    init_state: SVIState | None = None,
    init_params: dict | None = None,
    average_from: int | None = None,
    strict: bool = True,
    checkpoint_path: os.PathLike | str | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    allow_missing: bool = False,
    **kwargs: Any,
) -> FitResult:
    """Run ``num_steps`` SVI updates compiled as a ``lax.scan`` over chunks of ``chunk_size``.

    The chunk function is compiled once per ``svi`` (and chunk size and static arguments) and
    reused by later calls, e.g. ``fit(..., init_state=result.state)``. Between chunks the host
    updates a progress bar (the only host synchronization). An update whose loss or new
    parameters are not finite is not applied (the random key still advances) and is counted in
    ``num_skipped``; when steps were skipped, an eager run at the final parameters checks every
    layer's ``K(Z, Z)`` factorization and the warning (or error, if every step was skipped)
    names the layer that fails, if one does. Minibatching comes from the model's
    ``numpyro.plate(..., subsample_size=...)``.

    **Reproducible and resumable.** The run does not depend on how its steps are cut: the
    padding steps of a last, partial chunk change nothing (not even the key), so
    ``fit(a)`` then ``fit(b, init_state=result.state)`` equals ``fit(a + b)`` bit for bit, for
    any ``chunk_size``. The guide is set up (its prototype trace built) under a key of its own
    before ``svi.init``, so fitting the same ``SVI`` object twice with the same key gives the
    same result (NumPyro's autoguides otherwise draw their set-up key from ``svi.init``'s
    stream on the first call only). With ``checkpoint_path`` the fit writes a checkpoint
    (atomically) every ``checkpoint_every`` steps and at the end; ``resume=True`` continues
    from it, and the resumed fit ends exactly where the uninterrupted one would (same
    parameters, losses and averaged parameters).

    :param svi: a ``numpyro.infer.SVI`` (any NumPyro or optax optimizer, any ELBO).
    :param rng_key: PRNG key for initialization (may be ``None`` when ``init_state`` is given).
    :param args: model arguments; arrays are passed to the compiled function, other
        values are treated as static. A first argument that is a 2-D float array (the inputs
        ``X``) gives an :class:`~numpyro_dgp.InputScaleWarning` when far from standardized.
    :param num_steps: number of optimization steps (with ``resume``: in total, the steps
        before the checkpoint included).
    :param chunk_size: steps per compiled chunk (progress-bar granularity).
    :param progress_bar: show a tqdm progress bar.
    :param init_state: continue from a previous ``FitResult.state``.
    :param init_params: initial constrained values of parameter sites for ``svi.init``
        (e.g. a loaded ``FitResult.params``), checked against what the model and guide create
        (names, shapes, dtypes, finiteness).
    :param average_from: also return, as ``FitResult.averaged_params``, the mean of the
        parameters after each of the steps ``average_from + 1, ..., num_steps`` of this call
        (iterate averaging, as in stochastic weight averaging: Izmailov et al., 2018). The mean
        is taken over the unconstrained values the optimizer updates, so it is valid for every
        constraint, and mapped back through the constraints. A skipped update counts with the
        unchanged parameters. ``None`` (default): no averaging.
    :param strict: with ``init_params``, refuse missing and unexpected entries (``False``: a
        partial initialization; the entries given are still checked).
    :param checkpoint_path: file of the checkpoint (written at the end, and every
        ``checkpoint_every`` steps); it holds the optimizer state, the step count, the key,
        the averaging state and the losses so far (:mod:`numpyro_dgp.io` format). It must be
        new or a checkpoint a fit wrote (a file of yours is never written over), in an existing
        folder: checked before any work.
    :param checkpoint_every: steps between checkpoints (needs ``checkpoint_path``).
    :param resume: continue from ``checkpoint_path`` if that file exists (else start afresh,
        so the same call serves the first run and every restart); ``rng_key``,
        ``init_state`` or ``init_params`` only rebuild the state's structure then. A checkpoint
        records what identifies its fit (the data's shapes, dtypes and SHA-256, the parameters,
        the guide, the objective, the optimizer's class and the structure of its state; not its
        learning rate, which NumPyro's optimizers do not expose): another fit's is refused before
        any work, naming what differs.
    :param allow_missing: pass NaN entries of the model's arguments after the first (the
        targets) on to the model, which masks them out of its likelihood (its own
        ``numpyro.handlers.mask``); models of :mod:`numpyro_dgp.models` built with
        ``missing_targets="mask"`` are recognized without it. Inputs (the first argument) and
        infinite values are always refused.
    :param kwargs: model keyword arguments, split into traced arrays and static values as
        ``args`` are.
    :return: :class:`FitResult` (with ``resume``, its losses cover the whole run).
    :raises ValueError: for invalid arguments, empty or non-finite data, observed values outside
        their distribution's support, or a checkpoint from another fit.
    :raises FileExistsError: a ``checkpoint_path`` that is a folder or a file no fit wrote.
    :raises FileNotFoundError: a ``checkpoint_path`` in a folder that does not exist.
    :raises ~numpyro_dgp.ParameterMismatchError: ``init_params`` that do not match the model.
    :raises FloatingPointError: non-finite initial parameters, every update skipped, or final
        parameters that are not finite (the fit diverged: the message gives the first step whose
        loss was not finite, and names the layer whose ``K(Z, Z)`` fails, if one does).
    :raises RuntimeError: the model cannot be initialized (the message names the layer whose
        ``K(Z, Z)`` fails, if one does).
    """
    every = checkpoint_every
    _check_options(num_steps, chunk_size, average_from, checkpoint_path, every, resume)
    check_start("fit", rng_key, init_state, init_params)
    check_data(svi.model, args, kwargs, allow_missing)
    # after fit's own warning about X: the layers' warning about the same problem is then quiet
    check_observed(svi.model, args, {**kwargs, **svi.static_kwargs}, "fit")
    checkpoints = None
    if checkpoint_path is not None:  # another fit's checkpoint is refused before any work
        checkpoints = Checkpoints(
            checkpoint_path, svi, args, kwargs, average_from, resume, num_steps, every
        )
    # arrays are traced arguments; everything else (ints used as subsample sizes, flags) is static
    dyn_args, static_args, dyn_kwargs, static_kwargs = split_traced(args, kwargs)
    chunk = min(int(chunk_size), int(num_steps), int(every or num_steps))
    # what a chunk's program is compiled for besides its arguments' shapes (a cache key)
    statics = _cache_key((svi, chunk, average_from is not None, static_args, static_kwargs))
    if init_state is None:
        init_state = initial_state(svi, rng_key, args, kwargs, init_params, strict)
    step, carry, losses, num_skipped = _start(svi, init_state, average_from, checkpoints)
    # the optimizer's (unconstrained) values, finite where the constrained ones are
    bad = non_finite_params(svi.optim.get_params(carry[0].optim_state))
    if bad:
        raise FloatingPointError(f"fit: initial parameters are not finite: {bad}")
    params, compile_seconds = None, 0.0
    if step < num_steps:
        # the jitted call reuses this executable; cheap when svi already has it for these shapes
        first = (statics, carry, jnp.asarray(num_steps), jnp.asarray(0), dyn_args, dyn_kwargs)
        compile_seconds = timed_compile(_run_chunk, *first)[1]

    def run(done, n):
        nonlocal carry, params
        average_start = jnp.asarray((average_from or 0) - done)
        carry, (losses, skipped), params = _run_chunk(
            statics, carry, jnp.asarray(n), average_start, dyn_args, dyn_kwargs
        )
        return np.asarray(losses)[:n], np.asarray(skipped)[:n]

    def chunk_length(done):
        # a chunk ends at the next checkpoint, so checkpoints fall on exact step counts
        return min(chunk, num_steps - done, every - done % every if every else chunk)

    def after_chunk(log):
        if checkpoints is not None:
            checkpoints.after_chunk(log, carry)

    log = TrainingLog("fit", num_steps, losses, num_skipped, progress_bar)
    log.run(run, chunk_length, after_chunk)
    state, mean, _ = carry
    if params is None:  # no chunk ran: resumed from the checkpoint of the finished run
        params = svi.get_params(state)
    averaged = svi.constrain_fn(mean) if average_from is not None else None
    return log.result(svi, params, state, args, kwargs, chunk, compile_seconds, averaged)


def _start(svi, state, average_from, checkpoints):
    """Where the fit starts, ``(step, carry, losses, num_skipped)``: ``state`` before any step
    (the running mean of averaging starts at its parameters), or the checkpoint's progress when
    resuming."""
    mean = svi.optim.get_params(state.optim_state) if average_from is not None else {}
    carry = (state, mean, jnp.zeros((), jnp.int32))
    if checkpoints is None:
        return 0, carry, np.empty(0), 0
    return checkpoints.start(svi, carry)


def _check_options(num_steps, chunk_size, average_from, checkpoint_path, every, resume):
    check_positive_int(num_steps, "num_steps", "fit")
    check_positive_int(chunk_size, "chunk_size", "fit")
    check_positive_int(every, "checkpoint_every", "fit", allow_none=True)
    if average_from is not None and not (
        isinstance(average_from, (int, np.integer)) and 0 <= average_from < num_steps
    ):
        raise ValueError(
            f"fit: average_from must be an integer in [0, num_steps) = [0, {num_steps}), "
            f"got {average_from!r}"
        )
    if checkpoint_path is None and (every is not None or resume):
        raise ValueError(
            "fit: checkpoint_every and resume need checkpoint_path (the checkpoint file)"
        )
