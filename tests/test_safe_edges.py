"""Users' files and answers at every edge: one test per finding of the safe-edges review.

Each test here failed on the code before its fix (the commit that added this file ran against
it); together they hold: nothing is deleted that the library did not write, a resumed fit is the
same fit, no success is reported for a model that cannot be loaded, predictions follow the
model's dtype, ``save_model`` refuses what ``load_model`` would, targets far from standardized
are warned about, and bad input is refused up front, naming the argument.
"""

from __future__ import annotations

import csv
import json
import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp import _validation, cli
from numpyro_dgp.models import deep_gp_regression


@pytest.fixture(autouse=True)
def fresh_scale_warnings():
    """Scale warnings are issued once per problem and process: start each test afresh."""
    _validation._WARNED.clear()
    yield
    _validation._WARNED.clear()


def _write_table(path, n=60, seed=0, target_shift=0.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n) + target_shift
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "y"])
        w.writerows(np.column_stack([X, y]).tolist())
    return X, y


def _fit_args(data, output, *extra):
    return ["fit", str(data), "--target", "y", "--layers", "1", "--num-inducing", "5", "--steps", "5",
            "--batch-size", "1000", "--no-progress", "--output", str(output), *map(str, extra)]


def _snapshot(folder):
    """Every file under ``folder`` with its bytes (the user's files, to check they are untouched)."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _users_folder(tmp_path):
    folder = tmp_path / "results"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "sub" / "figure.png").write_bytes(b"\x89PNG not really")
    return folder


# ---- never delete or overwrite what the library did not write -------------------------------


def test_fit_overwrite_refuses_a_users_folder_and_the_training_table(tmp_path, capsys):
    data = tmp_path / "train.csv"
    _write_table(data)
    folder = _users_folder(tmp_path)
    before = _snapshot(folder)
    assert cli.main(_fit_args(data, folder, "--overwrite")) != 0
    out, err = capsys.readouterr()
    assert err.startswith("numpyro-dgp: error: --output") and "not a model directory" in err
    assert "fitted" not in out  # refused before any training
    assert _snapshot(folder) == before

    table = data.read_bytes()
    assert cli.main(_fit_args(data, data, "--overwrite")) != 0
    out, err = capsys.readouterr()
    assert err.startswith("numpyro-dgp: error: --output") and "input" in err and "fitted" not in out
    assert data.is_file() and data.read_bytes() == table


def test_fit_refuses_an_existing_output_before_training_naming_the_option(tmp_path, capsys):
    data = tmp_path / "train.csv"
    _write_table(data)
    model_dir = tmp_path / "model"
    assert cli.main(_fit_args(data, model_dir)) == 0
    capsys.readouterr()
    assert cli.main(_fit_args(data, model_dir)) != 0
    out, err = capsys.readouterr()
    assert "--overwrite" in err and "overwrite=True" not in err
    assert "fitted" not in out and "DSVI DGP" not in out  # before the plan is even printed
    # and a model directory this library wrote is replaced with --overwrite
    assert cli.main(_fit_args(data, model_dir, "--overwrite")) == 0
    assert dgp.load_model(model_dir).input_dim == 2


def test_save_model_overwrite_replaces_only_a_model_directory(tmp_path):
    X, y = _write_table(tmp_path / "t.csv")
    model = deep_gp_regression(1, num_inducing=4)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = dgp.fit(svi, jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y), num_steps=2,
                     progress_bar=False).params
    folder = _users_folder(tmp_path)
    before = _snapshot(folder)
    with pytest.raises(FileExistsError, match="not a model directory"):
        dgp.save_model(folder, model, guide, params, input_dim=2, overwrite=True)
    assert _snapshot(folder) == before
    with pytest.raises(FileExistsError, match="is a file"):
        dgp.save_model(tmp_path / "t.csv", model, guide, params, input_dim=2, overwrite=True)
    assert (tmp_path / "t.csv").is_file()
    # a model directory with a file of the user's added is not the library's alone either
    dgp.save_model(tmp_path / "m", model, guide, params, input_dim=2)
    (tmp_path / "m" / "README.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="README.txt"):
        dgp.save_model(tmp_path / "m", model, guide, params, input_dim=2, overwrite=True)
    assert (tmp_path / "m" / "README.txt").read_text() == "mine"


def test_predict_refuses_outputs_that_are_inputs_folders_or_existing_files(tmp_path, capsys):
    data = tmp_path / "train.csv"
    _write_table(data)
    model_dir = tmp_path / "model"
    assert cli.main(_fit_args(data, model_dir)) == 0
    capsys.readouterr()
    table = data.read_bytes()
    for output in (data, model_dir, model_dir / "params.npz", tmp_path / "missing" / "p.csv"):
        assert cli.main(["predict", str(model_dir), str(data), "--output", str(output), "--overwrite"]) != 0
        out, err = capsys.readouterr()
        assert err.startswith("numpyro-dgp: error: --output") and "wrote" not in out
    assert data.read_bytes() == table and dgp.load_model(model_dir).input_dim == 2
    mine = tmp_path / "mine.csv"
    mine.write_text("keep me\n")
    assert cli.main(["predict", str(model_dir), str(data), "--output", str(mine)]) != 0
    assert "--overwrite" in capsys.readouterr().err and mine.read_text() == "keep me\n"
    assert cli.main(["predict", str(model_dir), str(data), "--output", str(mine), "--overwrite"]) == 0


# ---- resume only the same fit ------------------------------------------------------------------


def test_resume_refuses_a_checkpoint_of_other_data_naming_what_differs(tmp_path):
    rs = np.random.RandomState(0)
    X, y = jnp.asarray(rs.randn(20, 1)), jnp.asarray(rs.randn(20))
    model = deep_gp_regression(1, num_inducing=4)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    path = tmp_path / "ck.npz"
    first = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=10, checkpoint_path=path, resume=True,
                    progress_bar=False)
    with pytest.raises(ValueError, match=r"args\[1\]"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, -y, num_steps=10, checkpoint_path=path, resume=True,
                progress_bar=False)
    with pytest.raises(ValueError, match=r"args\[0\].*shape"):
        dgp.fit(svi, jax.random.PRNGKey(0), X[:15], y[:15], num_steps=10, checkpoint_path=path,
                resume=True, progress_bar=False)
    other = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), numpyro.infer.Trace_ELBO())
    with pytest.raises(ValueError, match="objective"):
        dgp.fit(other, jax.random.PRNGKey(0), X, y, num_steps=10, checkpoint_path=path, resume=True,
                progress_bar=False)
    # the same fit resumes as before
    again = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=10, checkpoint_path=path, resume=True,
                    progress_bar=False)
    for k in first.params:
        assert np.array_equal(first.params[k], again.params[k])


# ---- no success reported for a broken model ----------------------------------------------------


def test_a_diverged_command_line_fit_fails_and_saves_nothing(tmp_path, capsys):
    data = tmp_path / "train.csv"
    _write_table(data, n=80)
    model_dir = tmp_path / "m"
    args = ["fit", str(data), "--target", "y", "--layers", "2", "--num-inducing", "10", "--steps", "150",
            "--lr", "1000", "--no-progress", "--output", str(model_dir)]
    assert cli.main(args) != 0
    err = capsys.readouterr().err
    assert err.startswith("numpyro-dgp: error: the fit diverged")
    assert "--lr 1000" in err and "step" in err
    assert not model_dir.exists()


# ---- predictions follow the model ----------------------------------------------------------------


def test_a_float64_model_predicts_the_same_at_float32_inputs():
    rs = np.random.RandomState(1)
    X, y = jnp.asarray(rs.randn(40, 1)), jnp.asarray(np.sin(rs.randn(40)))
    model = deep_gp_regression(1, num_inducing=8)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.05), dgp.DGPElbo())
    params = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=50, progress_bar=False).params
    X_new = np.linspace(-2, 2, 7, dtype=np.float32)[:, None]
    at64 = dgp.predict(model, guide, params, jax.random.PRNGKey(1), X_new.astype(np.float64))
    at32 = dgp.predict(model, guide, params, jax.random.PRNGKey(1), X_new)
    assert at32.mean.dtype == jnp.float64
    np.testing.assert_array_equal(at32.mean, at64.mean)
    np.testing.assert_array_equal(at32.variance, at64.variance)


# ---- save_model refuses what load_model would -----------------------------------------------------


@pytest.fixture(scope="module")
def fitted_two_inputs():
    rs = np.random.RandomState(2)
    X, y = jnp.asarray(rs.randn(30, 2)), jnp.asarray(rs.randn(30))
    model = deep_gp_regression(1, num_inducing=4)
    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    return model, guide, dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, progress_bar=False).params


def test_save_model_refuses_an_input_dim_the_parameters_contradict(tmp_path, fitted_two_inputs):
    model, guide, params = fitted_two_inputs
    with pytest.raises(ValueError, match="input_dim"):
        dgp.save_model(tmp_path / "m", model, guide, params, input_dim=3)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "field, value",
    [("x_scale", [0.0, 1.0]), ("x_scale", [np.nan, 1.0]), ("y_scale", -2.0), ("y_mean", np.inf),
     ("x_mean", [0.0])],
)
def test_save_model_refuses_a_bad_standardization(tmp_path, fitted_two_inputs, field, value):
    model, guide, params = fitted_two_inputs
    s = dgp.Standardization(np.zeros(2), np.ones(2), 0.0, 1.0)._replace(**{field: value})
    with pytest.raises(ValueError, match=field):
        dgp.save_model(tmp_path / "m", model, guide, params, input_dim=2, standardization=s)
    assert not (tmp_path / "m").exists()


# ---- targets far from standardized ------------------------------------------------------------------


def _quickstart_model(X, y=None):
    h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=5, out_dim=1, mean="identity")
    noise = numpyro.param("noise", 0.01, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(h[..., 0], jnp.sqrt(noise)), obs=y)


@pytest.mark.parametrize("scale, shift", [(77.0, 150.0), (1.0, 1e6), (1e-4, 0.0)])
def test_a_gaussian_target_far_from_standardized_is_warned_about(scale, shift):
    rs = np.random.RandomState(3)
    X = jnp.asarray(rs.randn(30, 1))
    y = jnp.asarray(shift + scale * rs.randn(30))
    svi = SVI(_quickstart_model, dgp.guides.AutoFactorizedDGP(_quickstart_model), numpyro.optim.Adam(0.01),
              dgp.DGPElbo())
    with pytest.warns(dgp.TargetScaleWarning, match="Standardization"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=1, progress_bar=False)


def test_standardized_targets_and_counts_are_not_warned_about():
    rs = np.random.RandomState(4)
    X = jnp.asarray(rs.randn(30, 1))
    y = jnp.asarray(rs.randn(30))
    svi = SVI(_quickstart_model, dgp.guides.AutoFactorizedDGP(_quickstart_model), numpyro.optim.Adam(0.01),
              dgp.DGPElbo())
    counts = jnp.asarray(rs.poisson(200.0, 30))
    model = deep_gp_regression(1, num_inducing=4, likelihood="poisson")
    counting = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    with warnings.catch_warnings():
        warnings.simplefilter("error", dgp.TargetScaleWarning)
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=1, progress_bar=False)
        dgp.fit(counting, jax.random.PRNGKey(0), X, counts, num_steps=1, progress_bar=False)


# ---- refusals up front, naming the argument ------------------------------------------------------------


def test_fit_refuses_zero_rows_naming_the_argument():
    model = deep_gp_regression(1, num_inducing=2)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    with pytest.raises(ValueError, match=r"fit: args\[0\].*no rows"):
        dgp.fit(svi, jax.random.PRNGKey(0), jnp.zeros((0, 2)), jnp.zeros(0), num_steps=2, progress_bar=False)


def test_predict_refuses_inputs_with_another_number_of_columns_or_no_rows(fitted_two_inputs):
    model, guide, params = fitted_two_inputs
    with pytest.raises(ValueError, match=r"predict: X_new has 3 columns.*2"):
        dgp.predict(model, guide, params, jax.random.PRNGKey(0), jnp.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"predict: X_new has no rows"):
        dgp.predict(model, guide, params, jax.random.PRNGKey(0), jnp.zeros((0, 2)))


def _probit_model(X, y=None):
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=3)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dgp.likelihoods.bernoulli_probit(f[..., 0]), obs=y)


def _counts_model(X, y=None):
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=3)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dgp.likelihoods.poisson(f[..., 0]), obs=y)


@pytest.mark.parametrize("model, labels", [(_probit_model, [-1, 1]), (_counts_model, [-1, 2]),
                                           (_counts_model, [0.5, 2])])
def test_fit_refuses_labels_outside_the_likelihoods_support_before_any_step(model, labels):
    """A model of the user's own (the factories check their labels themselves)."""
    rs = np.random.RandomState(5)
    X = jnp.asarray(rs.randn(20, 1))
    y = jnp.asarray(np.resize(np.asarray(labels, float), 20))
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    with pytest.raises(ValueError, match=r"fit: observed site 'y' \(args\[1\]\).*outside.*support"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, progress_bar=False)


@pytest.mark.parametrize("y_scale", [0.0, -1.0, np.nan, [1.0, 2.0]])
def test_metrics_refuses_a_bad_y_scale(fitted_two_inputs, y_scale):
    model, guide, params = fitted_two_inputs
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(0), jnp.zeros((3, 2)))
    with pytest.raises(ValueError, match="y_scale"):
        dgp.metrics(pred, jnp.zeros(3), y_scale=y_scale)


# ---- what a newcomer tripped over -----------------------------------------------------------------------


def test_fit_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "(default: 5000)" in out and "(default: 0.01)" in out


def test_predictions_carry_the_row_of_the_input_table(tmp_path, capsys):
    data = tmp_path / "train.csv"
    _write_table(data, n=12)
    model_dir, out = tmp_path / "m", tmp_path / "p.csv"
    assert cli.main(_fit_args(data, model_dir)) == 0
    assert cli.main(["predict", str(model_dir), str(data), "--output", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.reader(f))
    assert rows[0][0] == "row" and [r[0] for r in rows[1:]] == [str(i) for i in range(12)]


def test_a_fit_whose_final_parameters_are_not_finite_raises_naming_them():
    rs = np.random.RandomState(6)
    X, y = jnp.asarray(rs.randn(40, 2)), jnp.asarray(rs.randn(40))
    model = deep_gp_regression(2, num_inducing=5)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(1000.0), dgp.DGPElbo())
    with pytest.raises(FloatingPointError, match=r"fit: the fit diverged at step \d+ .*'noise'"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=30, progress_bar=False)


# ---- the suite says what it ran against; one dtype story; an extra for the tutorials ----------------

ROOT = Path(__file__).resolve().parents[1]


def test_the_test_command_installs_the_versions_the_suite_last_passed_with():

    pins = {}
    for line in (ROOT / "tests" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line).groups()
            pins[name.lower().replace("_", "-")] = version
    for name in ("jax", "jaxlib", "numpyro", "numpy", "arviz", "optax", "funsor", "pytest", "scipy"):
        assert name in pins, name
    readme_command = next(line for line in (ROOT / "README.md").read_text().splitlines() if '".[test]"' in line)
    assert "-c tests/constraints.txt" in readme_command and "pytest" in readme_command
    assert "-c tests/constraints.txt" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_quickstart_runs_in_float64_on_standardized_data():
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert 'jax.config.update("jax_enable_x64", True)' in code
    assert "Standardization.fit(" in code and "to_data_units(" in code


def test_an_extra_installs_every_module_the_tutorials_import():
    import ast
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["tutorials"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in declared}
    # papers: the reproductions in the repository's benchmarks/ folder (tutorials 02-04)
    distribution = {"sklearn": "scikit-learn", "numpyro_dgp": None, "papers": None}
    for script in sorted((ROOT / "tutorials").glob("*.py")):
        source = "\n".join(line for line in script.read_text().splitlines() if not line.startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or distribution.get(top, top) is None:
                    continue
                assert distribution.get(top, top).lower() in names, f"{script.name} imports {module}"


# ---- found in review: legitimate uses that must not be refused, and checks that must reach every path ----


def _masked_probit(X, y=None, observed=None):
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=3)
    with numpyro.plate("data", X.shape[0]), numpyro.handlers.mask(mask=observed):
        numpyro.sample("y", dgp.likelihoods.bernoulli_probit(f[..., 0]), obs=y)


def test_masked_out_placeholders_are_not_refused_but_read_labels_are():
    rs = np.random.RandomState(8)
    X = jnp.asarray(rs.randn(20, 1))
    observed = jnp.asarray(np.arange(20) % 4 != 0)
    y = jnp.where(observed, jnp.asarray(rs.randint(0, 2, 20)), -1)  # -1 where no label
    svi = SVI(_masked_probit, dgp.guides.AutoFactorizedDGP(_masked_probit), numpyro.optim.Adam(0.01),
              dgp.DGPElbo())
    assert dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, progress_bar=False,
                   observed=observed).num_skipped == 0
    with pytest.raises(ValueError, match=r"observed site 'y' \(args\[1\]\) holds 1 value\(s\) outside"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y.at[1].set(-1), num_steps=2, progress_bar=False,
                observed=observed)


@pytest.mark.parametrize("as_numpy", [True, False])
def test_a_factory_model_warns_about_its_unstandardized_target_given_as_numpy_or_jax(as_numpy):
    rs = np.random.RandomState(9)
    X, y = rs.randn(30, 1), 100 + 50 * rs.randn(30)
    model = deep_gp_regression(1, num_inducing=3)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    with pytest.warns(dgp.TargetScaleWarning, match=r"target y is far from standardized: mean 9\d\.\d"):
        dgp.fit(svi, jax.random.PRNGKey(0), jnp.asarray(X), y if as_numpy else jnp.asarray(y), num_steps=1,
                progress_bar=False)


def test_metrics_takes_the_y_scale_a_standardization_of_one_column_gives(fitted_two_inputs):
    model, guide, params = fitted_two_inputs
    pred = dgp.predict(model, guide, params, jax.random.PRNGKey(0), jnp.zeros((3, 2)))
    s = dgp.Standardization.fit(np.zeros((3, 2)), np.arange(3.0)[:, None])
    assert np.shape(s.y_scale) == (1,)
    assert dgp.metrics(pred, jnp.zeros(3), y_scale=s.y_scale)["rmse"] == pytest.approx(
        dgp.metrics(pred, jnp.zeros(3), y_scale=float(s.y_scale[0]))["rmse"], rel=1e-12)


def test_an_empty_folder_takes_a_model_and_a_users_folder_is_named_without_overwrite(tmp_path, capsys):
    data = tmp_path / "train.csv"
    _write_table(data)
    (tmp_path / "empty").mkdir()
    assert cli.main(_fit_args(data, tmp_path / "empty")) == 0
    assert dgp.load_model(tmp_path / "empty").input_dim == 2
    folder = _users_folder(tmp_path)
    capsys.readouterr()
    assert cli.main(_fit_args(data, folder)) != 0
    assert "not a model directory written by numpyro_dgp" in capsys.readouterr().err


def test_predict_refuses_a_corrupt_model_json_by_name(tmp_path, capsys):
    data = tmp_path / "train.csv"
    _write_table(data)
    assert cli.main(_fit_args(data, tmp_path / "m")) == 0
    config = json.loads((tmp_path / "m" / "model.json").read_text())
    config["target_name"] = 7
    (tmp_path / "m" / "model.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert cli.main(["predict", str(tmp_path / "m"), str(data), "--output", str(tmp_path / "p.csv")]) == 2
    assert "is corrupted (target_name 7 is not a name" in capsys.readouterr().err


def test_a_numpy_integer_average_from_checkpoints(tmp_path):
    rs = np.random.RandomState(10)
    X, y = jnp.asarray(rs.randn(20, 1)), jnp.asarray(rs.randn(20))
    model = deep_gp_regression(1, num_inducing=3)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    path = tmp_path / "ck.npz"
    first = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=6, average_from=np.int64(2),
                    checkpoint_path=path, progress_bar=False)
    again = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=6, average_from=2, checkpoint_path=path,
                    resume=True, progress_bar=False)
    for name in first.params:
        assert np.array_equal(first.averaged_params[name], again.averaged_params[name])


# ---- every new guard fires ------------------------------------------------------------------------


def test_an_output_folder_that_is_not_writable_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """model_files.check_output_place (as root os.access always allows: the refusal is simulated)."""
    import os

    data = tmp_path / "train.csv"
    _write_table(data)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert cli.main(_fit_args(data, tmp_path / "m")) == 2
    assert "is not writable" in capsys.readouterr().err and not (tmp_path / "m").exists()


@pytest.mark.parametrize("files, named", [({"model.json": '{"format": "mine"}', "params.npz": ""},
                                           "model.json (not written by numpyro_dgp)"),
                                          ({"params.npz": ""}, "params.npz without model.json")])
def test_a_folder_that_only_looks_like_a_model_directory_is_not_replaced(tmp_path, fitted_two_inputs, files, named):
    model, guide, params = fitted_two_inputs
    folder = tmp_path / "look_alike"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    with pytest.raises(FileExistsError, match=re.escape(named)):
        dgp.save_model(folder, model, guide, params, input_dim=2, overwrite=True)
    assert {p.name: p.read_text() for p in folder.iterdir()} == files


def test_a_checkpoint_path_in_a_missing_folder_is_refused(tmp_path):
    model = deep_gp_regression(1, num_inducing=2)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    with pytest.raises(FileNotFoundError, match="checkpoint_path .* the folder .* does not exist"):
        dgp.fit(svi, jax.random.PRNGKey(0), jnp.zeros((4, 1)), jnp.zeros(4), num_steps=1, progress_bar=False,
                checkpoint_path=tmp_path / "missing" / "ck.npz")


def test_resume_refuses_a_checkpoint_without_its_fit_and_names_new_or_changed_arguments(tmp_path):
    from numpyro_dgp.infer._checks import CHECKPOINT_FORMAT

    rs = np.random.RandomState(11)
    X, y = jnp.asarray(rs.randn(12, 1)), jnp.asarray(rs.randn(12))
    model = deep_gp_regression(1, num_inducing=2)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    old = tmp_path / "old.npz"
    dgp.save_params(old, {"leaves": {}}, metadata={"format": CHECKPOINT_FORMAT, "step": 1})
    with pytest.raises(ValueError, match=r"does not record its fit \(written by an older numpyro_dgp\)"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, checkpoint_path=old, resume=True,
                progress_bar=False)
    path = tmp_path / "ck.npz"
    dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, checkpoint_path=path, progress_bar=False)
    with pytest.raises(ValueError, match=r"data\.batch_size= is {'value': 6} here, None in the"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, checkpoint_path=path, resume=True,
                progress_bar=False, batch_size=6)
    other = deep_gp_regression(1, num_inducing=2)
    joint = SVI(other, dgp.guides.AutoJointDGP(other), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    with pytest.raises(ValueError, match="guide is 'AutoJointDGP' here, 'AutoFactorizedDGP' in the"):
        dgp.fit(joint, jax.random.PRNGKey(0), X, y, num_steps=2, checkpoint_path=path, resume=True,
                progress_bar=False)


def test_standardization_targets_of_two_shapes_and_malformed_feature_names_are_refused(tmp_path, fitted_two_inputs,
                                                                                      capsys):
    model, guide, params = fitted_two_inputs
    s = dgp.Standardization(np.zeros(2), np.ones(2), np.zeros(2), np.ones(3))
    with pytest.raises(ValueError, match=r"y_mean and y_scale must be numbers or one per target column"):
        dgp.save_model(tmp_path / "m", model, guide, params, input_dim=2, standardization=s)
    dgp.save_model(tmp_path / "m", model, guide, params, input_dim=2)
    config = json.loads((tmp_path / "m" / "model.json").read_text())
    config["feature_names"] = 5
    (tmp_path / "m" / "model.json").write_text(json.dumps(config))
    with pytest.raises(dgp.ModelFileError, match="feature_names 5 is not a list of names"):
        dgp.load_model(tmp_path / "m")


def test_no_finite_loss_in_the_last_steps_is_a_divergence_at_the_step_it_began():
    from numpyro_dgp.cli._commands import final_loss

    losses = np.concatenate([[3.0, 2.0, 1.0], np.full(100, np.nan)])
    with pytest.raises(FloatingPointError, match=r"diverged at step 4: its loss was not finite from there on"):
        final_loss(losses, 100)
    assert final_loss(np.array([3.0, np.nan, 1.0]), 1) == 2.0


def test_a_site_masked_out_whole_is_not_checked():
    rs = np.random.RandomState(12)
    X = jnp.asarray(rs.randn(12, 1))
    svi = SVI(_masked_probit, dgp.guides.AutoFactorizedDGP(_masked_probit), numpyro.optim.Adam(0.01),
              dgp.DGPElbo())
    dgp.fit(svi, jax.random.PRNGKey(0), X, jnp.full(12, -1), num_steps=1, progress_bar=False, observed=False)
