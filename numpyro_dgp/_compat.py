"""The only place that touches NumPyro and JAX internals.

NumPyro has no public API for a few things a GP-layer primitive needs: the handler stack (to
tell whether a model runs under a ``seed`` handler and inside which plates, and which sites the
innermost ``trace`` handler has recorded so far in this run), the function a ``numpyro.plate``
draws subsample indices with (replaced by a faster one, or compiled once), the lazy initial
value of a ``numpyro.param`` message, the constraint class behind ``softplus_lower_cholesky``
(to register a faster transform for it), whether NumPyro validates distribution arguments by
default (``numpyro.enable_validation``; read to run the checks on the host), and the class of
the optimizers ``optax_to_numpyro`` returns (for annotations only). JAX has none for whether a
transformation is tracing the caller even where its arguments are concrete
(:func:`one_shot_program`: a program compiled with its own XLA options cannot be nested in
another); the tracing mode :func:`values_only` sits beside them. Each access is wrapped here,
and ``tests/test_compat.py`` fails loudly if a NumPyro or JAX release changes any of them.
"""

from __future__ import annotations

import contextlib
import contextvars
from functools import update_wrapper
from typing import TYPE_CHECKING, Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.primitives as _primitives
from jax._src import core as _jax_core
from numpyro.distributions import constraints as _constraints
from numpyro.distributions import transforms as _transforms

from numpyro_dgp.core._triangular import lower_from_vector
from numpyro_dgp.kernels import is_jit_argument

if TYPE_CHECKING:
    from numpyro.optim import _NumPyroOptim as NumPyroOptimizer  # noqa: F401

__all__ = [
    "active_plates",
    "apply_stack",
    "autocontinuous_layout",
    "compiled_numpyro_subsample_fn",
    "distribution_validation_enabled",
    "filled",
    "handler_stack_is_empty",
    "innermost_guide",
    "innermost_trace",
    "is_tracer",
    "jax_is_tracing",
    "lazy_param_initializer",
    "numpyro_subsample_fn",
    "one_shot_program",
    "softplus_lower_cholesky",
    "tracing_values_only",
    "values_only",
]

#: NumPyro's function that draws plate subsample indices (sequential Fisher-Yates on CPU).
numpyro_subsample_fn: Callable | None = getattr(_primitives, "_subsample_fn", None)

#: Sends a message through the handler stack (``numpyro.primitives.apply_stack``).
apply_stack = _primitives.apply_stack


def _stack() -> list:
    return _primitives._PYRO_STACK


def handler_stack_is_empty() -> bool:
    """Whether no NumPyro handler (in particular no ``seed``) is active."""
    return not _stack()


def active_plates() -> list[numpyro.plate]:
    """The ``numpyro.plate`` handlers active at the call site, outermost first."""
    return [h for h in _stack() if isinstance(h, numpyro.plate)]


def innermost_trace() -> dict | None:
    """The sites recorded so far by the innermost ``numpyro.handlers.trace`` on the stack
    (``{name: message}``, the run in progress), or ``None`` when no trace handler is active.

    NumPyro refuses a duplicate sample site with an ``assert`` (gone under ``python -O``);
    looking a name up here detects a duplicate in every mode.
    """
    for handler in reversed(_stack()):
        if isinstance(handler, numpyro.handlers.trace):
            return handler.trace
    return None


def lazy_param_initializer(msg: dict) -> Callable | None:
    """The callable initial value of a ``numpyro.param`` message, or ``None``.

    NumPyro keeps a callable ``init_value`` as the keyword default of the message's ``fn``.
    """
    defaults = getattr(msg.get("fn"), "__kwdefaults__", None) or {}
    init = defaults.get("init_value")
    return init if callable(init) else None


def distribution_validation_enabled() -> bool:
    """Whether NumPyro's distributions validate their arguments by default (NumPyro's default,
    or ``numpyro.enable_validation``)."""
    return bool(numpyro.distributions.Distribution._validate_args)


def is_tracer(x: Any) -> bool:
    """Whether ``x`` is a JAX tracer (an abstract value inside ``jit``/``vmap``/``grad``)."""
    return isinstance(x, jax.core.Tracer)


def jax_is_tracing() -> bool:
    """Whether a JAX transformation (``jit``, ``grad``, ``vmap``, ``eval_shape``) is tracing the
    caller, even where every argument it holds is concrete (a constant closed over by a jitted
    function)."""
    return not _jax_core.trace_state_clean()


#: Whether the program being traced computes values only (see :func:`values_only`).
_VALUES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "numpyro_dgp_values_only", default=False
)


@contextlib.contextmanager
def values_only() -> Iterator[None]:
    """Within it, the programs traced compute values that no one differentiates (a compiled
    initialization, an abstract run for a model's structure): functions that pick a cheaper
    route for values alone read :func:`tracing_values_only` when they are traced. A derivative
    taken inside anyway follows the route taken, JAX's own rules for its operations: right,
    and slower.

    A plain context variable, not a JAX user context (``jax.make_user_context``, which JAX's
    caches key on): with that, every jitted function the initialization traced (kernels,
    conditionals) was traced again for the training step, and a first ``fit`` traced for 2.5 s
    where it had taken 1.2 s. So the mode is read when a function is traced, and a jitted
    function wrapped around a reader would keep the route of its first trace: the readers
    (``numpyro_dgp._layers.inducing.inducing_factor``) are traced in the model's own run,
    never inside a cached ``jit`` (``tests/infer/test_init.py`` counts their traces)."""
    token = _VALUES_ONLY.set(True)
    try:
        yield
    finally:
        _VALUES_ONLY.reset(token)


def tracing_values_only() -> bool:
    """Whether the caller runs inside :func:`values_only`."""
    return _VALUES_ONLY.get()


def autocontinuous_layout(guide: Any) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """Where each latent site sits in the flat latent vector of a NumPyro ``AutoContinuous``
    guide (``AutoNormal``'s siblings: ``AutoDiagonalNormal``, ``AutoMultivariateNormal``,
    ``AutoLowRankMultivariateNormal``, ``AutoIAFNormal``, ``AutoBNAF``, ...).

    NumPyro packs the sites' unconstrained values in the order of its ``_init_locs`` dict
    (the model's execution order), each flattened.

    :param guide: a set-up ``AutoContinuous`` guide.
    :return: ``{site: (start, stop, shape)}``.
    """
    layout, start = {}, 0
    for name, value in guide._init_locs.items():
        shape = tuple(jax.numpy.shape(value))
        size = int(np.prod(shape, dtype=int))
        layout[name] = (start, start + size, shape)
        start += size
    return layout


# NumPyro's constraint class is private: the base is read from its public instance (a dynamic base
# to mypy)
class _SoftplusLowerCholesky(type(_constraints.softplus_lower_cholesky)):  # type: ignore[misc]
    """NumPyro's ``softplus_lower_cholesky`` constraint, transformed with one gather each way."""


class _SoftplusLowerCholeskyTransform(_transforms.SoftplusLowerCholeskyTransform):
    """NumPyro's transform (same vector layout, inverse and Jacobian) with a faster forward map."""

    def __call__(self, x: jax.Array) -> jax.Array:
        n = round((np.sqrt(1 + 8 * x.shape[-1]) - 1) / 2)
        diagonal = jax.nn.softplus(x[..., -n:])
        return lower_from_vector(jnp.concatenate([x[..., :-n], diagonal], axis=-1))

    def _inverse(self, y: jax.Array) -> jax.Array:
        return _lower_cholesky_to_vector(jnp.asarray(y))


def _lower_cholesky_to_vector(y: jax.Array) -> jax.Array:
    """NumPyro's inverse (``matrix_to_tril_vec`` of the strict lower triangle, the inverse
    softplus of the diagonal) with the triangle's indices built on the host: as one program
    (:func:`one_shot_program`, below), the inverse ``svi.init`` applies to every factor
    compiles once per shape instead of ~35 small programs (``jnp.tril_indices`` run eagerly)."""
    rows, cols = np.tril_indices(y.shape[-1], -1)
    strict = y[..., rows, cols]
    diagonal = _transforms._softplus_inv(jnp.diagonal(y, axis1=-2, axis2=-1))
    return jnp.concatenate([strict, diagonal], axis=-1)


#: ``numpyro.distributions.constraints.softplus_lower_cholesky`` with :func:`biject_to` giving a
#: transform whose forward map and derivative are one gather each (the library's guides use it).
softplus_lower_cholesky = _SoftplusLowerCholesky()
_transforms.biject_to.register(
    _SoftplusLowerCholesky, lambda constraint: _SoftplusLowerCholeskyTransform()
)


def innermost_guide(guide: Callable) -> Callable:
    """The guide inside handlers that wrap it (``data_parallel(guide)``, ``fast_subsample``...):
    follows NumPyro's ``Messenger.fn``."""
    while isinstance(guide, _primitives.Messenger) and guide.fn is not None:
        guide = guide.fn
    return guide


def filled(shape: tuple[int, ...], value: float, dtype: Any) -> jax.Array:
    """``jnp.full(shape, value, dtype)``, built on the host and put on the device when run
    eagerly (``svi.init``; ``jnp.full`` would compile a program per shape), an operation of the
    caller's program when traced (not a constant of its size)."""
    if jax_is_tracing():
        return jnp.full(shape, value, dtype)
    return jax.device_put(np.full(shape, value, dtype))


#: XLA options of a program that runs once per shape.
ONE_SHOT_OPTIONS = {"xla_backend_optimization_level": 0}


class _OneShot:
    """``fun`` itself under a JAX transformation or for arguments that cannot be a jitted
    function's (:func:`numpyro_dgp.kernels.is_jit_argument`), else its program compiled with
    :data:`ONE_SHOT_OPTIONS` (one per shapes and static arguments)."""

    def __init__(self, fun: Callable, static_argnums: int | tuple[int, ...]) -> None:
        self._fun = fun
        self._compiled = jax.jit(
            fun, static_argnums=static_argnums, compiler_options=ONE_SHOT_OPTIONS
        )
        update_wrapper(self, fun)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # an argument JAX cannot compare with a compiled program's (a kernel with an array
        # setting) would fail on the second call: its operations one by one instead
        if jax_is_tracing() or not is_jit_argument((args, kwargs)):
            return self._fun(*args, **kwargs)
        return self._compiled(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The program's lowering (``jax.stages.Lowered``); compiling it fills the cache the
        call reads."""
        return self._compiled.lower(*args, **kwargs)

    def shapes(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.eval_shape`` of ``fun``: its result's shapes and types, nothing compiled."""
        return jax.eval_shape(self._compiled, *args, **kwargs)

    def _cache_size(self) -> int:
        """Programs compiled so far (as a jitted function's ``_cache_size``)."""
        return self._compiled._cache_size()  # type: ignore[attr-defined]


def one_shot_program(fun: Callable, static_argnums: int | tuple[int, ...] = ()) -> Any:
    """``fun`` for eager runs (``svi.init``, a trace of the model for its sites), which compile
    it once per shape and run it once: compiled without XLA's optimization passes
    (``xla_backend_optimization_level`` 0; about half the compile time, the same operations
    rounded alike up to fused arithmetic). Under a JAX transformation (a training step's
    ``jit``) ``fun`` runs as it is, part of the caller's program and compiled with the caller's
    options: JAX refuses compiler options on a nested ``jit``, and steps keep XLA's defaults."""
    return _OneShot(fun, static_argnums)


_lower_cholesky_to_vector = one_shot_program(_lower_cholesky_to_vector)

#: :data:`numpyro_subsample_fn` as one compiled program per ``(size, subsample_size)``: the
#: same indices from the same key. Run eagerly (a plate in ``svi.init``) NumPyro's
#: ``lax.scan`` is compiled anew on every call (0.5-0.7 s on a 2-core CPU at 1,000 of 8,000).
compiled_numpyro_subsample_fn: Callable | None = (
    None if numpyro_subsample_fn is None else one_shot_program(numpyro_subsample_fn, (0, 1))
)
