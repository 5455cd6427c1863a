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
  model (:func:`numpyro_dgp.load_model`): per row of ``DATA`` (its 0-based index in the
  ``row`` column), the predictive mean, standard deviation and quantiles of every target
  column (regression, counts), the probability of ``y = 1`` (probit) or the class
  probabilities and the most probable class (softmax, robust max), in the data's units.

Outputs are checked before any work and never written over what the command did not write:
``fit --output`` must be new, an empty folder, or (with ``--overwrite``) a model directory
this library wrote;
``predict --output`` must be a new file, or an existing file with ``--overwrite``; neither
may be one of the command's inputs or a folder of the user's. A fit that diverges (parameters
or, at its last steps, losses that are not finite) exits with status 1 and saves nothing.

Every numeric argument is checked before anything runs: counts must be positive integers,
``--lr`` a finite positive number, ``--seed`` a non-negative integer and ``--splits``
non-negative indices or increasing ranges; ``--num-inducing`` above the number of training
points is an error (not clipped). A bad value exits with status 2 and a message naming the
argument.

The commands keep JAX's compiled programs in a persistent compilation cache in the user's cache
folder (``$XDG_CACHE_HOME/numpyro_dgp/jax``, by default ``~/.cache/numpyro_dgp/jax``; set
``JAX_COMPILATION_CACHE_DIR`` to use another): a command run again on data of the same shapes
starts training without compiling.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from numpyro_dgp.cli._table import (
    CONTINUOUS,
    check_feature_columns,
    check_inducing,
    check_output_file,
    final_loss,
    fit_table,
    prediction_columns,
    print_fit_plan,
    scores_text,
    train_test_rows,
    training_arrays,
)

__all__ = ["build_parser", "main"]


def _argument(convert: Callable[[str], Any], ok: Callable[[Any], bool], must: str) -> Callable:
    """An argparse ``type``: ``convert(text)``, refused as an argument error when it fails or
    ``ok`` of its value is false."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {must}, got {text!r}")
        return value

    return parse


_positive_int = _argument(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _argument(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _argument(float, lambda v: math.isfinite(v) and v > 0, "a finite positive number")
_fraction = _argument(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
_quantile_list = _argument(
    lambda text: [float(v) for v in text.split(",") if v.strip()],
    lambda values: values and all(0 < v < 1 for v in values),
    "comma-separated numbers in (0, 1) such as 0.025,0.975",
)
_target_list = _argument(
    lambda text: [name.strip() for name in text.split(",")],
    all,
    "a column name or comma-separated names",
)


def _parse_splits(text: str) -> list[int]:
    from numpyro_dgp.datasets import parse_splits  # NumPy only: before JAX loads

    try:
        return parse_splits(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


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

#: the options several subcommands share: flag -> ``add_argument``'s keywords
_SHARED: dict[str, dict[str, Any]] = {
    "--layers": dict(type=_positive_int, default=2, help="GP layers"),
    "--num-inducing": dict(type=_positive_int, default=100, help="M per layer"),
    "--steps": dict(type=_positive_int, default=5000, help="training steps"),
    "--batch-size": dict(type=_positive_int, default=1000, help="minibatch size"),
    "--lr": dict(type=_positive_float, default=0.01, help="Adam's learning rate (> 0)"),
    "--seed": dict(type=_non_negative_int, default=0, help="random seed"),
    "--float32": dict(action="store_true", help="single precision (else float64)"),
}


def _add(parser: argparse.ArgumentParser, *flags: str, **options: Any) -> None:
    """Add an argument: a shared one of :data:`_SHARED` (``options`` override its keywords) or
    a new one; a default its help does not state is appended to it."""
    options = {**_SHARED.get(flags[0], {}), **options}
    stated = "default" in options["help"] or options.get("action") == "store_true"
    if options.get("default") is not None and not stated:
        options["help"] += " (default: %(default)s)"
    parser.add_argument(*flags, **options)


def _add_demo(demo: argparse.ArgumentParser) -> None:
    """The arguments of ``demo``."""
    _add(demo, "--steps", default=3000, help="training steps per model")
    _add(demo, "--seed")
    _add(demo, "--output-dir", default="demo_output", help="folder of the PNG (created if missing)")
    _add(demo, "--float32")


def _add_uci(uci: argparse.ArgumentParser) -> None:
    """The arguments of ``uci``."""
    _add(
        uci,
        "--dataset",
        required=True,
        help="a data set folder under --data-dir (e.g. kin8nm, boston, concrete, energy, power, "
        "wine, yacht, or any other folder in the standard split layout), or the path of such a "
        "folder",
    )
    _add(uci, "--splits", type=_parse_splits, default=[0], help="e.g. 0-4 or 0,3,7 (default: 0)")
    _add(uci, "--layers")
    _add(uci, "--num-inducing", help="M per layer (at most the number of training points)")
    for flag in ("--steps", "--batch-size", "--lr"):
        _add(uci, flag)
    _add(uci, "--data-dir", help="folder holding the data sets (default: $NUMPYRO_DGP_DATA)")
    _add(uci, "--float32")


def _add_fit(fit: argparse.ArgumentParser) -> None:
    """The arguments of ``fit``."""
    _add(fit, "data", help="a CSV file with a header row, or an .npz of named columns")
    _add(
        fit,
        "--target",
        required=True,
        metavar="COLUMN[,COLUMN...]",
        type=_target_list,
        help="the column to predict, or several separated by commas (one model for all); every "
        "other column is a feature",
    )
    _add(
        fit,
        "--output",
        required=True,
        metavar="MODEL_DIR",
        help="the model directory to write (new, or see --overwrite); checked before the fit",
    )
    _add(fit, "--layers")
    _add(fit, "--num-inducing")
    _add(fit, "--hidden-width", type=_positive_int, help="inner-layer width (default: D)")
    _add(fit, "--steps")
    _add(fit, "--batch-size", help="minibatch size (full batch below)")
    _add(fit, "--lr")
    _add(
        fit,
        "--likelihood",
        choices=tuple(LIKELIHOODS),
        metavar="NAME",
        default="normal",
        help="normal or heteroscedastic (regression), student-t (robust regression), probit "
        "(target 0/1), softmax or robust-max (target 0..C-1), poisson or negative-binomial "
        "(counts)",
    )
    _add(
        fit,
        "--missing-targets",
        choices=("raise", "mask"),
        default="raise",
        help="mask: empty or NaN target cells are left out of the likelihood (default: raise, "
        "refused by name)",
    )
    _add(
        fit,
        "--test-fraction",
        type=_fraction,
        default=0.0,
        help="hold out this fraction of rows (at random) and print metrics on them",
    )
    _add(fit, "--seed")
    _add(fit, "--float32")
    _add(
        fit,
        "--overwrite",
        action="store_true",
        help="replace an existing model directory written by numpyro-dgp (never a file, a "
        "folder of your own or an input)",
    )
    _add(fit, "--no-progress", action="store_true", help="no progress bar")


def _add_predict(predict: argparse.ArgumentParser) -> None:
    """The arguments of ``predict``."""
    _add(predict, "model_dir", help="a model directory written by 'numpyro-dgp fit' or save_model")
    _add(predict, "data", help="a CSV or .npz table with the model's feature columns")
    _add(
        predict,
        "--output",
        required=True,
        metavar="CSV",
        help="the CSV file to write, one row per input row (its 0-based index in 'row')",
    )
    _add(predict, "--num-samples", type=_positive_int, default=100, help="mixture components")
    _add(predict, "--batch-size", default=10_000, help="rows predicted at a time")
    _add(
        predict,
        "--quantiles",
        type=_quantile_list,
        default=[0.025, 0.975],
        help="comma-separated levels (regression; default: 0.025,0.975)",
    )
    _add(predict, "--seed")
    _add(predict, "--overwrite", action="store_true", help="replace an existing --output file")


def _setup_jax(float32: bool) -> None:
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


def cmd_demo(args: argparse.Namespace) -> int:
    """``numpyro-dgp demo``: fit a 2-layer DGP and an SVGP to the step function, print a table
    of their ELBOs and test metrics and write a PNG of the DGP's layer samples.

    :param args: the parsed ``demo`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    """
    _setup_jax(args.float32)
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
    from numpyro_dgp.datasets import num_uci_splits

    available = num_uci_splits(dataset, data_dir)
    bad = [s for s in splits if not 0 <= s < available]
    if bad:
        raise SystemExit(f"--splits: {dataset} has splits 0..{available - 1}; got {bad}")


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
    _setup_jax(args.float32)
    from numpyro_dgp.datasets import load_uci
    from numpyro_dgp.recipes import mean_and_standard_error, run_uci

    data = load_uci(
        args.dataset, args.splits[0], data_dir=args.data_dir
    )  # fails early on bad files
    name = data.name
    where = f"training points of {name} (split {args.splits[0]})"
    check_inducing(args.num_inducing, data.X_train.shape[0], where)
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


def cmd_fit(args: argparse.Namespace) -> int:
    """``numpyro-dgp fit``: fit a DSVI DGP to a table and save it as a model directory.

    :param args: the parsed ``fit`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    :raises ValueError: a bad table, target or size (the message names it).
    """
    import time

    from numpyro_dgp._persist import check_model_output

    # NumPy only: the output path and the table are checked before JAX loads or anything runs
    check_model_output(Path(args.output), args.overwrite, "--output", "--overwrite", (args.data,))
    targets = args.target
    masked = args.missing_targets == "mask"
    likelihood = LIKELIHOODS[args.likelihood]
    X, y, names, num_classes = fit_table(args, likelihood, targets, masked)
    N = X.shape[0]
    train, test = train_test_rows(N, args.seed, args.test_fraction)

    _setup_jax(args.float32)
    import jax
    import jax.numpy as jnp

    from numpyro_dgp import Standardization, load_model, save_model
    from numpyro_dgp.models import deep_gp_regression
    from numpyro_dgp.recipes import fit_factorized

    continuous = likelihood in CONTINUOUS
    s = Standardization.fit(X[train], y[train] if continuous else None)
    dtype = jnp.float32 if args.float32 else jnp.float64
    X_train, y_train = training_arrays(s, X, y, train, dtype, continuous, masked)
    batch = args.batch_size if args.batch_size < train.size else None
    check_inducing(args.num_inducing, train.size, "points of the training rows")
    print_fit_plan(args, N, names, num_classes, train.size, test.size, batch, dtype)
    model = deep_gp_regression(
        args.layers,
        num_inducing=args.num_inducing,
        hidden_width=args.hidden_width,
        likelihood=likelihood,
        num_outputs=len(targets),
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
        "rows": int(N),
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
        target_name=targets[0] if len(targets) == 1 else targets,
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
        print("held-out: " + scores_text(pred, y[test], targets))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """``numpyro-dgp predict``: predict with a saved model and write a CSV, one row per input row.

    :param args: the parsed ``predict`` arguments (see :func:`build_parser`).
    :return: the exit status, 0.
    :raises ValueError: a table without the model's feature columns, or a bad model directory.
    """
    # NumPy only: a bad output path, table or model.json is reported before JAX loads
    from numpyro_dgp._persist import check_model_directory, read_config, read_table

    check_output_file(Path(args.output), args.overwrite, (args.data, args.model_dir))
    table = read_table(args.data)
    config = read_config(check_model_directory(args.model_dir))
    target = config.get("target_name")
    targets = [] if target is None else [target] if isinstance(target, str) else list(target)
    names = config.get("feature_names") or [c for c in table.columns if c not in targets]
    check_feature_columns(names, table.columns, args.data, config.get("input_dim"))
    _setup_jax(config.get("dtype") == "float32")
    import csv

    import jax
    import numpy as np

    from numpyro_dgp import load_model
    from numpyro_dgp._persist import write_atomically

    model = load_model(args.model_dir)
    X = table.data[:, [table.columns.index(n) for n in names]]
    pred = model.predict(
        X,
        rng_key=jax.random.PRNGKey(args.seed),
        num_samples=args.num_samples,
        batch_size=args.batch_size,
    )
    header, columns = prediction_columns(pred, args.quantiles, targets)
    rows = np.stack(columns, axis=1).tolist()
    write_atomically(
        Path(args.output),
        lambda f: csv.writer(f).writerows(
            [["row"] + header] + [[i] + r for i, r in enumerate(rows)]
        ),
    )
    print(f"wrote {X.shape[0]} predictions to {args.output} (row, {', '.join(header)})")
    if targets and all(name in table.columns for name in targets):
        y = table.data[:, [table.columns.index(name) for name in targets]]
        y = y[:, 0] if len(targets) == 1 else y
        shown = repr(targets[0]) if len(targets) == 1 else str(targets)
        print(f"against the table's {shown}: " + scores_text(pred, y, targets))
    return 0


#: subcommand -> its help, the function adding its arguments and the function running it
_SUBCOMMANDS = {
    "demo": ("fit a DGP to the built-in step function and plot each layer", _add_demo, cmd_demo),
    "uci": ("DSVI on UCI regression splits", _add_uci, cmd_uci),
    "fit": (
        "fit a DGP to your own table (CSV with a header row, or .npz) and save it",
        _add_fit,
        cmd_fit,
    ),
    "predict": ("predict with a saved model; writes a CSV", _add_predict, cmd_predict),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``numpyro-dgp`` command, with the subcommands ``demo``,
    ``uci``, ``fit`` and ``predict``; each sets ``func`` to the function that runs it.

    :return: the parser.
    """
    parser = argparse.ArgumentParser(
        prog="numpyro-dgp",
        description="Deep Gaussian processes on NumPyro.",
        epilog="'numpyro-dgp COMMAND --help' lists a command's options.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, run) in _SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        add_arguments(command)
        command.set_defaults(func=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``numpyro-dgp`` command.

    :param argv: the arguments after the program name (default: ``sys.argv[1:]``).
    :return: the exit status: 0 on success; 1 when a fit diverged (nothing saved); 2 on a bad
        argument, table or path (``ValueError``, ``OSError``: reported on standard error before
        any work where it can be known then).
    """
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FloatingPointError as err:
        lr = f" with --lr {args.lr:g}" if hasattr(args, "lr") else ""
        print(
            f"numpyro-dgp: error: the fit diverged{lr}; nothing was saved. {err}", file=sys.stderr
        )
        return 1
    except (ValueError, OSError) as err:
        print(f"numpyro-dgp: error: {err}", file=sys.stderr)
        return 2
