"""The subcommands of ``numpyro-dgp`` (``demo``, ``uci``, ``fit``, ``predict``) and the
helpers of ``fit``'s and ``predict``'s tables: reading, checking and splitting the rows, the
fit's plan and record, the scores and the prediction columns. NumPy, JAX and the library are
imported inside the functions that need them: the command's start and its argument errors
stay light."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


#: ``--likelihood``'s choices: the factories' likelihoods
#: (:data:`numpyro_dgp.models.LIKELIHOODS`) with ``-`` for ``_`` and ``normal`` for ``gaussian``
LIKELIHOODS = (
    "normal probit softmax robust-max student-t poisson negative-binomial heteroscedastic"
).split()


def setup_jax(float32: bool) -> None:
    """JAX's precision, and its persistent compilation cache in the user's cache folder
    (``$XDG_CACHE_HOME/numpyro_dgp/jax``, by default ``~/.cache/numpyro_dgp/jax``) unless
    ``JAX_COMPILATION_CACHE_DIR`` names another: a command run again with data of the same
    shapes compiles nothing."""
    import jax

    if not float32:
        jax.config.update("jax_enable_x64", True)
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        jax.config.update("jax_compilation_cache_dir", os.path.join(base, "numpyro_dgp", "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def plan(args: argparse.Namespace, batch: int | None) -> str:
    """The fit's plan as the commands print it: layers, ``M``, steps and the minibatch."""
    batches = f"batch {batch}" if batch else "full batch"
    return f"{args.layers}-layer DSVI DGP, M={args.num_inducing}, {args.steps} steps, {batches}"


def cmd_demo(args: argparse.Namespace) -> int:
    """``numpyro-dgp demo``: fit a 2-layer DGP and an SVGP to the step function, print a table
    of their ELBOs and test metrics and write a PNG of the DGP's layer samples.

    :param args: the parsed ``demo`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    """
    setup_jax(args.float32)
    import jax
    import matplotlib

    matplotlib.use("Agg")  # the command writes files; no display needed

    from numpyro_dgp.recipes import run_demo

    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "demo_step_function.png"
    print(f"Fitting a 2-layer DGP and an SVGP to the step function ({args.steps} steps each)...")
    runs = run_demo(jax.random.PRNGKey(args.seed), num_steps=args.steps, output=png)
    print()
    print(f"{'model':<14} {'final ELBO':>11} {'test LL':>9} {'RMSE':>8} {'CRPS':>8} {'ms/step':>8}")
    for label, name in (("dgp", "DGP (2 layers)"), ("svgp", "SVGP (1 layer)")):
        r = runs[label]
        print(
            f"{name:<14} {r.final_elbo:>11.2f} {r.metrics['log_likelihood']:>9.3f} "
            f"{r.metrics['rmse']:>8.4f} {r.metrics['crps']:>8.4f} {r.seconds_per_step * 1e3:>8.2f}"
        )
    print(f"\nwrote {png}")
    return 0


def cmd_uci(args: argparse.Namespace) -> int:
    """``numpyro-dgp uci``: DSVI on the chosen UCI splits; prints per-split test
    log-likelihood, RMSE and CRPS, then their mean and standard error.

    :param args: the parsed ``uci`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    :raises SystemExit: a split index the data set does not have.
    :raises ValueError: ``--num-inducing`` above the number of training points.
    """
    from numpyro_dgp.datasets import load_uci, num_uci_splits

    # the data directory, the data set and the splits are checked before JAX is imported
    available = num_uci_splits(args.dataset, args.data_dir)
    bad = [s for s in args.splits if not 0 <= s < available]
    if bad:
        raise SystemExit(f"--splits: {args.dataset} has splits 0..{available - 1}; got {bad}")
    data = load_uci(args.dataset, args.splits[0], data_dir=args.data_dir)  # bad files fail early
    where = f"training points of {data.name} (split {args.splits[0]})"
    check_inducing(args.num_inducing, data.X_train.shape[0], where)
    setup_jax(args.float32)
    from numpyro_dgp.recipes import mean_and_standard_error, run_uci

    print(f"{data.name}: {plan(args, args.batch_size)}")
    print(f"{'split':>5} {'test LL':>9} {'RMSE':>9} {'CRPS':>9} {'ms/step':>8} {'seconds':>8}")
    options = dict(
        data_dir=args.data_dir,
        num_layers=args.layers,
        num_inducing=args.num_inducing,
        num_steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.lr,
    )
    scores = []
    for split in args.splits:
        r = run_uci(args.dataset, split, **options)
        scores.append(r.metrics)
        print(
            f"{split:>5} {r.metrics['log_likelihood']:>9.4f} {r.metrics['rmse']:>9.4g} "
            f"{r.metrics['crps']:>9.4g} {r.seconds_per_step * 1e3:>8.2f} {r.total_seconds:>8.1f}",
            flush=True,
        )
    ll, ll_se = mean_and_standard_error([m["log_likelihood"] for m in scores])
    rm, rm_se = mean_and_standard_error([m["rmse"] for m in scores])
    print(f"{'mean':>5} {ll:>9.4f} {rm:>9.4g}")
    print(f"{'s.e.':>5} {ll_se:>9.4f} {rm_se:>9.4g}")
    return 0


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
    args: argparse.Namespace, likelihood: str
) -> tuple[np.ndarray, np.ndarray, list[str], int | None, np.ndarray, np.ndarray]:
    """``(X, y, feature names, number of classes, training rows, test rows)`` of ``fit``'s
    table, checked (its targets against the likelihood, ``--num-inducing`` against the training
    rows) and its sizes printed; ``--test-fraction`` of the rows are held out at random. NumPy
    only: a bad table is reported before JAX loads."""
    import numpy as np

    from numpyro_dgp.datasets import read_table

    targets = args.target
    if len(targets) > 1 and likelihood in ("probit", "softmax", "robust_max"):
        raise ValueError(
            f"--likelihood {args.likelihood} takes one --target column of labels, got {targets}"
        )
    table = read_table(args.data, allow_missing=targets)
    target = targets[0] if len(targets) == 1 else targets
    X, y, names = table.split(target)
    assert y is not None  # a target was named
    gaps = [name for name, gap in zip(targets, np.isnan(y.reshape(len(y), -1)).any(0)) if gap]
    if gaps and args.missing_targets != "mask":
        raise ValueError(
            f"{args.data}: target column(s) {gaps} have missing values; pass --missing-targets "
            "mask to leave them out of the likelihood"
        )
    num_classes = _check_target_values(y, likelihood, targets)
    N = X.shape[0]
    order = np.random.default_rng(args.seed).permutation(N)
    num_test = int(round(args.test_fraction * N))
    test, train = order[:num_test], order[num_test:]
    if train.size < 2:
        raise ValueError(
            f"--test-fraction {args.test_fraction} leaves {train.size} training rows of {N}"
        )
    check_inducing(args.num_inducing, train.size, "points of the training rows")
    print(
        f"{args.data}: {N} rows, {len(names)} features, target {target!r} ({args.likelihood}"
        f"{f', {num_classes} classes' if num_classes else ''}); {train.size} training, "
        f"{test.size} test rows"
    )
    return X, y, names, num_classes, train, test


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
    # (Q, N) or (Q, N, T)
    qs = np.asarray(predictive_quantiles(pred, np.asarray(quantiles, np.float64)))
    if mean.ndim == 1:
        return ["mean", "std"] + [f"q{q:g}" for q in quantiles], [mean, std] + list(qs)
    header, columns = [], []
    for j, name in enumerate(targets or [f"y{j}" for j in range(mean.shape[1])]):
        header += [f"mean_{name}", f"std_{name}"] + [f"q{q:g}_{name}" for q in quantiles]
        columns += [mean[:, j], std[:, j]] + list(qs[..., j])
    return header, columns


def cmd_fit(args: argparse.Namespace) -> int:
    """``numpyro-dgp fit``: fit a DSVI DGP to a table and save it as a model directory.

    :param args: the parsed ``fit`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    :raises ValueError: a bad table, target or size (the message names it).
    """
    import time

    from numpyro_dgp._saved_model import check_model_output

    # NumPy only: the output path and the table are checked before JAX loads or anything runs
    check_model_output(Path(args.output), args.overwrite, "--output", "--overwrite", (args.data,))
    likelihood = "gaussian" if args.likelihood == "normal" else args.likelihood.replace("-", "_")
    X, y, names, num_classes, train, test = fit_table(args, likelihood)

    setup_jax(args.float32)
    import jax
    import jax.numpy as jnp

    from numpyro_dgp import Standardization, load_model, save_model
    from numpyro_dgp.models import deep_gp_regression
    from numpyro_dgp.recipes import fit_factorized

    continuous = likelihood in ("gaussian", "student_t", "heteroscedastic")
    y_float = continuous or args.missing_targets == "mask"
    s = Standardization.fit(X[train], y[train] if continuous else None)
    dtype = jnp.float32 if args.float32 else jnp.float64
    X_train = jnp.asarray(s.inputs(X[train]), dtype)
    # labels and counts as integers, unless missing ones (NaN) are masked
    y_train = jnp.asarray(s.targets(y[train]), dtype if y_float else jnp.int32)
    batch = args.batch_size if args.batch_size < train.size else None
    print(
        f"{plan(args, batch)}, {jnp.dtype(dtype).name}; inducing inputs by k-means on "
        f"{'one minibatch of ' + str(batch) if batch else str(min(train.size, 100_000))} points"
    )
    model = deep_gp_regression(
        args.layers,
        num_inducing=args.num_inducing,
        hidden_width=args.hidden_width,
        likelihood=likelihood,
        num_outputs=len(args.target),
        num_classes=num_classes,
        missing_targets=args.missing_targets,
    )
    start = time.perf_counter()
    _, guide, result = fit_factorized(
        model,
        jax.random.PRNGKey(args.seed),
        X_train,
        y_train,
        num_steps=args.steps,
        batch_size=batch,
        learning_rate=args.lr,
        progress_bar=not args.no_progress,
        chunk_size=100,
    )
    seconds = time.perf_counter() - start
    final = final_loss(result.losses, result.num_skipped)
    summary = {
        "rows": int(X.shape[0]),
        "train_rows": int(train.size),
        "test_rows": int(test.size),
        "steps": args.steps,
        "batch_size": batch,
        "seed": args.seed,
        "final_loss": final,
        "fit_seconds": seconds,
        "skipped_steps": int(result.num_skipped),
    }
    out = save_model(
        args.output,
        model,
        guide,
        result.params,
        input_dim=len(names),
        standardization=s,
        feature_names=names,
        target_name=args.target[0] if len(args.target) == 1 else args.target,
        metadata=summary,
        overwrite=args.overwrite,
    )
    print(
        f"fitted in {seconds:.1f} s ({result.seconds_per_step * 1e3:.2f} ms/step), "
        f"final loss {final:.4g}; saved {out}"
    )
    if test.size:  # the saved model, loaded again, on the held-out rows
        key = jax.random.PRNGKey(args.seed + 1)
        pred = load_model(out).predict(X[test], rng_key=key, batch_size=10_000)
        print("held-out: " + scores_text(pred, y[test], args.target))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """``numpyro-dgp predict``: predict with a saved model and write a CSV, one row per input row.

    Checked before any work (NumPy only: before JAX loads): ``--output`` no input of the
    command (the table, the model directory or a file in it), no folder, in a writable
    directory and new unless ``--overwrite``; the model directory's ``model.json``; the table
    holding every feature column of the model (for a model saved without feature names: every
    column but the targets).

    :param args: the parsed ``predict`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    :raises FileExistsError: ``--output`` an input, a folder, or an existing file without
        ``--overwrite``.
    :raises FileNotFoundError: its directory, the table or the model directory does not exist.
    :raises PermissionError: its directory is not writable.
    :raises ValueError: a bad table or model directory, or missing feature columns.
    """
    from numpyro_dgp._saved_model import check_model_directory, check_output_place, read_config
    from numpyro_dgp.datasets import read_table
    from numpyro_dgp.io import write_atomically

    path = Path(args.output)
    shown = f"--output {str(path)!r}"
    check_output_place(path, shown, (args.data, args.model_dir))
    if path.is_dir():
        raise FileExistsError(f"{shown} is a folder; give the path of a CSV file to write")
    if path.exists() and not args.overwrite:
        raise FileExistsError(f"{shown} exists; pass --overwrite to replace that file")
    table = read_table(args.data)
    config = read_config(check_model_directory(args.model_dir))
    target = config.get("target_name")
    targets = [] if target is None else [target] if isinstance(target, str) else list(target)
    names = config.get("feature_names") or [c for c in table.columns if c not in targets]
    missing = [n for n in names if n not in table.columns]
    if missing:
        raise ValueError(
            f"{args.data}: the model needs the columns {missing}, which the table lacks "
            f"(it has {table.columns})"
        )

    setup_jax(config.get("dtype") == "float32")
    import csv

    import jax
    import numpy as np

    from numpyro_dgp import load_model

    X = table.data[:, [table.columns.index(n) for n in names]]
    pred = load_model(args.model_dir).predict(
        X,
        rng_key=jax.random.PRNGKey(args.seed),
        num_samples=args.num_samples,
        batch_size=args.batch_size,
    )
    header, columns = prediction_columns(pred, args.quantiles, targets)
    values = np.stack(columns, axis=1).tolist()
    rows = [["row"] + header] + [[i] + r for i, r in enumerate(values)]
    write_atomically(path, lambda f: csv.writer(f).writerows(rows))
    print(f"wrote {X.shape[0]} predictions to {args.output} (row, {', '.join(header)})")
    if targets and all(name in table.columns for name in targets):
        target = targets[0] if len(targets) == 1 else targets
        _, y, _ = table.split(target)
        print(f"against the table's {target!r}: " + scores_text(pred, y, targets))
    return 0
