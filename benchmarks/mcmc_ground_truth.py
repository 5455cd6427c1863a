"""MCMC ground truth for Ustyuzhaninov et al.'s (2020) Table 1 problem: NUTS on the exact DGP vs the guides.

Same model as ``benchmarks/compositional.py`` (cos(pi x), 30 points on [-1, 1], RBF then
periodic layers with fixed hyperparameters, noise variance 1e-3). The exact posterior has
many modes whose masses differ by up to thousands of nats, so the ground truth is built in three steps:

1. explore: NUTS on the exact DGP with its last layer integrated out
   (``handlers.exact_layers(..., collapse_last=True)``), many chains from dispersed starts;
   the chains are grouped into modes (``diagnostics.mcmc_health``);
2. weigh: each mode's posterior mass by bridge sampling (``diagnostics.mode_evidence``);
   the modes pooled by mass (``diagnostics.mode_mixture``) are the ground truth;
3. confirm: 4 fresh chains started at draws of the heaviest mode, with R-hat and ESS.

Each variational family (factorized / joint / chain, several seeds, the Table 1 optimizer)
is then compared with it per layer at the grid points: variance ratio VI/MCMC, W1, coverage
-- against the modes by mass, the confirmed heaviest mode, and the mode nearest the fit.

    python benchmarks/mcmc_ground_truth.py                     # full run (results committed)
    python benchmarks/mcmc_ground_truth.py --chains 4 --warmup 100 --samples 100 --confirm-warmup 100 --confirm-samples 100 --seeds 1 --steps 500 --tag smoke
    python benchmarks/mcmc_ground_truth.py --no-collapse ...   # the full exact model (f2 sampled too)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from datetime import date

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import RESULTS, command, table, write_results  # noqa: E402
from compositional import TABLE1, fit_one, table1_data, table1_kernels  # noqa: E402
from papers.compositional import composed_gp  # noqa: E402

from numpyro_dgp import diagnostics  # noqa: E402
from numpyro_dgp.handlers import exact_layers  # noqa: E402

FAMILIES = ("factorized", "joint", "chain")


def exact_model(grid, collapse):
    model = composed_gp(table1_kernels(), num_inducing=TABLE1["num_inducing"], noise=TABLE1["noise"])
    return exact_layers(model, grid=grid, parameterization="noncentered", jitter=1e-6, collapse_last=collapse)


def run_nuts(model, X, y, chains, warmup, samples, seed, max_tree_depth, init_params=None, target_accept_prob=0.8):
    kernel = NUTS(model, dense_mass=True, max_tree_depth=max_tree_depth, target_accept_prob=target_accept_prob)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, num_chains=chains,
                chain_method="sequential", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y, init_params=init_params)
    jax.block_until_ready(mcmc.get_samples())
    return mcmc, time.perf_counter() - start


def starts_in_mode(samples, chains, count):
    """``count`` draws spread over the mode's chains, as per-chain initial values of the latent sites."""
    latent = {k: np.asarray(v) for k, v in samples.items() if k.endswith("_white")}
    pool = [(c, d) for c in chains for d in range(next(iter(latent.values())).shape[1])]
    picks = [pool[i] for i in np.linspace(0, len(pool) - 1, count).astype(int)]
    return {k: jnp.asarray(np.stack([v[c, d] for c, d in picks])) for k, v in latent.items()}


def mode_tree(tree, chains):
    """The sub-tree of the given chains."""
    layers = {n: np.asarray(tree["posterior"][n].values)[chains] for n in diagnostics.layer_names(tree)}
    return diagnostics.from_layer_samples(layers, np.asarray(tree["constant_data"]["grid_x"].values))


def nearest_mode(vi, mcmc, modes):
    """The mode whose chains' mean of the first layer is closest to the fit's."""
    name = diagnostics.layer_names(mcmc)[0]
    target = np.asarray(vi["posterior"][name].values).mean((0, 1))
    per_chain = np.asarray(mcmc["posterior"][name].values).mean(1)
    dist = [np.abs(per_chain[m].mean(0) - target).mean() for m in modes]
    return int(np.argmin(dist)), float(np.min(dist))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chains", type=int, default=32, help="exploration chains (dispersed starts)")
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--confirm-chains", type=int, default=4)
    p.add_argument("--confirm-warmup", type=int, default=2000)
    p.add_argument("--confirm-tree-depth", type=int, default=10)
    p.add_argument("--confirm-accept", type=float, default=0.99, help="NUTS target acceptance of the confirmation run")
    p.add_argument("--confirm-samples", type=int, default=1000)
    p.add_argument("--evidence-draws", type=int, default=4000)
    p.add_argument("--no-collapse", action="store_true", help="sample the last layer too (the full exact model)")
    p.add_argument("--max-tree-depth", type=int, default=8)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--grid", type=int, default=11)
    p.add_argument("--interior", type=float, default=0.6, help="grid points with |x| <= this are interior")
    p.add_argument("--vi-samples", type=int, default=2000)
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    cmd = command("mcmc_ground_truth.py", argv)

    X, y = table1_data()
    grid = jnp.linspace(-1.0, 1.0, args.grid)[:, None]
    interior = [int(i) for i in np.where(np.abs(np.asarray(grid[:, 0])) <= args.interior + 1e-12)[0]]
    model = exact_model(grid, collapse=not args.no_collapse)

    # 1. explore
    mcmc, explore_seconds = run_nuts(model, X, y, args.chains, args.warmup, args.samples, 0, args.max_tree_depth)
    explored = diagnostics.from_mcmc(mcmc, grid, label="NUTS (exact layers)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", diagnostics.MultimodalityWarning)
        health = diagnostics.mcmc_health(explored)
    mode_warning = [str(w.message) for w in caught if issubclass(w.category, diagnostics.MultimodalityWarning)]
    per_mode = [diagnostics.mcmc_health(mode_tree(explored, m), warn=False).table for m in health.modes]
    print(health.table.to_string(), "\nmodes", health.modes, f"\nexplore {explore_seconds:.0f} s", flush=True)

    # 2. weigh the modes
    start = time.perf_counter()
    samples = mcmc.get_samples(group_by_chain=True)
    evidence = diagnostics.mode_evidence(model, samples, health.modes, jax.random.PRNGKey(7), X, y,
                                         num_draws=args.evidence_draws)
    evidence_seconds = time.perf_counter() - start
    # the same estimate from each chain of a several-chain mode alone: how far to trust the weights
    per_chain = {}
    for i, chains in enumerate(evidence.modes):
        if len(chains) > 1:
            alone = diagnostics.mode_evidence(model, {k: v[np.asarray(chains)] for k, v in samples.items()},
                                              [[j] for j in range(len(chains))], jax.random.PRNGKey(7), X, y,
                                              num_draws=args.evidence_draws)
            per_chain[i] = alone.log_evidence.tolist()
    by_mass = diagnostics.mode_mixture(explored, evidence, jax.random.PRNGKey(8), label="NUTS, modes by mass")
    heaviest = int(np.argmax(evidence.weights))
    print("log evidence", np.round(evidence.log_evidence, 1), "khat", np.round(evidence.khat, 2), flush=True)

    # 3. confirm the heaviest mode with fresh chains started inside it
    init = starts_in_mode(samples, evidence.modes[heaviest], args.confirm_chains)
    confirm, confirm_seconds = run_nuts(model, X, y, args.confirm_chains, args.confirm_warmup, args.confirm_samples,
                                        1, args.confirm_tree_depth, init_params=init,
                                        target_accept_prob=args.confirm_accept)
    confirmed = diagnostics.from_mcmc(confirm, grid, label="NUTS, heaviest mode")
    confirm_health = diagnostics.mcmc_health(confirmed, warn=False)
    print(confirm_health.table.to_string(), "\nconfirm modes", confirm_health.modes, flush=True)

    rows, fits = [], {}
    model_kwargs = dict(num_inducing=TABLE1["num_inducing"], noise=TABLE1["noise"], jitter=TABLE1["jitter"])
    for family in FAMILIES:
        for seed in range(args.seeds):
            vi_model, guide, result, row = fit_one(family, table1_kernels(), X, y, seed, args.steps, "deterministic",
                                                   **dict(model_kwargs))
            vi = diagnostics.from_guide(vi_model, guide, result.params, jax.random.PRNGKey(3000 + seed), grid,
                                        num_samples=args.vi_samples, label=family)
            k, gap = nearest_mode(vi, explored, health.modes)
            metrics = {
                "mass": diagnostics.layer_metrics(vi, by_mass),
                "heaviest": diagnostics.layer_metrics(vi, confirmed),
                "mode": diagnostics.layer_metrics(vi, mode_tree(explored, health.modes[k])),
            }
            for name in diagnostics.layer_names(explored):
                rec = dict(family=family, seed=seed, layer=name, elbo=row["elbo"], fit_seconds=row["seconds"],
                           mode=k, mode_gap=gap, mode_weight=float(evidence.weights[k]))
                for key, per_point in metrics.items():
                    sel = per_point[(per_point.layer == name) & per_point.grid.isin(interior)]
                    rec[f"ratio_{key}"] = float(sel.variance_ratio.median())
                    rec[f"w1_{key}"] = float(sel.wasserstein.mean())
                    rec[f"coverage_{key}"] = float(sel.coverage.mean())
                    rec[f"var_mcmc_{key}"] = float(sel.var_mcmc.median())
                rec["var_vi"] = float(sel.var_vi.median())
                rows.append(rec)
            if seed == 0:
                fits[family] = vi
            print(family, seed, [(r["layer"], f"{r['ratio_mass']:.2e}", f"{r['ratio_mode']:.2e}") for r in rows[-2:]],
                  flush=True)

    timings = dict(explore=explore_seconds, evidence=evidence_seconds, confirm=confirm_seconds)
    write_report(args, cmd, rows, health, per_mode, mode_warning, evidence, per_chain, confirm_health, timings,
                 interior, grid)
    comp = diagnostics.compare(fits, by_mass, points=interior)
    tag = f"_{args.tag}" if args.tag else ""
    comp.figures["layers"].savefig(RESULTS / f"mcmc_ground_truth_layers{tag}.png", dpi=90)
    comp.figures["marginals"].savefig(RESULTS / f"mcmc_ground_truth_marginals{tag}.png", dpi=90)


def health_rows(health):
    """A ``mcmc_health`` table as markdown lines."""
    return table(["layer", "max R-hat", "min bulk ESS", "min tail ESS", "divergences"],
                 [[r["layer"], f"{r['max_rhat']:.3g}", f"{r['min_ess_bulk']:.0f}", f"{r['min_ess_tail']:.0f}",
                   r["divergences"]] for r in health.table.to_dict("records")])


def write_report(args, command, rows, health, per_mode, mode_warning, evidence, per_chain, confirm_health, timings,
                 interior, grid):
    tag = f"_{args.tag}" if args.tag else ""
    record = dict(command=command, date=str(date.today()), args=vars(args), rows=rows,
                  health=health.table.to_dict("records"), modes=health.modes,
                  per_mode_health=[t.to_dict("records") for t in per_mode], mode_warning=mode_warning,
                  log_evidence=evidence.log_evidence.tolist(), log_evidence_se=evidence.log_evidence_se.tolist(),
                  mode_weights=evidence.weights.tolist(), khat=evidence.khat.tolist(),
                  per_chain_log_evidence={str(evidence.modes[i]): v for i, v in per_chain.items()},
                  confirm_health=confirm_health.table.to_dict("records"), confirm_modes=confirm_health.modes,
                  seconds=timings, interior=interior)
    model = "the full exact model (f2 sampled)" if args.no_collapse else "last layer integrated out (`collapse_last=True`)"
    lines = [
        "# MCMC ground truth on Ustyuzhaninov et al.'s (2020) Table 1 problem",
        "",
        f"Command: `{command}` ({date.today()}, 2-core CPU, one core, float64). Problem as in "
        "`compositional.md` (cos(pi x), 30 points, RBF -> periodic, noise 1e-3, fixed hyperparameters).",
        "",
        f"## 1. Explore: NUTS on the exact DGP, {model}",
        "",
        f"Non-centered, dense mass, max tree depth {args.max_tree_depth}, {args.chains} chains from dispersed starts "
        f"(NumPyro's default init, uniform in (-2, 2)), {args.warmup} warmup + {args.samples} draws each: "
        f"{timings['explore']:.0f} s wall (compile included).",
        "",
        *health_rows(health),
    ]
    lines += ["", f"Chains grouped into {len(health.modes)} modes (per-chain means within 3 within-chain sds).", ""]
    if mode_warning:
        lines += ["**MultimodalityWarning** (abridged): MCMC chains settled in "
                  f"{len(health.modes)} different modes; pooled summaries average these compositions away.", ""]
    lines += [
        "## 2. Weigh: each mode's posterior mass (`diagnostics.mode_evidence`: bridge sampling between the mode's "
        f"draws and a Gaussian fitted to them, {args.evidence_draws} Gaussian draws; {timings['evidence']:.0f} s)",
        "",
        "Sorted by mass. log Z: log of the mode's unnormalized mass (se: Monte Carlo standard error, draws "
        "taken as independent, so a lower bound); k-hat: Pareto k of plain importance sampling from the "
        "Gaussian (> 0.7 or nan: that estimator alone would be unreliable, the reason for the bridge). "
        "R-hat and ESS: the mode's own chains (nan with one chain). Per-chain log Z: the same estimate from "
        "each of the mode's chains alone (their spread is the honest uncertainty of log Z).",
        "",
    ]
    order = np.argsort(-evidence.log_evidence)
    rows_by_mass = []
    for i in order:
        t = per_mode[i].to_dict("records")
        rhat = max(r["max_rhat"] for r in t)
        ess = min(r["min_ess_bulk"] for r in t)
        rows_by_mass.append([evidence.modes[i], f"{evidence.log_evidence[i]:.1f}", f"{evidence.log_evidence_se[i]:.2f}",
                             f"{evidence.khat[i]:.2f}", f"{evidence.weights[i]:.3g}", f"{rhat:.3g}", f"{ess:.0f}",
                             ", ".join(f"{v:.1f}" for v in per_chain[i]) if i in per_chain else ""])
    lines += table(["mode (chains)", "log Z", "se", "k-hat", "weight", "max R-hat", "min bulk ESS", "per-chain log Z"],
                   rows_by_mass)
    top = order[0]
    gap = evidence.log_evidence[top] - evidence.log_evidence[order[1]] if len(order) > 1 else float("inf")
    lines += ["", f"The heaviest mode {evidence.modes[top]} holds {evidence.weights[top]:.6g} of the mass found "
              f"({len(evidence.modes[top])} of {args.chains} chains found it; next mode {gap:.1f} nats lighter). "
              "Modes no chain found are not in the sum.", ""]
    lines += [
        f"## 3. Confirm: {args.confirm_chains} fresh chains started at draws of the heaviest mode "
        f"({args.confirm_warmup} warmup + {args.confirm_samples} draws, max tree depth {args.confirm_tree_depth}, "
        f"target acceptance {args.confirm_accept}; {timings['confirm']:.0f} s wall, compile included)",
        "",
        *health_rows(confirm_health),
    ]
    lines += ["", f"Modes among the confirmation chains: {confirm_health.modes}.", ""]
    xs = ", ".join(f"{float(grid[i, 0]):.1f}" for i in interior)
    lines += [
        f"## Variational families against it ({args.seeds} seeds, {args.steps} Adam steps as in Table 1; "
        f"interior grid points x = {xs})",
        "",
        "Median over interior points of Var_VI / Var_MCMC, then mean ± sd over seeds. References: 'by mass' = "
        "the explored modes pooled by their weights; 'heaviest' = the confirmation chains; 'nearest' = the "
        "explored mode closest to the fit's mean first layer (its weight in the last column). Coverage: "
        "share of MCMC draws inside the VI central 90% interval (0.90 if they agree).",
        "",
    ]
    family_rows = []
    for family in FAMILIES:
        for layer in sorted({r["layer"] for r in rows}):
            sel = [r for r in rows if r["family"] == family and r["layer"] == layer]
            if not sel:
                continue

            def ms(key, sci=True):
                v = np.array([r[key] for r in sel])
                return f"{v.mean():.2e} ± {v.std():.1e}" if sci else f"{v.mean():.3f} ± {v.std():.3f}"

            family_rows.append([family, layer, ms("ratio_mass"), ms("ratio_heaviest"), ms("ratio_mode"),
                                ms("coverage_mass", False), ms("w1_mass"), ms("mode_weight")])
    lines += table(["family", "layer", "ratio (by mass)", "ratio (heaviest)", "ratio (nearest)", "coverage (by mass)",
                    "W1 (by mass)", "nearest mode's weight"], family_rows)
    write_results(f"mcmc_ground_truth{tag}", record, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
