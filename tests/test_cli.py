"""The numpyro-dgp command line."""

import pytest

from numpyro_dgp import cli
from numpyro_dgp.datasets import default_data_dir


def has_uci():
    try:
        default_data_dir()
        return True
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not has_uci(), reason="UCI data not found")
def test_uci_command_prints_a_table(capsys):
    code = cli.main(["uci", "--dataset", "yacht", "--splits", "0", "--steps", "60", "--num-inducing", "8",
                     "--batch-size", "100"])
    out = capsys.readouterr().out
    assert code == 0
    assert "yacht: 2-layer DSVI DGP" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0"] and float(rows[0][1]) > -10
    assert "mean" in out and "s.e." in out


def test_uci_command_reports_bad_arguments(capsys, tmp_path):
    assert cli.main(["uci", "--dataset", "mnist"]) == 2
    assert "unknown" in capsys.readouterr().err.lower()
    assert cli.main(["uci", "--dataset", "yacht", "--data-dir", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["uci", "--dataset", "yacht", "--steps", "0"])
    if has_uci():
        with pytest.raises(SystemExit, match="splits 0..19"):
            cli.main(["uci", "--dataset", "yacht", "--splits", "25"])
