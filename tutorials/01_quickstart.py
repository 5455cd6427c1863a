# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Quickstart: a two-layer deep GP as a NumPyro program
#
# This tutorial fits a two-layer deep Gaussian process (DGP) to a noisy step function with
# `numpyro_dgp`. The model is an ordinary NumPyro program; inference is NumPyro's `SVI` with a
# guide and an objective from this package. The steps:
#
# 1. write the model with two `gp_layer` calls and look at the sites it creates;
# 2. fit it with `AutoFactorizedDGP` (the DSVI guide of Salimbeni & Deisenroth, 2017) and `DGPElbo`;
# 3. compare `DGPElbo` with NumPyro's `Trace_ELBO` on the same model and guide;
# 4. predict, plot each layer, and compare with a single-layer sparse GP (SVGP);
# 5. save and reload the fitted parameters, checked against the model, and resume a fit from a
#    checkpoint.

# %% [markdown]
# ## 1. Setup
#
# Gaussian-process linear algebra (Cholesky factors of kernel matrices) needs double precision,
# so 64-bit mode is switched on before anything else. `SMOKE` shortens every costly step; the
# test suite runs the notebook with `NUMPYRO_DGP_SMOKE=1`, and the numbers it then prints are
# not meaningful.

# %%
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

# NumPyro imports tqdm.auto, which warns in Jupyter when ipywidgets is not installed
warnings.filterwarnings("ignore", message="IProgress not found")
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO

import numpyro_dgp as dgp
from numpyro_dgp.models import deep_gp_regression

plt.rcParams["figure.dpi"] = 90

SMOKE = os.environ.get("NUMPYRO_DGP_SMOKE") == "1"
NUM_STEPS = 300 if SMOKE else 3000          # optimization steps per model
NUM_ELBO_KEYS = 50 if SMOKE else 1000       # random keys for the ELBO comparison
NUM_PRED_SAMPLES = 20 if SMOKE else 100     # mixture components in predict
NUM_LAYER_SAMPLES = 10 if SMOKE else 25     # function samples per layer in the plots
print(f"SMOKE={SMOKE}, NUM_STEPS={NUM_STEPS}")

# %% [markdown]
# ## 2. Data
#
# `step_function` draws 100 training inputs uniformly on $[-1, 1]$ with targets
# $y = \operatorname{sign}(x) + \varepsilon$, $\varepsilon \sim \mathcal N(0, 0.01^2)$, and 200
# test inputs on an even grid. A GP with a stationary kernel has one lengthscale for the whole
# input range, so it must either be wiggly everywhere or smooth through the jump; this is the
# standard example of what a second layer adds.

# %%
data = dgp.datasets.step_function(jax.random.PRNGKey(0), num_train=100)
X, y = jnp.asarray(data.X_train), jnp.asarray(data.y_train)
X_test, y_test = jnp.asarray(data.X_test), jnp.asarray(data.y_test)
print("train:", X.shape, y.shape, " test:", X_test.shape, y_test.shape, " dtype:", X.dtype)

fig, ax = plt.subplots(figsize=(6, 3))
ax.scatter(data.X_train[:, 0], data.y_train, s=10, color="k", label="train")
ax.plot(data.X_test[:, 0], data.y_test, ".", ms=3, color="C3", alpha=0.6, label="test")
ax.set(xlabel="x", ylabel="y", title="noisy step function")
ax.legend(loc="upper left")
fig.tight_layout()
plt.show()


# %% [markdown]
# ## 3. The model
#
# A DGP is a composition $f = f_2 \circ f_1$ of GPs. Each `gp_layer` call is one sparse GP
# layer with `num_inducing` inducing points; it takes the layer's input `(N, D)` and returns its
# output `(N, out_dim)`. The first layer has an identity mean function ($h_1(x) = x + g(x)$ with
# $g$ a zero-mean GP), which keeps the inner layer close to the identity at the start, as in
# DSVI. The second layer has zero mean. The Gaussian likelihood and its noise variance are
# written as in any NumPyro regression model.

# %%
def model(X, y=None):
    h = dgp.gp_layer("h1", X, dgp.kernels.RBF(), num_inducing=30, out_dim=1, mean="identity")
    f = dgp.gp_layer("h2", h, dgp.kernels.RBF(), num_inducing=30, out_dim=1, mean="zero")
    noise = numpyro.param("noise", 0.01, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


# %% [markdown]
# Running the model under `seed` and `trace` lists the sites it creates:

# %%
model_trace = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace(X, y)
print(f"{'site':<24} {'type':<14} {'shape':<10} details")
for name, site in model_trace.items():
    details = ""
    if site["type"] == "sample":
        fn = site["fn"]
        details = f"{type(fn).__name__}, event_shape={fn.event_shape}"
        details += ", observed" if site["is_observed"] else ""
        if site["infer"]:
            details += f", infer={site['infer']}"
    elif site["type"] == "dgp_layer":
        details = "message handled by the active handlers"
    print(f"{name:<24} {site['type']:<14} {str(jnp.shape(site['value'])):<10} {details}")

# %% [markdown]
# Per layer (`h1` shown; `h2` is the same):
#
# * `h1.kernel.variance`, `h1.kernel.lengthscale`, `h1.inducing_inputs` are `numpyro.param`
#   sites: kernel hyperparameters (point estimates) and the $M = 30$ inducing inputs,
#   initialized by k-means on the layer's input.
# * `h1.u` is the latent inducing-value site, shape `(out_dim, M)`. It is whitened: its prior is
#   $\mathcal N(0, I)$ and the inducing values are $L v$ with $L L^\top = K(Z, Z)$. The `infer`
#   tag marks it as belonging to layer `h1`; this is how `AutoFactorizedDGP` finds it.
# * `h1.layer` is a message of type `dgp_layer`. Without other handlers it draws the layer's
#   output at each input from $p(f(X) \mid u)$, point by point. Handlers can reinterpret it:
#   `DGPElbo` integrates $u$ out, and `sample_layers` draws whole functions.
# * `h1` is a `deterministic` site holding the layer's output `(N, out_dim)`, so `Predictive`
#   and traces expose it.

# %% [markdown]
# ## 4. Guide, objective and fit
#
# * `AutoFactorizedDGP(model)` is the DSVI guide: an independent Gaussian
#   $q(u_\ell) = \mathcal N(m_\ell, S_\ell)$ with a full Cholesky factor for each layer (and each
#   output). Inner layers start with a very small $S_\ell$, so training starts from a nearly
#   deterministic first layer.
# * `DGPElbo()` is the DSVI evidence lower bound. It uses the guide's Gaussians to integrate the
#   inducing values out analytically.
# * `dgp.fit` runs `NUM_STEPS` SVI updates compiled as a `lax.scan` (in chunks of 100 steps by
#   default). It returns the constrained parameters, the loss of every step, the final SVI
#   state, and the number of updates skipped because they were not finite.

# %%
guide = dgp.guides.AutoFactorizedDGP(model)
svi = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())

key_fit, key_elbo, key_pred, key_layers = jax.random.split(jax.random.PRNGKey(1), 4)
result = dgp.fit(svi, key_fit, X, y, num_steps=NUM_STEPS, progress_bar=False)
params = result.params

print("skipped updates:", result.num_skipped)
print(f"ELBO, mean of the last 100 steps: {-result.losses[-100:].mean():.2f}")
print(f"noise variance: {float(params['noise']):.2e}")
for layer in ("h1", "h2"):
    print(f"{layer}: kernel variance {float(params[layer + '.kernel.variance']):.3f}, "
          f"lengthscale {float(params[layer + '.kernel.lengthscale'][0]):.3f}")

# %% [markdown]
# Each step's loss is a one-sample estimate of the negative ELBO. The left panel shows the whole
# run, the right panel the second half on its own scale.

# %%
elbo_trace = -np.asarray(result.losses)
steps = np.arange(1, NUM_STEPS + 1)
half = NUM_STEPS // 2
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
axes[0].plot(steps, elbo_trace, lw=0.8)
axes[0].set_yscale("symlog")
axes[0].set(xlabel="step", ylabel="ELBO estimate (symlog scale)", title="all steps")
axes[1].plot(steps[half:], elbo_trace[half:], lw=0.8)
axes[1].set(xlabel="step", ylabel="ELBO estimate", title="second half")
fig.tight_layout()
plt.show()

# %% [markdown]
# The ELBO is still rising at the end of the run; more steps (`NUM_STEPS`) raise it further.
# Part of the slow climb is the first layer's $q(u)$: the diagonal of its Cholesky factor starts
# at $10^{-5}$ times the prior's and is the softplus of an unconstrained parameter, which Adam
# moves by at most about the learning rate (0.01) per step. For small values
# $\operatorname{softplus}(a) \approx e^a$, so the diagonal grows by at most a factor of about
# $e^{0.01}$ per step.

# %% [markdown]
# ## 5. The same bound with NumPyro's `Trace_ELBO`
#
# The model and guide are ordinary NumPyro objects, so NumPyro's own `Trace_ELBO` also works on
# them: it samples the inducing values from the guide and every layer output from
# $p(f \mid u)$, and estimates the KL terms from those samples. Both objectives estimate the
# same bound. The cell below evaluates both, at the fitted parameters, with `NUM_ELBO_KEYS`
# random keys each (`jax.vmap` over the keys).

# %%
elbo_keys = jax.random.split(key_elbo, NUM_ELBO_KEYS)


def elbo_estimates(objective):
    one = lambda key: -objective.loss(key, params, model, guide, X, y)
    return np.asarray(jax.jit(jax.vmap(one))(elbo_keys))


estimates = {"DGPElbo": elbo_estimates(dgp.DGPElbo()), "Trace_ELBO": elbo_estimates(Trace_ELBO())}
print(f"{'objective':<11} {'mean':>9} {'std. error':>11} {'std':>8}")
for name, values in estimates.items():
    std = values.std(ddof=1)
    print(f"{name:<11} {values.mean():9.2f} {std / np.sqrt(len(values)):11.2f} {std:8.2f}")
ratio = estimates["Trace_ELBO"].var(ddof=1) / estimates["DGPElbo"].var(ddof=1)
diff = estimates["Trace_ELBO"].mean() - estimates["DGPElbo"].mean()
diff_se = np.sqrt(sum(v.var(ddof=1) / len(v) for v in estimates.values()))
print(f"difference of means (Trace_ELBO - DGPElbo): {diff:.2f} +- {diff_se:.2f} (std. error)")
print(f"variance ratio Trace_ELBO / DGPElbo: {ratio:.2f}")
cond = np.linalg.cond(np.asarray(params["h1.u_auto_scale_tril"][0]))
print(f"condition number of the Cholesky factor of q(u) in layer h1: {cond:.1e}")

fig, ax = plt.subplots(figsize=(6, 3))
finite = {name: v[np.isfinite(v)] for name, v in estimates.items()}
lo = min(np.percentile(v, 1) for v in finite.values())
hi = max(np.percentile(v, 99) for v in finite.values())
bins = np.linspace(lo, hi, 40)
for name, values in finite.items():
    ax.hist(values, bins=bins, alpha=0.5, label=name)
ax.set(xlabel="one-sample ELBO estimate", ylabel="count", title="ELBO estimates at the fitted parameters")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# The difference between the two means is of the order of its standard error: both estimate
# the same bound. `DGPElbo` has the lower variance because it
# integrates the inducing values out analytically (each layer's output is drawn from its
# marginal $q(f_\ell \mid f_{\ell-1})$ and the KL terms are exact) and takes the expectation over
# the last layer's output by Gauss–Hermite quadrature; its remaining noise comes from sampling the
# first layer's output, which `Trace_ELBO` samples too.
#
# `Trace_ELBO` also evaluates $\log q(u)$ at the sampled $u$, which needs a triangular solve with
# the Cholesky factor of $S_1$. Early in training (for example after the 300 steps of smoke mode)
# that factor can have a tiny diagonal and much larger off-diagonal entries; its condition number
# then exceeds $10^{15}$ and `Trace_ELBO`'s estimates are dominated by round-off. `DGPElbo`
# computes the KL terms in closed form from the factor and is not affected.

# %% [markdown]
# ## 6. Prediction
#
# `dgp.predict` returns a Gaussian mixture at the test inputs: each of `num_samples` components
# propagates the inputs through a sample of the first layer and takes the last layer's marginal
# Gaussian analytically, plus the noise. `pred.mean` and `pred.variance` are the mixture's mean
# and variance. `dgp.metrics` gives the mean test log-likelihood per point (of the mixture,
# higher is better), the RMSE and the CRPS (both lower is better).

# %%
pred = dgp.predict(model, guide, params, key_pred, X_test, num_samples=NUM_PRED_SAMPLES)
dgp_metrics = dgp.metrics(pred, y_test)
print({k: round(v, 4) for k, v in dgp_metrics.items()})


def plot_prediction(ax, prediction, title):
    x = data.X_test[:, 0]
    mean, std = np.asarray(prediction.mean), np.sqrt(np.asarray(prediction.variance))
    ax.fill_between(x, mean - 2 * std, mean + 2 * std, color="C0", alpha=0.25, label="mean ± 2 std")
    ax.plot(x, mean, color="C0", lw=1.5, label="predictive mean")
    ax.scatter(data.X_train[:, 0], data.y_train, s=8, color="k", zorder=3, label="train")
    ax.set(xlabel="x", ylabel="y", title=title)


fig, ax = plt.subplots(figsize=(6, 3.2))
plot_prediction(ax, pred, "2-layer DGP: predictive distribution")
ax.legend(loc="upper left", fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 7. What each layer does
#
# `dgp.sample_layers` draws inducing values from the guide and each layer's output with its
# full covariance over the inputs, so each sample is a whole function (the prediction above
# draws points independently). It returns `{layer name: (num_samples, N, out_dim)}`.
#
# The three panels show, for the same samples: the first layer $h_1(x)$; the second layer
# as a function of its own input, $f(h_1)$, drawn along the range each sample of $h_1$ covers;
# and the composition $f(h_1(x))$ against the data.

# %%
grid = jnp.linspace(-1.2, 1.2, 200)[:, None]
samples = dgp.sample_layers(model, guide, params, key_layers, grid, num_samples=NUM_LAYER_SAMPLES)
print({name: value.shape for name, value in samples.items()})
fig = dgp.plots.plot_layer_samples(grid, samples, data.X_train, data.y_train)
plt.show()

# %% [markdown]
# How to read it: the first layer maps the inputs on each side of the jump to a narrow band of
# values (one band for $x < 0$, another for $x > 0$) and rises steeply between them near $x = 0$.
# It compresses the flat parts and stretches the neighbourhood of the jump. The second layer is
# a smooth function of $h_1$: about $-1$ on the first band and $+1$ on the second, with a
# transition between them as gradual as its RBF lengthscale allows. Composed, the two smooth
# layers give a sharp step. Outside the training inputs ($|x| > 1$) the samples of $h_1$
# spread out, and so do those of the composition.

# %% [markdown]
# ## 8. Comparison with a single-layer sparse GP
#
# `deep_gp_regression(1, num_inducing=30)` from `numpyro_dgp.models` builds the one-layer model
# (an SVGP: one `gp_layer` with zero mean and the same likelihood). It is fitted in the same way,
# with the same number of steps.

# %%
svgp_model = deep_gp_regression(1, num_inducing=30)
svgp_guide = dgp.guides.AutoFactorizedDGP(svgp_model)
svgp_svi = SVI(svgp_model, svgp_guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
svgp_result = dgp.fit(svgp_svi, key_fit, X, y, num_steps=NUM_STEPS, progress_bar=False)
svgp_pred = dgp.predict(svgp_model, svgp_guide, svgp_result.params, key_pred, X_test,
                        num_samples=NUM_PRED_SAMPLES)
svgp_metrics = dgp.metrics(svgp_pred, y_test)

print(f"{'model':<14} {'final ELBO':>10} {'noise var':>10} {'test LL':>8} {'RMSE':>7} {'CRPS':>7}")
for label, res, m in (("2-layer DGP", result, dgp_metrics), ("1-layer SVGP", svgp_result, svgp_metrics)):
    final_elbo = -res.losses[-100:].mean()
    noise = float(res.params["noise"])
    print(f"{label:<14} {final_elbo:10.2f} {noise:10.2e} {m['log_likelihood']:8.3f} {m['rmse']:7.3f} {m['crps']:7.3f}")

fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), sharey=True)
plot_prediction(axes[0], pred, "2-layer DGP")
plot_prediction(axes[1], svgp_pred, "1-layer SVGP")
axes[0].legend(loc="upper left", fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# "final ELBO" is the mean of the last 100 per-step estimates; test LL is the mean log
# predictive density per test point (in the units of $y$); RMSE measures the predictive mean
# alone. The SVGP has one lengthscale for the whole input range: its mean rises more gradually
# across the jump and overshoots next to it, and it explains the misfit with a larger noise
# variance, so its predictive band is wider everywhere. The DGP's first layer warps the input so
# that its smooth last layer can follow the jump, and keeps a small noise variance.

# %% [markdown]
# ## 9. Saving, loading, resuming and checkpointing
#
# `dgp.save_params` writes the parameter dict to an `.npz` file (keys, dtypes, shapes and values
# are preserved exactly, and the file is written atomically); `dgp.load_params` reads it back.
#
# In a new session the guide is a fresh object: `guide.setup(rng_key, X, y)` builds its structure
# from the model run on the *training* data (with `y` observed), after which the loaded
# parameters predict exactly as before.

# %%
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "dgp_step.npz")
    dgp.save_params(path, params)
    print(f"saved {len(params)} arrays, {os.path.getsize(path)} bytes")
    loaded = dgp.load_params(path)

fresh_guide = dgp.guides.AutoFactorizedDGP(model).setup(jax.random.PRNGKey(1), X, y)
pred_loaded = dgp.predict(model, fresh_guide, loaded, key_pred, X_test, num_samples=NUM_PRED_SAMPLES)
print("same keys:", sorted(loaded) == sorted(params))
print("identical predictive means:", bool(np.array_equal(pred.mean, pred_loaded.mean)))
print("max |difference|:", float(jnp.max(jnp.abs(pred.mean - pred_loaded.mean))))

# %% [markdown]
# **Parameters are checked against the model.** `dgp.predict` compares the parameters with the
# ones the model and guide create (names, shapes and dtypes, found by an abstract run: nothing
# is computed) and refuses non-finite values, so a file from another model (renamed layers,
# another `num_inducing` or width), a misspelt key or an empty dict raises a
# `dgp.ParameterMismatchError` listing the missing, unexpected and mis-shaped entries, instead of
# quietly predicting with initial values. `dgp.load_params(path, model=..., guide=...,
# args=(X, y))` runs the same check when loading (and sets the guide up on the training data),
# and `dgp.fit(..., init_params=...)` before starting; `strict=False` accepts a partial dict.

# %%
try:
    dgp.predict(model, fresh_guide, {k: v for k, v in loaded.items() if k != "noise"}, key_pred, X_test)
except dgp.ParameterMismatchError as err:
    print(err)

# %% [markdown]
# ### Resuming and checkpointing
#
# A fit can be cut into pieces without changing it: `fit(..., num_steps=a)` followed by
# `fit(svi, None, ..., num_steps=b, init_state=result.state)` ends bit for bit where
# `fit(..., num_steps=a + b)` does, whatever the `chunk_size`, and fitting the same `SVI` twice
# with the same key gives the same result. For long runs, `checkpoint_path=...` with
# `checkpoint_every=k` writes a checkpoint every `k` steps (atomically: a killed process leaves the
# last complete one), holding everything needed to go on: the optimizer state, the step count,
# the random key, the averaging state of `average_from` and the losses so far. The same call with
# `resume=True` continues from the checkpoint when there is one and starts afresh when there is
# not, so a job restarted after a crash or a preemption ends exactly where the uninterrupted run
# would. Below, a run stopped at step 100 is resumed to 200 steps.

# %%
svi_ckpt = SVI(model, dgp.guides.AutoFactorizedDGP(model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
with tempfile.TemporaryDirectory() as tmp:
    checkpoint = os.path.join(tmp, "fit.ckpt")
    options = dict(checkpoint_path=checkpoint, checkpoint_every=50, progress_bar=False)
    dgp.fit(svi_ckpt, key_fit, X, y, num_steps=100, **options)  # stopped after 100 steps
    resumed = dgp.fit(svi_ckpt, key_fit, X, y, num_steps=200, resume=True, **options)
uninterrupted = dgp.fit(svi_ckpt, key_fit, X, y, num_steps=200, progress_bar=False)
print("resumed run equals the uninterrupted one bit for bit:",
      all(np.array_equal(resumed.params[k], uninterrupted.params[k]) for k in resumed.params)
      and np.array_equal(resumed.losses, uninterrupted.losses))

# %% [markdown]
# ## 10. Training faster: compiled once, continued without recompiling, split across devices
#
# `dgp.fit` compiles a chunk of `chunk_size` steps (a `lax.scan`) once and keeps the compiled
# function on the `SVI` object, so continuing a fit with `init_state=result.state` (or fitting
# the same `SVI` again) starts at full speed. `fit` compiles the chunk before running it and
# times that apart (`result.compile_seconds`); `result.chunk_seconds` and
# `result.seconds_per_step` are running time only.
#
# Inside the step, `DGPElbo` draws the minibatch with one `top_k` (`dgp.handlers.fast_subsample`)
# instead of NumPyro's sequential CPU shuffle, and every layer differentiates its Cholesky
# factor and inverse with matrix products only (`dgp.core.cholesky`,
# `dgp.core.triangular_inverse`); benchmarks/topics/speed.md has what each change gave.

# %%
svi_more = SVI(model, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
first = dgp.fit(svi_more, key_fit, X, y, num_steps=200, chunk_size=50, progress_bar=False)
more = dgp.fit(svi_more, key_fit, X, y, num_steps=200, chunk_size=50, progress_bar=False,
               init_state=first.state)
print(f"first fit:  compiled in {first.compile_seconds:.2f} s, then {1e3 * first.seconds_per_step:.2f} ms/step")
print(f"continued:  compiled in {more.compile_seconds:.2f} s (already compiled), "
      f"then {1e3 * more.seconds_per_step:.2f} ms/step")

# %% [markdown]
# **Several devices.** `dgp.handlers.data_parallel(model)` splits the points of the data plate
# across `jax.devices()`. Everything the model computes from the plate's indices is split:
# with a model that takes its inputs through the plate, as `deep_gp_regression` does
# (`numpyro.subsample(X, event_dim=1)` inside `numpyro.plate("data", N, subsample_size=B)`),
# that is each layer's per-point work on the minibatch. The global parts (inducing values,
# kernel matrices, KL) are replicated, and the sums over points are reduced across devices.
# The model, the guide and the loss are unchanged; on the same minibatch the loss equals the
# single-device loss up to the order of the sums (tests/test_speed.py checks this to 1e-6 on
# two devices). On a CPU, two devices for trying it out come from
# `XLA_FLAGS=--xla_force_host_platform_device_count=2`, set before JAX starts; this notebook
# runs with whatever devices it has.

# %%
mb_model = deep_gp_regression(2, num_inducing=30, hidden_width=1)
mb_guide = dgp.guides.AutoFactorizedDGP(mb_model)
svi_one = SVI(mb_model, mb_guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
svi_parallel = SVI(dgp.handlers.data_parallel(mb_model), mb_guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
mb_state = svi_one.init(key_fit, X, y, batch_size=50)
svi_parallel.init(key_fit, X, y, batch_size=50)
mb_result = dgp.fit(svi_parallel, None, X, y, batch_size=50, num_steps=200, init_state=mb_state,
                    progress_bar=False)
loss_one = svi_one.evaluate(mb_result.state, X, y, batch_size=50)
loss_parallel = svi_parallel.evaluate(mb_result.state, X, y, batch_size=50)
print(f"{len(jax.devices())} device(s); the same minibatch: loss {float(loss_one):.6f} on one device, "
      f"{float(loss_parallel):.6f} data-parallel")

# %% [markdown]
# ## 11. Your own data: a model on disk, the command line, large data, several processes
#
# **A whole model in one directory.** `save_model` writes a model built by `dgp.models`
# (`deep_gp_regression`, `diffgp`, `amortized_dgp`) with its guide and fitted parameters:
# `model.json` (human-readable: format version, the factory and its arguments, the guide,
# the standardization, the checksum of the parameters) and `params.npz`, written to a
# temporary directory and renamed into place. `load_model` rebuilds the model from the file
# alone: a new process needs neither the training data nor the code that defined the model.
# Below, a fresh Python process loads the two-layer model of section 10 and predicts; its
# predictive means equal the ones computed here.

# %%
model_dir = Path(tempfile.mkdtemp()) / "step_model"
dgp.save_model(model_dir, mb_model, mb_guide, mb_result.params, input_dim=1)
print(sorted(p.name for p in model_dir.iterdir()))
print((model_dir / "model.json").read_text()[:400], "...")

here = dgp.load_model(model_dir).predict(X_test, rng_key=jax.random.PRNGKey(5), num_samples=20)
fresh_process = """
import sys, jax, numpy as np
jax.config.update("jax_enable_x64", True)
import numpyro_dgp as dgp
X_new = np.load(sys.argv[2])
np.save(sys.argv[3], np.asarray(dgp.load_model(sys.argv[1]).predict(X_new, rng_key=jax.random.PRNGKey(5), num_samples=20).mean))
"""
np.save(model_dir.parent / "X_test.npy", np.asarray(X_test))
subprocess.run([sys.executable, "-c", fresh_process, str(model_dir), str(model_dir.parent / "X_test.npy"),
                str(model_dir.parent / "mean.npy")], check=True)
print("predictive means from a fresh process equal this one's:",
      np.array_equal(np.load(model_dir.parent / "mean.npy"), np.asarray(here.mean)))

# %% [markdown]
# **The command line on a table.** `numpyro-dgp fit` trains on a CSV file (header row; every
# column but `--target` is a feature, text or missing values are refused by name) or an `.npz`,
# standardizes with the training part's statistics and saves the model directory;
# `numpyro-dgp predict` writes the predictive mean, standard deviation and quantiles in the
# data's units. Here on the step function, written to a CSV:

# %%
table = model_dir.parent / "step.csv"
np.savetxt(table, np.column_stack([np.asarray(X)[:, 0], np.asarray(y)]), delimiter=",", header="x,y", comments="")
cli = [sys.executable, "-m", "numpyro_dgp.cli"]
# run in the table's folder, so the commands (and what they print) name files, not local paths
fit_out = subprocess.run(cli + ["fit", "step.csv", "--target", "y", "--output", "cli_model",
                                "--num-inducing", "20", "--steps", str(200 if SMOKE else 2000), "--no-progress",
                                "--test-fraction", "0.2"], check=True, capture_output=True, text=True,
                         cwd=model_dir.parent)
print(fit_out.stdout[-600:])
subprocess.run(cli + ["predict", "cli_model", "step.csv", "--output", "predictions.csv"], check=True,
               capture_output=True, text=True, cwd=model_dir.parent)
print((model_dir.parent / "predictions.csv").read_text().splitlines()[:4])

# %% [markdown]
# A mistake (a missing file, a target the table lacks, no data directory for `uci`) is
# reported by name with exit status 2, in about a tenth of a second: the command checks these
# before it imports JAX.

# %%
wrong = subprocess.run(cli + ["fit", "step.csv", "--target", "z", "--output", "no_model"],
                       capture_output=True, text=True, cwd=model_dir.parent)
print(f"exit status {wrong.returncode}: {wrong.stderr.strip()}")

# %% [markdown]
# Your files are safe at every edge: `--output` must be new, an empty folder, or (with
# `--overwrite`) a model directory this library wrote; a folder of yours, a file or the training
# table itself is refused before any work and left as it was (`predict --output` replaces a file
# only with `--overwrite`). A fit that diverges exits with status 1 and saves nothing. Each row of
# `predictions.csv` carries its input row's index (`row`). In Python, standardize as the command
# does: `s = dgp.Standardization.fit(X_train, y_train)`, fit on `s.inputs(X_train)` and
# `s.targets(y_train)`, and map predictions back with `s.to_data_units(prediction)`; `fit` warns
# (`TargetScaleWarning`) when a Gaussian target is far from standardized. `docs/bad_input.md`
# lists what every entry point does with every kind of bad input.

# %% [markdown]
# **Large data.** `predict(..., batch_size=B)` predicts `B` points at a time and writes them
# into outputs allocated once (memory: the `S x N` components plus one window; add
# `keep_layers=False` to skip the per-layer arrays). It is the same predictive distribution;
# with sampled inner layers each window draws its own samples, so the means differ from an
# unbatched call by Monte Carlo error only (small against the predictive standard deviation).
# k-means initialization uses at most
# 100,000 points. For
# data larger than device memory, `infer.HostMinibatches` draws minibatches from host arrays
# or a memory-mapped `.npy`, and `infer.fit_minibatches` trains on them, with `num_data` the
# size of the whole data set (the likelihood is scaled by `num_data / B`).
# `benchmarks/scale.py` measures a million points.

# %%
batched = dgp.predict(mb_model, mb_guide, mb_result.params, jax.random.PRNGKey(6), X_test, num_samples=20, batch_size=64)
whole = dgp.predict(mb_model, mb_guide, mb_result.params, jax.random.PRNGKey(6), X_test, num_samples=20)
print(f"batched prediction: largest difference in the mean {float(jnp.max(jnp.abs(batched.mean - whole.mean))):.4f}, "
      f"mean predictive standard deviation {float(jnp.mean(jnp.sqrt(whole.variance))):.4f}")

np.save(model_dir.parent / "X.npy", np.asarray(X)); np.save(model_dir.parent / "y.npy", np.asarray(y))
X_disk = np.load(model_dir.parent / "X.npy", mmap_mode="r")
y_disk = np.load(model_dir.parent / "y.npy", mmap_mode="r")
stream_model = deep_gp_regression(2, num_inducing=30, hidden_width=1)
svi_stream = SVI(stream_model, dgp.guides.AutoFactorizedDGP(stream_model), numpyro.optim.Adam(0.01), dgp.DGPElbo())
stream = dgp.infer.fit_minibatches(svi_stream, jax.random.PRNGKey(7), dgp.infer.HostMinibatches(X_disk, y_disk, 50),
                                   num_steps=NUM_STEPS, num_data=len(X_disk), progress_bar=False)
print(f"host minibatches: loss {stream.losses[:100].mean():.1f} (first 100 steps) -> "
      f"{stream.losses[-100:].mean():.1f} (last 100)")

# %% [markdown]
# **Several processes or machines.** The same training runs on JAX's distributed runtime:
# every process loads its own shard of the rows, and `fit_minibatches(..., mesh=...)` sums the
# gradients across processes (on CPU through JAX's gloo collectives), so every process ends
# with the parameters one process reaches on the joined minibatches (the test suite checks
# two local processes against one, to 1e-6 in float64):
#
# ```python
# jax.config.update("jax_cpu_collectives_implementation", "gloo")   # CPU only
# jax.distributed.initialize(coordinator_address="host0:1234", num_processes=P, process_id=p)
# mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
# result = dgp.infer.fit_minibatches(svi, jax.random.PRNGKey(0),
#                                    dgp.infer.HostMinibatches(X_shard, y_shard, 500, seed=p),
#                                    num_steps=20_000, num_data=N_total, mesh=mesh)
# ```
#
# Start the same script as process `p` of `P` on every machine, with one coordinator address
# all of them reach; `tests/infer/_distributed_worker.py` in the repository is a complete one.

# %% [markdown]
# ## 12. Next steps
#
# The package's command-line tool runs the same experiments end to end:
#
# ```bash
# numpyro-dgp demo                                # 2-layer DGP and SVGP on this step function
# numpyro-dgp uci --dataset kin8nm --splits 0-4   # DSVI on UCI kin8nm, splits 0 to 4
# ```
#
# `demo` fits the two models of this tutorial (built with `deep_gp_regression`), prints their
# ELBO and test metrics, and writes a per-layer plot like the one in section 7 to
# `--output-dir` (default `demo_output`). `uci` prints the test log-likelihood and RMSE (mean
# and standard error over the splits); it reads the data from `--data-dir` or the
# `NUMPYRO_DGP_DATA` environment variable. `numpyro-dgp --help` lists the commands and
# `numpyro-dgp demo --help` their options.
#
# In your own models, the other `gp_layer` arguments (`out_dim`, `mean`, `priors`, `whiten`,
# `inducing_inputs`, ...) are documented in its docstring.
