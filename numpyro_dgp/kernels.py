"""Covariance functions (pure JAX, no NumPyro).

A kernel is a small immutable object holding its hyperparameter *values*. Its
hyperparameters are listed by :meth:`Kernel.hyperparameters` (name -> value) and replaced by
:meth:`Kernel.replace`; this is what :func:`numpyro_dgp.gp_layer` uses to register them as
``numpyro.param`` / ``numpyro.sample`` sites. Every hyperparameter is constrained positive.

Shapes: inputs ``X1 (N1, D)``, ``X2 (N2, D)``; ``kernel(X1, X2)`` is ``(N1, N2)`` and
``kernel.diag(X)`` is ``(N,)``. Lengthscales may be scalars or ARD vectors of shape ``(D,)``.

Kernels are JAX pytrees: the hyperparameter values are the leaves (other settings, such as
``ard``, are static), so a kernel passes through ``jax.jit``, ``jax.vmap`` and ``jax.grad`` as
an argument. A subclass may hold an array as a static setting; it cannot then be a jit
argument (:func:`is_jit_argument`), and the library evaluates it operation by operation where
it would otherwise pass it to a compiled program (a model run eagerly). ``k1 + k2`` and
``k1 * k2`` build :class:`Sum` and :class:`Product`, and ``sum([k1, k2, k3])`` works too.

Hyperparameters are checked at construction: concrete values (Python numbers, NumPy or JAX
arrays) must be finite and positive, or the constructor raises ``ValueError`` naming the
hyperparameter; traced values (a kernel built inside ``jit`` or ``vmap``) are not checked.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = [
    "Kernel",
    "Stationary",
    "RBF",
    "SquaredExponential",
    "Matern12",
    "Matern32",
    "Matern52",
    "Periodic",
    "Linear",
    "Sum",
    "Product",
]


def _check_hyperparameter(kernel: str, name: str, value: Any) -> None:
    """Raise unless the concrete ``value`` is numeric, finite and positive (tracers pass)."""
    try:
        array = np.asarray(value)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return  # traced (inside jit/vmap): checked where it was concrete
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{kernel}: {name} must be a real number or array, got {value!r}")
    if not (np.all(np.isfinite(array)) and np.all(array > 0)):
        raise ValueError(f"{kernel}: {name} must be finite and positive, got {value!r}")


def _check_hyperparameter_names(kernel: Kernel, values: dict[str, Any]) -> None:
    """The names given to :meth:`Kernel.replace` must be the kernel's hyperparameters.

    :raises ValueError: naming the unknown ones.
    """
    unknown = set(values) - set(kernel.hyperparameters())
    if unknown:
        raise ValueError(
            f"{type(kernel).__name__} has no hyperparameter(s) {sorted(unknown)}; "
            f"it has {sorted(kernel.hyperparameters())}"
        )


class Kernel:
    """Base class. Subclasses are frozen dataclasses whose fields listed in
    ``_hyperparameter_names`` are the positive hyperparameters (the pytree leaves); every
    other field is static. A subclass computes its matrix in ``_matrix(X1, X2)`` and its diagonal
    in ``_diag(X)`` from inputs :meth:`__call__` and :meth:`diag` have checked."""

    _hyperparameter_names: ClassVar[tuple[str, ...]] = ()
    # every concrete kernel is a dataclass (dataclasses.replace and fields take it)
    if TYPE_CHECKING:
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        # dataclass constructors and dataclasses.replace call this; pytree unflattening
        # (jit, vmap, tree_map) builds kernels without it, so placeholders pass through
        for name in self._hyperparameter_names:
            _check_hyperparameter(type(self).__name__, name, getattr(self, name))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node(
            cls, _flatten_kernel, lambda aux, leaves: _unflatten_kernel(cls, aux, leaves)
        )

    def __call__(self, X1: ArrayLike, X2: ArrayLike | None = None) -> jax.Array:
        """The covariance matrix ``(N1, N2)`` between ``X1 (N1, D)`` and ``X2 (N2, D)`` (default
        ``X1``).

        :raises ValueError: for inputs that are not 2-D or disagree in their dimension.
        """
        X1 = jnp.asarray(X1)
        X2 = X1 if X2 is None else jnp.asarray(X2)
        if X1.ndim != 2 or X2.ndim != 2:
            raise ValueError(
                f"kernel inputs must be 2-D (num_points, dim); got shapes {X1.shape} and {X2.shape}"
            )
        if X1.shape[-1] != X2.shape[-1]:
            raise ValueError(
                f"kernel inputs disagree in dimension: {X1.shape[-1]} vs {X2.shape[-1]}"
            )
        return self._matrix(X1, X2)

    def diag(self, X: ArrayLike) -> jax.Array:
        """Diagonal of ``self(X, X)``, shape ``(N,)`` (``(..., N)`` for ``(..., N, D)``), without
        forming the matrix."""
        X = jnp.asarray(X)
        if X.ndim < 2:
            raise ValueError(f"kernel inputs must be 2-D (num_points, dim); got shape {X.shape}")
        return self._diag(X)

    def _matrix(self, X1: jax.Array, X2: jax.Array) -> jax.Array:
        raise NotImplementedError

    def _diag(self, X: jax.Array) -> jax.Array:
        raise NotImplementedError

    def hyperparameters(self) -> dict[str, Any]:
        """Flat dict of hyperparameter name -> value (floats or arrays)."""
        return {name: getattr(self, name) for name in self._hyperparameter_names}

    def replace(self, **values: Any) -> Kernel:
        """A copy with some hyperparameters replaced (names as in :meth:`hyperparameters`)."""
        _check_hyperparameter_names(self, values)
        return dataclasses.replace(self, **values)

    def with_input_dim(self, input_dim: int) -> Kernel:
        """A copy whose ARD lengthscales (if any) are broadcast to ``(input_dim,)``."""
        return self

    def __add__(self, other: Kernel) -> Sum:
        """``self + other``: the :class:`Sum` of the two kernels."""
        return Sum(self, other)

    def __radd__(self, other: Any) -> Kernel:
        """``0 + self`` is ``self``, so that ``sum([k1, k2])`` works."""
        # sum([k1, k2]) starts from 0
        return self if isinstance(other, (int, float)) and other == 0 else NotImplemented

    def __mul__(self, other: Kernel) -> Product:
        """``self * other``: the :class:`Product` of the two kernels."""
        return Product(self, other)


def _flatten_kernel(kernel: Kernel) -> tuple[tuple, tuple]:
    names = kernel._hyperparameter_names
    static = tuple(
        (f.name, getattr(kernel, f.name)) for f in dataclasses.fields(kernel) if f.name not in names
    )
    return tuple(getattr(kernel, n) for n in names), static


def is_jit_argument(value: Any) -> bool:
    """Whether ``value`` (a kernel, or any pytree holding kernels) can be an argument of a
    jitted function: the static data of every node of its structure hash (a kernel's settings,
    every field but the hyperparameters, of every part). A kernel subclass with an array
    setting does not: JAX would fail comparing it with the settings of a compiled program's
    kernel."""

    def hashes(node: Any) -> bool:
        kind_and_data = node.node_data()  # None for a leaf
        data = None if kind_and_data is None else kind_and_data[1]
        try:
            hash(tuple(data) if isinstance(data, list) else data)  # a dict's keys: a list
        except TypeError:
            return False
        return all(hashes(child) for child in node.children())

    return hashes(jax.tree_util.tree_structure(value))


def _unflatten_kernel(cls: type[Kernel], static: tuple, leaves: tuple) -> Kernel:
    out = object.__new__(cls)
    for name, value in (*zip(cls._hyperparameter_names, leaves), *static):
        object.__setattr__(out, name, value)
    return out


@dataclasses.dataclass(frozen=True)
class Stationary(Kernel):
    """``variance * g(r)`` with ``r`` the lengthscale-scaled Euclidean distance.

    :param variance: signal variance (> 0).
    :param lengthscale: scalar or ``(D,)`` lengthscales (> 0).
    :param ard: if True, :meth:`with_input_dim` gives one lengthscale per input dimension.
    """

    variance: ArrayLike = 1.0
    lengthscale: ArrayLike = 1.0
    ard: bool = True
    _hyperparameter_names: ClassVar[tuple[str, ...]] = ("variance", "lengthscale")

    def with_input_dim(self, input_dim: int) -> Stationary:
        """A copy whose scalar lengthscale is broadcast to ``(input_dim,)`` if ``ard``.

        :param input_dim: the input width ``D``.
        :return: the kernel with lengthscales of shape ``(input_dim,)`` (``ard``) or as they are.
        :raises ValueError: if the lengthscales are a vector of another length than ``input_dim``.
        """
        ls = jnp.asarray(self.lengthscale)
        if ls.ndim == 1 and ls.shape[0] not in (1, input_dim):
            raise ValueError(
                f"{type(self).__name__}.lengthscale has shape {ls.shape}, "
                f"but the layer input has {input_dim} dimensions"
            )
        if self.ard and ls.ndim == 0:
            return dataclasses.replace(self, lengthscale=jnp.full((input_dim,), ls))
        return self

    # Profiles with a kink at r = 0 (Matern12) set squared distances below the round-off of
    # the expansion in _scaled_sqdist to exactly 0, see there.
    _zero_roundoff: ClassVar[bool] = False

    def _scaled_sqdist(self, X1: jax.Array, X2: jax.Array) -> jax.Array:
        ls = jnp.asarray(self.lengthscale)
        A = X1 / ls
        B = X2 / ls
        # |a-b|^2 via the BLAS-friendly expansion; clip tiny negatives from cancellation.
        nA = jnp.sum(A**2, -1)[:, None]
        nB = jnp.sum(B**2, -1)[None, :]
        sq = jnp.maximum(nA + nB - 2.0 * A @ B.T, 0.0)
        if self._zero_roundoff:
            # The expansion leaves O(eps (|a|^2 + |b|^2)) of round-off where a == b; exp(-r)
            # turns that into an O(sqrt(eps)) error (k(x, x) = variance * (1 - 1e-7) in
            # float64, 1 - 1e-3 in float32). Distances below the round-off are
            # indistinguishable from 0 anyway, so make them 0.
            dim = A.shape[-1]
            tol = (4.0 + 2.0 * dim**0.5) * jnp.finfo(sq.dtype).eps * (nA + nB)
            sq = jnp.where(sq > tol, sq, 0.0)
        return sq

    def _profile(self, sqdist: jax.Array) -> jax.Array:
        """``g`` as a function of the squared scaled distance ``r^2``."""
        raise NotImplementedError

    def _matrix(self, X1: jax.Array, X2: jax.Array) -> jax.Array:
        return (_stationary_gram if is_jit_argument(self) else _gram)(self, X1, X2)

    def _diag(self, X: jax.Array) -> jax.Array:  # variance at every point
        return jnp.broadcast_to(jnp.asarray(self.variance, X.dtype), X.shape[:-1])


# One program per kernel type and input shapes. Called outside jit (interactive use, tests),
# the dozen operations of a Gram matrix would otherwise each compile on their own at every new
# shape; inside jit, grad or vmap it is inlined like any nested jit.
def _gram(kernel: Stationary, X1: jax.Array, X2: jax.Array) -> jax.Array:
    return jnp.asarray(kernel.variance) * kernel._profile(kernel._scaled_sqdist(X1, X2))


_stationary_gram = jax.jit(_gram)


def _safe_sqrt(sq: jax.Array) -> jax.Array:
    # sqrt with a finite gradient at 0 (the diagonal of K(X, X)). Clamp, do not substitute:
    # XLA may compute ``sq`` twice in different fusions with different rounding, and with
    # ``where(sq > 0, sqrt(where(sq > 0, sq, 1.0)), 0)`` the two masks then disagree on a
    # diagonal round-off residue and the stand-in 1.0 leaks out (k(x, x) = 0.34 variance
    # under jit; tests/test_kernels.py). With a clamp a disagreement costs sqrt(tiny).
    tiny = jnp.finfo(sq.dtype).tiny
    return jnp.where(sq > tiny, jnp.sqrt(jnp.maximum(sq, tiny)), 0.0)


@dataclasses.dataclass(frozen=True)
class RBF(Stationary):
    """Squared exponential: ``variance * exp(-r^2 / 2)``."""

    def _profile(self, sq: jax.Array) -> jax.Array:
        return jnp.exp(-0.5 * sq)


SquaredExponential = RBF


@dataclasses.dataclass(frozen=True)
class Matern12(Stationary):
    """Matérn 1/2 (exponential): ``variance * exp(-r)``."""

    _zero_roundoff: ClassVar[bool] = True

    def _profile(self, sq: jax.Array) -> jax.Array:
        return jnp.exp(-_safe_sqrt(sq))


@dataclasses.dataclass(frozen=True)
class Matern32(Stationary):
    """Matérn 3/2: ``variance * (1 + sqrt(3) r) exp(-sqrt(3) r)``."""

    def _profile(self, sq: jax.Array) -> jax.Array:
        r = jnp.sqrt(3.0) * _safe_sqrt(sq)
        return (1.0 + r) * jnp.exp(-r)


@dataclasses.dataclass(frozen=True)
class Matern52(Stationary):
    """Matérn 5/2: ``variance * (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)``."""

    def _profile(self, sq: jax.Array) -> jax.Array:
        r = jnp.sqrt(5.0) * _safe_sqrt(sq)
        return (1.0 + r + 5.0 * sq / 3.0) * jnp.exp(-r)


@dataclasses.dataclass(frozen=True)
class Periodic(Kernel):
    """Periodic (MacKay) kernel on the Euclidean distance per dimension:
    ``variance * exp(-2 sum_d sin^2(pi |x_d - x'_d| / period) / lengthscale_d^2)``.

    :param variance: signal variance (> 0).
    :param lengthscale: scalar or ``(D,)`` (> 0).
    :param period: scalar (> 0).
    """

    variance: ArrayLike = 1.0
    lengthscale: ArrayLike = 1.0
    period: ArrayLike = 1.0
    _hyperparameter_names: ClassVar[tuple[str, ...]] = ("variance", "lengthscale", "period")

    def _matrix(self, X1: jax.Array, X2: jax.Array) -> jax.Array:
        diff = X1[:, None, :] - X2[None, :, :]
        s = jnp.sin(jnp.pi * diff / self.period) / jnp.asarray(self.lengthscale)
        return jnp.asarray(self.variance) * jnp.exp(-2.0 * jnp.sum(s**2, -1))

    def _diag(self, X: jax.Array) -> jax.Array:  # variance at every point
        return jnp.broadcast_to(jnp.asarray(self.variance, X.dtype), X.shape[:-1])


@dataclasses.dataclass(frozen=True)
class Linear(Kernel):
    """Linear kernel ``variance * x^T x'`` (a Bayesian linear model through the origin).

    :param variance: weight variance (> 0).
    """

    variance: ArrayLike = 1.0
    _hyperparameter_names: ClassVar[tuple[str, ...]] = ("variance",)

    def _matrix(self, X1: jax.Array, X2: jax.Array) -> jax.Array:
        return jnp.asarray(self.variance) * (X1 @ X2.T)

    def _diag(self, X: jax.Array) -> jax.Array:  # variance * |x|^2 per point
        return jnp.asarray(self.variance) * jnp.sum(X**2, -1)


@dataclasses.dataclass(frozen=True)
class _Combination(Kernel):
    """Hyperparameters of the parts are namespaced ``k0.<name>``, ``k1.<name>``, ...

    :param kernels: the parts (nested combinations of the same kind are flattened).
    :raises TypeError: if a part is not a :class:`Kernel`.
    """

    kernels: tuple
    # the parts are the pytree's children (their hyperparameters its leaves); a combination's
    # hyperparameters() and replace() read the parts' own
    _hyperparameter_names: ClassVar[tuple[str, ...]] = ("kernels",)
    #: how the parts' matrices and diagonals are combined, left to right
    _combine: ClassVar[Callable[[Any, Any], Any]]

    def __init__(self, *kernels: Kernel) -> None:
        flat: list[Kernel] = []
        for k in kernels:
            if not isinstance(k, Kernel):
                raise TypeError(f"{type(self).__name__} takes Kernel objects, got {type(k)}")
            # flatten nested combinations of the same kind so names stay short
            flat.extend(k.kernels if type(k) is type(self) else [k])
        object.__setattr__(self, "kernels", tuple(flat))

    def hyperparameters(self) -> dict[str, Any]:
        """Flat dict of ``"k<i>.<name>"`` -> value over the parts."""
        return {
            f"k{i}.{name}": value
            for i, k in enumerate(self.kernels)
            for name, value in k.hyperparameters().items()
        }

    def replace(self, **values: Any) -> _Combination:
        """A copy with some parts' hyperparameters replaced (names ``"k<i>.<name>"``)."""
        _check_hyperparameter_names(self, values)
        parts = []
        for i, k in enumerate(self.kernels):
            prefix = f"k{i}."
            mine = {n[len(prefix) :]: v for n, v in values.items() if n.startswith(prefix)}
            parts.append(k.replace(**mine) if mine else k)
        return type(self)(*parts)

    def with_input_dim(self, input_dim: int) -> _Combination:
        """A copy whose parts have their ARD lengthscales broadcast to ``(input_dim,)``."""
        return type(self)(*(k.with_input_dim(input_dim) for k in self.kernels))

    def __call__(self, X1: ArrayLike, X2: ArrayLike | None = None) -> jax.Array:
        """The covariance matrix ``(N1, N2)``: the parts' matrices combined."""
        return functools.reduce(type(self)._combine, (k(X1, X2) for k in self.kernels))

    def diag(self, X: ArrayLike) -> jax.Array:
        """Diagonal of ``self(X, X)``, shape ``(N,)``: the parts' diagonals combined."""
        return functools.reduce(type(self)._combine, (k.diag(X) for k in self.kernels))


class Sum(_Combination):
    """Sum of kernels: ``Sum(k1, k2)`` or ``k1 + k2`` (matrices and diagonals are the sums of the
    parts').

    :param kernels: the summands.
    """

    _combine = operator.add


class Product(_Combination):
    """Elementwise product of kernels: ``Product(k1, k2)`` or ``k1 * k2`` (matrices and diagonals
    are the elementwise products of the parts').

    :param kernels: the factors.
    """

    _combine = operator.mul
