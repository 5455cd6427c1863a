"""UCI regression with a DSVI DGP, against the published DGP rows.

Writes ``benchmarks/results/uci_<tag>.json`` and ``.md`` (appending each finished split, so
an interrupted run keeps what it measured) with the exact command line.

Example (the committed results)::

    python benchmarks/uci.py --datasets kin8nm --splits 0-4 --steps 5000 --tag kin8nm
"""

from __future__ import annotations

import argparse

import numpy as np
from _harness import add_data_dir, command, header, machine, now, table, write_results

# Published DSVI "DGP L=2" rows (Salimbeni & Deisenroth 2017):
# test log-likelihood and RMSE, mean (standard error) over 20 splits, original units.
PUBLISHED_DGP2 = {
    "bostonHousing": {"log_likelihood": (-2.47, 0.05), "rmse": (2.90, 0.17)},
    "energy": {"log_likelihood": (-0.73, 0.02), "rmse": (0.47, 0.01)},
    "concrete": {"log_likelihood": (-3.12, 0.01), "rmse": (5.61, 0.10)},
    "wine-quality-red": {"log_likelihood": (-0.95, 0.01), "rmse": (0.63, 0.01)},
    "kin8nm": {"log_likelihood": (1.34, 0.01), "rmse": (0.06, 0.00)},
    "power-plant": {"log_likelihood": (-2.75, 0.01), "rmse": (3.79, 0.03)},
    "yacht": None,  # not in the published table
}


def markdown(record):
    from numpyro_dgp.recipes import mean_and_standard_error as summarize

    rows = []
    for name, runs in record["results"].items():
        if not runs:
            continue
        ll = summarize([r["log_likelihood"] for r in runs])
        rmse = summarize([r["rmse"] for r in runs])
        crps = summarize([r["crps"] for r in runs])
        pub = PUBLISHED_DGP2.get(name)
        pll = f"{pub['log_likelihood'][0]:.2f} ({pub['log_likelihood'][1]:.2f})" if pub else "-"
        prm = f"{pub['rmse'][0]:.2f} ({pub['rmse'][1]:.2f})" if pub else "-"
        sps = np.mean([r["seconds_per_step"] for r in runs])
        comp = np.mean([r["compile_seconds"] for r in runs])
        tot = np.mean([r["total_seconds"] for r in runs])
        rows.append([name, len(runs), f"{ll[0]:.3f} ({ll[1]:.3f})", f"{rmse[0]:.4g} ({rmse[1]:.2g})",
                     f"{crps[0]:.4g} ({crps[1]:.2g})", pll, prm, f"{sps * 1e3:.1f} ms", f"{comp:.1f}", f"{tot:.0f}"])
    lines = [
        *header("UCI regression: 2-layer DSVI DGP (numpyro-dgp)", record["command"], record["machine"],
                f"float64={record['float64']}", record["settings"]),
        "",
        *table(["dataset", "splits", "test LL (ours)", "RMSE (ours)", "CRPS (ours)", "DGP L=2 LL (published)",
                "DGP L=2 RMSE (published)", "s/step", "compile s", "total s/split"], rows),
        "", "Mean (standard error) over splits; LL per test point, original target units.", "", "Per split:", "",
        *table(["dataset", "split", "LL", "RMSE", "CRPS", "final ELBO", "skipped"],
               [[name, r["split"], f"{r['log_likelihood']:.4f}", f"{r['rmse']:.4g}", f"{r['crps']:.4g}",
                 f"{r['final_elbo']:.1f}", r["num_skipped"]]
                for name, runs in record["results"].items() for r in runs]),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="kin8nm", help="comma-separated UCI names")
    parser.add_argument("--splits", default="0-4")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--float32", action="store_true")
    add_data_dir(parser)
    parser.add_argument("--tag", default=None, help="results file suffix")
    args = parser.parse_args(argv)

    import jax

    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    from numpyro_dgp.datasets import resolve_uci_name
    from numpyro_dgp.datasets import parse_splits
    from numpyro_dgp.recipes import run_uci

    names = [resolve_uci_name(n) for n in args.datasets.split(",")]
    splits = parse_splits(args.splits)
    tag = args.tag or "_".join(names)
    record = {
        "command": command("uci.py", argv),
        "machine": machine(),
        "float64": not args.float32,
        "settings": f"L={args.layers}, M={args.num_inducing}, batch={args.batch_size}, Adam lr={args.lr}, "
                    f"{args.steps} steps, 1 training sample (DGPElbo), 100 test samples, hidden width min(D, 30)",
        "date": now(),
        "results": {n: [] for n in names},
    }
    for name in names:
        for split in splits:
            r = run_uci(name, split, data_dir=args.data_dir, num_layers=args.layers, num_inducing=args.num_inducing,
                        num_steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr)
            row = {"split": split, **r.metrics, "final_elbo": r.final_elbo, "seconds_per_step": r.seconds_per_step,
                   "compile_seconds": r.compile_seconds, "total_seconds": r.total_seconds, "num_skipped": r.num_skipped}
            record["results"][name].append(row)
            print(f"{name} split {split}: LL {r.metrics['log_likelihood']:.4f} RMSE {r.metrics['rmse']:.4g} "
                  f"({r.seconds_per_step * 1e3:.1f} ms/step, {r.total_seconds:.0f} s)", flush=True)
            write_results(f"uci_{tag}", record, markdown(record))
    return record


if __name__ == "__main__":
    main()
