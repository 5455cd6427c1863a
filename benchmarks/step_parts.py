"""Micro-benchmarks of the parts of a DGP training step that the speed work changed.

Each part runs 200 (or 50) times inside one jitted ``lax.scan`` (no per-call dispatch),
``block_until_ready``, best of 3; float64 and float32 in separate processes.

* triangular inverse of a 100 x 100 factor: XLA's triangular solve against the identity vs
  :func:`numpyro_dgp.core.triangular_inverse` (block recursion to 32 x 32 solves);
* gradient of ``sum(f(L^{-1} Kmn))`` through Cholesky + inverse: JAX's rules (triangular
  solves) vs :func:`numpyro_dgp.core.cholesky` / ``triangular_inverse`` (matrix products);
* a 1000-of-7372 minibatch draw: NumPyro's CPU Fisher-Yates scan vs
  :class:`numpyro_dgp.handlers.fast_subsample` (``top_k`` of uniforms);
* value and gradient of the inner layer's variance term ``sum_k (L_p^T B)_kn^2`` (8 outputs,
  M = 100, batch 1000, full ``q_sqrt``): the output-batched einsum vs the single
  ``(P M, M) x (M, N)`` product that :func:`numpyro_dgp.core.conditional` uses.

Usage::

    python benchmarks/step_parts.py     # writes benchmarks/results/step_parts.{json,md}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _harness import command, header, machine, now, table, write_results


def best_ms(fn, arg, length):
    import jax

    run = jax.jit(lambda a: jax.lax.scan(lambda c, i: (c + fn(a, i), None), 0.0, jax.numpy.arange(length))[0])
    run(arg).block_until_ready()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        run(arg).block_until_ready()
        times.append((time.perf_counter() - t0) / length * 1e3)
    return min(times)


def measure(precision):
    import jax

    if precision == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.scipy.linalg import solve_triangular
    from numpyro.primitives import _subsample_fn

    from numpyro_dgp.core import cholesky, triangular_inverse
    from numpyro_dgp.core import factors_transpose_times
    from numpyro_dgp.handlers._training import _top_k_subsample

    dtype = jnp.float64 if precision == "float64" else jnp.float32
    M, N = 100, 1000
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    Z = jax.random.normal(k1, (M, 3), dtype)
    K = jnp.exp(-0.5 * jnp.sum((Z[:, None] - Z[None]) ** 2, -1)) + 1e-3 * jnp.eye(M, dtype=dtype)
    Kmn = jax.random.normal(k2, (M, N), dtype)
    L = jnp.linalg.cholesky(K)
    eye = jnp.eye(M, dtype=dtype)
    tiny = jnp.asarray(1e-9, dtype)

    def perturb(A, i):  # a different matrix every iteration, so nothing is hoisted out of the loop
        return A + (tiny * i) * eye

    def loss_jax(K):
        Li = solve_triangular(jnp.linalg.cholesky(K), eye, lower=True)
        return jnp.sum(jnp.tanh(Li @ Kmn))

    def loss_ours(K):
        return jnp.sum(jnp.tanh(triangular_inverse(cholesky(K)) @ Kmn))

    P = 8
    factors = jnp.tril(jax.random.normal(k1, (P, M, M), dtype))
    weights = jax.random.normal(k2, (N, P), dtype)

    def variance_einsum(Lq, Bm):
        return jnp.sum(jnp.einsum("pmk,mn->pkn", Lq, Bm) ** 2, axis=1).T

    def variance_flat(Lq, Bm):  # the layout core.conditional uses
        return jnp.sum(factors_transpose_times(Lq, Bm) ** 2, axis=1).T

    def variance_grad(form):
        def one(Lq, i):
            gL, gB = jax.grad(lambda Lq, Bm: jnp.sum(weights * form(Lq, Bm)), argnums=(0, 1))(Lq, Kmn + tiny * i)
            return gL.sum() + gB.sum()
        return one

    N_all, B = 7372, 1000
    out = {
        "precision": precision,
        "inverse_solve_ms": best_ms(lambda L, i: solve_triangular(perturb(L, i), eye, lower=True).sum(), L, 200),
        "inverse_blocked_ms": best_ms(lambda L, i: triangular_inverse(perturb(L, i)).sum(), L, 200),
        "grad_jax_rules_ms": best_ms(lambda K, i: jax.grad(loss_jax)(perturb(K, i)).sum(), K, 50),
        "grad_our_rules_ms": best_ms(lambda K, i: jax.grad(loss_ours)(perturb(K, i)).sum(), K, 50),
        "subsample_numpyro_ms": best_ms(
            lambda k, i: _subsample_fn(N_all, B, jax.random.fold_in(k, i)).sum().astype(dtype), jax.random.PRNGKey(0), 100),
        "subsample_top_k_ms": best_ms(
            lambda k, i: _top_k_subsample(N_all, B, jax.random.fold_in(k, i)).sum().astype(dtype), jax.random.PRNGKey(0), 100),
        "variance_grad_einsum_ms": best_ms(variance_grad(variance_einsum), factors, 50),
        "variance_grad_flat_ms": best_ms(variance_grad(variance_flat), factors, 50),
    }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=["float64", "float32"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    results = []
    for precision in ("float64", "float32"):
        proc = subprocess.run([sys.executable, __file__, "--child", precision], check=True, capture_output=True, text=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    record = {"command": command("step_parts.py", argv), "machine": machine(), "date": now(), "results": results}
    write_results("step_parts", record, markdown(record))
    print(markdown(record))


def markdown(record):
    lines = [
        *header("Parts of the training step (ms per call, inside a jitted scan, best of 3)", record["command"],
                record["machine"], record["date"], compact=True),
        "",
        *table(["precision", "100x100 triangular inverse: XLA solve", "block recursion",
                "grad through Cholesky + inverse: JAX rules", "our rules", "draw 1000 of 7372: NumPyro scan", "top_k",
                "grad of variance term: batched einsum", "one product"],
               [[r["precision"], *(f"{r[k]:.3f}" for k in (
                   "inverse_solve_ms", "inverse_blocked_ms", "grad_jax_rules_ms", "grad_our_rules_ms",
                   "subsample_numpyro_ms", "subsample_top_k_ms", "variance_grad_einsum_ms", "variance_grad_flat_ms"))]
                for r in record["results"]]),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
