"""``fit``: a compiled SVI loop (``lax.scan`` over chunks of steps) with a host progress bar.

**References:**

* Izmailov, Podoprikhin, Garipov, Vetrov, Wilson (2018). Averaging weights leads to wider
  optima and better generalization. UAI.
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import SVI
from numpyro.infer.svi import SVIState

from numpyro_dgp._protocol import model_config
from numpyro_dgp._validation import (
    check_positive_int,
    check_rows,
    concrete,
    is_array,
    non_finite_entries,
    split_traced,
    warn_if_not_standardized,
)
from numpyro_dgp.infer._checkpoint import (
    Progress,
    check_checkpoint_path,
    check_same_fit,
    fit_identity,
    read_checkpoint,
    with_state,
    write_checkpoint,
)
from numpyro_dgp.infer._faults import failed_layer
from numpyro_dgp.infer._loop import (
    TrainingLog,
    guarded_update,
    non_finite_params,
    report_skipped,
    run_chunks,
)
from numpyro_dgp.infer._observed import check_observed
from numpyro_dgp.io import (
    STRICT_HINT,
    ParameterMismatchError,
    check_params_against,
    param_specs,
    set_up_guide,
)

__all__ = ["FitResult", "fit"]

#: ``fold_in`` data of the key that sets up the guide (apart from the key ``svi.init`` gets)
_SETUP_STREAM = 0x5E7


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


def _check_finite_args(args, kwargs, allow_missing=False):
    """Refuse NaN or inf in the model's array arguments; with ``allow_missing``, NaN (but not
    inf) in those after the first (the inputs), which the model masks as missing targets."""
    # on the host (NumPy): an eager jnp check would compile a program per argument shape
    for where, value in [(f"args[{i}]", a) for i, a in enumerate(args)] + [
        (f"{k}=", v) for k, v in kwargs.items()
    ]:
        if is_array(value) and jnp.issubdtype(value.dtype, jnp.floating):
            value = concrete(value)  # None: another process's shard (that process checks it)
            if value is None:
                continue
            if allow_missing and where != "args[0]":
                if np.isinf(value).any():
                    raise ValueError(f"fit: model argument {where} contains inf values")
            elif non_finite_entries(value, max_first=0)[0]:
                hint = (
                    ""
                    if where == "args[0]"
                    else (
                        "; if they are missing targets, mask them in the model "
                        "(numpyro_dgp.models' missing_targets='mask', or numpyro.handlers.mask in "
                        "your own) and pass fit(..., allow_missing=True)"
                    )
                )
                raise ValueError(f"fit: model argument {where} contains NaN or inf values{hint}")


def _masks_missing_targets(model: Any) -> bool:
    """Whether ``model`` was built by a factory of :mod:`numpyro_dgp.models` with
    ``missing_targets="mask"``."""
    config = model_config(model) or {}
    return (config.get("arguments") or {}).get("missing_targets") == "mask"


@partial(jax.jit, static_argnums=0)
def _get_params(svi, state):
    # eagerly, svi.get_params compiles one program per parameter
    return svi.get_params(state)


class _ChunkStatics(NamedTuple):
    """What a chunk's program is compiled for, besides its arguments' shapes."""

    svi: SVI
    chunk: int
    average: bool
    static_args: tuple
    static_kwargs: tuple  # sorted (name, value) pairs


class _ByIdentity:
    """Statics whose model arguments cannot be hashed: compiled for this fit alone."""

    def __init__(self, statics: _ChunkStatics) -> None:
        self.statics = statics


def _chunk_statics(svi, chunk, static_args, static_kwargs, average):
    statics = _ChunkStatics(svi, chunk, average, static_args, tuple(sorted(static_kwargs.items())))
    try:
        hash(statics)
    except TypeError:
        return _ByIdentity(statics)
    return statics


@partial(jax.jit, static_argnums=0)
def _run_chunk(statics, state, num_active, dyn_a, dyn_kw, mean, count, average_start):
    """A ``lax.scan`` over ``chunk`` SVI steps; the steps with index ``>= num_active`` are
    inactive (they change nothing). JAX keeps its program per ``svi``, chunk size and static
    arguments: ``fit(..., init_state=result.state)`` and repeated fits reuse it.

    With ``average`` the carry also holds a running mean of the unconstrained parameters over
    the steps with index ``>= average_start`` (relative to the chunk's first step).
    """
    if isinstance(statics, _ByIdentity):
        statics = statics.statics
    svi, chunk, average, static_args, static_kwargs = statics
    a = [d if s is None else s for d, s in zip(dyn_a, static_args)]
    kw = {**dict(static_kwargs), **dyn_kw}

    def step(carry, step_index):
        state, mean, count = carry
        active = step_index < num_active
        state, loss, skipped = guarded_update(svi, state, a, kw, active)
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

    carry, per_step = jax.lax.scan(step, (state, mean, count), jnp.arange(chunk))
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
    _check_fit_arguments(
        num_steps,
        chunk_size,
        average_from,
        checkpoint_path,
        checkpoint_every,
        resume,
        init_state,
        init_params,
    )
    _check_finite_args(args, kwargs, allow_missing or _masks_missing_targets(svi.model))
    check_rows(args, kwargs, "fit")
    if (
        args
        and is_array(args[0])
        and args[0].ndim == 2
        and jnp.issubdtype(args[0].dtype, jnp.floating)
    ):
        warn_if_not_standardized(args[0], "X (its first argument)", "fit")
    # after fit's own warning about X: the layers' warning about the same problem is then quiet
    check_observed(svi.model, args, {**kwargs, **svi.static_kwargs}, "fit")
    # what identifies this fit in its checkpoints; another fit's checkpoint is refused up front
    identity, resume_from = None, None
    if checkpoint_path is not None:
        stored = check_checkpoint_path(Path(os.fspath(checkpoint_path)).expanduser())
        identity = fit_identity(svi, args, kwargs, average_from)
        if resume and stored is not None:
            resume_from = checkpoint_path
            check_same_fit(stored, resume_from, identity, num_steps)
    # Arrays are traced arguments; everything else (ints used as subsample sizes, flags) is static.
    dyn_args, static_args, dyn_kwargs, sorted_static = split_traced(args, kwargs)
    static_kwargs = dict(sorted_static)
    chunk = min(int(chunk_size), int(num_steps), int(checkpoint_every or num_steps))
    statics = _chunk_statics(svi, chunk, static_args, static_kwargs, average_from is not None)
    progress, identity = _starting_point(
        svi,
        rng_key,
        args,
        kwargs,
        init_state,
        init_params,
        strict,
        average_from,
        resume_from,
        num_steps,
        identity,
    )
    scan = _Scan(statics, progress, dyn_args, dyn_kwargs, average_from)
    compile_seconds = scan.compile(num_steps) if progress.step < num_steps else 0.0

    def chunk_length(done):
        # a chunk ends at the next checkpoint, so checkpoints fall on exact step counts
        return min(
            chunk,
            num_steps - done,
            checkpoint_every - done % checkpoint_every if checkpoint_every else chunk,
        )

    def checkpoint(done):
        if checkpoint_path is not None and (
            done == num_steps or (checkpoint_every and done % checkpoint_every == 0)
        ):
            write_checkpoint(checkpoint_path, scan.progress(done, log), num_steps, identity)

    log = TrainingLog(
        "fit",
        num_steps,
        losses=progress.losses,
        num_skipped=progress.num_skipped,
        progress_bar=progress_bar,
    )
    run_chunks(scan, log, chunk_length, checkpoint)
    # no chunk ran when resuming from a checkpoint of the finished run
    params = _get_params(svi, scan.state) if scan.params is None else scan.params
    report_skipped(log, svi, scan.state, args, kwargs, params)
    averaged = svi.constrain_fn(scan.mean) if average_from is not None else None
    return FitResult(
        params,
        log.losses,
        scan.state,
        log.num_skipped,
        np.asarray(log.chunk_seconds),
        chunk,
        compile_seconds,
        averaged,
    )


def _lower_chunk(statics, state, num_steps, dyn_args, dyn_kwargs, mean, count):
    """:func:`_run_chunk` lowered for the first chunk."""
    return _run_chunk.lower(
        statics, state, jnp.asarray(num_steps), dyn_args, dyn_kwargs, mean, count, jnp.asarray(0)
    )


class _Scan:
    """The compiled chunk function (:func:`_run_chunk`) and what it carries between chunks."""

    def __init__(self, statics, progress, dyn_args, dyn_kwargs, average_from):
        self.statics, self.dyn_args, self.dyn_kwargs = statics, dyn_args, dyn_kwargs
        self.state, self.mean, self.count = progress.state, progress.mean, progress.count
        self.average_from = average_from
        self.params = None  # constrained, from the last chunk

    def compile(self, num_steps):
        """Compile ahead of the first chunk, so that compilation is timed on its own (the jitted
        call reuses this executable; cheap when ``svi`` already has it for these shapes)."""
        start = time.perf_counter()
        _lower_chunk(
            self.statics,
            self.state,
            num_steps,
            self.dyn_args,
            self.dyn_kwargs,
            self.mean,
            self.count,
        ).compile()
        return time.perf_counter() - start

    def __call__(self, done, active):
        average_start = jnp.asarray((self.average_from or 0) - done)
        (self.state, self.mean, self.count), (losses, skipped), self.params = _run_chunk(
            self.statics,
            self.state,
            jnp.asarray(active),
            self.dyn_args,
            self.dyn_kwargs,
            self.mean,
            self.count,
            average_start,
        )
        return np.asarray(losses)[:active], np.asarray(skipped)[:active]

    def progress(self, done, log):
        """The :class:`Progress` a checkpoint after ``done`` steps records."""
        return Progress(done, self.state, self.mean, self.count, log.losses[:done], log.num_skipped)


def _starting_point(
    svi,
    rng_key,
    args,
    kwargs,
    init_state,
    init_params,
    strict,
    average_from,
    resume_from,
    num_steps,
    identity,
):
    """``(progress, identity)`` where the fit starts: a new state (``svi.init``),
    ``init_state``, or the checkpoint
    ``resume_from``; refuses non-finite parameters. ``identity`` (``None`` without checkpoints)
    comes back with the parameters and state added (``_checkpoint.with_state``)."""
    if init_state is None:
        if rng_key is None:
            raise ValueError(
                "fit: rng_key is None; pass a PRNG key (or init_state= to continue a fit)"
            )
        init_state = initial_state(
            svi,
            rng_key,
            args,
            kwargs,
            {**kwargs, **svi.static_kwargs},
            init_params,
            strict,
        )
    # without averaging the mean is an empty placeholder carried through the scan
    mean = svi.optim.get_params(init_state.optim_state) if average_from is not None else {}
    progress = Progress(0, init_state, mean, jnp.zeros((), jnp.int32), np.empty(0), 0)
    # the optimizer's (unconstrained) values: the same names as the constrained parameters,
    # finite where they are, and read without compiling anything
    if identity is not None:
        identity = with_state(identity, svi.optim.get_params(init_state.optim_state), progress)
    if resume_from is not None:
        progress = read_checkpoint(resume_from, progress, num_steps, identity)
    bad = non_finite_params(svi.optim.get_params(progress.state.optim_state))
    if bad:
        raise FloatingPointError(f"fit: initial parameters are not finite: {bad}")
    return progress, identity


def _check_fit_arguments(
    num_steps,
    chunk_size,
    average_from,
    checkpoint_path,
    checkpoint_every,
    resume,
    init_state,
    init_params,
):
    check_positive_int(num_steps, "num_steps", "fit")
    check_positive_int(chunk_size, "chunk_size", "fit")
    check_positive_int(checkpoint_every, "checkpoint_every", "fit", allow_none=True)
    if average_from is not None and not (
        isinstance(average_from, (int, np.integer)) and 0 <= average_from < num_steps
    ):
        raise ValueError(
            f"fit: average_from must be an integer in [0, num_steps) = [0, {num_steps}), "
            f"got {average_from!r}"
        )
    if checkpoint_path is None and (checkpoint_every is not None or resume):
        raise ValueError(
            "fit: checkpoint_every and resume need checkpoint_path (the checkpoint file)"
        )
    if init_state is not None and init_params is not None:
        raise ValueError(
            "fit: give init_state (continue a fit) or init_params (start from values), not both"
        )


def initial_state(svi, rng_key, args, kwargs, model_kwargs, init_params, strict):
    """``svi.init`` (compiled: :func:`numpyro_dgp.infer.init`) after setting up the guide (see
    :func:`numpyro_dgp.io.set_up_guide`) and checking ``init_params``; when the model
    cannot be initialized (NaN from a layer), name the layer whose ``K(Z, Z)`` fails."""
    try:
        set_up_guide(svi.guide, jax.random.fold_in(rng_key, _SETUP_STREAM), args, model_kwargs)
        if init_params is not None:
            check_params_against(
                param_specs(svi.model, svi.guide, args, model_kwargs),
                init_params,
                "fit (init_params)",
                allow_missing=not strict,
                allow_unexpected=not strict,
                require_finite=True,
                hint=STRICT_HINT,
            )
        from numpyro_dgp.infer._init import initialize  # a sibling that imports the guides

        return initialize(svi, rng_key, args, kwargs, init_params)
    except (ValueError, RuntimeError) as err:
        if isinstance(err, ParameterMismatchError):
            raise
        layer, _ = failed_layer(
            svi.model, None, dict(init_params or {}), args, model_kwargs, jax.random.PRNGKey(0)
        )
        if layer is None:
            raise
        raise type(err)(
            "fit: the model cannot be initialized: the Cholesky factorization of K(Z, Z) fails in "
            f"layer {layer!r} at its initial values; raise that layer's jitter "
            f"(gp_layer({layer!r}, ..., jitter=...)), use float64 "
            f"(jax.config.update('jax_enable_x64', True)) or spread its inducing inputs. ({err})"
        ) from err
