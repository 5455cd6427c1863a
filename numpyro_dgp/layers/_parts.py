"""What a ``gp_layer`` call is made of: hyperparameter and mean-function sites, checks, messages,
and its inducing part (the inducing inputs' parameter, the factor of ``K(Z, Z)`` and its inverse,
the prior of the inducing values)."""

from __future__ import annotations

import zlib
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from numpyro_dgp._compat import active_plates, handler_stack_is_empty, innermost_trace
from numpyro_dgp._protocol import INDUCING, InducingTag, send_encoder_input
from numpyro_dgp._validation import (
    as_float_array,
    check_kernel,
    check_mean,
    check_positive_int,
    check_positive_number,
    concrete,
    non_finite_entries,
    warn_if_not_standardized,
)
from numpyro_dgp.core import (
    affine_inducing_inputs,
    cholesky,
    cholesky_and_inverse,
    default_jitter,
    inverse_cholesky,
    jittered_cholesky,
    kmeans,
)
from numpyro_dgp.kernels import Kernel

#: The values of ``gp_layer(..., inducing=...)``.
INDUCING_MODES = ("global", "locations", "amortized")


def _check_finite(x: ArrayLike, what: str) -> None:
    """Refuse a concrete ``x`` holding NaN or inf values (checked on the host by blocks of rows:
    no whole-size mask for a large data set; traced values pass)."""
    value = concrete(x)
    if value is None or not np.issubdtype(value.dtype, np.inexact):
        return
    if non_finite_entries(value)[0]:
        raise ValueError(f"{what} contains NaN or inf values")


def missing_key(caller: str) -> RuntimeError:
    """The error of a layer or latent input that runs without a random key."""
    return RuntimeError(
        f"{caller} needs a random key: run the model under numpyro.handlers.seed "
        "(SVI, MCMC and Predictive do this)"
    )


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
    value = concrete(noise)
    if np.ndim(noise) != 0 or (value is not None and not (np.isfinite(value) and value > 0)):
        raise ValueError(
            f"gp_layer {name!r}: noise must be a finite positive scalar (a variance), got {noise!r}"
        )
    return numpyro.param(
        f"{name}.noise", jnp.asarray(noise, dtype), constraint=constraints.positive
    )


def hyperparameter_sites(name: str, kernel: Kernel, args: LayerArgs, learn: bool) -> Kernel:
    """The kernel with its hyperparameters read from sites ``"<name>.kernel.<hp>"``: a
    ``numpyro.sample`` site where ``priors`` has one, else a positive ``numpyro.param``
    (gradient stopped unless ``learn``)."""
    values = {}
    for hp, init in kernel.hyperparameters().items():
        site = f"{name}.kernel.{hp}"
        init = jnp.asarray(init, args.X.dtype)
        if hp in args.priors:
            prior = args.priors[hp]
            if prior.event_shape == () and prior.batch_shape != init.shape:
                # a scalar prior on an ARD hyperparameter: one independent copy per dimension
                prior = prior.expand(init.shape).to_event(init.ndim)
            values[hp] = numpyro.sample(site, prior)
            continue
        # initial values were checked positive by check_layer_args
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
    data_plate: Any = None  #: the data plate of a per-point (amortized) layer
    jitter: float = 0.0  #: relative jitter (scaled by the mean prior variance later)
    num_inducing: int = 0  #: ``M`` of k-means or of every point's set; 0 with given inputs


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
    """Every check of ``gp_layer``'s arguments, before any site is sent or JAX work done.

    A second layer ``name`` in one run of the model is refused (NumPyro's own check of
    duplicate sites is an ``assert``, gone under ``python -O``; a duplicate would silently
    overwrite the first layer's sites in the trace). The kernel's initial hyperparameters must
    be positive (a kernel built as a pytree skips its constructor's check). Inputs spread far
    beyond the kernel's lengthscales are warned about once, only on the upper side: an inner
    layer's inputs (the previous layer's outputs) legitimately start with a tiny spread (a
    near-deterministic q(u), zero-padded identity means); too small a spread of the data is
    reported by :func:`numpyro_dgp.fit`.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"gp_layer: name must be a non-empty string, got {name!r}")
    caller = f"gp_layer {name!r}"
    check_kernel(kernel, "kernel", caller)
    recorded = innermost_trace()
    clash = [site for site in (f"{name}.u", f"{name}.layer", name) if site in (recorded or {})]
    if clash:
        raise ValueError(
            f"gp_layer: duplicate layer name {name!r}: this run of the model already has the "
            f"site(s) {clash}; give every gp_layer call its own name (e.g. 'h1', 'h2', ...)"
        )
    for hp, value in kernel.hyperparameters().items():
        array = concrete(value)
        if array is not None and not np.all(array > 0):
            raise ValueError(
                f"{caller}: kernel hyperparameter {hp!r} must be positive, got {value}"
            )
    if inducing not in INDUCING_MODES:
        raise NotImplementedError(
            f"{caller}: inducing={inducing!r} is not available; supported: {INDUCING_MODES}"
        )
    check_positive_int(out_dim, "out_dim", caller)
    if inducing == "amortized":
        args = _check_amortized_args(caller, X, num_inducing, inducing_inputs, priors, whiten)
    else:
        locations = inducing == "locations"
        args = _check_shared_args(caller, X, kernel, priors, whiten, locations)
        args = _check_inducing_inputs(caller, args, num_inducing, inducing_inputs)
    _check_finite(args.X, f"{caller}: X")
    lengthscales = [
        v for k, v in kernel.hyperparameters().items() if k.rpartition(".")[2] == "lengthscale"
    ]
    warn_if_not_standardized(args.X, "X", caller, lengthscales, upper_only=True)
    if jitter is None:
        return args._replace(jitter=default_jitter(args.X.dtype))
    check_positive_number(jitter, "jitter", caller)
    return args._replace(jitter=jitter)


def _check_shared_args(
    caller: str,
    X: ArrayLike | tuple,
    kernel: Kernel,
    priors: dict | None,
    whiten: bool | None,
    locations: bool,
) -> LayerArgs:
    """The checks of a layer with shared inducing inputs (``"global"``, ``"locations"``): by
    default whitened, except inducing locations, which cannot be; a previous locations layer
    hands on the pair ``(X, Z)``; the layer runs under ``seed`` and outside data plates (its
    inducing points are global)."""
    if whiten and locations:
        raise ValueError(
            f"{caller}: inducing='locations' does not support whiten=True (whitening "
            "q(f_l^z) against K(f_(l-1)^z) would be a different variational family)"
        )
    propagated_Z = None
    if isinstance(X, (tuple, list)):
        if not locations:
            raise ValueError(
                f"{caller}: X is a pair (points, inducing locations), which only "
                "inducing='locations' takes; pass the points alone"
            )
        if len(X) != 2:
            raise ValueError(f"{caller}: X must be an array or the pair (X, Z); got {len(X)} items")
        X, propagated_Z = X
    if handler_stack_is_empty():
        raise missing_key(caller)
    plates = [h.name for h in active_plates()]
    if plates:
        raise ValueError(
            f"{caller} is called inside plate(s) {plates}: its inducing points are "
            "global. Call it outside data plates and subsample the inputs first "
            "(with plate: X_batch = numpyro.subsample(X, event_dim=1))"
        )
    X = as_float_array(X, "X", caller)  # a JAX array (a traced one too) is kept as it is
    if X.ndim == 3 and locations:
        raise ValueError(
            f"{caller}: inducing='locations' does not take branched inputs (S, N, D): "
            "the inducing locations of a layer follow one input, not weighted branches. Use "
            "inducing='global' under numpyro_dgp.handlers.quadrature"
        )
    if X.ndim not in (2, 3):
        raise ValueError(
            f"{caller}: X must have shape (num_points, dim), or (num_branches, "
            "num_points, dim) under numpyro_dgp.handlers.quadrature or an amortized guide; "
            f"got {X.shape}"
        )
    priors = dict(priors or {})
    for hp, prior in priors.items():
        if hp not in kernel.hyperparameters():
            raise ValueError(
                f"{caller}: priors has {hp!r}, not a hyperparameter of "
                f"{type(kernel).__name__} (it has {sorted(kernel.hyperparameters())})"
            )
        if not isinstance(prior, dist.Distribution):
            raise TypeError(f"{caller}: priors[{hp!r}] must be a Distribution")
    whiten = not locations if whiten is None else bool(whiten)
    return LayerArgs(X, propagated_Z, None, locations, whiten, priors)


def _check_inducing_inputs(
    caller: str, args: LayerArgs, num_inducing: int | None, inducing_inputs: ArrayLike | None
) -> LayerArgs:
    """A shared layer's inducing inputs: the locations of an ``(X, Z)`` pair, given ones, or
    ``num_inducing`` for k-means; given ones as ``(M, D)`` in ``X``'s dtype, agreeing with
    ``num_inducing``."""
    given = args.propagated_Z if args.propagated_Z is not None else inducing_inputs
    if given is None:
        if isinstance(num_inducing, bool) or not (
            isinstance(num_inducing, (int, np.integer)) and num_inducing >= 1
        ):
            raise ValueError(
                f"{caller}: give num_inducing (a positive integer) or inducing_inputs; "
                f"got num_inducing={num_inducing!r}"
            )
        return args._replace(num_inducing=int(num_inducing))
    what = "inducing_inputs" if args.propagated_Z is None else "the inducing locations Z of (X, Z)"
    Z = jnp.asarray(given, args.X.dtype)
    in_dim = args.X.shape[-1]
    if Z.ndim != 2 or Z.shape[1] != in_dim:
        raise ValueError(f"{caller}: {what} must have shape (M, {in_dim}), got {Z.shape}")
    if num_inducing is not None and num_inducing != Z.shape[0]:
        raise ValueError(
            f"{caller}: num_inducing={num_inducing} disagrees with {what} of shape {Z.shape}"
        )
    if args.propagated_Z is not None:
        if inducing_inputs is not None:
            raise ValueError(
                f"{caller}: the inducing locations come with X as (X, Z); do not also "
                "pass inducing_inputs"
            )
        return args._replace(propagated_Z=Z)
    _check_finite(Z, f"{caller}: inducing_inputs")
    return args._replace(inducing_inputs=Z)


def _check_amortized_args(
    caller: str,
    X: ArrayLike | tuple,
    num_inducing: int | None,
    inducing_inputs: ArrayLike | None,
    priors: dict | None,
    whiten: bool | None,
) -> LayerArgs:
    """Every check of a per-point (amortized) layer."""
    if whiten:
        raise ValueError(
            f"{caller}: inducing='amortized' is unwhitened (the prior "
            "N(m(Z_n), K(Z_n, Z_n)) of Meng & Zhang 2024); whiten=True is not available"
        )
    if inducing_inputs is not None:
        raise ValueError(
            f"{caller}: with inducing='amortized' the inducing inputs come from learned "
            "affine maps of the encoder input; inducing_inputs cannot be given"
        )
    if priors:
        raise ValueError(
            f"{caller}: inducing='amortized' is called inside the data plate, where a "
            "hyperparameter prior would become one sample per point; priors are not available"
        )
    check_positive_int(num_inducing, "num_inducing", caller)
    assert num_inducing is not None  # a positive integer, checked
    data_plate = [p for p in active_plates() if p.dim == -1]
    if not data_plate:
        raise ValueError(
            f"{caller}: inducing='amortized' gives every point its own inducing set; call "
            "it inside the data plate: with numpyro.plate('data', N, subsample_size=B): "
            "x = numpyro.subsample(X, event_dim=1); h = gp_layer(..., x, inducing='amortized')"
        )
    X = as_float_array(X, "X", caller)
    B = data_plate[0].subsample_size
    if X.ndim not in (2, 3) or X.shape[-2] != B:
        raise ValueError(
            f"{caller}: X must have shape ({B}, dim) (the plate's {B} points), or "
            f"(num_branches, {B}, dim); got {X.shape}"
        )
    return LayerArgs(X, None, None, False, False, {}, data_plate[0], num_inducing=int(num_inducing))


# ---- the inducing part: inducing inputs, the factor of K(Z, Z), the prior of u ----


def inducing_inputs_site(name: str, args: LayerArgs, learn_inducing: bool) -> jax.Array:
    """The layer's inducing inputs: the propagated locations, or a parameter initialized from the
    given inputs or by k-means on ``X``."""
    if args.propagated_Z is not None:
        return args.propagated_Z
    init: jax.Array | Callable[[jax.Array], jax.Array] | None = args.inducing_inputs
    if init is None:
        init = lambda _: kmeans_inducing_inputs(args.X, args.num_inducing)  # noqa: E731
    Z = numpyro.param(f"{name}.inducing_inputs", init)
    if jnp.ndim(Z) != 2 or jnp.shape(Z)[-1] != args.X.shape[-1]:  # fitted values given to a run
        raise ValueError(
            f"gp_layer {name!r}: its inputs have {args.X.shape[-1]} columns, its inducing_inputs "
            f"have shape {jnp.shape(Z)}: inputs with another number of columns than the layer "
            "was fitted on (for the first layer, X_new must have the training inputs' columns)"
        )
    return Z if learn_inducing else jax.lax.stop_gradient(Z)


def kmeans_inducing_inputs(X: jax.Array, num_inducing: int) -> jax.Array:
    """k-means centers of the rows of ``X`` (leading axes flattened) as inducing inputs.

    A fixed key: the same data give the same inducing inputs in every run of the model (a
    guide's prototype run and SVI's initial run must agree, e.g. for inducing locations). With
    fewer rows than ``num_inducing`` (a minibatch
    smaller than ``M``, which is all a layer sees at initialization) k-means cannot give
    ``M`` distinct centers: :func:`points_and_gaussian_draws` instead."""
    points = jax.lax.stop_gradient(X.reshape(-1, X.shape[-1]))
    if points.shape[0] < num_inducing:
        return points_and_gaussian_draws(points, num_inducing)
    return kmeans(jax.random.PRNGKey(0), points, num_inducing)


def points_and_gaussian_draws(points: jax.Array, num_inducing: int) -> jax.Array:
    """``(M, D)`` inducing inputs from ``n < M`` points: the ``n`` points, then ``M - n`` draws
    (fixed key) from the Gaussian with their mean and covariance.

    The draws cover the region the points span, and with probability one no two inducing
    inputs coincide (``K(Z, Z)`` stays invertible). The covariance gets a ridge of
    :func:`~numpyro_dgp.core.default_jitter` times its mean variance (fewer points than
    dimensions leave it singular, and its round-off in float32 can make it indefinite);
    identical points (or one) give a unit covariance.

    :param points: ``(n, D)``.
    :param num_inducing: ``M > n``.
    :return: ``(M, D)``, the points first.
    """
    n, D = points.shape
    mean = points.mean(0)
    centered = points - mean
    cov = centered.T @ centered / max(n - 1, 1)
    scale = jnp.trace(cov) / D
    identity = jnp.eye(D, dtype=points.dtype)
    ridge = default_jitter(points.dtype) * scale
    cov = jnp.where(scale > 0, cov + ridge * identity, identity)
    eps = jax.random.normal(jax.random.PRNGKey(0), (num_inducing - n, D), points.dtype)
    return jnp.concatenate([points, mean + eps @ jnp.linalg.cholesky(cov).T])


def inducing_factor(
    kernel: Kernel, Z: jax.Array, jitter: float, reads_factor: bool = True
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The jittered Cholesky factor ``L`` of ``K(Z, Z)``, its inverse and the jitter it used.

    ``reads_factor``: the caller's step reads ``L`` as well as ``L^{-1}`` (a non-whitened
    layer's prior, inducing locations), and the two are differentiated together
    (:func:`~numpyro_dgp.core.cholesky_and_inverse`); ``False``: a whitened layer's step reads
    ``L^{-1}`` alone, whose own rule (:func:`~numpyro_dgp.core.inverse_cholesky`) is cheaper."""
    # A failed factorization gives NaN, which fit() detects (skips and counts the step);
    # a lax.cond retry here would triple the compile time of every layer.
    Kmm = kernel(Z)
    # Relative to the prior variance, as for per-point sets: a classifier's output layer grows
    # its kernel variance to ~100, and a fixed 1e-4 then falls below float32 round-off.
    absolute = jitter * mean_diagonal(Kmm)
    jittered = Kmm + absolute * jnp.eye(Kmm.shape[-1], dtype=Kmm.dtype)
    if reads_factor:
        return *cholesky_and_inverse(jittered), absolute
    # L's own rule applies only where a step reads L after all (XLA drops it otherwise)
    return cholesky(jittered), inverse_cholesky(jittered), absolute


def inducing_prior(
    args: LayerArgs, Kmm_chol: jax.Array, prior_mean: jax.Array, out_dim: int
) -> dist.Distribution:
    """``p(u)`` per output: N(mean(Z), K) for locations, else N(0, I) whitened or N(0, K)."""
    if args.locations:
        return dist.MultivariateNormal(prior_mean, scale_tril=Kmm_chol)
    M, dtype = Kmm_chol.shape[-1], args.X.dtype
    zeros, eye = jnp.zeros(M, dtype), jnp.eye(M, dtype=dtype)
    if args.whiten:
        # the standard normal by construction: nothing to validate
        prior = dist.MultivariateNormal(zeros, scale_tril=eye, validate_args=False)
    else:
        prior = dist.MultivariateNormal(zeros, scale_tril=Kmm_chol)
    return prior.expand([out_dim])


def amortized_sets(
    name: str,
    args: LayerArgs,
    kernel: Kernel,
    mean_fn: Callable,
    learn_inducing: bool,
    average_kl: bool,
) -> tuple[jax.Array, jax.Array, jax.Array | None, float | jax.Array, jax.Array, jax.Array]:
    """``gp_layer(..., inducing="amortized")``'s per-point inducing sets (Meng & Zhang 2024):
    ``(Z, the factors of K(Z_n, Z_n), None (no inverse factor: the conditional solves with each
    point's factor), the relative jitter (each set's own variance scales it), the prior means,
    u)``.

    Each point's inducing inputs ``Z (..., B, M, D)`` are ``M`` learned affine maps
    ``z_m = W_m p + b_m`` of its encoder input ``p`` (``W_m = I``, ``b_m ~ N(0, I)`` at the
    start, from a key fixed by the name, so every run of the model starts from the same maps)."""
    X, D, M, jitter = args.X, args.X.shape[-1], args.num_inducing, args.jitter
    weight = numpyro.param(
        f"{name}.inducing_maps.weight",
        lambda _: jnp.broadcast_to(jnp.eye(D, dtype=X.dtype), (M, D, D)),
    )
    bias_key = jax.random.PRNGKey(zlib.crc32(name.encode()))
    bias = numpyro.param(
        f"{name}.inducing_maps.bias", lambda _: jax.random.normal(bias_key, (M, D), X.dtype)
    )
    if not learn_inducing:
        weight, bias = jax.lax.stop_gradient(weight), jax.lax.stop_gradient(bias)
    # the encoder input of a handler's amortization rule: (..., B, D) by construction
    p = jnp.asarray(send_encoder_input(name, X, identity), X.dtype)
    Z = affine_inducing_inputs(weight, bias, p)
    Kzz = jax.vmap(kernel)(Z.reshape(-1, M, D)).reshape(Z.shape[:-1] + (M,))
    # The jitter is relative to each set's prior variance: float32 round-off in K(Z_n, Z_n)
    # grows with the kernel variance (a probit output layer's reaches ~100 on the letters
    # task), and a fixed 1e-4 then loses to it at one point in thousands, NaN-ing the step.
    Kzz_chol = jittered_cholesky(Kzz, jitter * mean_diagonal(Kzz)[..., None, None])
    prior_mean = jnp.swapaxes(mean_fn(Z), -1, -2)  # (..., B, P, M)
    # valid by construction (a failed factorization is NaN, which fit detects); validating it
    # in the set-up run, where the arguments are concrete, compiled ~30 small programs eagerly
    prior = dist.MultivariateNormal(
        prior_mean, scale_tril=Kzz_chol[..., None, :, :], validate_args=False
    ).to_event(1)
    infer = {INDUCING: InducingTag(name, False, "amortized", p)}
    with numpyro.handlers.scale(scale=1.0 / args.data_plate.size if average_kl else 1.0):
        u = numpyro.sample(f"{name}.u", prior, infer=infer)
    if jnp.shape(u) != prior.shape():
        # the placeholder of AutoAmortizedDGP (shaped as at its set-up), replayed at another
        # batch size by an objective that samples the guide on its own (Trace_ELBO, ...)
        raise NotImplementedError(
            f"gp_layer {name!r} (inducing='amortized'): AutoAmortizedDGP's q(u_n | p_n) depends "
            "on the model's layer outputs, so NumPyro's Trace_ELBO, TraceMeanField_ELBO and "
            "Predictive cannot sample the guide on its own; use numpyro_dgp.DGPElbo or "
            "numpyro_dgp.PredictiveObjective to train and numpyro_dgp.predict to predict"
        )
    return Z, Kzz_chol, None, jitter, prior_mean, u


def mean_diagonal(K: jax.Array) -> jax.Array:
    """The mean of the diagonal of ``K`` (per matrix of a batch), kept above the smallest
    normal number so that a relative jitter never becomes zero."""
    mean = jnp.mean(jnp.diagonal(K, axis1=-2, axis2=-1), axis=-1)
    return jnp.maximum(mean, jnp.finfo(K.dtype).tiny)
