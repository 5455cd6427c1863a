"""The only place that touches NumPyro and JAX internals.

NumPyro has no public API for a few things a GP-layer primitive needs: the handler stack (to
tell whether a model runs under a ``seed`` handler and inside which plates, and which sites the
innermost ``trace`` handler has recorded so far in this run), the function a ``numpyro.plate``
draws subsample indices with (replaced by a faster one), the lazy initial value of a
``numpyro.param`` message, the constraint class behind ``softplus_lower_cholesky`` (to register
a faster transform for it), and the class of the optimizers ``optax_to_numpyro`` returns (for
annotations only). Each access is wrapped here, and ``tests/test_compat.py`` fails loudly if a
NumPyro release changes any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.primitives as _primitives
from numpyro.distributions import constraints as _constraints
from numpyro.distributions import transforms as _transforms

from numpyro_dgp.core._triangular import lower_from_vector

if TYPE_CHECKING:
    from numpyro.optim import _NumPyroOptim as NumPyroOptimizer  # noqa: F401

#: NumPyro's function that draws plate subsample indices (sequential Fisher-Yates on CPU).
numpyro_subsample_fn: Callable | None = getattr(_primitives, "_subsample_fn", None)

#: Sends a message through the handler stack (``numpyro.primitives.apply_stack``).
apply_stack = _primitives.apply_stack


def handler_stack_is_empty() -> bool:
    """Whether no NumPyro handler (in particular no ``seed``) is active."""
    return not _primitives._PYRO_STACK


def active_plates() -> list[numpyro.plate]:
    """The ``numpyro.plate`` handlers active at the call site, outermost first."""
    return [h for h in _primitives._PYRO_STACK if isinstance(h, numpyro.plate)]


def innermost_trace() -> dict | None:
    """The sites recorded so far by the innermost ``numpyro.handlers.trace`` on the stack
    (``{name: message}``, the run in progress), or ``None`` when no trace handler is active.

    NumPyro refuses a duplicate sample site with an ``assert`` (gone under ``python -O``);
    looking a name up here detects a duplicate in every mode.
    """
    for handler in reversed(_primitives._PYRO_STACK):
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


def is_tracer(x: Any) -> bool:
    """Whether ``x`` is a JAX tracer (an abstract value inside ``jit``/``vmap``/``grad``)."""
    return isinstance(x, jax.core.Tracer)


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
    """NumPyro's ``softplus_lower_cholesky`` constraint, transformed forward with one gather."""


class _SoftplusLowerCholeskyTransform(_transforms.SoftplusLowerCholeskyTransform):
    """NumPyro's transform (same vector layout, inverse and Jacobian) with a faster forward map."""

    def __call__(self, x: jax.Array) -> jax.Array:
        n = round((np.sqrt(1 + 8 * x.shape[-1]) - 1) / 2)
        diagonal = jax.nn.softplus(x[..., -n:])
        return lower_from_vector(jnp.concatenate([x[..., :-n], diagonal], axis=-1))


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
