"""What one training step costs at large M for each guide and objective: factorizations,
triangular solves, matrix-product FLOPs and time, against the DSVI step on the same model.

A 2-layer DGP (width 8, M inducing points per layer, ARD RBF kernels) on 1000 synthetic points
with 8 inputs (the data of ``scale.py``), the whole batch in every step; each configuration's
``SVI.update`` compiled on its own. The counts come from the compiled program (every function
inlined, so a count is how often one step runs it; :func:`operation_counts` reads them):
LAPACK Cholesky calls (the blocked factorization's leaves), LAPACK triangular-solve calls (one
batched call per triangular inverse) and matrix-product FLOPs. The math needs one ``K(Z, Z)``
factorization per layer, shared by the layer's outputs and samples; a guide that correlates
layers adds its own factor's work (``AutoJointDGP``: one ``L P M`` square factor;
``AutoChainDGP``: per-layer blocks). The SGHMC step is the sampler's update of the same
model (``SGHMC.sample``), with the kernel hyperparameters learned by Adam (MW-MCEM).

Usage::

    python benchmarks/guide_costs.py --num-inducing 500    # results/guide_costs_M500.{json,md}
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import time

from _harness import base_record, header, table, write_results

CONFIGS = ("dsvi", "unwhitened", "joint", "chain", "locations", "nested", "amortized", "sghmc")
_WHAT = {
    "dsvi": "AutoFactorizedDGP + DGPElbo (DSVI)",
    "unwhitened": "whiten=False layers + AutoFactorizedDGP + DGPElbo",
    "joint": "AutoJointDGP + DGPElbo (one Gaussian over both layers' inducing values)",
    "chain": "AutoChainDGP + DGPElbo (each layer's q(u) conditioned on the previous layer's)",
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


def operation_counts(hlo: str) -> dict:
    """LAPACK Cholesky and triangular-solve calls, matrix products, and the products' FLOPs by
    source function, from a compiled program's optimized HLO text (every function inlined, so a
    count is how often one run of the program runs it): ``{"counts": ..., "flops": ...}``."""
    shapes = {name: (dtype, tuple(int(d) for d in dims.split(",") if d))
              for name, dtype, dims in _SHAPE.findall(hlo)}  # names are unique in an HLO module
    counts, flops = collections.Counter(), collections.Counter()
    for line in hlo.splitlines():
        if 'custom_call_target="lapack_' in line:
            counts["cholesky" if "potrf" in line else "triangular_solve"] += 1
        elif (product := product_flops(line, shapes)) is not None:
            counts["dot_general"] += 1
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
             "amortized": dgp.guides.AutoAmortizedDGP}.get(config, dgp.guides.AutoFactorizedDGP)(model)
    objective = dgp.NestedCompressionElbo() if config == "nested" else dgp.DGPElbo()
    t0 = time.perf_counter()
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), objective)
    state = jax.block_until_ready(svi.init(key, X, y))
    init_seconds = time.perf_counter() - t0
    step = jax.jit(lambda s: svi.update(s, X, y)[0])
    return step.lower(state).compile(), (state,), init_seconds


def run(config, M, width, precision, repeats, amortized_inducing):
    import jax
    import numpy as np
    from scale import synthetic

    X, y = synthetic(1000, np.float64 if precision == "float64" else np.float32, dim=8)
    model = _model(config, M, width, amortized_inducing)
    t0 = time.perf_counter()
    compiled, args, init_seconds = _step(config, model, X, y)
    compile_seconds = time.perf_counter() - t0 - init_seconds
    counts = operation_counts(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    state = jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state = jax.block_until_ready(compiled(state))
        times.append(time.perf_counter() - t0)
    return {"config": config, "M": amortized_inducing if config == "amortized" else M, "width": width,
            "precision": precision,
            "init_seconds": init_seconds, "compile_seconds": compile_seconds, "ms_per_step": 1e3 * float(np.median(times)),
            "cholesky_calls": counts["counts"]["cholesky"], "triangular_solves": counts["counts"]["triangular_solve"],
            "products": counts["counts"]["dot_general"], "product_gflop": sum(counts["flops"].values()) / 1e9,
            "xla_gflop": float(cost.get("flops", float("nan"))) / 1e9}


def markdown(record):
    lines = header("What a training step costs at large M, by guide and objective", record["command"],
                   record["machine"], record["rows"][0]["precision"], record["date"]) + [""]
    rows = record["rows"]
    base = next((r for r in rows if r["config"] == "dsvi"), None)
    lines += ["A 2-layer DGP, width 8, M = {M} per layer, 1000 points with 8 inputs in every step, {p}. Counts "
              "from the compiled step (every function inlined): LAPACK Cholesky calls are the blocked "
              "factorization's leaves (8 per layer at M = 500), LAPACK triangular-solve calls one per triangular "
              "inverse (each solves all its 16 x 16 leaves in one batched call). Time: median "
              "of {n} steps after one warm-up. Init: the initial state (`svi.init`, SGHMC's `init`), "
              "compile: the step's lowering and compile; the configurations run one after the other in "
              "one process, so a later one reuses the eager programs an earlier one compiled (time "
              "one alone with `--configs`).".format(M=rows[0]["M"], p=rows[0]["precision"],
                                                                               n=record["repeats"]), "",
              ]
    lines += table(["configuration", "Cholesky calls", "triangular solves", "products", "product GFLOP", "XLA GFLOP",
                    "ms/step", "/ DSVI", "init s", "compile s"],
                   [[_WHAT[r["config"]], r["cholesky_calls"], r["triangular_solves"], r["products"],
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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--amortized-inducing", type=int, default=16, help="per-point set size of the amortized model")
    parser.add_argument("--tag", default=None, help="result name (default: guide_costs_M<M>)")
    args = parser.parse_args(argv)
    import jax

    if args.precision == "float64":
        jax.config.update("jax_enable_x64", True)
    record = base_record("guide_costs.py", argv)
    record.update(repeats=args.repeats, rows=[], settings=f"M = {args.num_inducing}, width {args.width}")
    for config in args.configs:
        row = run(config, args.num_inducing, args.width, args.precision, args.repeats, args.amortized_inducing)
        print(json.dumps(row), flush=True)
        record["rows"].append(row)
    tag = args.tag or f"guide_costs_M{args.num_inducing}"
    write_results(tag, record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
