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
import sys
from typing import Any, Callable, Sequence

from numpyro_dgp.cli._commands import LIKELIHOODS, cmd_demo, cmd_fit, cmd_predict, cmd_uci

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


def _shared(flags: str) -> dict[str, dict[str, Any]]:
    """The options ``flags`` (separated by spaces) as :data:`_SHARED` has them."""
    return dict.fromkeys(flags.split(), {})


_DEMO: dict[str, dict[str, Any]] = {
    "--steps": dict(default=3000, help="training steps per model"),
    "--output-dir": dict(default="demo_output", help="folder of the PNG (created if missing)"),
    **_shared("--seed --float32"),
}

_UCI: dict[str, dict[str, Any]] = {
    "--dataset": dict(
        required=True,
        help="a data set folder under --data-dir (kin8nm, boston, concrete, energy, power, wine, "
        "yacht or any other in the standard split layout), or the path of such a folder",
    ),
    "--splits": dict(type=_parse_splits, default=[0], help="e.g. 0-4 or 0,3,7 (default: 0)"),
    "--num-inducing": dict(help="M per layer (at most the number of training points)"),
    "--data-dir": dict(help="folder holding the data sets (default: $NUMPYRO_DGP_DATA)"),
    **_shared("--layers --steps --batch-size --lr --float32"),
}

_FIT: dict[str, dict[str, Any]] = {
    "data": dict(help="a CSV file with a header row, or an .npz of named columns"),
    "--target": dict(
        required=True,
        metavar="COLUMN[,COLUMN...]",
        type=_target_list,
        help="the column to predict, or several separated by commas (one model for all); every "
        "other column is a feature",
    ),
    "--output": dict(
        required=True,
        metavar="MODEL_DIR",
        help="the model directory to write (new, or see --overwrite); checked before the fit",
    ),
    **_shared("--layers --num-inducing --steps --lr --seed --float32"),
    "--hidden-width": dict(type=_positive_int, help="inner-layer width (default: D)"),
    "--batch-size": dict(help="minibatch size (full batch below)"),
    "--likelihood": dict(
        choices=LIKELIHOODS,
        metavar="NAME",
        default="normal",
        help="normal or heteroscedastic (regression), student-t (robust regression), probit "
        "(target 0/1), softmax or robust-max (target 0..C-1), poisson or negative-binomial "
        "(counts)",
    ),
    "--missing-targets": dict(
        choices=("raise", "mask"),
        default="raise",
        help="mask: empty or NaN target cells are left out of the likelihood (default: raise, "
        "refused by name)",
    ),
    "--test-fraction": dict(
        type=_fraction,
        default=0.0,
        help="hold out this fraction of rows (at random) and print metrics on them",
    ),
    "--overwrite": dict(
        action="store_true",
        help="replace an existing model directory written by numpyro-dgp (never a file, a "
        "folder of your own or an input)",
    ),
    "--no-progress": dict(action="store_true", help="no progress bar"),
}

_PREDICT: dict[str, dict[str, Any]] = {
    "model_dir": dict(help="a model directory written by 'numpyro-dgp fit' or save_model"),
    "data": dict(help="a CSV or .npz table with the model's feature columns"),
    "--output": dict(
        required=True,
        metavar="CSV",
        help="the CSV file to write, one row per input row (its 0-based index in 'row')",
    ),
    "--num-samples": dict(type=_positive_int, default=100, help="mixture components"),
    "--batch-size": dict(default=10_000, help="rows predicted at a time"),
    "--quantiles": dict(
        type=_quantile_list,
        default=[0.025, 0.975],
        help="comma-separated levels (regression; default: 0.025,0.975)",
    ),
    "--seed": {},
    "--overwrite": dict(action="store_true", help="replace an existing --output file"),
}

#: subcommand -> its help, the function running it and its arguments: flag or name ->
#: ``add_argument``'s keywords (over those of the flag in :data:`_SHARED`)
_SUBCOMMANDS: dict[str, tuple[str, Callable, dict[str, dict[str, Any]]]] = {
    "demo": ("fit a DGP to the built-in step function and plot each layer", cmd_demo, _DEMO),
    "uci": ("DSVI on UCI regression splits", cmd_uci, _UCI),
    "fit": ("fit a DGP to your own table (CSV or .npz) and save it", cmd_fit, _FIT),
    "predict": ("predict with a saved model; writes a CSV", cmd_predict, _PREDICT),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``numpyro-dgp`` command, with the subcommands ``demo``,
    ``uci``, ``fit`` and ``predict``; each sets ``func`` to the function that runs it. A
    default an argument's help does not state is appended to it.

    :return: the parser.
    """
    parser = argparse.ArgumentParser(
        prog="numpyro-dgp",
        description="Deep Gaussian processes on NumPyro.",
        epilog="'numpyro-dgp COMMAND --help' lists a command's options.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, run, arguments) in _SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        for flag, own in arguments.items():
            options = {**_SHARED.get(flag, {}), **own}
            stated = "default" in options["help"] or options.get("action") == "store_true"
            if options.get("default") is not None and not stated:
                options["help"] += " (default: %(default)s)"
            command.add_argument(flag, **options)
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
