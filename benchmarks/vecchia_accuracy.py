"""How close is the Vecchia prior to the exact one at UCI inputs, as m grows? Dense float64, no MCMC.

At the points of ``vecchia_ground_truth.py``'s agreement check (``--num-train`` training rows
in its fixed random order, then the first ``--num-held-out`` test inputs) and with the first
layer's kernel of the same DSVI fit, for each ``m``:

* the KL divergence from the exact prior ``N(0, K + jitter I)`` to the Vecchia prior
  (closed form from the sparse inverse factor ``U``: ``(||U L||_F^2 - n) / 2 - log|L| +
  sum log d``);
* a one-layer GP on the training targets with the fitted noise: the posterior at the held-out
  points under each prior, dense (Vecchia precision ``U^T U`` plus the likelihood's), the
  largest difference of the means in exact posterior standard deviations and the range of
  the variance ratio.

Both for the data's neighbour sets (Euclidean in the standardized inputs, the default) and
for sets chosen in the kernel's metric (inputs divided by the lengthscales).

    python benchmarks/vecchia_accuracy.py --data-dir ../shared/data/uci
"""

from __future__ import annotations

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import add_data_dir, base_record, header, table, write_results  # noqa: E402

from numpyro_dgp import kernels, recipes  # noqa: E402
from numpyro_dgp.core import nearest_previous_neighbors, vecchia_factors  # noqa: E402
from numpyro_dgp.datasets import load_uci  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_dir(p)
    p.add_argument("--dataset", default="kin8nm")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--num-train", type=int, default=100)
    p.add_argument("--num-held-out", type=int, default=100)
    p.add_argument("--neighbors", type=int, nargs="+", default=[10, 25, 50, 100, 150])
    p.add_argument("--dsvi-steps", type=int, default=5000)
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def vecchia_precision(kernel, A, choose, order, m, jitter):
    """The Vecchia prior's inverse factor ``U`` (rows ``(e_k - b_k) / d_k``; ``U^T U`` is its precision), in the
    points' own order, and the conditional scales ``d``; neighbour sets chosen among ``choose``."""
    n = len(A)
    neighbors, mask = nearest_previous_neighbors(choose[order], m)
    F = vecchia_factors(kernel, A[order], neighbors, mask, np.full(n, jitter))
    B = np.zeros((n, n))
    for k in range(n):
        np.add.at(B[k], np.asarray(F.neighbors[k]), np.asarray(F.coef[k]))
    U = (np.eye(n) - B) / np.asarray(F.scale)[:, None]
    inverse = np.argsort(order)
    return U[np.ix_(inverse, inverse)], np.asarray(F.scale)


def main(argv=None):
    args = parse(argv)
    record = base_record("vecchia_accuracy.py", argv)
    run = recipes.run_uci(args.dataset, args.split, data_dir=args.data_dir, num_steps=args.dsvi_steps)
    split = load_uci(args.dataset, args.split, data_dir=args.data_dir)
    order = np.random.default_rng(0).permutation(len(split.X_train))[:args.num_train]
    A = np.concatenate([split.X_train[order], split.X_test[:args.num_held_out]])
    y = np.asarray(split.y_train[order])
    lengthscale = np.asarray(run.params["h1.kernel.lengthscale"])
    variance = float(run.params["h1.kernel.variance"])
    noise = float(run.params["noise"])
    kernel = kernels.RBF(variance=variance, lengthscale=jnp.asarray(lengthscale))
    n, N = len(A), args.num_train
    jitter = 1e-6 * variance  # the layers' float64 default, relative to the kernel variance
    K = np.asarray(kernel(A)) + jitter * np.eye(n)
    L = np.linalg.cholesky(K)
    likelihood = np.diag(np.r_[np.full(N, 1 / noise), np.zeros(n - N)])
    exact_cov = np.linalg.inv(np.linalg.inv(K) + likelihood)
    exact_mean = exact_cov @ np.r_[y / noise, np.zeros(n - N)]
    sd = np.sqrt(np.diag(exact_cov))[N:]
    # the handler's order: the data rows at random (its ordering_seed 0), then the grid rows
    ordering = np.concatenate([np.asarray(jax.random.permutation(jax.random.PRNGKey(0), N)), np.arange(N, n)])
    rows = []
    for sets, choose in (("inputs", A), ("inputs / lengthscales", A / lengthscale)):
        for m in args.neighbors:
            U, scale = vecchia_precision(kernel, A, choose, ordering, m, jitter)
            # both factors in the points' own order (the KL does not depend on it)
            kl = 0.5 * (np.sum((U @ L) ** 2) - n) - np.log(np.diag(L)).sum() + np.log(scale).sum()
            cov = np.linalg.inv(U.T @ U + likelihood)
            mean = cov @ np.r_[y / noise, np.zeros(n - N)]
            ratio = np.diag(cov)[N:] / np.diag(exact_cov)[N:]
            rows.append({"sets": sets, "m": m, "kl": float(kl),
                         "max_mean_difference_in_sds": float(np.max(np.abs(mean - exact_mean)[N:] / sd)),
                         "variance_ratio_range": [float(ratio.min()), float(ratio.max())]})
            print(rows[-1], flush=True)
    record.update(settings=vars(args), lengthscale=lengthscale.tolist(), variance=variance, noise=noise,
                  condition_number=float(np.linalg.cond(K)), rows=rows)
    lines = header(f"Vecchia prior against the exact one at {args.dataset}'s inputs (dense float64)",
                   record["command"], record["machine"], record["date"])
    lines += ["", f"{N} training rows (in `vecchia_ground_truth.py`'s order) and {n - N} held-out inputs, the first "
              f"layer's RBF kernel of a DSVI fit (lengthscales {np.round(lengthscale, 2).tolist()}, variance "
              f"{variance:.2f}), jitter {jitter:.1e}, condition number {record['condition_number']:.1e}. "
              "Posterior: a one-layer GP on the training targets with the fitted noise "
              f"({noise:.3f}), at the held-out inputs.", ""]
    lines += table(["neighbour sets from", "m", "KL from exact to Vecchia (nats)", "max mean difference (posterior sds)",
                    "variance ratio Vecchia / exact"],
                   [(r["sets"], r["m"], f"{r['kl']:.1f}", f"{r['max_mean_difference_in_sds']:.2f}",
                     f"{r['variance_ratio_range'][0]:.2f} - {r['variance_ratio_range'][1]:.2f}") for r in rows])
    stem = f"vecchia_accuracy_{args.dataset}" + (f"_{args.tag}" if args.tag else "")
    write_results(stem, record, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
