"""Every public entry point against every kind of bad input (docs/bad_input.md).

Each cell of the table below is one test: the entry point given input of one category either
answers rightly (the outcome says what it does instead, e.g. integers cast) or refuses with an
error that names the argument, before any work: a refusal runs with the fit's initialization,
the predictor and the model loading replaced by a function that fails the test if reached
(:func:`no_work`), and refused writes leave every file as it was. ``python -m
tests.test_entry_points`` prints the table that docs/bad_input.md shows (a test compares them).
"""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp import cli
from numpyro_dgp._saved_model import load_model  # dgp.load_model fails under no_work
from numpyro_dgp.io import save_params  # dgp.io.save_params fails under no_work
from numpyro_dgp.models import deep_gp_regression

ROOT = Path(__file__).resolve().parents[1]

ENTRY_POINTS = ["fit", "predict", "predict_from_samples", "metrics", "save_model", "load_model",
                "SavedModel.predict", "numpyro-dgp fit", "numpyro-dgp predict"]
CATEGORIES = ["empty", "wrong shape", "wrong columns", "dtype", "non-finite", "outside support",
              "clobbering path", "path is an input", "changed data on resume", "extreme learning rate"]

#: ``{(entry point, category): (outcome, short, check)}``; a cell not here does not apply
CASES: dict[tuple[str, str], tuple[str, str, Callable]] = {}


def case(entry: str, category: str, outcome: str, short: str | None = None):
    """Register ``check(env, capsys)`` as the cell ``(entry, category)``. ``outcome`` says what
    the entry point does; one that starts with "refused" runs under :func:`no_work`. ``short``
    is the cell of the overview (default: "refused" or "answers")."""
    assert entry in ENTRY_POINTS and category in CATEGORIES and (entry, category) not in CASES
    short = short or ("refused" if outcome.startswith("refused") else "answers")

    def register(check):
        CASES[(entry, category)] = (outcome, short, check)
        return check

    return register


# ---- the environment the cells share ------------------------------------------------------------


def _table(path: Path, rows, header=("a", "b", "y")) -> Path:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([list(header), *rows])
    return path


class Env:
    """A fitted 1-layer model on 2 inputs, its saved directory, a training table and a folder of
    the user's (built once per module)."""

    def __init__(self, root: Path):
        rs = np.random.RandomState(0)
        self.root = root
        self.X = jnp.asarray(rs.randn(24, 2))
        self.y = jnp.asarray(np.sin(2 * self.X[:, 0]) + 0.1 * rs.randn(24))
        self.model = deep_gp_regression(1, num_inducing=4)
        self.guide = dgp.guides.AutoFactorizedDGP(self.model)
        self.svi = SVI(self.model, self.guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
        self.checkpoint = root / "fit.ckpt"
        self.params = dgp.fit(self.svi, jax.random.PRNGKey(0), self.X, self.y, num_steps=5,
                              checkpoint_path=self.checkpoint, progress_bar=False).params
        self.standardization = dgp.Standardization.fit(np.asarray(self.X), np.asarray(self.y))
        self.model_dir = dgp.save_model(root / "model", self.model, self.guide, self.params, input_dim=2,
                                        standardization=self.standardization, feature_names=["a", "b"],
                                        target_name="y")
        self.saved = dgp.load_model(self.model_dir)
        self.table = _table(root / "train.csv", np.column_stack([self.X, self.y]).tolist())
        self.samples = {"h1.u": self.guide.sample_posterior(jax.random.PRNGKey(1), self.params,
                                                            sample_shape=(3,))["h1.u"]}
        self.prediction = dgp.predict(self.model, self.guide, self.params, jax.random.PRNGKey(2), self.X[:5])

    def users_folder(self, name: str) -> Path:
        folder = self.root / name
        (folder / "sub").mkdir(parents=True, exist_ok=True)
        (folder / "notes.txt").write_text("mine\n")
        return folder


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_cli(args, capsys) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def refused_by_cli(args, capsys, pattern: str, code: int = 2) -> None:
    got, out, err = run_cli(args, capsys)
    assert got == code, (got, out, err)
    assert err.startswith("numpyro-dgp: error: ") and pattern in err, err


FIT_CLI = ["fit", "--target", "y", "--layers", "1", "--num-inducing", "4", "--steps", "3", "--no-progress"]


# ---- fit ------------------------------------------------------------------------------------------


@case("fit", "empty", "refused: `fit: args[0] has no rows`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"fit: args\[0\] has no rows"):
        dgp.fit(env.svi, jax.random.PRNGKey(0), env.X[:0], env.y[:0], num_steps=2, progress_bar=False)


@case("fit", "wrong shape", "refused: `y must have shape (24,) (or (24, 1))`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"y must have shape \(24,\) \(or \(24, 1\)\)"):
        dgp.fit(env.svi, jax.random.PRNGKey(0), env.X, jnp.stack([env.y, env.y], 1), num_steps=2,
                progress_bar=False)


@case("fit", "dtype", "integers cast to the default float (the fit runs); complex refused: `X must be a real`",
      "answers (integers), refused (complex)")
def _(env, capsys):
    X_int = jnp.round(env.X * 3).astype(jnp.int32)
    assert dgp.fit(env.svi, jax.random.PRNGKey(0), X_int, env.y, num_steps=2, progress_bar=False).num_skipped == 0
    with pytest.raises(TypeError, match="X must be a real"):
        dgp.fit(env.svi, jax.random.PRNGKey(0), env.X.astype(jnp.complex64), env.y, num_steps=2,
                progress_bar=False)


@case("fit", "non-finite", "refused: `fit: model argument args[0] contains NaN or inf values`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"fit: model argument args\[0\] contains NaN or inf"):
        dgp.fit(env.svi, jax.random.PRNGKey(0), env.X.at[3, 1].set(jnp.nan), env.y, num_steps=2,
                progress_bar=False)


def _probit_model(X, y=None):
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=3)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dgp.likelihoods.bernoulli_probit(f[..., 0]), obs=y)


@case("fit", "outside support",
      "refused: `fit: observed site 'y' (args[1]) holds 24 value(s) outside the support of its BernoulliProbs`")
def _(env, capsys):
    svi = SVI(_probit_model, dgp.guides.AutoFactorizedDGP(_probit_model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
    labels = jnp.asarray(np.resize([-1.0, 2.0], 24))
    with pytest.raises(ValueError, match=r"fit: observed site 'y' \(args\[1\]\) holds 24 value\(s\) outside"):
        dgp.fit(svi, jax.random.PRNGKey(0), env.X, labels, num_steps=2, progress_bar=False)


@case("fit", "clobbering path", "refused: `checkpoint_path ... exists and is not a fit checkpoint`, or `is a folder`")
def _(env, capsys):
    mine = env.root / "mine.npz"
    mine.write_bytes(b"my data")
    folder = env.users_folder("fit_folder")
    before = snapshot(folder)
    for path, pattern in ((mine, "exists and is not a fit checkpoint"), (folder, "is a folder")):
        with pytest.raises(FileExistsError, match=pattern):
            dgp.fit(env.svi, jax.random.PRNGKey(0), env.X, env.y, num_steps=2, checkpoint_path=path,
                    progress_bar=False)
    assert mine.read_bytes() == b"my data" and snapshot(folder) == before


@case("fit", "changed data on resume", "refused: `... was written by another fit: data.args[1].sha256 is ...`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"written by another fit: data\.args\[1\]\.sha256 is '[0-9a-f]+' here, '[0-9a-f]+' in the"):
        dgp.fit(env.svi, jax.random.PRNGKey(0), env.X, -env.y, num_steps=5, checkpoint_path=env.checkpoint,
                resume=True, progress_bar=False)


@case("fit", "extreme learning rate",
      "1000: raises `fit: the fit diverged at step 2 ...: the final parameters [...] are not finite`; 1e-12: "
      "answers (parameters unchanged to 1e-9)", "error (1000), answers (1e-12)")
def _(env, capsys):
    rs = np.random.RandomState(6)
    X, y = jnp.asarray(rs.randn(40, 2)), jnp.asarray(rs.randn(40))
    model = deep_gp_regression(2, num_inducing=5)
    svi = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(1000.0), dgp.DGPElbo())
    with pytest.raises(FloatingPointError, match=r"fit: the fit diverged at step \d+ .*are not finite"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=30, progress_bar=False)
    slow = SVI(env.model, dgp.guides.AutoFactorizedDGP(env.model), numpyro.optim.Adam(1e-12), dgp.DGPElbo())
    start = dgp.fit(slow, jax.random.PRNGKey(0), env.X, env.y, num_steps=1, progress_bar=False)
    end = dgp.fit(slow, None, env.X, env.y, num_steps=20, init_state=start.state, progress_bar=False)
    for name in start.params:
        np.testing.assert_allclose(end.params[name], start.params[name], rtol=1e-9, atol=1e-9)


# ---- predict and predict_from_samples ---------------------------------------------------------------


@case("predict", "empty", "refused: `predict: X_new has no rows`")
def _(env, capsys):
    with pytest.raises(ValueError, match="predict: X_new has no rows"):
        dgp.predict(env.model, env.guide, env.params, jax.random.PRNGKey(0), env.X[:0])


@case("predict", "wrong shape", "refused: `predict: X_new must have shape (num_points, dim)`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"predict: X_new must have shape"):
        dgp.predict(env.model, env.guide, env.params, jax.random.PRNGKey(0), env.X[:, 0])


@case("predict", "wrong columns", "refused: `predict: X_new has 3 columns; the model was fitted on inputs with 2`")
def _(env, capsys):
    with pytest.raises(ValueError, match="predict: X_new has 3 columns; the model was fitted on inputs with 2"):
        dgp.predict(env.model, env.guide, env.params, jax.random.PRNGKey(0), jnp.zeros((4, 3)))


@case("predict", "dtype", "float32 or integer X_new predicted in the model's dtype: the float64 numbers, bit for bit")
def _(env, capsys):
    X_new = np.round(np.linspace(-2, 2, 6))[:, None].repeat(2, 1)
    ref = dgp.predict(env.model, env.guide, env.params, jax.random.PRNGKey(0), X_new.astype(np.float64))
    for other in (X_new.astype(np.float32), X_new.astype(np.int32)):
        got = dgp.predict(env.model, env.guide, env.params, jax.random.PRNGKey(0), other)
        assert got.mean.dtype == jnp.float64
        np.testing.assert_array_equal(got.mean, ref.mean)
        np.testing.assert_array_equal(got.variance, ref.variance)


@case("predict", "non-finite", "refused: `predict: X_new contains 1 NaN or inf`")
def _(env, capsys):
    with pytest.raises(ValueError, match="predict: X_new contains 1 NaN or inf"):
        dgp.predict(env.model, env.guide, env.params, jax.random.PRNGKey(0), env.X.at[0, 0].set(jnp.inf))


@case("predict_from_samples", "empty", "refused: `predict_from_samples: X_new has no rows`")
def _(env, capsys):
    with pytest.raises(ValueError, match="predict_from_samples: X_new has no rows"):
        dgp.predict_from_samples(env.model, env.samples, jax.random.PRNGKey(0), env.X[:0], params=env.params,
                                 strict=False)


@case("predict_from_samples", "wrong columns", "refused: `gp_layer 'h1': its inputs have 3 columns, its inducing_inputs have shape (4, 2)`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"gp_layer 'h1': its inputs have 3 columns, its inducing_inputs have shape"):
        dgp.predict_from_samples(env.model, env.samples, jax.random.PRNGKey(0), jnp.zeros((4, 3)),
                                 params=env.params, strict=False)


@case("predict_from_samples", "dtype", "float32 X_new predicted in the samples' dtype: the float64 numbers")
def _(env, capsys):
    X_new = np.linspace(-2, 2, 5)[:, None].repeat(2, 1)
    ref = dgp.predict_from_samples(env.model, env.samples, jax.random.PRNGKey(0), X_new, params=env.params,
                                   strict=False)
    got = dgp.predict_from_samples(env.model, env.samples, jax.random.PRNGKey(0), X_new.astype(np.float32),
                                   params=env.params, strict=False)
    assert got.mean.dtype == jnp.float64
    np.testing.assert_array_equal(got.mean, ref.mean)


@case("predict_from_samples", "non-finite", "refused: `predict_from_samples: X_new contains 1 NaN or inf`")
def _(env, capsys):
    with pytest.raises(ValueError, match="predict_from_samples: X_new contains 1 NaN or inf"):
        dgp.predict_from_samples(env.model, env.samples, jax.random.PRNGKey(0), env.X.at[1, 1].set(jnp.nan),
                                 params=env.params, strict=False)


# ---- metrics ----------------------------------------------------------------------------------------


@case("metrics", "empty", "refused: `metrics: y has shape (0,), the prediction's targets have (5,)`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"metrics: y has shape \(0,\), the prediction's targets have \(5,\)"):
        dgp.metrics(env.prediction, jnp.zeros(0))


@case("metrics", "wrong shape", "refused: `metrics: y has shape (5, 2), ...`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"metrics: y has shape \(5, 2\)"):
        dgp.metrics(env.prediction, jnp.zeros((5, 2)))


@case("metrics", "wrong columns", "refused: `metrics: y_scale must be a finite positive number, or one per target column`")
def _(env, capsys):
    with pytest.raises(ValueError, match="metrics: y_scale must be a finite positive number, or one per target"):
        dgp.metrics(env.prediction, env.y[:5], y_scale=[1.0, 2.0])


@case("metrics", "dtype", "integer targets scored as their float values")
def _(env, capsys):
    y = np.round(np.asarray(env.y[:5]) * 3)
    assert dgp.metrics(env.prediction, y.astype(np.int32)) == dgp.metrics(env.prediction, y)


@case("metrics", "non-finite", "NaN targets left out (missing); refused: `y_scale` NaN, 0 or negative",
      "answers (NaN targets), refused (y_scale)")
def _(env, capsys):
    y = np.asarray(env.y[:5])
    with_gap = dgp.metrics(env.prediction, np.where(np.arange(5) == 1, np.nan, y))
    idx = np.array([0, 2, 3, 4])
    from numpyro_dgp._predict.prediction import take_points

    assert with_gap["rmse"] == pytest.approx(dgp.metrics(take_points(env.prediction, idx), y[idx])["rmse"], rel=1e-12)
    for bad in (np.nan, 0.0, -1.0):
        with pytest.raises(ValueError, match="y_scale must be a finite positive number"):
            dgp.metrics(env.prediction, y, y_scale=bad)


@case("metrics", "outside support", "refused: `metrics: y must hold only 0/1 labels for a bernoulli prediction`")
def _(env, capsys):
    p = jnp.full((3,), 0.5)
    prediction = dgp.Prediction(p, p * (1 - p), p[None], (p * (1 - p))[None], {}, {}, {}, likelihood="bernoulli")
    with pytest.raises(ValueError, match="metrics: y must hold only 0/1 labels for a bernoulli prediction"):
        dgp.metrics(prediction, jnp.asarray([0, 1, 2]))


# ---- save_model, load_model, SavedModel.predict --------------------------------------------------------


@case("save_model", "empty", "refused: `ParameterMismatchError` listing the missing entries")
def _(env, capsys):
    with pytest.raises(dgp.ParameterMismatchError, match="missing"):
        dgp.save_model(env.root / "empty_params", env.model, env.guide, {}, input_dim=2)
    assert not (env.root / "empty_params").exists()


@case("save_model", "wrong shape", "refused: `save_model: standardization.x_mean has shape (3,), expected (2,)`")
def _(env, capsys):
    s = env.standardization._replace(x_mean=np.zeros(3))
    with pytest.raises(ValueError, match=r"standardization\.x_mean has shape \(3,\), expected \(2,\)"):
        dgp.save_model(env.root / "m_shape", env.model, env.guide, env.params, input_dim=2, standardization=s)
    assert not (env.root / "m_shape").exists()


@case("save_model", "wrong columns", "refused: `save_model (input_dim=3): the parameters do not match ...`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"save_model \(input_dim=3\)"):
        dgp.save_model(env.root / "m_cols", env.model, env.guide, env.params, input_dim=3)
    assert not (env.root / "m_cols").exists()


@case("save_model", "non-finite", "refused: NaN parameters (`not finite`), a scale of 0 or NaN "
      "(`standardization.x_scale must be finite and positive`), a negative `y_scale`")
def _(env, capsys):
    bad = {**env.params, "noise": jnp.asarray(jnp.nan)}
    with pytest.raises(dgp.ParameterMismatchError, match=r"not finite.*noise"):
        dgp.save_model(env.root / "m_nan", env.model, env.guide, bad, input_dim=2)
    for field, value in (("x_scale", np.array([0.0, 1.0])), ("x_scale", np.array([np.nan, 1.0])), ("y_scale", -1.0)):
        s = env.standardization._replace(**{field: value})
        with pytest.raises(ValueError, match=rf"standardization\.{field} must be finite and positive"):
            dgp.save_model(env.root / "m_nan", env.model, env.guide, env.params, input_dim=2, standardization=s)
    assert not (env.root / "m_nan").exists()


@case("save_model", "clobbering path", "refused: a user's folder (`is not a model directory written by "
      "numpyro_dgp`), a file (`is a file`), an existing path without `overwrite=True`")
def _(env, capsys):
    folder = env.users_folder("save_folder")
    before, table = snapshot(folder), env.table.read_bytes()
    with pytest.raises(FileExistsError, match="is not a model directory written by numpyro_dgp"):
        dgp.save_model(folder, env.model, env.guide, env.params, input_dim=2, overwrite=True)
    with pytest.raises(FileExistsError, match="is a file"):
        dgp.save_model(env.table, env.model, env.guide, env.params, input_dim=2, overwrite=True)
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        dgp.save_model(env.model_dir, env.model, env.guide, env.params, input_dim=2)
    assert snapshot(folder) == before and env.table.read_bytes() == table


@case("load_model", "empty", "refused: `ModelFileError: ... has no model.json`")
def _(env, capsys):
    (env.root / "empty_dir").mkdir(exist_ok=True)
    with pytest.raises(dgp.ModelFileError, match="has no model.json"):
        load_model(env.root / "empty_dir")


def _copy_model(env, name: str, params: dict) -> Path:
    """The saved model with ``params.npz`` replaced and its checksum in model.json updated (a
    file edited consistently: only the check of the values can catch it)."""
    from numpyro_dgp._saved_model import sha256

    target = env.root / name
    target.mkdir(exist_ok=True)
    save_params(target / "params.npz", params)
    config = json.loads((env.model_dir / "model.json").read_text())
    config["files"]["params.npz"]["sha256"] = sha256(target / "params.npz")
    (target / "model.json").write_text(json.dumps(config))
    return target


@case("load_model", "wrong shape", "refused: `ParameterMismatchError` (another model's `params.npz`, checksum updated)")
def _(env, capsys):
    other = {**env.params, "h1.inducing_inputs": jnp.zeros((4, 3))}
    with pytest.raises(dgp.ParameterMismatchError, match=r"h1\.inducing_inputs"):
        load_model(_copy_model(env, "other_params", other))


@case("load_model", "non-finite", "refused: `ParameterMismatchError: ... not finite ... ['noise']`")
def _(env, capsys):
    bad = {**env.params, "noise": jnp.asarray(jnp.inf)}
    with pytest.raises(dgp.ParameterMismatchError, match=r"not finite.*noise"):
        load_model(_copy_model(env, "nan_params", bad))


@case("SavedModel.predict", "empty", "refused: `SavedModel.predict: X must have shape (N, 2) with N >= 1`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"SavedModel.predict: X must have shape \(N, 2\) with N >= 1"):
        env.saved.predict(np.zeros((0, 2)))


@case("SavedModel.predict", "wrong columns", "refused: `SavedModel.predict: X must have shape (N, 2)`")
def _(env, capsys):
    with pytest.raises(ValueError, match=r"SavedModel.predict: X must have shape \(N, 2\)"):
        env.saved.predict(np.zeros((3, 3)))


@case("SavedModel.predict", "dtype", "float32 X predicted in the model's dtype: the float64 numbers")
def _(env, capsys):
    X = np.asarray(env.X[:4], np.float32)
    got = env.saved.predict(X)
    ref = env.saved.predict(X.astype(np.float64))
    np.testing.assert_array_equal(got.mean, ref.mean)


@case("SavedModel.predict", "non-finite", "refused: `SavedModel.predict: X contains 1 NaN or inf values`")
def _(env, capsys):
    with pytest.raises(ValueError, match="SavedModel.predict: X contains 1 NaN or inf values"):
        env.saved.predict(np.array([[np.nan, 0.0]]))


# ---- the command line --------------------------------------------------------------------------------


@case("numpyro-dgp fit", "empty", "refused: `... needs a header row and at least one row of data`")
def _(env, capsys):
    table = _table(env.root / "header_only.csv", [])
    refused_by_cli([*FIT_CLI[:1], table, *FIT_CLI[1:], "--output", env.root / "m_empty"], capsys,
                   "needs a header row and at least one row of data")


@case("numpyro-dgp fit", "wrong columns", "refused: `--target: 'nope' is not a column`")
def _(env, capsys):
    refused_by_cli([*FIT_CLI[:1], env.table, "--target", "nope", "--output", env.root / "m_nope"], capsys,
                   "'nope' is not a column")


@case("numpyro-dgp fit", "dtype", "refused: `columns that are not numeric: 'city' (line 2: 'Paris')`")
def _(env, capsys):
    table = _table(env.root / "text.csv", [[0.1, 0.2, "Paris", 1.0]], header=("a", "b", "city", "y"))
    refused_by_cli([*FIT_CLI[:1], table, *FIT_CLI[1:], "--output", env.root / "m_text"], capsys,
                   "columns that are not numeric: 'city' (line 2: 'Paris')")


@case("numpyro-dgp fit", "non-finite", "refused: `target column(s) ['y'] have missing values; pass --missing-targets mask`")
def _(env, capsys):
    rows = np.column_stack([env.X, env.y]).tolist()
    rows[3][2] = "nan"
    table = _table(env.root / "gap.csv", rows)
    refused_by_cli([*FIT_CLI[:1], table, *FIT_CLI[1:], "--output", env.root / "m_gap"], capsys,
                   "target column(s) ['y'] have missing values; pass --missing-targets mask")


@case("numpyro-dgp fit", "outside support", "refused: `--likelihood probit needs a target of 0s and 1s`")
def _(env, capsys):
    refused_by_cli([*FIT_CLI[:1], env.table, *FIT_CLI[1:], "--likelihood", "probit", "--output",
                    env.root / "m_probit"], capsys, "--likelihood probit needs a target of 0s and 1s")


@case("numpyro-dgp fit", "clobbering path",
      "refused: `--output ... is not a model directory written by numpyro_dgp` (with `--overwrite`), "
      "`... exists; pass --overwrite` (without)")
def _(env, capsys):
    folder = env.users_folder("cli_folder")
    before = snapshot(folder)
    refused_by_cli([*FIT_CLI[:1], env.table, *FIT_CLI[1:], "--output", folder, "--overwrite"], capsys,
                   "is not a model directory written by numpyro_dgp")
    refused_by_cli([*FIT_CLI[:1], env.table, *FIT_CLI[1:], "--output", env.model_dir], capsys,
                   "exists; pass --overwrite")
    assert snapshot(folder) == before


@case("numpyro-dgp fit", "path is an input", "refused: `--output ... is an input of this command`")
def _(env, capsys):
    table = env.table.read_bytes()
    refused_by_cli([*FIT_CLI[:1], env.table, *FIT_CLI[1:], "--output", env.table, "--overwrite"], capsys,
                   "is an input of this command")
    assert env.table.read_bytes() == table


@case("numpyro-dgp fit", "extreme learning rate",
      "1000: exit 1, `the fit diverged with --lr 1000; nothing was saved`; 0 or inf: refused by argparse",
      "error, nothing saved (1000), refused (0, inf)")
def _(env, capsys):
    rs = np.random.RandomState(7)
    X = rs.randn(80, 2)
    table = _table(env.root / "lr.csv", np.column_stack([X, np.sin(2 * X[:, 0])]).tolist())
    out = env.root / "m_lr"
    with warnings.catch_warnings():  # the diverging inner layer's outputs are far from standardized
        warnings.simplefilter("ignore", dgp.InputScaleWarning)
        refused_by_cli(["fit", table, "--target", "y", "--layers", "2", "--num-inducing", "10", "--steps",
                        "150", "--lr", "1000", "--no-progress", "--output", out], capsys,
                       "the fit diverged with --lr 1000; nothing was saved", code=1)
    assert not out.exists()
    for lr in ("0", "inf"):
        with pytest.raises(SystemExit):
            cli.main(["fit", str(table), "--target", "y", "--lr", lr, "--output", str(out)])
        assert "must be a finite positive number" in capsys.readouterr().err


@case("numpyro-dgp predict", "empty", "refused: `... needs a header row and at least one row of data`")
def _(env, capsys):
    table = _table(env.root / "predict_empty.csv", [], header=("a", "b"))
    refused_by_cli(["predict", env.model_dir, table, "--output", env.root / "p_empty.csv"], capsys,
                   "needs a header row and at least one row of data")


@case("numpyro-dgp predict", "wrong columns", "refused: `the model needs the columns ['b'], which the table lacks`")
def _(env, capsys):
    table = _table(env.root / "only_a.csv", [[0.1], [0.2]], header=("a",))
    refused_by_cli(["predict", env.model_dir, table, "--output", env.root / "p_cols.csv"], capsys,
                   "the model needs the columns ['b'], which the table lacks")


@case("numpyro-dgp predict", "dtype", "refused: `columns that are not numeric: 'b'`")
def _(env, capsys):
    table = _table(env.root / "text_b.csv", [[0.1, "x"]], header=("a", "b"))
    refused_by_cli(["predict", env.model_dir, table, "--output", env.root / "p_text.csv"], capsys,
                   "columns that are not numeric: 'b'")


@case("numpyro-dgp predict", "non-finite", "refused: `columns with missing, NaN or infinite values: ['b']`")
def _(env, capsys):
    table = _table(env.root / "nan_b.csv", [[0.1, 0.3], [0.1, "inf"]], header=("a", "b"))
    refused_by_cli(["predict", env.model_dir, table, "--output", env.root / "p_nan.csv"], capsys,
                   "columns with missing, NaN or infinite values: ['b']")


@case("numpyro-dgp predict", "clobbering path",
      "refused: an existing file without `--overwrite` (`exists; pass --overwrite`), a folder (`is a folder`)")
def _(env, capsys):
    mine = env.root / "mine.csv"
    mine.write_text("keep\n")
    folder = env.users_folder("predict_folder")
    before = snapshot(folder)
    refused_by_cli(["predict", env.model_dir, env.table, "--output", mine], capsys, "exists; pass --overwrite")
    refused_by_cli(["predict", env.model_dir, env.table, "--output", folder, "--overwrite"], capsys, "is a folder")
    assert mine.read_text() == "keep\n" and snapshot(folder) == before


@case("numpyro-dgp predict", "path is an input", "refused: `--output ... is an input of this command` (the table, "
      "the model directory or a file in it)")
def _(env, capsys):
    table, model = env.table.read_bytes(), snapshot(env.model_dir)
    for output in (env.table, env.model_dir, env.model_dir / "params.npz"):
        refused_by_cli(["predict", env.model_dir, env.table, "--output", output, "--overwrite"], capsys,
                       "is an input of this command")
    assert env.table.read_bytes() == table and snapshot(env.model_dir) == model


# ---- running the cells ------------------------------------------------------------------------------


class _WorkStarted(AssertionError):
    """A refusal reached the work it should have come before."""


def _started(what: str):
    def fail(*args, **kwargs):
        raise _WorkStarted(f"{what} ran before the refusal")

    return fail


@pytest.fixture
def no_work(monkeypatch):
    """The fit's initialization, the predictor, the model loading and the parameter writes fail
    the test if reached."""
    import numpyro_dgp._predict.prediction as prediction_module
    import numpyro_dgp.infer._fit as fit_module

    monkeypatch.setattr(fit_module, "initial_state", _started("the fit's initialization"))
    monkeypatch.setattr(prediction_module, "_predictor", _started("the predictor"))
    monkeypatch.setattr(dgp, "load_model", _started("loading the model"))
    monkeypatch.setattr(dgp.io, "save_params", _started("writing parameters"))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return Env(tmp_path_factory.mktemp("entry_points"))


@pytest.mark.parametrize("cell", list(CASES), ids=[f"{e}-{c}" for e, c in CASES])
def test_cell(cell, env, capsys, request):
    outcome, _, check = CASES[cell]
    if outcome.startswith("refused"):
        request.getfixturevalue("no_work")
    check(env, capsys)


def table() -> str:
    """The tables of docs/bad_input.md: an overview (a row per entry point, a column per
    category), then every cell's outcome."""
    lines = ["| entry point | " + " | ".join(CATEGORIES) + " |",
             "| --- | " + " | ".join("---" for _ in CATEGORIES) + " |"]
    for entry in ENTRY_POINTS:
        cells = [CASES[(entry, c)][1] if (entry, c) in CASES else "–" for c in CATEGORIES]
        lines.append(f"| `{entry}` | " + " | ".join(cells) + " |")
    lines += ["", "| entry point | bad input | outcome |", "| --- | --- | --- |"]
    for (entry, category), (outcome, _, _) in CASES.items():
        lines.append(f"| `{entry}` | {category} | {outcome.replace('|', '\\|')} |")
    return "\n".join(lines)


def test_documented_table():
    """docs/bad_input.md shows the tables and the count, as this module runs them."""
    text = (ROOT / "docs" / "bad_input.md").read_text()
    assert table() in text
    assert f"{len(CASES)} cells" in text


if __name__ == "__main__":
    print(table())
    print(f"\n{len(CASES)} cells")
