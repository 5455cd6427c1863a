"""List the library's guards that no test makes fire.

A guard is a ``raise`` statement in ``numpyro_dgp`` (a refused argument, a missing site,
mismatched parameters, a refused combination, a non-finite value). This script runs the test
suite under coverage (pytest-cov: ``pip install pytest-cov``) and prints every ``raise`` that
no test executed, with its message, so that each can be given a test that triggers it (or
removed, if its condition can never be true)::

    python tests/guard_coverage.py            # the default suite, on every core
    python tests/guard_coverage.py --runslow  # further pytest arguments are passed on

Raises inside code that only subprocesses run (the command line's fresh-process tests, the
float32 workers, the notebooks) are not seen by coverage and show up here too: check those
by hand. It exits 0 in any case: the list is a to-do list, not a verdict.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "numpyro_dgp"


def raise_statements(path: Path) -> list[tuple[int, str]]:
    """``(line, message)`` of every ``raise`` with an exception to raise in a module."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            segment = ast.get_source_segment(source, node.exc) or ""
            found.append((node.lineno, " ".join(segment.split())[:140]))
    return sorted(found)


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "coverage.json"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider",
                        f"--cov={PACKAGE}", f"--cov-report=json:{report}", *argv], cwd=ROOT)
        files = json.loads(report.read_text())["files"]
    missed_total = total = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        entry = files.get(str(path)) or files.get(str(path.relative_to(ROOT)))
        executed = set(entry["executed_lines"]) if entry else set()
        raises = raise_statements(path)
        total += len(raises)
        missed = [(line, text) for line, text in raises if line not in executed]
        missed_total += len(missed)
        for line, text in missed:
            print(f"{path.relative_to(ROOT)}:{line}: {text}")
    print(f"{missed_total} of {total} raise statements were not executed by the tests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
