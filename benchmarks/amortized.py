"""Amortized DGP (Meng & Zhang 2024, AVDGP) against the published numbers, with our factorized DSVI
in the same run.

* ``--kin8nm`` (default): kin8nm, random 8:1:1 splits (seeds), 3 layers of widths (16, 4, 1),
  isotropic Matérn-5/2, standardized units; AR2P (``DGPElbo``), AR2PP (``PredictiveObjective``)
  with per-point M = (8, 4, 4) and S = 32 branches, and the DS-DGP baseline (global
  inducing points M = (256, 128, 128), learned linear inner means): Adam 0.005, batch 100,
  100 epochs; test NLL, RMSE and CRPS of the final parameters and of the epoch with the best
  NLL on the split's validation part, seconds per epoch (steady, compile excluded);
  ``--swa-epochs K`` also scores the mean of the end-of-epoch parameters over the last K epochs
  (stochastic weight averaging), ``--beta`` sets AR2PP's KL weight (paper: 1).
* ``--letters``: Meng & Zhang's (2024) toy classification ("DGP" letters on the unit square), amortized
  DGPs with 1-4 layers (AR2P, probit), test error beside Table 2.

Writes ``benchmarks/results/amortized_<tag>.json`` and ``.md`` after every finished run,
with the command line.

Examples::

    python benchmarks/amortized.py --splits 0-4
    python benchmarks/amortized.py --methods AR2P,AR2PP --swa-epochs 25 --splits 0-4
    python benchmarks/amortized.py --letters --layers 1,2,3,4 --num-inducing 64 --splits 0
    # splits run in two processes, then one results file
    python benchmarks/amortized.py --merge results/amortized_a.json results/amortized_b.json --tag kin8nm
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _harness import add_data_dir, command, header, machine, now, table, write_results

# Meng & Zhang (2024): kin8nm, standardized units, mean ± std over 5 splits
PUBLISHED_KIN8NM = {
    "AR2P": {"nll": (0.118, 0.037), "rmse": (0.266, 0.007), "crps": (0.168, 0.004)},
    "AR2PP": {"nll": (0.066, 0.022), "rmse": (0.263, 0.004)},
    "DS-DGP": {"nll": (0.290, 0.024), "rmse": (0.316, 0.006)},
}
TARGETS_KIN8NM = {"AR2P": {"nll": 0.16, "rmse": 0.275}, "AR2PP": {"nll": 0.10}}
# Table 2, test error (%), |M| = 64 (SGP-AVI is one layer)
PUBLISHED_LETTERS = {1: 6.81, 2: 3.10, 3: 2.59, 4: 1.86}


def _model_and_guide(method, num_branches, dsvi_inducing, X_train, beta=1.0):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints

    import numpyro_dgp as dgp
    from numpyro_dgp.guides import AutoAmortizedDGP, AutoFactorizedDGP
    from numpyro_dgp.kernels import Matern52
    from numpyro_dgp.layers import mean_projection

    if method in ("AR2P", "AR2PP"):
        model = dgp.models.amortized_dgp(widths=(16, 4, 1), num_inducing=(8, 4, 4))
        guide = AutoAmortizedDGP(model, rule="AR2P", num_branches=num_branches)
        objective = dgp.DGPElbo() if method == "AR2P" else dgp.PredictiveObjective(num_particles=1, beta=beta)
        return model, guide, objective
    # DS-DGP: global inducing points, k-means on the data propagated through the linear means
    X = jnp.asarray(X_train)
    P1 = mean_projection(X, X.shape[1], 16)
    H1 = X @ P1
    H2 = H1 @ mean_projection(H1, 16, 4)
    M1, M2, M3 = dsvi_inducing
    Z = [dgp.core.kmeans(jax.random.PRNGKey(i), H, M) for i, (H, M) in enumerate([(X, M1), (H1, M2), (H2, M3)])]

    def model(X, y=None, batch_size=None):
        data = numpyro.plate("data", X.shape[0], subsample_size=batch_size)
        with data:
            x = numpyro.subsample(X, event_dim=1)
            yb = None if y is None else numpyro.subsample(y, event_dim=0)
        kernel = Matern52(ard=False)
        h = dgp.gp_layer("h1", x, kernel, inducing_inputs=Z[0], out_dim=16, mean="linear")
        h = dgp.gp_layer("h2", h, kernel, inducing_inputs=Z[1], out_dim=4, mean="linear")
        f = dgp.gp_layer("h3", h, kernel, inducing_inputs=Z[2], out_dim=1)
        noise = numpyro.param("noise", jnp.asarray(0.01, X.dtype), constraint=constraints.positive)
        with data:
            numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=yb)

    return model, AutoFactorizedDGP(model), dgp.DGPElbo(num_particles=1)


def run_kin8nm(method, seed, args):
    """Train ``args.epochs`` epochs, scoring the validation part (the third part of the 8:1:1
    split, never the test part) after every epoch; test metrics of the final parameters and
    of those of the epoch with the best validation NLL."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from numpyro_dgp.datasets import random_uci_split

    data = random_uci_split("kin8nm", seed, data_dir=args.data_dir)
    valid = random_uci_split("kin8nm", seed, data_dir=args.data_dir, part="validation")
    X, y = jnp.asarray(data.X_train), jnp.asarray(data.y_train)
    model, guide, objective = _model_and_guide(method, args.branches, args.dsvi_inducing, data.X_train, args.beta)
    svi = SVI(model, guide, _optimizer(args), objective)
    steps_per_epoch = int(np.ceil(X.shape[0] / args.batch_size))
    # AR2P propagation is deterministic: its S = 32 branches are the mixture; DS-DGP: 32 samples
    num_samples = 1 if method != "DS-DGP" else args.branches

    def scores(params, split):  # standardized units, as in the paper
        pred = dgp.predict(model, guide, params, jax.random.PRNGKey(seed + 1000), jnp.asarray(split.X_test),
                           num_samples=num_samples)
        return dgp.metrics(pred, jnp.asarray(split.y_test))

    start = time.perf_counter()
    state, epoch_seconds, validation_seconds, losses, compile_seconds, num_skipped = None, [], [], [], None, 0
    best_nll, best_params, best_epoch, validation_nll = np.inf, None, 0, []
    swa_params, swa_count = None, 0
    for epoch in range(1, args.epochs + 1):
        result = dgp.fit(svi, jax.random.PRNGKey(seed), X, y, args.batch_size, num_steps=steps_per_epoch,
                         chunk_size=steps_per_epoch, progress_bar=False, init_state=state)
        state = result.state
        compile_seconds = result.compile_seconds if compile_seconds is None else compile_seconds
        epoch_seconds.append(result.seconds_per_step * steps_per_epoch)
        losses.append(float(np.nanmean(result.losses)))
        num_skipped += result.num_skipped
        t0 = time.perf_counter()
        nll = -scores(result.params, valid)["log_likelihood"]
        validation_seconds.append(time.perf_counter() - t0)
        validation_nll.append(round(nll, 4))
        if nll < best_nll:
            best_nll, best_params, best_epoch = nll, result.params, epoch
        if epoch > args.epochs - args.swa_epochs:
            # stochastic weight averaging (Izmailov et al., 2018): a running mean of the end-of-epoch
            # (constrained) parameters; every constraint used here is convex, so the mean is valid
            swa_count += 1
            swa_params = result.params if swa_params is None else jax.tree.map(
                lambda a, b: a + (b - a) / swa_count, swa_params, result.params)
    fit_seconds = time.perf_counter() - start
    final, selected = scores(result.params, data), scores(best_params, data)
    swa = {}
    if swa_params is not None:
        averaged = scores(swa_params, data)
        swa = {"nll_swa": -averaged["log_likelihood"], "rmse_swa": averaged["rmse"], "crps_swa": averaged["crps"],
               "validation_nll_swa": -scores(swa_params, valid)["log_likelihood"]}
    return {
        "split": seed, "nll": -final["log_likelihood"], "rmse": final["rmse"], "crps": final["crps"],
        "nll_selected": -selected["log_likelihood"], "rmse_selected": selected["rmse"], "crps_selected": selected["crps"],
        "selected_epoch": best_epoch, "validation_nll": validation_nll,
        "seconds_per_epoch": float(np.median(epoch_seconds)), "validation_seconds": float(np.median(validation_seconds)),
        "compile_seconds": compile_seconds, "fit_seconds": fit_seconds,
        "final_loss": losses[-1], "num_skipped": num_skipped, **swa,
    }


def _optimizer(args):
    """Adam at ``--lr``, after clipping each gradient to a global norm of ``--clip-norm`` if given."""
    import numpyro
    import optax

    if args.clip_norm is None:
        return numpyro.optim.Adam(args.lr)
    return numpyro.optim.optax_to_numpyro(optax.chain(optax.clip_by_global_norm(args.clip_norm), optax.adam(args.lr)))


def _optimizer_label(args):
    return f"Adam {args.lr}" + (f" (gradients clipped to global norm {args.clip_norm})" if args.clip_norm else "")


def run_letters(num_layers, seed, args):
    import jax
    import jax.numpy as jnp
    from numpyro.infer import SVI
    from papers.letters import letters_classification

    import numpyro_dgp as dgp
    from numpyro_dgp.guides import AutoAmortizedDGP

    data = letters_classification(jax.random.PRNGKey(seed), args.letters_train, args.letters_test)
    # inputs standardized (uniform on [0, 1]: mean 1/2, sd 1/sqrt(12)) like the UCI inputs
    standardize = lambda A: jnp.asarray((A - 0.5) * np.sqrt(12.0))  # noqa: E731
    X, y = standardize(data.X_train), jnp.asarray(data.y_train)
    widths = (2,) * (num_layers - 1) + (1,)
    model = dgp.models.amortized_dgp(widths=widths, num_inducing=(args.num_inducing,) * num_layers, likelihood="probit")
    guide = AutoAmortizedDGP(model, rule="AR2P", num_branches=args.branches if num_layers > 1 else 1,
                             hidden_width=args.hidden_width)
    svi = SVI(model, guide, _optimizer(args), dgp.DGPElbo())
    steps_per_epoch = int(np.ceil(X.shape[0] / args.batch_size))
    start = time.perf_counter()
    result = dgp.fit(svi, jax.random.PRNGKey(seed), X, y, args.batch_size, num_steps=args.epochs * steps_per_epoch,
                     chunk_size=steps_per_epoch, progress_bar=False)
    fit_seconds = time.perf_counter() - start
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(seed + 1000), standardize(data.X_test), num_samples=1)
    scores = dgp.metrics(pred, jnp.asarray(data.y_test))
    return {"split": seed, "error_pct": 100 * scores["error_rate"], "log_likelihood": scores["log_likelihood"],
            "brier": scores["brier"], "seconds_per_epoch": result.seconds_per_step * steps_per_epoch,
            "compile_seconds": result.compile_seconds, "fit_seconds": fit_seconds,
            "num_skipped": result.num_skipped,
            # training loss (negative ELBO of a batch, scaled to N) averaged per epoch, to tell a
            # stalled optimization from a converged one
            "epoch_loss": [round(float(v), 2) for v in
                           np.nanmean(result.losses.reshape(args.epochs, steps_per_epoch), axis=1)]}


def _mean_sd(values):
    v = np.asarray(values, float)
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else float("nan"))


def _fmt_mean_sd(mean, sd, digits):
    # A single run has no spread; say so rather than print "± nan".
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if np.isfinite(sd) else " (one run)")


def markdown(record):
    lines = [*header("Amortized DGP (Meng & Zhang 2024) — numpyro-dgp", record["command"], record["machine"],
                     f"float64: {record['float64']}", record["date"]), "", f"Settings: {record['settings']}", ""]
    if record.get("merged_from"):
        lines += [f"Merged from {', '.join(record['merged_from'])} (the same settings; disjoint splits run by the "
                  "commands above in separate processes).", ""]
    if record.get("notes"):
        lines += [record["notes"], ""]
    if record["mode"] == "kin8nm":
        swa_label = f"mean parameters of the last {record.get('swa_epochs')} epochs"
        table_rows = []
        for method, rows in record["results"].items():
            if not rows:
                continue
            for which, suffix in (("final epoch", ""), ("best validation epoch", "_selected"), (swa_label, "_swa")):
                if suffix and not all(f"nll{suffix}" in r for r in rows):
                    continue
                cells = []
                for key in ("nll", "rmse", "crps"):
                    m, sd = _mean_sd([r[key + suffix] for r in rows])
                    cells.append(_fmt_mean_sd(m, sd, 3))
                spe = _mean_sd([r["seconds_per_epoch"] for r in rows])[0]
                comp = _mean_sd([r["compile_seconds"] for r in rows])[0]
                pub = PUBLISHED_KIN8NM[method]
                target = TARGETS_KIN8NM.get(method, {})
                met = []
                for key, bound in target.items():
                    value = _mean_sd([r[key + suffix] for r in rows])[0]
                    met.append(f"{key.upper()} <= {bound}: {'met' if value <= bound else 'NOT met'}")
                table_rows.append([f"{method} ({which})", len(rows), *cells, f"{spe:.2f}", f"{comp:.1f}",
                                   f"{pub['nll'][0]:.3f} ± {pub['nll'][1]:.3f}",
                                   f"{pub['rmse'][0]:.3f} ± {pub['rmse'][1]:.3f}", "; ".join(met) or "—"])
        lines += ["kin8nm, standardized units, mean ± sd over the splits (paper: 5 random 8:1:1 splits).", "",
                  *table(["method", "splits", "NLL", "RMSE", "CRPS", "s/epoch", "compile s", "paper NLL", "paper RMSE",
                          "target"], table_rows)]
        if any("selected_epoch" in r for rows in record["results"].values() for r in rows):
            lines += ["", "'final epoch': the parameters after the last epoch; 'best validation epoch': those of the "
                      "epoch with the lowest NLL on the split's validation part (the 10% that is neither training "
                      "nor test), scored after every epoch; the test part is used only for the reported numbers. "
                      "Selected epochs: " + "; ".join(
                          f"{m} {[r['selected_epoch'] for r in rows]}" for m, rows in record["results"].items() if rows)
                      + ". s/epoch is training only (median over epochs); scoring the validation part took "
                      + "; ".join(f"{m} {_mean_sd([r['validation_seconds'] for r in rows])[0]:.2f} s"
                                  for m, rows in record["results"].items() if rows) + " per epoch (median)."]
        if any("nll_swa" in r for rows in record["results"].values() for r in rows):
            lines += ["", f"'{swa_label}': stochastic weight "
                      "averaging, the running mean of the end-of-epoch parameters over the last epochs, fixed "
                      "before the run (no selection). Validation NLL (mean over splits) of the final / averaged "
                      "parameters: " + "; ".join(
                          f"{m} {_mean_sd([r['validation_nll'][-1] for r in rows])[0]:.3f} / "
                          f"{_mean_sd([r['validation_nll_swa'] for r in rows])[0]:.3f}"
                          for m, rows in record["results"].items()
                          if rows and all("validation_nll_swa" in r for r in rows)) + "."]
    else:
        table_rows = []
        for layers, rows in record["results"].items():
            if not rows:
                continue
            e = _mean_sd([r["error_pct"] for r in rows])
            ll = _mean_sd([r["log_likelihood"] for r in rows])[0]
            spe = _mean_sd([r["seconds_per_epoch"] for r in rows])[0]
            table_rows.append([layers, len(rows), _fmt_mean_sd(*e, 2), f"{ll:.3f}", f"{spe:.2f}",
                               f"{PUBLISHED_LETTERS.get(int(layers), float('nan')):.2f}"])
        lines += ["'DGP' letters, AR2P amortized DGPs, test error (%), mean ± sd over seeds.", "",
                  *table(["layers", "seeds", "error %", "test LL", "s/epoch", "paper error % (|M| = 64)"], table_rows)]
    lines += ["", "Per run:", "", "```", json.dumps(record["results"], indent=1), "```"]
    return "\n".join(lines) + "\n"


def merge(paths, tag, note=None):
    """Combine the records of runs split over processes (same settings, disjoint splits) into
    ``amortized_<tag>``; the merged record keeps every source command and date."""
    from papers.results import extend_by_split

    recs = [json.loads(Path(p).read_text()) for p in paths]
    out = dict(recs[0])
    for r in recs[1:]:
        if (r["settings"], r["mode"], r["float64"]) != (out["settings"], out["mode"], out["float64"]):
            raise SystemExit(f"merge: {r['command']} ran with other settings:\n{r['settings']}")
    out["command"] = " ; ".join(r["command"] for r in recs)
    out["date"] = " ; ".join(r["date"] for r in recs)
    out["merged_from"] = [Path(p).name for p in paths]
    if note:
        out["notes"] = note
    out["results"] = {}
    for r in recs:
        for key, rows in r["results"].items():
            try:
                extend_by_split(out["results"].setdefault(key, []), rows, f"merge: {key}")
            except ValueError as err:
                raise SystemExit(str(err)) from None
    write_results(f"amortized_{tag}", out, markdown(out))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--letters", action="store_true", help="the toy classification instead of kin8nm")
    parser.add_argument("--splits", default="0-4", help="seeds of the random splits (kin8nm) or data sets (letters)")
    parser.add_argument("--methods", default="AR2P,AR2PP,DS-DGP")
    parser.add_argument("--layers", default="1,2,3,4", help="letters: numbers of layers")
    parser.add_argument("--num-inducing", type=int, default=64, help="letters: per-point M")
    parser.add_argument("--hidden-width", type=int, default=None, help="letters: encoder width (default min(in, out))")
    parser.add_argument("--letters-train", type=int, default=20000)
    parser.add_argument("--letters-test", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--clip-norm", type=float, default=None,
                        help="clip each gradient to this global norm before Adam (default: no clipping)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--branches", type=int, default=32)
    parser.add_argument("--dsvi-inducing", default="256,128,128")
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--swa-epochs", type=int, default=0,
                        help="kin8nm: also score the mean parameters of the last N epochs (stochastic weight averaging)")
    parser.add_argument("--beta", type=float, default=1.0, help="AR2PP: KL weight of the predictive objective (paper: 1)")
    parser.add_argument("--float32", action="store_true")
    add_data_dir(parser)
    parser.add_argument("--tag", default=None)
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="only merge these result files (one run's splits over several processes) into "
                             "amortized_<tag>")
    parser.add_argument("--note", default=None, help="with --merge: a note for the merged record (e.g. a stopped run)")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.tag or "merged", args.note)
    args.dsvi_inducing = tuple(int(m) for m in args.dsvi_inducing.split(","))

    import jax

    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    from numpyro_dgp.datasets import parse_splits

    splits = parse_splits(args.splits)
    mode = "letters" if args.letters else "kin8nm"
    tag = args.tag or mode
    if mode == "kin8nm":
        settings = (f"widths (16, 4, 1), Matérn-5/2 (isotropic), {_optimizer_label(args)}, batch {args.batch_size}, "
                    f"{args.epochs} epochs; AR2PP KL weight beta = {args.beta:g}; AR2P/AR2PP: per-point M = (8, 4, 4), zero means, S = {args.branches} "
                    f"learned branches, diagonal encoder covariances, 2-hidden-layer encoders; DS-DGP: global "
                    f"M = {args.dsvi_inducing}, learned linear inner means, factorized guide, DGPElbo with 1 "
                    f"sample per step (the paper's S = 32 per step: 0.81 s/step in a separate 200-step float64 run on this machine), {args.branches} test samples")
        keys = args.methods.split(",")
    else:
        settings = (f"{args.letters_train} training / {args.letters_test} test points, per-point M = "
                    f"{args.num_inducing}, inner widths 2, inputs standardized, AR2P with S = {args.branches} (1 for one layer), "
                    f"probit, {_optimizer_label(args)}, batch {args.batch_size}, {args.epochs} epochs, encoder width "
                    f"{args.hidden_width or 'min(in, out)'}")
        keys = [str(int(n)) for n in args.layers.split(",")]
    record = {
        "command": command("amortized.py", argv), "machine": machine(),
        "float64": not args.float32, "mode": mode, "settings": settings, "swa_epochs": args.swa_epochs,
        "date": now(), "results": {k: [] for k in keys},
    }
    for split in splits:
        for key in keys:
            row = run_kin8nm(key, split, args) if mode == "kin8nm" else run_letters(int(key), split, args)
            record["results"][key].append(row)
            print(key, row, flush=True)
            write_results(f"amortized_{tag}", record, markdown(record))
    return record


if __name__ == "__main__":
    main()
