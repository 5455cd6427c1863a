"""XLA's backend optimization level for the training step: compile seconds against step time.

The launch-to-first-step target of ``startup.py`` is dominated by XLA compiling two programs
(model initialization and the training step). The step is compiled at XLA's default backend
optimization level; a lower level compiles faster. This script measures what each level costs
and buys for the kin8nm DSVI step of ``startup.py`` / ``speed.py`` (2 layers, width 8, M = 100
or ``--num-inducing``, batch 1000 drawn inside the step, ``AutoFactorizedDGP`` + ``DGPElbo``,
Adam 0.01, split 0, float64 or ``--precision float32``):

* ``compile_s``: ``lowered.compile(compiler_options={"xla_backend_optimization_level": L})`` of
  a ``lax.scan`` over ``--steps`` SVI updates (the program ``fit`` compiles, less its finite
  checks), lowering excluded;
* ``step_ms``: the scan run ``--repeats`` times from the same state after a warm-up run, the
  fastest run divided by ``--steps`` (``block_until_ready``);
* ``loss``: the last step's loss after ``--steps`` steps from the same initial state, and
  whether it is bit-identical to the default level's.

Each (level, round) runs in a fresh process (no persistent compilation cache); the levels'
order rotates each round. Medians over rounds.

Writes ``benchmarks/results/compile_levels[_<tag>].json`` and ``.md`` with the command line.

Examples (the committed results)::

    python benchmarks/compile_levels.py --rounds 3 --data-dir /path/to/uci
    python benchmarks/compile_levels.py --rounds 3 --levels 1,2 --num-inducing 500 --steps 10 \
        --precision float32 --tag M500_float32 --data-dir /path/to/uci
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from _harness import add_data_dir, base_record, header, run_fresh, table, write_results

LEVELS = (0, 1, 2, 3)
DEFAULT_LEVEL = 2  # XLA's default backend optimization level

_CHILD = r"""
import json, sys, time
import jax
level, steps, repeats, data_dir, num_inducing, precision = (int(sys.argv[1]), int(sys.argv[2]),
    int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
jax.config.update("jax_enable_x64", precision == "float64")
import jax.numpy as jnp
import numpyro
from numpyro.infer import SVI
import numpyro_dgp as dgp

data = dgp.datasets.load_uci("kin8nm", 0, data_dir=data_dir)
X, y = jnp.asarray(data.X_train, precision), jnp.asarray(data.y_train, precision)
model = dgp.models.deep_gp_regression(2, num_inducing=num_inducing, hidden_width=8)
guide = dgp.guides.AutoFactorizedDGP(model)
svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
state = dgp.infer.init(svi, jax.random.PRNGKey(0), X, y, batch_size=1000)

def chunk(state, X, y):
    def body(state, _):
        return svi.update(state, X, y, batch_size=1000)
    return jax.lax.scan(body, state, None, length=steps)

lowered = jax.jit(chunk).lower(state, X, y)
t0 = time.perf_counter()
compiled = lowered.compile(compiler_options={"xla_backend_optimization_level": level})
compile_s = time.perf_counter() - t0
_, losses = jax.block_until_ready(compiled(state, X, y))  # warm-up
runs = []
for _ in range(repeats):
    t0 = time.perf_counter()
    _, losses = jax.block_until_ready(compiled(state, X, y))
    runs.append(time.perf_counter() - t0)
last = float(losses[-1])
print(json.dumps({"compile_s": compile_s, "step_ms": 1e3 * min(runs) / steps, "loss": last,
                  "loss_hex": last.hex()}))
"""


def run_child(level: int, steps: int, repeats: int, data_dir: str, num_inducing: int = 100,
              precision: str = "float64") -> dict:
    """One fresh process at ``level``."""
    return run_fresh(_CHILD, str(level), str(steps), str(repeats), data_dir, str(num_inducing), precision,
                     what=f"level {level}")


def summarize(record: dict) -> list[dict]:
    """Per level: median compile seconds and step milliseconds, both relative to the default
    level's, and whether every run's last loss is bit-identical to the default level's."""
    runs = {int(k): v for k, v in record["runs"].items()}
    reference = {r["loss_hex"] for r in runs.get(DEFAULT_LEVEL, [])}
    base = runs.get(DEFAULT_LEVEL)
    rows = []
    for level in sorted(runs):
        compile_s = float(np.median([r["compile_s"] for r in runs[level]]))
        step_ms = float(np.median([r["step_ms"] for r in runs[level]]))
        row = {"level": level, "runs": len(runs[level]), "compile_s": compile_s,
               "compile_range": [min(r["compile_s"] for r in runs[level]), max(r["compile_s"] for r in runs[level])],
               "step_ms": step_ms,
               "step_range": [min(r["step_ms"] for r in runs[level]), max(r["step_ms"] for r in runs[level])],
               "loss": runs[level][0]["loss"],
               "same_loss_in_every_run": len({r["loss_hex"] for r in runs[level]}) == 1,
               "bit_identical_to_default": bool(reference) and {r["loss_hex"] for r in runs[level]} == reference}
        if base:
            row["compile_vs_default"] = compile_s / float(np.median([r["compile_s"] for r in base]))
            row["step_vs_default"] = step_ms / float(np.median([r["step_ms"] for r in base]))
        rows.append(row)
    return rows


def markdown(record: dict) -> str:
    rows = []
    for row in summarize(record):
        rows.append([row["level"], row["runs"],
                     f"{row['compile_s']:.2f} ({row['compile_range'][0]:.2f}–{row['compile_range'][1]:.2f})",
                     f"{row.get('compile_vs_default', float('nan')):.2f}",
                     f"{row['step_ms']:.1f} ({row['step_range'][0]:.1f}–{row['step_range'][1]:.1f})",
                     f"{row.get('step_vs_default', float('nan')):.2f}", repr(row["loss"]),
                     "yes" if row["bit_identical_to_default"] else "no"])
    lines = [
        *header("XLA backend optimization level of the kin8nm DSVI step: compile time against step time",
                record["command"], record["machine"], record.get("precision", "float64"), record["date"],
                record["settings"], compact=True),
        "",
        "Each run a fresh process (no persistent compilation cache). Compile: the scan over the "
        "steps compiled at the level (lowering excluded); step: the fastest of the timed runs divided by the "
        f"steps. Level {DEFAULT_LEVEL} is XLA's default, at which `fit` compiles. Medians (min–max) over rounds; "
        "last loss: after the steps from the same initial state.",
        "",
        *table(["level", "runs", "compile s", "compile / default", "step ms", "step / default", "last loss",
                "bit-identical to the default level"], rows),
    ]
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, record: dict) -> None:
    Path(path).write_text(markdown(record))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50, help="SVI steps in the compiled scan")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the scan")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="comma-separated levels, 0 to 3")
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--precision", choices=["float32", "float64"], default="float64")
    parser.add_argument("--tag", default=None, help="results file suffix: compile_levels_<tag>")
    add_data_dir(parser)
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x]
    if not levels or any(level not in LEVELS for level in levels):
        parser.error(f"--levels must be a comma-separated subset of {LEVELS}")
    if not args.data_dir:
        parser.error("no UCI data: pass --data-dir or set $NUMPYRO_DGP_DATA")

    record = {
        **base_record("compile_levels.py", argv),
        "precision": args.precision,
        "settings": (f"kin8nm split 0, 2 layers, width 8, M = {args.num_inducing}, batch 1000; "
                     f"{args.steps} steps per scan, "
                     f"{args.repeats} timed runs; {args.rounds} rounds, the levels' order rotating"),
        "runs": {str(level): [] for level in levels},
    }
    for r in range(args.rounds):
        order = levels[r % len(levels):] + levels[:r % len(levels)]
        for level in order:
            result = run_child(level, args.steps, args.repeats, args.data_dir, args.num_inducing, args.precision)
            record["runs"][str(level)].append(result)
            print(f"round {r} level {level}: compile {result['compile_s']:.2f} s, step {result['step_ms']:.2f} ms",
                  file=sys.stderr, flush=True)
    record["summary"] = summarize(record)
    write_results("compile_levels" + (f"_{args.tag}" if args.tag else ""), record, markdown(record))
    return record


if __name__ == "__main__":
    main()
