"""The ``gp_layer`` primitive: one sparse GP layer of a deep GP, as NumPyro sites.

A call ``gp_layer("h1", X, kernel, num_inducing=50, out_dim=2)`` inside a model

1. registers the kernel hyperparameters (``"h1.kernel.<name>"``; ``numpyro.param`` by
   default, ``numpyro.sample`` for those given a prior), the inducing inputs
   (``"h1.inducing_inputs"``) and any mean-function weights (``"h1.mean.*"``);
2. samples the inducing values as the latent site ``"h1.u"`` of shape ``(out_dim, M)``
   (whitened: prior ``N(0, I)`` per output; otherwise ``N(0, K(Z, Z))``; always the
   residual about the mean function), tagged ``infer={"dgp_layer": "h1", ...}``;
3. emits one message of type ``"dgp_layer"`` named ``"h1.layer"`` whose default handling
   draws the layer's output at ``X`` from ``p(f(X) | u)`` point by point (DSVI propagation);
   handlers (``DGPElbo``'s analytic marginalization, coherent sampling, ...) reinterpret it;
4. records the output as ``numpyro.deterministic("h1", f)`` so ``Predictive`` returns it.

Shapes: ``X (N, D)``; returns ``(N, out_dim)``.

With ``inducing="locations"`` (paper 000 §4.2, notes/compositional.md §4) inducing inputs
exist only in the input space: a layer maps the pair (points, inducing locations) to the pair
(outputs, inducing values), and layer ``l``'s inducing inputs are layer ``l-1``'s inducing
values, so neighboring layers share ``f_{l-1}^z``::

    h, hz = gp_layer("h1", X, k1, num_inducing=20, inducing="locations")
    f, fz = gp_layer("f", (h, hz), k2, inducing="locations")

The u site then holds the inducing values themselves (not a residual) with prior
``N(mean(Z_l), K(Z_l, Z_l) + jitter)``; it is never whitened (whitening against a random
``K(f_{l-1}^z)`` is a different family).

With ``inducing="amortized"`` (paper 003, notes/amortized.md) every point has its own
inducing set: ``M`` inducing inputs ``Z_n = [W_m p_n + b_m]_m`` from learned affine maps of the
layer's *encoder input* ``p_n`` (the layer input by default; an amortization rule of
:class:`numpyro_dgp.guides.AutoAmortizedDGP` may supply another), and values ``u_n`` with
prior ``N(mean(Z_n), K(Z_n, Z_n))`` (plus ``jitter`` times the set's mean prior variance on the
diagonal); the point's output is the GP conditional on its own set.
The layer is called *inside* the data plate (its ``u`` site is local, shape ``(B, P, M)``) and,
by default, the KL is averaged over points as in the paper (the site is scaled by ``1/N`` on
top of the plate's ``N/B``)::

    with numpyro.plate("data", N, subsample_size=100):
        x = numpyro.subsample(X, event_dim=1)
        h = gp_layer("h1", x, Matern52(), num_inducing=8, out_dim=4, inducing="amortized")
"""

from __future__ import annotations

import zlib
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from numpyro_dgp._compat import active_plates, apply_stack, handler_stack_is_empty
from numpyro_dgp._protocol import ENCODER_INPUT_MESSAGE, INDUCING, LAYER_MESSAGE, InducingTag
from numpyro_dgp.core import (
    affine_inducing_inputs,
    check_jitter,
    conditional,
    default_jitter,
    jittered_cholesky,
    kmeans,
    local_conditional,
)
from numpyro_dgp.kernels import Kernel

__all__ = ["gp_layer", "Layer", "MEAN_FUNCTIONS", "layer_moments", "sample_moments"]

MEAN_FUNCTIONS = ("zero", "identity", "linear")
INDUCING_MODES = ("global", "locations", "amortized")


class Layer(NamedTuple):
    """Everything a handler needs to evaluate one GP layer (carried by its message).

    :ivar name: layer name (site prefix).
    :ivar kernel: kernel with its current hyperparameter values.
    :ivar inducing_inputs: ``(M, D)``.
    :ivar Kmm_chol: ``(M, M)`` lower Cholesky factor of ``k(Z, Z) + jitter I`` (computed once).
    :ivar mean_fn: callable ``(N, D) -> (N, out_dim)``.
    :ivar whiten: whether ``"<name>.u"`` is whitened.
    :ivar jitter: diagonal jitter.
    :ivar out_dim: number of outputs ``P``.
    :ivar u_site: name of the inducing-value site.
    :ivar prior_mean: ``(P, M)`` prior mean of the u site (zero unless ``inducing="locations"``,
        where the site holds the inducing values rather than their residual).
    :ivar inducing: ``"global"``, ``"locations"`` or ``"amortized"`` (then ``inducing_inputs``
        is ``(..., B, M, D)``, ``Kmm_chol`` ``(..., B, M, M)`` and ``prior_mean`` ``(..., B, P, M)``:
        one set per point, and per branch when the leading axis is there).
    """

    name: str
    kernel: Kernel
    inducing_inputs: jax.Array
    Kmm_chol: jax.Array
    mean_fn: Callable
    whiten: bool
    jitter: float
    out_dim: int
    u_site: str
    prior_mean: jax.Array | None = None
    inducing: str = "global"


def layer_moments(layer: Layer, X, q_mean, q_sqrt=None, full_cov: bool = False):
    """Mean and (co)variance of the layer's output at ``X`` given ``u ~ N(q_mean, q_sqrt q_sqrt^T)``.

    ``q_sqrt=None`` means ``u = q_mean`` exactly (the conditional ``p(f | u)``).

    :param X: ``(N, D)`` layer inputs.
    :param q_mean: ``(P, M)``.
    :param q_sqrt: ``(P, M, M)``, ``(P, M)`` or ``None``.
    :return: ``mean (N, P)`` and ``var (N, P)`` (or ``cov (P, N, N)`` if ``full_cov``).
    """
    if layer.inducing == "amortized":
        if full_cov:
            raise NotImplementedError(
                f"layer {layer.name!r} has per-point inducing sets (inducing='amortized'): its "
                "outputs are independent across points given the sets, so only marginals exist"
            )
        return amortized_moments(layer, X, q_mean, q_sqrt)
    if X.ndim == 3 and not full_cov:  # a leading branch axis: every branch's points alike
        mean, var = layer_moments(layer, X.reshape(-1, X.shape[-1]), q_mean, q_sqrt)
        return mean.reshape(X.shape[:-1] + mean.shape[-1:]), var.reshape(X.shape[:-1] + var.shape[-1:])
    Z = layer.inducing_inputs
    Kmn = layer.kernel(Z, X)
    Knn = layer.kernel(X) if full_cov else layer.kernel.diag(X)
    if layer.prior_mean is not None:
        q_mean = q_mean - layer.prior_mean
    mean, var = conditional(
        Kmn, layer.Kmm_chol, Knn, q_mean, q_sqrt, whiten=layer.whiten, full_cov=full_cov
    )
    return mean + layer.mean_fn(X), var


def amortized_moments(layer: Layer, X, q_mean, q_sqrt=None):
    """:func:`layer_moments` of a layer with per-point inducing sets.

    ``X`` is ``(B, D)``, or ``(S, B, D)`` with a leading branch axis (paper 003's branches),
    in which case the inducing sets (``layer.inducing_inputs``) and ``q_mean``/``q_sqrt`` are
    either shared by the branches (``(B, ...)``, rules AR2/AR2P) or per branch
    (``(S, B, ...)``, rule AR1).

    :param q_mean: ``(..., B, P, M)``; :param q_sqrt: ``(..., B, P, M, M)``, ``(..., B, P, M)`` or ``None``.
    :return: ``mean``, ``var`` of shape ``X.shape[:-1] + (P,)``.
    """
    q_mean = q_mean - layer.prior_mean

    def base(Z, L, X, m, s):
        mean, var = local_conditional(layer.kernel, Z, L, X, m, s)
        return mean + layer.mean_fn(X), var

    Z, L = layer.inducing_inputs, layer.Kmm_chol
    if X.ndim == 2:
        return base(Z, L, X, q_mean, q_sqrt)
    shared = None if Z.ndim == 3 else 0
    return jax.vmap(base, (shared, shared, 0, shared, shared))(Z, L, X, q_mean, q_sqrt)


def sample_moments(rng_key, mean, var, full_cov: bool = False, jitter: float = 1e-6):
    """One reparameterized draw from the moments returned by :func:`layer_moments`.

    Variances below zero from round-off are clipped; full covariances get ``jitter``.
    """
    if full_cov:
        L = jittered_cholesky(var, jitter)  # (P, N, N)
        eps = jax.random.normal(rng_key, mean.shape[::-1], mean.dtype)  # (P, N)
        return mean + jnp.einsum("pnm,pm->np", L, eps)
    eps = jax.random.normal(rng_key, mean.shape, mean.dtype)
    return mean + jnp.sqrt(jnp.maximum(var, 0.0)) * eps


def _propagate(layer: Layer, X, u, *, rng_key, full_cov: bool = False):
    """Default handling of a ``"dgp_layer"`` message: draw ``f(X) ~ p(f | u)``."""
    mean, var = layer_moments(layer, X, u, None, full_cov)
    return sample_moments(rng_key, mean, var, full_cov, layer.jitter)


def _concrete_bool(x):
    """``bool(x)`` for a concrete array, ``None`` for a traced one (checks run only eagerly)."""
    try:
        return bool(x)
    except jax.errors.ConcretizationTypeError:
        return None


def _check_finite(x, what: str) -> None:
    if _concrete_bool(jnp.all(jnp.isfinite(x))) is False:
        raise ValueError(f"{what} contains NaN or inf values")


def _projection(X, in_dim: int, out_dim: int):
    """DSVI's fixed inner-layer mean ``X @ W``: identity, zero-padding or PCA projection."""
    if in_dim == out_dim:
        return jnp.eye(in_dim, dtype=X.dtype)
    if in_dim < out_dim:
        return jnp.eye(in_dim, out_dim, dtype=X.dtype)  # [I, 0]: pad with zeros
    # top out_dim right singular vectors of the (uncentered) inputs, as in DSVI
    _, _, Vt = jnp.linalg.svd(X, full_matrices=False)
    return Vt[:out_dim].T


def _mean_function(name, mean, X, in_dim, out_dim):
    if callable(mean):
        return mean
    if mean == "zero":
        return lambda A: jnp.zeros(A.shape[:-1] + (out_dim,), A.dtype)
    if mean == "identity":
        if in_dim == out_dim:
            return lambda A: A
        W = numpyro.param(f"{name}.mean.weight", lambda _: _projection(X, in_dim, out_dim))
        W = jax.lax.stop_gradient(W)  # fixed, as in DSVI; stored so predictions reuse it
        return lambda A: A @ W
    if mean == "linear":
        W = numpyro.param(f"{name}.mean.weight", lambda _: _projection(X, in_dim, out_dim))
        b = numpyro.param(f"{name}.mean.bias", jnp.zeros(out_dim, X.dtype))
        return lambda A: A @ W + b
    raise ValueError(
        f"gp_layer {name!r}: mean must be one of {MEAN_FUNCTIONS} or a callable, got {mean!r}"
    )


def _hyperparameters(name, kernel, dtype, priors, learn):
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
        if _concrete_bool(jnp.all(init > 0)) is False:
            raise ValueError(
                f"gp_layer {name!r}: kernel hyperparameter {hp!r} must be positive, got {init}"
            )
        value = numpyro.param(site, init, constraint=constraints.positive)
        values[hp] = value if learn else jax.lax.stop_gradient(value)
    return kernel.replace(**values)


def gp_layer(
    name: str,
    X,
    kernel: Kernel,
    *,
    num_inducing: int | None = None,
    out_dim: int = 1,
    mean="zero",
    inducing_inputs=None,
    learn_inducing: bool = True,
    learn_hyperparameters: bool = True,
    priors: dict | None = None,
    whiten: bool | None = None,
    jitter: float | None = None,
    inducing: str = "global",
    average_kl: bool = True,
):
    """One sparse GP layer ``f: R^D -> R^out_dim`` with inducing points, as NumPyro sites.

    :param name: layer name; prefixes every site (``"<name>.u"``, ``"<name>.kernel.*"``, ...).
    :param X: ``(N, D)`` inputs (the data, or the previous layer's output); with
        ``inducing="locations"`` also the pair ``(X, Z)`` returned by the previous layer.
    :param kernel: a :mod:`numpyro_dgp.kernels` kernel; its values are the initial values.
        One kernel is shared by the ``out_dim`` outputs.
    :param num_inducing: ``M``; inducing inputs are initialized by k-means (seeded with a fixed
        key, so deterministic given the data) on ``X`` (for inner
        layers: on the propagated values at initialization).
    :param out_dim: output width ``P``.
    :param mean: ``"zero"``, ``"identity"`` (fixed ``X @ W``: identity, zero-padding or PCA
        projection when widths differ, as in DSVI), ``"linear"`` (learnable ``X @ W + b``,
        initialized like ``"identity"``) or a callable ``(N, D) -> (N, P)``.
    :param inducing_inputs: ``(M, D)`` initial inducing inputs (instead of k-means).
    :param learn_inducing: optimize the inducing inputs (otherwise they stay fixed).
    :param learn_hyperparameters: optimize kernel hyperparameters without priors.
    :param priors: ``{hyperparameter name: Distribution}``; those become ``numpyro.sample``
        sites (names as in ``kernel.hyperparameters()``).
    :param whiten: whitened inducing values ``u = L v`` (default for ``"global"``, better
        conditioned; not available for ``"locations"``).
    :param jitter: diagonal jitter; default :func:`numpyro_dgp.core.default_jitter` of ``X``'s dtype.
        With ``inducing="amortized"`` it is relative: each point's ``K(Z_n, Z_n)`` gets
        ``jitter`` times its mean diagonal (the kernel variance for stationary kernels).
    :param inducing: ``"global"`` (each layer has its own inducing inputs in its input space)
        or ``"locations"`` (inducing points as inducing locations) or ``"amortized"`` (per-point
        inducing sets, called inside the data plate; see the module docstring).
    :param average_kl: ``"amortized"`` only: scale the per-point KL by ``1/N`` (paper 003's
        weighting, averaged over points; ``False`` sums it, the proper ELBO).
    :return: ``(N, out_dim)`` layer output; with ``"locations"`` the pair
        ``(output (N, out_dim), inducing values (M, out_dim))`` for the next layer.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"gp_layer: name must be a non-empty string, got {name!r}")
    if not isinstance(kernel, Kernel):
        raise TypeError(f"gp_layer {name!r}: kernel must be a numpyro_dgp.kernels.Kernel, got {type(kernel)}")
    if inducing not in INDUCING_MODES:
        raise NotImplementedError(
            f"gp_layer {name!r}: inducing={inducing!r} is not available; supported: {INDUCING_MODES}"
        )
    if inducing == "amortized":
        return _amortized_layer(
            name, X, kernel, num_inducing=num_inducing, out_dim=out_dim, mean=mean,
            inducing_inputs=inducing_inputs, learn_inducing=learn_inducing,
            learn_hyperparameters=learn_hyperparameters, priors=priors, whiten=whiten,
            jitter=jitter, average_kl=average_kl,
        )
    locations = inducing == "locations"
    if whiten is None:
        whiten = not locations
    elif whiten and locations:
        raise ValueError(
            f"gp_layer {name!r}: inducing='locations' does not support whiten=True (whitening "
            "q(f_l^z) against K(f_(l-1)^z) would be a different variational family)"
        )
    propagated_Z = None
    if isinstance(X, (tuple, list)):
        if not locations:
            raise ValueError(
                f"gp_layer {name!r}: X is a pair (points, inducing locations), which only "
                "inducing='locations' takes; pass the points alone"
            )
        if len(X) != 2:
            raise ValueError(f"gp_layer {name!r}: X must be an array or the pair (X, Z); got {len(X)} items")
        X, propagated_Z = X
    if handler_stack_is_empty():
        raise RuntimeError(
            f"gp_layer {name!r} needs a random key: run the model under numpyro.handlers.seed "
            "(SVI, MCMC and Predictive do this)"
        )
    plates = [h.name for h in active_plates()]
    if plates:
        raise ValueError(
            f"gp_layer {name!r} is called inside plate(s) {plates}: its inducing points are global. "
            "Call it outside data plates and subsample the inputs first "
            "(with plate: X_batch = numpyro.subsample(X, event_dim=1))"
        )
    X = jnp.asarray(X)
    if X.ndim == 3 and locations:
        raise ValueError(f"gp_layer {name!r}: inducing='locations' does not take branched inputs (S, N, D)")
    if X.ndim not in (2, 3):
        raise ValueError(
            f"gp_layer {name!r}: X must have shape (num_points, dim), or (num_branches, num_points, "
            f"dim) under numpyro_dgp.handlers.quadrature or an amortized guide; got {X.shape}"
        )
    if not jnp.issubdtype(X.dtype, jnp.floating):
        X = X.astype(jnp.result_type(float))
    _check_finite(X, f"gp_layer {name!r}: X")
    if not (isinstance(out_dim, (int, np.integer)) and out_dim >= 1):
        raise ValueError(f"gp_layer {name!r}: out_dim must be a positive integer, got {out_dim!r}")
    priors = dict(priors or {})
    for hp, prior in priors.items():
        if hp not in kernel.hyperparameters():
            raise ValueError(
                f"gp_layer {name!r}: priors has {hp!r}, not a hyperparameter of "
                f"{type(kernel).__name__} (it has {sorted(kernel.hyperparameters())})"
            )
        if not isinstance(prior, dist.Distribution):
            raise TypeError(f"gp_layer {name!r}: priors[{hp!r}] must be a Distribution")
    jitter = default_jitter(X.dtype) if jitter is None else jitter
    try:
        check_jitter(jitter)
    except ValueError:
        raise ValueError(f"gp_layer {name!r}: jitter must be a finite positive number, got {jitter!r}") from None
    in_dim = X.shape[-1]

    kernel = _hyperparameters(name, kernel.with_input_dim(in_dim), X.dtype, priors, learn_hyperparameters)

    # inducing inputs
    if propagated_Z is not None:
        if inducing_inputs is not None:
            raise ValueError(
                f"gp_layer {name!r}: the inducing locations come with X as (X, Z); do not also "
                "pass inducing_inputs"
            )
        propagated_Z = jnp.asarray(propagated_Z, X.dtype)
        if propagated_Z.ndim != 2 or propagated_Z.shape[1] != in_dim:
            raise ValueError(
                f"gp_layer {name!r}: the inducing locations Z of (X, Z) must have shape "
                f"(M, {in_dim}), got {propagated_Z.shape}"
            )
        if num_inducing is not None and num_inducing != propagated_Z.shape[0]:
            raise ValueError(
                f"gp_layer {name!r}: num_inducing={num_inducing} disagrees with the "
                f"{propagated_Z.shape[0]} inducing locations passed in (X, Z)"
            )
        Z = propagated_Z
    elif inducing_inputs is not None:
        Z0 = jnp.asarray(inducing_inputs, X.dtype)
        if Z0.ndim != 2 or Z0.shape[1] != in_dim:
            raise ValueError(
                f"gp_layer {name!r}: inducing_inputs must have shape (M, {in_dim}), got {Z0.shape}"
            )
        if num_inducing is not None and num_inducing != Z0.shape[0]:
            raise ValueError(
                f"gp_layer {name!r}: num_inducing={num_inducing} disagrees with "
                f"inducing_inputs of shape {Z0.shape}"
            )
        _check_finite(Z0, f"gp_layer {name!r}: inducing_inputs")
        init_Z = Z0
    else:
        if not (isinstance(num_inducing, (int, np.integer)) and num_inducing >= 1):
            raise ValueError(
                f"gp_layer {name!r}: give num_inducing (a positive integer) or inducing_inputs; "
                f"got num_inducing={num_inducing!r}"
            )
        # A fixed key: the same data give the same inducing inputs in every run of the model
        # (a guide's prototype run and SVI's initial run must agree, e.g. for inducing locations).
        init_Z = lambda _: kmeans(jax.random.PRNGKey(0), jax.lax.stop_gradient(X.reshape(-1, in_dim)), int(num_inducing))  # noqa: E731
    if propagated_Z is None:
        Z = numpyro.param(f"{name}.inducing_inputs", init_Z)
        if not learn_inducing:
            Z = jax.lax.stop_gradient(Z)
    M = Z.shape[0]

    mean_fn = _mean_function(name, mean, X.reshape(-1, in_dim), in_dim, out_dim)

    # A failed factorization gives NaN, which fit() detects (skips and counts the step);
    # a lax.cond retry here would triple the compile time of every layer.
    Kmm_chol = jittered_cholesky(kernel(Z), jitter)
    # "locations": the site holds f_l^z itself, prior N(mean(Z_l), K); "global": the residual
    prior_mean = mean_fn(Z).T if locations else jnp.zeros((out_dim, M), X.dtype)
    if whiten:
        prior = dist.MultivariateNormal(jnp.zeros(M, X.dtype), scale_tril=jnp.eye(M, dtype=X.dtype))
    else:
        prior = dist.MultivariateNormal(jnp.zeros(M, X.dtype), scale_tril=Kmm_chol)
    prior = prior.expand([out_dim]) if not locations else dist.MultivariateNormal(prior_mean, scale_tril=Kmm_chol)
    u_site = f"{name}.u"
    u = numpyro.sample(
        u_site,
        prior.to_event(1),
        infer={INDUCING: InducingTag(name, bool(whiten), inducing)},
    )

    # NumPyro draws in the default float type; keep the layer in its inputs' precision
    u = jnp.asarray(u, X.dtype)
    layer = Layer(name, kernel, Z, Kmm_chol, mean_fn, whiten, jitter, out_dim, u_site, prior_mean, inducing)
    out = _emit_layer(layer, X, u)
    if locations:
        return out, u.T
    return out


def _emit_layer(layer: Layer, X, u):
    """Send the layer's ``"dgp_layer"`` message (default: draw ``f(X) | u``) and record the output."""
    rng_key = numpyro.prng_key()
    if rng_key is None:
        raise RuntimeError(
            f"gp_layer {layer.name!r} needs a random key: run the model under numpyro.handlers.seed "
            "(SVI, MCMC and Predictive do this)"
        )
    out = _emit(LAYER_MESSAGE, f"{layer.name}.layer", _propagate, (layer, X, u), rng_key=rng_key, full_cov=False)
    numpyro.deterministic(layer.name, out)
    return out


def _default_encoder_input(X):
    """Without an amortization rule a layer's encoder sees its own input (paper 003's AR1)."""
    return X


def _emit(msg_type, name, fn, args, **kwargs):
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


def _amortized_layer(name, X, kernel, *, num_inducing, out_dim, mean, inducing_inputs, learn_inducing,
                     learn_hyperparameters, priors, whiten, jitter, average_kl):
    """``gp_layer(..., inducing="amortized")``: per-point inducing sets (paper 003)."""
    if whiten:
        raise ValueError(
            f"gp_layer {name!r}: inducing='amortized' is unwhitened (the prior N(m(Z_n), K(Z_n, Z_n)) "
            "of paper 003); whiten=True is not available"
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
    if not (isinstance(num_inducing, (int, np.integer)) and num_inducing >= 1):
        raise ValueError(f"gp_layer {name!r}: num_inducing must be a positive integer, got {num_inducing!r}")
    if not (isinstance(out_dim, (int, np.integer)) and out_dim >= 1):
        raise ValueError(f"gp_layer {name!r}: out_dim must be a positive integer, got {out_dim!r}")
    data_plate = [p for p in active_plates() if p.dim == -1]
    if not data_plate:
        raise ValueError(
            f"gp_layer {name!r}: inducing='amortized' gives every point its own inducing set; call "
            "it inside the data plate: with numpyro.plate('data', N, subsample_size=B): "
            "x = numpyro.subsample(X, event_dim=1); h = gp_layer(..., x, inducing='amortized')"
        )
    data_plate = data_plate[0]
    X = jnp.asarray(X)
    if not jnp.issubdtype(X.dtype, jnp.floating):
        X = X.astype(jnp.result_type(float))
    B = data_plate.subsample_size
    if X.ndim not in (2, 3) or X.shape[-2] != B:
        raise ValueError(
            f"gp_layer {name!r}: X must have shape ({B}, dim) (the plate's {B} points), or "
            f"(num_branches, {B}, dim); got {X.shape}"
        )
    _check_finite(X, f"gp_layer {name!r}: X")
    jitter = default_jitter(X.dtype) if jitter is None else jitter
    try:
        check_jitter(jitter)
    except ValueError:
        raise ValueError(f"gp_layer {name!r}: jitter must be a finite positive number, got {jitter!r}") from None
    D = X.shape[-1]
    M = int(num_inducing)
    kernel = _hyperparameters(name, kernel.with_input_dim(D), X.dtype, {}, learn_hyperparameters)
    flat_X = X.reshape(-1, D)
    mean_fn = _mean_function(name, mean, flat_X, D, out_dim)

    # M affine maps z_m = W_m p + b_m: W_m = I, b_m ~ N(0, I) (a key fixed by the name, so
    # every run of the model starts from the same maps)
    weight = numpyro.param(f"{name}.inducing_maps.weight", lambda _: jnp.broadcast_to(jnp.eye(D, dtype=X.dtype), (M, D, D)))
    bias_key = jax.random.PRNGKey(zlib.crc32(name.encode()))
    bias = numpyro.param(f"{name}.inducing_maps.bias", lambda _: jax.random.normal(bias_key, (M, D), X.dtype))
    if not learn_inducing:
        weight, bias = jax.lax.stop_gradient(weight), jax.lax.stop_gradient(bias)

    p = _emit(ENCODER_INPUT_MESSAGE, f"{name}.encoder_input", _default_encoder_input, (X,))
    p = jnp.asarray(p, X.dtype)
    if p.shape[-2] != B or p.shape[-1] != D or p.ndim not in (2, 3):
        raise ValueError(f"gp_layer {name!r}: the encoder input must have shape (..., {B}, {D}), got {p.shape}")
    Z = affine_inducing_inputs(weight, bias, p)  # (..., B, M, D)
    Kzz = jax.vmap(kernel)(Z.reshape(-1, M, D)).reshape(Z.shape[:-1] + (M,))
    # The jitter is relative to each set's prior variance: float32 round-off in K(Z_n, Z_n)
    # grows with the kernel variance (a probit output layer's reaches ~100 on the letters
    # task), and a fixed 1e-4 then loses to it at one point in thousands, NaN-ing the step.
    prior_variance = jnp.mean(jnp.diagonal(Kzz, axis1=-2, axis2=-1), axis=-1)[..., None, None]
    Kzz_chol = jittered_cholesky(Kzz, jitter * prior_variance)
    prior_mean = jnp.swapaxes(mean_fn(Z), -1, -2)  # (..., B, P, M)
    prior = dist.MultivariateNormal(prior_mean, scale_tril=Kzz_chol[..., None, :, :]).to_event(1)
    u_site = f"{name}.u"
    infer = {INDUCING: InducingTag(name, False, "amortized", p)}
    with numpyro.handlers.scale(scale=1.0 / data_plate.size if average_kl else 1.0):
        u = numpyro.sample(u_site, prior, infer=infer)
    u = jnp.asarray(u, X.dtype)
    layer = Layer(name, kernel, Z, Kzz_chol, mean_fn, False, jitter, out_dim, u_site, prior_mean, "amortized")
    out = _emit_layer(layer, X, u)
    return out
