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
# # Nested variational compression, FITC and VFE
#
# DSVI (Salimbeni & Deisenroth 2017) trains a deep GP by *sampling* each inner layer's output,
# so its gradient is noisy. Nested variational compression (NVC; Hensman & Lawrence 2014,
# *Nested variational compression in deep Gaussian processes*) trains the same model
# deterministically: each layer's output is a Gaussian per point whose moments come from
# **psi statistics** (expectations of the kernel under a Gaussian input; Titsias & Lawrence
# 2010), and the bound pays for what it does not propagate with explicit penalties. It needs a
# little more from the model: every inner layer must be noisy, $h_l = f_l(h_{l-1}) +
# \epsilon_l$, and the likelihood Gaussian.
#
# In `numpyro_dgp` NVC is an objective, `NestedCompressionElbo`, for the same `gp_layer`
# programs and the same guide as DSVI. The single-layer approximations it builds on are here
# too: `CollapsedSparseGP("vfe")` (Titsias 2009) and `CollapsedSparseGP("fitc")` (Snelson &
# Ghahramani 2006), with `q(u)` integrated out.
#
# Contents: 1. setup · 2. one model with a noisy hidden layer · 3. DSVI and NVC on it ·
# 4. training against wall-clock time · 5. each layer's samples and the predictive ·
# 6. FITC, VFE and SVGP on a problem with a gap · 7. UCI numbers.

# %% [markdown]
# ## 1. Setup
#
# `SMOKE` shortens every costly step (the test suite sets `NUMPYRO_DGP_SMOKE=1`; numbers
# printed in that mode are not meaningful).

# %%
import os
import warnings
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

warnings.filterwarnings("ignore", message="IProgress not found")
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp.guides import AutoFactorizedDGP
from numpyro_dgp.kernels import RBF

plt.rcParams["figure.dpi"] = 90

SMOKE = os.environ.get("NUMPYRO_DGP_SMOKE") == "1"
NUM_STEPS = 200 if SMOKE else 4000      # optimization steps of each method
CHUNK = 50                              # steps per compiled chunk (one time stamp each)
GAP_STEPS = 200 if SMOKE else 5000      # steps of the one-layer fits in section 6
print(f"SMOKE={SMOKE}, NUM_STEPS={NUM_STEPS}")

# %% [markdown]
# ## 2. One model with a noisy hidden layer
#
# The step function (a classic DGP toy: one lengthscale cannot fit both the flat parts and the
# jump). Two layers with a one-dimensional hidden layer; the hidden layer has a learned output
# noise, `gp_layer(..., noise=0.01)` (the initial variance of the `numpyro.param`
# `"h1.noise"`), which NVC requires and DSVI simply propagates. Both methods fit **this same
# program** with the same guide class.

# %%
X, y, X_test, y_test, _ = dgp.datasets.step_function(jax.random.PRNGKey(2), num_train=100, noise_std=0.02)


def model(X, y=None):
    h = dgp.gp_layer("h1", X, RBF(), num_inducing=20, mean="identity", noise=0.01)
    f = dgp.gp_layer("h2", h, RBF(), num_inducing=20)
    noise = numpyro.param("noise", jnp.asarray(0.01), constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


fig, ax = plt.subplots(figsize=(6, 2.5))
ax.plot(X[:, 0], y, "k.", ms=4)
ax.set(xlabel="x", ylabel="y", title="training data")
plt.show()

# %% [markdown]
# ## 3. DSVI and NVC on the same model
#
# `DGPElbo` is DSVI's bound (one sample of the hidden layer per step, inducing values
# integrated out); `NestedCompressionElbo` is NVC's. We train each in chunks of 50 steps and
# keep the wall-clock time of every chunk (compilation excluded), to plot the training curves
# against time below.


# %%
def train(objective, seed=0):
    guide = AutoFactorizedDGP(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.01), objective)
    state, losses, seconds = None, [], []
    for _ in range(NUM_STEPS // CHUNK):
        r = dgp.fit(svi, jax.random.PRNGKey(seed), X, y, num_steps=CHUNK, chunk_size=CHUNK,
                    progress_bar=False, init_state=state)
        state = r.state
        losses.append(r.losses)
        seconds.append(float(np.sum(r.chunk_seconds)))
    steps_time = np.repeat(np.cumsum(seconds) - np.asarray(seconds), CHUNK) + np.tile(
        (np.arange(CHUNK) + 1) / CHUNK, len(seconds)) * np.repeat(seconds, CHUNK)
    return guide, svi.get_params(state), np.concatenate(losses), steps_time


fits = {name: train(objective) for name, objective in
        [("DSVI", dgp.DGPElbo()), ("NVC", dgp.NestedCompressionElbo())]}
for name, (_, params, losses, t) in fits.items():
    print(f"{name}: {t[-1] / NUM_STEPS * 1e3:.2f} ms per step, final loss (last 100 steps) "
          f"{np.mean(losses[-100:]):.1f}, learned hidden-layer noise {float(params['h1.noise']):.2e}")

# %% [markdown]
# Both objectives are lower bounds on the log marginal likelihood of the same model, so they
# can be compared **on the same footing**: NVC's bound is deterministic, DSVI's ELBO is
# estimated here with 256 samples of the hidden layer (with its standard error). Each is
# evaluated at its own parameters and at the other's.

# %%
def dsvi_elbo(params, guide, n=256):
    keys = jax.random.split(jax.random.PRNGKey(7), n)
    values = -np.asarray(jax.jit(jax.vmap(lambda k: dgp.DGPElbo().loss(k, params, model, guide, X, y)))(keys))
    return values.mean(), values.std(ddof=1) / np.sqrt(n)


def nvc_bound(params, guide):
    return -float(dgp.NestedCompressionElbo().loss(jax.random.PRNGKey(0), params, model, guide, X, y))


for name, (guide, params, _, _) in fits.items():
    elbo, se = dsvi_elbo(params, guide)
    print(f"parameters fitted by {name}: DSVI's ELBO {elbo:.2f} ({se:.2f}), NVC's bound {nvc_bound(params, guide):.2f}")

# %% [markdown]
# With two layers the two bounds differ in one place only. Both average the last layer's
# expected log-likelihood over a Gaussian hidden layer per point; DSVI's hidden layer carries
# its whole marginal variance (the GP's conditional variance given `u`, the inducing
# variance and the noise) into that average, by sampling, while NVC's carries only the
# inducing variance and the noise and pays for the conditional variance with Titsias' term,
# $\frac{\beta_1}{2} \sum_n (k_{nn} - q_{nn})$, weighed by the noise precision $\beta_1$
# (Hensman & Lawrence 2014). Neither bound dominates the other; NVC's is the tighter one only
# where the hidden layer's conditional variance is small next to its noise, and its optimum
# therefore prefers a hidden layer that passes on little uncertainty. With more layers NVC
# also pays for the variance of each layer's mean over its Gaussian input.
#
# ## 4. Training against wall-clock time
#
# DSVI's loss is a one-sample estimate: it jumps from step to step. NVC's is the bound itself,
# so its curve is smooth, and every step moves along the exact gradient.

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), sharey=True)
for name, (_, _, losses, t) in fits.items():
    axes[0].plot(t, -losses, lw=0.8, label=name, alpha=0.85)
    axes[1].plot(np.arange(1, len(losses) + 1), -losses, lw=0.8, label=name, alpha=0.85)
best = max(np.max(-losses) for _, _, losses, _ in fits.values())
axes[0].set(xlabel="training time (s, compilation excluded)", ylabel="training objective (nats)",
            title="against wall-clock time", ylim=(best - 400, best + 30))
axes[1].set(xlabel="step", title="against steps")
axes[0].legend(loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# In this run (one seed) DSVI's one-sample curve rises fast at first but has large downward
# spikes, and a late collapse from which it ends below NVC (its hidden layer's learned noise
# variance went to 4e-5, see above). NVC's curve is smooth between two sudden collapses of its
# own (near steps 2,300 and 3,600), each recovered within a few hundred steps. Fits of this
# model are chaotic: with other seeds and the same settings, half of 62 DSVI fits ended
# between -135 and -65 in final loss, and about one in ten above 0. NVC's steps cost more time
# here (psi statistics per point against one sample of the hidden layer); the UCI benchmark
# below measures both at scale.
#
# ## 5. Each layer's samples and the predictive
#
# The learned `q(u)` of both methods are ordinary Gaussian inducing posteriors, so
# `sample_layers` and `predict` apply unchanged (the hidden layer's noise is part of its
# samples). NVC also has a deterministic predictive, `predict_moment_matched`: the exact mean
# and variance of every layer's output per point, propagated as Gaussians (for two layers the
# hidden layer's marginal at fixed inputs *is* Gaussian, so it matches the sampled predictive).

# %%
grid = jnp.linspace(-1.5, 1.5, 200)[:, None]
fig, axes = plt.subplots(2, 3, figsize=(13, 6.8))
for row, (name, (guide, params, _, _)) in zip(axes, fits.items()):
    samples = dgp.sample_layers(model, guide, params, jax.random.PRNGKey(3), grid, num_samples=20)
    dgp.plots.plot_layer_samples(grid, samples, X, y, axes=row)
    row[0].set_title(f"{name}: layer 1, h1(x)")
fig.tight_layout()
plt.show()

# %%
def predictive(name, inputs):
    guide, params, _, _ = fits[name.split()[0]]
    if "moment" in name:
        return dgp.predict_moment_matched(model, guide, params, inputs)
    return dgp.predict(model, guide, params, jax.random.PRNGKey(4), inputs, num_samples=200)


fig, axes = plt.subplots(1, 3, figsize=(13, 3.4), sharey=True)
for ax, name in zip(axes, ["DSVI (sampled)", "NVC (sampled)", "NVC (moment-matched)"]):
    pred = predictive(name, grid)
    mean, sd = np.asarray(pred.mean), np.sqrt(np.asarray(pred.variance))
    ax.fill_between(grid[:, 0], mean - 2 * sd, mean + 2 * sd, alpha=0.25, label="mean ± 2 sd")
    ax.plot(grid[:, 0], mean, lw=1.5)
    ax.plot(X[:, 0], y, "k.", ms=3)
    test = dgp.metrics(predictive(name, X_test), y_test)
    ax.set(title=f"{name}: test LL {test['log_likelihood']:.2f}", xlabel="x")
axes[0].set_ylabel("y")
axes[0].legend(loc="upper left")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 6. FITC, VFE and SVGP on a problem with a gap
#
# One sparse layer with a Gaussian likelihood has three classic objectives (Bauer, van der
# Wilk & Rasmussen 2016 compare them):
#
# * **VFE** (Titsias 2009): $\log \mathcal N(y \mid 0, Q_{ff} + \sigma^2 I) - \frac{1}{2\sigma^2}
#   \operatorname{tr}(K_{ff} - Q_{ff})$, with $Q_{ff} = K_{fu}K_{uu}^{-1}K_{uf}$: a lower bound,
#   `q(u)` optimal and integrated out;
# * **SVGP** (Hensman et al. 2013): the same bound with `q(u)` explicit, which `DGPElbo`
#   computes for a one-layer model (it equals VFE at the optimal `q(u)`; the tests check this);
# * **FITC** (Snelson & Ghahramani 2006): $\log \mathcal N(y \mid 0, Q_{ff} + \Lambda)$ with
#   $\Lambda = \operatorname{diag}(K_{ff} - Q_{ff}) + \sigma^2 I$: the exact marginal likelihood
#   of another model, **not a bound**. Its per-point variance $\operatorname{diag}(K_{ff} -
#   Q_{ff})$ can absorb noise, so it tends to under-estimate $\sigma^2$ and over-fit.
#
# `CollapsedSparseGP("vfe")` and `CollapsedSparseGP("fitc")` compute both in $O(NM^2)$ without
# $N \times N$ matrices; no inducing values need a guide, so the guide is empty.
# `predict_collapsed` gives the FITC or VFE predictive. The data: 400 points with a gap in the
# middle, noise variance 0.09, 20 inducing inputs (learned).

# %%
rs = np.random.RandomState(1)
X_gap = np.concatenate([rs.uniform(-3, -0.7, 200), rs.uniform(1.2, 3, 200)])[:, None]
TRUE_NOISE = 0.09
y_gap = np.sin(2 * X_gap[:, 0]) + 0.3 * X_gap[:, 0] + np.sqrt(TRUE_NOISE) * rs.randn(400)
X_gap, y_gap = jnp.asarray(X_gap), jnp.asarray(y_gap)


def one_layer(X, y=None):
    f = dgp.gp_layer("f", X, RBF(), inducing_inputs=jnp.linspace(-3, 3, 20)[:, None])
    noise = numpyro.param("noise", jnp.asarray(0.5), constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


def no_guide(*args, **kwargs):  # the inducing values are integrated out: nothing to guide
    return None


grid_gap = jnp.linspace(-4, 4, 300)[:, None]
gap_fits = {}
for name in ("FITC", "VFE", "SVGP"):
    if name == "SVGP":
        guide = AutoFactorizedDGP(one_layer)
        svi = SVI(one_layer, guide, numpyro.optim.Adam(0.01), dgp.DGPElbo())
    else:
        svi = SVI(one_layer, no_guide, numpyro.optim.Adam(0.01), dgp.CollapsedSparseGP(name.lower()))
    params = dgp.fit(svi, jax.random.PRNGKey(0), X_gap, y_gap, num_steps=GAP_STEPS, progress_bar=False).params
    if name == "SVGP":
        pred = dgp.predict(one_layer, guide, params, jax.random.PRNGKey(1), grid_gap, num_samples=1)
    else:
        pred = dgp.predict_collapsed(one_layer, params, X_gap, y_gap, grid_gap, method=name.lower())
    gap_fits[name] = (params, pred)
    print(f"{name}: noise variance {float(params['noise']):.4f} (true {TRUE_NOISE}), lengthscale "
          f"{float(params['f.kernel.lengthscale'][0]):.3f}, signal variance {float(params['f.kernel.variance']):.3f}")

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
for ax, (name, (params, pred)) in zip(axes, gap_fits.items()):
    mean, sd = np.asarray(pred.mean), np.sqrt(np.asarray(pred.variance))
    ax.plot(X_gap[:, 0], y_gap, ".", color="0.6", ms=2)
    ax.fill_between(grid_gap[:, 0], mean - 2 * sd, mean + 2 * sd, alpha=0.3, color="C0", label="y: mean ± 2 sd")
    ax.plot(grid_gap[:, 0], mean, color="C0", lw=1.5)
    Z = np.asarray(params["f.inducing_inputs"])[:, 0]
    ax.plot(Z, np.full_like(Z, -3.2), "|", color="C3", ms=12, mew=2, label="inducing inputs")
    ax.set(title=f"{name}: noise variance {float(params['noise']):.3f} (true {TRUE_NOISE})", xlabel="x",
           xlim=(-4.2, 4.2), ylim=(-3.5, 3.5))
axes[0].set_ylabel("y")
axes[0].legend(loc="upper left", fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# VFE and SVGP agree (same bound, one with `q(u)` integrated out analytically, the other
# optimized) and recover the noise. FITC learns a noise variance well below the true one and a
# shorter lengthscale: its per-point variances take over part of the noise. That is the
# behaviour Bauer, van der Wilk & Rasmussen (2016) describe, and the reason FITC's objective is
# reported here as a marginal likelihood, not as a bound.
#
# ## 7. UCI numbers
#
# `benchmarks/nested.py` trains NVC and DSVI on the same 2-layer model (M = 100 inducing
# points per layer, a noisy hidden layer, the same steps and minibatches) on six UCI data sets
# and reports test log-likelihood, RMSE, the time per step and the training time NVC needs to
# reach DSVI's final training objective (both evaluated on the full training set, as bounds on
# the same evidence). Two NVC variants run: the bound above (`nvc`) and the cheaper one that
# forwards only each inner layer's noise (`nvc_penalize`,
# `NestedCompressionElbo(propagate_inducing_variance=False)`). The committed table:

# %%
# the tests run a copy of this notebook elsewhere, so find the results from the package
results = Path(dgp.__file__).resolve().parent.parent / "benchmarks" / "results"
table = (results / "nested_uci.md").read_text().split("Per split:")[0]
print("\n".join(line for line in table.splitlines() if not line.startswith("Machine")))
