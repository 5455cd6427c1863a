"""The numpyro-dgp command line."""

import os
import subprocess
import sys

import pytest

from numpyro_dgp import cli


def test_uci_command_prints_a_table(capsys, uci_data_dir):
    code = cli.main(["uci", "--dataset", "yacht", "--splits", "0", "--steps", "60", "--num-inducing", "8",
                     "--batch-size", "100", "--data-dir", str(uci_data_dir)])
    out = capsys.readouterr().out
    assert code == 0
    assert "yacht: 2-layer DSVI DGP" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0"] and float(rows[0][1]) > -10
    assert "mean" in out and "s.e." in out


def test_uci_command_reports_bad_arguments(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("NUMPYRO_DGP_DATA", raising=False)
    assert cli.main(["uci", "--dataset", "mnist", "--data-dir", str(tmp_path)]) == 2
    assert "name='mnist' not found" in capsys.readouterr().err
    assert cli.main(["uci", "--dataset", "yacht"]) == 2
    assert "--data-dir" in capsys.readouterr().err
    assert cli.main(["uci", "--dataset", "yacht", "--data-dir", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["uci", "--dataset", "yacht", "--steps", "0"])


def test_uci_command_reports_splits_out_of_range(uci_data_dir):
    with pytest.raises(SystemExit, match="splits 0..19"):
        cli.main(["uci", "--dataset", "yacht", "--splits", "25", "--data-dir", str(uci_data_dir)])


def test_the_commands_keep_compiled_programs_in_the_user_s_cache_folder(tmp_path):
    """Without JAX_COMPILATION_CACHE_DIR the commands cache JAX's programs under
    $XDG_CACHE_HOME/numpyro_dgp/jax (a second run compiles nothing); with it, that folder."""
    code = ("import jax; from numpyro_dgp.cli import _commands; _commands.setup_jax(True); "
            "print(jax.config.jax_compilation_cache_dir)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "numpyro_dgp" / "jax")
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "mine")
