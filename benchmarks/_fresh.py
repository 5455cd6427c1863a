"""A measurement in a fresh interpreter: nothing in JAX's caches, no persistent compilation cache.

``run_fresh(code, *args)`` runs ``python -c code args...`` with the repository on
``PYTHONPATH`` and without the settings that would change what is measured
(``JAX_COMPILATION_CACHE_DIR``, ``XLA_FLAGS``, ``JAX_DISABLE_MOST_OPTIMIZATIONS``, which the
test suite sets), and returns the JSON object the code prints as its last line;
``base_record(script, argv)`` starts a result record (command line, machine, date) and
``header_lines(title, record)`` starts its Markdown table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: environment variables a fresh measurement runs without
DROPPED_ENV = ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS", "JAX_DISABLE_MOST_OPTIMIZATIONS")


def run_fresh(code: str, *args: str, what: str, timeout: float = 600) -> dict:
    """Run ``code`` with ``args`` in a fresh interpreter; its last printed line, parsed as JSON.

    :raises RuntimeError: the process failed (``what`` names it, with the end of its stderr).
    """
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def base_record(script: str, argv: list[str] | None) -> dict:
    """The fields every result record of these scripts starts with: the command line as run
    (``argv``, default ``sys.argv[1:]``), the machine with JAX's version and backend, the date."""
    import platform
    import shlex
    import time

    import jax

    args = argv if argv is not None else sys.argv[1:]
    return {
        "command": (f"python benchmarks/{script} " + " ".join(shlex.quote(a) for a in args)).rstrip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} ({jax.default_backend()})",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def header_lines(title: str, record: dict, precision: str | None = "float64") -> list[str]:
    """The first lines of a Markdown report: ``title``, then the command and the machine line of
    a record from :func:`base_record` with its ``settings`` field (and ``precision`` unless None)."""
    machine = [record["machine"], *([precision] if precision else []), record["date"], record["settings"]]
    return [
        f"# {title}",
        "",
        f"Command: `{record['command']}`  ",
        "Machine: " + "; ".join(machine),
    ]
