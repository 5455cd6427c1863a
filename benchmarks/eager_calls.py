"""The first call of the numerical core outside ``jit``: seconds and XLA programs.

Interactive use (a notebook, a debugging session, the test suite) calls the library's functions
eagerly. JAX then compiles every operation on its own at each new shape (about 22 ms per
operation on this 2-core machine), unless the function is itself jitted, in which case it is
one program per shape. The core's hot functions are jitted for this reason; this script
measures what that buys.

Each case is run in a fresh process (nothing in JAX's caches, no persistent compilation cache),
in float64, twice per round:

* ``jitted``: the library as it is;
* ``op-by-op``: the same calls inside ``jax.disable_jit()``, so that every operation is
  dispatched and compiled on its own: what an eager call costs when a function is not jitted.
  (It also splits the few helpers JAX itself jits, such as ``solve_triangular``.)

Cases, at ``M = 50`` inducing inputs, ``N = 200`` points in ``D = 4`` dimensions, ``P = 3``
outputs: ``gram`` (``Matern52``'s ``K(Z, X)`` and ``K(Z, Z)``), ``conditional``
(``numpyro_dgp.core.conditional`` with full ``q_sqrt``, not whitened), ``gauss_kl``
(``numpyro_dgp.core.gauss_kl`` against a prior factor) and ``triangular_inverse``. Per case and
mode: the first call's seconds (compilation included), the second call's at the same shapes,
and the XLA programs lowered by the first call (``jax.monitoring`` events); medians over
``--rounds`` rounds, the modes alternating.

Writes ``benchmarks/results/eager_calls.json`` and ``.md`` with the command line.

Example (the committed results)::

    python benchmarks/eager_calls.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from _harness import base_record, header, run_fresh, table, write_results

CASES = ("gram", "conditional", "gauss_kl", "triangular_inverse")
MODES = ("jitted", "op-by-op")

_CHILD = r"""
import contextlib, json, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from jax import monitoring
from numpyro_dgp import core, kernels

case, mode = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
M, N, D, P = 50, 200, 4, 3
X = jnp.asarray(rng.normal(size=(N, D)))
Z = jnp.asarray(rng.normal(size=(M, D)))
kernel = kernels.Matern52(variance=1.3, lengthscale=np.full(D, 0.8))
# inputs built with NumPy: nothing is compiled before the timed calls
Kzz = np.asarray(1.3 * np.exp(-0.5 * ((np.asarray(Z)[:, None] - np.asarray(Z)[None]) ** 2).sum(-1)))
L = jnp.asarray(np.linalg.cholesky(Kzz + 1e-6 * np.eye(M)))
Kzx = jnp.asarray(rng.normal(size=(M, N)))
Knn = jnp.asarray(1.3 + np.zeros(N))
q_mean = jnp.asarray(rng.normal(size=(P, M)))
q_sqrt = jnp.asarray(np.tril(rng.normal(size=(P, M, M))))
calls = {
    "gram": lambda: (kernel(Z, X), kernel(Z)),
    "conditional": lambda: core.conditional(Kzx, L, Knn, q_mean, q_sqrt, whiten=False),
    "gauss_kl": lambda: core.gauss_kl(q_mean, q_sqrt, L),
    "triangular_inverse": lambda: core.triangular_inverse(L),
}
lowered = [0]
def listener(event, duration, **kwargs):
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
        lowered[0] += 1
monitoring.register_event_duration_secs_listener(listener)
ctx = jax.disable_jit() if mode == "op-by-op" else contextlib.nullcontext()
with ctx:
    t0 = time.perf_counter(); jax.block_until_ready(calls[case]()); t1 = time.perf_counter()
    programs = lowered[0]
    jax.block_until_ready(calls[case]()); t2 = time.perf_counter()
print(json.dumps({"first_s": t1 - t0, "second_s": t2 - t1, "programs": programs}))
"""


def run_case(case: str, mode: str) -> dict:
    """One fresh process: the case's first and second call in ``mode``."""
    return run_fresh(_CHILD, case, mode, what=f"{case} {mode}")


def summarize(record: dict) -> list[dict]:
    """Per case: the medians of each mode and the op-by-op / jitted ratio of the first call."""
    rows = []
    for case in CASES:
        runs = record["runs"].get(case)
        if not runs:
            continue
        row = {"case": case}
        for mode in MODES:
            for field in ("first_s", "second_s", "programs"):
                row[f"{mode}:{field}"] = float(np.median([r[field] for r in runs[mode]]))
        row["first_call_ratio"] = row["op-by-op:first_s"] / row["jitted:first_s"]
        rows.append(row)
    return rows


def markdown(record: dict) -> str:
    lines = [
        *header("Eager calls of the numerical core: the first call at new shapes", record["command"],
                record["machine"], "float64", record["date"], record["settings"], compact=True),
        "",
        "Each case in a fresh process (no persistent compilation cache). `jitted`: the library as it is "
        "(one compiled program per function and shapes); `op-by-op`: the same calls inside "
        "`jax.disable_jit()`, every operation compiled on its own, as when a function is not jitted. "
        "Medians over the rounds; programs = XLA programs lowered by the first call.",
        "",
        *table(["case", "jitted: first call s", "jitted: second call s", "jitted: programs", "op-by-op: first call s",
                "op-by-op: second call s", "op-by-op: programs", "first call, op-by-op / jitted"],
               [[row["case"], f"{row['jitted:first_s']:.3f}", f"{row['jitted:second_s']:.4f}",
                 f"{row['jitted:programs']:.0f}", f"{row['op-by-op:first_s']:.3f}", f"{row['op-by-op:second_s']:.4f}",
                 f"{row['op-by-op:programs']:.0f}", f"{row['first_call_ratio']:.1f}x"] for row in summarize(record)]),
    ]
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, record: dict) -> None:
    Path(path).write_text(markdown(record))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, from " + ", ".join(CASES))
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {CASES}")

    record = {
        **base_record("eager_calls.py", argv),
        "settings": f"M=50, N=200, D=4, P=3; {args.rounds} rounds, the modes alternating",
        "runs": {case: {mode: [] for mode in MODES} for case in cases},
    }
    for r in range(args.rounds):
        for case in cases:
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                record["runs"][case][mode].append(run_case(case, mode))
    record["summary"] = summarize(record)
    write_results("eager_calls", record, markdown(record))
    return record


if __name__ == "__main__":
    main()
