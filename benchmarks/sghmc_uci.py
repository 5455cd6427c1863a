"""UCI regression: SGHMC (sghmc_dgp, Havasi et al. 2018) against DSVI on the same 2-layer DGP.

SGHMC runs on ``deep_gp_regression`` (2 layers, M = 100 k-means inducing inputs, hidden width
min(D, 30)) under :class:`numpyro_dgp.handlers.collapse_last_layer` (the sghmc_dgp likelihood
``log N(y | m_L, v_L + s^2)``), minibatches of ``--batch-size`` through the model's plate,
step size 0.01, mdecay 0.05, kernel hyperparameters / noise / inducing inputs by MW-MCEM with
Adam(0.01) (window 100). Burn-in ``--burnin`` steps (preconditioner adaptation), then
``--samples`` samples ``--thin`` steps apart; prediction is the mixture over the samples
(:func:`numpyro_dgp.predict_from_samples`). sghmc_dgp itself used 10k iterations and 100
samples 50 steps apart.

The DSVI baseline is ``benchmarks/uci.py``'s run (same model, ``recipes.run_uci``):
by default its committed per-split rows are read from ``benchmarks/results/uci_<tag>.json``
(reported as such, with that file's command); ``--dsvi-steps N`` re-runs it here.

Writes ``benchmarks/results/sghmc_uci<suffix>.json`` and ``.md`` after every split, with the
exact command line, the date and the seconds.

Example::

    python benchmarks/sghmc_uci.py --datasets kin8nm,power-plant --splits 0-2 --burnin 1000 --samples 50 --thin 20
    python benchmarks/sghmc_uci.py --smoke
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np
from _harness import RESULTS, add_data_dir, command, machine, table, write_results

# committed DSVI runs of benchmarks/uci.py (same model and settings), by dataset
DSVI_FILES = {"kin8nm": "uci_kin8nm.json", "power-plant": "uci_power.json"}


def load_committed_dsvi(name, splits):
    path = RESULTS / DSVI_FILES.get(name, f"uci_{name}.json")
    if not path.exists():
        return None, []
    rec = json.loads(path.read_text())
    rows = [r for r in rec["results"].get(name, []) if r["split"] in splits]
    return f"{rec['command']} ({rec.get('date', 'undated')}; {rec['settings']})", rows


def run_sghmc(name, split, *, burnin, num_samples, thin, batch_size, num_inducing, step_size, mdecay, lr,
              collapse=True, data_dir=None):
    import jax
    import jax.numpy as jnp
    import optax
    from numpyro.infer import MCMC, init_to_value

    from numpyro_dgp.datasets import load_uci
    from numpyro_dgp.handlers import collapse_last_layer
    from numpyro_dgp.infer import SGHMC
    from numpyro_dgp.models import deep_gp_regression
    from numpyro_dgp import metrics, predict_from_samples

    data = load_uci(name, split, data_dir=data_dir)
    dtype = jnp.result_type(float)
    X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
    N, D = X.shape
    width = min(D, 30)
    M = min(num_inducing, N)
    model = deep_gp_regression(2, num_inducing=M, hidden_width=width, noise_init=0.01)
    target = collapse_last_layer(model, layer="h2") if collapse else model
    # inducing values start at zero, as in sghmc_dgp
    init = init_to_value(values={"h1.u": jnp.zeros((width, M), dtype), "h2.u": jnp.zeros((1, M), dtype)})
    kernel = SGHMC(target, step_size=step_size, mdecay=mdecay, param_optimizer=optax.adam(lr), window_size=100,
                   init_strategy=init)
    mcmc = MCMC(kernel, num_warmup=burnin, num_samples=num_samples * thin, thinning=thin, progress_bar=False)
    key = jax.random.PRNGKey(split)
    run_key, pred_key = jax.random.split(key)
    bs = batch_size if batch_size < N else None
    t0 = time.perf_counter()
    mcmc.run(run_key, X, y, batch_size=bs)
    samples = mcmc.get_samples()
    jax.block_until_ready(samples)
    train_s = time.perf_counter() - t0
    extra = mcmc.get_extra_fields()
    t1 = time.perf_counter()
    pred = predict_from_samples(model, samples, pred_key, jnp.asarray(data.X_test, dtype))
    m = metrics(pred, jnp.asarray(data.y_test, dtype), y_scale=data.y_std)
    pred_s = time.perf_counter() - t1
    skipped = int(np.asarray(extra["num_skipped"])[-1]) if "num_skipped" in extra else -1
    noise = float(np.mean(np.asarray(samples["noise"]))) if "noise" in samples else float("nan")
    return {"split": split, **m, "train_seconds": train_s, "predict_seconds": pred_s,
            "steps": burnin + num_samples * thin, "num_skipped": skipped, "mean_noise_variance": noise,
            "final_potential": float(np.asarray(extra["potential_energy"])[-1])}


def fmt(values, digits=3):
    v = np.asarray(values, float)
    sd = v.std(ddof=1) if len(v) > 1 else float("nan")
    return f"{v.mean():.{digits}f} ± {sd:.{digits}f}"


def markdown(record):
    lines = [
        "# UCI regression: SGHMC (sghmc_dgp) vs DSVI on the same 2-layer DGP (numpyro-dgp)",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Date: {record['date']}; machine: {record['machine']}; float64=True",
        "",
        f"SGHMC: {record['sghmc_settings']}",
        "",
        f"DSVI: {record['dsvi_source']}",
        "",
        "Test log-likelihood per point and RMSE in original units, mean ± std (ddof=1) over splits.",
        "",
    ]
    if record.get("notes"):
        lines += [record["notes"], ""]
    rows = []
    for name, res in record["results"].items():
        done = {r["split"] for r in res.get("sghmc") or []}
        for method in ("dsvi", "sghmc"):
            runs = res.get(method) or []
            if method == "dsvi" and done:  # compare on the splits SGHMC finished
                runs = [r for r in runs if r["split"] in done]
            if not runs:
                continue
            secs = [r.get("train_seconds", r.get("total_seconds", float("nan"))) for r in runs]
            rows.append([name, method.upper(), ",".join(str(r["split"]) for r in runs),
                         fmt([r["log_likelihood"] for r in runs]), fmt([r["rmse"] for r in runs], 4),
                         fmt([r["crps"] for r in runs], 4), f"{np.mean(secs):.0f}"])
    per_split = []
    for name, res in record["results"].items():
        for method in ("dsvi", "sghmc"):
            for r in res.get(method) or []:
                secs = r.get("train_seconds", r.get("total_seconds", float("nan")))
                note = (f"{r['steps']} steps, predict {r['predict_seconds']:.1f} s, mean noise var "
                        f"{r['mean_noise_variance']:.4g}" if method == "sghmc" else "")
                per_split.append([name, method.upper(), r["split"], f"{r['log_likelihood']:.4f}", f"{r['rmse']:.4g}",
                                  f"{r['crps']:.4g}", f"{secs:.0f}", r["num_skipped"], note])
    lines += [
        *table(["dataset", "method", "splits", "test LL", "RMSE", "CRPS", "train s/split"], rows),
        "",
        "Published sghmc_dgp (Havasi et al. 2018) numbers are not shown: we have no record of them "
        "for these splits, only of its settings.",
        "",
        "The summary compares both methods on the splits SGHMC finished; all DSVI rows are in the per-split table. "
        "DSVI \"train s\" is benchmarks/uci.py's total seconds per split (fit + predict) when read from "
        "its committed results. Seconds are wall-clock on a 2-core machine shared with other jobs.",
        "",
        "Per split:",
        "",
        *table(["dataset", "method", "split", "LL", "RMSE", "CRPS", "seconds", "skipped", "notes"], per_split),
    ]
    return "\n".join(lines) + "\n"


def merge(paths, suffix="", note=None):
    """Combine records of runs split over processes (same settings) into one results file;
    the merged record lists every source command, date and total seconds."""
    recs = [json.loads(Path(p).read_text()) for p in paths]
    out = dict(recs[0])
    out["command"] = " ; ".join(r["command"] for r in recs)
    out["date"] = " ; ".join(r["date"] for r in recs)
    out["seconds_total"] = [r.get("seconds_total") for r in recs]
    # each source reads "[dataset] committed rows of ...": keep every distinct one once
    out["dsvi_source"] = " ".join(dict.fromkeys(
        part.strip() for r in recs for part in re.split(r"(?=\[[^\]]+\] committed)", r["dsvi_source"]) if part.strip()))
    out["merged_from"] = [str(p) for p in paths]
    out["notes"] = ("Merged from runs split over processes (identical settings; each (dataset, split) row comes "
                    "from the command that ran it): " + "; ".join(
                        f"`{r['command']}` -> {[(n, [x['split'] for x in res['sghmc']]) for n, res in r['results'].items() if res.get('sghmc')]}"
                        for r in recs))
    if note:
        out["notes"] += " " + note
    earlier = [r["notes"] for r in recs if r.get("notes")]
    if earlier:  # a record that was itself merged keeps its history
        out["notes"] += " Earlier notes of the merged records: " + " ".join(earlier)
    out["results"] = {}
    for r in recs:
        if r.get("sghmc_settings") != recs[0].get("sghmc_settings"):
            raise SystemExit(f"merge: {r['command']} ran with other settings:\n{r.get('sghmc_settings')}")
        for name, res in r["results"].items():
            if not res.get("sghmc"):
                continue
            merged = out["results"].setdefault(name, {"sghmc": [], "dsvi": []})
            for method in ("sghmc", "dsvi"):
                have = {x["split"] for x in merged[method]}
                clash = have & {x["split"] for x in res.get(method) or []} if method == "sghmc" else set()
                if clash:
                    raise SystemExit(f"merge: {name} SGHMC split(s) {sorted(clash)} appear in more than one file")
                merged[method] += [x for x in res.get(method) or [] if x["split"] not in have]
                merged[method].sort(key=lambda x: x["split"])
    write_results(f"sghmc_uci{suffix}", out, markdown(out))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="kin8nm,power-plant")
    parser.add_argument("--splits", default="0-2")
    parser.add_argument("--burnin", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--thin", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--step-size", type=float, default=0.01)
    parser.add_argument("--mdecay", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--no-collapse", action="store_true", help="sample f_L instead of collapsing it")
    parser.add_argument("--dsvi-steps", type=int, default=0,
                        help="re-run DSVI with this many steps (0: read benchmarks/uci.py's committed rows)")
    add_data_dir(parser)
    parser.add_argument("--smoke", action="store_true", help="tiny run: 1 split, few steps, kin8nm only")
    parser.add_argument("--suffix", default=None, help="results file suffix (default: none; '_smoke' with --smoke)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="only merge these result files (runs split over processes) into sghmc_uci<suffix>")
    parser.add_argument("--note", default=None, help="with --merge: a note for the merged record (e.g. a stopped run)")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.suffix or "", args.note)

    import jax

    jax.config.update("jax_enable_x64", True)
    from numpyro_dgp.datasets import resolve_uci_name
    from numpyro_dgp.datasets import parse_splits
    from numpyro_dgp.recipes import run_uci

    if args.smoke:
        args.datasets, args.splits, args.burnin, args.samples, args.thin = "kin8nm", "0", 20, 4, 5
        args.dsvi_steps = args.dsvi_steps or 0
    names = [resolve_uci_name(n) for n in args.datasets.split(",")]
    splits = parse_splits(args.splits)
    suffix = args.suffix if args.suffix is not None else ("_smoke" if args.smoke else "")
    record = {
        "command": command("sghmc_uci.py", argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "sghmc_settings": (
            f"L=2, M={args.num_inducing} (k-means), hidden width min(D, 30), batch {args.batch_size}, step_size "
            f"{args.step_size}, mdecay {args.mdecay}, MW-MCEM Adam({args.lr}) window 100, "
            f"{'collapse_last_layer' if not args.no_collapse else 'f_L sampled'}, burn-in {args.burnin}, "
            f"{args.samples} samples thinned by {args.thin} ({args.burnin + args.samples * args.thin} steps); "
            "prediction: predict_from_samples mixture over the samples"
        ),
        "dsvi_source": None,
        "results": {n: {"dsvi": [], "sghmc": []} for n in names},
    }
    t_all = time.perf_counter()
    for name in names:
        if args.dsvi_steps:
            record["dsvi_source"] = (f"re-run here: recipes.run_uci (AutoFactorizedDGP + DGPElbo, Adam 0.01, "
                                     f"batch {args.batch_size}, {args.dsvi_steps} steps, 100 test samples)")
        else:
            src, rows = load_committed_dsvi(name, splits)
            record["results"][name]["dsvi"] = rows
            record["dsvi_source"] = (record["dsvi_source"] or "") + f"[{name}] committed rows of `{src}`. "
        for split in splits:
            if args.dsvi_steps:
                r = run_uci(name, split, data_dir=args.data_dir, num_layers=2, num_inducing=args.num_inducing,
                            num_steps=args.dsvi_steps, batch_size=args.batch_size, learning_rate=args.lr)
                record["results"][name]["dsvi"].append(
                    {"split": split, **r.metrics, "total_seconds": r.total_seconds, "num_skipped": r.num_skipped})
            row = run_sghmc(name, split, burnin=args.burnin, num_samples=args.samples, thin=args.thin,
                            batch_size=args.batch_size, num_inducing=args.num_inducing, step_size=args.step_size,
                            mdecay=args.mdecay, lr=args.lr, collapse=not args.no_collapse, data_dir=args.data_dir)
            record["results"][name]["sghmc"].append(row)
            print(f"{name} split {split} SGHMC: LL {row['log_likelihood']:.4f} RMSE {row['rmse']:.4g} "
                  f"train {row['train_seconds']:.0f} s, skipped {row['num_skipped']}", flush=True)
            record["seconds_total"] = time.perf_counter() - t_all
            write_results(f"sghmc_uci{suffix}", record, markdown(record))
    return record


if __name__ == "__main__":
    main()
