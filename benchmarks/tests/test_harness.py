"""``benchmarks/_harness.py``: the command line, header, tables and result files every script shares."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import _harness  # noqa: E402


def test_command_quotes_its_arguments_and_names_the_peers_folder(monkeypatch):
    monkeypatch.setenv("NUMPYRO_DGP_PEERS_DIR", "/opt/peers")
    line = _harness.command("digits.py", ["--with-gpflux", "/opt/peers/gpflux/bin/python", "--tag", "a b"])
    assert line == "python benchmarks/digits.py --with-gpflux $NUMPYRO_DGP_PEERS_DIR/gpflux/bin/python --tag 'a b'"
    assert _harness.command("speed.py", []) == "python benchmarks/speed.py"
    monkeypatch.setattr(sys, "argv", ["x.py", "--rounds", "3"])
    assert _harness.command("x.py") == "python benchmarks/x.py --rounds 3"


def test_machine_without_jax_names_the_interpreter():
    line = _harness.machine(with_jax=False)
    assert " cores, " in line and "Python" in line and "jax" not in line


def test_header_and_table():
    assert _harness.header("T", "python benchmarks/x.py", "m", "d", compact=True) == [
        "# T", "", "Command: `python benchmarks/x.py`  ", "Machine: m; d"]
    assert _harness.header("T", "c", "m") == ["# T", "", "Command: `c`", "", "Machine: m"]
    assert _harness.table(["a", "b"], [[1, "x"], [2.5, None]]) == [
        "| a | b |", "| --- | --- |", "| 1 | x |", "| 2.5 | None |"]
    assert _harness.table(["a"]) == ["| a |", "| --- |"]


def test_write_results(tmp_path, monkeypatch):
    monkeypatch.setattr(_harness, "RESULTS", tmp_path / "results")
    json_path, md_path = _harness.write_results("x", {"b": [1, 2]}, "# x\n")
    assert json_path.read_text() == '{\n  "b": [\n    1,\n    2\n  ]\n}\n' and json.loads(json_path.read_text())
    assert md_path.read_text() == "# x\n"
    assert _harness.write_results("y", None, "# y\n") == (None, tmp_path / "results" / "y.md")
    assert not (tmp_path / "results" / "y.json").exists()
