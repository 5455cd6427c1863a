"""The arguments of the ``numpyro-dgp`` command: their types, which check each value and
report a bad one as an argument error (before JAX is imported), and the subcommands'
parsers."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def _parse_splits(text: str) -> list[int]:
    from numpyro_dgp.datasets import parse_splits  # NumPy only: before JAX loads

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


def _float_or_nan(text: str) -> float:
    """``float(text)``, or NaN for text that is no number (the checks then refuse it by name)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _positive_float(text: str) -> float:
    value = _float_or_nan(text)
    _check_positive_float(value, text)
    return value


def _check_fraction(value: float, text: str) -> None:
    """Raise unless ``value`` (parsed from ``text``; NaN: not a number) is in ``[0, 1)``.

    :raises argparse.ArgumentTypeError: otherwise.
    """
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")


def _fraction(text: str) -> float:
    value = _float_or_nan(text)
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


#: appended to an option's help: argparse fills in its default
_DEFAULT = " (default: %(default)s)"


def add_demo_parser(sub, func: Callable[[argparse.Namespace], int]) -> None:
    """Add the ``demo`` subcommand and its arguments to ``sub``; ``func`` runs it."""
    demo = sub.add_parser(
        "demo",
        help="fit a DGP to the built-in step function and plot each layer",
    )
    demo.add_argument(
        "--steps", type=_positive_int, default=3000, help="training steps per model" + _DEFAULT
    )
    demo.add_argument("--seed", type=_non_negative_int, default=0, help="random seed" + _DEFAULT)
    demo.add_argument(
        "--output-dir",
        default="demo_output",
        help="folder of the PNG (created if missing)" + _DEFAULT,
    )
    demo.add_argument("--float32", action="store_true", help="single precision (else float64)")
    demo.set_defaults(func=func)


def add_uci_parser(sub, func: Callable[[argparse.Namespace], int]) -> None:
    """Add the ``uci`` subcommand and its arguments to ``sub``; ``func`` runs it."""
    uci = sub.add_parser(
        "uci",
        help="DSVI on UCI regression splits",
    )
    uci.add_argument(
        "--dataset",
        required=True,
        help="a data set folder under --data-dir (e.g. kin8nm, boston, concrete, energy, power, "
        "wine, yacht, or any other folder in the standard split layout), or the path of such a "
        "folder",
    )
    uci.add_argument(
        "--splits", type=_parse_splits, default=[0], help="e.g. 0-4 or 0,3,7 (default: 0)"
    )
    uci.add_argument("--layers", type=_positive_int, default=2, help="GP layers" + _DEFAULT)
    uci.add_argument(
        "--num-inducing",
        type=_positive_int,
        default=100,
        help="M per layer (at most the number of training points)" + _DEFAULT,
    )
    uci.add_argument("--steps", type=_positive_int, default=5000, help="training steps" + _DEFAULT)
    uci.add_argument(
        "--batch-size", type=_positive_int, default=1000, help="minibatch size" + _DEFAULT
    )
    uci.add_argument(
        "--lr", type=_positive_float, default=0.01, help="Adam's learning rate (> 0)" + _DEFAULT
    )
    uci.add_argument(
        "--data-dir", default=None, help="folder holding the data sets (default: $NUMPYRO_DGP_DATA)"
    )
    uci.add_argument("--float32", action="store_true", help="single precision (else float64)")
    uci.set_defaults(func=func)


def add_fit_parser(sub, func: Callable[[argparse.Namespace], int]) -> None:
    """Add the ``fit`` subcommand and its arguments to ``sub``; ``func`` runs it."""
    fit = sub.add_parser(
        "fit",
        help="fit a DGP to your own table (CSV with a header row, or .npz) and save it",
    )
    fit.add_argument("data", help="a CSV file with a header row, or an .npz of named columns")
    fit.add_argument(
        "--target",
        required=True,
        type=_target_list,
        help="the column to predict, or several separated by commas (one model for all); every "
        "other column is a feature",
    )
    fit.add_argument(
        "--output",
        required=True,
        help="the model directory to write (new, or see --overwrite); checked before the fit",
    )
    fit.add_argument("--layers", type=_positive_int, default=2, help="GP layers" + _DEFAULT)
    fit.add_argument(
        "--num-inducing", type=_positive_int, default=100, help="M per layer" + _DEFAULT
    )
    fit.add_argument(
        "--hidden-width", type=_positive_int, default=None, help="inner-layer width (default: D)"
    )
    fit.add_argument("--steps", type=_positive_int, default=5000, help="training steps" + _DEFAULT)
    fit.add_argument(
        "--batch-size",
        type=_positive_int,
        default=1000,
        help="minibatch size (full batch below)" + _DEFAULT,
    )
    fit.add_argument(
        "--lr", type=_positive_float, default=0.01, help="Adam's learning rate (> 0)" + _DEFAULT
    )
    fit.add_argument(
        "--likelihood",
        choices=tuple(LIKELIHOODS),
        default="normal",
        help="normal or heteroscedastic (regression), student-t (robust regression), probit "
        "(target 0/1), softmax or robust-max (target 0..C-1), poisson or negative-binomial "
        "(counts)" + _DEFAULT,
    )
    fit.add_argument(
        "--missing-targets",
        choices=("raise", "mask"),
        default="raise",
        help="mask: empty or NaN target cells are left out of the likelihood (default: raise, "
        "refused by name)",
    )
    fit.add_argument(
        "--test-fraction",
        type=_fraction,
        default=0.0,
        help="hold out this fraction of rows (at random) and print metrics on them" + _DEFAULT,
    )
    fit.add_argument("--seed", type=_non_negative_int, default=0, help="random seed" + _DEFAULT)
    fit.add_argument("--float32", action="store_true", help="single precision (else float64)")
    fit.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing model directory written by numpyro-dgp (never a file, a "
        "folder of your own or an input)",
    )
    fit.add_argument("--no-progress", action="store_true", help="no progress bar")
    fit.set_defaults(func=func)


def add_predict_parser(sub, func: Callable[[argparse.Namespace], int]) -> None:
    """Add the ``predict`` subcommand and its arguments to ``sub``; ``func`` runs it."""
    predict = sub.add_parser(
        "predict",
        help="predict with a saved model; writes a CSV",
    )
    predict.add_argument(
        "model_dir", help="a model directory written by 'numpyro-dgp fit' or save_model"
    )
    predict.add_argument("data", help="a CSV or .npz table with the model's feature columns")
    predict.add_argument(
        "--output",
        required=True,
        help="the CSV file to write, one row per input row (its 0-based index in 'row')",
    )
    predict.add_argument(
        "--num-samples", type=_positive_int, default=100, help="mixture components" + _DEFAULT
    )
    predict.add_argument(
        "--batch-size",
        type=_positive_int,
        default=10_000,
        help="rows predicted at a time" + _DEFAULT,
    )
    predict.add_argument(
        "--quantiles",
        type=_quantile_list,
        default=[0.025, 0.975],
        help="comma-separated levels (regression; default: 0.025,0.975)",
    )
    predict.add_argument("--seed", type=_non_negative_int, default=0, help="random seed" + _DEFAULT)
    predict.add_argument(
        "--overwrite", action="store_true", help="replace an existing --output file"
    )
    predict.set_defaults(func=func)
