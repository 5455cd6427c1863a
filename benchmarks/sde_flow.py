"""DiffGP (SDE flow, Hegde et al. 2019) on UCI regression against the published tables, with our
2-layer DSVI in the same run; optionally the flow-time sweep on one data set.

Writes ``benchmarks/results/sde_flow_<tag>.json`` and ``.md`` after every finished run (an
interrupted run keeps what it measured), with the exact command line. Published numbers are
Hegde et al.'s (2019) Tables 2-3 (20 splits; ours are the splits given).

Examples::

    # the table (paper settings: M = 100, 20 Euler-Maruyama steps, 3000 iterations,
    # full batch up to 10000, 4 training samples, 50 test samples)
    python benchmarks/sde_flow.py --datasets concrete,bostonHousing --splits 0-4 --T 1,5
    # the flow-time sweep plot
    python benchmarks/sde_flow.py --sweep concrete --sweep-T 0,1,2.5,5,10 --splits 0 --tag sweep
    # a sweep that takes flow times already run (same settings, same splits) from another file
    python benchmarks/sde_flow.py --sweep concrete --sweep-T 0,10 --splits 0 --merge results/sde_flow_x.json
    # one table from runs of disjoint splits (same settings) made by separate processes
    python benchmarks/sde_flow.py --combine results/sde_flow_a.json results/sde_flow_b.json --tag ab
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from _harness import RESULTS, add_data_dir, command, header, machine, now, table, write_results

# Hegde et al. (2019), Tables 2-3: (mean, standard error) over 20 splits, original units.
PUBLISHED = {
    "bostonHousing": {"T=1": ((-2.36, 0.05), (2.80, 0.13)), "T=5": ((-2.30, 0.05), (2.58, 0.12)),
                      "DGP L=2": ((-2.47, 0.05), (2.90, 0.17))},
    "energy": {"T=1": ((-0.65, 0.03), (0.49, 0.02)), "T=5": ((-0.66, 0.02), (0.50, 0.02)),
               "DGP L=2": ((-0.73, 0.02), (0.47, 0.01))},
    "concrete": {"T=1": ((-3.05, 0.02), (5.32, 0.10)), "T=5": ((-2.90, 0.05), (4.56, 0.12)),
                 "DGP L=2": ((-3.12, 0.01), (5.61, 0.10))},
    "wine-quality-red": {"T=1": ((-0.96, 0.01), (0.63, 0.01)), "T=5": ((-0.98, 0.02), (0.63, 0.01)),
                         "DGP L=2": ((-0.95, 0.01), (0.63, 0.01))},
    "kin8nm": {"T=1": ((1.36, 0.01), (0.06, 0.00)), "T=5": ((1.36, 0.01), (0.06, 0.00)),
               "DGP L=2": ((1.34, 0.01), (0.06, 0.00))},
    "power-plant": {"T=1": ((-2.75, 0.01), (3.76, 0.03)), "T=5": ((-2.72, 0.01), (3.65, 0.03)),
                    "DGP L=2": ((-2.75, 0.01), (3.79, 0.03))},
}
# the targets (T = 5 unless stated): (LL at least, RMSE at most)
TARGETS = {"concrete": (-2.98, 4.8), "bostonHousing": (-2.40, None), "kin8nm": (1.30, None)}


def _mean_se(pair, mean_format, se_format):
    """``mean (se)``, or ``mean (one run)`` where a single split leaves no standard error."""
    se = f"{pair[1]:{se_format}}" if np.isfinite(pair[1]) else "one run"
    return f"{pair[0]:{mean_format}} ({se})"


def _fmt(pair, digits=2):
    return _mean_se(pair, f".{digits}f", f".{digits}f")


def markdown(record):
    from numpyro_dgp.recipes import mean_and_standard_error as summarize

    rows = []
    for name, by_model in record["results"].items():
        for label, runs in by_model.items():
            if not runs:
                continue
            ll = summarize([r["log_likelihood"] for r in runs])
            rmse = summarize([r["rmse"] for r in runs])
            pub = PUBLISHED.get(name, {}).get(label)
            pll, prm = (_fmt(pub[0]), _fmt(pub[1])) if pub else ("-", "-")
            target = "-"
            if label == "T=5" and name in TARGETS:
                t_ll, t_rmse = TARGETS[name]
                ok = ll[0] >= t_ll and (t_rmse is None or rmse[0] <= t_rmse)
                want = f"LL >= {t_ll}" + (f", RMSE <= {t_rmse}" if t_rmse else "")
                target = f"{want}: {'met' if ok else 'NOT met'}"
            sps = np.mean([r["seconds_per_step"] for r in runs])
            comp = np.mean([r["compile_seconds"] for r in runs])
            rows.append([name, label, len(runs), _mean_se(ll, ".3f", ".3f"), _mean_se(rmse, ".4g", ".2g"), pll, prm,
                         target, f"{sps * 1e3:.0f} ms", f"{comp:.1f}"])
    lines = [
        *header("DiffGP (SDE flow) on UCI regression (numpyro-dgp)", record["command"], record["machine"],
                f"float64={record['float64']}", record["settings"]),
        "",
        *table(["dataset", "model", "splits", "test LL (ours)", "RMSE (ours)", "LL (published)", "RMSE (published)",
                "target", "s/step", "compile s"], rows),
        "", "Mean (standard error) over splits; LL per test point, original target units. "
        "Published: 20 splits. `DGP L=2` is our DSVI (published row: Salimbeni & Deisenroth 2017).", "",
        "Per run:", "",
        *table(["dataset", "model", "split", "LL", "RMSE", "final ELBO", "skipped", "total s"],
               [[name, label, r["split"], f"{r['log_likelihood']:.4f}", f"{r['rmse']:.4g}", f"{r['final_elbo']:.1f}",
                 r["num_skipped"], f"{r['total_seconds']:.0f}"]
                for name, by_model in record["results"].items() for label, runs in by_model.items() for r in runs]),
    ]
    if record.get("combined_from"):
        lines += ["", "Combined from " + ", ".join(f"`{f}`" for f in record["combined_from"])
                  + " (the same settings; disjoint splits, each run by its command above in its own process)."]
    if record.get("merged_from"):
        lines += ["", f"Flow times not run above come from `{record['merged_from']['file']}` "
                  f"(same settings; command `{record['merged_from']['command']}`)."]
    if record.get("sweep_plot"):
        lines += ["", f"Flow-time sweep: ![sweep]({record['sweep_plot']})"]
    return "\n".join(lines) + "\n"


def write_markdown(path, record):
    Path(path).write_text(markdown(record))


def combine(paths, tag):
    """One record from runs of disjoint splits with the same settings: every source command
    and date is kept; a split that appears twice for a data set and model is an error."""
    from papers.results import merge_by_split

    records = [json.loads(Path(p).read_text()) for p in paths]
    out = {k: v for k, v in records[0].items() if k not in ("merged_from", "sweep_plot")}
    for r in records[1:]:
        if (r["settings"], r["float64"]) != (out["settings"], out["float64"]):
            raise SystemExit(f"--combine: `{r['command']}` ran with other settings:\n{r['settings']}")
    out["command"] = " ; ".join(r["command"] for r in records)
    out["date"] = " ; ".join(r["date"] for r in records)
    out["combined_from"] = [Path(p).name for p in paths]
    try:
        out["results"] = merge_by_split([r["results"] for r in records], "--combine")
    except ValueError as err:
        raise SystemExit(str(err)) from None
    write_results(f"sde_flow_{tag}", out, markdown(out))
    return out


def plot_sweep(path, name, by_model):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ts, lls, rmses = [], [], []
    for label, runs in by_model.items():
        if not label.startswith("T=") or not runs:
            continue
        Ts.append(float(label[2:]))
        lls.append([r["log_likelihood"] for r in runs])
        rmses.append([r["rmse"] for r in runs])
    order = np.argsort(Ts)
    Ts = np.asarray(Ts)[order]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, vals, what in ((axes[0], lls, "test log-likelihood"), (axes[1], rmses, "test RMSE")):
        vals = [vals[i] for i in order]
        means = np.array([np.mean(v) for v in vals])
        ses = np.array([np.std(v, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0 for v in vals])
        ax.errorbar(Ts, means, yerr=ses, marker="o", capsize=3, label="numpyro-dgp DiffGP")
        pub = PUBLISHED.get(name, {})
        pub_T = [(float(k[2:]), v) for k, v in pub.items() if k.startswith("T=")]
        if pub_T:
            idx = 0 if what.endswith("likelihood") else 1
            ax.plot([t for t, _ in pub_T], [v[idx][0] for _, v in pub_T], "s", color="C3", label="paper (20 splits)")
        ax.set_xlabel("flow time T")
        ax.set_title(f"{name}: {what}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="concrete", help="comma-separated UCI names")
    parser.add_argument("--splits", default="0-4")
    parser.add_argument("--T", default="1,5", help="comma-separated flow times")
    parser.add_argument("--no-dsvi", action="store_true", help="skip the 2-layer DSVI rows")
    parser.add_argument("--sweep", default=None, help="data set of a flow-time sweep (uses --sweep-T)")
    parser.add_argument("--sweep-T", default="0,1,2.5,5,10")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--flow-steps", type=int, default=20)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=10000)
    parser.add_argument("--particles", type=int, default=4, help="training samples per step")
    parser.add_argument("--test-samples", type=int, default=50)
    parser.add_argument("--dsvi-batch-size", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--init", default="default", choices=("default", "released"),
                        help="DiffGP initial values: ours, or the released DiffGP code's (see fit_diffgp)")
    parser.add_argument("--pretrain-steps", type=int, default=0,
                        help="fit the predictor alone as an SVGP (T = 0) for this many steps first (the paper's pre-training)")
    parser.add_argument("--float32", action="store_true")
    add_data_dir(parser)
    parser.add_argument("--tag", default=None, help="results file suffix")
    parser.add_argument("--merge", default=None,
                        help="sweep: a results JSON of this script with the same settings whose other flow times "
                             "(at the requested splits) join the sweep")
    parser.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                        help="write one table (sde_flow_<tag>) from results files of disjoint splits, run nothing")
    args = parser.parse_args(argv)
    if args.combine:
        if not args.tag:
            raise SystemExit("--combine needs --tag (the combined file's name)")
        return combine(args.combine, args.tag)

    import jax

    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    from papers.diffgp import run_diffgp_uci

    from numpyro_dgp.datasets import parse_splits, resolve_uci_name
    from numpyro_dgp.recipes import run_uci

    if args.sweep:
        names = [resolve_uci_name(args.sweep)]
        Ts = [float(t) for t in args.sweep_T.split(",")]
    else:
        names = [resolve_uci_name(n) for n in args.datasets.split(",")]
        Ts = [float(t) for t in args.T.split(",")]
    splits = parse_splits(args.splits)
    tag = args.tag or "_".join(names)
    labels = [f"T={t:g}" for t in Ts] + ([] if (args.no_dsvi or args.sweep) else ["DGP L=2"])
    record = {
        "command": command("sde_flow.py", argv),
        "machine": machine(),
        "float64": not args.float32,
        "settings": (f"DiffGP: M={args.num_inducing} (flow and predictor), {args.flow_steps} Euler-Maruyama steps, "
                     f"batch min({args.batch_size}, N), {args.particles} training samples (DGPElbo), Adam lr={args.lr}, "
                     f"{args.steps} iterations, {args.test_samples} test samples"
                     + (", the released code's initial values" if args.init == "released" else "")
                     + (f", predictor pre-trained as an SVGP for {args.pretrain_steps} steps" if args.pretrain_steps else "")
                     + f"; DSVI L=2: M={args.num_inducing}, "
                     f"batch {args.dsvi_batch_size}, 1 sample, {args.steps} iterations, 100 test samples"),
        "date": now(),
        "results": {n: {label: [] for label in labels} for n in names},
    }
    if args.merge:
        other = json.loads(Path(args.merge).read_text())
        if other["settings"] != record["settings"] or other["float64"] != record["float64"]:
            raise SystemExit(f"--merge: {args.merge} was run with different settings:\n{other['settings']}")
        for name in names:
            for label, runs in other["results"].get(name, {}).items():
                if label.startswith("T=") and label not in labels:
                    record["results"][name][label] = [r for r in runs if r["split"] in splits]
        record["merged_from"] = {"file": Path(args.merge).name, "command": other["command"]}
    for name in names:
        for split in splits:
            for label in labels:
                if label.startswith("T="):
                    r = run_diffgp_uci(name, split, T=float(label[2:]), data_dir=args.data_dir,
                                       num_flow_steps=args.flow_steps, num_inducing=args.num_inducing,
                                       num_steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr,
                                       num_particles=args.particles, num_test_samples=args.test_samples,
                                       init=args.init, pretrain_steps=args.pretrain_steps)
                else:
                    r = run_uci(name, split, data_dir=args.data_dir, num_layers=2, num_inducing=args.num_inducing,
                                num_steps=args.steps, batch_size=args.dsvi_batch_size, learning_rate=args.lr)
                row = {"split": split, **r.metrics, "final_elbo": r.final_elbo, "seconds_per_step": r.seconds_per_step,
                       "compile_seconds": r.compile_seconds, "total_seconds": r.total_seconds,
                       "num_skipped": r.num_skipped}
                record["results"][name][label].append(row)
                print(f"{name} {label} split {split}: LL {r.metrics['log_likelihood']:.4f} RMSE {r.metrics['rmse']:.4g} "
                      f"({r.seconds_per_step * 1e3:.0f} ms/step, {r.total_seconds:.0f} s)", flush=True)
                if args.sweep:
                    RESULTS.mkdir(exist_ok=True)
                    png = RESULTS / f"sde_flow_{tag}.png"
                    plot_sweep(png, name, record["results"][name])
                    record["sweep_plot"] = png.name
                write_results(f"sde_flow_{tag}", record, markdown(record))
    return record


if __name__ == "__main__":
    main()
