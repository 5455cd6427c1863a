"""What a ``gp_layer`` call is made of: hyperparameter and mean-function sites, checks, messages."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from numpyro_dgp._compat import apply_stack, innermost_trace
from numpyro_dgp._validation import concrete, non_finite_entries, warn_if_not_standardized
from numpyro_dgp.core import check_jitter, default_jitter
from numpyro_dgp.kernels import Kernel

__all__ = ["MEAN_FUNCTIONS", "mean_projection"]

#: The named mean functions ``gp_layer(..., mean=...)`` accepts (besides a callable).
MEAN_FUNCTIONS = ("zero", "identity", "linear")


def _holds(check: Callable[..., Any], *values: ArrayLike) -> bool | None:
    """``bool(check(xp, *values))`` for concrete values, ``None`` when one is traced (checks run
    only eagerly). Values in host memory are checked with NumPy (``xp = numpy``), so that an eager
    check compiles nothing; arrays on an accelerator where they are (``xp = jax.numpy``) rather
    than copied to the host."""
    if any(isinstance(v, jax.core.Tracer) for v in values):
        return None
    if any(isinstance(v, jax.Array) and any(d.platform != "cpu" for d in v.devices()) for v in values):
        try:
            return bool(check(jnp, *values))
        except jax.errors.ConcretizationTypeError:
            return None
    arrays = [concrete(v) for v in values]
    if any(a is None for a in arrays):
        return None
    return bool(check(np, *arrays))


def _all_finite(xp: Any, x: Any) -> Any:
    if not np.issubdtype(x.dtype, np.inexact):
        return True
    # NumPy: by blocks of rows (no whole-size mask for a large data set)
    return non_finite_entries(x)[0] == 0 if xp is np else xp.all(xp.isfinite(x))


def _resolve_jitter(name: str, jitter: float | None, dtype: Any) -> float:
    """The layer's jitter: the dtype's default, or the given one once checked."""
    jitter = default_jitter(dtype) if jitter is None else jitter
    try:
        check_jitter(jitter)
    except ValueError:
        raise ValueError(f"gp_layer {name!r}: jitter must be a finite positive number, got {jitter!r}") from None
    return jitter


def _check_unique_name(name: str) -> None:
    """Refuse a second layer ``name`` in one run of the model (NumPyro's own check of duplicate
    sites is an ``assert``, gone under ``python -O``; a duplicate would silently overwrite the
    first layer's sites in the trace)."""
    recorded = innermost_trace()
    if recorded is None:
        return
    clash = [site for site in (f"{name}.u", f"{name}.layer", name) if site in recorded]
    if clash:
        raise ValueError(
            f"gp_layer: duplicate layer name {name!r}: this run of the model already has the site(s) "
            f"{clash}; give every gp_layer call its own name (e.g. 'h1', 'h2', ...)"
        )


def _check_kernel_values(name: str, kernel: Kernel) -> None:
    """The kernel's initial hyperparameters must be positive (a kernel built as a pytree skips
    its constructor's check)."""
    for hp, value in kernel.hyperparameters().items():
        if _holds(lambda xp, v: xp.all(v > 0), value) is False:
            raise ValueError(f"gp_layer {name!r}: kernel hyperparameter {hp!r} must be positive, got {value}")


def _check_input_scale(name: str, X: jax.Array, kernel: Kernel) -> None:
    """Warn (once) when the layer's inputs spread far beyond its kernel's lengthscales. Only
    the upper side: an inner layer's inputs (the previous layer's outputs) legitimately start
    with a tiny spread (a near-deterministic q(u), zero-padded identity means); too small a
    spread of the data is reported by :func:`numpyro_dgp.fit`."""
    lengthscales = [v for k, v in kernel.hyperparameters().items() if k.rpartition(".")[2] == "lengthscale"]
    warn_if_not_standardized(X, "X", f"gp_layer {name!r}", lengthscales or None, upper_only=True,
                             stacklevel=4)


def _check_finite(x: ArrayLike, what: str) -> None:
    if _holds(_all_finite, x) is False:
        raise ValueError(f"{what} contains NaN or inf values")


def mean_projection(X: ArrayLike, in_dim: int, out_dim: int) -> jax.Array:
    """DSVI's fixed inner-layer mean weight ``W`` (the mean function is ``X @ W``).

    The identity when the widths agree, zero-padding ``[I, 0]`` when the layer widens, and
    the projection on the top ``out_dim`` right singular vectors of the (uncentered) inputs
    when it narrows, as in Salimbeni & Deisenroth (2017). ``gp_layer(..., mean="identity")``
    uses it (fixed), ``mean="linear"`` starts from it (learned).

    :param X: ``(N, in_dim)`` the layer's inputs at initialization.
    :param in_dim: input width.
    :param out_dim: output width.
    :return: ``(in_dim, out_dim)`` weight.
    """
    X = jnp.asarray(X)
    if in_dim == out_dim:
        return jnp.eye(in_dim, dtype=X.dtype)
    if in_dim < out_dim:
        return jnp.eye(in_dim, out_dim, dtype=X.dtype)  # [I, 0]: pad with zeros
    # top out_dim right singular vectors of the (uncentered) inputs, as in DSVI
    _, _, Vt = jnp.linalg.svd(X, full_matrices=False)
    return Vt[:out_dim].T


def _mean_function(
    name: str, mean: str | Callable, X: jax.Array, in_dim: int, out_dim: int
) -> tuple[Callable, tuple[jax.Array, jax.Array] | None]:
    """The layer's mean function and, for the named (affine) ones, its ``(W (D, P), b (P,))``
    (``(None, None)`` for ``"zero"``): moment propagation through a layer (nested variational
    compression) needs them."""
    if callable(mean):
        return mean, None
    zero_bias = jnp.zeros(out_dim, X.dtype)
    if mean == "zero":
        return (lambda A: jnp.zeros(A.shape[:-1] + (out_dim,), A.dtype)), (None, None)
    if mean == "identity":
        if in_dim == out_dim:
            return (lambda A: A), (jnp.eye(in_dim, dtype=X.dtype), zero_bias)
        W = numpyro.param(f"{name}.mean.weight", lambda _: mean_projection(X, in_dim, out_dim))
        W = jax.lax.stop_gradient(W)  # fixed, as in DSVI; stored so predictions reuse it
        return (lambda A: A @ W), (W, zero_bias)
    if mean == "linear":
        W = numpyro.param(f"{name}.mean.weight", lambda _: mean_projection(X, in_dim, out_dim))
        b = numpyro.param(f"{name}.mean.bias", jnp.zeros(out_dim, X.dtype))
        return (lambda A: A @ W + b), (W, b)
    raise ValueError(
        f"gp_layer {name!r}: mean must be one of {MEAN_FUNCTIONS} or a callable, got {mean!r}"
    )


def _noise_variance(name: str, noise: ArrayLike | None, dtype: jnp.dtype) -> jax.Array | None:
    """The layer's learned output noise variance (``numpyro.param`` ``"<name>.noise"``), or ``None``."""
    if noise is None:
        return None
    if np.ndim(noise) != 0 or _holds(lambda xp, v: xp.isfinite(v) & (v > 0), noise) is False:
        raise ValueError(f"gp_layer {name!r}: noise must be a finite positive scalar (a variance), got {noise!r}")
    return numpyro.param(f"{name}.noise", jnp.asarray(noise, dtype), constraint=constraints.positive)


def _hyperparameters(name: str, kernel: Kernel, dtype: jnp.dtype, priors: dict, learn: bool) -> Kernel:
    values = {}
    for hp, init in kernel.hyperparameters().items():
        site = f"{name}.kernel.{hp}"
        init = jnp.asarray(init, dtype)
        if hp in priors:
            prior = priors[hp]
            if prior.event_shape == () and prior.batch_shape != init.shape:
                # a scalar prior on an ARD hyperparameter: one independent copy per dimension
                prior = prior.expand(init.shape).to_event(init.ndim)
            values[hp] = numpyro.sample(site, prior)
            continue
        if _holds(lambda xp, v: xp.all(v > 0), init) is False:
            raise ValueError(
                f"gp_layer {name!r}: kernel hyperparameter {hp!r} must be positive, got {init}"
            )
        value = numpyro.param(site, init, constraint=constraints.positive)
        values[hp] = value if learn else jax.lax.stop_gradient(value)
    try:
        return kernel.replace(**values)
    except ValueError as err:  # a given (substituted) value that is not positive
        raise ValueError(f"gp_layer {name!r}: {err} (site '{name}.kernel.*')") from None


def _default_encoder_input(X: jax.Array) -> jax.Array:
    """Without an amortization rule a layer's encoder sees its own input (rule AR1 of Meng & Zhang 2024)."""
    return X


def _emit(msg_type: str, name: str, fn: Callable, args: tuple, **kwargs: Any) -> Any:
    """Send a non-sample message (``"dgp_layer"``, ``"dgp_encoder_input"``) through the
    handler stack; handlers may set its value, else ``fn(*args, **kwargs)`` gives it."""
    msg = {
        "type": msg_type,
        "name": name,
        "fn": fn,
        "args": args,
        "kwargs": kwargs,
        "value": None,
        "scale": None,
        "is_observed": False,
        "intermediates": [],
        "cond_indep_stack": [],
        "infer": {},
    }
    return apply_stack(msg)["value"]
