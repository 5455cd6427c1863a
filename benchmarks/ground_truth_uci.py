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

``--guides joint chain`` adds the correlated guides (``AutoJointDGP``, ``AutoChainDGP``, fitted
``--guide-steps`` full-batch Adam(0.01) steps under ``DGPElbo()``) and ``--sghmc-batch-sizes``
adds SGHMC (``infer.SGHMC`` under ``handlers.collapse_last_layer``, mdecay 0.05 and step size 0.01
as the docs use, or ``--sghmc-step-sizes``; ``--sghmc-chains`` vectorized chains of
``--sghmc-warmup`` burn-in steps and ``--sghmc-draws`` draws ``--sghmc-thin`` steps apart) on the
same model with the same fixed hyperparameters, each measured against the same ground truth.
``--reference-cache PREFIX`` keeps each N's ground truth in ``PREFIX_<dataset>_<N>.pkl`` (read
back on a later run instead of sampling again; its seconds are the first run's).

    python benchmarks/ground_truth_uci.py --data-dir ../shared/data/uci --dataset kin8nm --sizes 100 200
    python benchmarks/ground_truth_uci.py --data-dir ../shared/data/uci --dataset kin8nm --sizes 200 \
        --warmup 1000 --draws 1000 --guides joint chain --guide-steps 20000 --sghmc-batch-sizes 50 200 \
        --sghmc-step-sizes 0.01 0.003 --sghmc-warmup 5000 --sghmc-draws 1000 --sghmc-thin 20 --tag methods
    python benchmarks/ground_truth_uci.py --data-dir ../shared/data/uci --dataset power --sizes 100 200
"""

from __future__ import annotations

import argparse
import itertools
import os
import pickle
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from numpyro.handlers import seed, substitute, trace  # noqa: E402
from numpyro.infer import MCMC, NUTS, SVI  # noqa: E402
from numpyro.optim import Adam  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import add_data_dir, base_record, header, table, write_results  # noqa: E402
from vecchia_ground_truth import held_out_metrics  # noqa: E402

from numpyro_dgp import DGPElbo, diagnostics, fit, recipes  # noqa: E402
from numpyro_dgp.datasets import load_uci  # noqa: E402
from numpyro_dgp.guides import AutoChainDGP, AutoJointDGP  # noqa: E402
from numpyro_dgp.handlers import collapse_last_layer, exact_layers  # noqa: E402
from numpyro_dgp.infer import SGHMC  # noqa: E402

GUIDES = {"joint": AutoJointDGP, "chain": AutoChainDGP}


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
    p.add_argument("--guides", nargs="*", default=[], choices=sorted(GUIDES))
    p.add_argument("--guide-steps", type=int, default=5000)
    p.add_argument("--sghmc-batch-sizes", type=int, nargs="*", default=[])
    p.add_argument("--sghmc-step-sizes", type=float, nargs="+", default=[0.01])
    p.add_argument("--sghmc-chains", type=int, default=4)
    p.add_argument("--sghmc-warmup", type=int, default=2000)
    p.add_argument("--sghmc-draws", type=int, default=500)
    p.add_argument("--sghmc-thin", type=int, default=10)
    p.add_argument("--tag", default="")
    p.add_argument("--reference-cache", default=None,
                   help="path prefix of a pickle of each N's ground truth (written if absent, read if present)")
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


#: the settings a kept ground truth depends on (a cache made with others is refused)
REFERENCE_SETTINGS = ("dataset", "split", "num_held_out", "dsvi_steps", "chains", "warmup", "draws", "max_tree_depth",
                      "evidence_draws")


def cache_path(args, n):
    return Path(f"{args.reference_cache}_{args.dataset}_{n}.pkl") if args.reference_cache else None


def check_caches(args):
    """Refuse, before any work, a kept ground truth made with other settings."""
    wanted = {k: getattr(args, k) for k in REFERENCE_SETTINGS}
    for n in args.sizes:
        cache = cache_path(args, n)
        if cache is not None and cache.exists() and pickle.loads(cache.read_bytes()).get("settings") != wanted:
            raise SystemExit(f"{cache} holds a ground truth made with other settings than {wanted}; "
                             "remove it or pass another --reference-cache")


def reference(args, model, params, grid, X, y, n):
    """The ground truth's reference draws, verdict and seconds; kept in (or read from)
    ``--reference-cache``, so that more methods can be measured against the same draws."""
    cache = cache_path(args, n)
    if cache is not None and cache.exists():
        return pickle.loads(cache.read_bytes())
    handler = exact_layers(substitute(model, data=params), grid=grid, collapse_last=True)
    start = time.perf_counter()
    truth = diagnostics.ground_truth(handler, jax.random.PRNGKey(1), grid, X, y,
                                     kernel=lambda m: NUTS(m, max_tree_depth=args.max_tree_depth),
                                     num_chains=args.chains, num_warmup=args.warmup, num_samples=args.draws,
                                     evidence_draws=args.evidence_draws)
    saved = {"reference": truth.reference, "converged": bool(truth.converged), "report": truth.report(),
             "seconds": time.perf_counter() - start, "stage_seconds": dict(truth.seconds),
             "settings": {k: getattr(args, k) for k in REFERENCE_SETTINGS}}
    if cache is not None:
        cache.write_bytes(pickle.dumps(saved))
    return saved


def one_size(args, split, order, n):
    idx = order[:n]
    X, y = split.X_train[idx], split.y_train[idx]
    grid, y_test = split.X_test[:args.num_held_out], np.asarray(split.y_test[:args.num_held_out])
    start = time.perf_counter()
    model, guide, fit = recipes.fit_dsvi(jax.random.PRNGKey(0), X, y, num_inducing=min(100, n),
                                         num_steps=args.dsvi_steps)
    fit_seconds = time.perf_counter() - start
    truth = reference(args, model, fit.params, grid, X, y, n)
    vi = diagnostics.from_guide(model, guide, fit.params, jax.random.PRNGKey(2), grid, num_samples=args.vi_draws,
                                label="DSVI")
    noise, y_std = float(fit.params["noise"]), float(split.y_std)
    last = sorted(diagnostics.layer_names(truth["reference"]))[-1]
    f_mcmc = np.asarray(truth["reference"]["posterior"][last].values).reshape(-1, len(y_test))
    f_vi = np.asarray(vi["posterior"][last].values).reshape(-1, len(y_test))
    record = {"n": n, "dsvi_fit_seconds": fit_seconds, "ground_truth_seconds": truth["seconds"],
              "stage_seconds": truth["stage_seconds"], "converged": truth["converged"], "report": truth["report"],
              "layers": layer_rows(diagnostics.layer_metrics(vi, truth["reference"])),
              "held_out": {"mcmc": held_out_metrics(f_mcmc, y_test, noise, y_std),
                           "dsvi": held_out_metrics(f_vi, y_test, noise, y_std)}}
    if args.guides or args.sghmc_batch_sizes:
        record["others"] = {
            name: {"seconds": secs, "layers": layer_rows(diagnostics.layer_metrics(tree, truth["reference"])),
                   "held_out": held_out_metrics(np.asarray(tree["posterior"][last].values).reshape(-1, len(y_test)),
                                                y_test, noise, y_std)}
            for name, (tree, secs) in other_methods(args, model, fit.params, X, y, grid).items()}
    print(n, {k: v for k, v in record.items() if k != "report"}, "\n", record["report"], flush=True)
    return record


def other_methods(args, model, params, X, y, grid):
    """The correlated guides and SGHMC on ``model`` with the DSVI fit's hyperparameters fixed:
    ``{name: (DataTree at grid, wall seconds of the fit or run)}``."""
    names = [k for k, site in trace(seed(model, 0)).get_trace(X, y).items() if site["type"] == "param"]
    fixed = substitute(model, data={k: params[k] for k in names})
    out = {}
    for i, name in enumerate(args.guides):
        guide = GUIDES[name](fixed)
        start = time.perf_counter()
        result = fit(SVI(fixed, guide, Adam(0.01), DGPElbo()), jax.random.PRNGKey(10 + i), X, y,
                     num_steps=args.guide_steps, progress_bar=False)
        seconds = time.perf_counter() - start
        out[name] = (diagnostics.from_guide(fixed, guide, result.params, jax.random.PRNGKey(20 + i), grid,
                                            num_samples=args.vi_draws, label=name), seconds)
    for batch, step in itertools.product(args.sghmc_batch_sizes, args.sghmc_step_sizes):
        kernel = SGHMC(collapse_last_layer(fixed), step_size=step, mdecay=0.05, param_optimizer=None)
        mcmc = MCMC(kernel, num_warmup=args.sghmc_warmup, num_samples=args.sghmc_draws, thinning=args.sghmc_thin,
                    num_chains=args.sghmc_chains, chain_method="vectorized", progress_bar=False)
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(30 + batch), X, y, batch_size=batch)
        seconds = time.perf_counter() - start
        name = f"SGHMC, batch {batch}" + (f", step {step:g}" if len(args.sghmc_step_sizes) > 1 else "")
        out[name] = (diagnostics.from_mcmc(mcmc, grid, model=fixed, rng_key=jax.random.PRNGKey(40 + batch),
                                           label=name), seconds)
    return out


def main(argv=None):
    args = parse(argv)
    check_caches(args)
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
    if any("others" in r for r in record["runs"]):
        lines += others_report(record, args)
    for r in record["runs"]:
        lines += ["", f"### N = {r['n']}: the verdict", "", "```", r["report"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def others_report(record, args):
    lines = ["", f"The correlated guides ({args.guide_steps} Adam(0.01) steps, full batch, `DGPElbo()`) and SGHMC "
             f"(step size {' and '.join(f'{v:g}' for v in getattr(args, 'sghmc_step_sizes', [0.01]))}, mdecay 0.05, "
             f"{args.sghmc_chains} vectorized chains of {args.sghmc_warmup} burn-in "
             f"steps and {args.sghmc_draws} draws {args.sghmc_thin} steps apart, under `collapse_last_layer`) on the "
             "same model with the same fixed hyperparameters, against the same ground truth (as above; seconds: the "
             "fit or run, compilation included).", ""]
    lines += table(["N", "method", "layer", "variance ratio / MCMC (5-95%)", "mean difference, MCMC sds (median / max)",
                    "coverage of 90%", "W1", "held-out LL / RMSE", "seconds"],
                   [(r["n"], name, layer, f"{v['variance_ratio_median']:.3g} ({v['variance_ratio_5_95'][0]:.3g} - "
                     f"{v['variance_ratio_5_95'][1]:.3g})",
                     f"{v['mean_difference_in_sds_median']:.2f} / {v['mean_difference_in_sds_max']:.2f}",
                     f"{v['coverage_of_90_median']:.2f}", f"{v['wasserstein_median']:.3g}",
                     f"{m['held_out']['log_likelihood']:.3f} / {m['held_out']['rmse']:.4f}", f"{m['seconds']:.0f}")
                    for r in record["runs"] for name, m in r.get("others", {}).items()
                    for layer, v in m["layers"].items()])
    return lines


if __name__ == "__main__":
    main()
