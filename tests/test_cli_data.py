"""``numpyro-dgp fit`` / ``predict`` on a user's own table, and read_table."""

import csv
import subprocess
import sys

import numpy as np
import pytest

from numpyro_dgp import cli
from numpyro_dgp.datasets import read_table


def _write_csv(path, n=150, seed=0, extra=None):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 2)) * [10, 0.1] + [100, -3]
    y = 5 * np.sin((X[:, 0] - 100) / 10) + 20 + 0.1 * rng.normal(size=n)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["temp", "speed", "load"] + ([extra[0]] if extra else []))
        for i in range(n):
            w.writerow([X[i, 0], y[i], X[i, 1]] + ([extra[1]] if extra else []))
    return X, y


def _run(*args):
    return subprocess.run([sys.executable, "-m", "numpyro_dgp.cli", *map(str, args)], capture_output=True,
                          text=True)


def test_fit_then_predict_in_fresh_processes(tmp_path):
    data = tmp_path / "train.csv"
    X, y = _write_csv(data)
    model_dir = tmp_path / "model"
    fitted = _run("fit", data, "--target", "speed", "--layers", "2", "--num-inducing", "10", "--steps", "40",
                  "--batch-size", "64", "--test-fraction", "0.2", "--no-progress", "--output", model_dir)
    assert fitted.returncode == 0, fitted.stderr
    assert "120 training, 30 test rows" in fitted.stdout and "held-out: log_likelihood" in fitted.stdout
    assert (model_dir / "model.json").is_file() and (model_dir / "params.npz").is_file()

    new = tmp_path / "new.csv"
    _write_csv(new, n=25, seed=1)
    out = tmp_path / "predictions.csv"
    predicted = _run("predict", model_dir, new, "--output", out, "--quantiles", "0.05,0.5,0.95")
    assert predicted.returncode == 0, predicted.stderr
    assert "against the table's 'speed'" in predicted.stdout
    with open(out) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["row", "mean", "std", "q0.05", "q0.5", "q0.95"] and len(rows) == 26
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(25)]  # the input table's rows, in order
    values = np.array(rows[1:], float)[:, 1:]
    assert np.all(np.isfinite(values)) and np.all(values[:, 1] > 0)
    assert np.all(values[:, 2] < values[:, 3]) and np.all(values[:, 3] < values[:, 4])
    # original units: the targets are about 20 +- 5, the standardized ones near 0
    assert 10 < values[:, 0].mean() < 30

    # the same predictions from a second fresh process (fixed seed)
    again = tmp_path / "again.csv"
    assert _run("predict", model_dir, new, "--output", again, "--quantiles", "0.05,0.5,0.95").returncode == 0
    assert again.read_text() == out.read_text()


def test_fit_refuses_text_columns_naming_them(tmp_path, capsys):
    data = tmp_path / "t.csv"
    _write_csv(data, n=10, extra=("city", "Paris"))
    assert cli.main(["fit", str(data), "--target", "speed", "--output", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "columns that are not numeric: 'city' (line 2: 'Paris')" in err
    assert not (tmp_path / "m").exists()


def test_fit_reports_an_unknown_target_and_too_many_inducing_points(tmp_path, capsys):
    data = tmp_path / "t.csv"
    _write_csv(data, n=30)
    assert cli.main(["fit", str(data), "--target", "nope", "--output", str(tmp_path / "m")]) == 2
    assert "'nope' is not a column" in capsys.readouterr().err
    assert cli.main(["fit", str(data), "--target", "speed", "--num-inducing", "50", "--output",
                     str(tmp_path / "m")]) == 2
    assert "--num-inducing 50 exceeds the 30 points" in capsys.readouterr().err
    assert cli.main(["fit", str(data), "--target", "speed", "--likelihood", "probit", "--output",
                     str(tmp_path / "m")]) == 2
    assert "needs a target of 0s and 1s" in capsys.readouterr().err


def test_fit_refuses_a_test_fraction_that_leaves_under_two_training_rows(tmp_path, capsys):
    data = tmp_path / "t.csv"
    _write_csv(data, n=4)
    assert cli.main(["fit", str(data), "--target", "speed", "--test-fraction", "0.9", "--output",
                     str(tmp_path / "m")]) == 2
    assert "--test-fraction 0.9 leaves 0 training rows of 4" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_fit_probit_on_npz_and_predict(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 2))
    y = (X[:, 0] > 0).astype(np.int64)
    np.savez(tmp_path / "d.npz", X=X, label=y)
    code = cli.main(["fit", str(tmp_path / "d.npz"), "--target", "label", "--likelihood", "probit", "--layers", "1",
                     "--num-inducing", "8", "--steps", "30", "--no-progress", "--output", str(tmp_path / "m")])
    assert code == 0
    assert cli.main(["predict", str(tmp_path / "m"), str(tmp_path / "d.npz"), "--output", str(tmp_path / "p.csv")]) == 0
    out = capsys.readouterr().out
    assert "error_rate" in out
    rows = list(csv.reader(open(tmp_path / "p.csv")))
    assert rows[0] == ["row", "probability", "std"] and len(rows) == 81
    p = np.array(rows[1:], float)[:, 1]
    assert np.all((p >= 0) & (p <= 1))


def test_fit_takes_more_inducing_points_than_a_minibatch_but_not_than_the_training_rows():
    from numpyro_dgp.cli._commands import check_inducing

    rows = "points of the training rows"
    check_inducing(500, 2000, rows)  # --batch-size 256: the layers start from the batch and draws
    check_inducing(30, 30, rows)
    with pytest.raises(ValueError, match="--num-inducing 31 exceeds the 30 points"):
        check_inducing(31, 30, rows)


def test_read_table_formats(tmp_path):
    (tmp_path / "a.csv").write_text("a;b\n1;2\n3;4.5\n")
    t = read_table(tmp_path / "a.csv")
    assert t.columns == ["a", "b"]
    np.testing.assert_array_equal(t.data, [[1, 2], [3, 4.5]])
    np.savez(tmp_path / "c.npz", u=np.arange(3), v=np.ones(3))
    assert read_table(tmp_path / "c.npz").columns == ["u", "v"]
    (tmp_path / "m.csv").write_text("a,b\n1,\n3,4\n")
    with pytest.raises(ValueError, match="not numeric: 'b'"):
        read_table(tmp_path / "m.csv")
    (tmp_path / "n.csv").write_text("a,b\n1,nan\n3,4\n")
    with pytest.raises(ValueError, match=r"NaN or infinite values: \['b'\]"):
        read_table(tmp_path / "n.csv")
    with pytest.raises(FileNotFoundError):
        read_table(tmp_path / "none.csv")


def _write_table(path, columns, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)


def test_fit_softmax_poisson_and_student_t_then_predict(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 2))
    label = np.argmax(np.stack([X[:, 0], X[:, 1], -X[:, 0] - X[:, 1]], 1), 1)
    count = rng.poisson(np.exp(0.5 * X[:, 0]))
    value = np.sin(X[:, 0]) + 0.1 * rng.standard_t(3, size=90)
    _write_table(tmp_path / "d.csv", ["a", "b", "label", "count", "value"],
                 np.column_stack([X, label, count, value]).tolist())
    _write_table(tmp_path / "new.csv", ["a", "b"], X[:4].tolist())
    common = ["--layers", "1", "--num-inducing", "8", "--steps", "30", "--no-progress", "--test-fraction", "0.2"]
    for target, likelihood, header in (("label", "softmax", ["p0", "p1", "p2", "class"]),
                                       ("count", "poisson", ["mean", "std", "q0.025", "q0.975"]),
                                       ("value", "student-t", ["mean", "std", "q0.025", "q0.975"])):
        others = [c for c in ("label", "count", "value") if c != target]
        _write_table(tmp_path / f"{target}.csv", ["a", "b", target],
                     np.column_stack([X, {"label": label, "count": count, "value": value}[target]]).tolist())
        code = cli.main(["fit", str(tmp_path / f"{target}.csv"), "--target", target, "--likelihood", likelihood,
                         *common, "--output", str(tmp_path / target)])
        out = capsys.readouterr().out
        assert code == 0, (likelihood, out)
        assert "held-out: log_likelihood" in out and (("accuracy" in out) == (likelihood == "softmax")), out
        assert others  # the other columns are not in this table
        assert cli.main(["predict", str(tmp_path / target), str(tmp_path / "new.csv"), "--output",
                         str(tmp_path / f"{target}_p.csv")]) == 0
        rows = list(csv.reader(open(tmp_path / f"{target}_p.csv")))
        assert rows[0] == ["row"] + header and len(rows) == 5, (likelihood, rows[0])
        values = np.array(rows[1:], float)[:, 1:]
        assert np.all(np.isfinite(values))
        if likelihood == "softmax":
            np.testing.assert_allclose(values[:, :3].sum(1), 1.0, rtol=1e-9)
            assert set(values[:, 3]) <= {0.0, 1.0, 2.0}
        if likelihood == "poisson":
            assert np.all(values[:, 2:] == np.round(values[:, 2:])) and np.all(values[:, 2] <= values[:, 3])


def test_fit_several_targets_with_missing_cells(tmp_path, capsys):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(80, 2))
    a = np.sin(X[:, 0]) + 0.1 * rng.normal(size=80)
    b = [("" if rng.random() < 0.2 else f"{v}") for v in np.cos(X[:, 1]) + 0.1 * rng.normal(size=80)]
    _write_table(tmp_path / "d.csv", ["x0", "x1", "a", "b"], [[*X[i], a[i], b[i]] for i in range(80)])
    args = ["fit", str(tmp_path / "d.csv"), "--target", "a,b", "--layers", "1", "--num-inducing", "8", "--steps", "30",
            "--no-progress", "--test-fraction", "0.2", "--output", str(tmp_path / "m")]
    assert cli.main(args) == 2
    assert "target column(s) ['b'] have missing values; pass --missing-targets mask" in capsys.readouterr().err
    assert cli.main(args + ["--missing-targets", "mask"]) == 0
    out = capsys.readouterr().out
    assert "target ['a', 'b']" in out and "; a: log_likelihood" in out and "; b: log_likelihood" in out
    _write_table(tmp_path / "new.csv", ["x0", "x1"], X[:3].tolist())
    assert cli.main(["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--output", str(tmp_path / "p.csv"),
                     "--quantiles", "0.5"]) == 0
    rows = list(csv.reader(open(tmp_path / "p.csv")))
    assert rows[0] == ["row", "mean_a", "std_a", "q0.5_a", "mean_b", "std_b", "q0.5_b"] and len(rows) == 4


def test_held_out_rows_without_a_label_are_not_scored(tmp_path, capsys):
    # --missing-targets mask with labels: the held-out scores are those of the labelled rows
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 2))
    label = [("" if i % 4 == 0 else str(int(X[i, 0] > 0))) for i in range(60)]
    _write_table(tmp_path / "d.csv", ["a", "b", "label"], [[*X[i], label[i]] for i in range(60)])
    assert cli.main(["fit", str(tmp_path / "d.csv"), "--target", "label", "--likelihood", "probit", "--layers", "1",
                     "--num-inducing", "6", "--steps", "20", "--no-progress", "--test-fraction", "0.3",
                     "--missing-targets", "mask", "--output", str(tmp_path / "m")]) == 0
    scores = capsys.readouterr().out.split("held-out: ")[1]
    assert "accuracy" in scores and "nan" not in scores, scores


def test_fit_refuses_targets_its_likelihood_cannot_take(tmp_path, capsys):
    rows = [[0.1, 0], [0.2, 1], [0.3, 3], [0.4, 2]]
    _write_table(tmp_path / "d.csv", ["x", "y"], rows)
    base = ["fit", str(tmp_path / "d.csv"), "--target", "y", "--output", str(tmp_path / "m")]
    _write_table(tmp_path / "f.csv", ["x", "y"], [[0.1, 0.5], [0.2, 1.0]])
    assert cli.main(["fit", str(tmp_path / "f.csv"), "--target", "y", "--likelihood", "softmax", "--output",
                     str(tmp_path / "m")]) == 2
    assert "needs class labels 0, 1, ..., C-1" in capsys.readouterr().err
    _write_table(tmp_path / "n.csv", ["x", "y"], [[0.1, -1], [0.2, 2]])
    assert cli.main(["fit", str(tmp_path / "n.csv"), "--target", "y", "--likelihood", "poisson", "--output",
                     str(tmp_path / "m")]) == 2
    assert "needs non-negative integer counts" in capsys.readouterr().err
    _write_table(tmp_path / "one.csv", ["x", "y"], [[0.1, 0], [0.2, 0]])
    assert cli.main(["fit", str(tmp_path / "one.csv"), "--target", "y", "--likelihood", "robust-max", "--output",
                     str(tmp_path / "m")]) == 2
    assert "needs at least two classes" in capsys.readouterr().err
    assert cli.main(base + ["--likelihood", "softmax", "--target", "x,y"]) == 2
    assert "takes one --target column of labels" in capsys.readouterr().err
    _write_table(tmp_path / "b.csv", ["x", "a", "b"], [[0.1, 0, 1], [0.2, 1, 0]])
    assert cli.main(["fit", str(tmp_path / "b.csv"), "--target", "a,b", "--likelihood", "probit", "--output",
                     str(tmp_path / "m")]) == 2
    assert "--likelihood probit takes one --target column of labels, got ['a', 'b']" in capsys.readouterr().err
    assert cli.main(["fit", str(tmp_path / "d.csv"), "--target", "y,y", "--output", str(tmp_path / "m")]) == 2
    assert "names a column twice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["fit", str(tmp_path / "d.csv"), "--target", "y,", "--output", str(tmp_path / "m")])
    assert "must be a column name or comma-separated names" in capsys.readouterr().err


def test_read_table_reads_missing_cells_where_allowed(tmp_path):
    (tmp_path / "m.csv").write_text("a,b\n1,\n3,nan\n5,6\n")
    t = read_table(tmp_path / "m.csv", allow_missing=["b"])
    assert np.isnan(t.data[:2, 1]).all() and t.data[2, 1] == 6
    with pytest.raises(ValueError, match="not numeric: 'b'"):
        read_table(tmp_path / "m.csv", allow_missing=["a"])
    X, Y, names = t.split(["b", "a"])
    assert Y.shape == (3, 2) and names == [] and X.shape == (3, 0)


def test_read_table_refuses_ragged_or_ambiguous_tables(tmp_path):
    (tmp_path / "r.csv").write_text("a,b\n1,2\n3\n")
    with pytest.raises(ValueError, match="line 3 has 1 fields, the header has 2"):
        read_table(tmp_path / "r.csv")
    (tmp_path / "h.csv").write_text("a,a\n1,2\n")
    with pytest.raises(ValueError, match="repeats column names"):
        read_table(tmp_path / "h.csv")
    np.savez(tmp_path / "e.npz")
    with pytest.raises(ValueError, match="holds no arrays"):
        read_table(tmp_path / "e.npz")
    np.savez(tmp_path / "s.npz", u=np.ones(3), v=np.ones(4))
    with pytest.raises(ValueError, match=r"every array must be one column.*\['v'\]"):
        read_table(tmp_path / "s.npz")



@pytest.mark.slow
def test_fit_hidden_width_and_predict_sampling_flags_reach_the_library(tmp_path):
    import jax

    from numpyro_dgp import load_model

    data, out = tmp_path / "t.csv", tmp_path / "p.csv"
    X, _ = _write_csv(data, n=40)
    assert cli.main(["fit", str(data), "--target", "speed", "--layers", "2", "--hidden-width", "3",
                     "--num-inducing", "6", "--steps", "20", "--no-progress", "--output", str(tmp_path / "m")]) == 0
    model = load_model(tmp_path / "m")
    assert model.params["h2.inducing_inputs"].shape == (6, 3)  # the second layer reads 3 hidden outputs
    assert cli.main(["predict", str(tmp_path / "m"), str(data), "--output", str(out), "--num-samples", "7",
                     "--seed", "3", "--batch-size", "9"]) == 0
    expected = model.predict(X, rng_key=jax.random.PRNGKey(3), num_samples=7, batch_size=9)
    rows = list(csv.reader(open(out)))
    assert rows[0][1] == "mean"
    np.testing.assert_array_equal(np.array(rows[1:], float)[:, 1], np.asarray(expected.mean).ravel())
    other = model.predict(X, rng_key=jax.random.PRNGKey(4), num_samples=7, batch_size=9)
    assert not np.array_equal(np.asarray(other.mean), np.asarray(expected.mean))  # the seed matters
