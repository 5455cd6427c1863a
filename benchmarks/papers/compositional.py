"""Compositional uncertainty: one DGP, several variational families, per-layer variances.

The driver behind the reproduction of Table 1 and Fig. 5 of Ustyuzhaninov et al. (2020)
(``benchmarks/compositional.py``, ``tutorials/02_swapping_guides.ipynb``): :func:`composed_gp`
builds a DGP of 1-D layers with fixed hyperparameters and noise; :data:`FAMILIES` names the
four variational families (three guides on global inducing points, and inducing points as
inducing locations with a factorized guide); :func:`fit_family` fits one;
:func:`layer_variances` and :func:`elbo_estimate` measure what it kept.

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax.typing import ArrayLike
from numpyro.infer import SVI

from numpyro_dgp._engine.run import marginal_trace
from numpyro_dgp._validation import check_choice
from numpyro_dgp.guides import AutoChainDGP, AutoFactorizedDGP, AutoJointDGP, DGPGuide
from numpyro_dgp.infer import FitResult, fit
from numpyro_dgp.kernels import Kernel
from numpyro_dgp.layers import gp_layer
from numpyro_dgp.objectives import DGPElbo

if TYPE_CHECKING:
    import matplotlib.figure

__all__ = ["FAMILIES", "Family", "composed_gp", "fit_family", "layer_variances", "elbo_estimate"]


class Family(NamedTuple):
    """A variational family: a guide class, its options, and the layers' inducing mode.

    :ivar guide: the guide class (a :class:`~numpyro_dgp.guides.DGPGuide`).
    :ivar inducing: the layers' ``inducing`` mode, ``"global"`` or ``"locations"``
        (see :func:`numpyro_dgp.gp_layer`).
    :ivar label: a name for tables and plots.
    """

    guide: type
    inducing: str
    label: str


#: The four variational families of Ustyuzhaninov et al. (2020), by name: ``"factorized"``,
#: ``"joint"``, ``"chain"`` (global inducing points) and ``"locations"`` (inducing points as
#: inducing locations, their Sec. 4.2).
FAMILIES = {
    "factorized": Family(AutoFactorizedDGP, "global", "DSVI (factorized)"),
    "joint": Family(AutoJointDGP, "global", "jointly Gaussian"),
    "chain": Family(AutoChainDGP, "global", "chain-structured"),
    "locations": Family(AutoFactorizedDGP, "locations", "inducing locations (4.2)"),
}


def _check_composed_gp(kernels: list[Kernel], noise: float) -> None:
    """Raise unless there is a kernel per layer (at least one) and ``noise`` is positive.

    :raises ValueError: otherwise.
    """
    if not kernels:
        raise ValueError("composed_gp: kernels must name at least one layer")
    if not noise > 0:
        raise ValueError(f"composed_gp: noise must be positive, got {noise!r}")


def composed_gp(
    kernels: Sequence[Kernel],
    *,
    num_inducing: int,
    inducing: str = "global",
    noise: float = 1e-3,
    inner_mean: str = "identity",
    inducing_inputs: ArrayLike | None = None,
    inner_inducing_inputs: ArrayLike | None = None,
    learn_hyperparameters: bool = False,
    learn_inducing: bool = True,
    jitter: float | None = None,
) -> Callable:
    """A DGP ``f_L o ... o f_1`` of 1-D GP layers ``h1 .. hL`` (kernels in order) with a fixed
    Gaussian noise variance, as in the toy experiments of Ustyuzhaninov et al. (2020).

    :param kernels: one kernel per layer (their values are used as given unless
        ``learn_hyperparameters``).
    :param num_inducing: ``M`` per layer.
    :param inducing: ``"global"`` or ``"locations"`` (see :func:`numpyro_dgp.gp_layer`).
    :param noise: likelihood variance (fixed).
    :param inner_mean: mean function of the inner layers.
    :param inducing_inputs: ``(M, 1)`` initial inducing inputs of the first layer (default k-means).
    :param inner_inducing_inputs: ``(M, 1)`` initial inducing inputs of the inner layers with
        ``inducing="global"`` (default k-means on the propagated values).
    :param learn_hyperparameters: optimize the kernel hyperparameters (default: fixed).
    :param learn_inducing: optimize the inducing inputs (with ``"locations"``: the first layer's).
    :param jitter: Cholesky jitter of every layer (default by dtype). Inducing locations need
        more than the float64 default: ``K(f_(l-1)^z)`` is as ill-conditioned as the previous
        layer makes its inducing values (nearly singular when that layer maps two inducing
        inputs close together).
    :return: ``model(X, y=None)`` with ``X`` ``(N, 1)`` and ``y`` ``(N,)``.
    """
    kernels = list(kernels)
    _check_composed_gp(kernels, noise)

    def model(X, y=None):
        h = X
        for i, kernel in enumerate(kernels):
            last = i == len(kernels) - 1
            kw = {}
            if i == 0 or inducing == "global":
                Z = inducing_inputs if i == 0 else inner_inducing_inputs
                kw = {"inducing_inputs": Z} if Z is not None else {"num_inducing": num_inducing}
            h = gp_layer(
                f"h{i + 1}",
                h,
                kernel,
                mean="zero" if last else inner_mean,
                inducing=inducing,
                learn_hyperparameters=learn_hyperparameters,
                learn_inducing=learn_inducing,
                jitter=jitter,
                **kw,
            )
        f = h[0] if inducing == "locations" else h
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample(
                "y", dist.Normal(f[..., 0], jnp.sqrt(jnp.asarray(noise, X.dtype))), obs=y
            )

    return model


def fit_family(
    family: str,
    kernels: Sequence[Kernel],
    X: ArrayLike,
    y: ArrayLike,
    *,
    rng_key: jax.Array,
    num_steps: int,
    learning_rate: float = 0.01,
    clip_norm: float | None = 1000.0,
    inner_init: str = "deterministic",
    num_particles: int = 1,
    progress_bar: bool = False,
    **model_kwargs,
) -> tuple[Callable, DGPGuide, FitResult]:
    """Fit one family of :data:`FAMILIES` on ``(X, y)`` with Adam and
    :class:`~numpyro_dgp.DGPElbo`.

    :param family: a key of :data:`FAMILIES`.
    :param kernels: one kernel per layer (see :func:`composed_gp`).
    :param X: ``(N, 1)`` training inputs.
    :param y: ``(N,)`` training targets.
    :param rng_key: PRNG key.
    :param num_steps: optimization steps.
    :param learning_rate: Adam's step size.
    :param clip_norm: clip each update's gradient to this global norm (``None``: no clipping).
        Inducing locations need it: a sample that puts two of layer ``l``'s locations close
        together makes ``K(f_(l-1)^z)`` nearly singular and its KL gradient huge.
    :param inner_init: the guide's ``inner_init`` option.
    :param num_particles: Monte Carlo samples per step.
    :param progress_bar: show a progress bar.
    :param model_kwargs: further options of :func:`composed_gp` (``num_inducing`` is required).
    :return: ``(model, guide, FitResult)``.
    """
    check_choice(family, tuple(sorted(FAMILIES)), "family", "fit_family")
    spec = FAMILIES[family]
    model = composed_gp(kernels, inducing=spec.inducing, **model_kwargs)
    guide = spec.guide(model, inner_init=inner_init)
    adam = optax.adam(learning_rate)
    optimizer = (
        adam if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), adam)
    )
    svi = SVI(
        model,
        guide,
        numpyro.optim.optax_to_numpyro(optimizer),
        DGPElbo(num_particles=num_particles),
    )
    result: FitResult = fit(svi, rng_key, X, y, num_steps=num_steps, progress_bar=progress_bar)
    return model, guide, result


def layer_variances(
    model: Callable,
    guide: Callable,
    params: dict,
    x: ArrayLike,
    rng_key: jax.Array,
    num_samples: int = 2000,
    *,
    own_input: bool = False,
) -> dict[str, np.ndarray]:
    """Variance of every layer's output at the points ``x`` under the fitted ``q``.

    By default layer ``l`` at ``x`` is the composition ``f_l(f_{l-1}(... f_1(x)))``; with
    ``own_input=True`` every layer is evaluated at ``x`` as its *own* input, ``f_l(x)``
    (:class:`numpyro_dgp.handlers.layer_inputs`; needs layers whose input width is ``x``'s).
    The variance is estimated by the law of total variance over ``num_samples`` propagated
    samples, each contributing the layer's exact Gaussian moments given its sampled input
    (and, with inducing locations or a guide that correlates layers, given what the layers
    before drew).

    :param model: the fitted model.
    :param guide: the fitted guide.
    :param params: the fitted parameters.
    :param x: ``(N, 1)`` points.
    :param rng_key: PRNG key.
    :param num_samples: propagated samples.
    :param own_input: evaluate every layer at ``x`` itself rather than at the composition.
    :return: ``{layer: (N,)}`` for the first output of each layer.
    """
    from numpyro_dgp.handlers import layer_inputs

    x = jnp.asarray(x)
    if own_input:
        # the layer names, from an abstract run (nothing is computed)
        found = {}

        def probe():
            found["names"] = marginal_trace(model, guide, params, rng_key, (x,), {}).layer_order
            return 0

        jax.eval_shape(probe)
        names = found["names"]
        model = layer_inputs(model, {name: x for name in names[1:]}) if len(names) > 1 else model

    def one(key):
        run = marginal_trace(model, guide, params, key, (x,), {})
        return {n: (m[:, 0], v[:, 0]) for n, (m, v) in run.moments.items()}

    keys = jax.random.split(rng_key, int(num_samples))
    moments = jax.jit(jax.vmap(one))(keys)
    return {n: np.asarray(v.mean(0) + m.var(0)) for n, (m, v) in moments.items()}


def elbo_estimate(
    model: Callable,
    guide: Callable,
    params: dict,
    X: ArrayLike,
    y: ArrayLike,
    rng_key: jax.Array,
    num_draws: int = 500,
) -> tuple[float, float]:
    """The ELBO at ``params`` (mean of ``num_draws`` :class:`~numpyro_dgp.DGPElbo` draws) and
    its standard error.

    :param model: the fitted model.
    :param guide: the fitted guide.
    :param params: the fitted parameters.
    :param X: ``(N, 1)`` training inputs.
    :param y: ``(N,)`` training targets.
    :param rng_key: PRNG key.
    :param num_draws: single-sample ELBO draws.
    :return: ``(mean, standard_error)``.
    """
    keys = jax.random.split(rng_key, int(num_draws))
    draws = jax.jit(jax.vmap(lambda k: -DGPElbo().loss(k, params, model, guide, X, y)))(keys)
    draws = np.asarray(draws)
    return float(draws.mean()), float(draws.std(ddof=1) / np.sqrt(len(draws)))


def family_samples(
    model: Callable,
    guide: Callable,
    params: dict,
    grid: ArrayLike,
    rng_key: jax.Array,
    num_samples: int = 25,
) -> dict[str, np.ndarray]:
    """Coherent function samples of every layer on ``grid`` (see :func:`numpyro_dgp.sample_layers`):
    the inducing values are drawn from the guide jointly, so a sample shows how the layers
    co-vary.

    :param model: the fitted model.
    :param guide: the fitted guide.
    :param params: the fitted parameters.
    :param grid: ``(G, 1)`` inputs of the first layer.
    :param rng_key: PRNG key.
    :param num_samples: ``S``, function samples.
    :return: ``{layer: (S, G)}`` (first output).
    """
    from numpyro_dgp._predict.prediction import sample_layers

    samples = sample_layers(model, guide, params, rng_key, grid, num_samples=num_samples)
    return {n: np.asarray(v[..., 0]) for n, v in samples.items()}


def plot_compositions(
    samples_by_family: dict[str, dict[str, np.ndarray]],
    grid: ArrayLike,
    X: ArrayLike | None = None,
    y: ArrayLike | None = None,
    labels: dict[str, str] | None = None,
) -> matplotlib.figure.Figure:
    """Fig. 5 of Ustyuzhaninov et al. (2020): per family (rows), each layer against its own
    input and the composition.

    :param samples_by_family: ``{family: {layer: (S, G)}}`` from :func:`family_samples`.
    :param grid: ``(G, 1)`` inputs of the first layer.
    :param X: ``(N, 1)`` training inputs to draw on the composition panels.
    :param y: ``(N,)`` training targets.
    :param labels: row labels by family (default: the :data:`FAMILIES` label, else the key).
    :return: a matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    fams = list(samples_by_family)
    layer_names = list(samples_by_family[fams[0]])
    ncols = len(layer_names) + 1
    fig, axes = plt.subplots(
        len(fams), ncols, figsize=(3.2 * ncols, 2.6 * len(fams)), squeeze=False
    )
    g = np.asarray(grid)[:, 0]
    for r, fam in enumerate(fams):
        layers = samples_by_family[fam]
        inputs = np.broadcast_to(g, layers[layer_names[0]].shape)
        for c, name in enumerate(layer_names):
            ax = axes[r, c]
            out = layers[name]
            for s in range(out.shape[0]):
                ax.plot(inputs[s], out[s], lw=0.8, alpha=0.6, color=f"C{r}")
            ax.set_title(f"{name} vs its input", fontsize=9)
            inputs = out
        ax = axes[r, -1]
        last = layers[layer_names[-1]]
        for s in range(last.shape[0]):
            ax.plot(g, last[s], lw=0.8, alpha=0.6, color=f"C{r}")
        if X is not None and y is not None:
            ax.plot(np.asarray(X)[:, 0], np.asarray(y), "k.", ms=3)
        ax.set_title("composition vs x", fontsize=9)
        label = (labels or {}).get(fam, FAMILIES[fam].label if fam in FAMILIES else fam)
        axes[r, 0].set_ylabel(label, fontsize=9)
    fig.tight_layout()
    return fig
