"""Guards that no other test made fire: one test each.

``python tests/guard_coverage.py`` listed these ``raise`` statements as never executed by the
suite. Each protects users from a silent wrong answer (a missing site, a model that does not
match its guide, mismatched parameters or files, a non-finite value). Every test builds the
smallest model that reaches its guard (6 inputs, 2 inducing points, no training) and checks
the error's type and message.

One guard is reached through a private function: ``DGPElbo``'s check that a chained layer's
parent ran before it (``objectives/_dsvi.py``) is shadowed, through the public entry points,
by ``marginalize_inducing``'s check of the same condition, which fires first.
"""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import numpyro
import numpyro.contrib.funsor as funsor
import numpyro.distributions as dist
import pytest
from numpyro.handlers import block, seed, substitute, trace
from numpyro.infer import SVI
from numpyro.infer.autoguide import AutoNormal

import numpyro_dgp as dgp
from numpyro_dgp import diagnostics
from numpyro_dgp._engine.marginal import marginalize_inducing
from numpyro_dgp._engine.run import layers_by_u_site
from numpyro_dgp.guides import AutoChainDGP, AutoFactorizedDGP, AutoJointDGP
from numpyro_dgp.handlers import (
    collapse_last_layer,
    exact_layers,
    layer_inputs,
    quadrature,
    sde_flow,
)
from numpyro_dgp.infer import fit_minibatches
from numpyro_dgp.io import load_params, save_params
from numpyro_dgp.models import deep_gp_regression
from numpyro_dgp.objectives._dsvi import inducing_kl

X = jnp.linspace(-1.0, 1.0, 6)[:, None]
Y = jnp.sin(2.0 * X[:, 0])
KEY = jax.random.PRNGKey(0)


def _layer(name, h, **kwargs):
    """A small layer: identity mean for inner layers, zero mean for the last ("f")."""
    mean = "zero" if name == "f" else "identity"
    return dgp.gp_layer(name, h, dgp.kernels.RBF(), num_inducing=2, mean=mean, **kwargs)


def _observe(f, y, name="y"):
    # the points are the layer output's second-to-last axis (quadrature nodes may lead)
    with numpyro.plate("data", f.shape[-2]):
        numpyro.sample(name, dist.Normal(f[..., 0], 0.1), obs=y)


def one_layer(X, y=None):
    _observe(_layer("f", X), y)


def _init_params(model, guide, *args, **kwargs):
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    return svi.get_params(svi.init(KEY, *args, **kwargs))


def _dgp_elbo(model, guide, **kwargs):
    """DGPElbo's loss at the guide's initial parameters; ``kwargs`` go to the model at the loss only."""
    params = _init_params(model, guide, X, Y)
    return dgp.DGPElbo().loss(jax.random.PRNGKey(1), params, model, guide, X, Y, **kwargs)


def _x64_disabled():
    return jax.enable_x64(False)


# --- _engine/marginal.py ---------------------------------------------------------------------------


def test_dgp_elbo_refuses_a_model_without_gp_layer():
    """_engine/run.py model_facts: DGPElbo on a model with no gp_layer (nothing to marginalize)."""

    def plain(X, y=None):
        m = numpyro.sample("m", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(m, 1.0), obs=y)

    guide = AutoNormal(plain)
    params = _init_params(plain, guide, X, Y)
    with pytest.raises(ValueError, match="the model has no gp_layer: DGPElbo and predict need"):
        dgp.DGPElbo().loss(KEY, params, plain, guide, X, Y)


def test_marginalize_refuses_unbranched_inputs_after_a_branching_layer():
    """_engine/marginal.py _branch_spec: a layer fed the unbranched inputs after another layer branched them."""

    def model(X, y=None):
        with quadrature(num_points=3, learnable=False):
            _layer("h1", X)
        _observe(_layer("f", X), y)  # X, not the branched h1

    with pytest.raises(ValueError, match="layer 'f' runs on unbranched inputs after another layer branched them"):
        _dgp_elbo(model, AutoFactorizedDGP(model))


def test_marginalize_refuses_layers_with_different_numbers_of_branches():
    """_engine/marginal.py _branch_spec: two layers with different numbers of quadrature branches."""

    def model(X, y=None):
        with quadrature(num_points=3, learnable=False):
            _layer("h1", X)
        with quadrature(num_points=2, learnable=False):
            _layer("h2", X)
        _observe(_layer("f", X), y)

    with pytest.raises(ValueError, match="layer 'h2' has 2 branches, an earlier layer 3"):
        _dgp_elbo(model, AutoFactorizedDGP(model))


def _ordered(X, y=None, order=("h1", "h2", "f")):
    h = X
    for name in order:
        h = _layer(name, h)
    _observe(h, y)


def test_marginalize_refuses_a_chain_whose_parent_has_not_run():
    """guides/_correlated.py CorrelatedRecursion._belief: a chain guide's child layer run before its parent (layers reordered)."""
    with pytest.raises(ValueError, match="the guide chains 'h2.u' to 'h1.u', but layer 'h1.u' has not run before it"):
        _dgp_elbo(_ordered, AutoChainDGP(_ordered), order=("h2", "h1", "f"))


def test_marginalize_refuses_layers_out_of_the_joint_guides_order():
    """guides/_correlated.py CorrelatedRecursion._belief: a joint guide's layers run in another order than the guide's Gaussian."""
    with pytest.raises(ValueError, match=r"joint Gaussian orders the layers \('h1.u', 'h2.u', 'f.u'\); 'h2.u' ran out"):
        _dgp_elbo(_ordered, AutoJointDGP(_ordered), order=("h2", "h1", "f"))


def test_marginalize_refuses_a_chained_layer_at_other_points():
    """_engine/marginal.py _correlated: a chain guide's layer run at other points than its parent."""

    def model(X, y=None):
        h = _layer("h1", X)
        _observe(_layer("f", h[:-1]), None if y is None else y[:-1])

    with pytest.raises(ValueError, match="layer 'f' runs at 5 points but the layer before it in the guide's chain ran at 6"):
        _dgp_elbo(model, AutoChainDGP(model))


# --- objectives ------------------------------------------------------------------------------


def test_dgp_elbo_inducing_kl_refuses_a_chain_parent_not_run_before():
    """objectives/_dsvi.py _chain_link_kl: a chained site whose parent's KL term was not seen (a wrong KL)."""

    def model(X, y=None):
        _observe(_layer("f", _layer("h1", X)), y)

    guide = AutoChainDGP(model)
    params = _init_params(model, guide, X, Y)
    guide_trace = trace(seed(numpyro.handlers.substitute(guide, data=params), 0)).get_trace(X, Y)
    model_trace = trace(seed(model, 0)).get_trace(X, Y)
    # the parent's marginal covariance is missing: 'h1.u' did not come first
    with pytest.raises(ValueError, match="DGPElbo: the guide chains 'f.u' to 'h1.u', which the model did not run before it"):
        inducing_kl("f.u", model_trace["f.u"], guide_trace["f.u"], layers_by_u_site(model_trace), False, {})


def test_dgp_elbo_refuses_a_joint_guide_over_layers_the_model_did_not_run():
    """objectives/_dsvi.py inducing_kl: a joint guide covering a layer the model skipped (its KL would be wrong)."""

    def model(X, y=None, run_f=True):
        h = _layer("h1", X)
        _observe(_layer("f", h) if run_f else h, y)

    with pytest.raises(ValueError, match=r"DGPElbo: the guide's joint Gaussian covers \['f.u'\], which the model did not run"):
        _dgp_elbo(model, AutoJointDGP(model), run_f=False)


def test_dgp_elbo_refuses_a_latent_site_after_the_last_layer():
    """objectives/_dsvi.py _check_other_site: a latent site after the last layer (quadrature would mis-score it)."""

    def model(X, y=None):
        f = _layer("f", X)
        s = numpyro.sample("s", dist.LogNormal(0.0, 1.0))
        _observe(f * s, y)

    with pytest.raises(ValueError, match="DGPElbo: latent site 's' comes after the last GP layer"):
        _dgp_elbo(model, AutoFactorizedDGP(model))


def test_dgp_elbo_refuses_a_latent_site_the_guide_does_not_cover():
    """objectives/_dsvi.py _check_other_site: a latent site the guide does not sample (log q missing)."""

    def model(X, y=None):
        s = numpyro.sample("s", dist.Normal(0.0, 1.0))
        _observe(_layer("f", X + s), y)

    with pytest.raises(ValueError, match="DGPElbo: latent site 's' is not covered by the guide"):
        _dgp_elbo(model, AutoFactorizedDGP(block(model, hide=["s"])))
    # the nested bound names itself (it shares the check)
    guide = AutoFactorizedDGP(block(model, hide=["s"]))
    params = _init_params(model, guide, X, Y)
    with pytest.raises(ValueError, match="NestedCompressionElbo: latent site 's' is not covered by the guide"):
        dgp.NestedCompressionElbo().loss(jax.random.PRNGKey(1), params, model, guide, X, Y)


def test_collapsed_refuses_a_latent_site_the_guide_does_not_cover():
    """objectives/_collapsed.py _check_guide_sites (CollapsedSparseGP): a latent site the guide does not sample."""

    def model(X, y=None):
        s = numpyro.sample("s", dist.LogNormal(0.0, 1.0))
        f = _layer("f", X)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f[..., 0], s), obs=y)

    with pytest.raises(ValueError, match="CollapsedSparseGP: latent site 's' is not covered by the guide"):
        dgp.CollapsedSparseGP().loss(KEY, {}, model, lambda *args, **kwargs: None, X, Y)


def test_collapsed_refuses_observations_of_another_shape():
    """objectives/_collapsed.py collapse_sparse_layer: observations that do not match the layer's outputs."""

    def model(X, y=None):
        numpyro.sample("y", dist.Normal(_layer("f", X), 0.1).to_event(2), obs=y)

    with pytest.raises(ValueError, match=r"CollapsedSparseGP: observation site 'y' has shape \(6, 2\); layer 'f' puts 1 output"):
        dgp.CollapsedSparseGP().loss(KEY, {}, model, lambda *args, **kwargs: None, X, jnp.stack([Y, Y], -1))


def _nested_loss(model):
    guide = AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.NestedCompressionElbo())
    params = svi.get_params(svi.init(KEY, X, Y))
    return dgp.NestedCompressionElbo().loss(KEY, params, model, guide, X, Y)


def test_nested_refuses_a_model_without_observations_after_the_last_layer():
    """objectives/_collapsed.py _tail_scale: no observed site after the last layer (no likelihood term)."""

    def model(X, y=None):
        _layer("f", X)

    with pytest.raises(ValueError, match="NestedCompressionElbo: no observed sample site follows the last gp_layer"):
        _nested_loss(model)


def test_nested_refuses_observation_sites_scaled_differently():
    """objectives/_collapsed.py _tail_scale: observation sites after the last layer with different plate scales."""

    def model(X, y=None):
        f = _layer("f", X)
        _observe(f, y)
        with numpyro.handlers.scale(scale=2.0):
            _observe(f, y, name="y2")

    with pytest.raises(ValueError, match=r"observation sites after the last layer \['y', 'y2'\] are scaled differently"):
        _nested_loss(model)


# --- _predict/prediction.py --------------------------------------------------------------------------


def two_observations(X, y=None):
    f = _layer("f", X)
    _observe(f, y)
    _observe(f, y, name="y2")


@pytest.fixture(scope="module")
def two_observations_fit():
    guide = AutoFactorizedDGP(two_observations)
    return guide, _init_params(two_observations, guide, X, Y)


def test_predict_refuses_to_guess_among_several_observation_sites(two_observations_fit):
    """_predict/prediction.py observation_of: several sample sites after the last layer and no obs_site."""
    guide, params = two_observations_fit
    with pytest.raises(ValueError, match=r"predict: cannot tell the observation site; sample sites after the last layer: \['y', 'y2'\]"):
        dgp.predict(two_observations, guide, params, KEY, X, num_samples=2)


def test_predict_refuses_an_obs_site_that_is_not_after_the_last_layer(two_observations_fit):
    """_predict/prediction.py observation_of: an obs_site not a sample site after the last layer (a typo)."""
    guide, params = two_observations_fit
    with pytest.raises(ValueError, match="predict: obs_site 'z' is not a sample site after the last GP layer"):
        dgp.predict(two_observations, guide, params, KEY, X, num_samples=2, obs_site="z")


def test_predict_from_samples_refuses_a_model_without_gp_layer():
    """_predict/variants.py _probe (predict_from_samples): a model that runs no gp_layer."""

    def plain(X, y=None):
        m = numpyro.sample("m", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(m, 1.0), obs=y)

    with pytest.raises(ValueError, match="predict_from_samples: the model runs no gp_layer"):
        dgp.predict_from_samples(plain, {"m": jnp.zeros(2)}, KEY, X)


def test_moment_matched_prediction_refuses_x_new_of_another_shape():
    """_predict/prediction.py checked_test_inputs, for predict_moment_matched: X_new that is not (num_points, dim)."""
    with pytest.raises(ValueError, match=r"predict_moment_matched: X_new must have shape \(num_points, dim\), got shape \(6,\)"):
        dgp.predict_moment_matched(one_layer, None, {}, X[:, 0])


def test_collapsed_prediction_refuses_non_finite_x_new():
    """_predict/prediction.py checked_test_inputs, for predict_collapsed: X_new with NaN (a NaN prediction otherwise)."""
    with pytest.raises(ValueError, match="predict_collapsed: X_new contains 1 NaN or inf"):
        dgp.predict_collapsed(one_layer, {}, X, Y, X.at[2, 0].set(jnp.nan))


# --- io.py ------------------------------------------------------------------------------


def test_check_params_refuses_a_guide_built_on_another_model():
    """io.py param_specs: a guide built on another model (its u shapes do not fit this model)."""
    other = deep_gp_regression(1, num_inducing=3)
    guide = AutoFactorizedDGP(other)
    params = _init_params(other, guide, X, Y)
    with pytest.raises(ValueError, match=r"the model cannot run with these arguments and this guide \(do they belong together\?\)"):
        dgp.check_params(deep_gp_regression(1, num_inducing=2), guide, params, X, Y)


def test_check_params_refuses_params_that_are_not_a_dict():
    """io.py check_params_against: params given as a list instead of {site: array}."""
    with pytest.raises(TypeError, match=r"check_params: params must be a dict \{site name: array\}, got list"):
        dgp.check_params(one_layer, None, [jnp.zeros(2)], X, Y)


# --- diagnostics -----------------------------------------------------------------------------


def test_layer_samples_refuses_samples_of_no_latent_site():
    """diagnostics/_trees.py layer_samples: samples none of whose sites the model has (a wrong dict)."""

    def plain(X):
        numpyro.sample("m", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=r"layer_samples: none of the samples' sites \['other'\] is a latent site"):
        diagnostics.layer_samples(plain, {"other": jnp.zeros(3)}, KEY, X)


def _tree(names, grid=X, draws=8):
    rng = np.random.default_rng(0)
    return diagnostics.from_layer_samples({n: rng.normal(size=(draws, grid.shape[0], 1)) for n in names}, grid,
                                          num_chains=2)


def test_layer_metrics_refuses_a_vi_result_missing_a_layer():
    """diagnostics/_compare.py layer_metrics: a VI result without some layer of the MCMC reference."""
    with pytest.raises(ValueError, match=r"layer_metrics: the VI result lacks layers \['h2'\]"):
        diagnostics.layer_metrics(_tree(["h1"]), _tree(["h1", "h2"]))


def test_compare_refuses_no_vi_result():
    """diagnostics/_compare.py compare: an empty dict of variational results."""
    with pytest.raises(ValueError, match="compare: vi must name at least one variational result"):
        diagnostics.compare({}, _tree(["h1"]), plot=False)


def test_compare_refuses_points_outside_the_grid():
    """diagnostics/_compare.py compare: summary points that are not grid indices."""
    with warnings.catch_warnings():  # 8 draws: the health report may warn about them
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"compare: points must be grid indices in \[0, 6\), got \[6\]"):
            diagnostics.compare({"vi": _tree(["h1"])}, _tree(["h1"]), points=[6], plot=False)


def test_mode_evidence_refuses_a_non_finite_log_density():
    """diagnostics/_modes.py mode_evidence: proposal draws where the model's log density is NaN."""

    def model():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0))
        numpyro.factor("broken", jnp.nan * x)

    samples = {"x": np.random.default_rng(0).normal(size=(1, 10))}
    with pytest.raises(FloatingPointError, match=r"mode_evidence: 100 of 100 proposal draws of mode \[0\] have a non-finite"):
        diagnostics.mode_evidence(model, samples, [[0]], KEY, num_draws=100)


# --- infer -----------------------------------------------------------------------------------


def _svi(model, guide=None):
    return SVI(model, guide or AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())


def test_fit_refuses_a_missing_rng_key():
    """infer/_fit.py fit: rng_key=None without init_state (nothing to initialize from)."""
    with pytest.raises(ValueError, match="fit: rng_key is None; pass a PRNG key"):
        dgp.fit(_svi(one_layer), None, X, Y, num_steps=1, progress_bar=False)


def test_fit_refuses_non_finite_initial_parameters():
    """infer/_fit.py fit: an init_state whose parameters hold NaN."""
    svi = _svi(one_layer)
    state = svi.init(KEY, X, Y)
    values = svi.optim.get_params(state.optim_state)
    name = min(values)
    bad = state._replace(optim_state=svi.optim.init({**values, name: values[name] * jnp.nan}))
    with pytest.raises(FloatingPointError, match=f"fit: initial parameters are not finite: .*{name}"):
        dgp.fit(svi, None, X, Y, num_steps=1, progress_bar=False, init_state=bad)


def singular(X, y=None, num_data=None):
    """K(Z, Z) of two equal inducing inputs with a negligible jitter: its Cholesky factor is NaN."""
    f = dgp.gp_layer("f", X, dgp.kernels.RBF(), inducing_inputs=jnp.zeros((2, 1)), jitter=1e-300,
                     learn_inducing=False)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)


def test_fit_names_the_layer_whose_cholesky_fails_at_initialization():
    """infer/_fit.py initial_state: a model that cannot be initialized because a layer's K(Z, Z) is singular."""
    with pytest.raises(ValueError, match="fit: the model cannot be initialized: the Cholesky factorization of K\\(Z, Z\\) fails in layer 'f'"):
        dgp.fit(_svi(singular, AutoNormal(singular)), KEY, X, Y, num_steps=1, progress_bar=False)


def test_fit_minibatches_refuses_a_missing_rng_key():
    """infer/_stream.py fit_minibatches: rng_key=None without init_state."""
    with pytest.raises(ValueError, match="fit_minibatches: rng_key is None"):
        fit_minibatches(_svi(singular), None, [(X, Y)], num_steps=1, num_data=6, progress_bar=False)


def test_fit_minibatches_refuses_a_fit_whose_every_update_is_non_finite():
    """infer/_stream.py fit_minibatches: every update non-finite (nothing was fitted)."""
    with pytest.raises(FloatingPointError, match="fit_minibatches: every update produced a non-finite loss or parameters"):
        fit_minibatches(_svi(singular), KEY, [(X, Y)], num_steps=1, num_data=6, progress_bar=False)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint of one Adam step of a one-layer model in float64."""
    path = tmp_path_factory.mktemp("checkpoint") / "fit.npz"
    model = deep_gp_regression(1, num_inducing=2)
    dgp.fit(_svi(model), KEY, X, Y, num_steps=1, progress_bar=False, checkpoint_path=path)
    return path


def test_resume_refuses_a_checkpoint_of_another_optimizer(checkpoint):
    """infer/_checks.py check_same_fit: resuming an SGD fit from an Adam checkpoint (before any work)."""
    model = deep_gp_regression(1, num_inducing=2)
    svi = SVI(model, AutoFactorizedDGP(model), numpyro.optim.SGD(0.01), dgp.DGPElbo())
    with pytest.raises(ValueError, match=r"written by another fit: optimizer is 'SGD\(.*\)' here, 'Adam\(.*\)' in the"):
        dgp.fit(svi, KEY, X, Y, num_steps=2, progress_bar=False, checkpoint_path=checkpoint, resume=True)


def test_resume_refuses_a_checkpoint_of_an_optimizer_with_another_state(tmp_path):
    """infer/_checks.py _identity_difference: two optax optimizers (one wrapper class, the same
    settings NumPyro sees) whose states differ: Adam's against AdaBelief's (same leaves, other types)."""
    import optax

    model = deep_gp_regression(1, num_inducing=2)

    def svi(transform):
        return SVI(model, AutoFactorizedDGP(model), numpyro.optim.optax_to_numpyro(transform), dgp.DGPElbo())

    path = tmp_path / "fit.ckpt"
    dgp.fit(svi(optax.adam(0.01)), KEY, X, Y, num_steps=1, progress_bar=False, checkpoint_path=path)
    with pytest.raises(ValueError, match=r"written by another fit: state\.structure is \.\.\..*BeliefState.* here, \.\.\..*AdamState"):
        dgp.fit(svi(optax.adabelief(0.01)), KEY, X, Y, num_steps=2, progress_bar=False, checkpoint_path=path,
                resume=True)


def test_resume_refuses_a_checkpoint_of_another_precision(checkpoint):
    """infer/_checks.py check_same_fit: resuming a float32 fit from a float64 checkpoint (before any work)."""
    with _x64_disabled():
        model = deep_gp_regression(1, num_inducing=2)
        X32, Y32 = jnp.asarray(X, jnp.float32), jnp.asarray(Y, jnp.float32)
        with pytest.raises(ValueError, match=r"written by another fit: data\.args\[0\]\.dtype is 'float32' here, 'float64'"):
            dgp.fit(_svi(model), KEY, X32, Y32, num_steps=2, progress_bar=False, checkpoint_path=checkpoint,
                    resume=True)


# --- files -----------------------------------------------------------------------------------


def test_load_model_refuses_a_float64_model_without_x64(tmp_path):
    """_saved_model.py load_model: a float64 model loaded with JAX's 64-bit mode off (silently cast otherwise)."""
    model = deep_gp_regression(1, num_inducing=2)
    guide = AutoFactorizedDGP(model)
    path = dgp.save_model(tmp_path / "model", model, guide, _init_params(model, guide, X, Y), input_dim=1)
    with _x64_disabled(), pytest.raises(ValueError, match=r"holds a float64 model; call jax.config.update\(\"jax_enable_x64\", True\)"):
        dgp.load_model(path)


def _rewrite(path, **members):
    """Replace (or, for ``None``, drop) members of a parameter file, keeping its header."""
    with np.load(path) as npz:
        stored = {name: npz[name] for name in npz.files}
    for name, value in members.items():
        if value is None:
            del stored[name]
        else:
            stored[name] = value
    with open(path, "wb") as f:
        np.savez(f, **stored)


@pytest.fixture
def params_file(tmp_path):
    path = tmp_path / "p.npz"
    save_params(path, {"a": np.ones(3), "b": np.ones(2, ml_dtypes.bfloat16)})
    with np.load(path) as npz:  # the members are named in the header, as written
        header = json.loads(str(npz["__numpyro_dgp_header__"][()]))
    names = {key: node["name"] for key, node in header["tree"]["items"]}
    return path, names


def test_load_params_refuses_a_file_missing_an_array(params_file):
    """io.py _check_array_entry: a parameter file whose header names an array member that is missing."""
    path, names = params_file
    _rewrite(path, **{names["a"]: None})
    with pytest.raises(ValueError, match=f"array for .*a.* \\(member '{names['a']}'\\) is missing"):
        load_params(path)


def test_load_params_refuses_a_raw_array_of_another_size(params_file):
    """io.py _check_array_entry: a raw-encoded (bfloat16) array whose bytes do not match its recorded dtype, shape."""
    path, names = params_file
    _rewrite(path, **{names["b"]: np.zeros(3, np.uint8)})
    with pytest.raises(ValueError, match="array for .*b.* does not match its recorded dtype/shape"):
        load_params(path)


def test_load_params_refuses_an_array_of_another_shape_than_its_header(params_file):
    """io.py _check_array_entry: an array whose dtype and shape differ from those its header records."""
    path, names = params_file
    _rewrite(path, **{names["a"]: np.ones(4, np.float32)})
    with pytest.raises(ValueError, match=r"has dtype float32 and shape \(4,\), but the header records <f8 and \(3,\)"):
        load_params(path)


# --- handlers --------------------------------------------------------------------------------


def test_sde_flow_refuses_a_layer_another_handler_already_handled():
    """handlers/_sde_flow.py sde_flow: wrapped outside a handler that already gave the flow layer its value."""

    def model(X, y=None):
        h = dgp.gp_layer("flow", X, dgp.kernels.RBF(), num_inducing=2)
        _observe(_layer("f", h), y)

    handled = sde_flow(marginalize_inducing(model), "flow", T=1.0, num_steps=2)
    with pytest.raises(ValueError, match="sde_flow: layer 'flow' was already handled by another handler; sde_flow must wrap the model itself"):
        trace(seed(handled, 0)).get_trace(X, Y)


def test_collapse_last_layer_refuses_a_non_normal_observation_site():
    """handlers/_mcmc.py collapse_last_layer: a likelihood that cannot absorb the layer's variance."""

    def model(X, y=None):
        f = _layer("f", X)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=f[..., 0]), obs=y)

    # the run must not end with the layer's variance silently dropped
    with pytest.raises(ValueError, match="collapse_last_layer: no Normal observation site followed layer 'f'"):
        trace(seed(collapse_last_layer(model), 0)).get_trace(X, (Y > 0).astype(jnp.int32))


def test_sde_helpers_refuse_inputs_of_another_shape():
    """sde.py flow_trajectories and temporal_inducing_inputs: X of another shape, bad num_samples
    or times."""
    flow = sde_flow(one_layer, "f")
    with pytest.raises(ValueError, match=r"flow_trajectories: X must have shape \(num_points, dim\)"):
        dgp.sde.flow_trajectories(flow, None, {}, KEY, X[:, 0])
    with pytest.raises(ValueError, match="flow_trajectories: num_samples must be a positive integer"):
        dgp.sde.flow_trajectories(flow, None, {}, KEY, X, num_samples=0)
    with pytest.raises(ValueError, match=r"temporal_inducing_inputs: X must have shape \(num_points, dim\)"):
        dgp.sde.temporal_inducing_inputs(X[:, 0], 2, [0.0, 1.0])
    with pytest.raises(ValueError, match="temporal_inducing_inputs: times must be a non-empty 1-D array"):
        dgp.sde.temporal_inducing_inputs(X, 2, jnp.zeros((2, 2)))


def test_exact_layers_collapse_last_refuses_observations_of_another_shape():
    """handlers/_mcmc.py exact_layers(collapse_last=True): observations that do not match the last layer's outputs."""

    def model(X, y=None):
        numpyro.sample("y", dist.Normal(_layer("f", X), 0.1).to_event(2), obs=y)

    with pytest.raises(ValueError, match=r"exact_layers\(collapse_last=True\): observation site 'y' has shape \(6, 2\)"):
        trace(seed(exact_layers(model, collapse_last=True), 0)).get_trace(X, jnp.stack([Y, Y], -1))



def test_quadrature_refuses_a_layer_another_handler_computes():
    """handlers/_base.py quadrature: an sde_flow layer (its value is the flow's, not branched)."""

    def model(X, y=None):
        _observe(_layer("f", _layer("h1", X)), y)

    flow = quadrature(sde_flow(model, "h1", T=1.0, num_steps=2), num_points=2)
    with pytest.raises(NotImplementedError, match="quadrature: layer 'h1' is an sde_flow layer, "
                                                  "which quadrature does not branch"):
        trace(seed(flow, 0)).get_trace(X, Y)


def test_layer_inputs_refuses_inputs_for_a_layer_the_model_lacks():
    """handlers/_base.py layer_inputs: inputs given for a layer name that never ran."""
    model = layer_inputs(one_layer, inputs={"g": X})
    with pytest.raises(ValueError, match=r"layer_inputs: the model has no layer named \['g'\]"):
        trace(seed(model, 0)).get_trace(X, Y)


def test_collapse_last_layer_refuses_an_observation_that_is_not_the_layer_output():
    """handlers/_mcmc.py _matched_variance: a Normal whose location is not the layer's output."""

    def model(X, y=None):
        f = _layer("f", X)
        with numpyro.plate("data", X.shape[0] - 1):
            numpyro.sample("y", dist.Normal(f[1:, 0], 0.1), obs=y)

    with pytest.raises(ValueError, match=r"collapse_last_layer: cannot match the layer's variance "
                                         r"\(6, 1\) to the observation's location \(5,\)"):
        trace(seed(collapse_last_layer(model), 0)).get_trace(X, Y[1:])


def test_flow_trajectories_refuses_a_model_not_wrapped_by_sde_flow():
    """sde.py flow_trajectories: the plain model instead of its sde_flow wrapper."""
    with pytest.raises(TypeError,
                       match="flow_trajectories: model must be the sde_flow-wrapped model itself"):
        dgp.sde.flow_trajectories(one_layer, None, {}, KEY, X)


# --- guides ----------------------------------------------------------------------------------


def test_guide_refuses_a_model_without_gp_layer_inducing_sites():
    """guides/_base.py _read_inducing_sites: a model with no '<name>.u' site."""

    def plain(X, y=None):
        m = numpyro.sample("m", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(m, 1.0), obs=y)

    with pytest.raises(ValueError,
                       match="AutoFactorizedDGP: the model has no gp_layer inducing sites"):
        seed(AutoFactorizedDGP(plain), 0)(X, Y)


@pytest.mark.filterwarnings("ignore:init_to_mean\\(\\) skipping")
def test_guide_refuses_a_global_inducing_site_inside_a_plate():
    """guides/_base.py _read_inducing_sites: a global inducing site under a plate that gp_layer's
    own check (numpyro.plate handlers only) does not see: a funsor plate, its batched u
    fixed by substitute (unfixed, the layer cannot run on a batched u)."""

    def model(X, y=None):
        with funsor.plate("rep", 1):
            f = _layer("f", X)
        _observe(f, y)

    fixed = substitute(funsor.enum(model, first_available_dim=-2), data={"f.u": jnp.zeros((1, 2))})
    with pytest.raises(ValueError, match=r"AutoFactorizedDGP: inducing site 'f.u' is inside "
                                         r"plate\(s\) \['rep'\]"):
        seed(AutoFactorizedDGP(fixed), 0)(X, Y)

# ---------------------------------------------------------------- likelihoods, targets, latent inputs


def _initial_params(model, guide, y):
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    return svi.get_params(svi.init(KEY, X, y))


def test_likelihood_recipes_refuse_bad_arguments():
    with pytest.raises(ValueError, match="softmax: f must be the last layer's output .* at least 2"):
        dgp.likelihoods.softmax(jnp.zeros((5, 1)))
    with pytest.raises(ValueError, match=r"RobustMax: epsilon must lie in \(0, 1\)"):
        dgp.likelihoods.robust_max(jnp.zeros((5, 3)), epsilon=1.0)
    with pytest.raises(ValueError, match=r"RobustMax: epsilon must lie in \(0, 1\)"):
        dgp.likelihoods.RobustMax(jnp.zeros((5, 3)), epsilon=0.0)
    with pytest.raises(TypeError, match="RobustMax: epsilon must be a number"):
        dgp.likelihoods.robust_max(jnp.zeros((5, 3)), epsilon="small")
    with pytest.raises(ValueError, match="poisson: exposure must be positive"):
        dgp.likelihoods.poisson(jnp.zeros((5, 1)), exposure=jnp.array([1.0, 2.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="heteroscedastic_normal: f needs an even number of outputs"):
        dgp.likelihoods.heteroscedastic_normal(jnp.zeros((5, 3)))
    with pytest.raises(ValueError, match="poisson: f must be the last layer's output"):
        dgp.likelihoods.poisson(jnp.zeros(()))


def test_objectives_refuse_bad_likelihood_settings():
    for objective in (dgp.DGPElbo, dgp.PredictiveObjective, dgp.ImportanceWeightedElbo):
        with pytest.raises(ValueError, match="num_likelihood_samples must be a positive integer"):
            objective(num_likelihood_samples=0)
        with pytest.raises(ValueError, match=f"{objective.__name__}: num_quadrature must be a positive integer"):
            objective(num_quadrature=2.5)
    with pytest.raises(ValueError, match="PredictiveObjective: num_particles must be a positive integer"):
        dgp.PredictiveObjective(num_particles=0)

    def four_outputs(X, y=None):
        f = dgp.gp_layer("f", X, dgp.kernels.RBF(), num_inducing=2, out_dim=4)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(f, 0.1).to_event(1), obs=y)

    guide = AutoFactorizedDGP(four_outputs)
    Y4 = jnp.zeros((6, 4))
    params = _initial_params(four_outputs, guide, Y4)
    with pytest.raises(ValueError, match="num_quadrature=20 over 4 outputs has 160000 nodes"):
        dgp.DGPElbo(num_quadrature=20).loss(KEY, params, four_outputs, guide, X, Y4)


def test_predict_refuses_a_likelihood_it_cannot_rebuild():
    def truncated(X, y=None):
        f = _layer("f", X)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.TruncatedNormal(f[..., 0], 0.1, low=-5.0), obs=y)

    guide = AutoFactorizedDGP(truncated)
    params = _initial_params(truncated, guide, Y)
    with pytest.raises(NotImplementedError, match="cannot be rebuilt from its parameters"):
        dgp.predict(truncated, guide, params, KEY, X, num_samples=2)


def test_saved_count_model_refuses_a_target_standardization(tmp_path):
    model = deep_gp_regression(1, num_inducing=2, likelihood="poisson")
    guide = AutoFactorizedDGP(model)
    counts = jnp.asarray([0, 1, 2, 3, 1, 0])
    params = _initial_params(model, guide, counts)
    standardization = dgp.Standardization(np.zeros(1), np.ones(1), 2.0, 3.0)  # y scaled: wrong for counts
    dgp.save_model(tmp_path / "m", model, guide, params, input_dim=1, standardization=standardization)
    with pytest.raises(ValueError, match="a Poisson prediction has no location and scale"):
        dgp.load_model(tmp_path / "m").predict(np.asarray(X))


def test_targets_of_another_width_and_infinite_missing_targets_are_refused():
    model = deep_gp_regression(1, num_inducing=2, num_outputs=2)
    with pytest.raises(ValueError, match=r"y must have shape \(6, 2\) .* its 2 target columns, got shape \(6,\)"):
        seed(model, 0)(X, Y)
    masked = deep_gp_regression(1, num_inducing=2, missing_targets="mask")
    guide = AutoFactorizedDGP(masked)
    with pytest.raises(ValueError, match=r"args\[1\] contains inf values"):
        dgp.fit(SVI(masked, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo()), KEY, X, Y.at[0].set(jnp.inf),
                num_steps=1, progress_bar=False)


def test_latent_inputs_refuse_a_bad_name_a_missing_key_and_a_bad_guide_width():
    def in_plate(fn):
        with numpyro.plate("data", 6):
            return fn()

    with pytest.raises(ValueError, match="latent_input: name must be a non-empty string"):
        seed(lambda: in_plate(lambda: dgp.latent_input("", X)), 0)()
    with pytest.raises(RuntimeError, match="needs a random key"):
        in_plate(lambda: dgp.latent_input("w", X))
    with pytest.raises(ValueError, match="latent_hidden_width must be a positive integer"):
        AutoFactorizedDGP(one_layer, latent_hidden_width=0)


def test_importance_weighting_refuses_amortized_layers():
    model = dgp.models.amortized_dgp(widths=(1,), num_inducing=(2,))
    guide = dgp.guides.AutoAmortizedDGP(model, num_branches=2)
    params = _initial_params(model, guide, Y)
    with pytest.raises(ValueError, match=r"layers \['h1'\] have per-point inducing sets, which the importance"):
        dgp.ImportanceWeightedElbo(2).loss(KEY, params, model, guide, X, Y)


def test_the_gaussian_observation_refuses_non_finite_outputs_and_a_bad_noise_as_numpyro_does():
    """The factories' Normal likelihood is NumPyro's, validated as NumPyro validates: run
    eagerly, with NumPyro's messages; traced or with validation off, not."""
    model = deep_gp_regression(1, num_inducing=2)
    u_shape = trace(seed(model, 0)).get_trace(X, Y)["h1.u"]["value"].shape
    bad_u = numpyro.handlers.substitute(model, {"h1.u": jnp.full(u_shape, jnp.nan)})
    with pytest.raises(ValueError, match="Normal distribution got invalid loc parameter"):
        seed(bad_u, 0)(X, Y)
    bad_noise = numpyro.handlers.substitute(model, {"noise": jnp.asarray(-1.0)})
    with pytest.raises(ValueError, match="Normal distribution got invalid scale parameter"):
        seed(bad_noise, 0)(X, Y)
    jax.jit(lambda: seed(bad_noise, 0)(X, Y))()  # traced: not checked (as NumPyro)
    with numpyro.validation_enabled(False):
        seed(bad_noise, 0)(X, Y)  # validation off: NumPyro would not check either
