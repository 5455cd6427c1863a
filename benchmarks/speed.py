"""Steady training speed and compile time of one DSVI step at the kin8nm configuration.

2 layers, hidden width 8, M = 100 k-means inducing points per layer, ARD RBF, whitened,
identity inner mean, minibatch 1000 drawn inside the compiled step (plate subsampling),
1 Monte Carlo sample (DGPElbo), Adam 0.01 -- the configuration of
shared/notes/performance.md. float32 and float64 each run in their own process (x64 is
process-wide); rounds alternate between them so machine drift hits both alike.

Reported per precision:
* compile: ``jax.jit(svi.update).lower(...).compile()`` wall time (the first step's cost);
* steady steps/s inside ``lax.scan`` (how :func:`numpyro_dgp.fit` runs), median over repeats,
  ``block_until_ready``, compile excluded;
* steady steps/s of a Python loop over the jitted update (one dispatch per step).

Usage::

    python benchmarks/speed.py --rounds 3        # writes benchmarks/results/speed.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path


def measure(precision, scan_length=50, repeats=5, data_dir=None):
    import jax

    if precision == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp
    from numpyro_dgp.datasets import load_uci
    from numpyro_dgp.models import deep_gp_regression

    dtype = jnp.float64 if precision == "float64" else jnp.float32
    data = load_uci("kin8nm", 0, data_dir=data_dir)
    X, y = jnp.asarray(data.X_train, dtype), jnp.asarray(data.y_train, dtype)
    model = deep_gp_regression(2, num_inducing=100, hidden_width=8)
    guide = dgp.guides.AutoFactorisedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=1000)

    update = jax.jit(lambda s, X, y: svi.update(s, X, y, batch_size=1000))
    compiled, compile_s = compile_timed(update, state, X, y)

    # Python loop over the compiled step
    state1, loss = compiled(state, X, y)
    jax.block_until_ready(loss)
    loop_rates = []
    for _ in range(repeats):
        s = state1
        t0 = time.perf_counter()
        for _ in range(scan_length):
            s, loss = compiled(s, X, y)
        jax.block_until_ready(loss)
        loop_rates.append(scan_length / (time.perf_counter() - t0))

    # lax.scan over steps (what fit() does)
    @jax.jit
    def run(s, X, y):
        return jax.lax.scan(lambda c, _: svi.update(c, X, y, batch_size=1000), s, None, length=scan_length)

    run_c, scan_compile_s = compile_timed(run, state, X, y)
    s, losses = run_c(state, X, y)
    jax.block_until_ready(losses)
    scan_rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        s, losses = run_c(s, X, y)
        jax.block_until_ready(losses)
        scan_rates.append(scan_length / (time.perf_counter() - t0))
    return {
        "precision": precision,
        "compile_seconds": compile_s,
        "scan_compile_seconds": scan_compile_s,
        "scan_steps_per_second": float(np.median(scan_rates)),
        "loop_steps_per_second": float(np.median(loop_rates)),
        "scan_rates": scan_rates,
        "loop_rates": loop_rates,
        "final_loss_finite": bool(np.all(np.isfinite(np.asarray(losses)))),
    }


def compile_timed(jitted, *args):
    """Ahead-of-time compile ``jitted`` for ``args``: ``(compiled, seconds)``."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scan-length", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--child", choices=["float32", "float64"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.scan_length, args.repeats, args.data_dir)))
        return
    import jax
    import numpy as np

    runs = {"float32": [], "float64": []}
    for r in range(args.rounds):
        for precision in (("float32", "float64") if r % 2 == 0 else ("float64", "float32")):
            cmd = [sys.executable, __file__, "--child", precision, "--scan-length", str(args.scan_length),
                   "--repeats", str(args.repeats)] + (["--data-dir", args.data_dir] if args.data_dir else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ})
            result = json.loads(out.stdout.strip().splitlines()[-1])
            runs[precision].append(result)
            print(f"round {r} {precision}: scan {result['scan_steps_per_second']:.1f} steps/s, "
                  f"loop {result['loop_steps_per_second']:.1f} steps/s, compile {result['compile_seconds']:.2f} s", flush=True)
    command = "python benchmarks/speed.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    record = {
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} (cpu)",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": runs,
    }
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "speed.json").write_text(json.dumps(record, indent=1))
    lines = [
        "# Speed of one DSVI training step (kin8nm configuration)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {record['machine']}; {record['date']}",
        "",
        "2 layers, width 8, M = 100, batch 1000 (subsampled inside the step), 1 sample, DGPElbo, Adam.",
        "Median over rounds (each round: a fresh process, median of repeats); compile excluded from steps/s.",
        "",
        "| precision | steps/s in lax.scan (fit) | steps/s, Python loop | compile of one step (s) | compile of a 50-step scan (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for precision, rs in runs.items():
        lines.append(
            f"| {precision} | {np.median([r['scan_steps_per_second'] for r in rs]):.1f} "
            f"(range {min(r['scan_steps_per_second'] for r in rs):.1f}-{max(r['scan_steps_per_second'] for r in rs):.1f}) | "
            f"{np.median([r['loop_steps_per_second'] for r in rs]):.1f} | "
            f"{np.median([r['compile_seconds'] for r in rs]):.2f} | {np.median([r['scan_compile_seconds'] for r in rs]):.2f} |"
        )
    lines += [
        "",
        "For reference, shared/notes/performance.md measured on this kind of machine (other runs, not this one):",
        "GPflux 0.4.5 44-52 (float64) / 97-140 (float32) steps/s; GPyTorch 21-27 / 39-44; a hand-written jitted JAX",
        "DSVI step 30-44 / 65-88. Only numbers taken in the same run are comparable; that side-by-side run is issue 7.",
        "",
    ]
    (out_dir / "speed.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
