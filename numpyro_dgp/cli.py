"""The ``numpyro-dgp`` command.

* ``numpyro-dgp demo`` -- fit a 2-layer DGP and a 1-layer SVGP to the built-in step
  function, print the ELBO and test metrics, write a PNG of each layer's samples.
* ``numpyro-dgp uci --dataset NAME --splits 0-4 ...`` -- DSVI on UCI splits; prints a table
  of test log-likelihood and RMSE (mean and standard error over splits).
* ``numpyro-dgp fit DATA --target COLUMN[,COLUMN...] --output MODEL_DIR ...`` -- fit a DSVI DGP
  to your own table (CSV with a header row, or ``.npz``; see
  :func:`numpyro_dgp.datasets.read_table`) with any of the likelihoods of ``--likelihood``,
  standardized with the training part's statistics, and save it
  (:func:`numpyro_dgp.save_model`); with ``--test-fraction`` print held-out metrics.
* ``numpyro-dgp predict MODEL_DIR DATA --output predictions.csv`` -- predict with a saved
  model (:func:`numpyro_dgp.load_model`): the predictive mean, standard deviation and
  quantiles of every target column (regression, counts), the probability of ``y = 1``
  (probit) or the class probabilities and the most probable class (softmax, robust max) per
  row, in the data's units.

Every numeric argument is checked before anything runs: counts must be positive integers,
``--lr`` a finite positive number, ``--seed`` a non-negative integer and ``--splits``
non-negative indices or increasing ranges; ``--num-inducing`` above the number of training
points is an error (not clipped). A bad value exits with status 2 and a message naming the
argument.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # NumPy is imported where it is used: the command's start stays light
    import numpy as np

__all__ = ["build_parser", "main"]


def _parse_splits(text: str) -> list[int]:
    from numpyro_dgp._persist.uci_files import parse_splits  # not datasets: that imports JAX

    try:
        return parse_splits(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _check_at_least(value: int | None, minimum: int, text: str) -> int:
    """``value`` (parsed from ``text``; ``None``: not an integer), checked to be ``>= minimum``.

    :raises argparse.ArgumentTypeError: otherwise.
    """
    if value is None or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}")
    return value


def _integer(text: str, minimum: int) -> int:
    try:
        value: int | None = int(text)
    except ValueError:
        value = None
    return _check_at_least(value, minimum, text)


def _positive_int(text: str) -> int:
    return _integer(text, 1)


def _non_negative_int(text: str) -> int:
    return _integer(text, 0)


def _check_positive_float(value: float, text: str) -> None:
    """Raise unless ``value`` (parsed from ``text``; NaN: not a number) is finite and positive.

    :raises argparse.ArgumentTypeError: otherwise.
    """
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text!r}")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    _check_positive_float(value, text)
    return value


def _setup_precision(float32: bool) -> None:
    import jax

    if not float32:
        jax.config.update("jax_enable_x64", True)


def cmd_demo(args: argparse.Namespace) -> int:
    """``numpyro-dgp demo``: fit a 2-layer DGP and an SVGP to the step function, print a table
    of their ELBOs and test metrics and write a PNG of the DGP's layer samples.

    :param args: the parsed ``demo`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    """
    _setup_precision(args.float32)
    import jax
    import matplotlib

    matplotlib.use("Agg")  # the command writes files; no display needed

    from numpyro_dgp.recipes import run_demo

    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "demo_step_function.png"
    print(
        "Fitting a 2-layer DGP and a 1-layer SVGP to the step function "
        f"({args.steps} steps each)..."
    )
    runs = run_demo(jax.random.PRNGKey(args.seed), num_steps=args.steps, output=png)
    print()
    print(f"{'model':<14} {'final ELBO':>11} {'test LL':>9} {'RMSE':>8} {'CRPS':>8} {'ms/step':>8}")
    for label, name in (("dgp", "DGP (2 layers)"), ("svgp", "SVGP (1 layer)")):
        r = runs[label]
        print(
            f"{name:<14} {r.final_elbo:>11.2f} {r.metrics['log_likelihood']:>9.3f} "
            f"{r.metrics['rmse']:>8.4f} "
            f"{r.metrics['crps']:>8.4f} {r.seconds_per_step * 1e3:>8.2f}"
        )
    print(f"\nwrote {png}")
    return 0


def _check_uci_splits(dataset: str, data_dir: str | None, splits: list[int]) -> None:
    """Raise unless the data set has every split of ``splits`` (NumPy only: before JAX loads).

    :raises FileNotFoundError: no such data set (see :func:`~numpyro_dgp.datasets.num_uci_splits`).
    :raises SystemExit: a split index the data set does not have.
    """
    from numpyro_dgp._persist.uci_files import num_uci_splits

    available = num_uci_splits(dataset, data_dir)
    bad = [s for s in splits if not 0 <= s < available]
    if bad:
        raise SystemExit(f"--splits: {dataset} has splits 0..{available - 1}; got {bad}")


def _check_uci_inducing(num_inducing: int, num_train: int, name: str, split: int) -> None:
    """Raise if ``--num-inducing`` exceeds the ``num_train`` training points of the first split.

    :raises ValueError: otherwise.
    """
    if num_inducing > num_train:
        raise ValueError(
            f"--num-inducing {num_inducing} exceeds the {num_train} training points of {name} "
            f"(split {split}); pass --num-inducing {num_train} or fewer"
        )


def cmd_uci(args: argparse.Namespace) -> int:
    """``numpyro-dgp uci``: DSVI on the chosen UCI splits; prints per-split test
    log-likelihood, RMSE and CRPS, then their mean and standard error.

    :param args: the parsed ``uci`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    :raises SystemExit: a split index the data set does not have.
    :raises ValueError: ``--num-inducing`` above the number of training points.
    """
    # the data directory, the data set and the splits are checked before JAX is imported
    _check_uci_splits(args.dataset, args.data_dir, args.splits)
    _setup_precision(args.float32)
    from numpyro_dgp.datasets import load_uci
    from numpyro_dgp.recipes import mean_and_standard_error, run_uci

    data = load_uci(
        args.dataset, args.splits[0], data_dir=args.data_dir
    )  # fails early on bad files
    name = data.name
    _check_uci_inducing(args.num_inducing, data.X_train.shape[0], name, args.splits[0])
    print(
        f"{name}: {args.layers}-layer DSVI DGP, M={args.num_inducing}, {args.steps} steps, "
        f"batch {args.batch_size}"
    )
    print(f"{'split':>5} {'test LL':>9} {'RMSE':>9} {'CRPS':>9} {'ms/step':>8} {'seconds':>8}")
    lls, rmses = [], []
    for split in args.splits:
        r = run_uci(
            args.dataset,
            split,
            data_dir=args.data_dir,
            num_layers=args.layers,
            num_inducing=args.num_inducing,
            num_steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.lr,
        )
        lls.append(r.metrics["log_likelihood"])
        rmses.append(r.metrics["rmse"])
        print(
            f"{split:>5} {lls[-1]:>9.4f} {rmses[-1]:>9.4g} {r.metrics['crps']:>9.4g} "
            f"{r.seconds_per_step * 1e3:>8.2f} {r.total_seconds:>8.1f}",
            flush=True,
        )

    (ll, ll_se), (rm, rm_se) = mean_and_standard_error(lls), mean_and_standard_error(rmses)
    print(f"{'mean':>5} {ll:>9.4f} {rm:>9.4g}")
    print(f"{'s.e.':>5} {ll_se:>9.4f} {rm_se:>9.4g}")
    return 0


def _check_fraction(value: float, text: str) -> None:
    """Raise unless ``value`` (parsed from ``text``; NaN: not a number) is in ``[0, 1)``.

    :raises argparse.ArgumentTypeError: otherwise.
    """
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    _check_fraction(value, text)
    return value


def _check_quantiles(values: list[float], text: str) -> None:
    """Raise unless ``values`` (parsed from ``text``; empty: not numbers) are some levels in
    ``(0, 1)``.

    :raises argparse.ArgumentTypeError: otherwise.
    """
    if not values or not all(0 < v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated numbers in (0, 1), e.g. 0.025,0.975; got {text!r}"
        )


def _quantile_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    _check_quantiles(values, text)
    return values


#: ``--likelihood`` -> the factories' name (:data:`numpyro_dgp.models.LIKELIHOODS`)
LIKELIHOODS = {
    "normal": "gaussian",
    "probit": "probit",
    "softmax": "softmax",
    "robust-max": "robust_max",
    "student-t": "student_t",
    "poisson": "poisson",
    "negative-binomial": "negative_binomial",
    "heteroscedastic": "heteroscedastic",
}
_CONTINUOUS = ("gaussian", "student_t", "heteroscedastic")


def _check_target_names(names: list[str], text: str) -> None:
    """Raise if a name of ``names`` (split from ``text``) is empty.

    :raises argparse.ArgumentTypeError: otherwise.
    """
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"must be a column name or comma-separated names, got {text!r}"
        )


def _target_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    _check_target_names(names, text)
    return names


def _check_target_values(y: np.ndarray, likelihood: str, targets: list[str]) -> int | None:
    """Refuse targets the likelihood cannot take (NumPy only, before JAX loads); return the
    number of classes for ``softmax`` / ``robust_max``."""
    import numpy as np

    values = y[~np.isnan(y)]
    shown = (  # noqa: E731
        lambda v: f"{np.unique(v)[:6].tolist()}{' ...' if np.unique(v).size > 6 else ''}"
    )
    if likelihood == "probit" and not set(np.unique(values).tolist()) <= {0.0, 1.0}:
        raise ValueError(
            f"--likelihood probit needs a target of 0s and 1s; {targets[0]!r} holds {shown(values)}"
        )
    if likelihood in ("softmax", "robust_max"):
        if values.size == 0 or np.any(values < 0) or np.any(values != np.round(values)):
            raise ValueError(
                f"--likelihood {likelihood.replace('_', '-')} needs class labels 0, 1, ..., C-1; "
                f"{targets[0]!r} holds {shown(values)}"
            )
        num_classes = int(values.max()) + 1
        if num_classes < 2:
            raise ValueError(
                f"--likelihood {likelihood.replace('_', '-')} needs at least two classes; "
                f"{targets[0]!r} holds only {shown(values)}"
            )
        return num_classes
    if likelihood in ("poisson", "negative_binomial") and (
        np.any(values < 0) or np.any(values != np.round(values))
    ):
        raise ValueError(
            f"--likelihood {likelihood.replace('_', '-')} needs non-negative integer counts; "
            f"{targets} hold {shown(values)}"
        )
    return None


def _check_label_targets(option: str, likelihood: str, targets: list[str]) -> None:
    """Raise if a likelihood of labels (``--likelihood option``) is given several target columns.

    :raises ValueError: otherwise.
    """
    if len(targets) > 1 and likelihood in ("probit", "softmax", "robust_max"):
        raise ValueError(
            f"--likelihood {option} takes one --target column of labels, got {targets}"
        )


def _check_missing_targets(data: str, y: np.ndarray, targets: list[str], masked: bool) -> None:
    """Raise if a target column has missing values (NaN) and they are not to be masked.

    :raises ValueError: naming the columns.
    """
    import numpy as np

    N = y.shape[0]
    gaps = [name for j, name in enumerate(targets) if np.isnan(y.reshape(N, -1)[:, j]).any()]
    if gaps and not masked:
        raise ValueError(
            f"{data}: target column(s) {gaps} have missing values; pass --missing-targets mask to "
            "leave them out of the likelihood"
        )


def _check_training_rows(num_train: int, test_fraction: float, N: int) -> None:
    """Raise if ``--test-fraction`` leaves fewer than two of the ``N`` rows for training.

    :raises ValueError: otherwise.
    """
    if num_train < 2:
        raise ValueError(f"--test-fraction {test_fraction} leaves {num_train} training rows of {N}")


def _check_fit_inducing(num_inducing: int, batch: int | None, num_train: int) -> None:
    """Raise if ``--num-inducing`` exceeds the points its k-means initialization sees (the first
    minibatch of ``batch`` rows, else the ``num_train`` training rows).

    :raises ValueError: otherwise.
    """
    init_points = batch or num_train
    if num_inducing > init_points:
        raise ValueError(
            f"--num-inducing {num_inducing} exceeds the {init_points} points its k-means "
            f"initialization sees ({'the first minibatch' if batch else 'the training rows'}); "
            f"pass --num-inducing {init_points} or fewer"
            f"{' or a larger --batch-size' if batch else ''}"
        )


def _fit_table(
    args: argparse.Namespace, likelihood: str, targets: list[str], masked: bool
) -> tuple[np.ndarray, np.ndarray, list[str], int | None]:
    """``(X, y, feature names, number of classes)`` of ``fit``'s table, its targets checked
    against the likelihood (NumPy only: a bad table is reported before JAX loads)."""
    from numpyro_dgp._persist.tables import read_table  # NumPy only: before JAX loads

    _check_label_targets(args.likelihood, likelihood, targets)
    table = read_table(args.data, allow_missing=targets)
    X, y, names = table.split(targets[0] if len(targets) == 1 else targets)
    assert y is not None  # a target was named
    _check_missing_targets(args.data, y, targets, masked)
    num_classes = _check_target_values(y, likelihood, targets)
    return X, y, names, num_classes


def _train_test_rows(N: int, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` row indices: ``--test-fraction`` of the ``N`` rows held out at random."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(N)
    num_test = int(round(test_fraction * N))
    test, train = order[:num_test], order[num_test:]
    _check_training_rows(train.size, test_fraction, N)
    return train, test


def _training_arrays(
    s, X: np.ndarray, y: np.ndarray, train: np.ndarray, dtype, continuous: bool, masked: bool
):
    """``(X_train, y_train)`` as JAX arrays: standardized inputs, and standardized targets
    (continuous likelihoods), labels or counts."""
    import jax.numpy as jnp

    X_train = jnp.asarray(s.inputs(X[train]), dtype)
    if continuous or masked:
        y_train = jnp.asarray(s.targets(y[train]) if continuous else y[train], dtype)
    else:
        y_train = jnp.asarray(y[train], jnp.int32)
    return X_train, y_train


def _print_fit_plan(
    args: argparse.Namespace,
    N: int,
    names: list[str],
    num_classes: int | None,
    train_rows: int,
    test_rows: int,
    batch: int | None,
    dtype,
) -> None:
    """Print what ``fit`` is about to do: the table's sizes, the model and the optimization."""
    import numpy as np

    targets = args.target
    shown = repr(targets[0]) if len(targets) == 1 else str(targets)
    print(
        f"{args.data}: {N} rows, {len(names)} features, target {shown} ({args.likelihood}"
        f"{f', {num_classes} classes' if num_classes else ''}); {train_rows} training, "
        f"{test_rows} test rows"
    )
    print(
        f"{args.layers}-layer DSVI DGP, M={args.num_inducing}, {args.steps} steps, "
        f"{'batch ' + str(batch) if batch else 'full batch'}, {np.dtype(dtype).name}; "
        "inducing inputs by k-means on "
        f"{'one minibatch of ' + str(batch) if batch else str(min(train_rows, 100_000))} points"
    )


def _fit_summary(
    args: argparse.Namespace,
    N: int,
    train_rows: int,
    test_rows: int,
    batch: int | None,
    final: float,
    seconds: float,
    result,
) -> dict:
    """The fit's record saved with the model (``metadata``)."""
    return {
        "rows": int(N),
        "train_rows": int(train_rows),
        "test_rows": int(test_rows),
        "steps": args.steps,
        "batch_size": batch,
        "seed": args.seed,
        "final_loss": final,
        "fit_seconds": seconds,
        "skipped_steps": int(result.num_skipped),
    }


def _print_held_out(
    loaded, X: np.ndarray, y: np.ndarray, test: np.ndarray, targets: list[str], seed: int
) -> None:
    """Print the metrics of the saved model (``loaded`` again) on the held-out rows."""
    import jax

    pred = loaded.predict(X[test], rng_key=jax.random.PRNGKey(seed + 1), batch_size=10_000)
    print("held-out: " + _scores_text(pred, y[test], targets))


def cmd_fit(args: argparse.Namespace) -> int:
    """``numpyro-dgp fit``: fit a DSVI DGP to a table and save it as a model directory.

    :param args: the parsed ``fit`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    :raises ValueError: a bad table, target or size (the message names it).
    """
    import time

    import numpy as np

    targets = args.target
    masked = args.missing_targets == "mask"
    likelihood = LIKELIHOODS[args.likelihood]
    X, y, names, num_classes = _fit_table(args, likelihood, targets, masked)
    N = X.shape[0]
    train, test = _train_test_rows(N, args.seed, args.test_fraction)

    _setup_precision(args.float32)
    import jax
    import jax.numpy as jnp
    import numpyro
    from numpyro.infer import SVI

    from numpyro_dgp import DGPElbo, Standardization, fit, load_model, save_model
    from numpyro_dgp.guides import AutoFactorizedDGP
    from numpyro_dgp.models import deep_gp_regression

    continuous = likelihood in _CONTINUOUS
    s = Standardization.fit(X[train], y[train] if continuous else None)
    dtype = jnp.float32 if args.float32 else jnp.float64
    X_train, y_train = _training_arrays(s, X, y, train, dtype, continuous, masked)
    batch = args.batch_size if args.batch_size < train.size else None
    _check_fit_inducing(args.num_inducing, batch, train.size)
    _print_fit_plan(args, N, names, num_classes, train.size, test.size, batch, dtype)
    model = deep_gp_regression(
        args.layers,
        num_inducing=args.num_inducing,
        hidden_width=args.hidden_width,
        likelihood=likelihood,
        num_outputs=len(targets),
        num_classes=num_classes,
        missing_targets=args.missing_targets,
    )
    guide = AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(args.lr), DGPElbo())
    kwargs = {"batch_size": batch} if batch else {}
    start = time.perf_counter()
    result = fit(
        svi,
        jax.random.PRNGKey(args.seed),
        X_train,
        y_train,
        num_steps=args.steps,
        chunk_size=min(100, args.steps),
        progress_bar=not args.no_progress,
        **kwargs,
    )
    seconds = time.perf_counter() - start
    final = float(np.nanmean(result.losses[-min(100, args.steps) :]))
    summary = _fit_summary(args, N, train.size, test.size, batch, final, seconds, result)
    out = save_model(
        args.output,
        model,
        guide,
        result.params,
        input_dim=len(names),
        standardization=s,
        feature_names=names,
        target_name=targets[0] if len(targets) == 1 else targets,
        metadata=summary,
        overwrite=args.overwrite,
    )
    print(
        f"fitted in {seconds:.1f} s ({result.seconds_per_step * 1e3:.2f} ms/step), "
        f"final loss {final:.4g}; saved {out}"
    )
    if test.size:
        loaded = load_model(out)
        _print_held_out(loaded, X, y, test, targets, args.seed)
    return 0


def _scores_text(pred, y, targets: list[str]) -> str:
    """The metrics of ``pred`` against ``y`` as one line (each column's too, for several)."""
    import numpy as np

    from numpyro_dgp import metrics
    from numpyro_dgp._predict.prediction import take_points

    y = np.asarray(y, np.float64)
    if pred.likelihood in ("bernoulli", "categorical"):
        labelled = ~np.isnan(y)  # rows without a label (--missing-targets mask) are not scored
        pred, y = take_points(pred, np.flatnonzero(labelled)), y[labelled].astype(np.int32)
    scores = metrics(pred, y)
    text = ", ".join(f"{k} {v:.4g}" for k, v in scores.items())
    if len(targets) > 1:
        columns = metrics(pred, y, per_column=True)
        text += "".join(
            f"; {name}: " + ", ".join(f"{k} {v[j]:.4g}" for k, v in columns.items())
            for j, name in enumerate(targets)
        )
    return text


def cmd_predict(args: argparse.Namespace) -> int:
    """``numpyro-dgp predict``: predict with a saved model and write a CSV, one row per input row.

    :param args: the parsed ``predict`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    :raises ValueError: a table without the model's feature columns, or a bad model directory.
    """
    import json

    from numpyro_dgp._persist.tables import (
        read_table,
    )  # NumPy only: a bad table is reported before JAX loads

    table = read_table(args.data)
    config_path = Path(args.model_dir) / "model.json"
    try:
        dtype = json.loads(config_path.read_text(encoding="utf-8")).get("dtype")
    except (OSError, ValueError, AttributeError):
        dtype = None  # load_model reports what is wrong
    _setup_precision(dtype == "float32")
    import csv

    import jax
    import numpy as np

    from numpyro_dgp import load_model

    model = load_model(args.model_dir)
    targets = model.target_names
    names = model.feature_names or [c for c in table.columns if c not in targets]
    _check_feature_columns(names, table.columns, args.data)
    X = table.data[:, [table.columns.index(n) for n in names]]
    pred = model.predict(
        X,
        rng_key=jax.random.PRNGKey(args.seed),
        num_samples=args.num_samples,
        batch_size=args.batch_size,
    )
    header, columns = _prediction_columns(pred, args.quantiles, targets)
    with open(args.output, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(np.stack(columns, axis=1).tolist())
    print(f"wrote {X.shape[0]} predictions to {args.output} ({', '.join(header)})")
    if targets and all(name in table.columns for name in targets):
        y = table.data[:, [table.columns.index(name) for name in targets]]
        y = y[:, 0] if len(targets) == 1 else y
        shown = repr(targets[0]) if len(targets) == 1 else str(targets)
        print(f"against the table's {shown}: " + _scores_text(pred, y, targets))
    return 0


def _check_feature_columns(names: list[str], columns: list[str], data: str) -> None:
    """Raise unless the table (of ``columns``) has every feature column of the model (``names``).

    :raises ValueError: naming the missing columns.
    """
    missing = [n for n in names if n not in columns]
    if missing:
        raise ValueError(
            f"{data}: the model needs the columns {missing}, which the table lacks "
            f"(it has {columns})"
        )


def _prediction_columns(pred, quantiles: list[float], targets: list[str]) -> tuple[list[str], list]:
    """The CSV's header and columns: class probabilities and the most probable class, the
    probability of ``y = 1``, or (regression, counts) the mean, standard deviation and
    quantiles of every target column."""
    import numpy as np

    from numpyro_dgp import predictive_quantiles

    mean, std = np.asarray(pred.mean), np.sqrt(np.asarray(pred.variance))
    if pred.likelihood == "categorical":
        header = [f"p{c}" for c in range(mean.shape[-1])] + ["class"]
        return header, list(mean.T) + [np.argmax(mean, axis=-1)]
    if pred.likelihood == "bernoulli":
        return ["probability", "std"], [mean, std]
    qs = np.asarray(
        predictive_quantiles(pred, np.asarray(quantiles, np.float64))
    )  # (Q, N) or (Q, N, T)
    if mean.ndim == 1:
        return ["mean", "std"] + [f"q{q:g}" for q in quantiles], [mean, std] + list(qs)
    header, columns = [], []
    for j, name in enumerate(targets or [f"y{j}" for j in range(mean.shape[1])]):
        header += [f"mean_{name}", f"std_{name}"] + [f"q{q:g}_{name}" for q in quantiles]
        columns += [mean[:, j], std[:, j]] + list(qs[..., j])
    return header, columns


def _add_demo_parser(sub) -> None:
    """Add the ``demo`` subcommand and its arguments to ``sub`` (the subparsers)."""
    demo = sub.add_parser(
        "demo", help="fit a DGP to the built-in step function and plot each layer"
    )
    demo.add_argument("--steps", type=_positive_int, default=3000)
    demo.add_argument("--seed", type=_non_negative_int, default=0)
    demo.add_argument("--output-dir", default="demo_output")
    demo.add_argument("--float32", action="store_true", help="single precision (default float64)")
    demo.set_defaults(func=cmd_demo)


def _add_uci_parser(sub) -> None:
    """Add the ``uci`` subcommand and its arguments to ``sub`` (the subparsers)."""
    uci = sub.add_parser("uci", help="DSVI on UCI regression splits")
    uci.add_argument(
        "--dataset",
        required=True,
        help="a data set folder under --data-dir (e.g. kin8nm, boston, concrete, energy, power, "
        "wine, yacht, or any other folder in the standard split layout), or the path of such a "
        "folder",
    )
    uci.add_argument("--splits", type=_parse_splits, default=[0], help="e.g. 0-4 or 0,3,7")
    uci.add_argument("--layers", type=_positive_int, default=2)
    uci.add_argument(
        "--num-inducing",
        type=_positive_int,
        default=100,
        help="M per layer (at most the number of training points)",
    )
    uci.add_argument("--steps", type=_positive_int, default=5000)
    uci.add_argument("--batch-size", type=_positive_int, default=1000)
    uci.add_argument("--lr", type=_positive_float, default=0.01, help="Adam's learning rate (> 0)")
    uci.add_argument(
        "--data-dir", default=None, help="folder holding the data sets (default: $NUMPYRO_DGP_DATA)"
    )
    uci.add_argument("--float32", action="store_true")
    uci.set_defaults(func=cmd_uci)


def _add_fit_parser(sub) -> None:
    """Add the ``fit`` subcommand and its arguments to ``sub`` (the subparsers)."""
    fit = sub.add_parser(
        "fit", help="fit a DGP to your own table (CSV with a header row, or .npz) and save it"
    )
    fit.add_argument("data", help="a CSV file with a header row, or an .npz of named columns")
    fit.add_argument(
        "--target",
        required=True,
        type=_target_list,
        help="the column to predict, or several separated by commas (one model for all); every "
        "other column is a feature",
    )
    fit.add_argument("--output", required=True, help="the model directory to write")
    fit.add_argument("--layers", type=_positive_int, default=2)
    fit.add_argument("--num-inducing", type=_positive_int, default=100, help="M per layer")
    fit.add_argument(
        "--hidden-width", type=_positive_int, default=None, help="inner-layer width (default: D)"
    )
    fit.add_argument("--steps", type=_positive_int, default=5000)
    fit.add_argument("--batch-size", type=_positive_int, default=1000)
    fit.add_argument("--lr", type=_positive_float, default=0.01, help="Adam's learning rate (> 0)")
    fit.add_argument(
        "--likelihood",
        choices=tuple(LIKELIHOODS),
        default="normal",
        help="normal or heteroscedastic (regression), student-t (robust regression), probit "
        "(target 0/1), softmax or robust-max (target 0..C-1), poisson or negative-binomial "
        "(counts)",
    )
    fit.add_argument(
        "--missing-targets",
        choices=("raise", "mask"),
        default="raise",
        help="mask: empty or NaN target cells are left out of the likelihood (default: refused)",
    )
    fit.add_argument(
        "--test-fraction",
        type=_fraction,
        default=0.0,
        help="hold out this fraction of rows (at random) and print metrics on them",
    )
    fit.add_argument("--seed", type=_non_negative_int, default=0)
    fit.add_argument("--float32", action="store_true", help="single precision (default float64)")
    fit.add_argument("--overwrite", action="store_true", help="replace an existing model directory")
    fit.add_argument("--no-progress", action="store_true", help="no progress bar")
    fit.set_defaults(func=cmd_fit)


def _add_predict_parser(sub) -> None:
    """Add the ``predict`` subcommand and its arguments to ``sub`` (the subparsers)."""
    predict = sub.add_parser("predict", help="predict with a saved model; writes a CSV")
    predict.add_argument(
        "model_dir", help="a model directory written by 'numpyro-dgp fit' or save_model"
    )
    predict.add_argument("data", help="a CSV or .npz table with the model's feature columns")
    predict.add_argument("--output", required=True, help="the CSV file to write")
    predict.add_argument(
        "--num-samples", type=_positive_int, default=100, help="mixture components"
    )
    predict.add_argument(
        "--batch-size", type=_positive_int, default=10_000, help="rows predicted at a time"
    )
    predict.add_argument(
        "--quantiles",
        type=_quantile_list,
        default=[0.025, 0.975],
        help="comma-separated levels (regression), default 0.025,0.975",
    )
    predict.add_argument("--seed", type=_non_negative_int, default=0)
    predict.set_defaults(func=cmd_predict)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``numpyro-dgp`` command, with the subcommands ``demo``,
    ``uci``, ``fit`` and ``predict``; each sets ``func`` to the function that runs it.

    :return: the parser.
    """
    parser = argparse.ArgumentParser(
        prog="numpyro-dgp", description="Deep Gaussian processes on NumPyro."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    _add_demo_parser(sub)
    _add_uci_parser(sub)
    _add_fit_parser(sub)
    _add_predict_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``numpyro-dgp`` command.

    :param argv: the arguments after the program name (default: ``sys.argv[1:]``).
    :return: the exit status: 0 on success, 2 on a ``ValueError``, ``FileNotFoundError`` or
        ``FileExistsError`` (reported on standard error).
    """
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"numpyro-dgp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
