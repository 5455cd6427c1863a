"""Input validation at the door: dtypes, shapes, finiteness and the scale of the inputs.

Checks that need values (finiteness, scale) run only on concrete arrays: inside ``jit``,
``vmap`` or ``eval_shape`` the inputs are tracers and were checked when the model first ran
eagerly (``svi.init``, :func:`numpyro_dgp.fit`'s door).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dgp.kernels import Kernel

#: The named mean functions ``gp_layer(..., mean=...)`` accepts (besides a callable).
MEAN_FUNCTIONS = ("zero", "identity", "linear")

#: Spread of a feature (standard deviation over the points, relative to the kernel's initial
#: lengthscale where a layer checks) outside which :class:`InputScaleWarning` is issued.
SCALE_LIMITS = (1e-3, 1e3)

#: fingerprints of the scale problems already reported (one warning per problem and process)
_WARNED: set = set()


class InputScaleWarning(UserWarning):
    """Inputs far from standardized: some feature's spread (standard deviation over the points)
    is above 1e3 or below 1e-3 times the kernel's lengthscale (kernels start at unit
    lengthscales), so the fit may converge to a constant predictor or a poor optimum.

    Standardize the inputs (subtract the mean, divide by the standard deviation per feature)
    or give the kernel lengthscales of the data's scale. Issued once per distinct problem by
    :func:`numpyro_dgp.fit` (its first argument, the inputs), :func:`numpyro_dgp.gp_layer`
    (inputs spread above the upper limit relative to the layer's lengthscales) and
    :func:`numpyro_dgp.predict` (test inputs above the upper limit); silence it with
    ``warnings.filterwarnings("ignore", category=InputScaleWarning)``.
    """


#: Largest ``|mean|`` and the range of the standard deviation of a Gaussian (or Student-t)
#: target outside which :class:`TargetScaleWarning` is issued.
TARGET_LIMITS = (10.0, (0.1, 10.0))


class TargetScaleWarning(UserWarning):
    """A Gaussian (or Student-t) target far from standardized: its mean is beyond +-10 or its
    standard deviation outside [0.1, 10], while the last layer starts as a zero-mean GP of unit
    variance and the noise at 0.01, so the fit may end at a constant predictor (a target of
    standard deviation 77 fitted to an RMSE of 77).

    Standardize the targets with the training part's statistics and map the predictions back:
    ``s = Standardization.fit(X_train, y_train)``, fit on ``s.targets(y_train)``, then
    ``s.to_data_units(prediction)`` (:class:`~numpyro_dgp.Standardization`). Issued once per
    distinct problem by :func:`numpyro_dgp.fit`; silence it with
    ``warnings.filterwarnings("ignore", category=TargetScaleWarning)``.
    """


def is_array(x: Any) -> bool:
    """Whether ``x`` is an array (JAX or NumPy): what the compiled drivers trace rather than
    treat as a static argument."""
    return isinstance(x, (jax.Array, np.ndarray))


def split_traced(
    args: tuple, kwargs: dict
) -> tuple[tuple, tuple, dict, tuple[tuple[str, Any], ...]]:
    """``(dyn_args, static_args, dyn_kwargs, static_kwargs)``: the arrays a compiled driver
    traces, each other argument (a batch size, a flag) static. A traced positional argument's
    place holds ``None`` in ``static_args`` and the reverse; ``static_kwargs`` is sorted by name
    (hashable, a cache key when its values are)."""
    dyn_args = tuple(a if is_array(a) else None for a in args)
    static_args = tuple(None if is_array(a) else a for a in args)
    dyn_kwargs = {k: v for k, v in kwargs.items() if is_array(v)}
    static_kwargs = tuple(sorted((k, v) for k, v in kwargs.items() if not is_array(v)))
    return dyn_args, static_args, dyn_kwargs, static_kwargs


def hashable(value: Any) -> bool:
    """Whether ``value`` can be hashed (a static argument of a compiled function, a cache key)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def concrete(x: Any) -> np.ndarray | None:
    """``x`` as a NumPy array, or ``None`` when it is a tracer (inside ``jit``/``eval_shape``)
    or a global array of several processes (not all of it is in this process)."""
    if isinstance(x, jax.core.Tracer):
        return None
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return None
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def as_float_array(x: Any, name: str, caller: str, ndim: int | None = None) -> jax.Array:
    """``x`` as a JAX array of a floating dtype: booleans and integers are cast to the default
    float (``jnp.result_type(float)``: float64 with 64-bit mode on, else float32), complex and
    non-numeric inputs are refused.

    :param x: the input.
    :param name: the argument's name in messages (e.g. ``"X"``).
    :param caller: the function in messages.
    :param ndim: the number of dimensions required (``None``: any).
    :return: the floating array.
    :raises TypeError: for complex or non-numeric inputs.
    :raises ValueError: for a number of dimensions other than ``ndim``.
    """
    try:
        # a JAX array is kept as it is: jnp.asarray would copy a tracer under jax.grad, and
        # moment propagation tells a layer's input by its identity
        if not isinstance(x, jax.Array):
            x = jnp.asarray(x)
    except TypeError as err:
        raise TypeError(
            f"{caller}: {name} must be a numeric array, got {type(x).__name__}: {err}"
        ) from None
    if jnp.issubdtype(x.dtype, jnp.complexfloating) or not (
        jnp.issubdtype(x.dtype, jnp.number) or x.dtype == jnp.bool_
    ):
        raise TypeError(
            f"{caller}: {name} must be a real (float or integer) array, got dtype {x.dtype}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    if ndim is not None and x.ndim != ndim:
        shape = {1: "(num_points,)", 2: "(num_points, dim)"}.get(ndim, f"{ndim}-D")
        raise ValueError(f"{caller}: {name} must have shape {shape}, got shape {tuple(x.shape)}")
    return x


def check_finite(x: Any, name: str, caller: str) -> None:
    """Raise if the concrete array ``x`` holds NaN or infinite values (tracers pass).

    :param x: the array.
    :param name: the argument's name in messages.
    :param caller: the function in messages.
    :raises ValueError: naming the argument and the first bad entries.
    """
    value = concrete(x)
    if value is None or not np.issubdtype(value.dtype, np.inexact):
        return
    count, first = non_finite_entries(value)
    if count:
        raise ValueError(f"{caller}: {name} contains {count} NaN or inf values (first at {first})")


#: bytes of data per block of the host-side finiteness check (its boolean mask stays small)
_FINITE_BLOCK_BYTES = 1 << 24


def non_finite_entries(value: np.ndarray, max_first: int = 3) -> tuple[int, list[tuple[int, ...]]]:
    """``(count, first)``: how many entries of the NumPy array ``value`` are NaN or inf, and the
    indices of the first ``max_first`` of them.

    Checked over blocks of rows of at most 16 MiB, so that a large data set never gets a
    whole-size boolean mask (a ``(10^7, 90)`` array's would be 900 MB).

    :param value: the array.
    :param max_first: how many indices of bad entries to return.
    :return: the count of NaN and inf entries and the first indices.
    """
    if value.ndim == 0 or value.size == 0:
        bad = ~np.isfinite(value)
        return int(bad.sum()), [tuple(int(i) for i in idx) for idx in np.argwhere(bad)[:max_first]]
    row_bytes = max(1, value.itemsize * (value.size // value.shape[0]))
    rows = max(1, _FINITE_BLOCK_BYTES // row_bytes)
    count = 0
    first: list[tuple[int, ...]] = []
    for start in range(0, value.shape[0], rows):
        bad = ~np.isfinite(value[start : start + rows])
        n = int(bad.sum())
        if n and len(first) < max_first:
            first += [
                (int(idx[0]) + start,) + tuple(int(i) for i in idx[1:])
                for idx in np.argwhere(bad)[: max_first - len(first)]
            ]
        count += n
    return count, first


def tree_all_finite(*trees: Any) -> jax.Array:
    """Whether every floating-point entry of ``trees`` is finite, as a traceable boolean
    (integer leaves, e.g. step counters, are skipped): the guard of the training loops.

    :param trees: pytrees of arrays.
    :return: ``()`` boolean array.
    """
    leaves = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree_util.tree_leaves(trees)
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)
    ]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def check_positive_int(value: Any, name: str, caller: str, allow_none: bool = False) -> None:
    """Raise unless ``value`` is a positive integer (or ``None`` when allowed).

    :param value: the value.
    :param name: the argument's name in messages.
    :param caller: the function in messages.
    :param allow_none: accept ``None``.
    :raises ValueError: otherwise.
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{caller}: {name} must be a positive integer, got {value!r}")


def check_positive_number(value: Any, name: str, caller: str, allow_zero: bool = False) -> None:
    """Raise unless ``value`` is a finite number ``> 0`` (``>= 0`` with ``allow_zero``).

    :param value: the value.
    :param name: the argument's name in messages.
    :param caller: the function in messages.
    :param allow_zero: accept 0.
    :raises ValueError: otherwise.
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    ok = math.isfinite(number) and (number > 0 or (allow_zero and number == 0))
    if isinstance(value, bool) or not ok:
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{caller}: {name} must be a finite {kind} number, got {value!r}")


def check_choice(
    value: Any, choices: Any, name: str, caller: str, error: type[Exception] = ValueError
) -> None:
    """Raise unless ``value`` is one of ``choices``.

    :param value: the value.
    :param choices: the accepted values (a tuple, or a dict whose keys are).
    :param name: the argument's name in messages.
    :param caller: the function in messages.
    :param error: the exception type (``NotImplementedError`` for a mode that exists elsewhere).
    :raises ValueError: (or ``error``) naming the accepted values.
    """
    try:
        accepted = value in choices
    except TypeError:  # an unhashable value against a dict or set
        accepted = False
    if not accepted:
        raise error(f"{caller}: {name} must be one of {tuple(choices)}, got {value!r}")


def check_mapping(value: Any, name: str, caller: str) -> None:
    """Raise unless ``value`` is a non-empty dict.

    :raises ValueError: otherwise.
    """
    if not isinstance(value, dict) or not value:
        raise ValueError(
            f"{caller}: {name} must be a non-empty dict, got {type(value).__name__} {value!r:.80}"
        )


def check_kernel(kernel: Any, name: str, caller: str) -> None:
    """Raise unless ``kernel`` is a :class:`~numpyro_dgp.kernels.Kernel`.

    :raises TypeError: otherwise.
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(
            f"{caller}: {name} must be a numpyro_dgp.kernels.Kernel, got {type(kernel).__name__}"
        )


def check_mean(mean: Any, name: str, caller: str) -> None:
    """Raise unless ``mean`` is a callable or one of :data:`MEAN_FUNCTIONS`.

    :raises ValueError: otherwise.
    """
    if not (callable(mean) or mean in MEAN_FUNCTIONS):
        raise ValueError(
            f"{caller}: {name} must be one of {MEAN_FUNCTIONS} or a callable, got {mean!r}"
        )


def _feature_spread(X: np.ndarray) -> np.ndarray:
    """Standard deviation of each feature over the points (NaN where a feature is constant).

    Computed in float64 over blocks of rows (two passes), so that a large ``X`` is never
    copied whole (a float64 copy of a million-row float32 array would double its memory)."""
    X = X.reshape(-1, X.shape[-1])
    block = 1 << 16
    total = np.zeros(X.shape[-1])
    for start in range(0, X.shape[0], block):
        total += X[start : start + block].astype(np.float64).sum(axis=0)
    mean = total / X.shape[0]
    squares = np.zeros(X.shape[-1])
    for start in range(0, X.shape[0], block):
        squares += ((X[start : start + block].astype(np.float64) - mean) ** 2).sum(axis=0)
    std = np.sqrt(squares / X.shape[0])
    return np.where(std > 0, std, np.nan)


def warn_if_not_standardized(
    X: Any,
    name: str,
    caller: str,
    lengthscales: list | None = None,
    upper_only: bool = False,
    stacklevel: int = 4,
) -> None:
    """Issue :class:`InputScaleWarning` (once per distinct problem) when some feature of the
    concrete array ``X`` has a spread outside :data:`SCALE_LIMITS` relative to the lengthscale.

    Constant features are ignored; with several lengthscales (a sum or product of kernels)
    a feature is flagged only when it is off for every one of them.

    :param X: ``(..., N, D)`` inputs (tracers pass).
    :param name: the argument's name in messages.
    :param caller: the function in messages.
    :param lengthscales: the kernel's initial lengthscales (scalars or ``(D,)``); none: 1.
    :param upper_only: flag only spreads above the upper limit (test inputs: a few nearby
        points legitimately have a small spread).
    :param stacklevel: of the warning (4: the line calling the caller's caller, the user's call
        of gp_layer, fit or predict).
    """
    value = concrete(X)
    if value is None or not np.issubdtype(value.dtype, np.floating):
        return
    if value.ndim < 2 or value.shape[-2] < 2:  # no spread to measure
        return
    spread = _feature_spread(value)
    candidates = []
    for ls in lengthscales or [1.0]:
        ls = concrete(ls)
        if ls is None or not (np.all(np.isfinite(ls)) and np.all(ls > 0)):
            return  # traced, or invalid (the kernel's own check reports that)
        candidates.append(spread / np.broadcast_to(np.asarray(ls, np.float64), spread.shape))
    ratios = np.stack(candidates)
    # per feature the lengthscale that fits it best
    best = np.take_along_axis(
        ratios, np.nanargmin(np.abs(np.log(np.where(np.isnan(ratios), 1.0, ratios))), 0)[None], 0
    )[0]
    low, high = SCALE_LIMITS
    too_big = np.flatnonzero(best > high)
    too_small = np.array([], int) if upper_only else np.flatnonzero(best < low)
    if not (too_big.size or too_small.size):
        return
    fingerprint = (
        value.shape[-1],
        tuple(too_big),
        tuple(too_small),
        tuple(np.round(np.log10(best[np.concatenate([too_big, too_small])]))),
    )
    if fingerprint in _WARNED:
        return
    _WARNED.add(fingerprint)
    parts = [
        f"feature(s) {index.tolist()[:10]} have a spread {side} {extreme(best[index]):.3g}"
        for index, side, extreme in (
            (too_big, "up to", np.nanmax),
            (too_small, "down to", np.nanmin),
        )
        if index.size
    ]
    relative = " times the kernel's lengthscale" if lengthscales else ""
    warnings.warn(
        f"{caller}: {name} is far from standardized: {'; '.join(parts)}{relative} (expected within "
        f"[{low:g}, {high:g}]). Kernels start at unit lengthscales, so the fit may end at a "
        "constant predictor: standardize each feature (or set the kernel's lengthscales to the "
        "data's scale).",
        InputScaleWarning,
        stacklevel=stacklevel,
    )


def warn_if_target_not_standardized(
    value: np.ndarray, name: str, caller: str, stacklevel: int = 4
) -> None:
    """Issue :class:`TargetScaleWarning` (once per distinct problem) for a Gaussian target whose
    finite entries have a mean or spread outside :data:`TARGET_LIMITS`.

    :param value: the target's values (NumPy).
    :param name: how the message names it (e.g. ``"'y' (args[1])"``).
    :param caller: the function in messages.
    :param stacklevel: of the warning.
    """
    present = value[np.isfinite(value)].astype(np.float64)
    if present.size < 2:
        return
    mean, std = float(present.mean()), float(present.std())
    largest_mean, (low, high) = TARGET_LIMITS
    if abs(mean) <= largest_mean and (std == 0 or low <= std <= high):
        return
    fingerprint = ("target", round(np.log10(abs(mean) + 1e-300)), round(np.log10(std + 1e-300)))
    if fingerprint in _WARNED:
        return
    _WARNED.add(fingerprint)
    warnings.warn(
        f"{caller}: the Gaussian target {name} is far from standardized: mean {mean:.4g}, "
        f"standard deviation {std:.4g} (expected |mean| <= {largest_mean:g} and a standard "
        f"deviation within [{low:g}, {high:g}]). The last layer starts as a zero-mean GP of unit "
        "variance, so the fit may end at a constant predictor: standardize the target with the "
        "training part's statistics (numpyro_dgp.Standardization.fit(X, y), fit on "
        "s.targets(y), map predictions back with s.to_data_units).",
        TargetScaleWarning,
        stacklevel=stacklevel,
    )
