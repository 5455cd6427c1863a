"""How long ``numpyro-dgp`` takes to answer ``--help`` and its common mistakes, against importing JAX.

``import numpyro_dgp`` loads nothing until a name is used, and the command checks its arguments,
the data directory, the data set, the splits and a table before it imports JAX. So these answers
should cost a fraction of one JAX and NumPyro import, which is what every command that imports
first waits at least. This script measures that, whole processes timed from outside:

* ``help``: ``numpyro-dgp --help``;
* ``uci, no data directory``: ``numpyro-dgp uci --dataset kin8nm`` with ``NUMPYRO_DGP_DATA``
  unset;
* ``uci, unknown data set``: ``--dataset nosuch`` in an existing, empty data directory;
* ``fit, missing table`` and ``predict, missing table``: a CSV path that does not exist;
* the yardstick, ``import JAX and NumPyro``: ``python -c "import jax, numpyro"``.

Each command is run with the interpreter running this script (``python -m numpyro_dgp.cli``),
the repository on ``PYTHONPATH``, and its exit status and message checked (0 for ``--help``,
2 and ``numpyro-dgp: error:`` for a mistake). One warm-up round is not counted; then
``--rounds`` rounds, the commands' order rotating. Per command: the median, min and max wall
seconds, and the median over rounds of its time divided by the yardstick's in the same round.

Writes ``benchmarks/results/cli_latency.json`` and ``.md`` with the command line.

Example (the committed results)::

    python benchmarks/cli_latency.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _harness import DROPPED_ENV, REPO, base_record, header, table, write_results

YARDSTICK = "import JAX and NumPyro"


def commands(folder: Path) -> dict[str, tuple[list[str], int]]:
    """``{name: (argv after the interpreter, expected exit status)}``; ``folder`` is an empty,
    existing directory to point the commands at."""
    cli = ["-m", "numpyro_dgp.cli"]
    return {
        "help": ([*cli, "--help"], 0),
        "uci, no data directory": ([*cli, "uci", "--dataset", "kin8nm"], 2),
        "uci, unknown data set": ([*cli, "uci", "--dataset", "nosuch", "--data-dir", str(folder)], 2),
        "fit, missing table": ([*cli, "fit", str(folder / "none.csv"), "--target", "y", "--output",
                                str(folder / "m")], 2),
        "predict, missing table": ([*cli, "predict", str(folder / "m"), str(folder / "none.csv"), "--output",
                                    str(folder / "p.csv")], 2),
        YARDSTICK: (["-c", "import jax, numpyro"], 0),
    }


def time_command(argv: list[str], expected: int, name: str) -> float:
    """Wall seconds of one run of ``python argv``; checks its exit status and error message."""
    env = {k: v for k, v in os.environ.items() if k not in (*DROPPED_ENV, "NUMPYRO_DGP_DATA")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - start
    if proc.returncode != expected or (expected == 2 and "numpyro-dgp: error:" not in proc.stderr):
        raise RuntimeError(f"{name}: exit status {proc.returncode} (expected {expected}):\n{proc.stderr[-2000:]}")
    return seconds


def summarize(record: dict) -> list[dict]:
    """One row per command: median, min and max seconds, and the median per-round ratio to the
    yardstick."""
    runs = record["runs"]
    rows = []
    for name, seconds in runs.items():
        ratios = [s / y for s, y in zip(seconds, runs[YARDSTICK])]
        rows.append({"command": name, "runs": len(seconds), "median_s": float(np.median(seconds)),
                     "min_s": min(seconds), "max_s": max(seconds), "vs_yardstick": float(np.median(ratios))})
    return rows


def markdown(record: dict) -> str:
    lines = [
        *header("`numpyro-dgp` answering `--help` and common mistakes, against importing JAX", record["command"],
                record["machine"], record["date"], record["settings"], compact=True),
        "",
        "Whole processes timed from outside, each with the interpreter that ran the script and the "
        "repository on `PYTHONPATH`, `NUMPYRO_DGP_DATA` unset. Median (min–max) wall seconds over the rounds; "
        f"ratio: the median over rounds of the command's time over the yardstick's ({YARDSTICK}: "
        "`python -c \"import jax, numpyro\"`) in the same round.",
        "",
        *table(["command", "runs", "wall s", "/ import JAX and NumPyro"],
               [[row["command"], row["runs"], f"{row['median_s']:.3f} ({row['min_s']:.3f}–{row['max_s']:.3f})",
                 f"{row['vs_yardstick']:.3f}"] for row in summarize(record)]),
    ]
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, record: dict) -> None:
    Path(path).write_text(markdown(record))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    with tempfile.TemporaryDirectory() as tmp:
        cases = commands(Path(tmp))
        names = list(cases)
        record = {
            **base_record("cli_latency.py", argv),
            "settings": f"{args.rounds} rounds after 1 warm-up round, the commands' order rotating",
            "runs": {name: [] for name in names},
        }
        for r in range(-1, args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                seconds = time_command(*cases[name], name)
                if r >= 0:
                    record["runs"][name].append(seconds)
            print(f"round {r}" + (" (warm-up)" if r < 0 else ""), file=sys.stderr, flush=True)
    record["summary"] = summarize(record)
    write_results("cli_latency", record, markdown(record))
    return record


if __name__ == "__main__":
    main()
