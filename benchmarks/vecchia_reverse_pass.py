"""What the hand-written reverse pass of ``core.vecchia_sample`` buys: A/B against autodiff of the scan.

The Vecchia DGP of ``vecchia_ground_truth.py`` (2-layer, hidden width 8, m = 25, last layer
integrated out, 100 held-out inputs as the grid) at kin8nm subsets; its log density + gradient,
``jax.jit``-ed, once with the package's ``vecchia_sample`` and once with the previous one (the
same scan, differentiated by JAX), in alternating rounds in one process; medians. Parameters from
a short DSVI fit (the cost does not depend on them).

    python benchmarks/vecchia_reverse_pass.py --data-dir ../shared/data/uci
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
from numpyro.handlers import substitute  # noqa: E402
from numpyro.infer.util import initialize_model  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import add_data_dir, base_record, header, table, write_results  # noqa: E402

import numpyro_dgp.handlers._vecchia as vecchia_module  # noqa: E402
from numpyro_dgp import recipes  # noqa: E402
from numpyro_dgp.datasets import load_uci  # noqa: E402
from numpyro_dgp.handlers import vecchia_layers  # noqa: E402


def scan_autodiff(factors, eps, given=None):
    """The previous ``vecchia_sample``: the same scan, its gradient left to JAX."""
    P, start = eps.shape[0], 0 if given is None else given.shape[-1]
    n = start + eps.shape[-1]
    coef = jnp.broadcast_to(factors.coef, (P, n) + factors.coef.shape[-1:])
    scale = jnp.broadcast_to(factors.scale, (P, n))
    residual = jnp.zeros((P, n), eps.dtype)
    if given is not None:
        residual = residual.at[:, :start].set(given)

    def step(residual, k):
        value = jnp.sum(coef[:, k] * residual[:, factors.neighbors[k]], axis=-1) + scale[:, k] * eps[:, k - start]
        return residual.at[:, k].set(value), None

    return jax.lax.scan(step, residual, jnp.arange(start, n))[0]


def compiled_gradient(model, X, y, grid, sample):
    vecchia_module.vecchia_sample = sample  # the name the handler calls, while it traces
    try:
        info = initialize_model(jax.random.PRNGKey(0), vecchia_layers(model, grid=grid, collapse_last=True),
                                model_args=(X, y))
        fn = jax.jit(jax.value_and_grad(info.potential_fn))
        jax.block_until_ready(fn(info.param_info.z))
    finally:
        vecchia_module.vecchia_sample = PACKAGE
    return lambda: jax.block_until_ready(fn(info.param_info.z))


PACKAGE = vecchia_module.vecchia_sample


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_dir(p)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 7373])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    record = base_record("vecchia_reverse_pass.py", argv)
    split = load_uci("kin8nm", 0, data_dir=args.data_dir)
    order = np.random.default_rng(0).permutation(len(split.X_train))
    grid = jnp.asarray(split.X_test[:100])
    rows = []
    for n in args.sizes:
        X, y = jnp.asarray(split.X_train[order[:n]]), jnp.asarray(split.y_train[order[:n]])
        model, _, fit = recipes.fit_dsvi(jax.random.PRNGKey(0), X, y, num_steps=10)
        model = substitute(model, data=fit.params)
        runs = {"hand-written": compiled_gradient(model, X, y, grid, PACKAGE),
                "scan autodiff": compiled_gradient(model, X, y, grid, scan_autodiff)}
        times = {name: [] for name in runs}
        for _ in range(args.rounds):  # ABAB
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        medians = {name: float(np.median(t)) for name, t in times.items()}
        rows.append({"n": n, "seconds": times, "median_seconds": medians})
        print(rows[-1], flush=True)
    record.update(settings=vars(args), rows=rows)
    lines = header("Vecchia DGP gradient: hand-written reverse pass against autodiff of the scan", record["command"],
                   record["machine"], "float64", record["date"])
    lines += ["", "kin8nm rows, 2-layer DGP (hidden width 8), m = 25, 100 held-out inputs, last layer collapsed; one "
              f"jitted log density + gradient, {args.rounds} alternating rounds, medians.", ""]
    lines += table(["N", "hand-written ms", "scan autodiff ms", "ratio"],
                   [(r["n"], f"{r['median_seconds']['hand-written'] * 1e3:.0f}",
                     f"{r['median_seconds']['scan autodiff'] * 1e3:.0f}",
                     f"{r['median_seconds']['scan autodiff'] / r['median_seconds']['hand-written']:.2f}")
                    for r in rows])
    write_results("vecchia_reverse_pass_kin8nm", record, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
