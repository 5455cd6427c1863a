"""Large-N scaling of DSVI training and prediction on synthetic year-like data (D = 90).

Two parts, each point in a fresh process (so that peak resident memory is the point's own):

* ``--sizes``: per N (float32 unless ``--precision float64``), a 2-layer DGP (M = 100, inner
  width 30, batch 1000) on ``N x 90`` synthetic inputs held on the device:
  initialization seconds (guide set-up, compiled ``svi.init`` with the k-means of the first
  minibatch), compile seconds of the training chunk, steps/s (median over chunks of 100
  steps, compilation excluded), prediction seconds for 100,000 points
  (``predict(..., batch_size=B, keep_layers=False)``, ``B`` from ``--predict-batch``, default
  500, S = 100; a first, one-batch call
  that compiles is timed apart), resident memory once the data are on the device and its
  peak (``VmHWM``, reset after the data were drawn) through training and through prediction,
  against the data's size, and whether every loss and prediction was finite.
* ``--grid``: time per step at N = 10,000 against M (``--grid-m``, default 50 to 1000), the
  inner width (``--grid-widths``, 1, 8, 32), the input dimension (``--grid-dims``, 8 and 90)
  and the precision (``--grid-precisions``), batch 1000; with the FLOP floor of the step
  (:func:`step_flops`) at the matrix-product speed measured in the same process.

Usage::

    python benchmarks/scale.py --sizes 10000 100000 1000000 --grid    # results/scale.{json,md}
    python benchmarks/scale.py --grid --grid-precisions float32 float64 --grid-dims 8 90 \\
        --grid-m 100 500 1000 --grid-widths 8 32 --grid-steps 20 \\
        --with-gpflux $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python --tag scale_grid    # results/scale_grid.md

With ``--with-gpflux PYTHON`` (the GPflux venv of ``benchmarks/peers/setup.sh``), every grid
point also times GPflux (``peers/gpflux_scale.py``, the same model) right after ours;
``--grid-repeats K`` runs each point K times, ours and the peers alternating, and reports the
medians and the ratios paired by run (a single run's ratio moves 10-20% with this machine's
drift). Ours runs on JAX's default device; on a machine with a GPU, ``--with-gpytorch python
--peer-device cuda`` puts GPyTorch there too (GPflux's peer runs on the CPU only). Each point
records the device it ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _harness import RESULTS, command, header, machine, table, write_results

D = 90


def synthetic(N, dtype, seed=0, dim=D):
    """Year-like regression data: 90 standardized features, a smooth nonlinear target.

    Drawn on the device (``jax.random``), so that the process holds the data once (a NumPy
    copy beside the device array would double the peak memory on CPU)."""
    import jax
    import jax.numpy as jnp

    kx, kw, ke = jax.random.split(jax.random.PRNGKey(seed), 3)
    X = jax.random.normal(kx, (N, dim), dtype)
    W = jax.random.normal(kw, (dim, 3), dtype) / jnp.sqrt(dim).astype(dtype)
    proj = X @ W
    y = jnp.sin(2 * proj[:, 0]) + 0.5 * proj[:, 1] * proj[:, 2] + 0.1 * jax.random.normal(ke, (N,), dtype)
    return X, (y - y.mean()) / y.std()


def _status_mb(field):
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status`` (Linux), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss():
    """Reset the peak resident memory (``VmHWM``) to the current one (Linux >= 4.0), so that the
    peak of what follows is measured without the data generation's temporaries."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_mb():
    return _status_mb("VmHWM")


def run_size(N, precision, steps, num_inducing=100, width=30, batch=1000, predict_points=100_000,
             predict_batch=500, num_samples=100):
    import jax

    if precision == "float64":
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp

    dtype = np.float32 if precision == "float32" else np.float64
    t0 = time.perf_counter()
    X, y = jax.block_until_ready(synthetic(N, dtype))
    data_seconds = time.perf_counter() - t0
    data_mb = (X.nbytes + y.nbytes) / 2**20
    import gc

    gc.collect()
    reset_peak_rss()
    rss_with_data = _status_mb("VmRSS")
    model = dgp.models.deep_gp_regression(2, num_inducing=num_inducing, hidden_width=width)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    kwargs = {"batch_size": batch}
    t0 = time.perf_counter()
    state = dgp.infer.init(svi, jax.random.PRNGKey(0), X, y, **kwargs)
    jax.block_until_ready(state)
    init_seconds = time.perf_counter() - t0
    result = dgp.fit(svi, None, X, y, num_steps=steps, chunk_size=100, progress_bar=False, init_state=state,
                     batch_size=batch)
    train_rss = peak_rss_mb()
    X_pred = X[:predict_points] if N >= predict_points else jnp.concatenate([X] * (predict_points // N + 1))[
        :predict_points]
    times = []
    for points in (predict_batch, predict_points):  # the first call compiles (one batch)
        t0 = time.perf_counter()
        pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), X_pred[:points],
                           batch_size=predict_batch, num_samples=num_samples, keep_layers=False)
        jax.block_until_ready(pred.mean)
        times.append(time.perf_counter() - t0)
    finite = bool(np.all(np.isfinite(result.losses))) and bool(jnp.all(jnp.isfinite(pred.mean))) and bool(
        jnp.all(jnp.isfinite(pred.variance)))
    return {"N": N, "precision": precision, "D": D, "M": num_inducing, "width": width, "batch_size": batch,
            "data_seconds": data_seconds, "data_mb": data_mb, "init_seconds": init_seconds,
            "compile_seconds": result.compile_seconds, "steps": steps, "steps_per_second": 1 / result.seconds_per_step,
            "predict_points": predict_points, "predict_batch": predict_batch, "num_samples": num_samples,
            "predict_compile_seconds": times[0], "predict_seconds": times[1],
            "rss_mb_with_data": rss_with_data, "peak_rss_mb_training": train_rss, "peak_rss_mb": peak_rss_mb(), "all_finite": finite, "num_skipped": int(result.num_skipped),
            "final_loss": float(np.mean(result.losses[-100:]))}


def step_flops(M, width, dim, batch=1000):
    """FLOPs of one training step that the math cannot avoid (the roofline's floor).

    Per layer (``D`` inputs, ``P`` outputs, ``M`` inducing points, batch ``B``), forward and
    backward (the backward pass of a product is two products of the same size):
    ``K(Z, X)`` and ``K(Z, Z)``: ``2 M (B + M) D``, x 3; the factorization ``K(Z, Z) = L L^T``, ``M^3 / 3``, and
    its derivative, at least three triangular products of ``M^3 / 3``; ``A = L^{-1} K(Z, X)``
    (triangular): ``M^2 B``, x 3; the mean ``2 P M B``, x 3; the variance ``diag(A^T S_p A)``
    with ``S_p = R_p R_p^T``, ``R_p`` triangular: ``P M^2 B``, x 3. Elementwise work, the
    KL term (``O(P M^2)``) and the optimizer are left out.
    """
    total = 0.0
    for d, p in ((dim, width), (width, 1)):
        total += 3 * 2 * M * (batch + M) * d + M**3 / 3 + M**3 + 3 * M**2 * batch + 3 * 2 * p * M * batch
        total += 3 * p * M**2 * batch
    return total


def matmul_peak(precision, size=2000):
    """GFLOP/s of a ``size``-cubed matrix product in this process: the best of three medians of
    five (single timings drift by up to 2x on this kind of machine)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((size, size), jnp.float64 if precision == "float64" else jnp.float32)
    product = jax.jit(lambda a: a @ a)
    product(x).block_until_ready()
    medians = []
    for _ in range(3):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            product(x).block_until_ready()
            times.append(time.perf_counter() - t0)
        medians.append(sorted(times)[2])
    return 2 * size**3 / min(medians) / 1e9


def run_grid_point(M, width, precision, dim=D, steps=30, N=10_000, batch=1000):
    import jax

    if precision == "float64":
        jax.config.update("jax_enable_x64", True)
    import numpy as np
    import numpyro
    from numpyro.infer import SVI

    import numpyro_dgp as dgp

    dtype = np.float32 if precision == "float32" else np.float64
    X, y = synthetic(N, dtype, dim=dim)
    model = dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=width)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    t0 = time.perf_counter()
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=3 * steps, chunk_size=steps, progress_bar=False,
                     batch_size=batch)
    total = time.perf_counter() - t0
    return {"N": N, "D": dim, "M": M, "width": width, "batch_size": batch, "precision": precision,
            "ms_per_step": 1e3 * result.seconds_per_step, "compile_seconds": result.compile_seconds,
            "first_step_seconds": total - (3 * steps - 1) * result.seconds_per_step,
            "floor_gflop": step_flops(M, width, dim, batch) / 1e9, "matmul_gflops": matmul_peak(precision),
            "device": device_name(), "jax": jax.__version__, "all_finite": bool(np.all(np.isfinite(result.losses)))}


def device_name():
    """What JAX runs on: ``<n>-core CPU``, or the accelerator's kind (e.g. ``NVIDIA H200``)."""
    import os

    import jax

    device = jax.devices()[0]
    return f"{os.cpu_count()}-core CPU" if device.platform == "cpu" else device.device_kind


def child(argv):
    kind = argv[0]
    if kind == "size":
        out = run_size(int(argv[1]), argv[2], int(argv[3]), predict_batch=int(argv[4]))
    else:
        out = run_grid_point(int(argv[1]), int(argv[2]), argv[3], dim=int(argv[4]), steps=int(argv[5]))
    print(json.dumps(out))


def in_fresh_process(*args):
    proc = subprocess.run([sys.executable, __file__, "--child", *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown(results):
    lines = [*header("Large N, and the step against M, width and D (synthetic data)", results.get("command", ""),
                     results["machine"]), ""]
    if results.get("sizes"):
        lines += ["2 layers, M = 100, inner width 30, batch 1000, data on the device; prediction of 100,000 points "
                  f"with S = 100 in batches of {results['sizes'][0]['predict_batch']:,} (the one-batch call that compiles is timed apart). RSS: the "
                  "process's resident memory once the data are on the device (imports and data included), then "
                  "its peak (VmHWM, reset after the data were drawn) through training, and through prediction.", "",
                  *table(["N", "precision", "data MB", "init s", "compile s", "steps/s", "predict 1e5 s",
                          "predict compile s", "RSS MB with data", "peak RSS MB training / prediction", "finite"],
                         [[f"{r['N']:,}", r["precision"], f"{r['data_mb']:.0f}", f"{r['init_seconds']:.2f}",
                           f"{r['compile_seconds']:.1f}", f"{r['steps_per_second']:.1f}", f"{r['predict_seconds']:.1f}",
                           f"{r['predict_compile_seconds']:.1f}", f"{r['rss_mb_with_data']:.0f}",
                           f"{r['peak_rss_mb_training']:.0f} / {r['peak_rss_mb']:.0f}", r["all_finite"]]
                          for r in results["sizes"]]),
                  ""]
    if results.get("grid"):
        lines += _grid_lines(results["grid"])
    return "\n".join(lines)


def grid_point(M, width, precision, dim, steps, peers, peer_device="cpu", repeats=1):
    """One grid point, ``repeats`` times (ours, then each peer, then ours again...), combined
    by :func:`combine_runs`."""
    return combine_runs([_grid_run(M, width, precision, dim, steps, peers, peer_device) for _ in range(repeats)])


def combine_runs(runs):
    """One grid point from its repeats: the median of each time and of the matrix-product peak,
    the times themselves (``*_ms_per_step_runs``) and each peer's ratios paired by repeat
    (``*_ratios``: the machine's drift moves both sides of a pair alike, so the table's ratio is
    their median, not the ratio of the medians)."""
    if len(runs) == 1:
        return runs[0]
    point = {**runs[0], "repeats": len(runs), "all_finite": all(r["all_finite"] for r in runs)}
    for key in runs[0]:
        if key.endswith(("ms_per_step", "compile_seconds", "first_step_seconds")) or key == "matmul_gflops":
            values = [r[key] for r in runs]
            point[key] = statistics.median(values)
            if key.endswith("ms_per_step"):
                point[f"{key}_runs"] = values
    for library in ("gpflux", "gpytorch"):
        if f"{library}_ms_per_step" in runs[0]:
            point[f"{library}_ratios"] = [r[f"{library}_ms_per_step"] / r["ms_per_step"] for r in runs]
    return point


def peer_ratio(r, library):
    """A peer's time over ours at a grid point: the median of the paired ratios where it was
    repeated."""
    if f"{library}_ratios" in r:
        return statistics.median(r[f"{library}_ratios"])
    return r[f"{library}_ms_per_step"] / r["ms_per_step"]


def _grid_run(M, width, precision, dim, steps, peers, peer_device):
    """Ours at one grid point in a fresh process, then each peer's same model right after
    (``peers``: library name -> its venv's python, for the Ms it runs at; GPyTorch on
    ``peer_device``)."""
    r = in_fresh_process("grid", M, width, precision, dim, steps)
    print(json.dumps(r), flush=True)
    for library, (python, ms) in peers.items():
        if python is None or (ms is not None and M not in ms):
            continue
        peer = subprocess.run([python, str(Path(__file__).parent / "peers" / f"{library}_scale.py"),
                               "--num-inducing", str(M), "--width", str(width), "--precision", precision,
                               "--dim", str(dim), "--steps", str(steps),
                               *(["--device", peer_device] if library == "gpytorch" else [])],
                              capture_output=True, text=True)
        if peer.returncode != 0:
            raise RuntimeError(f"{library} M={M} width={width} D={dim} failed:\n{peer.stderr[-3000:]}")
        g = json.loads(peer.stdout.strip().splitlines()[-1])
        print(json.dumps(g), flush=True)
        r[f"{library}_ms_per_step"], r[f"{library}_compile_seconds"] = g["ms_per_step"], g["compile_seconds"]
        r[f"{library}_version"] = g["version"] + (f" on {g['device']}" if g.get("device", "cpu") != "cpu" else "")
    return r


def _grid_lines(grid):
    peers = any("gpflux_ms_per_step" in r for r in grid)
    gpytorch = any("gpytorch_ms_per_step" in r for r in grid)
    columns = ["precision", "D", "M", "width", "ms/step", "compile s", "first step s", "peak GFLOP/s", "floor ms",
               "achieved GFLOP/s", "roofline %"]
    repeated = any(r.get("repeats", 1) > 1 for r in grid)
    columns += ["GPflux ms/step", "GPflux first step s", "GPflux / ours",
                *(["range (runs)"] if repeated else []), "meets"] if peers else []
    columns += ["GPyTorch ms/step", "GPyTorch / ours"] if gpytorch else []
    rows = []
    for r in grid:
        floor_ms = r["floor_gflop"] / r["matmul_gflops"] * 1e3
        row = [r["precision"], r.get("D", D), r["M"], r["width"], f"{r['ms_per_step']:.1f}",
               f"{r['compile_seconds']:.1f}", f"{r['first_step_seconds']:.1f}", f"{r['matmul_gflops']:.0f}",
               f"{floor_ms:.1f}", f"{r['floor_gflop'] / r['ms_per_step'] * 1e3:.1f}",
               f"{100 * floor_ms / r['ms_per_step']:.0f}"]
        if peers:
            ratio = peer_ratio(r, "gpflux")
            twice_below_floor = r["gpflux_ms_per_step"] / 2 < floor_ms
            meets = "2x" if ratio >= 2 else ("65%" if twice_below_floor and floor_ms / r["ms_per_step"] >= 0.65 else "-")
            row += [f"{r['gpflux_ms_per_step']:.1f}", f"{r['gpflux_compile_seconds']:.1f}", f"{ratio:.2f}", meets]
            if repeated:
                ratios = r.get("gpflux_ratios", [ratio])
                row.insert(-1, f"{min(ratios):.2f}-{max(ratios):.2f} ({len(ratios)})")
        if gpytorch:
            row += ([f"{r['gpytorch_ms_per_step']:.1f}", f"{peer_ratio(r, 'gpytorch'):.2f}"]
                    if "gpytorch_ms_per_step" in r else ["-", "-"])
        rows.append(row)
    return ["Time per step, N = 10,000 synthetic points, batch 1000, 2 layers" + (
            f" (GPflux: {grid[0].get('gpflux_version')}, run right after ours at each point)" if peers else "")
            + (" (GPyTorch: " + next(r["gpytorch_version"] for r in grid if "gpytorch_version" in r)
               + ", after GPflux where given)" if gpytorch else "")
            + (f". Ours on {grid[0]['device']} (jax {grid[0]['jax']})" if "device" in grid[0] else "")
            + (". Where a point was repeated (`--grid-repeats`, ours and the peers alternating), each time "
               "is the median of the runs and each ratio the median of the ratios paired by run, with "
               "their range" if repeated else "")
            + ". Peak: the matrix-product speed measured in our process at that point (2000^3, best of three "
            "medians of five); floor: the FLOPs the math needs (`step_flops` in the script) at that speed; "
            "achieved: those FLOPs over our time; roofline: achieved / peak. "
            "Meets: `2x` where ours is at least twice GPflux's steps/s, `65%` where 2x GPflux would be "
            "below the floor and ours reaches 65% of the peak, `-` neither. First step: the peers' whole "
            "first step (GPflux traces and compiles its `tf.function` there; GPyTorch is eager).", "",
            *table(columns, rows), ""]


def plot_grid(grid, path):
    """Log-log ms/step against M: ours (solid), GPflux (dashed), GPyTorch (crosses) and the FLOP
    floor (dotted), one colour per width, one panel per precision and input dimension."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    precisions = sorted({r["precision"] for r in grid})
    dims = sorted({r["D"] for r in grid})
    fig, axes = plt.subplots(len(precisions), len(dims), figsize=(5 * len(dims), 4 * len(precisions)),
                             squeeze=False, sharex=True)
    colours = dict(zip(sorted({r["width"] for r in grid}), ["tab:blue", "tab:orange", "tab:green", "tab:red"]))
    for (i, precision), (j, dim) in ((a, b) for a in enumerate(precisions) for b in enumerate(dims)):
        ax = axes[i][j]
        if not any((r["precision"], r["D"]) == (precision, dim) for r in grid):
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"{precision}, D = {dim}: not run yet\n(scale.py --grid --resume)", ha="center",
                    va="center", transform=ax.transAxes)
            continue
        for width, colour in colours.items():
            rows = sorted((r for r in grid if (r["precision"], r["D"], r["width"]) == (precision, dim, width)),
                          key=lambda r: r["M"])
            Ms = [r["M"] for r in rows]
            ax.plot(Ms, [r["ms_per_step"] for r in rows], "-o", color=colour, label=f"ours, width {width}")
            if any("gpflux_ms_per_step" in r for r in rows):
                ax.plot(Ms, [r.get("gpflux_ms_per_step", float("nan")) for r in rows], "--s", color=colour,
                        label=f"GPflux, width {width}", markerfacecolor="none")
            torch_rows = [r for r in rows if "gpytorch_ms_per_step" in r]
            if torch_rows:
                ax.plot([r["M"] for r in torch_rows], [r["gpytorch_ms_per_step"] for r in torch_rows], "x",
                        color=colour, markersize=9, label=f"GPyTorch, width {width}")
            # a marker too: a grid of one M draws no line
            ax.plot(Ms, [r["floor_gflop"] / r["matmul_gflops"] * 1e3 for r in rows], ":_", color=colour,
                    markersize=12, label=f"FLOP floor, width {width}")
        ax.set(xscale="log", yscale="log", title=f"{precision}, D = {dim}", xlabel="inducing points M",
               ylabel="ms per training step")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    narrow = len(dims) == 1  # one column: the legend in two columns, the title on two lines
    fig.legend(handles, labels, loc="lower center", ncol=2 if narrow else 4, fontsize=8)
    fig.suptitle("DSVI training step (2 layers, batch 1000, N = 10,000)" + ("\n" if narrow else " ")
                 + f"on {grid[0].get('device', 'a 2-core CPU')}")
    fig.tight_layout(rect=(0, 0.14 if narrow else 0.1, 1, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _grid_steps(M, width, dim):
    """Steps per timed chunk: about 1.5 s at 40 GFLOP/s of the floor's FLOPs, 5 to 50."""
    return int(min(50, max(5, 60e9 / step_flops(M, width, dim))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[])
    parser.add_argument("--grid", action="store_true")
    parser.add_argument("--precision", choices=("float32", "float64"), default="float32")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--predict-batch", type=int, default=500,
                        help="--sizes: points per prediction batch (bounds the prediction's memory)")
    parser.add_argument("--grid-m", type=int, nargs="+", default=[50, 100, 200, 500, 1000])
    parser.add_argument("--grid-widths", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--grid-dims", type=int, nargs="+", default=[8, 90])
    parser.add_argument("--grid-precisions", nargs="+", choices=("float32", "float64"), default=None,
                        help="--grid: precisions (default: --precision)")
    parser.add_argument("--grid-steps", type=int, default=None,
                        help="--grid: steps per timed chunk (3 chunks; default: about 1.5 s of work at the floor's "
                             "FLOPs, 5 to 50 steps)")
    parser.add_argument("--tag", default="scale")
    parser.add_argument("--with-gpflux", metavar="PYTHON", default=None,
                        help="the GPflux venv's python (benchmarks/peers/setup.sh): time GPflux at every grid point, "
                             "right after ours")
    parser.add_argument("--with-gpytorch", metavar="PYTHON", default=None,
                        help="the GPyTorch venv's python: time GPyTorch at the grid points with M in --gpytorch-m")
    parser.add_argument("--gpytorch-m", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--grid-repeats", type=int, default=1,
                        help="--grid: runs of each point, ours and the peers alternating (medians; paired ratios)")
    parser.add_argument("--peer-device", default="cpu",
                        help="the PyTorch device GPyTorch runs on (cpu, cuda); ours runs on JAX's default device")
    parser.add_argument("--resume", action="store_true",
                        help="--grid: keep every point already in results/TAG.json and run this grid's missing ones")
    parser.add_argument("--plot-only", action="store_true",
                        help="re-render results/TAG.md and TAG.png from results/TAG.json without running")
    args = parser.parse_args(argv)
    if args.plot_only:
        results = json.loads((RESULTS / f"{args.tag}.json").read_text())
        write_results(args.tag, None, markdown(results))
        plot_grid(results["grid"], RESULTS / f"{args.tag}.png")
        return
    RESULTS.mkdir(exist_ok=True)
    # JAX is the children's (each point a fresh process): the parent does not import it
    results = {"command": command("scale.py", argv), "machine": machine(with_jax=False), "sizes": [], "grid": []}
    for N in args.sizes:
        r = in_fresh_process("size", N, args.precision, args.steps, args.predict_batch)
        print(json.dumps(r), flush=True)
        results["sizes"].append(r)
    done = {}
    if args.resume and (RESULTS / f"{args.tag}.json").is_file():
        previous = json.loads((RESULTS / f"{args.tag}.json").read_text())
        done = {(r["precision"], r["D"], r["M"], r["width"]): r for r in previous.get("grid", [])}
        # every earlier point stays (a resumed run may name a part of the grid); both commands are kept
        results["grid"] = list(previous.get("grid", []))
        results["command"] = f"{previous.get('command', '')} ; resumed by: {results['command']}"
    if args.grid:
        for precision in args.grid_precisions or [args.precision]:
            for dim in args.grid_dims:
                for M in args.grid_m:
                    for width in args.grid_widths:
                        if (precision, dim, M, width) in done:
                            continue
                        steps = args.grid_steps or _grid_steps(M, width, dim)
                        peers = {"gpflux": (args.with_gpflux, None), "gpytorch": (args.with_gpytorch, args.gpytorch_m)}
                        results["grid"].append(grid_point(M, width, precision, dim, steps, peers, args.peer_device,
                                                          args.grid_repeats))
                        # written after every point: a long grid's finished points survive an interruption
                        write_results(args.tag, results, None)
    write_results(args.tag, results, markdown(results))
    if results["grid"]:
        plot_grid(results["grid"], RESULTS / f"{args.tag}.png")
    print(markdown(results))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
