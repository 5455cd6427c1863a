"""What the benchmark scripts share: the command line and machine line of a result record, its
Markdown header and tables, the result files, the UCI data option, and a fresh interpreter.

* :func:`command` -- the command line recorded in a result file (``python benchmarks/<script> <argv>``,
  the peers' folder written as ``$NUMPYRO_DGP_PEERS_DIR``);
* :func:`machine` and :func:`now` -- the machine line and the date; :func:`base_record` -- the three
  together, the fields a result record starts with;
* :func:`header` and :func:`table` -- a Markdown report's first lines and its tables;
* :func:`write_results` -- ``results/<stem>.json`` and ``results/<stem>.md``;
* :func:`add_data_dir` -- the ``--data-dir`` option (``$NUMPYRO_DGP_DATA``, else ``../shared/data/uci``);
* :func:`run_fresh` -- a measurement in a fresh interpreter (nothing in JAX's caches).

Only the standard library is imported here, most of it when used: the start-up children of
``startup.py`` import this module before their first mark.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
_BESIDE_REPO = REPO.parent / "shared" / "data" / "uci"
#: environment variables a fresh measurement runs without
DROPPED_ENV = ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS", "JAX_DISABLE_MOST_OPTIMIZATIONS")
DATA_DIR_HELP = ("folder holding the UCI data sets (default: $NUMPYRO_DGP_DATA, else ../shared/data/uci beside the "
                 "repository)")


def default_data_dir() -> str | None:
    """The ``--data-dir`` default: ``$NUMPYRO_DGP_DATA`` or ``../shared/data/uci`` beside the repository."""
    env = os.environ.get("NUMPYRO_DGP_DATA")
    if env:
        return env
    return str(_BESIDE_REPO) if _BESIDE_REPO.is_dir() else None


def add_data_dir(parser) -> None:
    """Add ``--data-dir`` (default :func:`default_data_dir`) to an ``argparse`` parser."""
    parser.add_argument("--data-dir", default=default_data_dir(), help=DATA_DIR_HELP)


def command(script: str, argv: list[str] | None = None) -> str:
    """``python benchmarks/<script> <argv, shell-quoted>`` (``argv`` None: ``sys.argv[1:]``), the
    peers' folder written as ``$NUMPYRO_DGP_PEERS_DIR`` (``benchmarks/peers/setup.sh``) rather
    than this machine's path."""
    import shlex

    args = sys.argv[1:] if argv is None else argv
    peers = os.environ.get("NUMPYRO_DGP_PEERS_DIR", str(Path.home() / ".cache" / "numpyro_dgp_peers"))
    return f"python benchmarks/{script} {shlex.join(args)}".rstrip().replace(peers, "$NUMPYRO_DGP_PEERS_DIR")


def machine(with_jax: bool = True) -> str:
    """``<architecture>, <n> cores, jax <version> (<backend>)``; with ``with_jax=False`` (a parent
    process that leaves JAX to its children) ``<architecture>, <n> cores, <Python> <version>``."""
    import platform

    cores = f"{platform.machine()}, {os.cpu_count()} cores"
    if not with_jax:
        return f"{cores}, {platform.python_implementation()} {platform.python_version()}"
    import jax

    return f"{cores}, jax {jax.__version__} ({jax.default_backend()})"


def now() -> str:
    """The date and time a record is written with, ``YYYY-MM-DD HH:MM:SS``."""
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S")


def base_record(script: str, argv: list[str] | None = None) -> dict:
    """The fields a result record starts with: ``command``, ``machine`` and ``date``."""
    return {"command": command(script, argv), "machine": machine(), "date": now()}


def header(title: str, cmd: str, *parts: str, compact: bool = False) -> list[str]:
    """A report's first lines: ``# title``, then ``Command: `cmd``` and ``Machine:`` with the
    ``parts`` (the machine line, then e.g. the precision, date and settings) joined by ``"; "``;
    ``compact``: the two in one paragraph (a Markdown line break), else two paragraphs."""
    return [f"# {title}", "", f"Command: `{cmd}`" + ("  " if compact else ""), *([] if compact else [""]),
            "Machine: " + "; ".join(parts)]


def table(columns: list[str], rows=()) -> list[str]:
    """A Markdown table's lines: the ``columns``' header, its rule, and one line per row of cells
    (each cell written with ``str``)."""
    return [_row(columns), "|" + " --- |" * len(columns), *(_row(row) for row in rows)]


def _row(cells) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def write_results(stem: str, record: dict | None, markdown: str | None) -> tuple[Path | None, Path | None]:
    """Write ``results/<stem>.json`` (``record``, indented by 2, a final newline) and
    ``results/<stem>.md`` (``markdown`` as it is); a ``None`` is not written. The paths written."""
    RESULTS.mkdir(exist_ok=True)
    json_path = md_path = None
    if record is not None:
        json_path = RESULTS / f"{stem}.json"
        json_path.write_text(json.dumps(record, indent=2) + "\n")
    if markdown is not None:
        md_path = RESULTS / f"{stem}.md"
        md_path.write_text(markdown)
    return json_path, md_path


def run_fresh(code: str, *args: str, what: str, timeout: float = 600, env: dict | None = None) -> dict:
    """Run ``python -c code args...`` with the repository on ``PYTHONPATH`` and without
    :data:`DROPPED_ENV` (which the test suite sets), in ``env`` (default: this process's
    environment); the JSON object it prints as its last line.

    :raises RuntimeError: the process failed (``what`` names it, with the end of its stderr).
    """
    import subprocess

    env = {k: v for k, v in (os.environ if env is None else env).items() if k not in DROPPED_ENV}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
