"""Bad input caught at the door: one test per class of bad input, each asserting the error type
and a message that names the argument (or the parameter entries).

Classes: integer inputs; targets of shape ``(N, 1)`` or another shape; non-finite data;
inputs far from standardized; non-positive kernel hyperparameters; duplicate layer names
(under ``python -O`` too); parameters that do not match the model (renamed layers, missing
entries, a misspelt key, ``params={}``, another ``num_inducing``, another ``out_dim``) in
``predict``, ``predict_from_samples``, ``fit(init_params=...)`` and
``load_params(..., model=...)``; latent layer samples used at new inputs; invalid arguments of
the model factories, ``fit`` and ``predict``; the command line's numeric arguments.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer import MCMC, NUTS, SVI, Predictive

import numpyro_dgp as dgp
from numpyro_dgp import _validation, cli
from numpyro_dgp.models import amortized_dgp, deep_gp_regression, diffgp


@pytest.fixture(autouse=True)
def fresh_scale_warnings():
    """Scale warnings are issued once per problem and process: start each test afresh."""
    _validation._WARNED.clear()
    yield
    _validation._WARNED.clear()


@pytest.fixture(scope="module")
def data():
    rs = np.random.RandomState(0)
    X = jnp.asarray(rs.uniform(-1, 1, (30, 2)))
    return X, jnp.asarray(np.sin(2 * X[:, 0]) + 0.1 * rs.randn(30))


def make_svi(model):
    guide = dgp.guides.AutoFactorizedDGP(model)
    return guide, SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())


@pytest.fixture(scope="module")
def fitted(data):
    """A 1-layer model with M = 6 and out_dim 1, fitted for a few steps."""
    X, y = data
    model = deep_gp_regression(1, num_inducing=6)
    guide, svi = make_svi(model)
    return model, guide, dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=3, progress_bar=False).params


def test_integer_inputs_are_cast_to_float_never_a_zero_noise(data):
    """Integer X used to make the noise an integer 0 ('invalid scale parameter')."""
    X, y = data
    X_int = jnp.round(X * 3).astype(jnp.int32)
    model = deep_gp_regression(1, num_inducing=4)
    tr = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(X_int, y)
    assert tr["noise"]["value"].dtype == jnp.result_type(float) and float(tr["noise"]["value"]) == 0.01
    assert tr["h1"]["value"].dtype == jnp.result_type(float)
    _, svi = make_svi(model)
    assert dgp.fit(svi, jax.random.PRNGKey(0), X_int, y, num_steps=2, progress_bar=False).num_skipped == 0
    with pytest.raises(TypeError, match="X must be a real"):
        numpyro.handlers.seed(model, 0)(X.astype(jnp.complex64), y)


def test_targets_of_shape_n_by_1_are_squeezed_other_shapes_refused(data):
    X, y = data
    model = deep_gp_regression(1, num_inducing=4)
    tr = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(X, y[:, None])
    assert tr["y"]["value"].shape == (30,)
    with pytest.raises(ValueError, match=r"y must have shape \(30,\) \(or \(30, 1\)\).*got shape \(30, 2\)"):
        numpyro.handlers.seed(model, 0)(X, jnp.stack([y, y], 1))
    with pytest.raises(ValueError, match=r"y must have shape \(30,\).*got shape \(29,\)"):
        numpyro.handlers.seed(model, 0)(X, y[:-1])
    with pytest.raises(ValueError, match=r"X must have shape \(num_points, dim\), got shape \(30,\)"):
        numpyro.handlers.seed(model, 0)(X[:, 0], y)


def test_non_finite_data_is_refused_naming_the_argument(data, fitted):
    X, y = data
    model = deep_gp_regression(1, num_inducing=4)
    with pytest.raises(ValueError, match=r"deep_gp_regression model: X contains 1 NaN or inf"):
        numpyro.handlers.seed(model, 0)(X.at[3, 1].set(jnp.nan), y)
    with pytest.raises(ValueError, match=r"deep_gp_regression model: y contains 1 NaN or inf"):
        numpyro.handlers.seed(model, 0)(X, y.at[0].set(jnp.inf))
    _, svi = make_svi(model)
    with pytest.raises(ValueError, match=r"fit: model argument args\[1\] contains NaN"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y.at[0].set(jnp.nan), num_steps=2, progress_bar=False)
    fitted_model, guide, params = fitted
    with pytest.raises(ValueError, match="predict: X_new contains 1 NaN or inf"):
        dgp.predict(fitted_model, guide, params, jax.random.PRNGKey(0), X.at[0, 0].set(jnp.inf))
    with pytest.raises(ValueError, match=r"gp_layer 'h': X contains NaN"):
        numpyro.handlers.seed(lambda: dgp.gp_layer("h", X.at[0, 0].set(jnp.nan), dgp.kernels.RBF(), num_inducing=2),
                              0)()


@pytest.mark.parametrize("block_bytes", [1, 8 * 7, 1 << 24])
def test_the_blockwise_finiteness_check_counts_and_locates_every_bad_entry(monkeypatch, block_bytes):
    # large data are checked over blocks of rows (no whole-size mask): the count and the first
    # indices must be those of the whole array, whatever the block
    from numpyro_dgp import _validation

    monkeypatch.setattr(_validation, "_FINITE_BLOCK_BYTES", block_bytes)
    value = np.zeros((23, 3, 2))
    bad_at = [(2, 1, 0), (2, 2, 1), (9, 0, 0), (22, 2, 1)]
    for i, idx in enumerate(bad_at):
        value[idx] = [np.nan, np.inf, -np.inf, np.nan][i]
    assert _validation.non_finite_entries(value) == (4, bad_at[:3])
    assert _validation.non_finite_entries(value, max_first=10) == (4, bad_at)
    assert _validation.non_finite_entries(np.zeros((5, 2))) == (0, [])
    assert _validation.non_finite_entries(np.float64(np.nan)) == (1, [()])


def test_inputs_far_from_standardized_warn_once(data):
    """Inputs scaled by 1e8 used to train to a constant predictor without a word."""
    X, y = data
    model = deep_gp_regression(2, num_inducing=4)
    guide, svi = make_svi(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dgp.fit(svi, jax.random.PRNGKey(0), X * 1e8, y, num_steps=2, progress_bar=False)
    scale = [w for w in record if issubclass(w.category, dgp.InputScaleWarning)]
    assert len(scale) == 1, [str(w.message) for w in scale]  # once, though every layer and run sees X
    assert "fit: X (its first argument) is far from standardized" in str(scale[0].message)
    with pytest.warns(dgp.InputScaleWarning, match=r"fit: X \(its first argument\) is far from standardized: .*spread down to"):
        dgp.fit(svi, jax.random.PRNGKey(0), X * 1e-6, y, num_steps=1, progress_bar=False)
    with pytest.warns(dgp.InputScaleWarning, match=r"gp_layer 'h': X is far from standardized: .*spread up to 5.6"):
        numpyro.handlers.seed(lambda: dgp.gp_layer("h", X * 1e4, dgp.kernels.RBF(), num_inducing=2), 0)()
    with warnings.catch_warnings():
        warnings.simplefilter("error", dgp.InputScaleWarning)
        # lengthscales of the data's scale: no warning from the layer
        numpyro.handlers.seed(lambda: dgp.gp_layer("h", X * 1e4, dgp.kernels.RBF(lengthscale=1e4),
                                                   num_inducing=2), 0)()
        # an inner layer's inputs may start with a tiny spread (here: zero-padded identity means)
        numpyro.handlers.seed(deep_gp_regression(2, num_inducing=4, hidden_width=4), 0)(X, y)
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=1, progress_bar=False)  # standardized: silent


@pytest.mark.parametrize("make, match", [
    (lambda: dgp.kernels.RBF(lengthscale=0.0), "RBF: lengthscale must be finite and positive"),
    (lambda: dgp.kernels.Matern52(variance=-1.0), "Matern52: variance must be finite and positive"),
    (lambda: dgp.kernels.Matern12(lengthscale=np.array([1.0, -2.0])), "Matern12: lengthscale"),
    (lambda: dgp.kernels.Matern32(lengthscale=jnp.array([1.0, jnp.nan])), "Matern32: lengthscale"),
    (lambda: dgp.kernels.Periodic(period=0), "Periodic: period"),
    (lambda: dgp.kernels.Linear(variance=float("inf")), "Linear: variance"),
    (lambda: dgp.kernels.RBF() + dgp.kernels.RBF(variance=-2.0), "RBF: variance"),
])
def test_kernels_refuse_non_positive_hyperparameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("call, error, match", [
    (lambda: dgp.kernels.RBF(variance="a"), TypeError, "RBF: variance must be a real number or array"),
    (lambda: dgp.kernels.RBF().replace(period=1.0), ValueError, r"RBF has no hyperparameter\(s\) \['period'\]"),
    (lambda: dgp.kernels.Sum(dgp.kernels.RBF(), 3), TypeError, "Sum takes Kernel objects"),
    (lambda: dgp.kernels.RBF(lengthscale=jnp.ones(3)).with_input_dim(2), ValueError,
     "but the layer input has 2 dimensions"),
    (lambda: dgp.kernels.RBF()(jnp.ones((3, 2)), jnp.ones((3, 3))), ValueError, "kernel inputs disagree in dimension"),
    (lambda: dgp.kernels.RBF()(jnp.ones(3)), ValueError,
     r"kernel inputs must be 2-D \(num_points, dim\); got shapes \(3,\) and \(3,\)"),
    (lambda: dgp.kernels.RBF()(jnp.ones((3, 1)), jnp.ones(3)), ValueError,
     r"kernel inputs must be 2-D .*got shapes \(3, 1\) and \(3,\)"),
    (lambda: dgp.kernels.Matern52().diag(jnp.ones(3)), ValueError,
     r"kernel inputs must be 2-D \(num_points, dim\); got shape \(3,\)"),
])
def test_kernels_name_what_is_wrong(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_kernels_accept_positive_arrays_and_skip_traced_values():
    k = dgp.kernels.RBF(variance=jnp.asarray(2.0), lengthscale=np.array([0.5, 1.0]))
    assert k(jnp.ones((3, 2))).shape == (3, 3)
    # traced hyperparameters are not checked (a kernel built under jit or vmap)
    out = jax.jit(lambda v: dgp.kernels.RBF(variance=v).diag(jnp.ones((2, 1))))(-1.0)
    assert out.shape == (2,)


DUPLICATE = """
import jax, numpyro, numpyro_dgp as dgp
from numpyro.handlers import seed, trace

def model(X):
    h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=2)
    return dgp.gp_layer("h1", h, dgp.kernels.RBF(), num_inducing=2)

try:
    trace(seed(model, 0)).get_trace(jax.numpy.linspace(0, 1, 5)[:, None])
except ValueError as err:
    print("ValueError:", err)
print("asserts", "on" if __debug__ else "off")
"""


@pytest.mark.parametrize("optimize", [False, True])
def test_duplicate_layer_names_raise_even_under_python_O(optimize):
    """NumPyro's own check is an assert, gone under ``python -O``."""
    flags = ["-O"] if optimize else []
    out = subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(DUPLICATE)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ValueError: gp_layer: duplicate layer name 'h1'" in out.stdout
    assert f"asserts {'off' if optimize else 'on'}" in out.stdout


def test_predict_refuses_parameters_that_do_not_match_the_model(data, fitted):
    X, y = data
    model, guide, params = fitted
    key, X_new = jax.random.PRNGKey(1), X[:5]
    cases = {
        "params={}": ({}, r"missing .*'h1.inducing_inputs'.*'noise'"),
        "missing entry": ({k: v for k, v in params.items() if k != "h1.kernel.variance"},
                          r"missing .*\['h1.kernel.variance'\]"),
        "misspelt key": ({**{k: v for k, v in params.items() if k != "noise"}, "noize": params["noise"]},
                         r"missing .*\['noise'\]\n  unexpected .*\['noize'\]"),
        "renamed layers": ({k.replace("h1", "layer1"): v for k, v in params.items()},
                           r"unexpected .*'layer1.inducing_inputs'"),
    }
    for name, (bad, match) in cases.items():
        with pytest.raises(dgp.ParameterMismatchError, match=match):
            dgp.predict(model, guide, bad, key, X_new)
    # parameters of an M = 10 model given to an M = 6 one, and of an out_dim = 2 inner layer
    other = deep_gp_regression(1, num_inducing=10)
    other_guide, other_svi = make_svi(other)
    params10 = dgp.fit(other_svi, key, X, y, num_steps=1, progress_bar=False).params
    with pytest.raises(dgp.ParameterMismatchError,
                       match=r"mis-shaped 'h1.inducing_inputs': given shape \(10, 2\) float64, .* creates shape \(6, 2\)"):
        dgp.predict(model, guide, params10, key, X_new)
    wide, narrow = deep_gp_regression(2, num_inducing=4, hidden_width=3), deep_gp_regression(2, num_inducing=4)
    wide_params = dgp.fit(make_svi(wide)[1], key, X, y, num_steps=1, progress_bar=False).params
    narrow_guide, narrow_svi = make_svi(narrow)
    dgp.fit(narrow_svi, key, X, y, num_steps=1, progress_bar=False)
    with pytest.raises(dgp.ParameterMismatchError, match=r"mis-shaped 'h1.u_auto_loc': given shape \(3, 4\)"):
        dgp.predict(narrow, narrow_guide, wide_params, key, X_new)
    # strict=False ignores extra entries (never missing ones)
    pred = dgp.predict(model, guide, {**params, "extra": jnp.ones(2)}, key, X_new, num_samples=2, strict=False)
    assert pred.mean.shape == (5,)
    with pytest.raises(dgp.ParameterMismatchError, match=r"unexpected .*\['extra'\]"):
        dgp.check_params(model, guide, {**params, "extra": jnp.ones(2)}, X, y)


def test_fit_and_load_params_check_parameters_against_the_model(data, fitted, tmp_path):
    X, y = data
    model, guide, params = fitted
    _, svi = make_svi(model)
    with pytest.raises(dgp.ParameterMismatchError, match=r"(?s)fit \(init_params\).*missing .*'h1.u_auto_loc'"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=1, progress_bar=False, init_params={"noise": 0.5})
    partial = dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=1, progress_bar=False,
                      init_params={"noise": jnp.asarray(0.5)}, strict=False)
    assert partial.num_skipped == 0
    with pytest.raises(dgp.ParameterMismatchError, match=r"mis-shaped 'noise': given shape \(2,\)"):
        dgp.fit(svi, jax.random.PRNGKey(0), X, y, num_steps=1, progress_bar=False,
                init_params={"noise": jnp.ones(2)}, strict=False)
    path = tmp_path / "params.npz"
    dgp.save_params(path, {k.replace("h1", "layer1"): v for k, v in params.items()})
    fresh_model = deep_gp_regression(1, num_inducing=6)
    fresh_guide = dgp.guides.AutoFactorizedDGP(fresh_model)
    with pytest.raises(dgp.ParameterMismatchError, match=r"(?s)load_params\(.*params.npz'\).*missing"):
        dgp.load_params(path, model=fresh_model, guide=fresh_guide, args=(X, y))
    dgp.save_params(path, params)
    loaded = dgp.load_params(path, model=fresh_model, guide=fresh_guide, args=(X, y))
    assert dgp.predict(fresh_model, fresh_guide, loaded, jax.random.PRNGKey(1), X[:3], num_samples=2).mean.shape == (3,)
    with pytest.raises(ValueError, match="pass model= too"):
        dgp.load_params(path, guide=fresh_guide)


def test_predict_from_samples_checks_samples_and_params(data):
    X, y = data
    model = deep_gp_regression(1, num_inducing=4)
    tr = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(X, y)
    samples = {k: jnp.stack([tr[k]["value"]] * 2) for k in ("h1.u", "h1.inducing_inputs", "h1.kernel.variance",
                                                               "h1.kernel.lengthscale", "noise")}
    assert dgp.predict_from_samples(model, samples, jax.random.PRNGKey(0), X[:3]).mean.shape == (3,)
    with pytest.raises(dgp.ParameterMismatchError, match=r"(?s)samples.*mis-shaped 'h1.u': given shape \(2, 4\)"):
        dgp.predict_from_samples(model, {**samples, "h1.u": jnp.zeros((2, 2, 4))}, jax.random.PRNGKey(0), X[:3])
    fixed = {"noise": samples.pop("noise")[0], "nosie": jnp.asarray(0.1)}
    with pytest.raises(dgp.ParameterMismatchError, match=r"(?s)predict_from_samples \(params\).*unexpected .*'nosie'"):
        dgp.predict_from_samples(model, samples, jax.random.PRNGKey(0), X[:3], params=fixed)
    pred = dgp.predict_from_samples(model, samples, jax.random.PRNGKey(0), X[:3], params=fixed, strict=False)
    assert pred.mean.shape == (3,)


def test_latent_layer_samples_at_new_inputs_are_refused():
    """``Predictive(latent_conditionals(model), mcmc_samples)`` at new inputs used to fail with
    'mul got incompatible shapes'."""
    rs = np.random.RandomState(0)
    X, y = jnp.asarray(rs.uniform(-1, 1, (12, 1))), jnp.asarray(rs.randn(12))
    model = dgp.handlers.latent_conditionals(deep_gp_regression(2, num_inducing=3))
    mcmc = MCMC(NUTS(model), num_warmup=3, num_samples=2, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    with pytest.raises(ValueError, match=r"latent layer output 'h1.f_white' has shape \(1, 12\).*5 points.*"
                                         r"predict_from_samples"):
        Predictive(model, mcmc.get_samples())(jax.random.PRNGKey(1), X[:5])


@pytest.mark.parametrize("build, error, match", [
    (lambda: deep_gp_regression(0), ValueError, "deep_gp_regression: num_layers must be a positive integer"),
    (lambda: deep_gp_regression(num_inducing=0), ValueError, "deep_gp_regression: num_inducing must be a positive"),
    (lambda: deep_gp_regression(hidden_width=2.5), ValueError, "deep_gp_regression: hidden_width must be"),
    (lambda: deep_gp_regression(noise_init=float("nan")), ValueError, "deep_gp_regression: noise_init must be"),
    (lambda: deep_gp_regression(jitter=-1e-6), ValueError, "deep_gp_regression: jitter must be"),
    (lambda: deep_gp_regression(kernel="rbf"), TypeError, "deep_gp_regression: kernel must be"),
    (lambda: deep_gp_regression(inner_mean="cubic"), ValueError, "deep_gp_regression: inner_mean must be"),
    (lambda: diffgp(T=-1.0), ValueError, "diffgp: T must be a finite non-negative number"),
    (lambda: diffgp(num_steps=0), ValueError, "diffgp: num_steps must be a positive integer"),
    (lambda: amortized_dgp(num_inducing=(8, 0, 4)), ValueError, r"amortized_dgp: num_inducing\[1\] must be"),
    (lambda: amortized_dgp(widths=(0, 4, 1)), ValueError, r"amortized_dgp: widths\[0\] must be a positive integer"),
    (lambda: amortized_dgp(widths=(4, 2)), ValueError, "amortized_dgp: widths and num_inducing need one entry per"),
    (lambda: diffgp(flow_kernel=3), TypeError, "diffgp: flow_kernel must be a numpyro_dgp.kernels.Kernel"),
    (lambda: diffgp(time_input=True), ValueError, "diffgp: time_input=True needs flow_inducing_inputs"),
])
def test_model_factories_validate_their_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_fit_and_predict_validate_their_arguments(data, fitted):
    X, y = data
    model, guide, params = fitted
    _, svi = make_svi(model)
    key = jax.random.PRNGKey(0)
    for kwargs, match in [(dict(num_steps=0), "num_steps must be a positive integer"),
                          (dict(num_steps=5, chunk_size=-1), "chunk_size must be a positive integer"),
                          (dict(num_steps=5, checkpoint_every=0), "checkpoint_every must be a positive integer"),
                          (dict(num_steps=5, average_from=5), r"average_from must be an integer in \[0, num_steps\)"),
                          (dict(num_steps=5, init_state=object(), init_params={}), "give init_state.*not both")]:
        with pytest.raises(ValueError, match=f"fit: {match}"):
            dgp.fit(svi, key, X, y, progress_bar=False, **kwargs)
    with pytest.raises(ValueError, match="predict: num_samples must be a positive integer"):
        dgp.predict(model, guide, params, key, X, num_samples=0)
    with pytest.raises(ValueError, match=r"predict: X_new must have shape \(num_points, dim\)"):
        dgp.predict(model, guide, params, key, X[0])


@pytest.mark.parametrize("argv, match", [
    (["--lr", "-1"], "argument --lr: must be a finite positive number, got '-1'"),
    (["--lr", "0"], "argument --lr: must be a finite positive number"),
    (["--lr", "nan"], "argument --lr: must be a finite positive number"),
    (["--steps", "0"], "argument --steps: must be a positive integer, got '0'"),
    (["--num-inducing", "ten"], "argument --num-inducing: must be a positive integer, got 'ten'"),
    (["--batch-size", "-5"], "argument --batch-size: must be a positive integer"),
    (["--layers", "1.5"], "argument --layers: must be a positive integer"),
    (["--splits", "-1"], "argument --splits: '-1' is not a split index or a range"),
    (["--splits", "3-1"], "argument --splits: the range '3-1' is empty"),
    (["--splits", "a"], "argument --splits: 'a' is not a split index or a range"),
    (["--splits", ","], "argument --splits: no split indices"),
])
def test_command_line_refuses_bad_numbers_naming_the_argument(argv, match, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["uci", "--dataset", "yacht", *argv])
    assert exit_.value.code == 2
    assert match in capsys.readouterr().err


def test_command_line_reports_num_inducing_above_the_training_set(capsys, uci_data_dir):
    code = cli.main(["uci", "--dataset", "yacht", "--num-inducing", "5000", "--data-dir", str(uci_data_dir)])
    assert code == 2
    err = capsys.readouterr().err
    assert "--num-inducing 5000 exceeds the 277 training points of yacht" in err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--seed", "-3"])
    assert exit_.value.code == 2 and "argument --seed: must be an integer >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("build, match", [
    (lambda: dgp.handlers.sde_flow(deep_gp_regression(2), layer="h1", num_steps=True), "sde_flow: num_steps"),
    (lambda: dgp.handlers.quadrature(deep_gp_regression(2), num_points=True), "quadrature: num_points"),
    (lambda: dgp.infer.SGHMC(deep_gp_regression(2), window_size=True), "SGHMC: window_size"),
    (lambda: dgp.guides.AutoAmortizedDGP(deep_gp_regression(2), num_branches=True), "AutoAmortizedDGP: num_branches"),
    (lambda: dgp.guides.AutoAmortizedDGP(deep_gp_regression(2), hidden_width=2.0), "AutoAmortizedDGP: hidden_width"),
    (lambda: dgp.infer.natural_gradient_ramp(num_steps=True), "natural_gradient_ramp: num_steps"),
])
def test_counts_refuse_booleans_and_floats(build, match):
    # one helper checks every count: True is an int to Python, but no user means one step by it
    with pytest.raises(ValueError, match=f"{match} must be a positive integer"):
        build()


def test_layer_and_prediction_counts_refuse_booleans(data, fitted):
    X, _ = data
    model, guide, params = fitted
    layer_model = lambda X: dgp.gp_layer("f", X, dgp.kernels.SquaredExponential(), num_inducing=2, out_dim=True)  # noqa: E731
    with pytest.raises(ValueError, match="gp_layer 'f': out_dim must be a positive integer"):
        numpyro.handlers.seed(layer_model, 0)(X)
    no_count = lambda X: dgp.gp_layer("f", X, dgp.kernels.SquaredExponential(), num_inducing=True)  # noqa: E731
    with pytest.raises(ValueError, match="gp_layer 'f': give num_inducing"):
        numpyro.handlers.seed(no_count, 0)(X)
    for kwargs, name in [(dict(num_samples=True), "num_samples"), (dict(batch_size=0), "batch_size")]:
        with pytest.raises(ValueError, match=f"predict: {name} must be a positive integer"):
            dgp.predict(model, guide, params, jax.random.PRNGKey(0), X, **kwargs)


def test_tree_all_finite_reads_every_floating_leaf_and_skips_counters():
    # the guard fit, fit_minibatches and SGHMC skip an update by
    tree = {"a": jnp.ones(3), "b": (jnp.zeros((2, 2)), jnp.array(7, jnp.int32))}
    assert bool(_validation.tree_all_finite(tree)) and bool(_validation.tree_all_finite())
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        broken = {**tree, "b": (jnp.zeros((2, 2)).at[1, 0].set(bad), tree["b"][1])}
        assert not bool(_validation.tree_all_finite(tree, broken))
        assert not bool(jax.jit(_validation.tree_all_finite)(broken))


@pytest.mark.parametrize("call, error, match", [
    (lambda: _validation.check_choice("qr", ("chol", "eig"), "method", "f"), ValueError,
     r"f: method must be one of \('chol', 'eig'\), got 'qr'"),
    (lambda: _validation.check_choice([1], {"a": 1}, "mode", "f", NotImplementedError), NotImplementedError,
     r"f: mode must be one of \('a',\), got \[1\]"),
    (lambda: _validation.check_mapping({}, "inputs", "f"), ValueError, "f: inputs must be a non-empty dict"),
    (lambda: _validation.check_mapping([1], "inputs", "f"), ValueError, "must be a non-empty dict, got list"),
])
def test_generic_checks_fire_with_the_argument_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_generic_checks_pass_what_they_accept():
    _validation.check_choice("eig", ("chol", "eig"), "method", "f")
    _validation.check_mapping({"a": 1}, "inputs", "f")
