"""How close is the Vecchia prior to the exact one at UCI inputs, as m grows? Dense float64, no MCMC.

At the points of ``vecchia_ground_truth.py``'s agreement check (``--num-train`` training rows
in its fixed random order, then the first ``--num-held-out`` test inputs) and with the first
layer's kernel of the same DSVI fit, for each ``m``:

* the KL divergence from the exact prior ``N(0, K + jitter I)`` to the approximate prior
  ``N(0, S)`` (dense: ``(tr(S^{-1} K) - n + log|S| - log|K|) / 2``, ``S^{-1} = U^T U`` from the
  sparse inverse factor ``U``);
* a one-layer GP on the training targets with the fitted noise: the posterior at the held-out
  points under each prior, dense (the prior's precision plus the likelihood's), the
  largest difference of the means in exact posterior standard deviations and the range of
  the variance ratio.

For the data's neighbour sets (Euclidean in the standardized inputs, the handler's default)
and for three remedies the literature proposes for smooth kernels: sets chosen in the kernel's
metric (inputs divided by the lengthscales; Katzfuss et al. 2022), a maximin ordering
(Guinness 2018), and a low-rank part for the smooth component plus Vecchia on the residual
(``K = Q + (K - Q)`` with ``Q`` the Nystrom approximation at the first ``r`` points of the
random order; a full-scale approximation, Sang & Huang 2012).

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
    p.add_argument("--low-rank", type=int, nargs="*", default=[25, 50], help="ranks r of the low-rank + Vecchia rows")
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


def maximin_order(points):
    """Greedy maximin order (Guinness 2018): the point nearest the centre, then each time the point farthest
    from those already chosen."""
    chosen = [int(np.argmin(((points - points.mean(0)) ** 2).sum(1)))]
    distance = ((points - points[chosen[0]]) ** 2).sum(1)
    for _ in range(len(points) - 1):
        distance[chosen[-1]] = -1.0
        chosen.append(int(np.argmax(distance)))
        distance = np.minimum(distance, ((points - points[chosen[-1]]) ** 2).sum(1))
    return np.asarray(chosen)


def nystrom(kernel, Z, jitter):
    """``(X, X2) -> K(X, Z) K(Z, Z)^{-1} K(Z, X2)``."""
    chol = jnp.linalg.cholesky(kernel(jnp.asarray(Z)) + jitter * jnp.eye(len(Z)))

    def Q(X, X2):
        a = jax.scipy.linalg.solve_triangular(chol, kernel(jnp.asarray(Z), jnp.asarray(X)), lower=True)
        b = jax.scipy.linalg.solve_triangular(chol, kernel(jnp.asarray(Z), jnp.asarray(X2)), lower=True)
        return a.T @ b

    return Q


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
    maximin = np.concatenate([maximin_order(A[:N]), N + maximin_order(A[N:])])  # data first, as the handler
    variants = [("inputs", A, ordering, kernel, None), ("inputs / lengthscales", A / lengthscale, ordering, kernel, None),
                ("inputs, maximin order", A, maximin, kernel, None)]
    for r in args.low_rank:
        Q = nystrom(kernel, A[ordering[:r]], jitter)
        variants.append((f"low rank r = {r} + Vecchia residual", A, ordering, lambda X, Q=Q: kernel(X) - Q(X, X), Q))
    for sets, choose, order, gram, Q in variants:
        for m in args.neighbors:
            U, _ = vecchia_precision(gram, A, choose, order, m, jitter)
            precision = U.T @ U
            if Q is not None:  # the prior Q + (U^T U)^{-1}
                precision = np.linalg.inv(np.asarray(Q(A, A)) + np.linalg.inv(precision))
            # KL(N(0, K) || N(0, S)), S^{-1} = precision
            kl = 0.5 * (np.sum(precision * K) - n - np.linalg.slogdet(precision)[1]) - np.log(np.diag(L)).sum()
            cov = np.linalg.inv(precision + likelihood)
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
    lines += table(["neighbour sets, order, prior", "m", "KL from exact to Vecchia (nats)", "max mean difference (posterior sds)",
                    "variance ratio Vecchia / exact"],
                   [(r["sets"], r["m"], f"{r['kl']:.1f}", f"{r['max_mean_difference_in_sds']:.2f}",
                     f"{r['variance_ratio_range'][0]:.2f} - {r['variance_ratio_range'][1]:.2f}") for r in rows])
    stem = f"vecchia_accuracy_{args.dataset}" + (f"_{args.tag}" if args.tag else "")
    write_results(stem, record, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
