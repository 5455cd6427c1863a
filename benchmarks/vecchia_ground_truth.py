"""MCMC on the Vecchia DGP at UCI sizes: cost against N, and agreement with exact NUTS.

A 2-layer DGP (ARD RBF, hidden width D, identity mean) with its hyperparameters and noise
fixed at a DSVI fit on the whole training split (``recipes.run_uci``'s model: M = 100, 5000
steps), the last layer integrated out (``collapse_last=True``), the layer outputs at the first
``--num-held-out`` test inputs sampled jointly with the training rows (``grid``):

1. **agreement** at ``--agree-size`` training points: NUTS on ``exact_layers`` and on
   ``vecchia_layers(num_neighbors=m)`` for each m of ``--agree-neighbors``, same seed; per held-out point, the difference
   of the two posterior means of ``f`` in units of its Monte Carlo standard error (from each
   run's effective sample size), and the same for the variances;
2. **cost** at each of ``--sizes`` (training subsets, a fixed random order): neighbour search,
   seconds per log density and gradient (and the exact DGP's up to ``--exact-max-n``), then short NUTS and elliptical-slice runs: seconds
   per draw, bulk ESS per second of the held-out outputs (worst point), and the projected
   time to a bulk ESS of 400 at every held-out point in one chain's mode (400 / that rate);
   R-hat across the chains and the modes ``diagnostics.mcmc_health`` finds;
3. test log-likelihood and RMSE at the held-out points of the MCMC predictive (draws of ``f``
   plus the fitted noise) against the DSVI fit's, original units.

    python benchmarks/vecchia_ground_truth.py --data-dir ../shared/data/uci --agree-neighbors 25 50 100
    python benchmarks/vecchia_ground_truth.py --sizes 100 --agree-size 30 --agree-draws 20 --draws 20 --num-held-out 10 --dsvi-steps 100 --tag smoke
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin  # noqa: E402
from numpyro.handlers import substitute  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from numpyro.infer.util import initialize_model  # noqa: E402
from scipy.special import logsumexp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import add_data_dir, base_record, header, table, write_results  # noqa: E402

from numpyro_dgp import diagnostics, recipes  # noqa: E402
from numpyro_dgp.datasets import load_uci  # noqa: E402
from numpyro_dgp.handlers import exact_layers, vecchia_layers  # noqa: E402
from numpyro_dgp.infer import EllipticalSlice  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_dir(p)
    p.add_argument("--dataset", default="kin8nm")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--sizes", type=int, nargs="*", default=[200, 1000, 3000, 7373], help="cost runs (none: skip)")
    p.add_argument("--num-neighbors", type=int, default=25)
    p.add_argument("--num-held-out", type=int, default=100)
    p.add_argument("--agree-size", type=int, default=100)
    p.add_argument("--agree-neighbors", type=int, nargs="*", default=None,
                   help="Vecchia runs of the agreement check, one per m (default: --num-neighbors; none: skip)")
    p.add_argument("--agree-draws", type=int, default=500, help="NUTS warm-up and draws per chain (agreement)")
    p.add_argument("--draws", type=int, default=100, help="NUTS warm-up and draws per chain at the smallest size (cost)")
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--max-tree-depth", type=int, default=8)
    p.add_argument("--nuts-max-n", type=int, default=1000, help="short NUTS runs up to this N (above: gradient only)")
    p.add_argument("--ess-max-n", type=int, default=3000, help="short elliptical-slice runs up to this N")
    p.add_argument("--exact-max-n", type=int, default=3000, help="the exact DGP's gradient timed up to this N")
    p.add_argument("--dsvi-steps", type=int, default=5000)
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def fitted_model(args):
    """The DSVI fit on the whole training split; its model with the fitted parameters fixed."""
    start = time.perf_counter()
    run = recipes.run_uci(args.dataset, args.split, data_dir=args.data_dir, num_steps=args.dsvi_steps)
    split = load_uci(args.dataset, args.split, data_dir=args.data_dir)
    return substitute(run.model, data=run.params), run, split, time.perf_counter() - start


def held_out_metrics(f_draws, y, noise, y_scale):
    """Test LL and RMSE (original units) of the mixture of N(f_s, noise) over draws ``(S, G)``."""
    var = noise + 0.0
    ll = logsumexp(-0.5 * (y - f_draws) ** 2 / var - 0.5 * np.log(2 * np.pi * var), axis=0) - np.log(len(f_draws))
    return {"log_likelihood": float(np.mean(ll) - np.log(y_scale)),
            "rmse": float(np.sqrt(np.mean((f_draws.mean(0) - y) ** 2)) * y_scale)}


COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
_compile_seconds = [0.0]


def _listen(event, duration, **kwargs):
    if event in COMPILE_EVENTS:
        _compile_seconds[0] += duration


jax.monitoring.register_event_duration_secs_listener(_listen)


def run_chains(kernel, X, y, chains, warmup, draws, seed=0):
    """NUTS or elliptical slice chains (sequential); the seconds returned leave out the time JAX spent
    tracing and compiling (its monitoring events), which MCMC.run pays on every run."""
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws, num_chains=chains, chain_method="sequential",
                progress_bar=False)
    compiled, start = _compile_seconds[0], time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y, extra_fields=("num_steps",) if isinstance(kernel, NUTS) else ())
    grid = np.asarray(mcmc.get_samples(group_by_chain=True)["h2.grid"][..., 0])  # (chains, draws, G)
    return mcmc, grid, time.perf_counter() - start - (_compile_seconds[0] - compiled)


def summary(grid, seconds, warmup):
    """Seconds per iteration (warm-up and draws alike), ESS and R-hat of the held-out outputs, and ESS per
    second of one chain counting its warm-up: 400 over it is the projected time to ESS 400, warm-up included
    (at the run's share of warm-up)."""
    ess = np.asarray(effective_sample_size(grid)) if grid.shape[1] > 3 else np.full(grid.shape[2], np.nan)
    per_chain = [float(np.min(effective_sample_size(grid[c:c + 1]))) if grid.shape[1] > 3 else np.nan
                 for c in range(grid.shape[0])]
    rate = max(np.nanmin(per_chain), 0.0) / (seconds / grid.shape[0])
    iterations = grid.shape[0] * (warmup + grid.shape[1])
    return {"seconds": seconds, "seconds_per_iteration": seconds / iterations,
            "min_bulk_ess": float(np.min(ess)), "max_rhat": float(np.max(split_gelman_rubin(grid))),
            "min_ess_per_second_one_chain": float(rate),
            "projected_seconds_to_ess_400": float(400 / rate) if rate > 0 else float("inf")}


def agreement(model, split, args, order):
    """Exact NUTS against Vecchia NUTS (one run per m) at a small N, same seed."""
    idx = order[:args.agree_size]
    X, y = jnp.asarray(split.X_train[idx]), jnp.asarray(split.y_train[idx])
    grid = jnp.asarray(split.X_test[:args.num_held_out])
    neighbors = [args.num_neighbors] if args.agree_neighbors is None else args.agree_neighbors
    handlers = [("exact", exact_layers(model, grid=grid, collapse_last=True))]
    handlers += [(f"vecchia_m{m}", vecchia_layers(model, num_neighbors=m, grid=grid, collapse_last=True))
                 for m in neighbors]
    runs, draws = {}, {}
    for name, handler in handlers:
        kernel = NUTS(handler, max_tree_depth=args.max_tree_depth)
        _, draws[name], seconds = run_chains(kernel, X, y, args.chains, args.agree_draws, args.agree_draws)
        health = diagnostics.mcmc_health(draws_tree(draws[name]))
        runs[name] = {"seconds": seconds, "modes": [list(m) for m in health.modes],
                      **summary(draws[name], seconds, args.agree_draws)}
        print("agreement run", name, runs[name], flush=True)
    out = {"runs": runs, "against_exact": {}}
    for name in draws:
        if name != "exact":
            out["against_exact"][name] = z_scores(draws["exact"], draws[name])
    return out


def z_scores(a, b):
    """Per held-out point, the differences of the two runs' posterior means and variances in units of
    their combined Monte Carlo standard error (each run's from its effective sample size)."""
    se_mean = np.hypot(*(d.std((0, 1)) / np.sqrt(np.asarray(effective_sample_size(d))) for d in (a, b)))
    z_mean = (a.mean((0, 1)) - b.mean((0, 1))) / se_mean
    sq = [(d - d.mean((0, 1))) ** 2 for d in (a, b)]
    se_var = np.hypot(*(s.std((0, 1)) / np.sqrt(np.asarray(effective_sample_size(s))) for s in sq))
    z_var = (sq[0].mean((0, 1)) - sq[1].mean((0, 1))) / se_var
    sd = np.sqrt(a.var((0, 1)))
    return {"z_mean": z_mean.tolist(), "z_var": z_var.tolist(),
            "max_abs_z_mean": float(np.abs(z_mean).max()), "max_abs_z_var": float(np.abs(z_var).max()),
            "max_mean_difference_in_exact_sds": float(np.max(np.abs(a.mean((0, 1)) - b.mean((0, 1))) / sd)),
            "variance_ratio_range": [float(np.min(b.var((0, 1)) / a.var((0, 1)))),
                                     float(np.max(b.var((0, 1)) / a.var((0, 1))))],
            "fraction_within_3se": float(np.mean((np.abs(z_mean) < 3) & (np.abs(z_var) < 3)))}


def draws_tree(grid):
    from numpyro_dgp.diagnostics import from_layer_samples

    return from_layer_samples({"h2": grid[..., None]}, np.zeros((grid.shape[2], 1)))


def gradient_seconds(handler, X, y):
    """Seconds of ``initialize_model`` and the median of five jitted log density + gradient calls."""
    start = time.perf_counter()
    info = initialize_model(jax.random.PRNGKey(0), handler, model_args=(X, y))
    init_seconds = time.perf_counter() - start
    value_and_grad = jax.jit(jax.value_and_grad(info.potential_fn))
    jax.block_until_ready(value_and_grad(info.param_info.z))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(value_and_grad(info.param_info.z))
        times.append(time.perf_counter() - start)
    return init_seconds, float(np.median(times))


def cost(model, split, args, order, n, noise):
    idx = order[:n]
    X, y = jnp.asarray(split.X_train[idx]), jnp.asarray(split.y_train[idx])
    grid = jnp.asarray(split.X_test[:args.num_held_out])
    handler = vecchia_layers(model, num_neighbors=args.num_neighbors, grid=grid, collapse_last=True)
    init_seconds, seconds = gradient_seconds(handler, X, y)
    draws = max(10, int(args.draws * min(args.sizes) / n))
    record = {"n": n, "init_seconds": init_seconds, "seconds_per_gradient": seconds, "draws_per_chain": draws}
    if n <= args.exact_max_n:  # the exact DGP's O(n^3) gradient at the same points, for the crossover
        record["exact_seconds_per_gradient"] = gradient_seconds(
            exact_layers(model, grid=grid, collapse_last=True), X, y)[1]
    y_test = np.asarray(split.y_test[:args.num_held_out])
    samplers = [("nuts", NUTS(handler, max_tree_depth=args.max_tree_depth))] if n <= args.nuts_max_n else []
    samplers += [("elliptical_slice", EllipticalSlice(handler))] if n <= args.ess_max_n else []
    for name, kernel in samplers:
        steps = draws if name == "nuts" else 10 * draws
        mcmc, grid_draws, seconds = run_chains(kernel, X, y, args.chains, steps, steps)
        record[name] = summary(grid_draws, seconds, steps)
        record[name]["modes"] = [list(m) for m in diagnostics.mcmc_health(draws_tree(grid_draws)).modes]
        record[name]["held_out"] = held_out_metrics(grid_draws.reshape(-1, grid_draws.shape[2]), y_test, noise,
                                                    float(split.y_std))
        extra = mcmc.get_extra_fields()
        if "num_steps" in extra:
            record[name]["mean_leapfrog_steps"] = float(np.mean(extra["num_steps"]))
        if "num_evaluations" in extra:
            record[name]["mean_evaluations"] = float(np.mean(extra["num_evaluations"]))
        print(name, n, record[name], flush=True)
    return record


def main(argv=None):
    args = parse(argv)
    record = base_record("vecchia_ground_truth.py", argv)
    model, run, split, fit_seconds = fitted_model(args)
    noise = float(run.params["noise"]) if "noise" in run.params else float("nan")
    order = np.random.default_rng(0).permutation(len(split.X_train))
    dsvi = recipes_predict_held_out(run, split, args)
    record.update(settings=vars(args), dsvi={"fit_seconds": fit_seconds, "held_out": dsvi, "full_test": run.metrics,
                                             "num_train": len(split.X_train)})
    print("dsvi", record["dsvi"], flush=True)
    if args.agree_neighbors != []:
        record["agreement"] = agreement(model, split, args, order)
    record["cost"] = [cost(model, split, args, order, n, noise) for n in args.sizes]
    stem = f"vecchia_ground_truth_{args.dataset}" + (f"_{args.tag}" if args.tag else "")
    write_results(stem, record, report(record, args))


def recipes_predict_held_out(run, split, args):
    from numpyro_dgp import predict

    pred = predict(run.model, run.guide, run.params, jax.random.PRNGKey(1), split.X_test[:args.num_held_out],
                   num_samples=200)
    y = np.asarray(split.y_test[:args.num_held_out])
    m, v = np.asarray(pred.component_means), np.asarray(pred.component_variances)
    ll = logsumexp(-0.5 * (y - m) ** 2 / v - 0.5 * np.log(2 * np.pi * v), axis=0) - np.log(len(m))
    return {"log_likelihood": float(np.mean(ll) - np.log(float(split.y_std))),
            "rmse": float(np.sqrt(np.mean((np.asarray(pred.mean) - y) ** 2)) * float(split.y_std))}


def report(record, args):
    lines = header(f"MCMC on the Vecchia DGP: {args.dataset}, agreement with exact NUTS and cost against N",
                   record["command"], record["machine"], "float64", record["date"])
    lines += ["", f"2-layer DGP (hidden width 8), hyperparameters and noise fixed at a DSVI fit on the whole training "
              f"split ({args.dsvi_steps} steps, {record['dsvi']['fit_seconds']:.0f} s); last layer integrated out "
              f"(`collapse_last=True`); f at the first {args.num_held_out} test inputs sampled with the training rows "
              f"(`grid`); {args.chains} chains per run, sequential, one process on 2 cores; NUTS max tree depth "
              f"{args.max_tree_depth}. Seconds leave out JAX's tracing and compilation.", ""]
    if "agreement" in record:
        ag = record["agreement"]
        lines += [f"## Agreement at N = {args.agree_size}: exact NUTS against Vecchia NUTS "
                  f"({args.agree_draws} warm-up + {args.agree_draws} draws per chain)", ""]
        lines += table(["run", "seconds", "s per iteration (one chain)", "max R-hat", "min bulk ESS", "modes (chains)"],
                       [(k, f"{r['seconds']:.0f}", f"{r['seconds_per_iteration']:.2f}", f"{r['max_rhat']:.3f}",
                         f"{r['min_bulk_ess']:.0f}", r["modes"]) for k, r in ag["runs"].items()])
        lines += ["", "Against exact NUTS, per held-out point: z = difference of the posterior means (and variances) "
                  "over the two runs' combined Monte Carlo standard error (from each run's ESS).", ""]
        lines += table(["run", "max abs z, means", "max abs z, variances", "points with both abs z < 3",
                        "max mean difference (exact posterior sds)", "variance ratio Vecchia / exact"],
                       [(k, f"{z['max_abs_z_mean']:.1f}", f"{z['max_abs_z_var']:.1f}",
                         f"{100 * z['fraction_within_3se']:.0f}%", f"{z['max_mean_difference_in_exact_sds']:.2f}",
                         f"{z['variance_ratio_range'][0]:.2f} - {z['variance_ratio_range'][1]:.2f}")
                        for k, z in ag["against_exact"].items()])
        lines += [""]
    if record["cost"]:
        lines += [f"## Cost against N (m = {args.num_neighbors}; training subsets in a fixed random order)", ""]
        rows = []
        for c in record["cost"]:
            exact = f"{c['exact_seconds_per_gradient'] * 1e3:.0f}" if "exact_seconds_per_gradient" in c else ""
            if not any(name in c for name in ("nuts", "elliptical_slice")):
                rows.append((c["n"], f"{c['seconds_per_gradient'] * 1e3:.0f}", exact, "(gradient only)", *[""] * 7))
            for name in ("nuts", "elliptical_slice"):
                if name not in c:
                    continue
                r = c[name]
                per_draw = r.get("mean_leapfrog_steps", r.get("mean_evaluations", float("nan")))
                rows.append((c["n"], f"{c['seconds_per_gradient'] * 1e3:.0f}", exact, name, f"{per_draw:.1f}",
                             f"{r['seconds_per_iteration']:.3f}", f"{r['min_bulk_ess']:.0f}", f"{r['max_rhat']:.2f}",
                             f"{r['projected_seconds_to_ess_400'] / 60:.0f}",
                             f"{r['held_out']['log_likelihood']:.3f}", f"{r['held_out']['rmse']:.4f}"))
        lines += table(["N", "ms per density + gradient", "exact DGP: ms per density + gradient", "sampler", "leapfrogs / log densities per iteration",
                        "s per iteration (one chain)", "min bulk ESS", "max R-hat",
                        "projected min to ESS 400, warm-up included (one chain)",
                        "held-out LL", "held-out RMSE"], rows)
        lines += ["", "Short runs, as many warm-up iterations as draws (draws per chain shrink as N grows: "
                  "`draws_per_chain` in the JSON; elliptical slice: ten times as many): the projected "
                  "time is 400 over the worst held-out point's bulk ESS per second of one chain (its warm-up "
                  "counted), a rough figure from "
                  "runs far shorter than a converged one; a chain that has not left its start counts as slow or "
                  "fast at random. Held-out LL and RMSE are of chains fitted to N training points only (DSVI below "
                  "used all of them)."]
    d = record["dsvi"]
    lines += ["", f"DSVI (all {d['num_train']} training points) on the same held-out points: LL "
              f"{d['held_out']['log_likelihood']:.3f}, RMSE {d['held_out']['rmse']:.4f}; on the whole test set LL "
              f"{d['full_test']['log_likelihood']:.3f}, RMSE {d['full_test']['rmse']:.4f} (original units).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
