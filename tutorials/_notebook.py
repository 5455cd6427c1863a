"""What the ``make_*.py`` tutorial generators share: collecting cells, building the notebook,
and the ``--execute`` / ``--output`` command line."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent


class NotebookBuilder:
    """Cells in order: ``md(text)`` and ``code(text)`` append one each."""

    def __init__(self):
        self.cells = []

    def md(self, text):
        self.cells.append(new_markdown_cell(text.strip("\n")))

    def code(self, text):
        self.cells.append(new_code_cell(text.strip("\n")))

    def build(self) -> nbformat.NotebookNode:
        nb = new_notebook(cells=list(self.cells))
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        return nb

    def main(self, notebook: Path, description: str, timeout: int = 1200, argv=None):
        """Write ``notebook`` (``--output`` elsewhere); with ``--execute`` run it first (set
        ``NUMPYRO_DGP_SMOKE=1`` for the short settings)."""
        parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--execute", action="store_true", help="execute and save with outputs")
        parser.add_argument("--output", default=str(notebook))
        args = parser.parse_args(argv)
        nb = self.build()
        if args.execute:
            from nbclient import NotebookClient

            # the kernel must import this checkout's package
            root = str(HERE.parent)
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
            t0 = time.perf_counter()
            NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                           resources={"metadata": {"path": str(HERE)}}).execute()
            print(f"executed in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        nbformat.validate(nb)
        nbformat.write(nb, args.output)
        print(f"wrote {args.output} ({os.path.getsize(args.output)} bytes)", file=sys.stderr)
