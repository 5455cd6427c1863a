"""The ``numpyro-dgp`` command.

* ``numpyro-dgp demo`` -- fit a 2-layer DGP and a 1-layer SVGP to the built-in step
  function, print the ELBO and test metrics, write a PNG of each layer's samples.
* ``numpyro-dgp uci --dataset NAME --splits 0-4 ...`` -- DSVI on UCI splits; prints a table
  of test log-likelihood and RMSE (mean and standard error over splits).

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
from typing import Sequence

__all__ = ["build_parser", "main"]


def _parse_splits(text: str) -> list[int]:
    from numpyro_dgp.datasets import parse_splits

    try:
        return parse_splits(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _integer(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _integer(text, 1)


def _non_negative_int(text: str) -> int:
    return _integer(text, 0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite positive number, got {text!r}")
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
    print(f"Fitting a 2-layer DGP and a 1-layer SVGP to the step function ({args.steps} steps each)...")
    runs = run_demo(jax.random.PRNGKey(args.seed), num_steps=args.steps, output=png)
    print()
    print(f"{'model':<14} {'final ELBO':>11} {'test LL':>9} {'RMSE':>8} {'CRPS':>8} {'ms/step':>8}")
    for label, name in (("dgp", "DGP (2 layers)"), ("svgp", "SVGP (1 layer)")):
        r = runs[label]
        print(f"{name:<14} {r.final_elbo:>11.2f} {r.metrics['log_likelihood']:>9.3f} {r.metrics['rmse']:>8.4f} "
              f"{r.metrics['crps']:>8.4f} {r.seconds_per_step * 1e3:>8.2f}")
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
    _setup_precision(args.float32)
    from numpyro_dgp.datasets import load_uci, num_uci_splits
    from numpyro_dgp.recipes import mean_and_standard_error, run_uci

    available = num_uci_splits(args.dataset, args.data_dir)
    bad = [s for s in args.splits if not 0 <= s < available]
    if bad:
        raise SystemExit(f"--splits: {args.dataset} has splits 0..{available - 1}; got {bad}")
    data = load_uci(args.dataset, args.splits[0], data_dir=args.data_dir)  # fails early on bad files
    name, num_train = data.name, data.X_train.shape[0]
    if args.num_inducing > num_train:
        raise ValueError(f"--num-inducing {args.num_inducing} exceeds the {num_train} training points of {name} "
                         f"(split {args.splits[0]}); pass --num-inducing {num_train} or fewer")
    print(f"{name}: {args.layers}-layer DSVI DGP, M={args.num_inducing}, {args.steps} steps, batch {args.batch_size}")
    print(f"{'split':>5} {'test LL':>9} {'RMSE':>9} {'CRPS':>9} {'ms/step':>8} {'seconds':>8}")
    lls, rmses = [], []
    for split in args.splits:
        r = run_uci(args.dataset, split, data_dir=args.data_dir, num_layers=args.layers, num_inducing=args.num_inducing,
                    num_steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr)
        lls.append(r.metrics["log_likelihood"])
        rmses.append(r.metrics["rmse"])
        print(f"{split:>5} {lls[-1]:>9.4f} {rmses[-1]:>9.4g} {r.metrics['crps']:>9.4g} "
              f"{r.seconds_per_step * 1e3:>8.2f} {r.total_seconds:>8.1f}", flush=True)

    (ll, ll_se), (rm, rm_se) = mean_and_standard_error(lls), mean_and_standard_error(rmses)
    print(f"{'mean':>5} {ll:>9.4f} {rm:>9.4g}")
    print(f"{'s.e.':>5} {ll_se:>9.4f} {rm_se:>9.4g}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``numpyro-dgp`` command, with the subcommands ``demo`` and
    ``uci``; each sets ``func`` to the function that runs it.

    :return: the parser.
    """
    parser = argparse.ArgumentParser(prog="numpyro-dgp", description="Deep Gaussian processes on NumPyro.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="fit a DGP to the built-in step function and plot each layer")
    demo.add_argument("--steps", type=_positive_int, default=3000)
    demo.add_argument("--seed", type=_non_negative_int, default=0)
    demo.add_argument("--output-dir", default="demo_output")
    demo.add_argument("--float32", action="store_true", help="single precision (default float64)")
    demo.set_defaults(func=cmd_demo)

    uci = sub.add_parser("uci", help="DSVI on UCI regression splits")
    uci.add_argument("--dataset", required=True,
                     help="a data set folder under --data-dir (e.g. kin8nm, boston, concrete, energy, power, wine, "
                          "yacht, or any other folder in the standard split layout), or the path of such a folder")
    uci.add_argument("--splits", type=_parse_splits, default=[0], help="e.g. 0-4 or 0,3,7")
    uci.add_argument("--layers", type=_positive_int, default=2)
    uci.add_argument("--num-inducing", type=_positive_int, default=100,
                     help="M per layer (at most the number of training points)")
    uci.add_argument("--steps", type=_positive_int, default=5000)
    uci.add_argument("--batch-size", type=_positive_int, default=1000)
    uci.add_argument("--lr", type=_positive_float, default=0.01, help="Adam's learning rate (> 0)")
    uci.add_argument("--data-dir", default=None, help="folder holding the data sets (default: $NUMPYRO_DGP_DATA)")
    uci.add_argument("--float32", action="store_true")
    uci.set_defaults(func=cmd_uci)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``numpyro-dgp`` command.

    :param argv: the arguments after the program name (default: ``sys.argv[1:]``).
    :return: the exit status: 0 on success, 2 on a ``ValueError`` or ``FileNotFoundError``
        (reported on standard error).
    """
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"numpyro-dgp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
