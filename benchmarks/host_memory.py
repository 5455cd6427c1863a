"""Page faults of a per-call step loop on CPU, and allocator settings that reduce them.

A hand-written NumPyro loop (``svi.update`` called once per step; ``SVI.run`` with its progress
bar calls its compiled step the same way) runs the compiled program once per call. XLA's CPU
runtime allocates the program's temporary buffers for every call (the step's
``memory_analysis().temp_size_in_bytes``: 62 MiB at M = 500, width 8, float32), and glibc's
``malloc`` serves a block above its mmap threshold (at most 32 MiB) with a fresh mapping that
``free`` returns to the kernel; the page faults counted here are consistent with every call
touching such memory anew (the kernel zeroes each page at its first touch). ``dgp.fit`` runs
chunks of steps in one program (``lax.scan``), whose buffers are allocated once per chunk.

Per point (precision, M, width; ``scale.py``'s synthetic data with D inputs, N = 10,000, batch
1000, two layers, ``AutoFactorizedDGP`` + ``DGPElbo``, Adam), in fresh processes alternated over
``--rounds`` rounds, two drivers under two allocator settings:

* driver ``loop``: ``jit(svi.update)`` compiled once (closing over the data, as
  ``product_bound.py``'s step does) and called once per step;
* driver ``fit``: ``dgp.fit`` with one chunk of ``--steps`` steps per call;
* settings ``default`` (``GLIBC_TUNABLES`` removed from the environment) and ``tuned``: set to
  ``--tunables`` (default: transparent huge pages for ``malloc``'s memory, no mmap for large
  blocks, freed memory kept in the heap; glibc >= 2.35 for ``hugetlb``).

Each child warms up with one block of ``--steps`` steps, then times three blocks: ms per step,
minor page faults per step and system CPU ms per step (``getrusage``), medians of the blocks.
With ``--with-gpflux``, GPflux's step (``peers/gpflux_scale.py``, its own per-call loop, 30
steps a block as in ``product_bound.py``) under both settings too. The record keeps the glibc
version and the kernel's transparent-huge-page mode (glibc ignores ``hugetlb`` before 2.35, and
the kernel's ``never`` mode ignores it too).

Usage::

    python benchmarks/host_memory.py --points float32:500:8 float32:100:8 --rounds 2 \\
        --with-gpflux $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python --tag host_memory

writes ``benchmarks/results/<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import product_bound
from _harness import command, header, machine, now, run_fresh, table, write_results

TUNABLES = "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967295"
DRIVERS = ("loop", "fit")
SETTINGS = ("default", "tuned")

_CHILD = r"""
import json, os, resource, statistics, sys, time
sys.path.insert(0, sys.argv[7])
M, width, precision, dim, driver, steps = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                           sys.argv[5], int(sys.argv[6]))
import jax
if precision == "float64":
    jax.config.update("jax_enable_x64", True)
import numpy as np, numpyro
from numpyro.infer import SVI
import numpyro_dgp as dgp
import scale

X, y = scale.synthetic(10_000, np.float32 if precision == "float32" else np.float64, dim=dim)
model = dgp.models.deep_gp_regression(2, num_inducing=M, hidden_width=width)
svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=1000)
step = jax.jit(lambda s: svi.update(s, X, y, batch_size=1000)).lower(state).compile()
temp_mib = step.memory_analysis().temp_size_in_bytes / 2**20

def loop(state):
    for _ in range(steps):
        state, loss = step(state)
    jax.block_until_ready(loss)
    return state

def fit(state):
    return dgp.fit(svi, None, X, y, num_steps=steps, chunk_size=steps, progress_bar=False, init_state=state,
                   batch_size=1000).state

run = loop if driver == "loop" else fit
state = run(state)
blocks = []
for _ in range(3):
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    state = run(state)
    seconds, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    blocks.append((seconds / steps * 1e3, (after.ru_minflt - before.ru_minflt) / steps,
                   (after.ru_stime - before.ru_stime) / steps * 1e3))
ms, faults, sys_ms = (statistics.median(column) for column in zip(*blocks))
print(json.dumps({"ms": ms, "faults": faults, "sys_ms": sys_ms, "temp_mb": temp_mib,
                  "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
                  "finite": bool(all(np.isfinite(v).all() for v in jax.tree.leaves(svi.get_params(state))))}))
"""


def system_info() -> dict:
    """The glibc version and the kernel's transparent-huge-page mode (``None`` where unknown)."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        glibc = None
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        thp = None
    return {"glibc": glibc, "transparent_hugepages": thp}


def _system_line(record: dict) -> str:
    if "glibc" not in record:
        return ""
    return f" {record['glibc'] or 'glibc unknown'}; transparent huge pages: `{record['transparent_hugepages']}`."


def parse_point(text: str) -> tuple[str, int, int]:
    """``precision:M:width`` as ``(precision, M, width)``.

    :raises argparse.ArgumentTypeError: naming the malformed point.
    """
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("float32", "float64") or not (parts[1].isdigit() and parts[2].isdigit()):
        raise argparse.ArgumentTypeError(f"--points: expected precision:M:width (e.g. float32:500:8), got {text!r}")
    return parts[0], int(parts[1]), int(parts[2])


def setting_env(setting: str, tunables: str) -> dict[str, str]:
    """The environment a child runs in under ``setting`` (``GLIBC_TUNABLES`` set or removed)."""
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if setting == "tuned":
        env["GLIBC_TUNABLES"] = tunables
    return env


def run_ours(point, dim, driver, setting, steps, tunables) -> dict:
    precision, M, width = point
    return run_fresh(_CHILD, str(M), str(width), precision, str(dim), driver, str(steps),
                     str(Path(__file__).parent), what=f"{driver} {setting} {precision} M={M} width={width}",
                     timeout=1800, env=setting_env(setting, tunables))


def run_gpflux(python, point, dim, setting, tunables) -> float:
    """GPflux's ms per step at ``point`` under ``setting`` (``product_bound.gpflux_ms``)."""
    precision, M, width = point
    return product_bound.gpflux_ms(python, M, width, precision, dim, env=setting_env(setting, tunables))


def summary(runs: list[dict]) -> dict:
    """Per (point, driver or ``gpflux``, setting): medians over the rounds (pure)."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["precision"], r["M"], r["width"], r["driver"], r["setting"]), []).append(r)
    return {key: {field: statistics.median(r[field] for r in group)
                  for field in ("ms", "faults", "sys_ms", "temp_mb") if all(field in r for r in group)}
            for key, group in groups.items()}


def markdown(record: dict) -> str:
    """The report of ``record`` (pure)."""
    medians = summary(record["runs"])
    rows = []
    for precision, M, width in record["points"]:
        for driver in (*DRIVERS, "gpflux"):
            default = medians.get((precision, M, width, driver, "default"))
            tuned = medians.get((precision, M, width, driver, "tuned"))
            if default is None or tuned is None:
                continue

            def cell(row, field, digits):
                return f"{row[field]:.{digits}f}" if field in row else "-"

            rows.append([precision, M, width, driver, cell(default, "temp_mb", 0),
                         cell(default, "ms", 1), cell(tuned, "ms", 1), f"{tuned['ms'] / default['ms']:.3f}",
                         cell(default, "faults", 0), cell(tuned, "faults", 0),
                         cell(default, "sys_ms", 1), cell(tuned, "sys_ms", 1)])
    lines = header("Page faults of a per-call step loop, and allocator settings that reduce them",
                   record["command"], record["machine"], record["date"],
                   f"{record['rounds']} rounds, fresh processes alternated")
    lines += ["", f"`tuned`: `GLIBC_TUNABLES={record['tunables']}`. D = {record['dim']}, N = 10,000, batch 1000; "
              f"{record['steps']} steps a block, medians of three blocks, then of the rounds. `loop`: the compiled "
              "`svi.update` called once per step; `fit`: `dgp.fit`, one chunk of the block's steps per call; "
              "`gpflux`: GPflux's own step loop (`peers/gpflux_scale.py`). Temp MiB: the compiled step's "
              "temporary buffers (`memory_analysis`)." + _system_line(record), "",
              *table(["precision", "M", "width", "driver", "step temp MiB", "ms/step default", "ms/step tuned",
                      "tuned / default", "page faults/step default", "tuned", "system CPU ms/step default", "tuned"],
                     rows)]
    versus = []
    for precision, M, width in record["points"]:
        for setting in SETTINGS:
            gpflux = medians.get((precision, M, width, "gpflux", setting))
            ours = [medians.get((precision, M, width, driver, setting)) for driver in DRIVERS]
            if gpflux is not None and None not in ours:
                versus.append([precision, M, width, setting, f"{gpflux['ms']:.1f}",
                               *(f"{gpflux['ms'] / row['ms']:.2f}" for row in ours)])
    if versus:
        lines += ["", "GPflux's time per step over ours, each under the same setting:", "",
                  *table(["precision", "M", "width", "setting", "GPflux ms/step", "GPflux / ours, loop",
                          "GPflux / ours, fit"], versus)]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=parse_point, nargs="+",
                        default=[("float32", 100, 8), ("float32", 500, 8), ("float32", 1000, 8), ("float64", 500, 8),
                                 ("float32", 500, 32)], help="precision:M:width")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tunables", default=TUNABLES, help="GLIBC_TUNABLES of the tuned setting")
    parser.add_argument("--with-gpflux", metavar="PYTHON", default=None, help="GPflux's venv python (peers/setup.sh)")
    parser.add_argument("--tag", default="host_memory")
    args = parser.parse_args(argv)
    record = {"command": command("host_memory.py", argv), "machine": machine(with_jax=False), "date": now(),
              "points": args.points, "dim": args.dim, "steps": args.steps, "rounds": args.rounds,
              "tunables": args.tunables, **system_info(), "runs": []}
    configs = [(driver, setting) for driver in DRIVERS for setting in SETTINGS]
    for point in args.points:
        precision, M, width = point
        for r in range(args.rounds):
            for driver, setting in configs if r % 2 == 0 else configs[::-1]:
                result = run_ours(point, args.dim, driver, setting, args.steps, args.tunables)
                record["runs"].append({"precision": precision, "M": M, "width": width, "driver": driver,
                                       "setting": setting, "round": r, **result})
                print(json.dumps(record["runs"][-1]), flush=True)
            if args.with_gpflux:
                for setting in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
                    ms = run_gpflux(args.with_gpflux, point, args.dim, setting, args.tunables)
                    record["runs"].append({"precision": precision, "M": M, "width": width, "driver": "gpflux",
                                           "setting": setting, "round": r, "ms": ms})
                    print(json.dumps(record["runs"][-1]), flush=True)
    paths = write_results(args.tag, record, markdown(record))
    print(markdown(record))
    print("wrote", *paths)


if __name__ == "__main__":
    main(sys.argv[1:])
