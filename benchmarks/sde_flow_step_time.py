"""Seconds per training step of DiffGP against a 2-layer DSVI step on one UCI set (same
process, ``block_until_ready``, compile excluded and reported separately).

Why the DiffGP UCI runs here use reduced settings: at the paper's (M = 100, 20 Euler-Maruyama
steps, full batch, 4 training samples) a step is ``20 x`` an ``O(D M^2 N)`` marginal-variance
evaluation. Writes ``benchmarks/results/sde_flow_step_time.md`` with the command.

    python benchmarks/sde_flow_step_time.py --dataset concrete
"""

from __future__ import annotations

import argparse
import time

from _harness import add_data_dir, command, header, machine, table, write_results

CONFIGS = [  # (label, batch size (None: full), training samples)
    ("paper: full batch, 4 samples", None, 4),
    ("committed runs: batch 256, 1 sample", 256, 1),
]


def time_steps(model, X, y, batch_size, num_particles, num_steps):
    import jax
    import numpyro
    from numpyro.infer import SVI

    from numpyro_dgp.guides import AutoFactorizedDGP
    from numpyro_dgp.objectives import DGPElbo

    guide = AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), DGPElbo(num_particles=num_particles))
    kwargs = {"batch_size": batch_size} if batch_size else {}
    state = svi.init(jax.random.PRNGKey(0), X, y, **kwargs)
    update = jax.jit(lambda s: svi.update(s, X, y, **kwargs))
    t0 = time.perf_counter()
    state, loss = update(state)
    jax.block_until_ready(loss)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(num_steps):
        state, loss = update(state)
    jax.block_until_ready(loss)
    return (time.perf_counter() - t0) / num_steps, first


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="concrete")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
    add_data_dir(parser)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from numpyro_dgp.datasets import load_uci
    from numpyro_dgp.models import deep_gp_regression, diffgp

    lines = [
        *header("DiffGP vs DSVI: seconds per training step", command("sde_flow_step_time.py", argv), machine(),
                f"{args.dataset} split 0", "M = 100", "DiffGP T = 5 with 20 Euler-Maruyama steps",
                "DSVI L = 2, hidden width min(D, 30)", f"mean over {args.steps} steps after one compiled step"),
        "",
    ]
    rows = []
    for x64 in (True, False):
        jax.config.update("jax_enable_x64", x64)
        dtype = jnp.float64 if x64 else jnp.float32
        data = load_uci(args.dataset, 0, data_dir=args.data_dir)
        X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
        for label, batch, particles in CONFIGS:
            batch = batch if batch and batch < X.shape[0] else None
            flow = time_steps(diffgp(5.0, num_inducing=100), X, y, batch, particles, args.steps)
            dsvi = time_steps(deep_gp_regression(2, num_inducing=100, hidden_width=min(X.shape[1], 30)),
                              X, y, batch, particles, args.steps)
            rows.append(["float64" if x64 else "float32", label, f"{flow[0]:.3f}", f"{dsvi[0]:.4f}",
                         f"{flow[0] / dsvi[0]:.0f}x", f"{flow[1]:.1f}", f"{dsvi[1]:.1f}"])
            print(*rows[-1], sep=" | ", flush=True)
    lines += table(["dtype", "configuration", "DiffGP s/step", "DSVI s/step", "ratio", "DiffGP compile+first s",
                    "DSVI compile+first s"], rows)
    write_results("sde_flow_step_time", None, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
