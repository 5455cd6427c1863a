"""The documentation site builds without warnings and documents every public name.

One Sphinx build per test session (``python -m sphinx -W --keep-going -b html -q docs
<tmp>/html``, the README's command plus ``--keep-going`` so that a failure lists every
warning, not just the first). Nothing is executed: the tutorials are rendered from their
committed outputs (``nb_execution_mode = "off"`` in ``docs/conf.py``). About 10 s.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS_DIR = REPO_ROOT / "docs"

#: every module whose ``__all__`` the API reference documents
DOCUMENTED_MODULES = (
    "numpyro_dgp",
    "numpyro_dgp.kernels",
    "numpyro_dgp.core",
    "numpyro_dgp.layers",
    "numpyro_dgp.posteriors",
    "numpyro_dgp.handlers",
    "numpyro_dgp.guides",
    "numpyro_dgp.objectives",
    "numpyro_dgp.infer",
    "numpyro_dgp.models",
    "numpyro_dgp.likelihoods",
    "numpyro_dgp.sde",
    "numpyro_dgp.io",
    "numpyro_dgp.datasets",
    "numpyro_dgp.diagnostics",
    "numpyro_dgp.plots",
    "numpyro_dgp.recipes",
    "numpyro_dgp.cli",
    "numpyro_dgp.papers.compositional",
    "numpyro_dgp.papers.signflip",
    "numpyro_dgp.papers.diffgp",
    "numpyro_dgp.papers.letters",
    "numpyro_dgp.papers.results",
)


def _require_doc_tools():
    for module in ("sphinx", "myst_nb"):
        try:
            importlib.import_module(module)
        except ImportError:
            pytest.skip(f"{module} is not installed; install the docs extra: pip install -e \".[docs]\"")


@pytest.fixture(scope="module")
def built_docs(tmp_path_factory):
    """Build the site once; return ``(html folder, return code, output, seconds)``."""
    _require_doc_tools()
    out = tmp_path_factory.mktemp("docs") / "html"
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", str(DOCS_DIR), str(out)]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    return out, proc.returncode, proc.stdout + proc.stderr, seconds


def test_docs_build_without_warnings(built_docs):
    _, returncode, output, seconds = built_docs
    print(f"sphinx build: {seconds:.1f} s")
    assert returncode == 0, f"the docs build failed (rc {returncode}, {seconds:.1f} s); warnings and errors:\n{output}"


def _inventory_names(html: Path) -> set[str]:
    """Names of the Python objects in ``objects.inv`` (Sphinx inventory version 2)."""
    raw = (html / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):  # four header lines, then zlib-compressed entries
        header_end = raw.index(b"\n", header_end) + 1
    names = set()
    for line in zlib.decompress(raw[header_end:]).decode("utf-8").splitlines():
        name, _, rest = line.partition(" ")
        if rest.startswith("py:"):
            names.add(name)
    return names


def _resolve(fullname: str):
    parts = fullname.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def test_docs_document_every_public_name(built_docs):
    """Each name in a documented module's ``__all__`` has an entry in the API reference (under
    that module, or under another public module for a name re-exported from it)."""
    html, returncode, output, _ = built_docs
    if not (html / "objects.inv").exists():
        pytest.fail(f"the docs build wrote no objects.inv (rc {returncode}):\n{output}")
    documented = _inventory_names(html)
    by_short_name: dict[str, list[str]] = {}
    for name in documented:
        by_short_name.setdefault(name.rpartition(".")[2], []).append(name)
    missing = []
    for module_name in DOCUMENTED_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, ModuleType) or f"{module_name}.{name}" in documented:
                continue
            if not any(_resolve(other) is obj for other in by_short_name.get(name, [])):
                missing.append(f"{module_name}.{name}")
    assert not missing, (
        "public names missing from the API reference (autodoc skips functions it does not "
        "recognize, e.g. jax.custom_jvp objects, and constants re-exported from a private module: "
        f"add an explicit autofunction/autodata directive in docs/api/ or docs/papers/): {missing}"
    )
