"""Training speed at the kin8nm configuration: ours, and with ``--with-peers`` GPflux and GPyTorch.

The configuration of the peers' speed measurements (topics/speed.md): 2 layers, hidden width 8, M = 100 k-means
inducing points per layer, ARD RBF (SE) kernels, whitened, identity inner mean, minibatch
1000 drawn inside the compiled step (plate subsampling), 1 Monte Carlo sample with the
analytic Gaussian expectation at the output (DGPElbo), Adam 0.01, jitter 1e-6 / 1e-4.
Every (library, precision) runs in a fresh process; rounds interleave them (reversing the
order every round) so machine drift hits all alike.

Reported per library and precision (median over rounds):
* steady steps/s: ours inside ``lax.scan`` (how :func:`numpyro_dgp.fit` runs) and as a Python
  loop over the jitted update; peers as their own timed blocks; ``block_until_ready`` /
  a host read at the end of each block; compile excluded;
* compile / first step seconds (ours: ``jit(...).lower().compile()`` of one update);
* with ``--budget-seconds B``: a fresh model trained for ``B`` seconds of wall clock
  (compilation included), then test log-likelihood and RMSE in original units
  (100 predictive samples, split 0);
* for ours, the step's FLOP count (XLA's cost analysis) against this machine's measured
  matrix-multiply throughput in the same process: the roofline fraction.

Usage::

    python benchmarks/speed.py --rounds 3                                  # ours only
    python benchmarks/speed.py --rounds 2 --with-peers --budget-seconds 60  # side by side
    python benchmarks/speed.py --rounds 2 --data-parallel 2 --tag dp       # 1 vs 2 host devices

writes ``benchmarks/results/speed.{json,md}``. The peers' environments come from
``benchmarks/peers/setup.sh`` (run automatically by ``--with-peers`` when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _harness import add_data_dir, command, header, machine, now, table, write_results

HERE = Path(__file__).resolve().parent
PEERS = {"gpflux": "gpflux_kin8nm.py", "gpytorch": "gpytorch_kin8nm.py"}
BATCH = 1000


def matmul_throughput(dtype, repeats=20):
    """GFLOP/s of a jitted 2000^3 and an 800x100x1000 matrix product (block_until_ready)."""
    import jax
    import jax.numpy as jnp

    out = {}
    f = jax.jit(lambda a, b: a @ b)
    for name, (m, k, n) in {"2000x2000x2000": (2000, 2000, 2000), "800x100x1000": (800, 100, 1000)}.items():
        a, b = jnp.ones((m, k), dtype), jnp.ones((k, n), dtype)
        f(a, b).block_until_ready()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(repeats):
                c = f(a, b)
            c.block_until_ready()
            best = min(best, (time.perf_counter() - t0) / repeats)
        out[name] = 2 * m * k * n / best / 1e9
    return out


def measure(precision, scan_length=50, repeats=5, data_dir=None, budget_seconds=0.0, devices=1):
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
    guide = dgp.guides.AutoFactorizedDGP(model)
    if devices > 1:  # the minibatch split over `devices` host devices (XLA_FLAGS set by the parent)
        assert len(jax.devices()) == devices, jax.devices()
        model = dgp.handlers.data_parallel(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    state0 = svi.init(jax.random.PRNGKey(0), X, y, batch_size=BATCH)

    update = jax.jit(lambda s, X, y: svi.update(s, X, y, batch_size=BATCH))
    compiled, compile_s = compile_timed(update, state0, X, y)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get("flops", float("nan"))) if cost else float("nan")

    # Python loop over the compiled step
    state1, loss = compiled(state0, X, y)
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
        return jax.lax.scan(lambda c, _: svi.update(c, X, y, batch_size=BATCH), s, None, length=scan_length)

    run_c, scan_compile_s = compile_timed(run, state0, X, y)
    s, losses = run_c(state0, X, y)
    jax.block_until_ready(losses)
    scan_rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        s, losses = run_c(s, X, y)
        jax.block_until_ready(losses)
        scan_rates.append(scan_length / (time.perf_counter() - t0))
    result = {
        "library": "numpyro_dgp" if devices == 1 else f"numpyro_dgp, data_parallel over {devices} devices",
        "devices": devices,
        "version": f"numpyro_dgp {dgp.__version__}, numpyro {numpyro.__version__}, jax {jax.__version__}",
        "precision": precision,
        "compile_seconds": compile_s,
        "scan_compile_seconds": scan_compile_s,
        "steps_per_second": float(np.median(scan_rates)),
        "scan_rates": scan_rates,
        "loop_steps_per_second": float(np.median(loop_rates)),
        "loop_rates": loop_rates,
        "flops_per_step": flops,
        "matmul_gflops": matmul_throughput(dtype),
        "final_loss_finite": bool(np.all(np.isfinite(np.asarray(losses)))),
        "budget_steps": None, "test_ll": None, "test_rmse": None,
    }

    if budget_seconds > 0:
        # A fresh start, charged the scan's compilation as the peers are charged their first step.
        s, steps, elapsed = state0, 0, scan_compile_s
        while elapsed < budget_seconds:
            t0 = time.perf_counter()
            s, losses = run_c(s, X, y)
            jax.block_until_ready(losses)
            elapsed += time.perf_counter() - t0
            steps += scan_length
        params = svi.get_params(s)
        pred = dgp.predict(model, guide, params, jax.random.PRNGKey(1), jnp.asarray(data.X_test, dtype), num_samples=100)
        m = dgp.metrics(pred, jnp.asarray(data.y_test, dtype), y_scale=data.y_std)
        result.update(budget_steps=steps, test_ll=m["log_likelihood"], test_rmse=m["rmse"], budget_elapsed=elapsed)
    return result


def compile_timed(jitted, *args):
    """Ahead-of-time compile ``jitted`` for ``args``: ``(compiled, seconds)``."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - t0


def peers_python(library):
    root = Path(os.environ.get("NUMPYRO_DGP_PEERS_DIR", Path.home() / ".cache" / "numpyro_dgp_peers"))
    return root / library / "bin" / "python"


def run_child(library, precision, args):
    common = ["--data-dir", args.data_dir] if args.data_dir else []
    budget = ["--budget-seconds", str(args.budget_seconds)]
    env = dict(os.environ)
    if library.startswith("numpyro_dgp"):
        devices = int(library.split("x")[1]) if "x" in library else 1
        if devices > 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
        cmd = [sys.executable, __file__, "--child", precision, "--scan-length", str(args.scan_length),
               "--repeats", str(args.repeats), "--devices", str(devices)] + budget + common
    else:
        cmd = [str(peers_python(library)), str(HERE / "peers" / PEERS[library]), "--precision", precision,
               "--timed-steps", str(args.peer_timed_steps), "--repeats", str(args.repeats)] + budget + common
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(values):
    import numpy as np

    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _fmt(value, spec):
    return "–" if value is None else format(value, spec)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scan-length", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peer-timed-steps", type=int, default=100, help="steps per timed block of a peer")
    parser.add_argument("--budget-seconds", type=float, default=0.0, help="wall-clock training budget, then test metrics (0: skip)")
    parser.add_argument("--with-peers", action="store_true", help="also run GPflux and GPyTorch (benchmarks/peers)")
    parser.add_argument("--precisions", default="float32,float64")
    parser.add_argument("--data-parallel", type=int, default=0, metavar="N",
                        help="also run ours with handlers.data_parallel over N host devices (XLA_FLAGS device count)")
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    add_data_dir(parser)
    parser.add_argument("--tag", default="", help="results file suffix: results/speed_<tag>.{json,md}")
    parser.add_argument("--child", choices=["float32", "float64"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.scan_length, args.repeats, args.data_dir, args.budget_seconds, args.devices)))
        return
    libraries = ["numpyro_dgp"] + ([f"numpyro_dgp_x{args.data_parallel}"] if args.data_parallel > 1 else []) + (
        list(PEERS) if args.with_peers else [])
    if args.with_peers and not all(peers_python(lib).exists() for lib in PEERS):
        subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], check=True)
    precisions = args.precisions.split(",")
    jobs = [(lib, p) for p in precisions for lib in libraries]
    runs = {f"{lib}/{p}": [] for lib, p in jobs}
    for r in range(args.rounds):
        for lib, p in (jobs if r % 2 == 0 else jobs[::-1]):
            result = run_child(lib, p, args)
            runs[f"{lib}/{p}"].append(result)
            print(f"round {r} {lib} {p}: {result['steps_per_second']:.1f} steps/s, compile {result['compile_seconds']:.2f} s"
                  + (f", budget {result['budget_steps']} steps -> LL {result['test_ll']:.3f} RMSE {result['test_rmse']:.4f}"
                     if result.get("test_ll") is not None else ""), flush=True)

    record = {"command": command("speed.py", argv), "machine": machine(), "date": now(), "runs": runs}
    stem = f"speed_{args.tag}" if args.tag else "speed"
    write_results(stem, record, markdown(record))
    print(markdown(record))


def markdown(record):
    """The report of a record (its runs by ``library/precision``, in the order of the jobs)."""
    runs = record["runs"]
    jobs = [tuple(key.split("/")) for key in runs]
    precisions = list(dict.fromkeys(p for _, p in jobs))
    libraries = list(dict.fromkeys(lib for lib, _ in jobs))
    rows = []
    for lib, p in jobs:
        rs = runs[f"{lib}/{p}"]
        rate = _median([r["steps_per_second"] for r in rs])
        ref = runs.get(f"gpflux/{p}")
        ratio = rate / _median([r["steps_per_second"] for r in ref]) if ref else None
        rows.append([lib, p, f"{rate:.1f}",
                     f"{min(r['steps_per_second'] for r in rs):.1f}-{max(r['steps_per_second'] for r in rs):.1f}",
                     _fmt(ratio, ".2f"), f"{_median([r['compile_seconds'] for r in rs]):.2f}",
                     _fmt(_median([r.get("budget_steps") for r in rs]), ".0f"),
                     _fmt(_median([r.get("test_ll") for r in rs]), ".3f"),
                     _fmt(_median([r.get("test_rmse") for r in rs]), ".4f")])
    ours = []
    for p in precisions:
        rs = runs[f"numpyro_dgp/{p}"]
        rate = _median([r["steps_per_second"] for r in rs])
        gflop = _median([r["flops_per_step"] for r in rs]) / 1e9
        big = _median([r["matmul_gflops"]["2000x2000x2000"] for r in rs])
        small = _median([r["matmul_gflops"]["800x100x1000"] for r in rs])
        ours.append([p, f"{rate:.1f}", f"{_median([r['loop_steps_per_second'] for r in rs]):.1f}",
                     f"{_median([r['compile_seconds'] for r in rs]):.2f}",
                     f"{_median([r['scan_compile_seconds'] for r in rs]):.2f}", f"{gflop:.3f}",
                     f"{big:.0f}; {small:.0f}",
                     f"{gflop * rate:.1f}", f"{gflop * rate / big:.2f}"])
    with_peers = any(lib in PEERS for lib in libraries)
    lines = [
        *header("Training speed at the kin8nm configuration"
                + (": numpyro-dgp, GPflux and GPyTorch in one run" if with_peers else ""),
                record["command"], record["machine"], record["date"], compact=True),
        "",
        "2 layers, width 8, M = 100, batch 1000 drawn inside the step, 1 sample, analytic expectation at the",
        "output, Adam 0.01 (as GPflux and GPyTorch in benchmarks/peers). Each cell: median over rounds; every run a "
        "fresh",
        "process; rounds interleaved. Steps/s exclude compilation; ours are steps inside `lax.scan` (as `fit`",
        "runs them). Budget columns: a fresh model trained for the stated wall-clock seconds (compilation",
        "included), test LL / RMSE in original units, kin8nm split 0, 100 predictive samples.",
        "",
        *table(["library", "precision", "steps/s", "range", "ratio to GPflux", "compile / first step (s)",
                "steps in budget", "test LL", "test RMSE"], rows),
        "", "## Ours in detail, and the roofline", "",
        *table(["precision", "steps/s in scan", "steps/s, Python loop", "compile of one step (s)",
                "compile of a 50-step scan (s)", "GFLOP per step (XLA)", "matmul GFLOP/s (2000^3; 800x100x1000)",
                "achieved GFLOP/s", "fraction of 2000^3 matmul"], ours),
    ]
    versions = {lib: runs[f"{lib}/{precisions[0]}"][0].get("version") for lib in libraries if lib in PEERS or lib == "numpyro_dgp"}
    threads = {lib: runs[f"{lib}/{precisions[0]}"][0].get("num_threads") for lib in PEERS if lib in libraries}
    lines += ["", "Versions: " + "; ".join(f"{k}: {v}" for k, v in versions.items())]
    if threads:
        lines.append("Peer threads: " + ", ".join(f"{k} {v}" for k, v in threads.items()))
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
