"""A latent-variable DGP trained by the importance-weighted bound against DSVI, on UCI splits.

The latent-variable model of Salimbeni, Dutordoir, Hensman & Deisenroth (2019): a latent
``w_n ~ N(0, 1)`` appended to every input (:func:`numpyro_dgp.latent_input`, ``q(w_n)`` from an
MLP of ``[x_n, y_n]``), then ``--layers`` GP layers (inner width ``D + 1``, identity mean),
Gaussian noise, trained by :class:`numpyro_dgp.ImportanceWeightedElbo` with ``K =
--num-importance``. Against the DSVI DGP of ``benchmarks/uci.py`` (same layers without the
latent input, :class:`numpyro_dgp.DGPElbo`), the same steps, batch and learning rate. Test
log-likelihood, RMSE and CRPS in the original units, from mixtures of 100 samples (the
latents of test points drawn from their prior).

Writes ``benchmarks/results/latent_variable_<tag>.json`` and ``.md`` with the exact command.

Example (the committed results)::

    python benchmarks/latent_variable.py --dataset concrete --splits 0-2 --steps 5000 --tag concrete
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _harness import add_data_dir, command, header, machine, table, write_results


def latent_variable_dgp(num_layers: int, num_inducing: int):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    import numpyro_dgp as dgp
    from numpyro_dgp.kernels import RBF

    def model(X, y=None, batch_size=None):
        data = numpyro.plate("data", X.shape[0], subsample_size=batch_size)
        with data:
            X_batch = numpyro.subsample(X, event_dim=1)
            y_batch = None if y is None else numpyro.subsample(y, event_dim=0)
            features = X_batch if y is None else jnp.concatenate([X_batch, y_batch[:, None]], -1)
            h = dgp.latent_input("w", X_batch, 1, encoder_input=features)
        width = h.shape[-1]
        for layer in range(1, num_layers + 1):
            last = layer == num_layers
            h = dgp.gp_layer(f"h{layer}", h, RBF(), num_inducing=num_inducing, out_dim=1 if last else width,
                             mean="zero" if last else "identity")
        noise = numpyro.param("noise", jnp.asarray(0.01, X.dtype), constraint=dist.constraints.positive)
        with data:
            numpyro.sample("y", dist.Normal(h[..., 0], jnp.sqrt(noise)), obs=y_batch)

    return model


def fit_and_score(model, guide, objective, data, args, seed) -> dict:
    import jax
    import jax.numpy as jnp
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp

    svi = SVI(model, guide, numpyro.optim.Adam(args.lr), objective)
    X, y = jnp.asarray(data.X_train), jnp.asarray(data.y_train)
    start = time.perf_counter()
    result = dgp.fit(svi, jax.random.PRNGKey(seed), X, y, num_steps=args.steps,
                     batch_size=min(args.batch_size, X.shape[0]), progress_bar=False)
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(seed + 1), jnp.asarray(data.X_test),
                       num_samples=100)
    scores = dgp.metrics(pred, data.y_test, y_scale=data.y_std)
    return {**scores, "seconds_per_step": result.seconds_per_step, "seconds": time.perf_counter() - start,
            "skipped": int(result.num_skipped), "final_loss": float(np.mean(result.losses[-100:]))}


def summary(values) -> str:
    v = np.asarray(values, float)
    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return f"{v.mean():.3f} ({se:.3f})"


def markdown(record: dict) -> str:
    runs = record["runs"]
    rows = []
    for label, key in (("DSVI DGP (DGPElbo)", "dsvi"), ("latent-variable DGP (IW bound)", "latent")):
        rs = [r[key] for r in runs]
        rows.append([label, len(rs), summary([r["log_likelihood"] for r in rs]), summary([r["rmse"] for r in rs]),
                     summary([r["crps"] for r in rs]), f"{np.mean([r['seconds_per_step'] for r in rs]) * 1e3:.1f}"])
    lines = [*header(f"Latent-variable DGP (importance-weighted bound) against DSVI: {record['dataset']}",
                     record["command"], record["machine"], record["settings"]), "",
             *table(["model", "splits", "test LL", "RMSE", "CRPS", "ms/step"], rows),
             "", "Mean (standard error) over splits, original target units. Per split (test LL):", "",
             *table(["split", "DSVI", "latent-variable", "skipped DSVI / LV"],
                    [[r["split"], f"{r['dsvi']['log_likelihood']:.4f}", f"{r['latent']['log_likelihood']:.4f}",
                      f"{r['dsvi']['skipped']} / {r['latent']['skipped']}"] for r in runs])]
    return "\n".join(lines) + "\n"


def write(record: dict, path: Path) -> None:
    Path(path).write_text(markdown(record))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="concrete")
    parser.add_argument("--splits", default="0-4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--num-importance", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.01)
    add_data_dir(parser)
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpyro_dgp as dgp
    from numpyro_dgp.datasets import load_uci, parse_splits

    record = {"command": command("latent_variable.py", argv), "machine": machine(), "dataset": args.dataset,
              "settings": (f"{args.layers} layers, M = {args.num_inducing}, {args.steps} steps, batch {args.batch_size}, "
                           f"Adam {args.lr}, K = {args.num_importance}, float64"),
              "runs": []}
    stem = f"latent_variable_{args.tag or args.dataset}"
    for split in parse_splits(args.splits):
        data = load_uci(args.dataset, split, data_dir=args.data_dir)
        dsvi_model = dgp.models.deep_gp_regression(args.layers, num_inducing=args.num_inducing)
        dsvi = fit_and_score(dsvi_model, dgp.guides.AutoFactorizedDGP(dsvi_model), dgp.DGPElbo(), data, args, split)
        lv_model = latent_variable_dgp(args.layers, args.num_inducing)
        lv_guide = dgp.guides.AutoFactorizedDGP(lv_model, latent_inputs="amortized")
        latent = fit_and_score(lv_model, lv_guide, dgp.ImportanceWeightedElbo(args.num_importance), data, args, split)
        record["runs"].append({"split": split, "dsvi": dsvi, "latent": latent})
        print(json.dumps(record["runs"][-1]), flush=True)
        write_results(stem, record, markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
