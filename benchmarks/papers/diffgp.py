"""DiffGP on the UCI regression splits (Hegde et al. 2019): the drivers behind its benchmark.

**References:**

* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian
  process flows. AISTATS.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from numpyro_dgp.kernels import RBF
from numpyro_dgp.models import diffgp
from numpyro_dgp.recipes import Fitted, RunResult, fit_factorized, run_on_uci

__all__ = ["fit_diffgp", "run_diffgp_uci"]


def _check_diffgp_options(init: str, pretrain_steps: int) -> None:
    """Raise unless ``init`` is ``"default"`` or ``"released"`` and ``pretrain_steps`` a
    non-negative integer.

    :raises ValueError: otherwise.
    """
    if init not in ("default", "released"):
        raise ValueError(f"fit_diffgp: init must be 'default' or 'released', got {init!r}")
    if not (isinstance(pretrain_steps, (int, np.integer)) and pretrain_steps >= 0):
        raise ValueError(
            f"fit_diffgp: pretrain_steps must be a non-negative integer, got {pretrain_steps!r}"
        )


def fit_diffgp(
    rng_key: jax.Array,
    X: jax.Array,
    y: jax.Array,
    *,
    T: float = 1.0,
    num_flow_steps: int = 20,
    num_inducing: int = 100,
    num_steps: int = 3000,
    batch_size: int | None = None,
    learning_rate: float = 0.01,
    num_particles: int = 4,
    progress_bar: bool = False,
    chunk_size: int = 500,
    noise_init: float = 0.01,
    estimator: str = "marginal",
    init: str = "default",
    pretrain_steps: int = 0,
) -> Fitted:
    """Fit a DiffGP (:func:`numpyro_dgp.models.diffgp`, ``AutoFactorizedDGP`` + ``DGPElbo`` + Adam).

    :param rng_key: PRNG key.
    :param X: ``(N, D)`` training inputs.
    :param y: ``(N,)`` training targets.
    :param T: flow time.
    :param num_flow_steps: Euler–Maruyama steps of the flow.
    :param num_inducing: ``M`` of the flow and of the predictor.
    :param num_steps: optimization steps.
    :param batch_size: minibatch size (``None``: full batch).
    :param learning_rate: Adam's step size.
    :param num_particles: Monte Carlo samples of the flow per step.
    :param progress_bar: show a progress bar.
    :param chunk_size: steps per compiled chunk.
    :param noise_init: initial Gaussian noise variance.
    :param estimator: ``"marginal"`` or ``"ancestral"`` (see
        :class:`~numpyro_dgp.handlers.sde_flow`).
    :param init: ``"default"`` (:func:`~numpyro_dgp.models.diffgp`'s initial values: unit
        lengthscales, zero inducing means, noise ``noise_init``) or ``"released"`` (the
        released DiffGP code's: lengthscales ``D`` for both kernels, noise variance 1,
        whitened inducing means of flow and predictor drawn from N(0, 1)).
    :param pretrain_steps: first fit the predictor alone as an SVGP (``T = 0``) for this many
        steps and start the flow model from its predictor and noise (the pre-training of
        Hegde et al.; the flow keeps its own initial values).
    :return: ``(model, guide, FitResult)``; ``FitResult`` of the flow model (the
        pre-training is not counted in its timings).
    """
    _check_diffgp_options(init, pretrain_steps)
    D = X.shape[-1]
    options: dict[str, Any] = {"num_inducing": num_inducing, "noise_init": noise_init}
    if init == "released":
        options.update(
            noise_init=1.0,
            flow_kernel=RBF(variance=0.01, lengthscale=float(D)),
            kernel=RBF(lengthscale=float(D)),
        )
    # the flow model's own fit keeps rng_key, so that the default run is unchanged by these options
    pretrain_key, means_key = jax.random.fold_in(rng_key, 1), jax.random.fold_in(rng_key, 2)
    init_params = {}
    if init == "released":  # whitened inducing means, shape (out_dim, M)
        for i, (site, width) in enumerate((("flow.u_auto_loc", D), ("g.u_auto_loc", 1))):
            init_params[site] = jax.random.normal(
                jax.random.fold_in(means_key, i), (width, num_inducing), X.dtype
            )
    if pretrain_steps:
        _, _, pre = fit_factorized(
            diffgp(0.0, **options),
            pretrain_key,
            X,
            y,
            num_steps=int(pretrain_steps),
            batch_size=batch_size,
            learning_rate=learning_rate,
            progress_bar=progress_bar,
            chunk_size=chunk_size,
        )
        init_params.update(
            {k: v for k, v in pre.params.items() if k == "noise" or k.startswith("g.")}
        )

    model = diffgp(T, num_steps=num_flow_steps, estimator=estimator, **options)
    return fit_factorized(
        model,
        rng_key,
        X,
        y,
        num_steps=num_steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        num_particles=num_particles,
        progress_bar=progress_bar,
        chunk_size=chunk_size,
        init_params=init_params or None,
    )


def run_diffgp_uci(
    name: os.PathLike | str,
    split: int = 0,
    *,
    T: float = 1.0,
    rng_key: jax.Array | None = None,
    data_dir: os.PathLike | str | None = None,
    num_flow_steps: int = 20,
    num_inducing: int = 100,
    num_steps: int = 3000,
    batch_size: int = 10000,
    learning_rate: float = 0.01,
    num_particles: int = 4,
    num_test_samples: int = 50,
    progress_bar: bool = False,
    init: str = "default",
    pretrain_steps: int = 0,
) -> RunResult:
    """DiffGP on one UCI split (the released code's settings by default: full batch up to
    10000 points, 4 training samples, 50 test samples); metrics in original target units.

    :param name: data set name under ``data_dir``, or a path to a folder in the standard
        split layout (see :func:`~numpyro_dgp.datasets.load_uci`).
    :param split: split index.
    :param T: flow time.
    :param rng_key: PRNG key (default ``PRNGKey(split)``).
    :param data_dir: folder holding the data sets.
    :param num_flow_steps: Euler–Maruyama steps of the flow.
    :param num_inducing: ``M`` of the flow and of the predictor (at most the number of
        training points).
    :param num_steps: optimization steps.
    :param batch_size: minibatch size (full batch when the training set is smaller).
    :param learning_rate: Adam's step size.
    :param num_particles: Monte Carlo samples of the flow per training step.
    :param num_test_samples: mixture components of the prediction.
    :param progress_bar: show a progress bar.
    :param init: initial values, see :func:`fit_diffgp`.
    :param pretrain_steps: SVGP pre-training steps, see :func:`fit_diffgp`.
    :return: :class:`~numpyro_dgp.recipes.RunResult`.
    """

    def fit_fn(fit_key, X, y):
        return fit_diffgp(
            fit_key,
            X,
            y,
            T=T,
            num_flow_steps=num_flow_steps,
            num_inducing=min(num_inducing, X.shape[0]),
            num_steps=num_steps,
            batch_size=batch_size if batch_size < X.shape[0] else None,
            learning_rate=learning_rate,
            num_particles=num_particles,
            progress_bar=progress_bar,
            init=init,
            pretrain_steps=pretrain_steps,
        )

    return run_on_uci(name, split, rng_key, data_dir, num_test_samples, fit_fn)
