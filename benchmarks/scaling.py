"""Scaling of the DSVI training step: time per step and compiled memory against batch size,
number of inducing points, number of layers, layer width and number of Monte Carlo samples.

Each sweep varies one setting around the kin8nm configuration (batch 1000, M = 100, 2 layers,
width 8, 1 sample; synthetic 8-D inputs, N = 8000), one process per precision. Per point: the
jitted update compiled ahead of time (compile seconds reported), then the median of 3 blocks
of 20 steps (``block_until_ready``); memory is XLA's ``memory_analysis`` of the compiled step
(temporary buffers + arguments + outputs), i.e. the step's peak working set as compiled.

Usage::

    python benchmarks/scaling.py --precision float64    # results/scaling_float64.{json,md,png}
"""

from __future__ import annotations

import argparse
import time

from _harness import RESULTS, command, header, machine, now, table, write_results

BASE = {"batch_size": 1000, "num_inducing": 100, "num_layers": 2, "hidden_width": 8, "num_samples": 1}
SWEEPS = {
    "batch_size": [100, 250, 500, 1000, 2000, 4000],
    "num_inducing": [25, 50, 100, 200, 400],
    "num_layers": [1, 2, 3, 4],
    "hidden_width": [2, 4, 8, 16, 32],
    "num_samples": [1, 2, 4, 8],
}


def time_step(cfg, X, y, blocks=3, steps=20):
    import jax
    import numpy as np
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from numpyro_dgp.models import deep_gp_regression

    model = deep_gp_regression(cfg["num_layers"], num_inducing=cfg["num_inducing"], hidden_width=cfg["hidden_width"])
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo(num_particles=cfg["num_samples"]))
    B = cfg["batch_size"]
    state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=B)
    t0 = time.perf_counter()
    update = jax.jit(lambda s, X, y: svi.update(s, X, y, batch_size=B)).lower(state, X, y).compile()
    compile_s = time.perf_counter() - t0
    mem = update.memory_analysis()
    mem_bytes = None if mem is None else int(mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)
    s, loss = update(state, X, y)
    jax.block_until_ready(loss)
    rates = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(steps):
            s, loss = update(s, X, y)
        jax.block_until_ready(loss)
        rates.append((time.perf_counter() - t0) / steps * 1e3)
    return {"ms_per_step": float(np.median(rates)), "compile_seconds": compile_s, "memory_bytes": mem_bytes,
            "finite": bool(np.isfinite(float(loss)))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=["float32", "float64"], default="float64")
    args = parser.parse_args(argv)
    import jax

    if args.precision == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    dtype = jnp.float64 if args.precision == "float64" else jnp.float32
    rs = np.random.RandomState(0)
    X = jnp.asarray(rs.uniform(-1, 1, (8000, 8)), dtype)
    y = jnp.asarray(np.sin(3 * np.asarray(X[:, 0])) * np.asarray(X[:, 1]) + 0.1 * rs.randn(8000), dtype)
    results = {}
    for name, values in SWEEPS.items():
        results[name] = []
        for v in values:
            cfg = {**BASE, name: v}
            r = time_step(cfg, X, y)
            results[name].append({"value": v, **r})
            print(f"{name}={v}: {r['ms_per_step']:.2f} ms/step, compile {r['compile_seconds']:.2f} s, "
                  f"memory {r['memory_bytes'] / 2**20:.1f} MiB", flush=True)

    record = {"command": command("scaling.py", argv), "machine": machine(), "date": now(), "base": BASE,
              "results": results}
    stem = f"scaling_{args.precision}"
    write_results(stem, record, markdown(record, args.precision))

    fig, axes = plt.subplots(2, len(SWEEPS), figsize=(3.2 * len(SWEEPS), 5.6))
    for j, (name, rows) in enumerate(results.items()):
        xs = [r["value"] for r in rows]
        axes[0, j].plot(xs, [r["ms_per_step"] for r in rows], "o-")
        axes[1, j].plot(xs, [r["memory_bytes"] / 2**20 for r in rows], "s-", color="C1")
        for ax in axes[:, j]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel(name)
            ax.grid(alpha=0.3)
        if name in ("batch_size", "num_inducing"):
            axes[0, j].set_yscale("log")
    axes[0, 0].set_ylabel("ms per step")
    axes[1, 0].set_ylabel("compiled memory (MiB)")
    fig.suptitle(f"DSVI step ({args.precision}); base: " + ", ".join(f"{k}={v}" for k, v in BASE.items()), fontsize=10)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=110)
    print(markdown(record, args.precision))


def markdown(record, precision):
    """The report of a record (``precision``: its ``--precision``, which names the plot)."""
    lines = [*header(f"Scaling of the DSVI training step ({precision})", record["command"], record["machine"],
                     record["date"], compact=True), "",
             "Base: " + ", ".join(f"{k} = {v}" for k, v in record["base"].items())
             + "; synthetic 8-D inputs, N = 8000. "
             "Memory: XLA's memory analysis of the compiled step (temporaries + arguments + outputs).", "",
             f"![scaling](scaling_{precision}.png)", ""]
    for name, rows in record["results"].items():
        lines += table([name, "ms per step", "compile (s)", "memory (MiB)"],
                       [[r["value"], f"{r['ms_per_step']:.2f}", f"{r['compile_seconds']:.2f}",
                         f"{r['memory_bytes'] / 2**20:.1f}"] for r in rows])
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
