"""Natural gradients against Adam alone: the wall-clock time to DSVI's final training objective.

For each data set and split, the 2-layer DSVI DGP of ``benchmarks/uci.py`` (M = 100, batch
1,000) is fitted twice from the same start: with Adam on every parameter, and with
:func:`numpyro_dgp.infer.natural_gradients` on the last layer's ``q(u)`` (step size ramped
log-linearly from 1e-4 to ``--gamma`` over ``--ramp`` steps) and Adam on the rest. The target is
Adam's final training objective, the mean loss of its last ``--window`` steps; each run's
time to the target is the compiled-step time (compilation excluded) until the mean loss of
the trailing ``--window`` steps first reaches it. Test log-likelihood and RMSE at the end of
each run.

With ``--with-gpflux PYTHON`` (the venv of ``benchmarks/peers/setup.sh``), GPflow's
``NaturalGradient`` against Adam in the same DGP in GPflux, on the same splits in the same run
(``benchmarks/peers/gpflux_natural_gradients.py``), timed and scored the same way.

Writes ``benchmarks/results/natural_gradients_<tag>.json`` and ``.md`` with the exact command.

Example (the committed results)::

    python benchmarks/natural_gradients.py --datasets kin8nm,power-plant --splits 0 --steps 5000 \\
        --with-gpflux $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python --tag uci
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np
from _harness import add_data_dir, command, header, machine, table, write_results

PEER = Path(__file__).resolve().parent / "peers" / "gpflux_natural_gradients.py"


def time_to(losses: np.ndarray, step_seconds: np.ndarray, target: float, window: int) -> float:
    """Seconds until the trailing ``window``-step mean of ``losses`` first reaches ``target``
    (NaN if it never does)."""
    running = np.convolve(losses, np.ones(window) / window, mode="valid")  # ends at step window - 1 + i
    reached = np.flatnonzero(running <= target)
    return float(np.cumsum(step_seconds)[window - 1 + reached[0]]) if reached.size else float("nan")


def run(data, args, natural: bool, seed: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpyro
    import optax
    from numpyro.infer import SVI

    import numpyro_dgp as dgp

    model = dgp.models.deep_gp_regression(2, num_inducing=args.num_inducing)
    guide = dgp.guides.AutoFactorizedDGP(model)
    if natural:
        ramp = dgp.infer.natural_gradient_ramp(1e-4, args.gamma, args.ramp)
        optimizer = dgp.infer.natural_gradients(guide, optax.adam(args.lr), step_size=ramp)
    else:
        optimizer = numpyro.optim.Adam(args.lr)
    svi = SVI(model, guide, optimizer, dgp.DGPElbo())
    X, y = jnp.asarray(data.X_train), jnp.asarray(data.y_train)
    start = time.perf_counter()
    result = dgp.fit(svi, jax.random.PRNGKey(seed), X, y, num_steps=args.steps, chunk_size=args.chunk,
                     batch_size=min(args.batch_size, X.shape[0]), progress_bar=False)
    wall = time.perf_counter() - start
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(seed + 1), jnp.asarray(data.X_test),
                       num_samples=100, batch_size=10_000)
    scores = dgp.metrics(pred, data.y_test, y_scale=data.y_std)
    step_seconds = np.repeat(result.chunk_seconds / result.chunk_size, result.chunk_size)[: args.steps]
    return {"losses": np.asarray(result.losses), "step_seconds": step_seconds, "compile_seconds": result.compile_seconds,
            "wall_seconds": wall, "skipped": int(result.num_skipped), "test_ll": scores["log_likelihood"],
            "test_rmse": scores["rmse"]}


def gpflux(python: str, name: str, split: int, args) -> dict:
    """Adam and natural gradients + Adam in GPflux on one split (a subprocess in its own venv)."""
    command = [python, str(PEER), "--dataset", name, "--split", str(split), "--steps", str(args.steps),
               "--gamma", str(args.gamma), "--ramp", str(args.ramp), "--seed", str(split)]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the GPflux peer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(adam: dict, natural: dict, window: int) -> dict:
    """Both runs' time to Adam's final objective, step time, final objective and test scores."""
    target = float(np.mean(adam["losses"][-window:]))
    entry = {"target": target}
    for label, r in (("adam", adam), ("natural", natural)):
        losses = np.asarray(r["losses"])
        entry[label] = {"seconds_to_target": time_to(losses, r["step_seconds"], target, window),
                        "ms_per_step": float(np.median(r["step_seconds"]) * 1e3),
                        "compile_seconds": r.get("compile_seconds"),
                        "final_objective": float(np.mean(losses[-window:])), "test_ll": r["test_ll"],
                        "test_rmse": r["test_rmse"], "skipped": r.get("skipped", "-")}
    return entry


def _row(library: str, r: dict) -> list:
    ratio = r["natural"]["seconds_to_target"] / r["adam"]["seconds_to_target"]
    return [library, r["dataset"], r["split"], f"{r['adam']['seconds_to_target']:.1f}",
            f"{r['natural']['seconds_to_target']:.1f}", f"{ratio:.2f}", f"{r['adam']['ms_per_step']:.2f}",
            f"{r['natural']['ms_per_step']:.2f}", f"{r['adam']['test_ll']:.3f} / {r['natural']['test_ll']:.3f}",
            f"{r['adam']['skipped']} / {r['natural']['skipped']}"]


def markdown(record: dict) -> str:
    rows = []
    for r in record["runs"]:
        rows.append(_row("numpyro-dgp", r))
        if "gpflux" in r:
            rows.append(_row("gpflux", {**r["gpflux"], "dataset": r["dataset"], "split": r["split"]}))
    lines = [*header("Natural gradients (last layer) + Adam against Adam alone: time to DSVI's final objective",
                     record["command"], record["machine"], record["settings"]), "",
             *table(["library", "data set", "split", "Adam: s to target", "NG + Adam: s to target", "ratio",
                     "Adam ms/step", "NG ms/step", "test LL Adam / NG", "skipped Adam / NG"], rows)]
    lines += ["", "Each library's target is its own Adam run's final training objective (mean negative ELBO of "
              f"its last {record['window']} steps, standardized units); s to target: compiled-step seconds until a "
              f"run's trailing {record['window']}-step mean loss first reaches it (compilation excluded, NaN: "
              "never). Ratio below 1: natural gradients reach it sooner. Test LL per point, original units."]
    if record.get("gpflux_version"):
        lines += ["", f"Peer: {record['gpflux_version']} (GPflow's `NaturalGradient` on the last layer's "
                  "`q_mu`, `q_sqrt`, the same ramp; its per-step time is the mean over the run)."]
    return "\n".join(lines) + "\n"


def write(record: dict, path: Path) -> None:
    Path(path).write_text(markdown(record))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="kin8nm,power-plant")
    parser.add_argument("--splits", default="0-2")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--gamma", type=float, default=0.1, help="the natural-gradient step after the ramp")
    parser.add_argument("--ramp", type=int, default=100, help="steps of the log-linear ramp from 1e-4")
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=100)
    add_data_dir(parser)
    parser.add_argument("--with-gpflux", metavar="PYTHON", default=None, help="the GPflux venv's python")
    parser.add_argument("--tag", default="uci")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    from numpyro_dgp.datasets import load_uci, parse_splits

    record = {"command": command("natural_gradients.py", argv), "machine": machine(),
              "settings": (f"2 layers, M = {args.num_inducing}, batch {args.batch_size}, {args.steps} steps, Adam "
                           f"{args.lr}; natural gradients on the last layer's q(u), step 1e-4 -> {args.gamma} over "
                           f"{args.ramp} steps; float64"),
              "window": args.window, "runs": []}
    for name in args.datasets.split(","):
        for split in parse_splits(args.splits):
            data = load_uci(name, split, data_dir=args.data_dir)
            adam = run(data, args, False, split)
            natural = run(data, args, True, split)
            entry = {"dataset": name, "split": split, **summarize(adam, natural, args.window)}
            if args.with_gpflux:
                peer = gpflux(args.with_gpflux, name, split, args)
                record["gpflux_version"] = peer["version"]
                runs = [{**peer[k], "step_seconds": np.full(args.steps, peer[k]["seconds_per_step"])}
                        for k in ("adam", "natural")]
                entry["gpflux"] = summarize(*runs, args.window)
            record["runs"].append(entry)
            print(json.dumps(entry), flush=True)
            write_results(f"natural_gradients_{args.tag}", record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
