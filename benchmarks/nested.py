"""Nested variational compression (NVC, Hensman & Lawrence 2014) against DSVI on the same 2-layer
DGP, UCI regression: test log-likelihood, RMSE, time per step, and the training time NVC needs
to reach DSVI's final training objective.

The model is ``models.deep_gp_regression(2, inner_noise=...)`` for every method (M inducing
points per layer, hidden width ``min(D, 30)``, identity mean on the inner layer, learned output
noise on the inner layer and a Gaussian likelihood), the guide ``AutoFactorizedDGP``, Adam, the
same steps and minibatches. Methods:

* ``dsvi`` -- ``DGPElbo()`` (one sample of the inner layer per step);
* ``nvc`` -- ``NestedCompressionElbo()`` (the inner layer's inducing variance forwarded: per-point
  input variances, ``B M (M + 1) / 2`` exponentials per step);
* ``nvc_penalize`` -- ``NestedCompressionElbo(propagate_inducing_variance=False)`` (the inner
  layer forwards its noise only: psi statistics by matrix products).

Training objectives are compared on the same footing: both are lower bounds on the log marginal
likelihood of the same model, evaluated on the full training set (standardized units) with each
method's parameters: NVC's bound exactly (it is deterministic), DSVI's ELBO as the mean of
``--elbo-samples`` one-sample full-data evaluations (with its standard error). "Time to reach"
is the training time (compiled chunks only: no compilation, no evaluation) at the first
checkpoint (every ``--eval-every`` steps) where NVC's full-data bound is at least DSVI's final
full-data ELBO of the same split; "not reached" if it never is within the steps.

Step times: the median over training chunks of each run, and an interleaved measurement on the
first split of each data set (``--timing-rounds`` rounds of one chunk per method, alternating,
after training; median per method), which is what the step-time comparison uses, since the
machines drift by 30-40% within minutes.

Writes ``benchmarks/results/nested_<tag>.json`` and ``.md`` after every finished split, with the
exact command line; ``--combine`` joins runs of disjoint data sets or splits made by separate
processes (same settings).

Example (the committed results)::

    python benchmarks/nested.py --datasets bostonHousing,concrete,energy --splits 0-4 --tag small
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np
from _harness import add_data_dir, command, header, machine, now, table, write_results

DEFAULT_DATASETS = "bostonHousing,concrete,energy,wine-quality-red,kin8nm,power-plant"
METHODS = ("dsvi", "nvc", "nvc_penalize")
#: NVC's test LL must be within this many nats of DSVI's (the issue's criterion)
LL_MARGIN = 0.1


def _mean_se(values, fmt=".3f"):
    from numpyro_dgp.recipes import mean_and_standard_error

    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mean, se = mean_and_standard_error(values)
    return f"{mean:{fmt}} ({se:{fmt}})" if np.isfinite(se) else f"{mean:{fmt}} (one run)"


def _reach_summary(runs):
    reached = [r["seconds_to_reach_dsvi"] for r in runs if r.get("seconds_to_reach_dsvi") is not None]
    if not reached:
        return f"not reached (0/{len(runs)})"
    return f"{np.median(reached):.0f} s ({len(reached)}/{len(runs)} reached)"


def markdown(record):
    rows, verdicts = [], []
    for name, by_method in record["results"].items():
        for method, runs in by_method.items():
            if not runs:
                continue
            timing = record.get("timing", {}).get(name, {}).get(method)
            rows.append([name, method, len(runs), _mean_se([r["log_likelihood"] for r in runs]),
                         _mean_se([r["rmse"] for r in runs], ".4g"),
                         _mean_se([r.get("moment_matched_log_likelihood") for r in runs]),
                         _mean_se([r["final_objective"] for r in runs], ".1f"),
                         f"{np.median([r['seconds_per_step'] for r in runs]) * 1e3:.1f} ms",
                         "-" if timing is None else f"{timing * 1e3:.1f} ms",
                         f"{np.mean([r['train_seconds'] for r in runs]):.0f}",
                         "-" if method == "dsvi" else _reach_summary(runs)])
        dsvi = {r["split"]: r for r in by_method.get("dsvi", [])}
        for method in ("nvc", "nvc_penalize"):
            runs = [r for r in by_method.get(method, []) if r["split"] in dsvi]
            if not runs:
                continue
            gap = np.mean([r["log_likelihood"] - dsvi[r["split"]]["log_likelihood"] for r in runs])
            timing = record.get("timing", {}).get(name, {})
            faster = (f"{timing[method] / timing['dsvi']:.2f}x DSVI's step time" if method in timing and "dsvi" in timing
                      else "step time not measured")
            verdicts.append([name, method, f"{gap:+.3f}", "yes" if gap >= -LL_MARGIN else "NO", faster])
    lines = [
        *header("NVC against DSVI on UCI regression (numpyro-dgp)", record["command"], record["machine"],
                f"float64={record['float64']}", record["settings"]),
        "",
        "Test LL per test point and RMSE in original units; training objectives on the full training set "
        "(standardized units, nats): NVC's bound exactly, DSVI's ELBO estimated. Mean (standard error) over splits.",
        "",
        *table(["dataset", "method", "splits", "test LL", "RMSE", "test LL (moment-matched)",
                "final training objective", "s/step (training)", "s/step (interleaved, split 0)", "training s",
                "time to reach DSVI's final objective"], rows),
    ]
    if verdicts:
        lines += ["", f"NVC against DSVI (same splits): mean test-LL difference, within {LL_MARGIN} nats or ahead, "
                  "and interleaved step time:", "",
                  *table(["dataset", "method", "LL(method) - LL(DSVI)", "within 0.1 or ahead", "step time"], verdicts)]
    per_split = []
    for name, by_method in record["results"].items():
        for method, runs in by_method.items():
            for r in runs:
                mm = r.get("moment_matched_log_likelihood")
                reach = r.get("seconds_to_reach_dsvi")
                objective = f"{r['final_objective']:.1f}" + (
                    f" ({r['final_objective_se']:.1f})" if r.get("final_objective_se") is not None else "")
                per_split.append([name, method, r["split"], f"{r['log_likelihood']:.4f}", f"{r['rmse']:.4g}",
                                  "-" if mm is None else f"{mm:.4f}", objective,
                                  f"{r['seconds_per_step'] * 1e3:.1f} ms",
                                  f"{r['train_seconds']:.0f}",
                                  "-" if method == "dsvi" else ("not reached" if reach is None else f"{reach:.0f} s"),
                                  r["num_skipped"]])
    lines += ["", "Per split:", "",
              *table(["dataset", "method", "split", "LL", "RMSE", "LL (moment-matched)", "final objective", "s/step",
                      "training s", "time to reach DSVI's final", "skipped"], per_split)]
    if record.get("combined_from"):
        lines += ["", "Combined from " + ", ".join(f"`{f}`" for f in record["combined_from"])
                  + " (the same settings; disjoint data sets or splits, each run by its command above in its own process)."]
    return "\n".join(lines) + "\n"


def combine(paths, tag):
    """One record from runs with the same settings made by separate processes."""
    from papers.results import merge_by_split

    records = [json.loads(Path(p).read_text()) for p in paths]
    out = dict(records[0])
    def training_settings(record):
        # the interleaved timing is per run (its own table column); it does not change results
        return re.sub(r"; \d+ interleaved timing rounds of \d+ steps", "", record["settings"]), record["float64"]

    for r in records[1:]:
        if training_settings(r) != training_settings(out):
            raise SystemExit(f"--combine: `{r['command']}` ran with other settings:\n{r['settings']}")
    out["command"] = " ; ".join(r["command"] for r in records)
    out["date"] = " ; ".join(r["date"] for r in records)
    out["combined_from"] = [Path(p).name for p in paths]
    try:
        out["results"] = merge_by_split([r["results"] for r in records], "--combine")
    except ValueError as err:
        raise SystemExit(str(err)) from None
    out["timing"] = {}
    for r in records:
        for name, timing in r.get("timing", {}).items():
            out["timing"].setdefault(name, timing)
    write_results(f"nested_{tag}", out, markdown(out))
    return out


class _Run:
    """One method on one split: the model, SVI, and its training in chunks."""

    def __init__(self, method, X, y, args, rng_key):
        import jax
        import numpyro
        from numpyro.infer import SVI

        import numpyro_dgp as dgp
        from numpyro_dgp.guides import AutoFactorizedDGP

        self.method, self.X, self.y = method, X, y
        N, D = X.shape
        self.model = dgp.models.deep_gp_regression(
            2, num_inducing=min(args.num_inducing, N), hidden_width=min(D, 30), inner_noise=args.inner_noise)
        self.guide = AutoFactorizedDGP(self.model)
        if method == "dsvi":
            self.objective = dgp.DGPElbo()
        else:
            self.objective = dgp.NestedCompressionElbo(propagate_inducing_variance=method == "nvc")
        self.svi = SVI(self.model, self.guide, numpyro.optim.Adam(args.lr), self.objective)
        self.kwargs = {"batch_size": args.batch_size} if args.batch_size < N else {}
        self.eval_every = args.eval_every
        self.state, self.train_seconds, self.compile_seconds, self.chunk_seconds = None, 0.0, 0.0, []
        self.num_skipped, self.losses = 0, []
        self.rng_key = rng_key
        model, guide = self.model, self.guide
        if method == "dsvi":
            def elbo(params, key):
                return -dgp.DGPElbo().loss(key, params, model, guide, X, y)

            self.full_objective = jax.jit(jax.vmap(elbo, in_axes=(None, 0)))
        else:
            objective = self.objective
            self.full_objective = jax.jit(lambda params: -objective.loss(jax.random.PRNGKey(0), params, model, guide, X, y))

    def train_chunk(self):
        from numpyro_dgp import fit

        r = fit(self.svi, self.rng_key, self.X, self.y, num_steps=self.eval_every, chunk_size=self.eval_every,
                progress_bar=False, init_state=self.state, **self.kwargs)
        if self.state is None:
            self.compile_seconds = r.compile_seconds
        self.state = r.state
        self.chunk_seconds.append(float(np.sum(r.chunk_seconds)))
        self.train_seconds += self.chunk_seconds[-1]
        self.num_skipped += r.num_skipped
        self.losses.append(float(np.nanmean(r.losses)))
        return r

    @property
    def params(self):
        return self.svi.get_params(self.state)


def run_split(name, split, args, record):
    import jax
    import jax.numpy as jnp

    import numpyro_dgp as dgp
    from numpyro_dgp.datasets import load_uci

    data = load_uci(name, split, data_dir=args.data_dir)
    dtype = jnp.result_type(float)
    X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
    Xt, yt = jnp.asarray(data.X_test, dtype), jnp.asarray(data.y_test, dtype)
    key = jax.random.PRNGKey(split)
    runs = {m: _Run(m, X, y, args, jax.random.fold_in(key, 0)) for m in args.methods}
    curves = {m: [] for m in args.methods}
    num_chunks = -(-args.steps // args.eval_every)
    for _ in range(num_chunks):
        # methods alternate chunk by chunk, so machine drift hits them alike
        for m, run in runs.items():
            run.train_chunk()
            if m != "dsvi":
                curves[m].append((run.train_seconds, float(run.full_objective(run.params))))
    rows = {}
    dsvi_final = None
    if "dsvi" in runs:
        keys = jax.random.split(jax.random.fold_in(key, 1), args.elbo_samples)
        values = np.asarray(runs["dsvi"].full_objective(runs["dsvi"].params, keys))
        dsvi_final = float(values.mean())
        dsvi_se = float(values.std(ddof=1) / np.sqrt(len(values)))
    for m, run in runs.items():
        pred = dgp.predict(run.model, run.guide, run.params, jax.random.fold_in(key, 2), Xt, num_samples=100)
        metrics = dgp.metrics(pred, yt, y_scale=data.y_std)
        row = {"split": split, **metrics, "seconds_per_step": float(np.median(run.chunk_seconds) / args.eval_every),
               "compile_seconds": run.compile_seconds, "train_seconds": run.train_seconds,
               "num_skipped": run.num_skipped, "loss_curve": run.losses}
        if m == "dsvi":
            row.update(final_objective=dsvi_final, final_objective_se=dsvi_se)
        else:
            mm = dgp.predict_moment_matched(run.model, run.guide, run.params, Xt)
            row["moment_matched_log_likelihood"] = dgp.metrics(mm, yt, y_scale=data.y_std)["log_likelihood"]
            row["final_objective"] = curves[m][-1][1]
            row["objective_curve"] = curves[m]
            if dsvi_final is not None:
                reached = [t for t, value in curves[m] if value >= dsvi_final]
                row["seconds_to_reach_dsvi"] = reached[0] if reached else None
        rows[m] = row
    if split == args.timing_split and args.timing_rounds:
        per_step = {m: [] for m in runs}
        for _ in range(args.timing_rounds):
            for m, run in runs.items():
                run.train_chunk()
                per_step[m].append(run.chunk_seconds[-1] / args.eval_every)
        record.setdefault("timing", {})[name] = {m: float(np.median(v)) for m, v in per_step.items()}
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=DEFAULT_DATASETS, help="comma-separated UCI names")
    parser.add_argument("--splits", default="0-4")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {METHODS}")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--eval-every", type=int, default=100, help="steps per chunk and objective checkpoint")
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--inner-noise", type=float, default=0.01, help="initial noise variance of the inner layer")
    parser.add_argument("--elbo-samples", type=int, default=32, help="one-sample evaluations of DSVI's final ELBO")
    parser.add_argument("--timing-rounds", type=int, default=3)
    parser.add_argument("--timing-split", type=int, default=None, help="split of the interleaved timing (default: the first)")
    parser.add_argument("--float32", action="store_true")
    add_data_dir(parser)
    parser.add_argument("--tag", default=None, help="results file suffix")
    parser.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                        help="join these result files (same settings, disjoint runs) into nested_<tag>")
    args = parser.parse_args(argv)
    if args.combine:
        if not args.tag:
            raise SystemExit("--combine needs --tag (the combined file's name)")
        return combine(args.combine, args.tag)
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"--methods: unknown {sorted(unknown)}; choose from {METHODS}")
    if args.steps % args.eval_every:
        raise SystemExit("--steps must be a multiple of --eval-every")

    import jax

    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    from numpyro_dgp.datasets import parse_splits, resolve_uci_name

    names = [resolve_uci_name(n) for n in args.datasets.split(",")]
    splits = parse_splits(args.splits)
    if args.timing_split is None:
        args.timing_split = splits[0]
    tag = args.tag or "_".join(names)
    record = {
        "command": command("nested.py", argv),
        "machine": machine(),
        "float64": not args.float32,
        "settings": (f"2-layer deep_gp_regression, M={args.num_inducing}, hidden width min(D, 30), inner noise "
                     f"initial {args.inner_noise}, AutoFactorizedDGP, Adam lr={args.lr}, {args.steps} steps, batch "
                     f"min({args.batch_size}, N); DSVI: DGPElbo (1 sample); NVC: NestedCompressionElbo; "
                     f"objective checkpoints every {args.eval_every} steps, DSVI's final ELBO from {args.elbo_samples} "
                     f"samples; test: predict with 100 samples (and predict_moment_matched for NVC); "
                     f"{args.timing_rounds} interleaved timing rounds of {args.eval_every} steps"),
        "date": now(),
        "results": {n: {m: [] for m in args.methods} for n in names},
    }
    for name in names:
        for split in splits:
            start = time.perf_counter()
            rows = run_split(name, split, args, record)
            for m, row in rows.items():
                record["results"][name][m].append(row)
            summary = ", ".join(f"{m} LL {r['log_likelihood']:.3f} ({r['seconds_per_step'] * 1e3:.0f} ms/step)"
                                for m, r in rows.items())
            print(f"{name} split {split}: {summary} [{time.perf_counter() - start:.0f} s]", flush=True)
            write_results(f"nested_{tag}", record, markdown(record))
    return record


if __name__ == "__main__":
    main()
