"""What the core's own factorization buys: the blocked Cholesky with the inverse built beside it
and the breadth-first triangular inverse (``numpyro_dgp.core``), against the library's
``jnp.linalg.cholesky`` and one ``solve_triangular`` against the identity, inside a DSVI
training step.

Only the primal computations are swapped (the core's derivative rules stay), so both arms
compute the same step up to round-off. Each configuration runs in one fresh process: both arms
compiled ahead of time (``jax.jit(...).lower(...).compile()``, JAX's tracing caches cleared
between them), then timed in interleaved rounds (the order alternates every round), medians.
Model: the kin8nm-sized DSVI model of ``package_ab.py`` (synthetic data, 7,373 x 8, batch 1,000
drawn inside the step, 2 layers, ``AutoFactorizedDGP`` + ``DGPElbo``, Adam), a jitted
``svi.update`` per call.

Usage::

    python benchmarks/factorization_ab.py --rounds 5

writes ``benchmarks/results/factorization_ab.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
from _harness import command, header, machine, now, table, write_results

ARMS = ("blocked", "library")


def use_library(core_module) -> None:
    """Swap the core's factorization and triangular inverse for the library's (primal only)."""
    import jax.numpy as jnp
    from jax.scipy.linalg import solve_triangular

    def inverse(L):
        eye = jnp.broadcast_to(jnp.eye(L.shape[-1], dtype=L.dtype), L.shape)
        return solve_triangular(L, eye, lower=True)

    def pair(K, leaf):
        L = jnp.linalg.cholesky(K)
        return L, inverse(L)

    core_module._pair_recursion = pair
    core_module._triangular_inverse.fun = inverse


def child(M: int, width: int, precision: str, rounds: int, steps: int) -> dict:
    import jax

    jax.config.update("jax_enable_x64", precision == "float64")
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from numpyro_dgp.core import _triangular

    rs = np.random.RandomState(0)
    X = rs.randn(7373, 8).astype(precision)
    y = (np.sin(X.sum(1)) + 0.1 * rs.randn(7373)).astype(precision)
    model = dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=width)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = dgp.infer.init(svi, jax.random.PRNGKey(0), X, y, batch_size=1000)
    compiled, losses = {}, {}
    for arm in ARMS:
        if arm == "library":
            use_library(_triangular)
        jax.clear_caches()
        start = time.perf_counter()
        compiled[arm] = jax.jit(lambda s: svi.update(s, X, y, batch_size=1000)).lower(state).compile()
        losses[arm] = float(compiled[arm](state)[1])
        print(f"{arm}: compiled and ran in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    ms = {arm: [] for arm in ARMS}
    for r in range(rounds):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            s = state
            t0 = time.perf_counter()
            for _ in range(steps):
                s, loss = compiled[arm](s)
            jax.block_until_ready(loss)
            ms[arm].append(1e3 * (time.perf_counter() - t0) / steps)
    return {"ms": ms, "first_loss": losses}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30, help="steps per timing")
    p.add_argument("--inducing", type=int, nargs="*", default=[100, 500])
    p.add_argument("--widths", type=int, nargs="*", default=[8])
    p.add_argument("--precisions", nargs="*", default=["float64", "float32"])
    p.add_argument("--child", nargs=3, metavar=("M", "WIDTH", "PRECISION"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        M, width, precision = args.child
        print(json.dumps(child(int(M), int(width), precision, args.rounds, args.steps)))
        return
    runs = []
    for M in args.inducing:
        for width in args.widths:
            for precision in args.precisions:
                cmd = [sys.executable, __file__, "--child", str(M), str(width), precision,
                       "--rounds", str(args.rounds), "--steps", str(args.steps)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                runs.append({"M": M, "width": width, "precision": precision,
                             **json.loads(out.stdout.strip().splitlines()[-1])})
                print(runs[-1], flush=True)
    record = {"command": command("factorization_ab.py", argv), "machine": machine(), "date": now(),
              "rounds": args.rounds, "steps": args.steps, "runs": runs}
    write_results("factorization_ab", record, report(record))


def report(record: dict) -> str:
    rows = []
    for run in record["runs"]:
        blocked, library = (float(np.median(run["ms"][arm])) for arm in ARMS)
        b_loss, l_loss = (run["first_loss"][arm] for arm in ARMS)
        rows.append([run["M"], run["width"], run["precision"], f"{blocked:.1f}", f"{library:.1f}",
                     f"{library / blocked:.2f}", f"{abs(b_loss - l_loss) / abs(b_loss):.1e}"])
    return "\n".join([
        *header("The core's factorization against the library's, inside a DSVI step", record["command"],
                record["machine"], record["date"]),
        f"ms per jitted `svi.update`, medians over {record['rounds']} interleaved rounds of {record['steps']} steps; "
        "blocked: `numpyro_dgp.core`'s factorization and triangular inverse (as shipped); library: "
        "`jnp.linalg.cholesky` and `solve_triangular` against the identity, the same derivative rules. "
        "The last column: the two arms' first losses, relative difference.", "",
        *table(["M", "width", "precision", "blocked ms", "library ms", "library / blocked", "loss difference"],
               rows), "",
    ])


if __name__ == "__main__":
    main()
