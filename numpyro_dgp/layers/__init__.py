"""The ``gp_layer`` primitive: one sparse GP layer of a deep GP, as NumPyro sites (and
``latent_input``, a per-point latent concatenated to a layer's input).

A call ``gp_layer("h1", X, kernel, num_inducing=50, out_dim=2)`` inside a model

1. registers the kernel hyperparameters (``"h1.kernel.<name>"``; ``numpyro.param`` by
   default, ``numpyro.sample`` for those given a prior), the inducing inputs
   (``"h1.inducing_inputs"``) and any mean-function weights (``"h1.mean.*"``);
2. samples the inducing values as the latent site ``"h1.u"`` of shape ``(out_dim, M)``
   (whitened: prior ``N(0, I)`` per output; otherwise ``N(0, K(Z, Z))``; always the
   residual about the mean function), tagged with an :class:`~numpyro_dgp._protocol.InducingTag`
   (read it with :func:`numpyro_dgp._protocol.inducing_tag`);
3. emits one layer message (:data:`~numpyro_dgp._protocol.LAYER_MESSAGE`) named ``"h1.layer"``
   whose default handling draws the layer's output at ``X`` from ``p(f(X) | u)`` point by point
   (DSVI propagation); handlers (``DGPElbo``'s analytic marginalization, coherent sampling, ...)
   reinterpret it;
4. records the output as ``numpyro.deterministic("h1", f)`` so ``Predictive`` returns it.

Shapes: ``X (N, D)``; returns ``(N, out_dim)``.

With ``inducing="locations"`` (inducing points as inducing locations, Ustyuzhaninov et al.
2020, Sec. 4.2) inducing inputs exist only in the input space: a layer maps the pair
(points, inducing locations) to the pair (outputs, inducing values), and layer ``l``'s
inducing inputs are layer ``l-1``'s inducing values, so neighboring layers share
``f_{l-1}^z``::

    h, hz = gp_layer("h1", X, k1, num_inducing=20, inducing="locations")
    f, fz = gp_layer("f", (h, hz), k2, inducing="locations")

The u site then holds the inducing values themselves (not a residual) with prior
``N(mean(Z_l), K(Z_l, Z_l) + jitter I)``; it is never whitened (whitening against a random
``K(f_{l-1}^z)`` is a different family).

With ``inducing="amortized"`` (Meng & Zhang 2024) every point has its own inducing set:
``M`` inducing inputs ``Z_n = [W_m p_n + b_m]_m`` from learned affine maps of the layer's
*encoder input* ``p_n`` (the layer input by default; an amortization rule of
:class:`numpyro_dgp.guides.AutoAmortizedDGP` may supply another), and values ``u_n`` with
prior ``N(mean(Z_n), K(Z_n, Z_n))`` (plus ``jitter`` times the set's mean prior variance on the
diagonal); the point's output is the GP conditional on its own set.
The layer is called *inside* the data plate (its ``u`` site is local, shape ``(B, P, M)``) and,
by default, the KL is averaged over points as in Meng & Zhang (2024) (the site is scaled by
``1/N`` on top of the plate's ``N/B``)::

    with numpyro.plate("data", N, subsample_size=100):
        x = numpyro.subsample(X, event_dim=1)
        h = gp_layer("h1", x, Matern52(), num_inducing=8, out_dim=4, inducing="amortized")

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike

from numpyro_dgp._compat import active_plates
from numpyro_dgp._protocol import INDUCING, InducingTag, LayerCall, send_latent, send_layer
from numpyro_dgp._validation import MEAN_FUNCTIONS, as_float_array, check_positive_int
from numpyro_dgp.core import (
    conditional,
    default_jitter,
    jittered_cholesky,
    local_conditional,
    standard_normal,
)
from numpyro_dgp.kernels import Kernel
from numpyro_dgp.layers._parts import (
    amortized_sets,
    check_layer_args,
    hyperparameter_sites,
    inducing_factor,
    inducing_inputs_site,
    inducing_prior,
    mean_function,
    mean_projection,
    missing_key,
    noise_variance,
)

__all__ = [
    "gp_layer",
    "Layer",
    "MEAN_FUNCTIONS",
    "layer_moments",
    "mean_projection",
    "sample_moments",
]


class Layer(NamedTuple):
    """Everything a handler needs to evaluate one GP layer (carried by its message).

    :ivar name: layer name (site prefix).
    :ivar kernel: kernel with its current hyperparameter values.
    :ivar inducing_inputs: ``(M, D)``.
    :ivar Kmm_chol: ``(M, M)`` lower Cholesky factor of ``k(Z, Z) + jitter I`` (computed once).
    :ivar mean_fn: callable ``(N, D) -> (N, out_dim)``.
    :ivar whiten: whether ``"<name>.u"`` is whitened.
    :ivar jitter: the diagonal jitter added to ``k(Z, Z)``: ``gp_layer``'s (relative) jitter times
        the mean of its diagonal (with ``inducing="amortized"``, the relative jitter itself).
    :ivar out_dim: number of outputs ``P``.
    :ivar u_site: name of the inducing-value site.
    :ivar prior_mean: ``(P, M)`` prior mean of the u site (zero unless ``inducing="locations"``,
        where the site holds the inducing values rather than their residual).
    :ivar inducing: ``"global"``, ``"locations"`` or ``"amortized"`` (then ``inducing_inputs``
        is ``(..., B, M, D)``, ``Kmm_chol`` ``(..., B, M, M)`` and ``prior_mean``
        ``(..., B, P, M)``: one set per point, and per branch when the leading axis is there).
    :ivar noise: the variance of the Gaussian noise added to the layer's output
        (``gp_layer(..., noise=...)``), or ``None`` (a noiseless layer).
    :ivar mean_affine: ``(W (D, P), b (P,))`` of a named mean function (``"identity"``,
        ``"linear"``: ``mean_fn(X) = X @ W + b``), ``(None, None)`` for ``"zero"``, ``None`` for
        a callable.
    :ivar Kmm_chol_inv: ``(M, M)`` ``Kmm_chol^{-1}``, built beside ``Kmm_chol`` by the
        factorization (never by inverting ``Kmm_chol``) for a layer with shared inducing
        inputs: differentiated by :func:`~numpyro_dgp.core.inverse_cholesky`'s rule for a
        whitened layer, whose step reads it alone (3 products of the factors where inverting
        ``Kmm_chol`` costs 5), else together with ``Kmm_chol``
        (:func:`~numpyro_dgp.core.cholesky_and_inverse`: 4 products where the two rules take
        6). ``None`` for a layer built without it (then the conditional inverts
        ``Kmm_chol``). The conditional, the correlated guides' projection, the KL of a
        non-whitened prior, the collapsed bound and the nested bound's moments use it;
        deterministic predictions and the collapsed posterior invert ``Kmm_chol``.
    """

    name: str
    kernel: Kernel
    inducing_inputs: jax.Array
    Kmm_chol: jax.Array
    mean_fn: Callable
    whiten: bool
    jitter: float | jax.Array
    out_dim: int
    u_site: str
    prior_mean: jax.Array | None = None
    inducing: str = "global"
    noise: jax.Array | None = None
    mean_affine: tuple[jax.Array, jax.Array] | tuple[None, None] | None = None
    Kmm_chol_inv: jax.Array | None = None


def layer_moments(
    layer: Layer,
    X: ArrayLike,
    q_mean: ArrayLike,
    q_sqrt: ArrayLike | None = None,
    full_cov: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Mean and (co)variance of the layer's output at ``X`` given
    ``u ~ N(q_mean, q_sqrt q_sqrt^T)``.

    ``q_sqrt=None`` means ``u = q_mean`` exactly (the conditional ``p(f | u)``). A layer with
    noise (``gp_layer(..., noise=...)``) outputs ``f(X) + eps``: its noise variance is added to
    the variances (to the diagonal of the covariances).

    :param layer: the layer (from its layer message).
    :param X: ``(N, D)`` layer inputs, or ``(S, N, D)`` with a leading branch axis (marginals
        only).
    :param q_mean: ``(P, M)`` (per-point inducing sets: ``(..., B, P, M)``, one set per point).
    :param q_sqrt: ``(P, M, M)`` lower factors, ``(P, M)`` standard deviations or ``None``.
    :param full_cov: return the covariance over the points instead of marginal variances.
    :return: ``(mean (N, P), var (N, P))``, or ``(mean (N, P), cov (P, N, N))`` if ``full_cov``.
    :raises NotImplementedError: for ``full_cov`` on a layer with per-point inducing sets.
    """
    # arrays are kept as they are (moment propagation tells a layer's input by its identity)
    X, q_mean = (a if isinstance(a, jax.Array) else jnp.asarray(a) for a in (X, q_mean))
    q_sqrt = q_sqrt if q_sqrt is None or isinstance(q_sqrt, jax.Array) else jnp.asarray(q_sqrt)
    mean, var = _noiseless_moments(layer, X, q_mean, q_sqrt, full_cov)
    if layer.noise is None:
        return mean, var
    if full_cov:
        return mean, var + layer.noise * jnp.eye(var.shape[-1], dtype=var.dtype)
    return mean, var + layer.noise


def _noiseless_moments(
    layer: Layer, X: jax.Array, q_mean: jax.Array, q_sqrt: jax.Array | None, full_cov: bool
) -> tuple[jax.Array, jax.Array]:
    """:func:`layer_moments` of the GP ``f`` itself (the layer's noise not added).

    A layer with per-point inducing sets (``inducing="amortized"``) takes ``X`` ``(B, D)``, or
    ``(S, B, D)`` with a leading branch axis (the branches of Meng & Zhang 2024), in which case
    the inducing sets (``layer.inducing_inputs``) and ``q_mean``/``q_sqrt`` are either shared by
    the branches (``(B, ...)``, rules AR2/AR2P) or per branch (``(S, B, ...)``, rule AR1):
    ``q_mean`` ``(..., B, P, M)``, ``q_sqrt`` ``(..., B, P, M, M)`` lower factors, ``(..., B, P,
    M)`` standard deviations or ``None``; the moments are ``X.shape[:-1] + (P,)``.
    """
    if layer.inducing == "amortized" and full_cov:
        raise NotImplementedError(
            f"layer {layer.name!r} has per-point inducing sets (inducing='amortized'): its "
            "outputs are independent across points given the sets, so only marginals exist"
        )
    if layer.inducing == "amortized":
        assert layer.prior_mean is not None  # an amortized layer always has its sets' prior means
        q_mean = q_mean - layer.prior_mean

        def base(Z, L, X, m, s):
            mean, var = local_conditional(layer.kernel, Z, L, X, m, s)
            return mean + layer.mean_fn(X), var

        Z, L = layer.inducing_inputs, layer.Kmm_chol
        if X.ndim == 2:
            return base(Z, L, X, q_mean, q_sqrt)
        shared = None if Z.ndim == 3 else 0
        return jax.vmap(base, (shared, shared, 0, shared, shared))(Z, L, X, q_mean, q_sqrt)
    if X.ndim == 3 and not full_cov:  # a leading branch axis: every branch's points alike
        mean, var = _noiseless_moments(layer, X.reshape(-1, X.shape[-1]), q_mean, q_sqrt, False)
        shape = X.shape[:-1] + (-1,)  # (S, N, P)
        return mean.reshape(shape), var.reshape(shape)
    Z = layer.inducing_inputs
    Kmn = layer.kernel(Z, X)
    Knn = layer.kernel(X) if full_cov else layer.kernel.diag(X)
    if layer.prior_mean is not None:
        q_mean = q_mean - layer.prior_mean
    mean, var = conditional(
        Kmn,
        layer.Kmm_chol,
        Knn,
        q_mean,
        q_sqrt,
        whiten=layer.whiten,
        full_cov=full_cov,
        Kmm_chol_inv=layer.Kmm_chol_inv,
    )
    return mean + layer.mean_fn(X), var


def sample_moments(
    rng_key: jax.Array,
    mean: ArrayLike,
    var: ArrayLike,
    full_cov: bool = False,
    jitter: float | jax.Array | None = None,
) -> jax.Array:
    """One reparameterized draw from the moments returned by :func:`layer_moments`.

    Variances below zero from round-off are clipped; full covariances get ``jitter``.

    :param rng_key: PRNG key of the draw.
    :param mean: ``(N, P)`` means.
    :param var: ``(N, P)`` variances, or ``(P, N, N)`` covariances if ``full_cov``.
    :param full_cov: whether ``var`` holds covariances over the points.
    :param jitter: diagonal jitter of the covariances (``full_cov`` only); default
        :func:`~numpyro_dgp.core.default_jitter` of the dtype.
    :return: ``(N, P)`` draw.
    """
    mean = jnp.asarray(mean)
    if full_cov:
        jitter = default_jitter(jnp.result_type(var)) if jitter is None else jitter
        L = jittered_cholesky(var, jitter)  # (P, N, N)
        eps = standard_normal(rng_key, mean.shape[::-1], mean.dtype)  # (P, N)
        return mean + jnp.einsum("pnm,pm->np", L, eps)
    eps = standard_normal(rng_key, mean.shape, mean.dtype)
    return mean + jnp.sqrt(jnp.maximum(jnp.asarray(var), 0.0)) * eps


def _propagate(
    layer: Layer, X: jax.Array, u: jax.Array, *, rng_key: jax.Array, full_cov: bool = False
) -> jax.Array:
    """Default handling of a layer message: draw ``f(X) ~ p(f | u)``."""
    mean, var = layer_moments(layer, X, u, None, full_cov)
    return sample_moments(rng_key, mean, var, full_cov, layer.jitter)


def gp_layer(
    name: str,
    X: ArrayLike | tuple[ArrayLike, ArrayLike],
    kernel: Kernel,
    *,
    num_inducing: int | None = None,
    out_dim: int = 1,
    mean: str | Callable = "zero",
    inducing_inputs: ArrayLike | None = None,
    learn_inducing: bool = True,
    learn_hyperparameters: bool = True,
    priors: dict[str, dist.Distribution] | None = None,
    whiten: bool | None = None,
    jitter: float | None = None,
    inducing: str = "global",
    average_kl: bool = True,
    noise: float | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """One sparse GP layer ``f: R^D -> R^out_dim`` with inducing points, as NumPyro sites.

    :param name: layer name; prefixes every site (``"<name>.u"``, ``"<name>.kernel.*"``, ...).
    :param X: ``(N, D)`` inputs (the data, or the previous layer's output); with
        ``inducing="locations"`` also the pair ``(X, Z)`` returned by the previous layer.
    :param kernel: a :mod:`numpyro_dgp.kernels` kernel; its values are the initial values.
        One kernel is shared by the ``out_dim`` outputs.
    :param num_inducing: ``M``; inducing inputs are initialized by k-means (seeded with a fixed
        key, so deterministic given the data) on ``X`` (for inner
        layers: on the propagated values at initialization). With fewer points than ``M``
        (a minibatch smaller than ``M``), by the points and ``M - n`` draws (fixed key) from
        the Gaussian with their mean and covariance.
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
    :param jitter: diagonal jitter relative to the prior variance: ``K(Z, Z)`` gets ``jitter``
        times its mean diagonal (the kernel variance for stationary kernels; with
        ``inducing="amortized"``, each point's ``K(Z_n, Z_n)`` its own); default
        :func:`numpyro_dgp.core.default_jitter` of ``X``'s dtype.
    :param inducing: ``"global"`` (each layer has its own inducing inputs in its input space)
        or ``"locations"`` (inducing points as inducing locations) or ``"amortized"`` (per-point
        inducing sets, called inside the data plate; see the module docstring).
    :param average_kl: ``"amortized"`` only: scale the per-point KL by ``1/N`` (the weighting
        of Meng & Zhang 2024, averaged over points; ``False`` sums it, the proper ELBO).
    :param noise: initial variance of a learned Gaussian noise added to the layer's output,
        ``h = f(X) + eps`` with ``eps ~ N(0, noise I)`` (the ``numpyro.param``
        ``"<name>.noise"``, positive); ``None`` (default): a noiseless layer. Nested variational
        compression (:class:`~numpyro_dgp.objectives.NestedCompressionElbo`) needs it on every
        layer but the last; the other objectives, ``predict`` and the MCMC handlers propagate
        it (see :func:`layer_moments`).
    :return: ``(N, out_dim)`` layer output; with ``"locations"`` the pair
        ``(output (N, out_dim), inducing values (M, out_dim))`` for the next layer.
    :raises ValueError: for invalid arguments (shapes, non-finite inputs, a layer inside a
        data plate, ...).
    :raises TypeError: if ``kernel`` is not a :class:`~numpyro_dgp.kernels.Kernel` or a prior
        is not a ``Distribution``.
    :raises RuntimeError: if the model does not run under a ``seed`` handler.
    """
    args = check_layer_args(
        name, X, kernel, num_inducing, out_dim, priors, whiten, jitter, inducing, inducing_inputs
    )
    X, in_dim = args.X, args.X.shape[-1]
    kernel = hyperparameter_sites(name, kernel.with_input_dim(in_dim), args, learn_hyperparameters)
    # the parameters' initial values ignore the keys they are given: the order of these sites
    # leaves every draw as it is
    mean_fn, mean_affine = mean_function(name, mean, X.reshape(-1, in_dim), in_dim, out_dim)
    noise_var = noise_variance(name, noise, X.dtype)
    if inducing == "amortized":
        Z, Kmm_chol, Kmm_chol_inv, layer_jitter, prior_mean, u = amortized_sets(
            name, args, kernel, mean_fn, learn_inducing, average_kl
        )
    else:
        Z = inducing_inputs_site(name, args, learn_inducing)
        # a whitened layer's step reads L^{-1} alone; elsewhere the prior reads L as well
        reads_factor = args.locations or not args.whiten
        Kmm_chol, Kmm_chol_inv, layer_jitter = inducing_factor(
            kernel, Z, float(args.jitter), reads_factor
        )
        # "locations": the site holds f_l^z itself, prior N(mean(Z_l), K); "global": the residual
        prior_mean = mean_fn(Z).T if args.locations else jnp.zeros((out_dim, Z.shape[0]), X.dtype)
        u = numpyro.sample(
            f"{name}.u",
            inducing_prior(args, Kmm_chol, prior_mean, out_dim).to_event(1),
            infer={INDUCING: InducingTag(name, args.whiten, inducing)},
        )
    # NumPyro draws in the default float type; keep the layer in its inputs' precision
    u = jnp.asarray(u, X.dtype)
    layer = Layer(
        name,
        kernel,
        Z,
        Kmm_chol,
        mean_fn,
        args.whiten,
        layer_jitter,
        out_dim,
        f"{name}.u",
        prior_mean,
        inducing,
        noise_var,
        mean_affine,
        Kmm_chol_inv,
    )
    rng_key = numpyro.prng_key()
    if rng_key is None:
        raise missing_key(f"gp_layer {name!r}")
    # the layer's message (default: draw f(X) | u), then its output recorded
    out = send_layer(LayerCall(layer, X, u), rng_key, _propagate)
    numpyro.deterministic(name, out)
    return (out, u.T) if args.locations else out


class LatentSpec(NamedTuple):
    """A latent input as its :data:`~numpyro_dgp._protocol.LATENT_MESSAGE` carries it.

    :ivar name: the latent sample site.
    :ivar latent_dim: ``Q``, the latent dimensions per point.
    :ivar encoder_input: ``(B, E)`` what an amortized guide's encoder sees.
    """

    name: str
    latent_dim: int
    encoder_input: jax.Array


def latent_input(
    name: str, X: ArrayLike, latent_dim: int = 1, *, encoder_input: ArrayLike | None = None
) -> jax.Array:
    """Concatenate a latent ``w_n ~ N(0, I_Q)`` to every point's input: ``[x_n, w_n]``.

    A layer that sees ``[x_n, w_n]`` can represent conditional densities a GP alone cannot
    (several modes, input-dependent noise of any shape): the latent-variable layer of Salimbeni,
    Dutordoir, Hensman & Deisenroth (2019, ICML: deep Gaussian processes with
    importance-weighted variational inference) and GPflux's ``LatentVariableLayer``::

        with numpyro.plate("data", N):
            h = latent_input("w", X, latent_dim=1)          # (N, D + 1)
        f = gp_layer("f", h, RBF(), num_inducing=50)

    The library's guides give each point's ``q(w_n)``: free parameters per point, or an encoder
    of ``encoder_input`` (default ``X``; pass ``[x_n, y_n]`` to let the targets inform it, as in
    the paper). :class:`~numpyro_dgp.DGPElbo` takes the KL of ``q(w_n)`` in closed form;
    :class:`~numpyro_dgp.ImportanceWeightedElbo` draws ``K`` latents per point and
    importance-weights them; :func:`~numpyro_dgp.predict` draws the latents of new points from
    their prior, so the predictive is a mixture over them (multimodal where the data are).

    Call it inside the data plate (``w`` is local: one per point, subsampled with the points);
    the sample site ``name`` holds ``w`` (``(B, Q)``).

    :param name: the latent site's name.
    :param X: ``(B, D)`` the points' inputs (the plate's ``B`` points).
    :param latent_dim: ``Q``.
    :param encoder_input: ``(B, E)`` what an amortized guide's encoder maps to ``q(w_n)``
        (default ``X``; e.g. ``jnp.concatenate([X, y[:, None]], -1)`` when ``y`` is given).
    :return: ``(B, D + Q)``; with ``K`` importance draws of ``w`` (an objective's),
        ``(K, B, D + Q)``.
    :raises ValueError: outside a data plate, or inputs of another shape than the plate's.
    :raises RuntimeError: without a random key (the model must run under ``seed``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"latent_input: name must be a non-empty string, got {name!r}")
    caller = f"latent_input {name!r}"
    check_positive_int(latent_dim, "latent_dim", caller)
    plates = [p for p in active_plates() if p.dim == -1]
    if not plates:
        raise ValueError(
            f"{caller}: w is one latent per point; call it inside the data plate "
            "(with numpyro.plate('data', N): h = latent_input(...))"
        )
    B = plates[0].subsample_size
    X = as_float_array(X, "X", caller)
    encoder_input = (
        X if encoder_input is None else as_float_array(encoder_input, "encoder_input", caller)
    )
    for what, value, columns in (("X", X, "dim"), ("encoder_input", encoder_input, "features")):
        if value.ndim != 2 or value.shape[0] != B:
            raise ValueError(
                f"{caller}: {what} must have shape ({B}, {columns}), the plate's {B} points; "
                f"got {value.shape}"
            )
    rng_key = numpyro.prng_key()
    if rng_key is None:
        raise missing_key(caller)
    send_latent(LatentSpec(name, int(latent_dim), encoder_input), rng_key)
    prior = dist.Normal(jnp.zeros((B, int(latent_dim)), X.dtype), 1.0).to_event(1)
    w = jnp.asarray(numpyro.sample(name, prior), X.dtype)
    return jnp.concatenate([jnp.broadcast_to(X, w.shape[:-1] + X.shape[-1:]), w], axis=-1)
