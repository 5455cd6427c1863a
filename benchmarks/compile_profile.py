"""Where the compile time of one DSVI training step goes: XLA's passes and LLVM, by source.

The step of ``scale.py --grid`` (2 layers, ``AutoFactorizedDGP`` + ``DGPElbo``, Adam, batch
1000 of N = 10,000 synthetic points with D inputs) at any ``--num-inducing`` and
``--hidden-width`` is lowered and compiled once in a fresh process with XLA's CPU compiler
timers on (``TF_CPP_VMODULE=cpu_compiler=1,ir_compiler=1``). From its log:

* ``compile s``: ``lowered.compile()``, wall clock; ``HLO passes s``: XLA's optimization passes;
* ``LLVM s``: the CPU time LLVM spent on the step's kernels (XLA compiles them on several
  threads, so this can exceed the wall clock), and how many kernels;
* the kernels' LLVM time grouped by the JAX operation each came from (the ``op_name`` XLA
  keeps in the optimized program), largest first.

Writes ``results/compile_profile_<precision>_M<M>_W<width>_D<D>.md`` and ``.json``.

Usage::

    python benchmarks/compile_profile.py --precision float32 --num-inducing 500
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import DROPPED_ENV, REPO, command, header, machine, now, table, write_results

_CHILD = r"""
import json, sys, time
import numpy as np
import jax, jax.numpy as jnp, numpyro
from numpyro.infer import SVI
import numpyro_dgp as dgp
from numpyro_dgp.models import deep_gp_regression

precision, hlo_path = sys.argv[1], sys.argv[5]
M, width, D = map(int, sys.argv[2:5])
if precision == "float64":
    jax.config.update("jax_enable_x64", True)
dtype = jnp.float64 if precision == "float64" else jnp.float32
rs = np.random.RandomState(0)
X = rs.rand(10_000, D)
y = np.sin(3.0 * X.sum(1)) + 0.1 * rs.randn(10_000)
X, y = jnp.asarray(X, dtype), jnp.asarray(y, dtype)
model = deep_gp_regression(2, num_inducing=M, hidden_width=width)
svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
state = svi.init(jax.random.PRNGKey(0), X, y, batch_size=1000)
print("STEP COMPILE STARTS", file=sys.stderr, flush=True)
start = time.perf_counter()
lowered = jax.jit(lambda s, X, y: svi.update(s, X, y, batch_size=1000)).lower(state, X, y)
lowered_at = time.perf_counter()
compiled = lowered.compile()
done = time.perf_counter()
hlo = compiled.as_text()
open(hlo_path, "w").write(hlo)
print(json.dumps({"lower_s": lowered_at - start, "compile_s": done - lowered_at,
                  "stablehlo_ops": lowered.as_text().count(" = "), "hlo_lines": hlo.count("\n")}))
"""

_TIME = re.compile(r"time: [^(]*\((\d+) us\)")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--precision", choices=["float32", "float64"], default="float32")
    parser.add_argument("--num-inducing", type=int, default=500)
    parser.add_argument("--hidden-width", type=int, default=8)
    parser.add_argument("--input-dim", type=int, default=8)
    parser.add_argument("--top", type=int, default=20, help="sources listed")
    parser.add_argument("--tag", default=None, help="result stem (default: from the configuration)")
    args = parser.parse_args(argv)
    config = (args.precision, args.num_inducing, args.hidden_width, args.input_dim)
    with tempfile.TemporaryDirectory() as tmp:
        hlo_path = Path(tmp) / "step.hlo"
        run, log = _compile_logged(config, hlo_path)
        hlo = hlo_path.read_text()
    kernels = _kernel_times(log, hlo)
    run |= {
        "hlo_passes_s": _timer(log, "Running HLO passes"),
        "llvm_s": sum(t for t, _ in kernels) / 1e6,
        "kernels": len(kernels),
    }
    by_source = _by_source(kernels)
    record = {
        "command": command("compile_profile.py", argv),
        "machine": machine(with_jax=False),
        "date": now(),
        "config": dict(zip(("precision", "M", "width", "D"), config)),
        "run": run,
        "llvm_by_source": by_source,
    }
    stem = args.tag or "compile_profile_{}_M{}_W{}_D{}".format(*config)
    write_results(stem, record, _markdown(record, args.top))
    print(_markdown(record, args.top))


def _compile_logged(config, hlo_path: Path) -> tuple[dict, str]:
    """Compile the step in a fresh process with XLA's timers on: its JSON line and the log of
    the step's compilation (everything after the child's marker)."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env |= {
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "cpu_compiler=1,ir_compiler=1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *map(str, config), str(hlo_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the step's compilation failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr.split(
        "STEP COMPILE STARTS", 1
    )[-1]


def _timer(log: str, label: str) -> float:
    """Seconds of XLA's scoped timer ``label`` (its last report)."""
    times = [
        int(m.group(1)) for line in log.splitlines() if label in line and (m := _TIME.search(line))
    ]
    return times[-1] / 1e6 if times else float("nan")


def _kernel_times(log: str, hlo: str) -> list[tuple[int, str]]:
    """``(microseconds, source)`` of each kernel LLVM compiled; the source is the ``op_name`` of
    the instruction the kernel is named after, without its parameters."""
    sources = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]*)\"", line)
        if m:
            sources[m.group(1)] = re.sub(r"\[.*?\]", "", m.group(2))
    kernels = []
    for line in log.splitlines():
        m = re.search(r"Compiled LLVM module: (\S+) " + _TIME.pattern, line)
        if m:
            name = re.sub(r"^(__compute_module_)+", "", m.group(1))
            name = name.replace("_kernel_module", "").replace("_elemental", "")
            kernels.append(
                (
                    int(m.group(2)),
                    sources.get(name, "(no op_name: " + re.sub(r"\.\d+$", "", name) + ")"),
                )
            )
    return kernels


def _by_source(kernels) -> list[dict]:
    total, count = collections.Counter(), collections.Counter()
    for micros, source in kernels:
        total[source] += micros
        count[source] += 1
    return [{"source": s, "llvm_s": t / 1e6, "kernels": count[s]} for s, t in total.most_common()]


def _markdown(record: dict, top: int) -> str:
    c, r = record["config"], record["run"]
    lines = header(
        f"Compile time of the DSVI step, {c['precision']}, M = {c['M']}, width {c['width']}, "
        f"D = {c['D']}",
        record["command"],
        record["machine"],
        record["date"],
    ) + [
        "",
        f"Lowering {r['lower_s']:.2f} s ({r['stablehlo_ops']} StableHLO operations); "
        f"`compile()` {r['compile_s']:.2f} s wall clock, of which XLA's HLO passes "
        f"{r['hlo_passes_s']:.2f} s; LLVM {r['llvm_s']:.2f} s of CPU time over {r['kernels']} "
        "kernels (compiled on several threads). "
        "The kernels' LLVM time by the JAX operation they came from:",
        "",
    ]
    rows = [
        (s["source"].replace("|", "/"), f"{s['llvm_s']:.2f}", s["kernels"])
        for s in record["llvm_by_source"][:top]
    ]
    return "\n".join(lines + table(["source (op_name)", "LLVM s", "kernels"], rows)) + "\n"


if __name__ == "__main__":
    main()
