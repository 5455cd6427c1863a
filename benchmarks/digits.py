"""Multi-class classification: a 2-layer softmax DGP on scikit-learn's handwritten digits.

Each seed draws a split (1,500 training and 297 test images, pixels standardized with the
training statistics) and fits the same DGP in numpyro-dgp and, with ``--with-gpflux``, in
GPflux right after it on the same split: 64 inputs, an inner layer of width ``--hidden-width``
(a fixed PCA projection as its mean function), a last layer of 10 outputs with a zero mean,
``--num-inducing`` k-means inducing inputs per layer, whitened ``q(u)``, Adam, minibatches of
``--batch-size``, and a softmax likelihood (ours: :func:`numpyro_dgp.likelihoods.softmax`,
32 Monte Carlo draws per point in the bound; GPflux: GPflow's ``Softmax``, 100). Test
accuracy, log-likelihood (its negative is the NLL) and expected calibration error from a
mixture of ``--num-samples`` propagated samples.

Writes ``benchmarks/results/digits_<tag>.json`` and ``.md`` with the exact command.

Example (the committed results)::

    python benchmarks/digits.py --seeds 0-4 --steps 3000 --with-gpflux $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python --tag softmax
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from _harness import command, header, machine, table, write_results

PEER = Path(__file__).resolve().parent / "peers" / "gpflux_digits.py"


def split(seed: int, num_train: int = 1500) -> dict:
    """One random split of the digits, standardized with the training part's statistics."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    train, test = order[:num_train], order[num_train:]
    X = digits.data.astype(np.float64)
    mean, scale = X[train].mean(0), X[train].std(0)
    scale = np.where(scale > 0, scale, 1.0)
    X = (X - mean) / scale
    return {"X_train": X[train], "y_train": digits.target[train], "X_test": X[test], "y_test": digits.target[test]}


def ours(data: dict, args: argparse.Namespace, seed: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp

    model = dgp.models.deep_gp_regression(2, num_inducing=args.num_inducing, hidden_width=args.hidden_width,
                                          likelihood="softmax", num_classes=10)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(args.lr), dgp.DGPElbo())
    dtype = jnp.float32 if args.float32 else jnp.float64
    X, y = jnp.asarray(data["X_train"], dtype), jnp.asarray(data["y_train"], jnp.int32)
    start = time.perf_counter()
    result = dgp.fit(svi, jax.random.PRNGKey(seed), X, y, num_steps=args.steps, batch_size=args.batch_size,
                     progress_bar=False)
    fit_seconds = time.perf_counter() - start
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(seed + 1), jnp.asarray(data["X_test"], dtype),
                       num_samples=args.num_samples)
    scores = dgp.metrics(pred, data["y_test"])
    return {"library": "numpyro-dgp", "seed": seed, "accuracy": scores["accuracy"],
            "nll": -scores["log_likelihood"], "ece": scores["ece"], "seconds_per_step": result.seconds_per_step,
            "compile_seconds": result.compile_seconds, "fit_seconds": fit_seconds,
            "skipped": int(result.num_skipped)}


def gpflux(python: str, data: dict, args: argparse.Namespace, seed: int) -> dict:
    """The GPflux peer on the same split (a subprocess in its own virtualenv)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "split.npz"
        np.savez(path, **data)
        command = [python, str(PEER), "--data", str(path), "--seed", str(seed), "--steps", str(args.steps),
                   "--num-inducing", str(args.num_inducing), "--hidden-width", str(args.hidden_width),
                   "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--num-samples", str(args.num_samples),
                   "--precision", "float32" if args.float32 else "float64"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the GPflux peer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(values: list) -> str:
    v = np.asarray(values, float)
    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return f"{v.mean():.4f} ({se:.4f})"


def markdown(record: dict) -> str:
    rows = []
    for library in ("numpyro-dgp", "gpflux"):
        runs = [r for r in record["runs"] if r["library"] == library]
        if runs:
            rows.append([library, len(runs), summary([r["accuracy"] for r in runs]), summary([r["nll"] for r in runs]),
                         summary([r["ece"] for r in runs]),
                         f"{np.mean([r['seconds_per_step'] for r in runs]) * 1e3:.1f}",
                         f"{np.mean([r['compile_seconds'] for r in runs]):.1f}",
                         f"{np.mean([r['fit_seconds'] for r in runs]):.0f}"])
    lines = [*header("Digits: a 2-layer softmax DGP (scikit-learn's 8x8 handwritten digits)", record["command"],
                     record["machine"], record["settings"]), "",
             *table(["library", "seeds", "test accuracy", "test NLL", "ECE", "ms/step", "compile s", "fit s"], rows),
             "", "Mean (standard error) over seeds; each seed its own random split, both libraries on the "
             "same split in the same run. NLL per test image (natural log).", "", "Per seed:", "",
             *table(["library", "seed", "accuracy", "NLL", "ECE", "ms/step", "skipped"],
                    [[r["library"], r["seed"], f"{r['accuracy']:.4f}", f"{r['nll']:.4f}", f"{r['ece']:.4f}",
                      f"{r['seconds_per_step'] * 1e3:.1f}", r.get("skipped", "-")] for r in record["runs"]])]
    return "\n".join(lines) + "\n"


def write(record: dict, path: Path) -> None:
    Path(path).write_text(markdown(record))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,3")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--hidden-width", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--num-samples", type=int, default=100, help="mixture components at prediction")
    parser.add_argument("--float32", action="store_true")
    parser.add_argument("--with-gpflux", metavar="PYTHON", default=None, help="the GPflux venv's python")
    parser.add_argument("--tag", default="softmax")
    args = parser.parse_args(argv)
    if not args.float32:
        import jax

        jax.config.update("jax_enable_x64", True)
    from numpyro_dgp.datasets import parse_splits

    record = {"command": command("digits.py", argv), "machine": machine(),
              "settings": (f"{args.steps} steps, M = {args.num_inducing}, width {args.hidden_width}, batch "
                           f"{args.batch_size}, Adam {args.lr}, {args.num_samples} samples, "
                           f"{'float32' if args.float32 else 'float64'}"),
              "runs": []}
    for seed in parse_splits(args.seeds):
        data = split(seed)
        record["runs"].append(ours(data, args, seed))
        print(json.dumps(record["runs"][-1]), flush=True)
        if args.with_gpflux:
            record["runs"].append(gpflux(args.with_gpflux, data, args, seed))
            print(json.dumps(record["runs"][-1]), flush=True)
        write_results(f"digits_{args.tag}", record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
