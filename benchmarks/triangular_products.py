"""The factorization and the triangular products of a training step, by size: ours against the
plain formulation, value and gradient, to record where each choice of ``numpyro_dgp.core`` pays.

Per size ``M`` and precision, jitted, median of ``--repeats`` calls, each pair timed in
alternation so drift hits both alike (one process; these are the pieces alone, without the
rest of a step competing for the cores: ``profile_step.py`` measures them in a step):

- **Cholesky with its gradient** (``sum(W * L)``): ``jnp.linalg.cholesky`` with JAX's rule
  (two triangular solves) against ``numpyro_dgp.core.cholesky`` (LAPACK below 64, the blocked
  recursion above; the explicit-inverse derivative);
- **the variance term** ``diag(B^T L_p L_p^T B)`` for ``P = 8`` outputs, ``B (M, 1000)``,
  with its gradient: one full product of the stacked factors against the block-triangular
  products of ``quadratic_form_diagonals``;
- **``L^{-1} K(Z, X)``** with its gradient: one full product against ``lower_times``.

Usage::

    python benchmarks/triangular_products.py    # writes results/triangular_products.{json,md}
"""

from __future__ import annotations

import argparse
import json
import time

from _harness import base_record, header, table, write_results


def _median_ms(fn, args, repeats):
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[repeats // 2]


def _pairs(M, dtype):
    """``{piece: (plain, ours, args)}``, every function the gradient of a scalar."""
    import jax
    import jax.numpy as jnp

    from numpyro_dgp.core import cholesky
    from numpyro_dgp.core._triangular import lower_times, quadratic_form_diagonals

    keys = jax.random.split(jax.random.PRNGKey(M), 4)
    A = jax.random.normal(keys[0], (M, M), dtype)
    K = A @ A.T + M * jnp.eye(M, dtype=dtype)
    W = jax.random.normal(keys[1], (M, M), dtype)
    q_sqrt = jnp.tril(jax.random.normal(keys[2], (8, M, M), dtype))
    B = jax.random.normal(keys[3], (M, 1000), dtype)

    def dense_quadratic(q, B):
        factors = jnp.transpose(jnp.tril(q), (1, 0, 2)).reshape(M, -1)
        return jnp.sum((factors.T @ B) ** 2)

    both = (0, 1)
    return {
        "Cholesky + gradient": (jax.jit(jax.grad(lambda K: jnp.sum(W * jnp.linalg.cholesky(K)))),
                                jax.jit(jax.grad(lambda K: jnp.sum(W * cholesky(K)))), (K,)),
        "variance term (P = 8) + gradient": (jax.jit(jax.grad(dense_quadratic, both)),
                                             jax.jit(jax.grad(lambda q, B: jnp.sum(quadratic_form_diagonals(q, B)), both)),
                                             (q_sqrt, B)),
        "L^-1 K(Z, X) + gradient": (jax.jit(jax.grad(lambda T, X: jnp.sum(jnp.tril(T) @ X), both)),
                                    jax.jit(jax.grad(lambda T, X: jnp.sum(lower_times(T, X)), both)), (W, B)),
    }


def measure(precision, sizes, repeats):
    import jax.numpy as jnp

    dtype = jnp.float64 if precision == "float64" else jnp.float32
    rows = []
    for M in sizes:
        for piece, (plain, ours, args) in _pairs(M, dtype).items():
            plain_ms, ours_ms = [], []
            for _ in range(3):  # alternate the two, three times
                plain_ms.append(_median_ms(plain, args, repeats))
                ours_ms.append(_median_ms(ours, args, repeats))
            rows.append({"precision": precision, "M": M, "piece": piece,
                         "plain_ms": sorted(plain_ms)[1], "ours_ms": sorted(ours_ms)[1]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(record):
    lines = header("Cholesky and triangular products by size: ours against the plain formulation", record["command"],
                   record["machine"], record["date"], record["settings"], compact=True)
    lines += ["", "Milliseconds per call (value and gradient), median; speed-up = plain / ours.", ""]
    lines += table(["precision", "piece", "M", "plain ms", "ours ms", "speed-up"],
                   [[r["precision"], r["piece"], r["M"], f"{r['plain_ms']:.2f}", f"{r['ours_ms']:.2f}",
                     f"{r['plain_ms'] / r['ours_ms']:.2f}"] for r in record["rows"]])
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 100, 128, 200, 500, 1000])
    parser.add_argument("--precisions", nargs="+", default=["float64", "float32"], choices=["float32", "float64"])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)  # float32 arrays stay float32
    record = base_record("triangular_products.py", argv)
    record["settings"] = "jitted, one process, pieces alone"
    record["rows"] = [r for p in args.precisions for r in measure(p, args.sizes, args.repeats)]
    write_results("triangular_products", record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
