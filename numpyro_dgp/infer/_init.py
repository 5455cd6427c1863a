"""``init``: ``svi.init`` compiled as one program.

NumPyro's ``svi.init`` runs the guide and the model eagerly, and JAX compiles every operation
outside a jitted function on its first use: a two-layer DGP's initialization (k-means of the
inducing inputs, kernel matrices, Cholesky factors, the guide's draws) compiles some 60
programs (the library's heavy parts one program each), seconds of a fresh process.
:func:`init` reads the guide's structure from one abstract run (nothing compiled) and runs
``svi.init`` inside ``jax.jit``: one program, the same initial values to round-off (1e-15 up to
M = 64, 1e-13 to 1e-11 at M = 100-300). The program is never differentiated, so it factors
``K(Z, Z)`` as the eager run does, with one LAPACK call and a triangular solve, not with the
blocked factorization and derivative rules a training step needs (``_compat.values_only``;
at M = 100 its compile about 0.3 s shorter).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import jax
from numpyro.infer import SVI
from numpyro.infer.svi import SVIState
from numpyro.primitives import Messenger

from numpyro_dgp._cache import OwnerCache
from numpyro_dgp._compat import innermost_guide, one_shot_program, values_only
from numpyro_dgp._validation import split_traced
from numpyro_dgp.guides import DGPGuide
from numpyro_dgp.handlers import data_parallel

__all__ = ["init"]

#: compiled initializations per SVI object
_INITS = OwnerCache(max_entries=8)


def _compilable(svi: SVI) -> bool:
    """Whether ``svi.init`` can run inside ``jit``: the guide is one of this library's, whose
    structure is read abstractly, and owns no NumPyro sub-guide (an ``AutoNormal`` for latent
    hyperparameters builds its structure from concrete values on its first call)."""
    guide = innermost_guide(svi.guide)
    return isinstance(guide, DGPGuide) and guide._other_guide is None


def init(
    svi: SVI, rng_key: jax.Array, *args: Any, init_params: dict | None = None, **kwargs: Any
) -> SVIState:
    """The initial ``SVIState`` of ``svi``: ``svi.init`` compiled as one program.

    The same state as ``svi.init(rng_key, *args, init_params=init_params, **kwargs)``, for the
    library's guides (``AutoFactorizedDGP``, ``AutoJointDGP``, ``AutoChainDGP``,
    ``AutoAmortizedDGP``) without latent hyperparameters; other guides run ``svi.init`` as it
    is. Array arguments are inputs of the compiled program; other arguments (a batch size)
    are static. The program is kept per ``svi`` and argument shapes: a second initialization
    (another key, other data of the same shapes) does not compile again. :func:`numpyro_dgp.fit`
    initializes with it, compiling its training steps at the same time (in a second thread;
    on a single device, with inputs not committed to it).

    Checks that NumPyro's distributions make on concrete values are skipped in the compiled
    run; :func:`numpyro_dgp.fit` checks its data for NaN and inf first.

    :param svi: a ``numpyro.infer.SVI``.
    :param rng_key: PRNG key (as for ``svi.init``).
    :param args: the model's positional arguments.
    :param init_params: initial constrained values of some parameters.
    :param kwargs: the model's keyword arguments.
    :return: the initial ``SVIState``.
    """
    return initialize(svi, rng_key, args, kwargs, init_params)


def initialize(
    svi: SVI,
    rng_key: jax.Array,
    args: tuple,
    kwargs: dict,
    init_params: dict | None = None,
    alongside: Callable[[Any], Callable[[], Any]] | None = None,
) -> SVIState:
    """:func:`init`; with ``alongside``, a function of the state's shapes (a pytree of
    ``jax.ShapeDtypeStruct``) that traces another program and returns its compilation, run
    while the initialization compiles in a second thread (see :func:`_compile_beside`).
    ``alongside`` is not called when ``svi.init`` runs eagerly (a guide that cannot be
    compiled) or when the state will come out placed on a device (see
    :func:`_state_comes_unplaced`)."""
    guide = innermost_guide(svi.guide)
    if isinstance(guide, DGPGuide) and guide.prototype_trace is None:
        guide._setup_prototype(*args, **kwargs)
    if not _compilable(svi):
        return svi.init(rng_key, *args, init_params=init_params, **kwargs)
    dyn_args, static_args, dyn_kwargs, static_kwargs = split_traced(args, kwargs)
    key = (static_args, static_kwargs, init_params is None)
    try:
        hash(key)
    except TypeError:  # unhashable static arguments: as svi.init does
        return svi.init(rng_key, *args, init_params=init_params, **kwargs)
    compiled = _INITS.get(svi, key)
    if compiled is None:
        svi_ref = weakref.ref(svi)  # the cache must not keep svi alive

        # runs once: without XLA's optimization passes (its results agree with svi.init's);
        # never differentiated, so the factors of K(Z, Z) are traced as in an eager svi.init
        @one_shot_program
        def compiled(rng_key, dyn_args, dyn_kwargs, init_params):
            call_args = tuple(s if d is None else d for d, s in zip(dyn_args, static_args))
            model_kwargs = {**dict(static_kwargs), **dyn_kwargs}
            with values_only():
                return svi_ref().init(rng_key, *call_args, init_params=init_params, **model_kwargs)

        _INITS.put(svi, key, compiled)
    call = (rng_key, dyn_args, dyn_kwargs, init_params)
    if alongside is not None and _state_comes_unplaced(svi, call):
        _compile_beside(compiled.lower(*call), lambda: compiled.shapes(*call), alongside)
    return compiled(*call)


def _state_comes_unplaced(svi: SVI, call: tuple) -> bool:
    """Whether the initialization's state comes out on the default device without a placement
    (uncommitted): one device, no input committed to a device (``jax.device_put(X, device)``),
    no :class:`~numpyro_dgp.handlers.data_parallel` around the model. Only then is a program
    lowered for the state's shapes alone the one its call compiles; otherwise it would be
    compiled a second time for the placed state."""
    if jax.device_count() != 1:
        return False
    if any(getattr(leaf, "committed", False) for leaf in jax.tree.leaves(call)):
        return False
    model = svi.model
    while isinstance(model, Messenger):
        if isinstance(model, data_parallel):
            return False
        model = model.fn
    return True


def _compile_beside(
    lowered: Any,
    shapes: Callable[[], Any],
    alongside: Callable[[Any], Callable[[], Any]],
) -> None:
    """Compile ``lowered`` in a second thread while this one traces and compiles
    ``alongside(shapes())``'s program: XLA compiles without holding Python's lock, so with two
    cores the two compilations overlap (the kin8nm DSVI model's initialization and training
    step: about 1 s of a fresh process's first fit; ``benchmarks/topics/startup.md``). Only
    compilation runs in the second thread; tracing stays in this one (NumPyro's handler stack
    is one list shared by all threads). Both compilations fill JAX's cache, which the calls
    that follow read. ``shapes`` gives the program's result as ``jax.ShapeDtypeStruct`` leaves
    with their weak types (``lowered.out_info`` drops them, and a program lowered for a
    strongly typed step count would be compiled again for the weakly typed one)."""
    failure: list[BaseException] = []

    def compile_lowered() -> None:
        try:
            lowered.compile()
        except BaseException as err:  # re-raised in this thread
            failure.append(err)

    worker = threading.Thread(target=compile_lowered, name="numpyro_dgp-init-compile")
    worker.start()
    try:
        alongside(shapes())()
    finally:
        worker.join()
    if failure:
        raise failure[0]
