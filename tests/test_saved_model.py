"""Whole-model save and load (save_model, load_model), batched prediction, predictive quantiles."""

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import SVI
from numpyro.optim import Adam

import numpyro_dgp as dgp
from numpyro_dgp.kernels import Matern52


def _data(n=120, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    return X, y


def _fitted(model, guide, X, y, steps=20):
    svi = SVI(model, guide, Adam(0.01), dgp.DGPElbo())
    return dgp.fit(svi, jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y), num_steps=steps,
                   progress_bar=False).params


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    X, y = _data()
    s = dgp.Standardization.fit(X * 3 + 1, y * 2 - 5)
    model = dgp.models.deep_gp_regression(2, num_inducing=8, kernel=Matern52(variance=0.5))
    guide = dgp.guides.AutoFactorizedDGP(model)
    params = _fitted(model, guide, X, y)
    path = tmp_path_factory.mktemp("models") / "m"
    dgp.save_model(path, model, guide, params, input_dim=3, standardization=s, feature_names=["a", "b", "c"],
                   target_name="t", metadata={"note": "test"})
    return path, model, guide, params, X, s


def test_round_trip_predicts_as_the_fitted_model(saved):
    path, model, guide, params, X, s = saved
    loaded = dgp.load_model(path)
    assert loaded.feature_names == ["a", "b", "c"] and loaded.target_name == "t"
    assert loaded.config["metadata"] == {"note": "test"}
    assert set(loaded.params) == set(params)
    for k in params:
        np.testing.assert_array_equal(np.asarray(loaded.params[k]), np.asarray(params[k]))
    X_raw = X[:15] * s.x_scale + s.x_mean
    got = loaded.predict(X_raw, rng_key=jax.random.PRNGKey(3))
    ref = dgp.predict(model, guide, params, jax.random.PRNGKey(3), jnp.asarray(X[:15]))
    np.testing.assert_allclose(got.mean, ref.mean * s.y_scale + s.y_mean, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.variance, ref.variance * s.y_scale**2, rtol=1e-10)


def test_model_json_is_human_readable(saved):
    config = json.loads((saved[0] / "model.json").read_text())
    assert config["format_version"] == 1 and config["model"]["factory"] == "deep_gp_regression"
    assert config["model"]["arguments"]["kernel"]["__kernel__"]["type"] == "Matern52"
    assert config["guide"]["class"] == "AutoFactorizedDGP"
    assert len(config["standardization"]["x_mean"]) == 3


def test_load_in_a_fresh_process(saved, tmp_path):
    path = saved[0]
    script = textwrap.dedent(f"""
        import jax, numpy as np
        jax.config.update("jax_enable_x64", True)
        import numpyro_dgp as dgp
        m = dgp.load_model({str(path)!r})
        p = m.predict(np.zeros((4, 3)), rng_key=jax.random.PRNGKey(3))
        print(repr([float(v) for v in p.mean]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    here = dgp.load_model(path).predict(np.zeros((4, 3)), rng_key=jax.random.PRNGKey(3))
    np.testing.assert_allclose(eval(out.stdout.strip().splitlines()[-1]), np.asarray(here.mean), rtol=1e-12)


def _copy(path, tmp_path):
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(path, target)
    return target


def test_corrupted_params_are_refused(saved, tmp_path):
    target = _copy(saved[0], tmp_path)
    data = bytearray((target / "params.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (target / "params.npz").write_bytes(bytes(data))
    with pytest.raises(dgp.ModelFileError, match="corrupted or was replaced"):
        dgp.load_model(target)


def test_missing_files_are_refused(saved, tmp_path):
    target = _copy(saved[0], tmp_path)
    (target / "params.npz").unlink()
    with pytest.raises(dgp.ModelFileError, match="no params.npz"):
        dgp.load_model(target)
    (target / "model.json").unlink()
    with pytest.raises(dgp.ModelFileError, match="no model.json"):
        dgp.load_model(target)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        dgp.load_model(tmp_path / "nowhere")


def test_unknown_format_version_and_bad_json_are_refused(saved, tmp_path):
    target = _copy(saved[0], tmp_path)
    config = json.loads((target / "model.json").read_text())
    config["format_version"] = 99
    (target / "model.json").write_text(json.dumps(config))
    with pytest.raises(dgp.ModelFileError, match="format_version=99.*upgrade numpyro_dgp"):
        dgp.load_model(target)
    (target / "model.json").write_text("{not json")
    with pytest.raises(dgp.ModelFileError, match="not valid JSON"):
        dgp.load_model(target)


def test_library_versions_are_checked(saved, tmp_path):
    target = _copy(saved[0], tmp_path)
    config = json.loads((target / "model.json").read_text())
    # a newer library's model that this one cannot build: the error says to upgrade
    newer = dict(config, library_version="99.0.0",
                 model=dict(config["model"], arguments=dict(config["model"]["arguments"], depth_schedule="cosine")))
    (target / "model.json").write_text(json.dumps(newer))
    with pytest.raises(dgp.ModelFileError, match=r"cannot build.*written by numpyro_dgp 99\.0\.0, newer than this "
                                                  r"library.*upgrade numpyro_dgp"):
        dgp.load_model(target)
    # ... or whose parameters do not fit what this one builds
    newer = dict(config, library_version="99.0.0",
                 model=dict(config["model"], arguments=dict(config["model"]["arguments"], num_inducing=9)))
    (target / "model.json").write_text(json.dumps(newer))
    with pytest.raises(dgp.ParameterMismatchError, match=r"written by numpyro_dgp 99\.0\.0.*upgrade"):
        dgp.load_model(target)
    # an older library's model loads (same format version); a missing or garbled version is corruption
    (target / "model.json").write_text(json.dumps(dict(config, library_version="0.0.1")))
    assert dgp.load_model(target).params.keys() == saved[3].keys()
    for bad in ["", "latest", 3]:
        (target / "model.json").write_text(json.dumps(dict(config, library_version=bad)))
        with pytest.raises(dgp.ModelFileError, match="corrupted.*library_version"):
            dgp.load_model(target)
    del config["library_version"]
    (target / "model.json").write_text(json.dumps(config))
    with pytest.raises(dgp.ModelFileError, match="corrupted.*'library_version'"):
        dgp.load_model(target)


def test_a_model_json_this_library_cannot_build_is_refused(saved, tmp_path):
    target = _copy(saved[0], tmp_path)
    config = json.loads((target / "model.json").read_text())
    kernel = config["model"]["arguments"]["kernel"]
    for changed, match in [
        (dict(config, format="other.model"), "does not describe a numpyro_dgp model"),
        (dict(config, model=dict(config["model"], factory="my_factory")), "unknown model factory 'my_factory'"),
        (dict(config, guide=dict(config["guide"], **{"class": "MyGuide"})), "guide class 'MyGuide'"),
        (dict(config, model=dict(config["model"], arguments=dict(
            config["model"]["arguments"], kernel={"__kernel__": dict(kernel["__kernel__"], type="Nope")}))),
         "cannot build: unknown kernel type 'Nope'"),
        (dict(config, model=dict(config["model"], arguments=dict(config["model"]["arguments"], kernel={"x": 1}))),
         "cannot build: unknown encoded value"),
    ]:
        (target / "model.json").write_text(json.dumps(changed))
        with pytest.raises(dgp.ModelFileError, match=match):
            dgp.load_model(target)
    with pytest.raises(dgp.ModelFileError, match="is a file; a model is a directory"):
        dgp.load_model(target / "model.json")


def test_save_model_refuses_what_it_cannot_record(tmp_path):
    model = dgp.models.deep_gp_regression(1, num_inducing=2)
    guide = dgp.guides.AutoFactorizedDGP(model)
    with pytest.raises(ValueError, match="save_model: 1 feature_names for input_dim=3"):
        dgp.save_model(tmp_path / "m", model, guide, {}, input_dim=3, feature_names=["a"])
    from numpyro.infer.autoguide import AutoNormal

    with pytest.raises(TypeError, match="one of the library's guides"):
        dgp.save_model(tmp_path / "m", model, AutoNormal(model), {}, input_dim=3)
    amortized = dgp.models.amortized_dgp()
    with_points = dgp.guides.AutoAmortizedDGP(amortized, points={"h1": np.zeros((32, 16))})
    with pytest.raises(TypeError, match="built with points= cannot be saved"):
        dgp.save_model(tmp_path / "m", amortized, with_points, {}, input_dim=3)
    with pytest.raises(ValueError, match=r"X must be a non-empty \(N, D\) array, got shape \(3,\)"):
        dgp.Standardization.fit(np.zeros(3))
    assert not (tmp_path / "m").exists()


def test_mismatched_shapes_are_refused(saved, tmp_path):
    target = _copy(saved[0], tmp_path)
    config = json.loads((target / "model.json").read_text())
    config["model"]["arguments"]["num_inducing"] = 9  # the parameters hold M = 8
    (target / "model.json").write_text(json.dumps(config))
    with pytest.raises(dgp.ParameterMismatchError, match="mis-shaped"):
        dgp.load_model(target)


def test_save_refuses_an_existing_directory_and_user_models(saved, tmp_path):
    path, model, guide, params, *_ = saved
    with pytest.raises(FileExistsError, match="overwrite=True"):
        dgp.save_model(path, model, guide, params, input_dim=3)

    def my_model(X, y=None):
        pass

    with pytest.raises(TypeError, match="save_params"):
        dgp.save_model(tmp_path / "x", my_model, guide, params, input_dim=3)
    assert not (tmp_path / "x").exists()
    dgp.save_model(path.parent / "m2", model, guide, params, input_dim=3)
    dgp.save_model(path.parent / "m2", model, guide, params, input_dim=3, overwrite=True)
    assert sorted(p.name for p in (path.parent / "m2").iterdir()) == ["model.json", "params.npz"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary left


# The other factories' round trips (probit, amortized; DiffGP with --runslow) at every
# prediction size: tests/test_model_kinds.py::test_saved_kind_predicts_at_every_size.


def test_batched_prediction_equals_unbatched_for_one_layer():
    X, y = _data(n=80)
    model = dgp.models.deep_gp_regression(1, num_inducing=8)
    guide = dgp.guides.AutoFactorizedDGP(model)
    params = _fitted(model, guide, X, y)
    key = jax.random.PRNGKey(2)
    full = dgp.predict(model, guide, params, key, jnp.asarray(X), num_samples=4)
    batched = dgp.predict(model, guide, params, key, jnp.asarray(X), num_samples=4, batch_size=30)
    np.testing.assert_allclose(batched.mean, full.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(batched.variance, full.variance, rtol=1e-12)
    assert batched.layers["h1"].shape == full.layers["h1"].shape
    lean = dgp.predict(model, guide, params, key, jnp.asarray(X), num_samples=4, batch_size=30, keep_layers=False)
    assert lean.layers == {} and lean.layer_means == {}
    np.testing.assert_allclose(lean.mean, full.mean, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="batch_size"):
        dgp.predict(model, guide, params, key, jnp.asarray(X), batch_size=0)


def test_batched_prediction_is_the_windows_predicted_alone():
    # batches of 30 over 80 points: windows [0, 30), [30, 60) and the last one shifted back to
    # [50, 80) (no padding); every window is predicted as predict() predicts it alone, with
    # the same key, and the later window wins where two overlap. (Every model kind's windows,
    # amortized branches included, field by field: tests/test_model_kinds.py.)
    X, y = _data(n=80)
    model = dgp.models.deep_gp_regression(2, num_inducing=8)
    guide = dgp.guides.AutoFactorizedDGP(model)
    params = _fitted(model, guide, X, y, steps=5)
    key = jax.random.PRNGKey(3)
    batched = dgp.predict(model, guide, params, key, jnp.asarray(X), num_samples=5, batch_size=30)
    for lo, hi, keep in [(0, 30, slice(0, 30)), (30, 60, slice(30, 50)), (50, 80, slice(50, 80))]:
        alone = dgp.predict(model, guide, params, key, jnp.asarray(X[lo:hi]), num_samples=5)
        part = slice(keep.start - lo, keep.stop - lo)
        for got, want in [(batched.mean, alone.mean), (batched.variance, alone.variance)]:
            np.testing.assert_allclose(got[keep], want[part], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(batched.component_means[:, keep], alone.component_means[:, part], rtol=1e-12,
                                   atol=1e-14)
        for name in alone.layers:
            np.testing.assert_allclose(batched.layers[name][..., keep, :], alone.layers[name][..., part, :],
                                       rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(batched.layer_variances[name][..., keep, :],
                                       alone.layer_variances[name][..., part, :], rtol=1e-12, atol=1e-14)
        if alone.weights is not None:
            np.testing.assert_allclose(batched.weights, alone.weights, rtol=1e-12)
    assert batched.component_means.shape == (batched.component_means.shape[0], 80)


def test_predictive_quantiles_of_one_gaussian():
    p = dgp.Prediction(jnp.array([1.0]), jnp.array([4.0]), jnp.array([[1.0]]), jnp.array([[4.0]]), {}, {}, {})
    q = dgp.predictive_quantiles(p, [0.025, 0.5, 0.975])
    np.testing.assert_allclose(q[:, 0], [1 - 2 * 1.959963984540054, 1.0, 1 + 2 * 1.959963984540054], rtol=1e-9)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        dgp.predictive_quantiles(p, [1.5])


@pytest.mark.parametrize("likelihood", ["student_t", "heteroscedastic", "softmax", "robust_max", "poisson",
                                        "negative_binomial", "gaussian-2"])
def test_saved_models_of_other_likelihoods_predict_in_the_data_s_units(likelihood, tmp_path):
    X, y = _data(n=40)
    options = {"student_t": dict(likelihood="student_t"), "heteroscedastic": dict(likelihood="heteroscedastic"),
               "softmax": dict(likelihood="softmax", num_classes=3),
               "robust_max": dict(likelihood="robust_max", num_classes=3), "poisson": dict(likelihood="poisson"),
               "negative_binomial": dict(likelihood="negative_binomial"), "gaussian-2": dict(num_outputs=2)}[likelihood]
    model = dgp.models.deep_gp_regression(1, num_inducing=4, **options)
    guide = dgp.guides.AutoFactorizedDGP(model)
    unscaled = likelihood in ("softmax", "robust_max", "poisson", "negative_binomial")  # labels and counts
    if unscaled:
        y_fit, s = (np.arange(40) % 3), dgp.Standardization(np.zeros(3), np.ones(3))
    elif likelihood == "gaussian-2":
        y_fit = np.stack([y, -y], 1)
        s = dgp.Standardization(np.zeros(3), np.ones(3), np.array([5.0, -1.0]), np.array([2.0, 0.5]))
    else:
        y_fit, s = y, dgp.Standardization(np.zeros(3), np.ones(3), 5.0, 2.0)
    params = _fitted(model, guide, X, y_fit, steps=3)
    dgp.save_model(tmp_path / "m", model, guide, params, input_dim=3, standardization=s)
    loaded = dgp.load_model(tmp_path / "m")
    assert loaded.likelihood == options.get("likelihood", "gaussian")
    ours = loaded.predict(X[:5], rng_key=jax.random.PRNGKey(3), num_samples=4)
    plain = dgp.predict(model, guide, params, jax.random.PRNGKey(3), jnp.asarray(X[:5]), num_samples=4)
    if unscaled:  # classes and counts are not standardized
        np.testing.assert_allclose(ours.mean, plain.mean, rtol=1e-12)
        np.testing.assert_allclose(dgp.log_likelihood(ours, y_fit[:5]), dgp.log_likelihood(plain, y_fit[:5]),
                                   rtol=1e-12)
        return
    shift, scale = np.asarray(s.y_mean), np.asarray(s.y_scale)
    np.testing.assert_allclose(ours.mean, plain.mean * scale + shift, rtol=1e-10)
    np.testing.assert_allclose(ours.variance, plain.variance * scale**2, rtol=1e-10)
    # densities of the data's units: those of the standardized targets, over the scale
    y_data = y_fit[:5] * scale + shift
    np.testing.assert_allclose(dgp.log_likelihood(ours, y_data),
                               np.asarray(dgp.log_likelihood(plain, y_fit[:5])) - np.sum(np.log(scale) * np.ones(shift.shape)),
                               rtol=1e-10)
    quantiles = np.asarray(dgp.predictive_quantiles(ours, [0.5]))[0]
    np.testing.assert_allclose(quantiles, np.asarray(dgp.predictive_quantiles(plain, [0.5]))[0] * scale + shift,
                               rtol=1e-8, atol=1e-8)


def test_a_corrupted_standardization_and_what_cannot_be_written_are_refused(saved, tmp_path):
    target = _copy(saved[0], tmp_path)
    config = json.loads((target / "model.json").read_text())
    config["standardization"]["x_scale"] = [0.0, 1.0, 1.0]
    (target / "model.json").write_text(json.dumps(config))
    with pytest.raises(dgp.ModelFileError, match=r"is corrupted: load_model: standardization.x_scale must"):
        dgp.load_model(target)
    path, model, guide, params, *_ = saved
    with pytest.raises(TypeError, match="save_model: metadata must be JSON-serializable"):
        dgp.save_model(tmp_path / "m", model, guide, params, input_dim=3, metadata={"f": object()})
    (tmp_path / "file").write_text("mine")
    with pytest.raises(FileExistsError, match="is a file, not a model directory"):
        dgp.save_model(tmp_path / "file", model, guide, params, input_dim=3, overwrite=True)
    assert (tmp_path / "file").read_text() == "mine" and not (tmp_path / "m").exists()
