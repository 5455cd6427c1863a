"""UCI regression with a DSVI DGP, against the published DGP rows.

Writes ``benchmarks/results/uci_<tag>.json`` and ``.md`` (appending each finished split, so
an interrupted run keeps what it measured) with the exact command line.

Example (the committed results)::

    python benchmarks/uci.py --datasets kin8nm --splits 0-4 --steps 5000 --tag kin8nm
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from _paths import DATA_DIR_HELP, default_data_dir

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


def write_markdown(path, record):
    from numpyro_dgp.recipes import mean_and_standard_error as summarize

    lines = [
        "# UCI regression: 2-layer DSVI DGP (numpyro-dgp)",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Machine: {record['machine']}; float64={record['float64']}; {record['settings']}",
        "",
        "| dataset | splits | test LL (ours) | RMSE (ours) | CRPS (ours) | DGP L=2 LL (published) | DGP L=2 RMSE (published) | s/step | compile s | total s/split |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
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
        lines.append(
            f"| {name} | {len(runs)} | {ll[0]:.3f} ({ll[1]:.3f}) | {rmse[0]:.4g} ({rmse[1]:.2g}) | "
            f"{crps[0]:.4g} ({crps[1]:.2g}) | {pll} | {prm} | {sps * 1e3:.1f} ms | {comp:.1f} | {tot:.0f} |"
        )
    lines += ["", "Mean (standard error) over splits; LL per test point, original target units.", ""]
    lines += ["Per split:", "", "| dataset | split | LL | RMSE | CRPS | final ELBO | skipped |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, runs in record["results"].items():
        for r in runs:
            lines.append(f"| {name} | {r['split']} | {r['log_likelihood']:.4f} | {r['rmse']:.4g} | {r['crps']:.4g} | {r['final_elbo']:.1f} | {r['num_skipped']} |")
    Path(path).write_text("\n".join(lines) + "\n")


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
    parser.add_argument("--data-dir", default=default_data_dir(), help=DATA_DIR_HELP)
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
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    json_path, md_path = out_dir / f"uci_{tag}.json", out_dir / f"uci_{tag}.md"
    record = {
        "command": "python benchmarks/uci.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} ({jax.default_backend()})",
        "float64": not args.float32,
        "settings": f"L={args.layers}, M={args.num_inducing}, batch={args.batch_size}, Adam lr={args.lr}, "
                    f"{args.steps} steps, 1 training sample (DGPElbo), 100 test samples, hidden width min(D, 30)",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
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
            json_path.write_text(json.dumps(record, indent=1))
            write_markdown(md_path, record)
    return record


if __name__ == "__main__":
    main()
