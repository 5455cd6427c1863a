"""The table and target checks of ``numpyro-dgp fit`` and ``predict``, and the helpers of
their tables: reading and splitting the rows, the fit's plan and record, the scores and
the prediction columns (NumPy, and JAX only inside the functions that need it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NumPy is imported where it is used: the command's start stays light
    import numpy as np

CONTINUOUS = ("gaussian", "student_t", "heteroscedastic")


def check_output_file(path: Path, overwrite: bool, inputs: tuple) -> None:
    """Raise unless ``predict --output`` can be written at ``path`` (before any work): no input of
    the command (the table, the model directory or a file in it), no folder, its parent a
    writable directory, and new unless ``overwrite``.

    :raises FileExistsError: an input, a folder, or an existing file without ``--overwrite``.
    :raises FileNotFoundError: the parent directory does not exist.
    :raises PermissionError: it is not writable.
    """
    from numpyro_dgp._persist import check_output_place

    shown = f"--output {str(path)!r}"
    check_output_place(path, shown, inputs)
    if path.is_dir():
        raise FileExistsError(f"{shown} is a folder; give the path of a CSV file to write")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{shown} exists; pass --overwrite to replace that file")


def _check_target_values(y: np.ndarray, likelihood: str, targets: list[str]) -> int | None:
    """Refuse targets the likelihood cannot take (NumPy only, before JAX loads); return the
    number of classes for ``softmax`` / ``robust_max``."""
    import numpy as np

    values = y[~np.isnan(y)]
    distinct = np.unique(values).tolist()
    held = f"{distinct[:6]}{' ...' if len(distinct) > 6 else ''}"
    option = f"--likelihood {likelihood.replace('_', '-')}"
    integers = not np.any(values < 0) and bool(np.all(values == np.round(values)))
    if likelihood == "probit" and not set(distinct) <= {0.0, 1.0}:
        raise ValueError(f"{option} needs a target of 0s and 1s; {targets[0]!r} holds {held}")
    if likelihood in ("poisson", "negative_binomial") and not integers:
        raise ValueError(f"{option} needs non-negative integer counts; {targets} hold {held}")
    if likelihood not in ("softmax", "robust_max"):
        return None
    if values.size == 0 or not integers:
        raise ValueError(f"{option} needs class labels 0, 1, ..., C-1; {targets[0]!r} holds {held}")
    if values.max() < 1:
        raise ValueError(f"{option} needs at least two classes; {targets[0]!r} holds only {held}")
    return int(values.max()) + 1


def check_inducing(num_inducing: int, num_train: int, where: str) -> None:
    """Raise if ``--num-inducing`` exceeds the ``num_train`` training points (``where`` names
    them): a sparse GP with more inducing points than data. A minibatch smaller than ``M`` is
    fine: the layers then start from the batch's points and draws around them, see
    :func:`numpyro_dgp.gp_layer`.

    :raises ValueError: otherwise.
    """
    if num_inducing > num_train:
        raise ValueError(
            f"--num-inducing {num_inducing} exceeds the {num_train} {where}; pass "
            f"--num-inducing {num_train} or fewer"
        )


def fit_table(
    args: argparse.Namespace, likelihood: str, targets: list[str], masked: bool
) -> tuple[np.ndarray, np.ndarray, list[str], int | None]:
    """``(X, y, feature names, number of classes)`` of ``fit``'s table, its targets checked
    against the likelihood (NumPy only: a bad table is reported before JAX loads)."""
    import numpy as np

    from numpyro_dgp._persist import read_table  # NumPy only: before JAX loads

    if len(targets) > 1 and likelihood in ("probit", "softmax", "robust_max"):
        raise ValueError(
            f"--likelihood {args.likelihood} takes one --target column of labels, got {targets}"
        )
    table = read_table(args.data, allow_missing=targets)
    X, y, names = table.split(targets[0] if len(targets) == 1 else targets)
    assert y is not None  # a target was named
    gaps = [name for j, name in enumerate(targets) if np.isnan(y.reshape(len(y), -1)[:, j]).any()]
    if gaps and not masked:
        raise ValueError(
            f"{args.data}: target column(s) {gaps} have missing values; pass --missing-targets "
            "mask to leave them out of the likelihood"
        )
    num_classes = _check_target_values(y, likelihood, targets)
    return X, y, names, num_classes


def train_test_rows(N: int, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` row indices: ``--test-fraction`` of the ``N`` rows held out at random."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(N)
    num_test = int(round(test_fraction * N))
    test, train = order[:num_test], order[num_test:]
    if train.size < 2:
        raise ValueError(
            f"--test-fraction {test_fraction} leaves {train.size} training rows of {N}"
        )
    return train, test


def training_arrays(
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


def print_fit_plan(
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


def final_loss(losses: np.ndarray, num_skipped: int) -> float:
    """The mean loss of the last 100 steps (those that were finite).

    :raises FloatingPointError: no step among them had a finite loss: the parameters are finite
        but no step can evaluate the model at them (a kernel variance of 0, say).
    """
    import numpy as np

    last = losses[-100:]
    finite = last[np.isfinite(last)]
    if not finite.size:
        since = np.flatnonzero(np.isfinite(losses))
        start = since[-1] + 2 if since.size else 1
        raise FloatingPointError(
            f"fit: the fit diverged at step {start}: its loss was not finite from there on "
            f"({num_skipped} of {losses.size} updates skipped)"
        )
    return float(finite.mean())


def scores_text(pred, y, targets: list[str]) -> str:
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


def check_feature_columns(
    names: list[str], columns: list[str], data: str, input_dim: int | None = None
) -> None:
    """Raise unless the table (of ``columns``) has every feature column of the model (``names``)
    and, for a model saved without feature names (then every column but the targets is one),
    ``input_dim`` of them.

    :raises ValueError: naming the missing columns, or the count.
    """
    missing = [n for n in names if n not in columns]
    if missing:
        raise ValueError(
            f"{data}: the model needs the columns {missing}, which the table lacks "
            f"(it has {columns})"
        )
    if isinstance(input_dim, int) and len(names) != input_dim:
        raise ValueError(
            f"{data}: the model takes {input_dim} feature columns; the table has {len(names)} "
            f"besides its targets ({names})"
        )


def prediction_columns(pred, quantiles: list[float], targets: list[str]) -> tuple[list[str], list]:
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
