"""Execute every tutorial notebook in smoke mode (``NUMPYRO_DGP_SMOKE=1``).

Each ``tutorials/*.ipynb`` is copied to a temporary directory and run top to bottom with
nbclient; a cell that raises fails the test. Each notebook must produce at least one PNG
figure. The kernel is the interpreter running pytest (a kernelspec pointing at
``sys.executable`` is put first on ``JUPYTER_PATH``), with the repository root on
``PYTHONPATH`` so an uninstalled checkout works too.
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
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))
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
