"""The package's structure holds: layers import downwards, private code stays private, the
message protocol is read through its accessors (counts from ``tests/structure_counts.py``)."""

import importlib.util
import subprocess
import sys

import pytest

from tests import structure_counts as counts


def test_no_module_imports_from_a_layer_above_its_own():
    assert counts.upward_imports() == []


def test_every_layer_of_the_package_is_placed():
    parts = {counts._part(counts._module(p)) for p in counts.package_files()}
    placed = {part for layer in counts.LAYERS for part in layer}
    assert parts - placed == set()


def test_private_imports_are_few_and_each_has_its_reason():
    found = {(imp.path, imp.module) for imp in counts.private_imports()}
    assert found <= set(counts.ALLOWED_PRIVATE_IMPORTS), found - set(counts.ALLOWED_PRIVATE_IMPORTS)
    assert len(counts.ALLOWED_PRIVATE_IMPORTS) <= 5
    # an allowance nobody uses any more goes too
    assert set(counts.ALLOWED_PRIVATE_IMPORTS) <= found


def test_at_most_five_private_modules_at_the_top_level():
    assert len(counts.private_top_level_modules()) <= 5, counts.private_top_level_modules()


def test_no_module_is_longer_than_650_lines():
    long = {counts._rel(p): n for p in counts.package_files()
            if (n := len(p.read_text().splitlines())) > 650}
    assert not long, f"split these modules by job: {long}"


def test_the_message_protocol_is_read_only_through_its_module():
    assert counts.protocol_literals() == []


def test_no_function_is_longer_than_40_statements():
    assert counts.long_functions() == []


def test_the_counts_see_what_they_count(tmp_path, monkeypatch):
    """Each count fires on a package that breaks its rule (so the tests above can fail)."""
    package = tmp_path / "numpyro_dgp"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("from numpyro_dgp.layers import gp_layer\n")
    (package / "layers.py").write_text("from numpyro_dgp.handlers._base import _helper\n")
    (package / "handlers").mkdir()
    (package / "handlers" / "__init__.py").write_text("")
    (package / "handlers" / "_base.py").write_text('def f(msg):\n    return msg["args"][0], "dgp_layer"\n')
    # 41 statements, a docstring and a wrapped call: only the statements count
    body = "".join(f"    x{i} = {i}\n" for i in range(40))
    (package / "handlers" / "long.py").write_text(
        f'def g():\n    """Doc."""\n{body}    return max(\n        x0,\n        x1,\n    )\n'
        f"def h():\n{body}"
    )
    for i in range(6):
        (package / f"_private{i}.py").write_text("")
    monkeypatch.setattr(counts, "ROOT", tmp_path)
    monkeypatch.setattr(counts, "PACKAGE", package)
    assert sorted((imp.path, part) for imp, _, part in counts.upward_imports()) == [
        ("numpyro_dgp/core/__init__.py", "layers"), ("numpyro_dgp/layers.py", "handlers")]
    assert [imp.module for imp in counts.private_imports()] == ["numpyro_dgp.handlers._base"]
    assert len(counts.private_top_level_modules()) == 6
    assert counts.protocol_literals() == ["numpyro_dgp/handlers/_base.py:2"]
    assert counts.long_functions() == [("numpyro_dgp/handlers/long.py:g", 41)]


def test_the_counting_script_runs():
    out = subprocess.run([sys.executable, str(counts.ROOT / "tests" / "structure_counts.py")], capture_output=True,
                         text=True, check=True).stdout
    assert "private modules at the top level" in out


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_finds_nothing_in_the_package():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "numpyro_dgp"], cwd=counts.ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_the_package_is_formatted():
    # `ruff format numpyro_dgp` rewrites what this finds; the style is pyproject.toml's [tool.ruff]
    result = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "numpyro_dgp"],
                            cwd=counts.ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[test]')")
def test_mypy_finds_nothing_in_the_package(tmp_path):
    # the configuration is pyproject.toml's [tool.mypy]; a fresh cache, so the answer is today's
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy_cache")],
                            cwd=counts.ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
