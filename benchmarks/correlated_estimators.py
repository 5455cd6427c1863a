"""The two estimators of DGPElbo for the guides that correlate the layers, at equal time:
gradient variance per second of each (``DGPElbo(correlated="exact")`` against
``correlated="sampled"``).

A 2-layer DGP (``deep_gp_regression``, ARD RBF kernels, whitened) on ``--num-data`` synthetic
points with ``--input-dim`` inputs (the data of ``scale.py``), hidden width ``--width``, M =
``--num-inducing``, the whole batch in every step, float64. Each guide is first trained with the
exact estimator for ``--train-steps`` Adam steps from the same start (so that the cross-layer
terms are no longer zero). At those parameters, ``--draws`` gradients of the loss per estimator
with respect to the unconstrained parameters (what the optimizer moves) with independent keys
give each parameter's variance over keys; "variance" is their sum, also
split by what the parameter belongs to. Seconds per gradient: the jitted gradient, median of
``--repeats`` calls. Efficiency: variance x seconds, the variance of the mean of the gradients
one second buys (times one second); lower is better, and the ratio says how many times more
gradients (or particles) the noisier estimator needs to match the other in the same time.

Usage::

    python benchmarks/correlated_estimators.py    # results/correlated_estimators.{json,md}
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _harness import base_record, header, table, write_results

ESTIMATORS = ("exact", "sampled")


def _group(name: str) -> str:
    """What a parameter belongs to, for the variance split."""
    if "coupling" in name or "joint" in name:
        return "q(u) (joint or coupling)"
    if "_auto_" in name:
        return "q(u) of " + name.split(".")[0]
    return "kernels and likelihood"


def run(guide_name, args):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    from numpyro.infer import SVI
    from scale import synthetic

    import numpyro_dgp as dgp

    X, y = synthetic(args.num_data, np.float64, dim=args.input_dim)
    model = dgp.models.deep_gp_regression(2, num_inducing=args.num_inducing, hidden_width=args.width)
    guide = {"joint": dgp.guides.AutoJointDGP, "chain": dgp.guides.AutoChainDGP}[guide_name](model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=args.train_steps, progress_bar=False)
    # the gradient Adam sees: with respect to the unconstrained parameters
    params = svi.optim.get_params(result.state.optim_state)
    rows = []
    for estimator in ESTIMATORS:
        objective = dgp.DGPElbo(correlated=estimator)
        grad = jax.jit(jax.grad(lambda p, k: objective.loss(k, svi.constrain_fn(p), model, guide, X, y)))
        jax.block_until_ready(grad(params, jax.random.PRNGKey(1)))
        seconds = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(grad(params, jax.random.PRNGKey(100 + i)))
            seconds.append(time.perf_counter() - t0)
        draws = [grad(params, k) for k in jax.random.split(jax.random.PRNGKey(7), args.draws)]
        variance = {}
        for name in params:
            stacked = jnp.stack([d[name] for d in draws])
            group = _group(name)
            variance[group] = variance.get(group, 0.0) + float(jnp.sum(jnp.var(stacked, axis=0, ddof=1)))
        total = sum(variance.values())
        row = {"guide": guide_name, "estimator": estimator, "seconds": statistics.median(seconds),
               "variance": total, "variance_by_group": variance,
               "efficiency": total * statistics.median(seconds), "final_loss": float(result.losses[-1])}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def markdown(record):
    lines = header("Exact recursion against the sampled estimator: gradient variance at equal time",
                   record["command"], record["machine"], "float64", record["date"]) + [""]
    a = record["args"]
    lines += [f"A 2-layer DGP, {a['num_data']} synthetic points with {a['input_dim']} inputs, width {a['width']}, "
              f"M = {a['num_inducing']}, whole batch; each guide trained {a['train_steps']} Adam steps with the exact "
              f"estimator first. Variance: the sum over parameters of each one's variance over {a['draws']} gradients "
              f"(independent keys); seconds: one jitted gradient (median of {a['repeats']}); efficiency: variance x "
              "seconds (lower is better).", ""]
    rows = record["rows"]
    groups = sorted({g for r in rows for g in r["variance_by_group"]})
    lines += table(["guide", "estimator", "ms / gradient", "variance", "efficiency", "/ exact's"] + groups,
                   [[r["guide"], r["estimator"], f"{1e3 * r['seconds']:.1f}", f"{r['variance']:.4g}",
                     f"{r['efficiency']:.4g}",
                     f"{r['efficiency'] / next(e for e in rows if e['guide'] == r['guide'] and e['estimator'] == 'exact')['efficiency']:.2f}"]
                    + [f"{r['variance_by_group'].get(g, 0.0):.3g}" for g in groups] for r in rows])
    return "\n".join(lines + [""])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-data", type=int, default=1000)
    parser.add_argument("--input-dim", type=int, default=10)
    parser.add_argument("--width", type=int, default=10)
    parser.add_argument("--num-inducing", type=int, default=50)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--guides", nargs="+", choices=("joint", "chain"), default=["joint", "chain"])
    parser.add_argument("--tag", default="correlated_estimators")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    record = base_record("correlated_estimators.py", argv)
    record.update(args=vars(args), rows=[])
    for guide_name in args.guides:
        record["rows"] += run(guide_name, args)
    write_results(args.tag, record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
