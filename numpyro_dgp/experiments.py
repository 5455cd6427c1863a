"""End-to-end runs shared by the CLI, the benchmarks and the tutorials."""

from __future__ import annotations

import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.infer import SVI

from numpyro_dgp.datasets import load_uci, step_function
from numpyro_dgp.guides import AutoFactorisedDGP
from numpyro_dgp.infer import fit
from numpyro_dgp.kernels import RBF
from numpyro_dgp.models import deep_gp_regression, diffgp
from numpyro_dgp.objectives import DGPElbo
from numpyro_dgp.plots import plot_layer_samples
from numpyro_dgp.predict import metrics, predict, sample_layers

__all__ = [
    "RunResult",
    "extend_by_split",
    "fit_diffgp",
    "fit_dsvi",
    "mean_and_standard_error",
    "parse_splits",
    "run_demo",
    "run_diffgp_uci",
    "run_uci",
]


def parse_splits(text):
    """``"0-4"`` -> ``[0, 1, 2, 3, 4]``; ``"0,3,7"`` -> ``[0, 3, 7]``; ranges and lists combine."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    if not out:
        raise ValueError(f"no split indices in {text!r}")
    return out


def extend_by_split(rows, more, what):
    """Append the per-split result rows ``more`` to ``rows`` (both lists of dicts with a
    ``"split"`` key), kept sorted by split; a split in both is an error naming ``what``
    (merging the results files of runs made by separate processes)."""
    clash = {r["split"] for r in rows} & {r["split"] for r in more}
    if clash:
        raise ValueError(f"{what}: split(s) {sorted(clash)} appear in more than one file")
    rows += more
    rows.sort(key=lambda r: r["split"])
    return rows


def mean_and_standard_error(values):
    """Mean and standard error (``ddof=1``; NaN for one value) as Python floats."""
    v = np.asarray(values, float)
    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return float(v.mean()), float(se)


class RunResult(NamedTuple):
    """Outcome of one fitted model.

    :ivar metrics: test ``{"log_likelihood", "rmse", "crps"}`` (original units for UCI).
    :ivar final_elbo: ``-loss`` averaged over the last 100 steps (standardised units).
    :ivar seconds_per_step: steady training time per step (compile excluded).
    :ivar compile_seconds: compilation of the training chunk (``FitResult.compile_seconds``).
    :ivar total_seconds: fit + predict wall time.
    :ivar num_skipped: non-finite updates skipped.
    """

    metrics: dict
    final_elbo: float
    seconds_per_step: float
    compile_seconds: float
    total_seconds: float
    num_skipped: int
    model: object
    guide: object
    params: dict


def _fit_factorised(model, rng_key, X, y, num_steps, batch_size, learning_rate, num_particles, progress_bar,
                    chunk_size, init_params=None):
    """``AutoFactorisedDGP`` + ``DGPElbo`` + Adam on ``model``: ``(model, guide, FitResult)``."""
    guide = AutoFactorisedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(learning_rate), DGPElbo(num_particles=num_particles))
    kwargs = {"batch_size": batch_size} if batch_size else {}
    result = fit(svi, rng_key, X, y, num_steps=num_steps, chunk_size=min(chunk_size, num_steps),
                 progress_bar=progress_bar, init_params=init_params, **kwargs)
    return model, guide, result


def _run_on_uci(name, split, rng_key, data_dir, num_test_samples, fit_fn) -> RunResult:
    """Load a UCI split, ``fit_fn(fit_key, X, y) -> (model, guide, FitResult)``, predict the
    test set; metrics in original target units."""
    rng_key = jax.random.PRNGKey(split) if rng_key is None else rng_key
    data = load_uci(name, split, data_dir=data_dir)
    dtype = jnp.result_type(float)
    X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
    t0 = time.perf_counter()
    fit_key, pred_key = jax.random.split(rng_key)
    model, guide, result = fit_fn(fit_key, X, y)
    pred = predict(model, guide, result.params, pred_key, jnp.asarray(data.X_test, dtype), num_samples=num_test_samples)
    m = metrics(pred, jnp.asarray(data.y_test, dtype), y_scale=data.y_std)
    total = time.perf_counter() - t0
    final_elbo = float(-np.nanmean(result.losses[-100:]))
    return RunResult(m, final_elbo, result.seconds_per_step, result.compile_seconds, total, result.num_skipped,
                     model, guide, result.params)


def fit_dsvi(
    rng_key,
    X,
    y,
    *,
    num_layers=2,
    num_inducing=100,
    hidden_width=None,
    num_steps=5000,
    batch_size=None,
    learning_rate=0.01,
    num_particles=1,
    progress_bar=False,
    chunk_size=500,
    noise_init=0.01,
):
    """Fit a DSVI DGP (``AutoFactorisedDGP`` + ``DGPElbo`` + Adam) and time it.

    :return: ``(model, guide, FitResult)``; timings are ``FitResult.seconds_per_step`` and
        ``FitResult.compile_seconds``.
    """
    model = deep_gp_regression(num_layers, num_inducing=num_inducing, hidden_width=hidden_width, noise_init=noise_init)
    return _fit_factorised(model, rng_key, X, y, num_steps, batch_size, learning_rate, num_particles, progress_bar,
                           chunk_size)


def run_uci(
    name,
    split=0,
    *,
    rng_key=None,
    data_dir=None,
    num_layers=2,
    num_inducing=100,
    num_steps=5000,
    batch_size=1000,
    learning_rate=0.01,
    num_test_samples=100,
    hidden_width=None,
    progress_bar=False,
) -> RunResult:
    """DSVI on one UCI split; metrics in the original target units.

    ``hidden_width`` defaults to ``min(D, 30)`` as in DSVI's experiments.
    """
    def fit_fn(fit_key, X, y):
        width = hidden_width if hidden_width is not None else min(X.shape[1], 30)
        return fit_dsvi(
            fit_key, X, y, num_layers=num_layers, num_inducing=min(num_inducing, X.shape[0]),
            hidden_width=width, num_steps=num_steps, batch_size=batch_size if batch_size < X.shape[0] else None,
            learning_rate=learning_rate, progress_bar=progress_bar,
        )

    return _run_on_uci(name, split, rng_key, data_dir, num_test_samples, fit_fn)


def fit_diffgp(
    rng_key,
    X,
    y,
    *,
    T=1.0,
    num_flow_steps=20,
    num_inducing=100,
    num_steps=3000,
    batch_size=None,
    learning_rate=0.01,
    num_particles=4,
    progress_bar=False,
    chunk_size=500,
    noise_init=0.01,
    estimator="marginal",
    init="default",
    pretrain_steps=0,
):
    """Fit a DiffGP (:func:`numpyro_dgp.models.diffgp`, ``AutoFactorisedDGP`` + ``DGPElbo`` + Adam).

    :param init: ``"default"`` (:func:`~numpyro_dgp.models.diffgp`'s initial values: unit
        lengthscales, zero inducing means, noise ``noise_init``) or ``"released"`` (the
        released DiffGP code's: lengthscales ``D`` for both kernels, noise variance 1,
        whitened inducing means of flow and predictor drawn from N(0, 1)).
    :param pretrain_steps: first fit the predictor alone as an SVGP (``T = 0``) for this many
        steps and start the flow model from its predictor and noise (the paper's
        pre-training; the flow keeps its own initial values).
    :return: ``(model, guide, FitResult)``; ``FitResult`` of the flow model (the
        pre-training is not counted in its timings).
    """
    if init not in ("default", "released"):
        raise ValueError(f"fit_diffgp: init must be 'default' or 'released', got {init!r}")
    if not (isinstance(pretrain_steps, (int, np.integer)) and pretrain_steps >= 0):
        raise ValueError(f"fit_diffgp: pretrain_steps must be a non-negative integer, got {pretrain_steps!r}")
    D = X.shape[-1]
    options = {"num_inducing": num_inducing, "noise_init": noise_init}
    if init == "released":
        options.update(noise_init=1.0, flow_kernel=RBF(variance=0.01, lengthscale=float(D)),
                       kernel=RBF(lengthscale=float(D)))
    # the flow model's own fit keeps rng_key, so that the default run is unchanged by these options
    pretrain_key, means_key = jax.random.fold_in(rng_key, 1), jax.random.fold_in(rng_key, 2)
    init_params = {}
    if init == "released":  # whitened inducing means, shape (out_dim, M)
        for i, (site, width) in enumerate((("flow.u_auto_loc", D), ("g.u_auto_loc", 1))):
            init_params[site] = jax.random.normal(jax.random.fold_in(means_key, i), (width, num_inducing), X.dtype)
    if pretrain_steps:
        _, _, pre = _fit_factorised(diffgp(0.0, **options), pretrain_key, X, y, int(pretrain_steps), batch_size,
                                    learning_rate, 1, progress_bar, chunk_size)
        init_params.update({k: v for k, v in pre.params.items() if k == "noise" or k.startswith("g.")})

    model = diffgp(T, num_steps=num_flow_steps, estimator=estimator, **options)
    return _fit_factorised(model, rng_key, X, y, num_steps, batch_size, learning_rate, num_particles, progress_bar,
                           chunk_size, init_params=init_params or None)


def run_diffgp_uci(
    name,
    split=0,
    *,
    T=1.0,
    rng_key=None,
    data_dir=None,
    num_flow_steps=20,
    num_inducing=100,
    num_steps=3000,
    batch_size=10000,
    learning_rate=0.01,
    num_particles=4,
    num_test_samples=50,
    progress_bar=False,
    init="default",
    pretrain_steps=0,
) -> RunResult:
    """DiffGP on one UCI split (the released code's settings by default: full batch up to
    10000 points, 4 training samples, 50 test samples); metrics in original target units.
    ``init`` and ``pretrain_steps``: see :func:`fit_diffgp`."""
    def fit_fn(fit_key, X, y):
        return fit_diffgp(
            fit_key, X, y, T=T, num_flow_steps=num_flow_steps, num_inducing=min(num_inducing, X.shape[0]),
            num_steps=num_steps, batch_size=batch_size if batch_size < X.shape[0] else None,
            learning_rate=learning_rate, num_particles=num_particles, progress_bar=progress_bar,
            init=init, pretrain_steps=pretrain_steps,
        )

    return _run_on_uci(name, split, rng_key, data_dir, num_test_samples, fit_fn)


def run_demo(rng_key=None, *, num_steps=3000, num_inducing=30, output=None, num_test_samples=100):
    """Fit a 2-layer DGP and a 1-layer SVGP to the step function; optionally plot.

    :param output: path of a PNG with each layer's samples and the composition (or ``None``).
    :return: ``{"dgp": RunResult, "svgp": RunResult}``.
    """
    rng_key = jax.random.PRNGKey(0) if rng_key is None else rng_key
    data_key, dgp_key, gp_key, plot_key = jax.random.split(rng_key, 4)
    data = step_function(data_key, num_train=100, num_test=200, noise_std=0.01)
    dtype = jnp.result_type(float)
    X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
    Xt, yt = jnp.asarray(data.X_test, dtype), jnp.asarray(data.y_test, dtype)
    out = {}
    for label, layers, key in (("dgp", 2, dgp_key), ("svgp", 1, gp_key)):
        t0 = time.perf_counter()
        fit_key, pred_key = jax.random.split(key)
        model, guide, result = fit_dsvi(
            fit_key, X, y, num_layers=layers, num_inducing=num_inducing, num_steps=num_steps,
            learning_rate=0.01, noise_init=0.01,
        )
        pred = predict(model, guide, result.params, pred_key, Xt, num_samples=num_test_samples)
        m = metrics(pred, yt)
        out[label] = RunResult(m, float(-np.nanmean(result.losses[-100:])), result.seconds_per_step,
                               result.compile_seconds, time.perf_counter() - t0, result.num_skipped,
                               model, guide, result.params)
    if output is not None:
        plot_demo(out["dgp"], data, plot_key, output)
    return out


def plot_demo(run: RunResult, data, rng_key, path):
    """Each layer's function samples and the composition (paper 000, Fig. 5 style)."""
    import matplotlib.pyplot as plt

    dtype = jnp.result_type(float)
    grid = jnp.linspace(-1.2, 1.2, 200, dtype=dtype)[:, None]
    samples = sample_layers(run.model, run.guide, run.params, rng_key, grid, num_samples=25)
    fig = plot_layer_samples(grid, samples, data.X_train, data.y_train)
    fig.suptitle(f"2-layer DGP (DSVI) on the step function: test LL {run.metrics['log_likelihood']:.2f}, "
                 f"RMSE {run.metrics['rmse']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
