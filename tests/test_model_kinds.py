"""Every model kind end to end at any input size (docs/model_kinds.md).

A kind is a guide (the library's four, NumPyro's four Gaussian autoguides) x an inducing kind
(global whitened, global not whitened, inducing locations, amortized) x a handler that changes
prediction (none, ``sde_flow``, ``quadrature``), with a Gaussian or probit likelihood, in
float64 or float32. Each either works -- fitted for a few steps, it predicts finite means and
variances of the right shape and dtype at one point, at fewer points than inducing points, at
more points than it was trained on, and in windows that do not divide the points, each window
the numbers of predicting it alone -- or is refused at its first run with the error that names
the reason (``tests/_model_kinds.py`` holds the matrix and the check).

The default suite runs one refused kind per guide and reason
(:func:`tests._model_kinds.default_refusals`) and a covering set of the working ones
(:func:`tests._model_kinds.covering_set`: each library guide with every inducing kind, each
NumPyro autoguide, every inducing kind with every handler); ``--runslow`` runs every kind, the
working ones with both likelihoods and both dtypes. The covering cases over the default
suite's time budget are listed in ``tests/slow_cases.txt`` and run with ``--runslow`` too;
four of them (whitened, not whitened, inducing locations with and without a flow) stay in
the default suite. Float32
cases run with JAX's 64-bit mode off (``jax.enable_x64(False)``), as users run float32 models.
"""

from __future__ import annotations

import csv
import itertools
import re
from pathlib import Path

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp import cli
from tests import _model_kinds as kinds

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = kinds.covering_set()
EVERY = [kind + variant for kind in kinds.KINDS if kinds.EXPECTED[kind] == "works"
         for variant in itertools.product(kinds.LIKELIHOODS, kinds.DTYPES)]
SLOW = [case for case in EVERY if case not in DEFAULT]


def _params(cases, marks=()):
    return [pytest.param(*case, id=kinds.case_id(case), marks=list(marks)) for case in cases]


@pytest.mark.parametrize("guide,inducing,handler,likelihood,dtype",
                         _params(DEFAULT) + _params(SLOW, [pytest.mark.slow]))
def test_working_kind_predicts_at_every_size(guide, inducing, handler, likelihood, dtype):
    kinds.check_case(guide, inducing, handler, likelihood, dtype)


REFUSED = [kind for kind in kinds.KINDS if kinds.EXPECTED[kind] == "refused"]
REFUSED_DEFAULT = kinds.default_refusals()


@pytest.mark.parametrize("guide,inducing,handler", [
    pytest.param(*k, id=kinds.case_id(k), marks=[] if k in REFUSED_DEFAULT else [pytest.mark.slow]) for k in REFUSED
])
def test_refused_kind_says_why_at_its_first_run(guide, inducing, handler):
    kinds.check_case(guide, inducing, handler, "gaussian", "float64")


#: working MCMC kinds that run in the default suite (and every refusal); the rest are slow
MCMC_DEFAULT = [("global", "quadrature", "SGHMC"), ("locations", "sde_flow", "SGHMC"),
                ("global, not whitened", "none", "NUTS")]


def _mcmc_params():
    for kind in kinds.MCMC_KINDS:
        slow = kinds.mcmc_refusal(*kind) is None and kind not in MCMC_DEFAULT
        yield pytest.param(*kind, id=kinds.case_id(kind), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("inducing,handler,sampler", list(_mcmc_params()))
def test_mcmc_kind_predicts_from_samples_at_every_size(inducing, handler, sampler):
    """SGHMC on the model, NUTS on latent_conditionals(model): predict_from_samples at one point,
    at fewer points than inducing points, at more than were trained on; or a refusal naming why."""
    kinds.check_mcmc(inducing, handler, sampler)


def test_every_option_is_in_the_default_cases():
    """The covering set has each default guide, inducing kind and handler, each library guide with
    every inducing kind it takes, and each likelihood and dtype with each handler and inducing
    kind; every reason for a refusal is in the default suite."""
    for guide, inducing, handler in kinds.KINDS:
        if guide in kinds.LIBRARY_GUIDES and kinds.EXPECTED[(guide, inducing, handler)] == "works":
            assert any(c[:2] == (guide, inducing) for c in DEFAULT), (guide, inducing)
    assert {kinds.refusal(*k) for k in REFUSED_DEFAULT} == set(kinds.REFUSALS)
    options = (kinds.DEFAULT_GUIDES, kinds.INDUCING, kinds.HANDLERS, kinds.LIKELIHOODS, kinds.DTYPES)
    for position, options in enumerate(options):
        assert {case[position] for case in DEFAULT} == set(options)
    for case in DEFAULT:
        assert kinds.EXPECTED[case[:3]] == "works"
    for inducing_or_handler in (1, 2):
        for variant in (3, 4):
            seen = {(c[inducing_or_handler], c[variant]) for c in DEFAULT}
            options = {c[inducing_or_handler] for c in DEFAULT}
            values = {c[variant] for c in DEFAULT}
            assert seen == set(itertools.product(options, values)), (inducing_or_handler, variant)


def test_documented_table():
    """docs/model_kinds.md shows EXPECTED, cell for cell."""
    text = (ROOT / "docs" / "model_kinds.md").read_text()
    assert kinds.table() in text and kinds.mcmc_table() in text
    found = {}
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 + len(kinds.GUIDES) and cells[0] in kinds.INDUCING and cells[1] in kinds.HANDLERS:
            for guide, cell in zip(kinds.GUIDES, cells[2:]):
                found[(guide, cells[0], cells[1])] = re.sub(r"\s*\(.*\)$", "", cell)
    assert found == kinds.EXPECTED


def test_the_issue_snippet_predicts_at_one_point():
    """Inducing locations fitted on 40 points with 20 inducing points predict at one point
    (prediction checked the parameters by running k-means on the prediction inputs)."""
    X = np.linspace(-1, 1, 40)[:, None]
    y = np.sin(3 * X[:, 0])

    def model(X, y=None):
        h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=20, mean="identity", inducing="locations")
        f, _ = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=20, inducing="locations")
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)

    guide = dgp.guides.AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    result = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=3, progress_bar=False)
    pred = dgp.predict(model, guide, result.params, jax.random.PRNGKey(1), np.zeros((1, 1)), num_samples=200)
    assert pred.mean.shape == (1,) and np.isfinite(pred.mean).all() and (pred.variance > 0).all()
    # the parameter check still refuses parameters of another shape at one point
    wrong = {**result.params, "h1.inducing_inputs": result.params["h1.inducing_inputs"][:5]}
    with pytest.raises(dgp.ParameterMismatchError, match=r"mis-shaped .h1.inducing_inputs.*\(20, 1\)"):
        dgp.predict(model, guide, wrong, jax.random.PRNGKey(1), np.zeros((1, 1)))


# ---- any number of points, any window: a property of the default model --------------------------


@pytest.fixture(scope="module")
def default_fit():
    """The quickstart's kind (AutoFactorizedDGP, whitened global inducing points, Gaussian),
    fitted for a few steps."""
    return kinds.fitted("AutoFactorizedDGP", "global", "none", "gaussian", "float64", num_steps=3)


@settings(max_examples=4)
@given(data=st.data())
def test_prediction_at_any_number_of_points_in_any_windows(default_fit, data):
    """From 1 to 3M points, unbatched or in windows of any size: finite means and positive
    variances of shape (n,); the last window, and the points of the first that no later window
    predicts again, the numbers of predicting those windows alone."""
    model, guide, result, _ = default_fit
    n = data.draw(st.integers(1, 3 * kinds.M), label="num_points")
    batch = data.draw(st.one_of(st.none(), st.integers(1, n + 2)), label="batch_size")
    X = np.linspace(-1.5, 1.5, n)[:, None]
    key = jax.random.PRNGKey(4)

    def predict(points, **kw):
        return dgp.predict(model, guide, result.params, key, points, num_samples=3, **kw)

    pred = predict(X, batch_size=batch)
    kinds.check_prediction(pred, n, "gaussian", "float64", f"{n} points, batch_size={batch}")
    if batch is not None and batch < n:
        # the last window ends at the last point and wins where it overlaps the one before
        kept = min(batch, n - batch)  # the first window's points no later window predicts again
        for window, part in ((slice(0, batch), slice(0, kept)), (slice(n - batch, n), slice(0, batch))):
            alone = predict(X[window])
            np.testing.assert_array_equal(pred.mean[window][part], alone.mean[part])
            np.testing.assert_array_equal(pred.variance[window][part], alone.variance[part])


# ---- saved models and the command line at any size -------------------------------------------


def _factory_model(factory):
    if factory == "deep, not whitened, probit":
        model = dgp.models.deep_gp_regression(2, num_inducing=kinds.M, whiten=False, likelihood="probit")
    elif factory == "diffgp":
        model = dgp.models.diffgp(0.5, num_steps=2, num_inducing=kinds.M)
    elif factory == "amortized":
        model = dgp.models.amortized_dgp((2, 1), (kinds.M, kinds.M))
        return model, dgp.guides.AutoAmortizedDGP(model, num_branches=2, num_hidden=1, hidden_width=4)
    else:
        model = dgp.models.deep_gp_regression(2, num_inducing=kinds.M)
    return model, dgp.guides.AutoFactorizedDGP(model)


@pytest.mark.parametrize("factory", ["deep, not whitened, probit", "amortized",
                                     pytest.param("deep", marks=pytest.mark.slow),
                                     pytest.param("diffgp", marks=pytest.mark.slow)])
def test_saved_kind_predicts_at_every_size(factory, tmp_path):
    """save_model / load_model by kind: the loaded model predicts what the fitted one predicts,
    and at one point, at fewer points than inducing points, at more points than were trained on
    and in windows."""
    likelihood = "probit" if "probit" in factory else "gaussian"
    X, y, X_new = kinds.data(likelihood, "float64")
    model, guide = _factory_model(factory)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    params = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=2, progress_bar=False).params
    dgp.save_model(tmp_path / "m", model, guide, params, input_dim=1)
    loaded = dgp.load_model(tmp_path / "m")
    key = jax.random.PRNGKey(1)
    for points, batch in ((X_new[:kinds.ONE], None), (X_new[:kinds.FEW], None), (X_new, None), (X_new, kinds.BATCH)):
        got = loaded.predict(points, rng_key=key, num_samples=3, batch_size=batch)
        kinds.check_prediction(got, len(points), likelihood, "float64", f"loaded {factory}, {len(points)} points")
    want = dgp.predict(model, guide, params, key, X_new[:kinds.FEW], num_samples=3)
    got = loaded.predict(X_new[:kinds.FEW], rng_key=key, num_samples=3)
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.variance, want.variance, rtol=1e-10, atol=1e-12)


def test_command_line_predicts_one_row_and_fewer_rows_than_inducing_points(tmp_path, capsys):
    X, y, X_new = kinds.data("gaussian", "float64")
    X, y = np.concatenate([X, X + 0.05]), np.concatenate([y, y])  # 20 rows: 4 held out
    with open(tmp_path / "train.csv", "w", newline="") as f:
        csv.writer(f).writerows([["x", "y"], *zip(X[:, 0], y)])
    assert cli.main(["fit", str(tmp_path / "train.csv"), "--target", "y", "--layers", "2", "--num-inducing",
                     str(kinds.M), "--steps", "2", "--no-progress", "--output", str(tmp_path / "m")]) == 0
    for rows in (kinds.ONE, kinds.FEW):
        with open(tmp_path / "new.csv", "w", newline="") as f:
            csv.writer(f).writerows([["x"], *X_new[:rows]])
        assert cli.main(["predict", str(tmp_path / "m"), str(tmp_path / "new.csv"), "--output",
                         str(tmp_path / "p.csv"), "--overwrite"]) == 0, capsys.readouterr().err
        with open(tmp_path / "p.csv") as f:
            table = list(csv.reader(f))
        assert table[0][:3] == ["row", "mean", "std"] and len(table) == rows + 1
        values = np.array(table[1:], float)[:, 1:]
        assert np.all(np.isfinite(values)) and np.all(values[:, 1] > 0)


def test_predict_from_samples_names_an_unset_param_at_one_point():
    """Samples without the model's params (NUTS keeps them at their initial values) are refused
    by name at any number of points, before k-means would run on the prediction inputs."""
    model = kinds.make_model("global", "gaussian")
    samples = {"h1.u": np.zeros((2, 1, kinds.M)), "h2.u": np.zeros((2, 1, kinds.M))}
    for n in (kinds.ONE, kinds.MANY):
        with pytest.raises(ValueError, match=r"param site 'h1\.[a-z_.]+' is neither in the samples nor in params="):
            dgp.predict_from_samples(model, samples, jax.random.PRNGKey(0), np.zeros((n, 1)))
