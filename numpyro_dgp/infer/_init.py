"""``init``: ``svi.init`` compiled as one program.

NumPyro's ``svi.init`` runs the guide and the model eagerly, and JAX compiles every operation
outside a jitted function on its first use: a two-layer DGP's initialization (k-means of the
inducing inputs, kernel matrices, Cholesky factors, the guide's draws) compiles dozens of small
programs, seconds of a fresh process. :func:`init` reads the guide's structure from one
abstract run (nothing compiled) and runs ``svi.init`` inside ``jax.jit``: one program, the same
initial values. :func:`initial_state` is how the training drivers start: the guide set up under
a key of its own, ``init_params`` checked, then :func:`init`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
from numpyro.infer import SVI
from numpyro.infer.svi import SVIState

from numpyro_dgp._compat import innermost_guide
from numpyro_dgp._validation import split_traced
from numpyro_dgp.guides import DGPGuide
from numpyro_dgp.infer._checks import failed_layer
from numpyro_dgp.io import (
    STRICT_HINT,
    ParameterMismatchError,
    check_params_against,
    param_specs,
    set_up_guide,
)

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
    # unhashable static arguments: as svi.init does
    if not (compilable and hashable((static_args, static_kwargs))):
        return svi.init(rng_key, *args, init_params=init_params, **kwargs)
    return _compiled_init(
        svi, static_args, static_kwargs, rng_key, dyn_args, dyn_kwargs, init_params
    )


def hashable(value: Any) -> bool:
    """Whether ``value`` can be hashed (a static argument of a compiled function)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


@partial(jax.jit, static_argnums=(0, 1, 2), compiler_options=ONE_SHOT_OPTIONS)
def _compiled_init(
    svi: SVI,
    static_args: tuple,
    static_kwargs: tuple,
    rng_key: jax.Array,
    dyn_args: tuple,
    dyn_kwargs: dict,
    init_params: dict | None,
) -> SVIState:
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
            check_params_against(
                param_specs(svi.model, svi.guide, args, model_kwargs),
                init_params,
                "fit (init_params)",
                allow_missing=not strict,
                allow_unexpected=not strict,
                require_finite=True,
                hint=STRICT_HINT,
            )
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
