"""Step time of NVC against DSVI on the six UCI data sets of ``nested.py``, measured on its own
(interleaved, no training or evaluation in between), with the cost of the one computation the
exact NVC bound cannot avoid.

For each data set (split 0, its training set's shapes): the models, guides and objectives of
``nested.py`` (``dsvi``, ``nvc``, ``nvc_penalize``), each trained ``--warmup`` steps first (so the
timed steps see fitted, not initial, parameters), then ``--rounds`` rounds of one compiled chunk
of ``--chunk`` steps per method, the methods alternating within each round; the median
seconds per step per method.

The floor: the full NVC bound (``propagate_inducing_variance=True``) needs the inner layer's
summed ``Psi2`` at per-point input variances, ``sum_n exp(log_w_n - sum_d (mean_nd - zbar_qd)^2
/ scale_nd)`` for every pair ``q`` of inducing inputs (``Q = M (M + 1) / 2``), and its gradient.
The script times exactly that (``numpyro_dgp.core._gauss_sums.gauss_sums_over_points``, forward
and gradient, random inputs at the data set's ``B``, ``Q`` and hidden width) and, as the bare
minimum inside it, the exponentials of a ``B x Q`` array, in the same rounds.

Writes ``benchmarks/results/nested_step_time.json`` and ``.md`` with the command line.

Example (the committed results)::

    python benchmarks/nested_step_time.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _harness import add_data_dir, command, header, machine, now, table, write_results
from nested import DEFAULT_DATASETS, METHODS, _Run

PARTS = ("psi2_sums_fwd_grad", "exp_only")


def _floor_functions(batch: int, num_inducing: int, width: int, rng: np.random.Generator):
    """The summed-``Psi2`` Gaussian sums (forward and gradient) and the bare exponentials at
    these sizes, jitted, with their inputs."""
    import jax
    import jax.numpy as jnp

    from numpyro_dgp.core._gauss_sums import gauss_sums_over_points

    pairs = num_inducing * (num_inducing + 1) // 2
    mean = jnp.asarray(rng.normal(size=(batch, width)))
    scale = jnp.asarray(1.0 + rng.random((batch, width)))
    log_weight = jnp.asarray(0.1 * rng.normal(size=batch))
    centers = jnp.asarray(rng.normal(size=(pairs, width)))
    contraction = jnp.asarray(rng.normal(size=pairs))
    ones = jnp.ones(batch)

    def contracted(m, s, w, c):
        return gauss_sums_over_points(m, s, w, c, ones) @ contraction

    sums = jax.jit(jax.value_and_grad(contracted, argnums=(0, 1, 2, 3)))
    exponent = jnp.asarray(0.1 * rng.normal(size=(batch, pairs)))
    exps = jax.jit(lambda x: jnp.sum(jnp.exp(x)))
    return {"psi2_sums_fwd_grad": (sums, (mean, scale, log_weight, centers)), "exp_only": (exps, (exponent,))}


def _time(fn, args, repeats: int) -> float:
    import jax

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure(name: str, args) -> dict:
    import jax
    import jax.numpy as jnp

    from numpyro_dgp.datasets import load_uci

    data = load_uci(name, 0, data_dir=args.data_dir)
    X, y = jnp.asarray(data.X_train), jnp.asarray(data.y_train)
    N, D = X.shape
    batch, width, num_inducing = min(args.batch_size, N), min(D, 30), min(args.num_inducing, N)
    args.eval_every = args.chunk  # _Run trains in chunks of eval_every steps
    runs = {m: _Run(m, X, y, args, jax.random.PRNGKey(0)) for m in METHODS}
    for run in runs.values():
        for _ in range(max(1, args.warmup // args.chunk)):
            run.train_chunk()
    floor = _floor_functions(batch, num_inducing, width, np.random.default_rng(0))
    for fn, inputs in floor.values():
        jax.block_until_ready(fn(*inputs))  # compile
    per_step = {k: [] for k in (*METHODS, *PARTS)}
    for _ in range(args.rounds):
        for m, run in runs.items():
            run.train_chunk()
            per_step[m].append(run.chunk_seconds[-1] / args.chunk)
        for part, (fn, inputs) in floor.items():
            per_step[part].append(_time(fn, inputs, args.chunk))
    median = {k: float(np.median(v)) for k, v in per_step.items()}
    skipped = {m: run.num_skipped for m, run in runs.items()}
    print(f"{name}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in median.items()), flush=True)
    return {"N": N, "batch": batch, "hidden_width": width, "num_inducing": num_inducing,
            "seconds_per_step": median, "rounds": per_step, "num_skipped": skipped}


def markdown(record: dict) -> str:
    rows = []
    for name, r in record["results"].items():
        t = {k: v * 1e3 for k, v in r["seconds_per_step"].items()}
        rows.append([name, r["N"], r["batch"], r["hidden_width"], f"{t['dsvi']:.1f}", f"{t['nvc']:.1f}",
                     f"{t['nvc_penalize']:.1f}", f"{t['psi2_sums_fwd_grad']:.1f}", f"{t['exp_only']:.1f}",
                     f"{t['nvc'] / t['dsvi']:.2f}x", f"{t['nvc_penalize'] / t['dsvi']:.2f}x",
                     f"{t['psi2_sums_fwd_grad'] / t['dsvi']:.2f}x"])
    lines = [
        *header("NVC step time against DSVI, with the cost of the summed Psi2 (numpyro-dgp)", record["command"],
                record["machine"], "float64", record["date"], record["settings"]),
        "",
        "Median milliseconds per step over the rounds (each method's compiled chunk, the methods alternating; "
        "`nvc` is the full bound, `nvc_penalize` the inner layer forwarding its noise only). "
        "`Psi2 sums` is the summed `Psi2` of the inner layer at per-point input variances, forward and "
        "gradient, alone; `exp` the exponentials of its `B x Q` entries alone (Q = M (M + 1) / 2).",
        "",
        *table(["dataset", "N", "B", "hidden width", "DSVI", "NVC", "NVC penalize", "Psi2 sums (fwd + grad)",
                "exp only", "NVC / DSVI", "NVC penalize / DSVI", "Psi2 sums / DSVI"], rows),
    ]
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, record: dict) -> None:
    Path(path).write_text(markdown(record))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=DEFAULT_DATASETS, help="comma-separated UCI names")
    parser.add_argument("--warmup", type=int, default=200, help="training steps per method before timing")
    parser.add_argument("--chunk", type=int, default=100, help="steps per timed chunk")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--inner-noise", type=float, default=0.01)
    parser.add_argument("--tag", default="nested_step_time", help="result name")
    add_data_dir(parser)
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    from numpyro_dgp.datasets import resolve_uci_name

    names = [resolve_uci_name(n) for n in args.datasets.split(",")]
    record = {
        "command": command("nested_step_time.py", argv),
        "machine": machine(),
        "date": now(),
        "settings": (f"nested.py's 2-layer model (M={args.num_inducing}, hidden width min(D, 30), AutoFactorizedDGP, "
                     f"Adam {args.lr}), batch min({args.batch_size}, N), split 0; {args.warmup} warm-up steps per "
                     f"method, then {args.rounds} rounds of {args.chunk} steps"),
        "results": {},
    }
    for name in names:
        record["results"][name] = measure(name, args)
        write_results(args.tag, record, markdown(record))
    return record


if __name__ == "__main__":
    main()
