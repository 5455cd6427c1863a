"""Ready-made DGP models (plain NumPyro programs built from :func:`gp_layer`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from numpyro_dgp.kernels import RBF, Kernel
from numpyro_dgp.layers import gp_layer

__all__ = ["deep_gp_regression"]


def deep_gp_regression(
    num_layers: int = 2,
    *,
    num_inducing: int = 100,
    hidden_width: int | None = None,
    kernel: Kernel | None = None,
    noise_init: float = 0.01,
    inner_mean: str = "identity",
    whiten: bool = True,
    jitter: float | None = None,
):
    """The DSVI regression DGP (Salimbeni & Deisenroth 2017) as a NumPyro model.

    Layers ``h1 .. h{L}``: inner layers of width ``hidden_width`` (default: the input
    dimension) with an ``inner_mean`` mean function, a last layer of width 1 with zero mean,
    then ``y ~ N(f, noise)``.

    The returned ``model(X, y=None, batch_size=None)`` subsamples ``batch_size`` points per
    call when given (minibatch SVI; the likelihood is rescaled by the plate).

    :param num_layers: ``L >= 1`` (``L = 1`` is an SVGP).
    :param num_inducing: ``M`` per layer (k-means initialised).
    :param hidden_width: inner-layer width.
    :param kernel: kernel of every layer (initial values; default ARD RBF).
    :param noise_init: initial Gaussian noise variance.
    :param inner_mean: mean function of inner layers (see :func:`gp_layer`).
    :param whiten: whitened inducing values.
    :param jitter: Cholesky jitter (default by dtype).
    """
    if not (isinstance(num_layers, int) and num_layers >= 1):
        raise ValueError(f"deep_gp_regression: num_layers must be a positive integer, got {num_layers!r}")
    if not noise_init > 0:
        raise ValueError(f"deep_gp_regression: noise_init must be positive, got {noise_init!r}")
    kernel = RBF() if kernel is None else kernel

    def model(X, y=None, batch_size=None):
        N, D = X.shape
        if y is not None and y.shape != (N,):
            raise ValueError(f"model: y must have shape ({N},) to match X {X.shape}, got {y.shape}")
        data = numpyro.plate("data", N, subsample_size=batch_size if batch_size and batch_size < N else None)
        with data:
            X_batch = numpyro.subsample(X, event_dim=1)
            y_batch = None if y is None else numpyro.subsample(y, event_dim=0)
        h = X_batch
        width = D if hidden_width is None else hidden_width
        for layer in range(1, num_layers + 1):
            last = layer == num_layers
            h = gp_layer(
                f"h{layer}",
                h,
                kernel,
                num_inducing=num_inducing,
                out_dim=1 if last else width,
                mean="zero" if last else inner_mean,
                whiten=whiten,
                jitter=jitter,
            )
        noise = numpyro.param("noise", jnp.asarray(noise_init, X.dtype), constraint=constraints.positive)
        with data:
            numpyro.sample("y", dist.Normal(h[..., 0], jnp.sqrt(noise)), obs=y_batch)

    return model
