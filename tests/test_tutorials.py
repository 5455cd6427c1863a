"""Execute every tutorial notebook in smoke mode (``NUMPYRO_DGP_SMOKE=1``), and check that
every notebook agrees with its jupytext script. The default suite executes the quickstart;
the others are listed in ``tests/slow_cases.txt`` and run with ``--runslow``.

Each ``tutorials/*.ipynb`` is copied to a temporary directory and run top to bottom with
nbclient; a cell that raises fails the test. Each notebook must produce at least one PNG
figure. The kernel is the interpreter running pytest (a kernelspec pointing at
``sys.executable`` is put first on ``JUPYTER_PATH``), with the repository root on
``PYTHONPATH`` so an uninstalled checkout works too.

Each tutorial is a pair: ``tutorials/0N_name.py`` (jupytext percent script, the source) and
``tutorials/0N_name.ipynb`` (the same cells with outputs). The sync tests (no execution)
check that every script has its notebook and vice versa, that both declare the pairing, and
that their cells (types and sources) are identical, so a notebook edited without its script,
or the other way round, fails. Every ``tutorials/*.py`` whose name does not start with ``_``
is a tutorial script.
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
SCRIPTS = sorted(p for p in TUTORIALS.glob("*.py") if not p.name.startswith("_"))
PAIRED_FORMATS = "ipynb,py:percent"
KERNEL_NAME = "python3"
CELL_TIMEOUT = 600


def _kernelspec_dir(tmp_path: Path) -> Path:
    """A Jupyter data dir whose ``python3`` kernel runs this interpreter."""
    data_dir = tmp_path / "jupyter"
    spec_dir = data_dir / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return data_dir


@pytest.mark.skipif(not NOTEBOOKS, reason="no tutorials/*.ipynb")
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(notebook, tmp_path, monkeypatch):
    work = tmp_path / "run"
    work.mkdir()
    path = work / notebook.name
    shutil.copy(notebook, path)

    # The kernel inherits this process's environment.
    monkeypatch.setenv("NUMPYRO_DGP_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(
        p for p in (str(_kernelspec_dir(tmp_path)), os.environ.get("JUPYTER_PATH")) if p))
    # inline figures even where the environment sets MPLBACKEND (e.g. Agg in CI)
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(work)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError if a cell fails
    elapsed = time.perf_counter() - start
    print(f"{notebook.name}: executed in {elapsed:.1f} s (smoke mode)")

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, [f"{o.ename}: {o.evalue}" for o in errors]
    pngs = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.output_type in ("display_data", "execute_result") and "image/png" in o.get("data", {})
    ]
    assert pngs, f"{notebook.name} produced no PNG figure"
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []) if o.output_type == "stream")
    assert "SMOKE=False" not in printed, "the kernel did not see NUMPYRO_DGP_SMOKE=1"


# --- notebook <-> script sync (fast, nothing is executed) -----------------------------------

def _first_difference(notebook: Path, script: Path):
    """``None`` if both files have the same cells (types and sources), else a message naming
    the notebook and the first differing cell."""
    import difflib

    import jupytext

    nb_cells = jupytext.read(notebook).cells
    py_cells = jupytext.read(script).cells
    rel_nb, rel_py = _rel(notebook), _rel(script)
    for i, (a, b) in enumerate(zip(nb_cells, py_cells)):
        if a.cell_type != b.cell_type:
            return (f"{rel_nb}: cell {i} is a {a.cell_type} cell in the notebook but a "
                    f"{b.cell_type} cell in {rel_py}")
        if a.source != b.source:
            diff = "\n".join(difflib.unified_diff(
                b.source.splitlines(), a.source.splitlines(), rel_py, rel_nb, lineterm="", n=1))
            return (f"{rel_nb}: cell {i} ({a.cell_type}) differs from {rel_py} "
                    f"(edit the script, then `jupytext --sync {rel_py}`):\n{diff}")
    if len(nb_cells) != len(py_cells):
        i = min(len(nb_cells), len(py_cells))
        longer = rel_nb if len(nb_cells) > len(py_cells) else rel_py
        return (f"{rel_nb}: {len(nb_cells)} cells but {rel_py} has {len(py_cells)}; "
                f"cell {i} is only in {longer}")
    return None


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def test_tutorial_scripts_and_notebooks_are_paired():
    pytest.importorskip("jupytext")
    notebooks = {p.stem for p in NOTEBOOKS}
    scripts = {p.stem for p in SCRIPTS}
    assert notebooks or scripts, "no tutorials found"
    assert not scripts - notebooks, [f"tutorials/{s}.py has no tutorials/{s}.ipynb (run `jupytext --sync "
                                     f"tutorials/{s}.py`)" for s in sorted(scripts - notebooks)]
    assert not notebooks - scripts, [f"tutorials/{s}.ipynb has no tutorials/{s}.py (run `jupytext "
                                     f"--set-formats {PAIRED_FORMATS} tutorials/{s}.ipynb`)"
                                     for s in sorted(notebooks - scripts)]


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_tutorial_notebook_matches_script(script):
    jupytext = pytest.importorskip("jupytext")
    notebook = script.with_suffix(".ipynb")
    if not notebook.exists():
        pytest.skip(f"{_rel(notebook)} missing (reported by test_tutorial_scripts_and_notebooks_are_paired)")
    for path in (notebook, script):
        formats = jupytext.read(path).metadata.get("jupytext", {}).get("formats")
        assert formats == PAIRED_FORMATS, (
            f"{_rel(path)} declares jupytext formats {formats!r}, expected {PAIRED_FORMATS!r}")
    difference = _first_difference(notebook, script)
    assert difference is None, difference


def test_sync_check_reports_the_first_differing_cell(tmp_path):
    """The check itself: a notebook whose cell was edited by hand is caught and named."""
    jupytext = pytest.importorskip("jupytext")
    nb = jupytext.reads("# %% [markdown]\n# # Title\n\n# %%\nx = 1\n\n# %%\ny = 2\n", fmt="py:percent")
    script, notebook = tmp_path / "00_check.py", tmp_path / "00_check.ipynb"
    jupytext.write(nb, script, fmt="py:percent")
    nb.cells[2].source = "y = 3"
    jupytext.write(nb, notebook)
    message = _first_difference(notebook, script)
    assert message is not None and "00_check.ipynb: cell 2 (code)" in message and "+y = 3" in message
    nb.cells[2].source = "y = 2"
    jupytext.write(nb, notebook)
    assert _first_difference(notebook, script) is None
    nb.cells.append(nbformat.v4.new_code_cell("z = 3"))
    jupytext.write(nb, notebook)
    assert "cell 3 is only in" in _first_difference(notebook, script)
