"""Sphinx configuration of the numpyro-dgp documentation.

Build (from the repository root; the README states this command)::

    python -m pip install -e ".[docs]" && python -m sphinx -W -b html docs docs/_build/html

The build needs no network and executes nothing but imports: the API reference comes from
the docstrings (``sphinx.ext.autodoc``), the tutorials are rendered from the outputs committed
in ``tutorials/*.ipynb`` (``myst_nb`` with ``nb_execution_mode = "off"``), there is no
intersphinx inventory to fetch, and MathJax is only loaded by the reader's browser.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version
from pathlib import Path

from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docstrings import prepare_docstring

DOCS_DIR = Path(__file__).resolve().parent
REPO_ROOT = DOCS_DIR.parent

# Document the package of this checkout even where it is not installed.
sys.path.insert(0, str(REPO_ROOT))


# -- Tutorials -------------------------------------------------------------------------------
#
# The notebooks live in ``tutorials/`` beside ``docs/``, and Sphinx only reads documents inside
# its source directory (a toctree entry such as ``../tutorials/01_quickstart`` is rejected).
# So the ``*.ipynb`` files are copied into ``docs/tutorials/`` (git-ignored) whenever this file
# is loaded, i.e. at the start of every build, before Sphinx looks for source files.
#
# Why a copy, and why here:
# * symbolic links would avoid the copy but do not survive every checkout (Windows, some
#   archives), and a ``builder-inited`` hook would run at the same moment in the build while
#   being less obvious to readers of this file;
# * only the notebooks are copied: their jupytext twins (``tutorials/*.py``) and the folder's
#   README are not documents of the site (``exclude_patterns`` also keeps any stray ``.py``
#   out);
# * a notebook is rewritten only when its bytes changed (through a temporary file and an
#   atomic rename, so two builds at once never see half a file), keeping the original's
#   modification time: incremental builds re-read only the notebooks that changed;
# * copies whose notebook no longer exists are deleted, so the site never shows a stale one.
TUTORIALS_SRC = REPO_ROOT / "tutorials"
TUTORIALS_DST = DOCS_DIR / "tutorials"


def _sync_tutorials(src: Path = TUTORIALS_SRC, dst: Path = TUTORIALS_DST) -> list[str]:
    """Mirror ``src/*.ipynb`` into ``dst``; return the notebook names."""
    notebooks = sorted(src.glob("*.ipynb"))
    dst.mkdir(exist_ok=True)
    for notebook in notebooks:
        target = dst / notebook.name
        data = notebook.read_bytes()
        if target.exists() and target.read_bytes() == data:
            continue
        fd, tmp = tempfile.mkstemp(dir=dst, prefix=f".{notebook.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        shutil.copystat(notebook, tmp)
        os.replace(tmp, target)
    wanted = {notebook.name for notebook in notebooks}
    for stale in dst.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()
    return sorted(wanted)


TUTORIAL_NOTEBOOKS = _sync_tutorials()


# -- Project ---------------------------------------------------------------------------------

project = "numpyro-dgp"
author = "the numpyro-dgp authors"
copyright = "the numpyro-dgp authors"
try:
    release = _package_version("numpyro-dgp")
except PackageNotFoundError:  # a checkout that is not installed
    release = "0.1.0"
version = release


# -- General ---------------------------------------------------------------------------------

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "myst_nb",
]

exclude_patterns = [
    "_build",
    "jupyter_execute",
    "**/.ipynb_checkpoints",
    "tutorials/*.py",
    "tutorials/.*.tmp",
    "Thumbs.db",
    ".DS_Store",
]

# the Python domain: show ``numpyro_dgp.guides.AutoFactorizedDGP`` as ``AutoFactorizedDGP``
add_module_names = False


# -- autodoc ---------------------------------------------------------------------------------
#
# ``.. automodule:: ... :members:`` documents exactly the names in the module's ``__all__``
# (in ``__all__`` order with ``"bysource"``). Docstrings are written as Sphinx field lists
# (``:param x:``), so no napoleon.

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"


def _skip_member(app, what, name, obj, skip, options):
    """Leave out the generated field accessors of named tuples ("Alias for field number 0")
    and ``_asdict``-style helpers: the fields are described in each class's docstring."""
    doc = getattr(obj, "__doc__", None) or ""
    if what == "class" and doc.startswith("Alias for field number"):
        return True
    return None


def _data_docstring(app, what, name, obj, options, lines):
    """Give a re-exported constant its ``#:`` comment instead of its type's docstring.

    autodoc reads ``#:`` comments from the source of the module it documents, so a constant
    defined in a private module and re-exported by a public one (``numpyro_dgp.handlers``
    re-exports ``FLOW_ESTIMATORS`` from ``numpyro_dgp.handlers._sde_flow``) would be shown
    with the docstring of ``tuple``. Look the comment up in the package module that defines
    the same object; show no text where there is none.
    """
    if what != "data" or lines != _type_docstring_lines(obj):
        return
    short = name.rpartition(".")[2]
    lines[:] = []
    for modname, module in sorted(sys.modules.items()):
        if not modname.startswith("numpyro_dgp.") or getattr(module, short, None) is not obj:
            continue
        try:
            comment = ModuleAnalyzer.for_module(modname).find_attr_docs().get(("", short))
        except PycodeError:
            continue
        if comment:
            lines.extend(line for line in comment)
            return


def _type_docstring_lines(obj) -> list[str]:
    doc = getattr(type(obj), "__doc__", None)
    return prepare_docstring(doc) if doc else []


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("autodoc-process-docstring", _data_docstring)


# -- MyST and notebooks ----------------------------------------------------------------------

nb_execution_mode = "off"  # render the committed outputs; never run a notebook
nb_merge_streams = True  # one block per cell for consecutive prints
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3


# -- HTML ------------------------------------------------------------------------------------

html_theme = "furo"
html_title = f"numpyro-dgp {release}"
html_show_sourcelink = False
