"""Converged MCMC ground truth for a 2-layer DGP on UCI subsets, and DSVI against it layer by layer.

For each ``--sizes`` N: the first N training rows of split ``--split`` in a fixed random order,
and the first ``--num-held-out`` test inputs. A 2-layer DGP is fitted by DSVI on those N rows
(``recipes.fit_dsvi``: ARD RBF, hidden width D, identity mean, ``M = min(100, N)``, Adam 0.01,
``--dsvi-steps`` full-batch steps). Its hyperparameters and noise are then fixed (the
comparison of Ustyuzhaninov et al. 2020), and the exact DGP (``handlers.exact_layers``, last
layer integrated out, the layer outputs at the held-out inputs sampled as its ``grid``) is run
through ``diagnostics.ground_truth``: ``--chains`` NUTS chains from dispersed starts, modes
weighed by bridge sampling, and every mode above 1% of the mass checked (within-mode R-hat <=
1.01, bulk ESS >= 400). Reported: the verdict and its wall time; per layer, DSVI's marginals
at the held-out inputs against the reference (``diagnostics.layer_metrics``: variance ratio
VI / MCMC, mean difference in MCMC posterior sds, coverage of MCMC draws by DSVI's central 90%
interval); held-out log-likelihood and RMSE of both predictives (original units).

    python benchmarks/ground_truth_uci.py --data-dir ../shared/data/uci --dataset kin8nm --sizes 100 200
    python benchmarks/ground_truth_uci.py --data-dir ../shared/data/uci --dataset power --sizes 100 200
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from numpyro.handlers import substitute  # noqa: E402
from numpyro.infer import NUTS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import add_data_dir, base_record, header, table, write_results  # noqa: E402
from vecchia_ground_truth import held_out_metrics  # noqa: E402

from numpyro_dgp import diagnostics, recipes  # noqa: E402
from numpyro_dgp.datasets import load_uci  # noqa: E402
from numpyro_dgp.handlers import exact_layers  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_dir(p)
    p.add_argument("--dataset", default="kin8nm")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 200])
    p.add_argument("--num-held-out", type=int, default=100)
    p.add_argument("--dsvi-steps", type=int, default=5000)
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--max-tree-depth", type=int, default=8)
    p.add_argument("--evidence-draws", type=int, default=2000)
    p.add_argument("--vi-draws", type=int, default=2000)
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def layer_rows(metrics):
    """Per layer: medians (and 5-95% ranges) over its outputs and held-out points."""
    rows = {}
    for name, m in metrics.groupby("layer"):
        z = np.abs(m["mean_vi"] - m["mean_mcmc"]) / np.sqrt(m["var_mcmc"])
        ratio = m["variance_ratio"]
        rows[name] = {"variance_ratio_median": float(ratio.median()),
                      "variance_ratio_5_95": [float(ratio.quantile(0.05)), float(ratio.quantile(0.95))],
                      "mean_difference_in_sds_median": float(z.median()), "mean_difference_in_sds_max": float(z.max()),
                      "coverage_of_90_median": float(m["coverage"].median()),
                      "wasserstein_median": float(m["wasserstein"].median())}
    return rows


def one_size(args, split, order, n):
    idx = order[:n]
    X, y = split.X_train[idx], split.y_train[idx]
    grid, y_test = split.X_test[:args.num_held_out], np.asarray(split.y_test[:args.num_held_out])
    start = time.perf_counter()
    model, guide, fit = recipes.fit_dsvi(jax.random.PRNGKey(0), X, y, num_inducing=min(100, n),
                                         num_steps=args.dsvi_steps)
    fit_seconds = time.perf_counter() - start
    handler = exact_layers(substitute(model, data=fit.params), grid=grid, collapse_last=True)
    start = time.perf_counter()
    truth = diagnostics.ground_truth(handler, jax.random.PRNGKey(1), grid, X, y,
                                     kernel=lambda m: NUTS(m, max_tree_depth=args.max_tree_depth),
                                     num_chains=args.chains, num_warmup=args.warmup, num_samples=args.draws,
                                     evidence_draws=args.evidence_draws)
    seconds = time.perf_counter() - start
    vi = diagnostics.from_guide(model, guide, fit.params, jax.random.PRNGKey(2), grid, num_samples=args.vi_draws,
                                label="DSVI")
    noise, y_std = float(fit.params["noise"]), float(split.y_std)
    last = sorted(diagnostics.layer_names(truth.reference))[-1]
    f_mcmc = np.asarray(truth.reference["posterior"][last].values).reshape(-1, len(y_test))
    f_vi = np.asarray(vi["posterior"][last].values).reshape(-1, len(y_test))
    record = {"n": n, "dsvi_fit_seconds": fit_seconds, "ground_truth_seconds": seconds,
              "stage_seconds": dict(truth.seconds), "converged": bool(truth.converged), "report": truth.report(),
              "layers": layer_rows(diagnostics.layer_metrics(vi, truth.reference)),
              "held_out": {"mcmc": held_out_metrics(f_mcmc, y_test, noise, y_std),
                           "dsvi": held_out_metrics(f_vi, y_test, noise, y_std)}}
    print(n, {k: v for k, v in record.items() if k != "report"}, "\n", record["report"], flush=True)
    return record


def main(argv=None):
    args = parse(argv)
    record = base_record("ground_truth_uci.py", argv)
    split = load_uci(args.dataset, args.split, data_dir=args.data_dir)
    order = np.random.default_rng(0).permutation(len(split.X_train))
    record.update(settings=vars(args), runs=[one_size(args, split, order, n) for n in args.sizes])
    stem = f"ground_truth_{args.dataset}" + (f"_{args.tag}" if args.tag else "")
    write_results(stem, record, report(record, args))


def report(record, args):
    lines = header(f"Converged MCMC ground truth on {args.dataset} subsets, and DSVI against it",
                   record["command"], record["machine"], "float64", record["date"])
    lines += ["", f"Per N: DSVI (M = min(100, N), {args.dsvi_steps} full-batch steps) on the first N training rows "
              f"(split {args.split}, a fixed random order); hyperparameters and noise fixed at that fit; exact DGP "
              f"(last layer integrated out) through `diagnostics.ground_truth` with {args.chains} NUTS chains of "
              f"{args.warmup} + {args.draws} (max tree depth {args.max_tree_depth}), one process on this machine's "
              f"cores; {args.num_held_out} held-out test inputs.", ""]
    lines += table(["N", "converged", "ground truth: wall s (sampling / weighing modes)", "DSVI fit s",
                    "held-out LL / RMSE, MCMC", "held-out LL / RMSE, DSVI"],
                   [(r["n"], "yes" if r["converged"] else "no",
                     f"{r['ground_truth_seconds']:.0f} ({r['stage_seconds'].get('sampling', float('nan')):.0f} / "
                     f"{r['stage_seconds'].get('weighing', float('nan')):.0f})", f"{r['dsvi_fit_seconds']:.0f}",
                     f"{r['held_out']['mcmc']['log_likelihood']:.3f} / {r['held_out']['mcmc']['rmse']:.4f}",
                     f"{r['held_out']['dsvi']['log_likelihood']:.3f} / {r['held_out']['dsvi']['rmse']:.4f}")
                    for r in record["runs"]])
    lines += ["", "DSVI (factorized guide) against the ground truth at the held-out inputs, per layer: medians over "
              "the layer's outputs and points (5-95% range of the variance ratio; coverage: the share of MCMC draws "
              "inside DSVI's central 90% interval, 0.90 when they agree).", ""]
    lines += table(["N", "layer", "variance ratio DSVI / MCMC (5-95%)", "mean difference, MCMC sds (median / max)",
                    "coverage of 90%", "W1"],
                   [(r["n"], name, f"{v['variance_ratio_median']:.3g} ({v['variance_ratio_5_95'][0]:.3g} - "
                     f"{v['variance_ratio_5_95'][1]:.3g})",
                     f"{v['mean_difference_in_sds_median']:.2f} / {v['mean_difference_in_sds_max']:.2f}",
                     f"{v['coverage_of_90_median']:.2f}", f"{v['wasserstein_median']:.3g}")
                    for r in record["runs"] for name, v in r["layers"].items()])
    for r in record["runs"]:
        lines += ["", f"### N = {r['n']}: the verdict", "", "```", r["report"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
