"""What one training step costs at large M for each guide and objective: factorizations,
triangular solves, matrix-product FLOPs and time, against the DSVI step on the same model.

A 2-layer DGP (width 8, M inducing points per layer, ARD RBF kernels) on 1000 synthetic points
with 8 inputs (the data of ``scale.py``; ``--width``, ``--input-dim``), the whole batch in every
step; each configuration's ``SVI.update`` compiled on its own, then timed in ``--rounds``
alternating rounds (the order reversed every round) of ``--repeats`` steps, medians. The counts come from the compiled program (every function
inlined, so a count is how often one step runs it; :func:`operation_counts` reads them):
LAPACK Cholesky calls (the blocked factorization's leaves), LAPACK triangular-solve calls (one
batched call per triangular inverse) and matrix-product FLOPs. The math needs one ``K(Z, Z)``
factorization per layer, shared by the layer's outputs and samples; a guide that correlates
layers adds its own factor's work (``AutoJointDGP``: one ``L P M`` square factor;
``AutoChainDGP``: per-layer blocks). "Per-point (MP)^2 products" counts the products that do at
least ``(M P)^2 / 2`` multiply-adds per point (``P`` the width; half, so that a product of
exactly ``(M P)^2`` counts however XLA splits it): DSVI's per-point work is
``P M^2``; the exact marginalization of a correlated guide needs ``P M K`` per layer for the
``K`` inducing values it depends on. The SGHMC step is the sampler's update of the same
model (``SGHMC.sample``), with the kernel hyperparameters learned by Adam (MW-MCEM).

Usage::

    python benchmarks/guide_costs.py --num-inducing 500    # results/guide_costs_M500.{json,md}
    python benchmarks/guide_costs.py --num-inducing 50 --width 10 --input-dim 10 \
        --configs dsvi joint chain --rounds 5 --tag correlated_M50    # the correlated guides
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import statistics
import time

from _harness import base_record, header, table, write_results

CONFIGS = ("dsvi", "unwhitened", "joint", "chain", "joint_sampled", "chain_sampled", "locations", "nested", "amortized",
           "sghmc")
_WHAT = {
    "dsvi": "AutoFactorizedDGP + DGPElbo (DSVI)",
    "unwhitened": "whiten=False layers + AutoFactorizedDGP + DGPElbo",
    "joint": "AutoJointDGP + DGPElbo (one Gaussian over both layers' inducing values)",
    "chain": "AutoChainDGP + DGPElbo (each layer's q(u) conditioned on the previous layer's)",
    "joint_sampled": "AutoJointDGP + DGPElbo(correlated='sampled')",
    "chain_sampled": "AutoChainDGP + DGPElbo(correlated='sampled')",
    "locations": "inducing='locations' layers + AutoFactorizedDGP + DGPElbo",
    "nested": "AutoFactorizedDGP + NestedCompressionElbo (nested variational compression)",
    "amortized": "amortized_dgp + AutoAmortizedDGP + DGPElbo (per-point inducing sets of --amortized-inducing)",
    "sghmc": "SGHMC sampler step (numpyro_dgp.infer.SGHMC) on the DSVI model",
}


_SHAPE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]", flags=re.M)
_DOT = re.compile(r"= \w+\[[\d,]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)")


def _dims(line: str, key: str) -> tuple[int, ...]:
    m = re.search(key + r"_dims=\{([\d,]*)\}", line)
    return tuple(int(i) for i in m.group(1).split(",") if i) if m else ()


def product_flops(line: str, shapes: dict) -> float | None:
    """FLOPs of the ``dot`` on one line of optimized HLO text (``2 * prod(output) *
    prod(contracted)``: two per multiply-add), its operands' shapes from ``shapes``; None for
    any other instruction."""
    m = _DOT.search(line)
    if m is None:
        return None
    (_, lhs), (_, rhs) = shapes[m.group(1)], shapes[m.group(2)]
    keys = ("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch")
    lc, rc, lb, rb = (_dims(line, key) for key in keys)
    free_lhs = [d for i, d in enumerate(lhs) if i not in lc and i not in lb]
    free_rhs = [d for i, d in enumerate(rhs) if i not in rc and i not in rb]
    output = [lhs[i] for i in lb] + free_lhs + free_rhs
    return 2.0 * math.prod(output) * math.prod(lhs[i] for i in lc)


def _source(name: str) -> str:
    """The innermost named function of an ``op_name``, with whether it is a derivative."""
    functions = re.findall(r"jit\(([^()]+)\)", name)
    inner = functions[-1] if functions else "step"
    return inner + (" (derivative)" if "transpose(" in name else "")


def operation_counts(hlo: str, big: float = math.inf) -> dict:
    """LAPACK Cholesky and triangular-solve calls, matrix products (``"big_products"``: those of
    at least ``big`` FLOPs), and the products' FLOPs by source function, from a compiled
    program's optimized HLO text (every function inlined, so a count is how often one run of the
    program runs it): ``{"counts": ..., "flops": ...}``."""
    shapes = {name: (dtype, tuple(int(d) for d in dims.split(",") if d))
              for name, dtype, dims in _SHAPE.findall(hlo)}  # names are unique in an HLO module
    counts, flops = collections.Counter(), collections.Counter()
    for line in hlo.splitlines():
        if 'custom_call_target="lapack_' in line:
            counts["cholesky" if "potrf" in line else "triangular_solve"] += 1
        elif (product := product_flops(line, shapes)) is not None:
            counts["dot_general"] += 1
            counts["big_products"] += product >= big
            op_name = re.search(r'op_name="([^"]*)"', line)
            flops[_source(op_name.group(1) if op_name else "")] += product
    return {"counts": counts, "flops": flops}


def _model(config, M, width, amortized_inducing):
    import numpyro

    import numpyro_dgp as dgp

    if config == "amortized":
        # per-point sets: the math factorizes one small K(Z_n, Z_n) per point, so M here is the
        # set size (Meng & Zhang 2024 use 4-8), not the global M
        return dgp.models.amortized_dgp(widths=(width, 1), num_inducing=(amortized_inducing, amortized_inducing))
    if config == "locations":
        def model(X, y=None):
            h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=M, out_dim=width, mean="identity",
                             inducing="locations")
            f, _ = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=M, inducing="locations")
            noise = numpyro.param("noise", 0.01, constraint=numpyro.distributions.constraints.positive)
            with numpyro.plate("data", X.shape[0]):
                numpyro.sample("y", numpyro.distributions.Normal(f[:, 0], noise**0.5), obs=y)
        return model
    inner_noise = 0.01 if config == "nested" else None
    return dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=width, inner_noise=inner_noise,
                                         whiten=config != "unwhitened")


def _step(config, model, X, y):
    """``(compiled step, its arguments, seconds of the initial state)`` of one configuration."""
    import jax
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp

    key = jax.random.PRNGKey(0)
    if config == "sghmc":
        t0 = time.perf_counter()
        kernel = dgp.infer.SGHMC(model, num_data=X.shape[0])
        state = jax.block_until_ready(kernel.init(key, 0, None, (X, y), {}))
        init_seconds = time.perf_counter() - t0
        step = jax.jit(lambda s: kernel.sample(s, (X, y), {}))
        return step.lower(state).compile(), (state,), init_seconds
    guide = {"joint": dgp.guides.AutoJointDGP, "chain": dgp.guides.AutoChainDGP,
             "amortized": dgp.guides.AutoAmortizedDGP}.get(config.split("_")[0], dgp.guides.AutoFactorizedDGP)(model)
    if config == "nested":
        objective = dgp.NestedCompressionElbo()
    else:
        objective = dgp.DGPElbo(correlated="sampled") if config.endswith("_sampled") else dgp.DGPElbo()
    t0 = time.perf_counter()
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), objective)
    state = jax.block_until_ready(svi.init(key, X, y))
    init_seconds = time.perf_counter() - t0
    step = jax.jit(lambda s: svi.update(s, X, y)[0])
    return step.lower(state).compile(), (state,), init_seconds


def compile_config(config, M, width, precision, input_dim, amortized_inducing):
    """``(row of counts, compiled step, its state)`` of one configuration."""
    import jax
    import numpy as np
    from scale import synthetic

    N = 1000
    X, y = synthetic(N, np.float64 if precision == "float64" else np.float32, dim=input_dim)
    model = _model(config, M, width, amortized_inducing)
    t0 = time.perf_counter()
    compiled, args, init_seconds = _step(config, model, X, y)
    compile_seconds = time.perf_counter() - t0 - init_seconds
    counts = operation_counts(compiled.as_text(), big=1.0 * N * (M * width) ** 2)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    state = jax.block_until_ready(compiled(*args))  # warm-up
    row = {"config": config, "M": amortized_inducing if config == "amortized" else M, "width": width,
           "input_dim": input_dim, "precision": precision,
           "init_seconds": init_seconds, "compile_seconds": compile_seconds,
           "cholesky_calls": counts["counts"]["cholesky"], "triangular_solves": counts["counts"]["triangular_solve"],
           "products": counts["counts"]["dot_general"], "big_products": counts["counts"]["big_products"],
           "product_gflop": sum(counts["flops"].values()) / 1e9,
           "xla_gflop": float(cost.get("flops", float("nan"))) / 1e9, "times": []}
    return row, compiled, state


def time_steps(compiled, state, repeats):
    """``(state, seconds of each of repeats steps)``."""
    import jax

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state = jax.block_until_ready(compiled(state))
        times.append(time.perf_counter() - t0)
    return state, times


def markdown(record):
    lines = header("What a training step costs at large M, by guide and objective", record["command"],
                   record["machine"], record["rows"][0]["precision"], record["date"]) + [""]
    rows = record["rows"]
    base = next((r for r in rows if r["config"] == "dsvi"), None)
    lines += ["A 2-layer DGP, width {w}, M = {M} per layer, 1000 points with {d} inputs in every step, {p}. Counts "
              "from the compiled step (every function inlined): LAPACK Cholesky calls are the blocked "
              "factorization's leaves (8 per layer at M = 500), LAPACK triangular-solve calls one per triangular "
              "inverse (each solves all its 16 x 16 leaves in one batched call). Time: median "
              "of {n} steps per round over {r} alternating rounds, after one warm-up. Init: the initial state (`svi.init`, SGHMC's `init`), "
              "compile: the step's lowering and compile; the configurations run one after the other in "
              "one process, so a later one reuses the eager programs an earlier one compiled (time "
              "one alone with `--configs`). Per-point (MP)^2 products: products of at least (M P)^2 / 2 "
              "multiply-adds per point (P the width).".format(M=rows[0]["M"], p=rows[0]["precision"],
                                                               w=rows[0]["width"], d=rows[0].get("input_dim", 8),
                                                                               n=record["repeats"], r=record.get("rounds", 1)), "",
              ]
    lines += table(["configuration", "Cholesky calls", "triangular solves", "products", "per-point (MP)^2 products",
                    "product GFLOP", "XLA GFLOP", "ms/step", "/ DSVI", "init s", "compile s"],
                   [[_WHAT[r["config"]], r["cholesky_calls"], r["triangular_solves"], r["products"], r.get("big_products", "-"),
                     f"{r['product_gflop']:.2f}", f"{r['xla_gflop']:.2f}", f"{r['ms_per_step']:.1f}",
                     f"{r['ms_per_step'] / base['ms_per_step']:.2f}" if base else "-", f"{r['init_seconds']:.1f}" if "init_seconds" in r else "-",
                     f"{r['compile_seconds']:.1f}"]
                    for r in rows])
    return "\n".join(lines + [""])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-inducing", type=int, default=500)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--precision", choices=("float32", "float64"), default="float64")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds over the configurations")
    parser.add_argument("--input-dim", type=int, default=8)
    parser.add_argument("--amortized-inducing", type=int, default=16, help="per-point set size of the amortized model")
    parser.add_argument("--tag", default=None, help="result name (default: guide_costs_M<M>)")
    args = parser.parse_args(argv)
    import jax

    if args.precision == "float64":
        jax.config.update("jax_enable_x64", True)
    record = base_record("guide_costs.py", argv)
    record.update(repeats=args.repeats, rounds=args.rounds, rows=[],
                  settings=f"M = {args.num_inducing}, width {args.width}, {args.input_dim} inputs")
    compiled = []
    for config in args.configs:
        row, step, state = compile_config(config, args.num_inducing, args.width, args.precision, args.input_dim,
                                          args.amortized_inducing)
        print(json.dumps(row), flush=True)
        record["rows"].append(row)
        compiled.append([step, state])
    for r in range(args.rounds):
        order = range(len(compiled)) if r % 2 == 0 else reversed(range(len(compiled)))
        for i in order:
            compiled[i][1], times = time_steps(*compiled[i], args.repeats)
            record["rows"][i]["times"] += times
    for row in record["rows"]:
        row["ms_per_step"] = 1e3 * statistics.median(row["times"])
    tag = args.tag or f"guide_costs_M{args.num_inducing}"
    write_results(tag, record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
