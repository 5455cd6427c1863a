"""What a ``gp_layer`` call is made of: hyperparameter and mean-function sites, checks, messages."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from numpyro_dgp._compat import active_plates, handler_stack_is_empty, innermost_trace
from numpyro_dgp._validation import (
    MEAN_FUNCTIONS,
    as_float_array,
    check_kernel,
    check_mean,
    check_positive_int,
    check_positive_number,
    concrete,
    non_finite_entries,
    warn_if_not_standardized,
)
from numpyro_dgp.core import default_jitter
from numpyro_dgp.kernels import Kernel

__all__ = ["MEAN_FUNCTIONS", "mean_projection"]

#: The values of ``gp_layer(..., inducing=...)``.
INDUCING_MODES = ("global", "locations", "amortized")


def _holds(check: Callable[..., Any], value: ArrayLike) -> bool | None:
    """``bool(check(xp, value))`` for a concrete value, ``None`` for a traced one (checks run
    only eagerly). Values in host memory are checked with NumPy (``xp = numpy``), so that an eager
    check compiles nothing; arrays on an accelerator where they are (``xp = jax.numpy``) rather
    than copied to the host."""
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, jax.Array) and any(d.platform != "cpu" for d in value.devices()):
        try:
            return bool(check(jnp, value))
        except jax.errors.ConcretizationTypeError:
            return None
    array = concrete(value)
    return None if array is None else bool(check(np, array))


def _all_finite(xp: Any, x: Any) -> Any:
    if not np.issubdtype(x.dtype, np.inexact):
        return True
    # NumPy: by blocks of rows (no whole-size mask for a large data set)
    return non_finite_entries(x)[0] == 0 if xp is np else xp.all(xp.isfinite(x))


def _check_layer_jitter(name: str, jitter: float | None, dtype: Any) -> float:
    """The layer's jitter: the dtype's default, or the given one once checked.

    :raises ValueError: for a given jitter that is not a finite positive number.
    """
    if jitter is None:
        return default_jitter(dtype)
    check_positive_number(jitter, "jitter", f"gp_layer {name!r}")
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
            f"gp_layer: duplicate layer name {name!r}: this run of the model already has the "
            f"site(s) {clash}; give every gp_layer call its own name (e.g. 'h1', 'h2', ...)"
        )


def _check_kernel_values(name: str, kernel: Kernel) -> None:
    """The kernel's initial hyperparameters must be positive (a kernel built as a pytree skips
    its constructor's check)."""
    for hp, value in kernel.hyperparameters().items():
        if _holds(lambda xp, v: xp.all(v > 0), value) is False:
            raise ValueError(
                f"gp_layer {name!r}: kernel hyperparameter {hp!r} must be positive, got {value}"
            )


def _check_input_scale(name: str, X: jax.Array, kernel: Kernel) -> None:
    """Warn (once) when the layer's inputs spread far beyond its kernel's lengthscales. Only
    the upper side: an inner layer's inputs (the previous layer's outputs) legitimately start
    with a tiny spread (a near-deterministic q(u), zero-padded identity means); too small a
    spread of the data is reported by :func:`numpyro_dgp.fit`."""
    lengthscales = [
        v for k, v in kernel.hyperparameters().items() if k.rpartition(".")[2] == "lengthscale"
    ]
    warn_if_not_standardized(
        X, "X", f"gp_layer {name!r}", lengthscales or None, upper_only=True, stacklevel=4
    )


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


def identity(A: jax.Array) -> jax.Array:
    """Its argument as it is: the ``"identity"`` mean function of a layer that keeps its width
    (no product with the identity, which a GPU's TF32 products would round), and the encoder
    input of a layer without an amortization rule (rule AR1 of Meng & Zhang 2024)."""
    return A


def mean_function(
    name: str, mean: str | Callable, X: jax.Array, in_dim: int, out_dim: int
) -> tuple[Callable, tuple[jax.Array, jax.Array] | tuple[None, None] | None]:
    """The layer's mean function and, for the named (affine) ones, its ``(W (D, P), b (P,))``
    (``(None, None)`` for ``"zero"``): moment propagation through a layer (nested variational
    compression) needs them."""
    check_mean(mean, "mean", f"gp_layer {name!r}")
    if callable(mean):
        return mean, None
    # constants built on the host: an eager run of the model compiles nothing for them
    zero_bias = jax.device_put(np.zeros(out_dim, X.dtype))
    if mean == "zero":
        return (lambda A: jnp.zeros(A.shape[:-1] + (out_dim,), A.dtype)), (None, None)
    if mean == "identity" and in_dim == out_dim:
        return identity, (jax.device_put(np.eye(in_dim, dtype=X.dtype)), zero_bias)
    W = numpyro.param(f"{name}.mean.weight", lambda _: mean_projection(X, in_dim, out_dim))
    if mean == "identity":
        W = jax.lax.stop_gradient(W)  # fixed, as in DSVI; stored so predictions reuse it
        return (lambda A: A @ W), (W, zero_bias)
    # "linear"
    b = numpyro.param(f"{name}.mean.bias", jnp.zeros(out_dim, X.dtype))
    return (lambda A: A @ W + b), (W, b)


def noise_variance(name: str, noise: ArrayLike | None, dtype: jnp.dtype) -> jax.Array | None:
    """The layer's learned output noise variance (``numpyro.param`` ``"<name>.noise"``), or
    ``None``.

    :raises ValueError: for a noise that is not a finite positive scalar (checked where
        concrete).
    """
    if noise is None:
        return None
    if np.ndim(noise) != 0 or _holds(lambda xp, v: xp.isfinite(v) & (v > 0), noise) is False:
        raise ValueError(
            f"gp_layer {name!r}: noise must be a finite positive scalar (a variance), got {noise!r}"
        )
    return numpyro.param(
        f"{name}.noise", jnp.asarray(noise, dtype), constraint=constraints.positive
    )


def hyperparameter_sites(
    name: str, kernel: Kernel, dtype: jnp.dtype, priors: dict, learn: bool
) -> Kernel:
    """The kernel with its hyperparameters read from sites ``"<name>.kernel.<hp>"``: a
    ``numpyro.sample`` site where ``priors`` has one, else a positive ``numpyro.param``
    (gradient stopped unless ``learn``)."""
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
        # initial values were checked positive by check_layer_args (_check_kernel_values)
        value = numpyro.param(site, init, constraint=constraints.positive)
        values[hp] = value if learn else jax.lax.stop_gradient(value)
    try:
        return kernel.replace(**values)
    except ValueError as err:  # a given (substituted) value that is not positive: name the layer
        raise ValueError(f"gp_layer {name!r}: {err} (site '{name}.kernel.*')") from None


# ---- gp_layer's argument checks: all of them run before any site is sent ----


class LayerArgs(NamedTuple):
    """A layer's arguments after :func:`check_layer_args`."""

    X: jax.Array  #: float inputs, ``(N, D)`` or ``(S, N, D)``
    propagated_Z: jax.Array | None  #: the locations of an ``(X, Z)`` pair, ``(M, D)``
    inducing_inputs: jax.Array | None  #: given initial inducing inputs, ``(M, D)``
    locations: bool
    whiten: bool
    priors: dict
    jitter: float  #: relative jitter (scaled by the mean prior variance later)
    data_plate: Any = None  #: the data plate of a per-point (amortized) layer


def check_layer_args(
    name: str,
    X: ArrayLike | tuple,
    kernel: Kernel,
    num_inducing: int | None,
    out_dim: int,
    priors: dict | None,
    whiten: bool | None,
    jitter: float | None,
    inducing: str,
    inducing_inputs: ArrayLike | None,
) -> LayerArgs:
    """Every check of ``gp_layer``'s arguments, before any site is sent or JAX work done."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"gp_layer: name must be a non-empty string, got {name!r}")
    check_kernel(kernel, "kernel", f"gp_layer {name!r}")
    _check_unique_name(name)
    _check_kernel_values(name, kernel)
    if inducing not in INDUCING_MODES:
        raise NotImplementedError(
            f"gp_layer {name!r}: inducing={inducing!r} is not available; "
            f"supported: {INDUCING_MODES}"
        )
    check_positive_int(out_dim, "out_dim", f"gp_layer {name!r}")
    if inducing == "amortized":
        return _check_amortized_args(
            name, X, kernel, num_inducing, inducing_inputs, priors, whiten, jitter
        )
    locations = inducing == "locations"
    whiten = _check_whiten(name, whiten, locations)
    X, propagated_Z = _check_locations_pair(name, X, locations)
    _check_run_context(name)
    X = _check_layer_inputs(name, X, kernel, locations)
    priors = _check_priors(name, priors, kernel)
    jitter = _check_layer_jitter(name, jitter, X.dtype)
    if propagated_Z is not None:
        propagated_Z = _check_inducing_array(
            name, propagated_Z, num_inducing, X, "the inducing locations Z of (X, Z)"
        )
        if inducing_inputs is not None:
            raise ValueError(
                f"gp_layer {name!r}: the inducing locations come with X as (X, Z); do not also "
                "pass inducing_inputs"
            )
    elif inducing_inputs is not None:
        inducing_inputs = _check_inducing_array(
            name, inducing_inputs, num_inducing, X, "inducing_inputs"
        )
        _check_finite(inducing_inputs, f"gp_layer {name!r}: inducing_inputs")
    elif isinstance(num_inducing, bool) or not (
        isinstance(num_inducing, (int, np.integer)) and num_inducing >= 1
    ):
        raise ValueError(
            f"gp_layer {name!r}: give num_inducing (a positive integer) or inducing_inputs; "
            f"got num_inducing={num_inducing!r}"
        )
    return LayerArgs(X, propagated_Z, inducing_inputs, locations, whiten, priors, jitter)


def _check_whiten(name: str, whiten: bool | None, locations: bool) -> bool:
    """``whiten`` resolved: by default whitened, except inducing locations, which cannot be."""
    if whiten is None:
        return not locations
    if whiten and locations:
        raise ValueError(
            f"gp_layer {name!r}: inducing='locations' does not support whiten=True (whitening "
            "q(f_l^z) against K(f_(l-1)^z) would be a different variational family)"
        )
    return bool(whiten)


def _check_locations_pair(
    name: str, X: ArrayLike | tuple, locations: bool
) -> tuple[ArrayLike, ArrayLike | None]:
    """``(X, Z or None)``: a previous locations layer hands on the pair ``(X, Z)``.

    :raises ValueError: for a pair without ``inducing='locations'``, or not two items.
    """
    if not isinstance(X, (tuple, list)):
        return X, None
    if not locations:
        raise ValueError(
            f"gp_layer {name!r}: X is a pair (points, inducing locations), which only "
            "inducing='locations' takes; pass the points alone"
        )
    if len(X) != 2:
        raise ValueError(
            f"gp_layer {name!r}: X must be an array or the pair (X, Z); got {len(X)} items"
        )
    return X[0], X[1]


def _check_run_context(name: str) -> None:
    """A global layer runs under ``seed`` and outside data plates (its inducing points are
    global)."""
    if handler_stack_is_empty():
        raise RuntimeError(
            f"gp_layer {name!r} needs a random key: run the model under numpyro.handlers.seed "
            "(SVI, MCMC and Predictive do this)"
        )
    plates = [h.name for h in active_plates()]
    if plates:
        raise ValueError(
            f"gp_layer {name!r} is called inside plate(s) {plates}: its inducing points are "
            "global. Call it outside data plates and subsample the inputs first "
            "(with plate: X_batch = numpyro.subsample(X, event_dim=1))"
        )


def _check_layer_inputs(name: str, X: ArrayLike, kernel: Kernel, locations: bool) -> jax.Array:
    """``X`` as a float array of points (or branches of points), finite and on a sane scale."""
    if not isinstance(X, jax.Array):  # keep a traced input as it is: moment propagation tracks it
        X = jnp.asarray(X)
    if X.ndim == 3 and locations:
        raise ValueError(
            f"gp_layer {name!r}: inducing='locations' does not take branched inputs (S, N, D): "
            "the inducing locations of a layer follow one input, not weighted branches. Use "
            "inducing='global' under numpyro_dgp.handlers.quadrature"
        )
    if X.ndim not in (2, 3):
        raise ValueError(
            f"gp_layer {name!r}: X must have shape (num_points, dim), or (num_branches, "
            "num_points, dim) under numpyro_dgp.handlers.quadrature or an amortized guide; "
            f"got {X.shape}"
        )
    X = as_float_array(X, "X", f"gp_layer {name!r}")
    _check_finite(X, f"gp_layer {name!r}: X")
    _check_input_scale(name, X, kernel)
    return X


def _check_priors(name: str, priors: dict | None, kernel: Kernel) -> dict:
    """``priors`` as a dict of distributions over the kernel's hyperparameters."""
    priors = dict(priors or {})
    for hp, prior in priors.items():
        if hp not in kernel.hyperparameters():
            raise ValueError(
                f"gp_layer {name!r}: priors has {hp!r}, not a hyperparameter of "
                f"{type(kernel).__name__} (it has {sorted(kernel.hyperparameters())})"
            )
        if not isinstance(prior, dist.Distribution):
            raise TypeError(f"gp_layer {name!r}: priors[{hp!r}] must be a Distribution")
    return priors


def _check_inducing_array(
    name: str, Z: ArrayLike, num_inducing: int | None, X: jax.Array, what: str
) -> jax.Array:
    """Given inducing inputs or locations as ``(M, D)`` in ``X``'s dtype, agreeing with
    ``num_inducing``."""
    Z = jnp.asarray(Z, X.dtype)
    in_dim = X.shape[-1]
    if Z.ndim != 2 or Z.shape[1] != in_dim:
        raise ValueError(f"gp_layer {name!r}: {what} must have shape (M, {in_dim}), got {Z.shape}")
    if num_inducing is not None and num_inducing != Z.shape[0]:
        raise ValueError(
            f"gp_layer {name!r}: num_inducing={num_inducing} disagrees with {what} of shape "
            f"{Z.shape}"
        )
    return Z


def _check_amortized_args(
    name: str,
    X: ArrayLike | tuple,
    kernel: Kernel,
    num_inducing: int | None,
    inducing_inputs: ArrayLike | None,
    priors: dict | None,
    whiten: bool | None,
    jitter: float | None,
) -> LayerArgs:
    """Every check of a per-point (amortized) layer."""
    if whiten:
        raise ValueError(
            f"gp_layer {name!r}: inducing='amortized' is unwhitened (the prior "
            "N(m(Z_n), K(Z_n, Z_n)) of Meng & Zhang 2024); whiten=True is not available"
        )
    if inducing_inputs is not None:
        raise ValueError(
            f"gp_layer {name!r}: with inducing='amortized' the inducing inputs come from learned "
            "affine maps of the encoder input; inducing_inputs cannot be given"
        )
    if priors:
        raise ValueError(
            f"gp_layer {name!r}: inducing='amortized' is called inside the data plate, where a "
            "hyperparameter prior would become one sample per point; priors are not available"
        )
    check_positive_int(num_inducing, "num_inducing", f"gp_layer {name!r}")
    data_plate = [p for p in active_plates() if p.dim == -1]
    if not data_plate:
        raise ValueError(
            f"gp_layer {name!r}: inducing='amortized' gives every point its own inducing set; call "
            "it inside the data plate: with numpyro.plate('data', N, subsample_size=B): "
            "x = numpyro.subsample(X, event_dim=1); h = gp_layer(..., x, inducing='amortized')"
        )
    X = as_float_array(X, "X", f"gp_layer {name!r}")
    B = data_plate[0].subsample_size
    if X.ndim not in (2, 3) or X.shape[-2] != B:
        raise ValueError(
            f"gp_layer {name!r}: X must have shape ({B}, dim) (the plate's {B} points), or "
            f"(num_branches, {B}, dim); got {X.shape}"
        )
    _check_finite(X, f"gp_layer {name!r}: X")
    _check_input_scale(name, X, kernel)
    jitter = _check_layer_jitter(name, jitter, X.dtype)
    return LayerArgs(X, None, None, False, False, {}, jitter, data_plate[0])
