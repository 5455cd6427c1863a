"""``init``: ``svi.init`` compiled as one program.

NumPyro's ``svi.init`` runs the guide and the model eagerly, and JAX compiles every operation
outside a jitted function on its first use: a two-layer DGP's initialization (k-means of the
inducing inputs, kernel matrices, Cholesky factors, the guide's draws) compiles dozens of small
programs, seconds of a fresh process. :func:`init` reads the guide's structure from one
abstract run (nothing compiled) and runs ``svi.init`` inside ``jax.jit``: one program, the same
initial values.
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

__all__ = ["init"]

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
    return initialize(svi, rng_key, args, kwargs, init_params)


def initialize(
    svi: SVI, rng_key: jax.Array, args: tuple, kwargs: dict, init_params: dict | None = None
) -> SVIState:
    """:func:`init` with the model's arguments as a tuple and a dict."""
    guide = innermost_guide(svi.guide)
    if isinstance(guide, DGPGuide) and guide.prototype_trace is None:
        guide._setup_prototype(*args, **kwargs)
    dyn_args, static_args, dyn_kwargs, static_kwargs = split_traced(args, kwargs)
    try:
        hash((static_args, static_kwargs))
    except TypeError:  # unhashable static arguments: as svi.init does
        guide = None
    # svi.init runs inside jit for the library's guides, whose structure is read abstractly, and
    # that own no NumPyro sub-guide (an AutoNormal for latent hyperparameters builds its
    # structure from concrete values on its first call)
    if not isinstance(guide, DGPGuide) or guide._other_guide is not None:
        return svi.init(rng_key, *args, init_params=init_params, **kwargs)
    return _compiled_init(
        svi, static_args, static_kwargs, rng_key, dyn_args, dyn_kwargs, init_params
    )


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
