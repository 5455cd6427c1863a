"""MCMC ground truth for paper 000's Table 1 problem: NUTS on the exact DGP vs the guides.

Same model as ``benchmarks/compositional.py`` (cos(pi x), 30 points on [-1, 1], RBF then
periodic layers with fixed hyperparameters, noise variance 1e-3). NUTS samples the exact DGP
(``handlers.exact_layers``: no inducing points) from dispersed starts, several chains; the
diagnostics group chains into modes and warn when they disagree. Each variational family
(factorised / joint / chain, several seeds, the Table 1 optimiser) is then compared with it
per layer at the grid points: variance ratio VI/MCMC, W1, coverage -- against all chains
pooled and against the MCMC mode nearest to the fit (a variational fit sits in one mode).

    python benchmarks/mcmc_ground_truth.py                     # full run (results committed)
    python benchmarks/mcmc_ground_truth.py --chains 2 --warmup 100 --samples 100 --seeds 1 --steps 500 --tag smoke
"""

from __future__ import annotations

import argparse
import json
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
from compositional import TABLE1, fit_one, table1_data, table1_kernels  # noqa: E402

from numpyro_dgp import diagnostics  # noqa: E402
from numpyro_dgp.compositional import composed_gp  # noqa: E402
from numpyro_dgp.handlers import exact_layers  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FAMILIES = ("factorised", "joint", "chain")


def run_nuts(X, y, grid, chains, warmup, samples, seed, max_tree_depth):
    model = composed_gp(table1_kernels(), num_inducing=TABLE1["num_inducing"], noise=TABLE1["noise"])
    kernel = NUTS(exact_layers(model, grid=grid, parameterisation="noncentred", jitter=1e-6),
                  dense_mass=True, max_tree_depth=max_tree_depth)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, num_chains=chains,
                chain_method="sequential", progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y)
    jax.block_until_ready(mcmc.get_samples())
    return mcmc, time.perf_counter() - start


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
    p.add_argument("--chains", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--max-tree-depth", type=int, default=8)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--grid", type=int, default=11)
    p.add_argument("--interior", type=float, default=0.6, help="grid points with |x| <= this are interior")
    p.add_argument("--vi-samples", type=int, default=2000)
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    command = "python benchmarks/mcmc_ground_truth.py " + " ".join(argv if argv is not None else sys.argv[1:])

    X, y = table1_data()
    grid = jnp.linspace(-1.0, 1.0, args.grid)[:, None]
    interior = [int(i) for i in np.where(np.abs(np.asarray(grid[:, 0])) <= args.interior + 1e-12)[0]]

    mcmc, nuts_seconds = run_nuts(X, y, grid, args.chains, args.warmup, args.samples, 0, args.max_tree_depth)
    reference = diagnostics.from_mcmc(mcmc, grid, label="NUTS (exact layers)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", diagnostics.MultimodalityWarning)
        health = diagnostics.mcmc_health(reference)
    mode_warning = [str(w.message) for w in caught if issubclass(w.category, diagnostics.MultimodalityWarning)]
    per_mode = [diagnostics.mcmc_health(mode_tree(reference, m), warn=False).table for m in health.modes]
    print(health.table.to_string(), "\nmodes", health.modes, flush=True)

    rows, fits = [], {}
    model_kwargs = dict(num_inducing=TABLE1["num_inducing"], noise=TABLE1["noise"], jitter=TABLE1["jitter"])
    for family in FAMILIES:
        for seed in range(args.seeds):
            model, guide, result, row = fit_one(family, table1_kernels(), X, y, seed, args.steps, "deterministic", **dict(model_kwargs))
            vi = diagnostics.from_guide(model, guide, result.params, jax.random.PRNGKey(3000 + seed), grid,
                                        num_samples=args.vi_samples, label=family)
            k, gap = nearest_mode(vi, reference, health.modes)
            pooled = diagnostics.layer_metrics(vi, reference)
            near = diagnostics.layer_metrics(vi, mode_tree(reference, health.modes[k]))
            for name in diagnostics.layer_names(reference):
                sel = pooled[(pooled.layer == name) & pooled.grid.isin(interior)]
                seln = near[(near.layer == name) & near.grid.isin(interior)]
                rows.append(dict(
                    family=family, seed=seed, layer=name, elbo=row["elbo"], fit_seconds=row["seconds"],
                    ratio_pooled=float(sel.variance_ratio.median()), ratio_mode=float(seln.variance_ratio.median()),
                    w1_pooled=float(sel.wasserstein.mean()), w1_mode=float(seln.wasserstein.mean()),
                    coverage_pooled=float(sel.coverage.mean()), coverage_mode=float(seln.coverage.mean()),
                    var_vi=float(sel.var_vi.median()), var_mcmc_pooled=float(sel.var_mcmc.median()),
                    var_mcmc_mode=float(seln.var_mcmc.median()), mode=k, mode_gap=gap,
                ))
            if seed == 0:
                fits[family] = vi
            print(family, seed, [(r["layer"], f"{r['ratio_pooled']:.2e}", f"{r['ratio_mode']:.2e}") for r in rows[-2:]], flush=True)

    write_report(args, command, rows, health, per_mode, mode_warning, nuts_seconds, interior, grid)
    comp = diagnostics.compare(fits, reference, points=interior)
    tag = f"_{args.tag}" if args.tag else ""
    comp.figures["layers"].savefig(os.path.join(RESULTS, f"mcmc_ground_truth_layers{tag}.png"), dpi=90)
    comp.figures["marginals"].savefig(os.path.join(RESULTS, f"mcmc_ground_truth_marginals{tag}.png"), dpi=90)


def write_report(args, command, rows, health, per_mode, mode_warning, nuts_seconds, interior, grid):
    tag = f"_{args.tag}" if args.tag else ""
    path = os.path.join(RESULTS, f"mcmc_ground_truth{tag}")
    json.dump(dict(command=command, date=str(date.today()), args=vars(args), rows=rows,
                   health=health.table.to_dict("records"), modes=health.modes,
                   per_mode_health=[t.to_dict("records") for t in per_mode],
                   mode_warning=mode_warning, nuts_seconds=nuts_seconds, interior=interior),
              open(path + ".json", "w"), indent=1)
    lines = [
        "# MCMC ground truth on paper 000's Table 1 problem",
        "",
        f"Command: `{command}` ({date.today()}, 2-core CPU, float64). Problem as in "
        "`compositional.md` (cos(pi x), 30 points, RBF -> periodic, noise 1e-3, fixed hyperparameters).",
        "",
        f"## NUTS on the exact DGP (`handlers.exact_layers`, non-centred, dense mass, max tree depth {args.max_tree_depth}, {args.chains} chains "
        f"from dispersed starts, {args.warmup} warmup + {args.samples} draws each): {nuts_seconds:.0f} s wall",
        "",
        "| layer | max R-hat | min bulk ESS | min tail ESS | divergences |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in health.table.to_dict("records"):
        lines.append(f"| {r['layer']} | {r['max_rhat']:.3g} | {r['min_ess_bulk']:.0f} | {r['min_ess_tail']:.0f} | {r['divergences']} |")
    lines += ["", f"Chains grouped into modes (per-chain means within 3 within-chain sds): {health.modes}.", ""]
    if mode_warning:
        lines += ["**MultimodalityWarning**: " + mode_warning[0], ""]
    lines += ["Per mode:", "", "| mode (chains) | layer | max R-hat | min bulk ESS |", "| --- | --- | --- | --- |"]
    for m, t in zip(health.modes, per_mode):
        for r in t.to_dict("records"):
            lines.append(f"| {m} | {r['layer']} | {r['max_rhat']:.3g} | {r['min_ess_bulk']:.0f} |")
    xs = ", ".join(f"{float(grid[i, 0]):.1f}" for i in interior)
    lines += [
        "",
        f"## Variational families against it ({args.seeds} seeds, {args.steps} Adam steps as in Table 1; "
        f"interior grid points x = {xs})",
        "",
        "Median over interior points of Var_VI / Var_MCMC, then mean ± sd over seeds; 'pooled' uses all "
        "chains, 'nearest mode' the chains of the mode closest to the fit's mean first layer. Coverage: "
        "share of MCMC draws inside the VI central 90% interval (0.90 if they agree).",
        "",
        "| family | layer | ratio (pooled) | ratio (nearest mode) | coverage (pooled) | coverage (mode) | W1 (mode) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        for layer in sorted({r["layer"] for r in rows}):
            sel = [r for r in rows if r["family"] == family and r["layer"] == layer]
            if not sel:
                continue

            def ms(key, sci=True):
                v = np.array([r[key] for r in sel])
                return f"{v.mean():.2e} ± {v.std():.1e}" if sci else f"{v.mean():.3f} ± {v.std():.3f}"

            lines.append(f"| {family} | {layer} | {ms('ratio_pooled')} | {ms('ratio_mode')} | "
                         f"{ms('coverage_pooled', False)} | {ms('coverage_mode', False)} | {ms('w1_mode')} |")
    open(path + ".md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
