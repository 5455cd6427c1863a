"""Speed and launch of two versions of the package in the same run: an old checkout against
this one, interleaved rounds (the order alternates every round), medians.

Every measurement is a fresh process whose ``PYTHONPATH`` puts one checkout's ``numpyro_dgp``
first; nothing sets a persistent compilation cache.

* ``launch``: ``startup.py``'s children ``fit-f64`` and ``fit-f32`` (the kin8nm DSVI model,
  ``numpyro_dgp.fit`` initializing it: seconds from the process's launch to the first finished
  step) and ``svi-init`` (the same model initialized by NumPyro's own eager ``svi.init``);
* ``step``: the kin8nm-sized DSVI model (synthetic data, 7,373 x 8, batch 1,000 drawn inside the
  step, 2 layers, ``AutoFactorizedDGP`` + ``DGPElbo``, Adam) at each M x hidden width x
  precision: ms per step through ``fit`` (``FitResult.seconds_per_step``, chunks of 50) and
  through a jitted ``svi.update`` called from Python (three timed blocks of ``steps // 3``
  calls, at least 10).

Usage::

    git worktree add /tmp/old <old commit>
    python benchmarks/package_ab.py --before /tmp/old --data-dir ../shared/data/uci --rounds 3

writes ``benchmarks/results/package_ab{_tag}.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _harness import add_data_dir, command, header, machine, now, table, write_results

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LAUNCH_CONFIGS = ("fit-f64", "fit-f32", "svi-init")


def step_child(M: int, width: int, precision: str, steps: int) -> dict:
    """ms per step through ``fit`` and through a jitted ``svi.update`` (one process)."""
    import jax

    jax.config.update("jax_enable_x64", precision == "float64")
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp

    rs = np.random.RandomState(0)
    X = rs.randn(7373, 8).astype(precision)
    y = (np.sin(X.sum(1)) + 0.1 * rs.randn(7373)).astype(precision)
    model = dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=width)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    key = jax.random.PRNGKey(0)
    result = dgp.fit(svi, key, X, y, batch_size=1000, num_steps=steps, chunk_size=50, progress_bar=False)
    state = result.state
    update = jax.jit(lambda s: svi.update(s, X, y, batch_size=1000))
    state, loss = update(state)
    jax.block_until_ready(loss)
    times = []
    calls = max(10, steps // 3)
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            state, loss = update(state)
        jax.block_until_ready(loss)
        times.append((time.perf_counter() - t0) / calls)
    return {"fit_ms": 1e3 * result.seconds_per_step, "update_ms": 1e3 * float(np.median(times)),
            "package_path": str(Path(dgp.__file__).parent)}


def run(cmd: list[str], package: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["PYTHONPATH"] = str(package)
    env["NUMPYRO_DGP_STARTUP_T0"] = repr(time.time())  # startup.py's origin: just before the launch
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["(no stderr)"])[-1]}
    return json.loads(lines[-1])


def launch_seconds(config: str, package: Path, data_dir: str | None) -> dict:
    data = ["--data-dir", data_dir] if data_dir else []
    result = run([sys.executable, str(HERE / "startup.py"), "--child", config] + data, package)
    if "error" in result:
        return result
    marks = result["marks"]
    return {"first_step": marks["first_step"], "init": marks["init"] - marks["data"]}


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir(p)
    p.add_argument("--before", type=Path, help="the old checkout's root (required)")
    p.add_argument("--after", type=Path, default=ROOT, help="the new checkout's root (default: this one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--inducing", type=int, nargs="*", default=[100, 500])
    p.add_argument("--widths", type=int, nargs="*", default=[8, 32])
    p.add_argument("--precisions", nargs="*", default=["float64", "float32"])
    p.add_argument("--steps", type=int, default=150, help="fit steps per step measurement")
    p.add_argument("--skip-launch", action="store_true")
    p.add_argument("--tag", default="")
    p.add_argument("--child-step", nargs=4, metavar=("M", "WIDTH", "PRECISION", "STEPS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_step:
        M, width, precision, steps = args.child_step
        print(json.dumps(step_child(int(M), int(width), precision, int(steps))))
        return
    if args.before is None:
        p.error("--before (the old checkout's root) is required")
    packages = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: list[dict] = []
    for r in range(args.rounds):
        order = list(packages) if r % 2 == 0 else list(packages)[::-1]
        for config in () if args.skip_launch else LAUNCH_CONFIGS:
            for which in order:
                runs.append({"round": r, "kind": "launch", "config": config, "package": which,
                             **launch_seconds(config, packages[which], args.data_dir)})
                print(runs[-1], flush=True)
        for M in args.inducing:
            for width in args.widths:
                for precision in args.precisions:
                    cmd = [sys.executable, __file__, "--child-step", str(M), str(width), precision, str(args.steps)]
                    for which in order:
                        runs.append({"round": r, "kind": "step", "config": f"M={M} width={width} {precision}",
                                     "package": which, **run(cmd, packages[which])})
                        print(runs[-1], flush=True)
    record = {"command": command("package_ab.py", argv), "machine": machine(), "date": now(),
              "packages": {k: str(v) for k, v in packages.items()}, "runs": runs}
    write_results("package_ab" + (f"_{args.tag}" if args.tag else ""), record, report(record))


def report(record: dict) -> str:
    # a step child's record names its package's folder: it must be the arm's
    paths = {f"{path}/numpyro_dgp": which for which, path in record["packages"].items()}
    runs = [{**r, "package": paths.get(r["package"], r["package"])} for r in record["runs"] if "error" not in r]
    wrong = [r for r in runs if r.get("package_path", f"{record['packages'][r['package']]}/numpyro_dgp")
             != f"{record['packages'][r['package']]}/numpyro_dgp"]
    assert not wrong, f"runs that imported another checkout's package: {wrong[:2]}"
    rows = []
    for kind, fields in (("launch", ("first_step", "init")), ("step", ("fit_ms", "update_ms"))):
        for config in dict.fromkeys(r["config"] for r in runs if r["kind"] == kind):
            for field in fields:
                values = {w: [r[field] for r in runs if r["config"] == config and r["package"] == w]
                          for w in ("before", "after")}
                b, a = median(values["before"]), median(values["after"])
                rows.append([config, field, f"{b:.3f}", f"{a:.3f}", f"{a / b:.3f}", str(len(values["after"]))])
    failed = [f"{r['config']} ({r['package']}): {r['error']}" for r in record["runs"] if "error" in r]
    return "\n".join([
        *header("Package A/B: the old checkout against the new, same run", record["command"], record["machine"],
                record["date"]),
        f"Before: `{record['packages']['before']}`; after: `{record['packages']['after']}`. Launch: seconds from the "
        "process's launch (first_step) and in the model's initialization (init), `startup.py`'s children; step: ms "
        "per step through fit (lax.scan chunks) and a jitted svi.update per call. Medians over rounds.", "",
        *table(["configuration", "measure", "before", "after", "after / before", "rounds"], rows),
        "", ("Failed runs: " + "; ".join(failed)) if failed else "",
    ])


if __name__ == "__main__":
    main()
