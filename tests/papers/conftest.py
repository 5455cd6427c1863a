"""The reproductions of published experiments live in ``benchmarks/papers/``, outside the
package; the benchmark scripts import them as ``papers.<module>`` from their own folder, and so
do these tests (the folder is found from this file, whatever the working directory)."""

import sys
from pathlib import Path

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
