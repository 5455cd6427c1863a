"""Where the time of one DSVI training step goes (kin8nm configuration), from ``jax.profiler``.

Traces 20 compiled steps (after warm-up) with ``jax.profiler.trace(create_perfetto_trace=True)``,
reads the Perfetto JSON, and tabulates XLA's CPU thunks: time per step by operation, by kind
(``ynn_fusion``: YNNPACK matrix products with fused elementwise producers; ``dot``; other
fusions; ``sort``; Cholesky / triangular solves) and by executor thread, plus the HLO's
custom calls. Timings under the profiler are somewhat inflated; use them for proportions.

Usage::

    python benchmarks/profile_step.py --precision float64   # writes results/profile_step_float64.md
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

from _paths import DATA_DIR_HELP, default_data_dir


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=["float32", "float64"], default="float64")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data-dir", default=default_data_dir(), help=DATA_DIR_HELP)
    args = parser.parse_args(argv)
    import jax

    if args.precision == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from numpyro_dgp.datasets import load_uci
    from numpyro_dgp.models import deep_gp_regression

    dtype = jnp.float64 if args.precision == "float64" else jnp.float32
    data = load_uci("kin8nm", 0, data_dir=args.data_dir)
    X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
    model = deep_gp_regression(2, num_inducing=100, hidden_width=8)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=1000)
    update = jax.jit(lambda s, X, y: svi.update(s, X, y, batch_size=1000)).lower(state, X, y).compile()
    hlo = update.as_text()
    for _ in range(20):
        state, loss = update(state, X, y)
    jax.block_until_ready(loss)
    t0 = time.perf_counter()
    for _ in range(50):
        state, loss = update(state, X, y)
    jax.block_until_ready(loss)
    unprofiled_ms = (time.perf_counter() - t0) / 50 * 1e3

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(args.steps):
                state, loss = update(state, X, y)
            jax.block_until_ready(loss)
        profiled_ms = (time.perf_counter() - t0) / args.steps * 1e3
        events = json.load(gzip.open(glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True)[-1]))["traceEvents"]

    per_op, count, per_thread = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or name.startswith(("$", "end: ")) or any(
            s in name for s in ("Thunk", "Pjit", "PjRt", "Threadpool", "Wait for", "SlinkyThreadPool")
        ):
            continue
        per_op[name] += e["dur"] / args.steps / 1e3
        count[name] += 1
        per_thread[e["tid"]] += e["dur"] / args.steps / 1e3

    def kind(name):
        for prefix, label in (("ynn_fusion", "ynn_fusion (matmul)"), ("dot", "dot"), ("sort", "sort"),
                              ("cholesky", "cholesky / triangular solve"), ("triangular", "cholesky / triangular solve")):
            if name.startswith(prefix):
                return label
        return "other (elementwise fusions, copies, reductions, ...)"

    by_kind = collections.Counter()
    for name, ms in per_op.items():
        by_kind[kind(name)] += ms
    busy = sorted(per_thread.values(), reverse=True)
    custom_calls = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', hlo))
    lines = [
        f"# Profile of one DSVI training step, kin8nm configuration, {args.precision}",
        "",
        f"Command: `python benchmarks/profile_step.py --precision {args.precision}`; {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        f"Wall time per step: {unprofiled_ms:.2f} ms unprofiled, {profiled_ms:.2f} ms under the profiler. "
        f"Thunks per step: {sum(count.values()) / args.steps:.0f}. Busy time per executor thread (ms/step): "
        + ", ".join(f"{b:.2f}" for b in busy[:4]) + f"; total op time {sum(per_op.values()):.2f} ms/step.",
        "",
        "| kind | ms per step (summed over threads) |",
        "| --- | --- |",
    ] + [f"| {k} | {v:.2f} |" for k, v in by_kind.most_common()] + [
        "",
        "| operation | ms per step |",
        "| --- | --- |",
    ] + [f"| {k} | {v:.3f} |" for k, v in per_op.most_common(15)] + [
        "",
        "Custom calls in the compiled step: " + ", ".join(f"{k} x{v}" for k, v in custom_calls.items()),
        "",
    ]
    out = Path(__file__).resolve().parent / "results" / f"profile_step_{args.precision}.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
