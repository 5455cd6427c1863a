"""Ready-made end-to-end runs: fit a DSVI DGP, score it on a UCI split, the demo.

These are the recipes behind the ``numpyro-dgp`` command line; each is a few calls of the
public API (:func:`~numpyro_dgp.models.deep_gp_regression`,
:class:`~numpyro_dgp.guides.AutoFactorizedDGP`, :class:`~numpyro_dgp.DGPElbo`,
:func:`~numpyro_dgp.fit`, :func:`~numpyro_dgp.predict`, :func:`~numpyro_dgp.metrics`) and is
meant to be read as an example as much as called.

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.typing import ArrayLike
from numpyro.infer import SVI

from numpyro_dgp._predict.metrics import metrics
from numpyro_dgp._predict.prediction import predict, sample_layers
from numpyro_dgp.datasets import Dataset, UCISplit, load_uci, step_function
from numpyro_dgp.guides import AutoFactorizedDGP
from numpyro_dgp.infer import FitResult, fit
from numpyro_dgp.models import deep_gp_regression
from numpyro_dgp.objectives import DGPElbo

__all__ = [
    "RunResult",
    "fit_dsvi",
    "fit_factorized",
    "mean_and_standard_error",
    "plot_demo",
    "run_demo",
    "run_on_uci",
    "run_uci",
]


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (``ddof=1``; NaN for one value) as Python floats.

    :param values: one number per run (e.g. per split).
    :return: ``(mean, standard_error)``.
    """
    v = np.asarray(values, float)
    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return float(v.mean()), float(se)


class RunResult(NamedTuple):
    """Outcome of one fitted and scored model.

    :ivar metrics: test ``{"log_likelihood", "rmse", "crps"}`` (original units for UCI).
    :ivar final_elbo: ``-loss`` averaged over the last 100 steps (standardized units).
    :ivar seconds_per_step: steady training time per step (compile excluded).
    :ivar compile_seconds: compilation of the training chunk (``FitResult.compile_seconds``).
    :ivar total_seconds: fit + predict wall time.
    :ivar num_skipped: non-finite updates skipped.
    :ivar model: the fitted model.
    :ivar guide: the fitted guide.
    :ivar params: the fitted parameters.
    """

    metrics: dict
    final_elbo: float
    seconds_per_step: float
    compile_seconds: float
    total_seconds: float
    num_skipped: int
    model: Callable
    guide: Any
    params: dict


#: what :func:`fit_factorized`, :func:`fit_dsvi` and ``run_on_uci``'s ``fit_fn`` return
Fitted = tuple[Callable, Any, FitResult]


def fit_factorized(
    model: Callable,
    rng_key: jax.Array,
    X: ArrayLike,
    y: ArrayLike,
    *,
    num_steps: int,
    batch_size: int | None = None,
    learning_rate: float = 0.01,
    num_particles: int = 1,
    **options: Any,
) -> Fitted:
    """Fit ``model(X, y, batch_size=...)`` with ``AutoFactorizedDGP``, ``DGPElbo`` and Adam.

    :param model: a model called as ``model(X, y)``, taking ``batch_size=`` when minibatching
        (as the models of :mod:`numpyro_dgp.models` do).
    :param rng_key: PRNG key.
    :param X: ``(N, D)`` training inputs.
    :param y: ``(N,)`` training targets.
    :param num_steps: optimization steps.
    :param batch_size: minibatch size (``None``: every point in every step).
    :param learning_rate: Adam's step size.
    :param num_particles: Monte Carlo samples of the inner layers per step.
    :param options: the other options of :func:`~numpyro_dgp.fit`: ``progress_bar`` (default
        here ``False``), ``chunk_size`` (steps per compiled chunk, default here 500),
        ``init_params`` (initial constrained values of some parameters: a partial dict, its
        entries checked against the model, as ``strict=False``, the default here, checks
        them), ...
    :return: ``(model, guide, FitResult)``.
    """
    guide = AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(learning_rate), DGPElbo(num_particles=num_particles))
    kwargs: dict[str, Any] = {"batch_size": batch_size} if batch_size else {}
    options = {"progress_bar": False, "chunk_size": 500, "strict": False, **options}
    return model, guide, fit(svi, rng_key, X, y, num_steps=num_steps, **options, **kwargs)


def run_on_uci(
    name: os.PathLike | str,
    split: int,
    rng_key: jax.Array | None,
    data_dir: os.PathLike | str | None,
    num_test_samples: int,
    fit_fn: Callable[[jax.Array, jax.Array, jax.Array], Fitted],
) -> RunResult:
    """Load a UCI split, fit with ``fit_fn(fit_key, X, y) -> (model, guide, FitResult)``,
    predict the test set; metrics in original target units.

    :param name: data set name under ``data_dir``, or a path to a folder in the standard
        split layout (see :func:`~numpyro_dgp.datasets.load_uci`).
    :param split: split index.
    :param rng_key: PRNG key (default ``PRNGKey(split)``).
    :param data_dir: folder holding the data sets (see :func:`~numpyro_dgp.datasets.load_uci`).
    :param num_test_samples: mixture components of the prediction.
    :param fit_fn: the fitting recipe.
    :return: :class:`RunResult`.
    """
    rng_key = jax.random.PRNGKey(split) if rng_key is None else rng_key
    data = load_uci(name, split, data_dir=data_dir)
    return _fit_and_score(fit_fn, rng_key, data, num_test_samples, data.y_std)


def _fit_and_score(
    fit_fn: Callable[[jax.Array, jax.Array, jax.Array], Fitted],
    rng_key: jax.Array,
    data: Dataset | UCISplit,
    num_test_samples: int,
    y_scale: ArrayLike = 1.0,
) -> RunResult:
    """Fit with ``fit_fn(fit_key, X, y)`` to ``data``'s training part, predict its test inputs
    and score them against its test targets (in units of ``y_scale``); the fit and the
    prediction timed together."""
    dtype = jnp.result_type(float)
    X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
    X_test, y_test = jnp.asarray(data.X_test, dtype), jnp.asarray(data.y_test, dtype)
    start = time.perf_counter()
    fit_key, pred_key = jax.random.split(rng_key)
    model, guide, result = fit_fn(fit_key, X, y)
    pred = predict(model, guide, result.params, pred_key, X_test, num_samples=num_test_samples)
    scores = metrics(pred, y_test, y_scale=y_scale)
    timing = (result.seconds_per_step, result.compile_seconds, time.perf_counter() - start)
    final_elbo = float(-np.nanmean(result.losses[-100:]))
    return RunResult(scores, final_elbo, *timing, result.num_skipped, model, guide, result.params)


def fit_dsvi(
    rng_key: jax.Array,
    X: ArrayLike,
    y: ArrayLike,
    *,
    num_layers: int = 2,
    num_inducing: int = 100,
    hidden_width: int | None = None,
    num_steps: int = 5000,
    **options: Any,
) -> Fitted:
    """Fit a DSVI DGP (:func:`~numpyro_dgp.models.deep_gp_regression` with
    ``AutoFactorizedDGP``, ``DGPElbo`` and Adam) and time it.

    :param rng_key: PRNG key.
    :param X: ``(N, D)`` training inputs.
    :param y: ``(N,)`` training targets.
    :param num_layers: GP layers.
    :param num_inducing: ``M`` per layer.
    :param hidden_width: inner-layer width (default ``D``).
    :param num_steps: optimization steps.
    :param options: the other options of :func:`fit_factorized` (``batch_size``,
        ``learning_rate``, ``num_particles``, ``progress_bar``, ``chunk_size``,
        ``init_params``).
    :return: ``(model, guide, FitResult)``; timings are ``FitResult.seconds_per_step`` and
        ``FitResult.compile_seconds``.
    """
    model = deep_gp_regression(num_layers, num_inducing=num_inducing, hidden_width=hidden_width)
    return fit_factorized(model, rng_key, X, y, num_steps=num_steps, **options)


def run_uci(
    name: os.PathLike | str,
    split: int = 0,
    *,
    rng_key: jax.Array | None = None,
    data_dir: os.PathLike | str | None = None,
    num_inducing: int = 100,
    batch_size: int = 1000,
    num_test_samples: int = 100,
    **options: Any,
) -> RunResult:
    """DSVI on one UCI split (the recipe of Salimbeni & Deisenroth, 2017, inner layers of width
    ``min(D, 30)`` as in its experiments); metrics in the original units.

    :param name: data set name under ``data_dir``, or a path to a folder in the standard split
        layout.
    :param split: split index.
    :param rng_key: PRNG key (default ``PRNGKey(split)``).
    :param data_dir: folder holding the data sets.
    :param num_inducing: ``M`` per layer (at most the number of training points).
    :param batch_size: minibatch size (full batch when the training set is smaller).
    :param num_test_samples: mixture components of the prediction.
    :param options: the other options of :func:`fit_dsvi`: ``num_layers`` (default 2),
        ``num_steps`` (5000), ``learning_rate`` (Adam's step size, 0.01), ``progress_bar``, ...
    :return: :class:`RunResult`.
    """

    def fit_fn(fit_key, X, y):
        return fit_dsvi(
            fit_key,
            X,
            y,
            num_inducing=min(num_inducing, X.shape[0]),
            hidden_width=min(X.shape[1], 30),
            batch_size=batch_size if batch_size < X.shape[0] else None,
            **options,
        )

    return run_on_uci(name, split, rng_key, data_dir, num_test_samples, fit_fn)


def run_demo(
    rng_key: jax.Array | None = None,
    *,
    num_steps: int = 3000,
    num_inducing: int = 30,
    output: os.PathLike | str | None = None,
    num_test_samples: int = 100,
) -> dict[str, RunResult]:
    """Fit a 2-layer DGP and a 1-layer SVGP to the step function; optionally plot.

    :param rng_key: PRNG key (default ``PRNGKey(0)``).
    :param num_steps: optimization steps of each model.
    :param num_inducing: ``M`` per layer.
    :param output: path of a PNG with each layer's samples and the composition (or ``None``).
    :param num_test_samples: mixture components of the predictions.
    :return: ``{"dgp": RunResult, "svgp": RunResult}``.
    """
    rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    data_key, dgp_key, gp_key, plot_key = jax.random.split(rng_key, 4)
    data = step_function(data_key, num_train=100, num_test=200, noise_std=0.01)
    out = {}
    for label, layers, key in (("dgp", 2, dgp_key), ("svgp", 1, gp_key)):
        fit_fn = partial(
            fit_dsvi, num_layers=layers, num_inducing=num_inducing, num_steps=num_steps
        )
        out[label] = _fit_and_score(fit_fn, key, data, num_test_samples)
    if output is not None:
        plot_demo(out["dgp"], data, plot_key, output)
    return out


def plot_demo(run: RunResult, data: Dataset, rng_key: jax.Array, path: os.PathLike | str) -> Path:
    """Each layer's function samples and the composition (as in Fig. 5 of Ustyuzhaninov et
    al., 2020).

    :param run: the fitted 2-layer model (``run_demo()["dgp"]``).
    :param data: the step-function data (scattered on the composition).
    :param rng_key: PRNG key of the function samples.
    :param path: PNG to write.
    :return: the path written.
    """
    import matplotlib.pyplot as plt

    from numpyro_dgp.plots import plot_layer_samples

    grid = jnp.linspace(-1.2, 1.2, 200, dtype=jnp.result_type(float))[:, None]
    samples = sample_layers(run.model, run.guide, run.params, rng_key, grid, num_samples=25)
    fig = plot_layer_samples(grid, samples, data.X_train, data.y_train)
    fig.suptitle(
        f"2-layer DGP (DSVI) on the step function: test LL {run.metrics['log_likelihood']:.2f}, "
        f"RMSE {run.metrics['rmse']:.3f}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
