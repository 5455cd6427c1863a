# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Any likelihood, natural gradients, missing targets and latent inputs
#
# The same `gp_layer` programs, with what users of GPflux and GPyTorch reach for beyond
# Gaussian regression:
#
# 1. setup · 2. **multi-class classification** (a softmax over ten outputs, on the handwritten
# digits scikit-learn ships) · 3. **heteroscedastic** regression (a second output for the
# log-variance) · 4. **counts** (Poisson) · 5. **natural gradients** against Adam, in
# wall-clock time · 6. **missing and several targets** · 7. a **latent-variable layer** and the
# importance-weighted bound: a conditional density with two modes.
#
# Every likelihood is an ordinary NumPyro distribution built from the last layer's output
# (`numpyro_dgp.likelihoods`); `DGPElbo` takes its expectation over the layer's Gaussian in
# closed form where there is one (Poisson, heteroscedastic Gaussian, robust max), by
# Gauss-Hermite quadrature for one output and by Monte Carlo otherwise; `predict` returns the
# predictive distribution of the observation and `metrics` the scores that go with it.

# %% [markdown]
# ## 1. Setup
#
# `SMOKE` shortens every costly step (the test suite sets `NUMPYRO_DGP_SMOKE=1`; numbers
# printed in that mode are not meaningful).

# %%
import os
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

warnings.filterwarnings("ignore", message="IProgress not found")
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI

import numpyro_dgp as dgp
from numpyro_dgp import likelihoods
from numpyro_dgp.guides import AutoFactorizedDGP
from numpyro_dgp.kernels import RBF

plt.rcParams["figure.dpi"] = 90
SMOKE = os.environ.get("NUMPYRO_DGP_SMOKE") == "1"
STEPS = 100 if SMOKE else 3000   # optimization steps of every fit
SIZE = 0.25 if SMOKE else 1.0    # the fraction of each data set used
M = 20 if SMOKE else 50          # inducing points per layer of the larger models
print(f"SMOKE={SMOKE}, STEPS={STEPS}")


def fit(model, guide, objective, *args, steps=STEPS, lr=0.01, optimizer=None, **kwargs):
    svi = SVI(model, guide, optimizer or numpyro.optim.Adam(lr), objective)
    return dgp.fit(svi, jax.random.PRNGKey(0), *args, num_steps=steps, progress_bar=False, **kwargs)


# %% [markdown]
# ## 2. Ten classes: a softmax over the last layer's outputs
#
# The 8 x 8 handwritten digits of `sklearn.datasets.load_digits` (1,797 images, bundled with
# scikit-learn, no download), standardized. Two layers: 64 inputs to a hidden layer of width
# 8, then 10 outputs, one per class, and `likelihoods.softmax(f)`, i.e.
# `Categorical(logits=f)`. Its expectation over the last layer has no closed form over ten
# outputs: `DGPElbo` draws 32 Monte Carlo samples per point.

# %%
from sklearn.datasets import load_digits

digits = load_digits()
rng = np.random.default_rng(0)
order = rng.permutation(len(digits.target))
train, test = order[:1500], order[1500:]
train, test = train[: int(SIZE * len(train))], test[: int(SIZE * len(test))]
images = digits.data
mean, scale = images[train].mean(0), images[train].std(0) + 1e-3
X_digits = (images - mean) / scale
labels = digits.target


def softmax_model(X, y=None, batch_size=None):
    data = numpyro.plate("data", X.shape[0], subsample_size=batch_size)
    with data:
        X_batch = numpyro.subsample(X, event_dim=1)
        y_batch = None if y is None else numpyro.subsample(y, event_dim=0)
    h = dgp.gp_layer("h1", X_batch, RBF(lengthscale=8.0), num_inducing=M, out_dim=8, mean="identity")
    f = dgp.gp_layer("h2", h, RBF(), num_inducing=M, out_dim=10)
    with data:
        numpyro.sample("y", likelihoods.softmax(f), obs=y_batch)


digit_guide = AutoFactorizedDGP(softmax_model)
start = time.perf_counter()
digit_fit = fit(softmax_model, digit_guide, dgp.DGPElbo(), jnp.asarray(X_digits[train]), jnp.asarray(labels[train]),
                batch_size=min(256, len(train)), lr=0.02)
print(f"fitted in {time.perf_counter() - start:.0f} s, {digit_fit.num_skipped} skipped steps")
digit_pred = dgp.predict(softmax_model, digit_guide, digit_fit.params, jax.random.PRNGKey(1),
                         jnp.asarray(X_digits[test]), num_samples=10 if SMOKE else 50)
print("class probabilities:", digit_pred.mean.shape)
print({k: round(v, 4) for k, v in dgp.metrics(digit_pred, labels[test]).items()})

# %% [markdown]
# `mean` holds the class probabilities `(N, 10)`; `metrics` gives the accuracy, the mean
# log-likelihood, the Brier score and the expected calibration error. A reliability diagram
# shows the calibration, and the least certain test digits show what the model doubts.

# %%
probs = np.asarray(digit_pred.mean)
confidence, predicted = probs.max(1), probs.argmax(1)
bins = np.linspace(0, 1, 11)
which = np.clip(np.digitize(confidence, bins) - 1, 0, 9)
centres, accuracy = [], []
for b in range(10):
    if np.any(which == b):
        centres.append(confidence[which == b].mean())
        accuracy.append(np.mean(predicted[which == b] == labels[test][which == b]))
fig, axes = plt.subplots(1, 5, figsize=(12, 2.6), gridspec_kw={"width_ratios": [2, 1, 1, 1, 1]})
axes[0].plot([0, 1], [0, 1], "k:", lw=1)
axes[0].plot(centres, accuracy, "o-")
axes[0].set(xlabel="confidence", ylabel="accuracy", title="reliability")
for ax, i in zip(axes[1:], np.argsort(confidence)[:4]):
    ax.imshow(digits.images[test[i]], cmap="gray_r")
    top = np.argsort(probs[i])[::-1][:2]
    ax.set_title(f"{top[0]}: {probs[i, top[0]]:.2f}\n{top[1]}: {probs[i, top[1]]:.2f}", fontsize=9)
    ax.axis("off")
plt.tight_layout()
plt.show()

# %% [markdown]
# `likelihoods.robust_max(f, epsilon)` is GPflow's robust max: the largest output's class
# with probability `1 - epsilon`. It is piecewise constant in `f`, so it trains only through
# its closed form (a one-dimensional Gauss-Hermite sum), which `DGPElbo` takes when the guide
# has an independent Gaussian per layer; the objectives refuse it otherwise.

# %% [markdown]
# ## 3. Heteroscedastic regression
#
# Noise that grows with `|x|`. A last layer with two outputs, the mean and the log-variance
# (`likelihoods.heteroscedastic_normal(f)`, expectation in closed form), against the usual
# Gaussian with one learned noise.

# %%
n1 = int(400 * SIZE)
x1 = np.sort(np.random.default_rng(1).uniform(-3, 3, n1))[:, None]
y1 = np.sin(x1[:, 0]) + (0.05 + 0.3 * np.abs(x1[:, 0])) * np.random.default_rng(2).normal(size=n1)
X1, Y1 = jnp.asarray(x1), jnp.asarray(y1)


def hetero_model(X, y=None):
    f = dgp.gp_layer("f", X, RBF(), num_inducing=20, out_dim=2)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", likelihoods.heteroscedastic_normal(f), obs=y)


def homo_model(X, y=None):
    f = dgp.gp_layer("f", X, RBF(), num_inducing=20)
    noise = numpyro.param("noise", 0.1, constraint=dist.constraints.positive)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


fig, axes = plt.subplots(1, 2, figsize=(11, 3), sharey=True)
for ax, (name, m) in zip(axes, [("heteroscedastic", hetero_model), ("one noise", homo_model)]):
    g = AutoFactorizedDGP(m)
    r = fit(m, g, dgp.DGPElbo(), X1, Y1, lr=0.02)
    p = dgp.predict(m, g, r.params, jax.random.PRNGKey(1), X1, num_samples=30)  # at the (sorted) data
    lo, hi = np.asarray(dgp.predictive_quantiles(p, [0.05, 0.95]))
    ax.plot(x1, y1, "k.", ms=2)
    ax.plot(x1[:, 0], p.mean, "C0")
    ax.fill_between(x1[:, 0], lo, hi, color="C0", alpha=0.25, label="90% interval")
    ax.set(title=f"{name}: training LL {dgp.metrics(p, y1)['log_likelihood']:.3f}", xlabel="x")
axes[0].legend(loc="upper left")
plt.show()

# %% [markdown]
# ## 4. Counts
#
# `likelihoods.poisson(f)` is `Poisson(exp(f))` (an `exposure=` argument multiplies the rate);
# its expected log-likelihood is in closed form. The prediction keeps each component as a
# mixture of Poisson distributions at the quadrature nodes, so its quantiles are counts.

# %%
x2 = np.sort(np.random.default_rng(3).uniform(0, 10, int(300 * SIZE)))[:, None]
counts = np.random.default_rng(4).poisson(np.exp(1 + np.sin(x2[:, 0])))


def poisson_model(X, y=None):
    f = dgp.gp_layer("f", X, RBF(lengthscale=2.0), num_inducing=15)
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", likelihoods.poisson(f), obs=y)


pg = AutoFactorizedDGP(poisson_model)
pr = fit(poisson_model, pg, dgp.DGPElbo(), jnp.asarray(x2), jnp.asarray(counts), lr=0.02)
grid2 = jnp.linspace(0, 10, 100)[:, None]
pp = dgp.predict(poisson_model, pg, pr.params, jax.random.PRNGKey(1), grid2, num_samples=30)
lo, hi = np.asarray(dgp.predictive_quantiles(pp, [0.05, 0.95]))
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(x2, counts, "k.", ms=3)
ax.plot(grid2[:, 0], pp.mean, "C1", label="predictive mean")
ax.plot(grid2[:, 0], np.exp(1 + np.sin(grid2[:, 0])), "k:", label="true rate")
ax.fill_between(grid2[:, 0], lo, hi, step="mid", color="C1", alpha=0.25, label="90% interval")
ax.set(xlabel="x", ylabel="count")
ax.legend()
plt.show()

# %% [markdown]
# ## 5. Natural gradients against Adam
#
# `dgp.infer.natural_gradients(guide, others, step_size, layers)` is an optimizer for `SVI`
# and `fit`: natural-gradient steps on the Gaussian `q(u)` of the chosen layers (default: the
# last), `others` (Adam) on every other parameter, from the same gradient (Salimbeni et al.
# 2018). With a Gaussian likelihood and one layer a step of size 1 lands on the optimal
# `q(u)`; a DGP takes a ramp, `natural_gradient_ramp` (log-linear from 1e-4 to 0.1 here). The
# curves below are against wall-clock time, compilation excluded.

# %%
n3 = int(2000 * SIZE)
x3 = np.random.default_rng(5).uniform(-2, 2, (n3, 2))
y3 = np.sin(2 * x3[:, 0]) * np.cos(x3[:, 1]) + 0.1 * np.random.default_rng(6).normal(size=n3)
X3, Y3 = jnp.asarray(x3), jnp.asarray(y3)
deep = dgp.models.deep_gp_regression(2, num_inducing=M)
curves = {}
for name in ("Adam", "natural gradients (last layer) + Adam"):
    g = AutoFactorizedDGP(deep)
    optimizer = None
    if name != "Adam":
        optimizer = dgp.infer.natural_gradients(g, optax.adam(0.01), step_size=dgp.infer.natural_gradient_ramp(1e-4, 0.1, 10))
    r = fit(deep, g, dgp.DGPElbo(), X3, Y3, optimizer=optimizer, chunk_size=50)
    curves[name] = (np.cumsum(np.repeat(r.chunk_seconds / 50, 50))[: len(r.losses)], r.losses)
    print(f"{name}: final loss {np.mean(r.losses[-50:]):.1f}, {r.seconds_per_step * 1e3:.1f} ms per step, "
          f"{r.num_skipped} skipped")
fig, ax = plt.subplots(figsize=(6, 3))
for name, (t, losses) in curves.items():
    ax.plot(t, losses, label=name)
ax.set(xlabel="seconds (compilation excluded)", ylabel="negative ELBO", yscale="symlog")
ax.legend()
plt.show()

# %% [markdown]
# ## 6. Several targets, some missing
#
# One model for two target columns: the last layer has two outputs and the factory models
# take `num_outputs=2` (one noise per column). Entries of `y` that are NaN are left out of the
# likelihood with `missing_targets="mask"` (the default refuses them, naming `y`); `fit`
# recognizes such a model, and `metrics(..., per_column=True)` scores each column on its
# present entries.

# %%
x4 = np.random.default_rng(7).uniform(-2, 2, (400, 1))
Y4 = np.stack([np.sin(2 * x4[:, 0]), np.cos(2 * x4[:, 0])], 1) + 0.1 * np.random.default_rng(8).normal(size=(400, 2))
gaps = Y4.copy()
gaps[np.random.default_rng(9).random(400) < 0.4, 1] = np.nan  # 40% of the second column missing
two = dgp.models.deep_gp_regression(1, num_inducing=20, num_outputs=2, missing_targets="mask")
tg = AutoFactorizedDGP(two)
tr = fit(two, tg, dgp.DGPElbo(), jnp.asarray(x4[:300]), jnp.asarray(gaps[:300]), lr=0.02)
tp = dgp.predict(two, tg, tr.params, jax.random.PRNGKey(1), jnp.asarray(x4[300:]), num_samples=20)
print("prediction:", tp.mean.shape)
print("per column:", {k: np.round(v, 3).tolist() for k, v in dgp.metrics(tp, Y4[300:], per_column=True).items()})
print(f"{int(np.isnan(gaps[:300, 1]).sum())} of 300 training targets of column 2 were missing")

# %% [markdown]
# ## 7. A latent-variable layer: two modes
#
# Each point is on one of two branches, `y = +-(0.5 + x^2) + noise`: no function of `x` fits
# it, and a GP on `x` alone averages the branches. `latent_input("w", X, 1)` appends a latent
# `w_n ~ N(0, 1)` to each point's input (inside the data plate; GPflux's
# `LatentVariableLayer`), the guide encodes `q(w_n)` from `[x_n, y_n]` (`latent_inputs=
# "amortized"`), and `ImportanceWeightedElbo(K)` draws `K` latents per point and weights them
# (Salimbeni et al. 2019). `predict` draws the latents of new points from their prior, so the
# predictive is a mixture over them, with both modes.

# %%
n5 = int(400 * SIZE)
x5 = np.random.default_rng(10).uniform(-1, 1, (n5, 1))
y5 = np.random.default_rng(11).choice([-1.0, 1.0], n5) * (0.5 + x5[:, 0] ** 2) + 0.05 * np.random.default_rng(12).normal(size=n5)


def latent_model(X, y=None):
    data = numpyro.plate("data", X.shape[0])
    with data:
        h = dgp.latent_input("w", X, 1, encoder_input=X if y is None else jnp.concatenate([X, y[:, None]], -1))
    f = dgp.gp_layer("f", h, RBF(), num_inducing=M)
    noise = numpyro.param("noise", 0.1, constraint=dist.constraints.positive)
    with data:
        numpyro.sample("y", dist.Normal(f[..., 0], jnp.sqrt(noise)), obs=y)


lg = AutoFactorizedDGP(latent_model, latent_inputs="amortized", latent_hidden_width=32)
latent_fit = fit(latent_model, lg, dgp.ImportanceWeightedElbo(num_importance=8), jnp.asarray(x5), jnp.asarray(y5), lr=0.02)
plain_guide = AutoFactorizedDGP(homo_model)
plain = fit(homo_model, plain_guide, dgp.DGPElbo(), jnp.asarray(x5), jnp.asarray(y5), lr=0.02)
xs = np.linspace(-1, 1, 30 if SMOKE else 60)[:, None]
ys = np.linspace(-2.2, 2.2, 40 if SMOKE else 120)
density = {}
for name, (m, g, p) in {"latent-variable layer, IW bound": (latent_model, lg, latent_fit.params),
                        "GP on x alone": (homo_model, plain_guide, plain.params)}.items():
    pred = dgp.predict(m, g, p, jax.random.PRNGKey(1), jnp.asarray(xs), num_samples=30 if SMOKE else 300)
    density[name] = np.stack([np.exp(np.asarray(dgp.log_likelihood(pred, np.full(len(xs), v)))) for v in ys])
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), sharey=True)
for ax, (name, d) in zip(axes, density.items()):
    ax.pcolormesh(xs[:, 0], ys, d, shading="auto", cmap="Blues")
    ax.plot(x5, y5, "k.", ms=1.5, alpha=0.5)
    ax.set(title=name, xlabel="x")
axes[0].set_ylabel("y")
plt.show()
