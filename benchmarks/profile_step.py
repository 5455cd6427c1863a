"""Where the time of one DSVI training step goes, and what it computes, from ``jax.profiler``.

The kin8nm configuration (2 layers, whitened DSVI guide, batch 1000) at any ``--num-inducing``
and ``--hidden-width``. Two views of the same compiled step:

- **What it computes** (from the compiled program, every function inlined, so each count is
  how often a step runs it): LAPACK Cholesky and triangular-solve calls, matrix products with
  their FLOPs (``2 * prod(output) * prod(contracted)``) grouped by the source function, and
  XLA's own FLOP estimate of the whole step.
- **Where the time goes** (20 compiled steps after warm-up under
  ``jax.profiler.trace(create_perfetto_trace=True)``): XLA's CPU thunks per step by operation,
  by kind, and by the source function each came from (the ``op_name`` XLA keeps). Timings
  under the profiler are somewhat inflated; use them for proportions.

Usage::

    python benchmarks/profile_step.py --precision float64 --num-inducing 500
    # writes results/profile_step_float64_M500_W8.md
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile
import time
from pathlib import Path

import product_bound
from _harness import add_data_dir, base_record, header, table, write_results

#: StableHLO operations counted, by the kind the tables report
_KINDS = {"cholesky": "LAPACK Cholesky call (the blocked factorization's leaves)",
          "triangular_solve": "LAPACK triangular solve (the triangular inverse's leaves)",
          "dot_general": "matrix product"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=["float32", "float64"], default="float64")
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--hidden-width", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    add_data_dir(parser)
    parser.add_argument("--out", default=None,
                        help="result file (default: results/profile_step_<precision>_M<M>_W<width>.md)")
    args = parser.parse_args(argv)
    import jax

    if args.precision == "float64":
        jax.config.update("jax_enable_x64", True)
    update, state, data = _compiled_step(args)
    counts = operation_counts(update.as_text())
    cost = update.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    unprofiled_ms, state, host = _time_steps(update, state, data, 50)
    per_op, per_thread, thunks, profiled_ms = _profile(update, state, data, args.steps)
    sources = _thunk_sources(update.as_text())

    record = base_record("profile_step.py", argv)
    settings = f"M = {args.num_inducing}, hidden width {args.hidden_width}, batch 1000, kin8nm split 0"
    lines = header(f"Profile of one DSVI training step, {args.precision}", record["command"], record["machine"],
                   args.precision, record["date"], settings, compact=True)
    lines += ["", f"Wall time per step: {unprofiled_ms:.2f} ms unprofiled (median of 5 x 10; "
              f"{host['faults']:.0f} minor page faults and {host['sys_ms']:.1f} ms of system CPU per step, "
              "`getrusage`; a step called once per call can get fresh memory for its temporaries at every "
              "call, and the kernel that first writes a fresh page pays its fault, so the times of small "
              "kernels below may include them: `host_memory.py`), "
              f"{profiled_ms:.2f} ms under the profiler. Thunks per step: {thunks:.0f}. Busy time per executor "
              "thread (ms/step): " + ", ".join(f"{b:.2f}" for b in sorted(per_thread.values(), reverse=True)[:4])
              + f"; total op time {sum(per_op.values()):.2f} ms/step.",
              "", f"XLA's FLOP estimate of the step: {cost.get('flops', float('nan')) / 1e9:.2f} GFLOP "
              f"({cost.get('flops', float('nan')) / 1e6 / unprofiled_ms:.1f} GFLOP/s at the unprofiled time).", ""]
    lines += _count_table(counts) + [""]
    lines += _time_tables(per_op, sources)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        write_results(f"profile_step_{args.precision}_M{args.num_inducing}_W{args.hidden_width}", None, text)
    print("\n".join(lines))


def _compiled_step(args):
    import jax
    import jax.numpy as jnp
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from numpyro_dgp.datasets import load_uci
    from numpyro_dgp.models import deep_gp_regression

    dtype = jnp.float64 if args.precision == "float64" else jnp.float32
    data = load_uci("kin8nm", 0, data_dir=args.data_dir)
    X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
    model = deep_gp_regression(2, num_inducing=args.num_inducing, hidden_width=args.hidden_width)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=1000)
    update = jax.jit(lambda s, X, y: svi.update(s, X, y, batch_size=1000)).lower(state, X, y).compile()
    return update, state, (X, y)


def _time_steps(update, state, data, n):
    """Median ms per step over 5 blocks of ``n // 5`` calls, the state after them, and the
    minor page faults and system CPU ms per step over all of them (``getrusage``)."""
    import resource

    import jax

    times = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n // 5):
            state, loss = update(state, *data)
        jax.block_until_ready(loss)
        times.append((time.perf_counter() - t0) / (n // 5) * 1e3)
    after = resource.getrusage(resource.RUSAGE_SELF)
    steps = 5 * (n // 5)
    host = {"faults": (after.ru_minflt - before.ru_minflt) / steps,
            "sys_ms": (after.ru_stime - before.ru_stime) / steps * 1e3}
    return sorted(times)[2], state, host


def operation_counts(hlo: str) -> dict:
    """Counts of each kind in ``_KINDS`` and matrix-product FLOPs by source function, from the
    compiled HLO (every function inlined, so a count is how often the step runs it)."""
    shapes = product_bound.hlo_shapes(hlo)
    counts, flops = collections.Counter(), collections.Counter()
    for line in hlo.splitlines():
        if 'custom_call_target="lapack_' in line:
            counts["cholesky" if "potrf" in line else "triangular_solve"] += 1
        elif (product := product_bound.line_product(line, shapes)) is not None:
            counts["dot_general"] += 1
            op_name = re.search(r'op_name="([^"]*)"', line)
            flops[_source(op_name.group(1) if op_name else "")] += product_bound.product_flops(product)
    return {"counts": counts, "flops": flops}


def _source(name: str) -> str:
    """The innermost named function of an ``op_name``, with whether it is a derivative."""
    functions = re.findall(r"jit\(([^()]+)\)", name)
    inner = functions[-1] if functions else "step"
    return inner + (" (derivative)" if "transpose(" in name else "")


def _count_table(counts: dict) -> list[str]:
    c, flops = counts["counts"], counts["flops"]
    return ["What the step computes (compiled program, every function inlined):", "",
            *table(["operation", "count"], [[label, c[kind]] for kind, label in _KINDS.items()]), "",
            *table(["matrix products from", "GFLOP"], [[k, f"{v / 1e9:.3f}"] for k, v in flops.most_common(12)]
                   + [["total", f"{sum(flops.values()) / 1e9:.3f}"]])]


def _profile(update, state, data, steps):
    import jax

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(steps):
                state, loss = update(state, *data)
            jax.block_until_ready(loss)
        profiled_ms = (time.perf_counter() - t0) / steps * 1e3
        events = json.load(gzip.open(glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True)[-1]))["traceEvents"]
    per_op, per_thread, thunks = collections.Counter(), collections.Counter(), 0
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or name.startswith(("$", "end: ")) or any(
            s in name for s in ("Thunk", "Pjit", "PjRt", "Threadpool", "Wait for", "SlinkyThreadPool")
        ):
            continue
        per_op[name] += e["dur"] / steps / 1e3
        per_thread[e["tid"]] += e["dur"] / steps / 1e3
        thunks += 1 / steps
    return per_op, per_thread, thunks, profiled_ms


def _thunk_sources(hlo: str) -> dict[str, str]:
    """The source function of each top-level instruction of the compiled HLO (its ``op_name``)."""
    found = re.findall(r"^\s*%([\w.\-]+) = .*?op_name=\"([^\"]*)\"", hlo, flags=re.M)
    return {name: _source(op_name) for name, op_name in found}


def _kind(name: str) -> str:
    for prefix, label in (("ynn_fusion", "matrix product (YNNPACK fusion)"), ("dot", "matrix product"),
                          ("cholesky", "Cholesky / triangular solve"), ("triangular", "Cholesky / triangular solve")):
        if name.startswith(prefix):
            return label
    return "other (elementwise fusions, copies, reductions, ...)"


def _time_tables(per_op, sources) -> list[str]:
    by_kind, by_source = collections.Counter(), collections.Counter()
    for name, ms in per_op.items():
        by_kind[_kind(name)] += ms
        by_source[sources.get(name, "?")] += ms
    return ["Where the time goes (under the profiler, summed over executor threads):", "",
            *table(["kind", "ms per step"], [[k, f"{v:.2f}"] for k, v in by_kind.most_common()]), "",
            *table(["source function", "ms per step"], [[k, f"{v:.2f}"] for k, v in by_source.most_common(12)]), "",
            *table(["operation", "source function", "ms per step"],
                   [[k, sources.get(k, "?"), f"{v:.3f}"] for k, v in per_op.most_common(15)])]


if __name__ == "__main__":
    main()
