"""Ready-made DGP models (plain NumPyro programs built from :func:`~numpyro_dgp.gp_layer`).

* :func:`deep_gp_regression` -- the doubly stochastic regression DGP of Salimbeni &
  Deisenroth (2017);
* :func:`diffgp` -- the differential GP (SDE flow of the inputs, then a GP) of Hegde et al.
  (2019);
* :func:`amortized_dgp` -- the amortized DGP of Meng & Zhang (2024).

The factories check their arguments when the model is built; every model checks its data
when it runs eagerly (the first run of ``svi.init`` / :func:`~numpyro_dgp.fit`): ``X`` must be a
finite ``(N, D)`` array (integers are cast to the default float, so the noise parameter, created
in ``X``'s dtype, is a float), ``y`` ``(N,)`` or ``(N, 1)`` (squeezed; ``(N, T)`` for
``num_outputs = T``) with finite values (NaN allowed where ``missing_targets="mask"``), and
features far from standardized give an :class:`~numpyro_dgp.InputScaleWarning`.

**References:**

* Salimbeni, Deisenroth (2017). Doubly stochastic variational inference for deep Gaussian
  processes. NeurIPS.
* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian
  process flows. AISTATS.
* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpyro
from jax.typing import ArrayLike

from numpyro_dgp._engine.observation import LIKELIHOODS, MISSING_TARGETS, Observation
from numpyro_dgp._protocol import attach_model_config
from numpyro_dgp._validation import (
    as_float_array,
    check_finite,
    check_kernel,
    check_mean,
    check_positive_int,
    check_positive_number,
)
from numpyro_dgp.handlers import sde_flow
from numpyro_dgp.kernels import RBF, Kernel, Matern52
from numpyro_dgp.layers import gp_layer

__all__ = [
    "LIKELIHOODS",
    "MISSING_TARGETS",
    "Observation",
    "WITH_REPLACEMENT_ABOVE",
    "amortized_dgp",
    "deep_gp_regression",
    "diffgp",
]

#: above this many points, minibatch indices are drawn with replacement (``O(B)`` per step)
#: instead of NumPyro's draw without replacement (``O(N)`` per step: a partial shuffle of
#: ``arange(N)`` on CPU, a permutation of ``N`` on accelerators)
WITH_REPLACEMENT_ABOVE = 100_000


def deep_gp_regression(
    num_layers: int = 2,
    *,
    num_inducing: int = 100,
    hidden_width: int | None = None,
    kernel: Kernel | None = None,
    noise_init: float = 0.01,
    inner_mean: str = "identity",
    whiten: bool = True,
    jitter: float | None = None,
    inner_noise: float | None = None,
    likelihood: str = "gaussian",
    num_outputs: int = 1,
    num_classes: int | None = None,
    missing_targets: str = "raise",
) -> Callable:
    """The DSVI regression DGP (Salimbeni & Deisenroth, 2017) as a NumPyro model.

    Layers ``h1 .. h{L}``: inner layers of width ``hidden_width`` (default: the input
    dimension) with an ``inner_mean`` mean function, a last layer with zero mean as wide as the
    likelihood needs (one output per target column; ``C`` for classes; two per column for the
    heteroscedastic Gaussian), then ``y ~ N(f, noise)`` or another likelihood (see
    ``likelihood``).

    The returned ``model(X, y=None, batch_size=None, num_data=None)`` subsamples
    ``batch_size`` points per call when given (minibatch SVI; the likelihood is rescaled by the
    plate; above :data:`WITH_REPLACEMENT_ABOVE` points the indices are drawn with replacement,
    so a step costs the same at any ``N``). With ``num_data``, ``X`` and ``y`` are themselves a
    minibatch of a data set of ``num_data`` points, drawn outside the model (from host memory
    or a memory-mapped file: :func:`numpyro_dgp.infer.fit_minibatches`), and the likelihood is
    scaled by ``num_data / len(X)``.

    :param num_layers: ``L >= 1`` (``L = 1`` is an SVGP).
    :param num_inducing: ``M`` per layer (k-means initialized).
    :param hidden_width: inner-layer width.
    :param kernel: kernel of every layer (initial values; default ARD RBF).
    :param noise_init: initial Gaussian noise variance.
    :param inner_mean: mean function of inner layers (see :func:`~numpyro_dgp.gp_layer`).
    :param whiten: whitened inducing values.
    :param jitter: Cholesky jitter (default by dtype).
    :param inner_noise: initial output-noise variance of every inner layer (``gp_layer(...,
        noise=...)``: a learned ``"h<l>.noise"``); ``None`` (default): noiseless inner layers, as
        in DSVI. :class:`~numpyro_dgp.objectives.NestedCompressionElbo` needs it.
    :param likelihood: one of :data:`LIKELIHOODS` (:mod:`numpyro_dgp.likelihoods`): ``"gaussian"``
        (learned noise ``"noise"``), ``"probit"`` (``y`` in {0, 1}), ``"softmax"`` or
        ``"robust_max"`` (``y`` in ``0..C-1``), ``"student_t"`` (learned ``"df"`` and
        ``"scale"``), ``"poisson"`` (counts), ``"negative_binomial"`` (counts, learned
        ``"concentration"``) or ``"heteroscedastic"`` (a Gaussian whose log-variance is a second
        output of the last layer).
    :param num_outputs: ``T``, target columns: ``y`` is ``(N, T)`` (one noise, df, scale or
        concentration per column).
    :param num_classes: ``C`` for ``"softmax"`` and ``"robust_max"``.
    :param missing_targets: ``"raise"`` (NaN targets are refused, naming ``y``) or ``"mask"``
        (NaN entries of ``y`` are left out of the likelihood; :func:`~numpyro_dgp.fit` then takes
        NaN in ``y``).
    :return: the model ``model(X, y=None, batch_size=None)``: ``X`` ``(N, D)``, ``y`` ``(N,)``
        (``(N, T)``).
    :raises ValueError: for an invalid argument (naming it).
    :raises NotImplementedError: for an unknown ``likelihood``.
    :raises TypeError: if ``kernel`` is not a :class:`~numpyro_dgp.kernels.Kernel`.
    """
    caller = "deep_gp_regression"
    config, observation = _observation(locals(), caller)
    check_positive_int(num_layers, "num_layers", caller)
    check_positive_int(num_inducing, "num_inducing", caller)
    check_positive_int(hidden_width, "hidden_width", caller, allow_none=True)
    check_mean(inner_mean, "inner_mean", caller)
    kernel = RBF() if kernel is None else kernel

    def layers(h, data):
        width = h.shape[-1] if hidden_width is None else hidden_width
        for layer in range(1, num_layers + 1):
            last = layer == num_layers
            h = gp_layer(
                f"h{layer}",
                h,
                kernel,
                num_inducing=num_inducing,
                out_dim=observation.width if last else width,
                mean="zero" if last else inner_mean,
                whiten=whiten,
                jitter=jitter,
                noise=None if last else inner_noise,
            )
        return h

    return attach_model_config(_model(caller, observation, layers), caller, config)


def _observation(arguments: dict, caller: str) -> tuple[dict, Observation]:
    """A factory's arguments as given (``locals()`` at its top), to attach to its model (the
    saved model's record), and its observation site built from them and checked, with the
    factories' shared arguments: ``kernel`` (``None``: the factory's default), ``noise_init``
    and ``jitter`` (``None``: by dtype).

    :raises TypeError: for a ``kernel`` that is not a :class:`~numpyro_dgp.kernels.Kernel`.
    :raises ValueError: for a ``noise_init`` or ``jitter`` that is not a finite positive number.
    """
    config = {k: v for k, v in arguments.items() if k != "caller"}
    observation = Observation(*(config[field] for field in Observation._fields))
    observation.check(caller)
    if config["kernel"] is not None:
        check_kernel(config["kernel"], "kernel", caller)
    check_positive_number(config["noise_init"], "noise_init", caller)
    if config["jitter"] is not None:
        check_positive_number(config["jitter"], "jitter", caller)
    return config, observation


def _model(caller: str, observation: Observation, layers: Callable) -> Callable:
    """A factory's ``model(X, y=None, batch_size=None, num_data=None)``: the data at the door
    (``X`` a finite float ``(N, D)`` array: integers cast to the default float, never left
    integer, as the noise is created in ``X``'s dtype; ``y`` as :meth:`Observation.targets`
    takes it), the data plate and the minibatch (:func:`_subsample`), ``layers(X_batch,
    plate)`` (the last layer's output), then the observation."""

    def model(X, y=None, batch_size=None, num_data=None):
        where = f"{caller} model"
        X = as_float_array(X, "X", where, ndim=2)
        check_finite(X, "X", where)
        y = observation.targets(y, X.shape[0], X.dtype, where)
        data, X_batch, y_batch = _subsample(X, y, batch_size, where, num_data)
        observation.observe(layers(X_batch, data), y_batch, data, X.dtype)

    return model


def diffgp(
    T: float = 1.0,
    *,
    num_steps: int = 20,
    num_inducing: int = 100,
    flow_kernel: Kernel | None = None,
    kernel: Kernel | None = None,
    likelihood: str = "gaussian",
    noise_init: float = 0.01,
    estimator: str = "marginal",
    diffusion: bool = True,
    flow_inducing_inputs: ArrayLike | None = None,
    time_input: bool = False,
    jitter: float | None = None,
    num_outputs: int = 1,
    num_classes: int | None = None,
    missing_targets: str = "raise",
) -> sde_flow:
    """The differential GP of Hegde et al. (2019), DiffGP: an SDE flow of the inputs, then a GP.

    A ``gp_layer`` ``"flow"`` (``D -> D``, zero mean, a weak field: ``flow_kernel`` defaults
    to an ARD RBF with variance 0.01 as in Hegde et al.) turned by
    :class:`numpyro_dgp.handlers.sde_flow` into the drift and diffusion of an Euler–Maruyama
    flow of the inputs to time ``T``; the end states go into the predictor ``gp_layer`` ``"g"``
    (``D -> 1``), then the likelihood. ``T = 0`` is an SVGP.

    The returned (``sde_flow``-wrapped) ``model(X, y=None, batch_size=None, num_data=None)``
    subsamples ``batch_size`` points per call when given (``num_data``: ``X`` is a minibatch,
    as for :func:`deep_gp_regression`).

    :param T: flow time.
    :param num_steps: Euler–Maruyama steps.
    :param num_inducing: ``M`` of the flow and of the predictor (k-means initialized).
    :param flow_kernel: kernel of the vector field (initial values).
    :param kernel: kernel of the predictor (default ARD RBF).
    :param likelihood: one of :data:`LIKELIHOODS` (see :func:`deep_gp_regression`).
    :param noise_init: initial Gaussian noise variance.
    :param estimator: ``"marginal"`` (Hegde et al.'s) or ``"ancestral"`` (see ``sde_flow``).
    :param diffusion: ``False`` gives the ODE flow.
    :param flow_inducing_inputs: ``(M, D)`` (``(M, D + 1)`` with ``time_input``) initial
        inducing inputs of the flow (instead of k-means); needed with ``time_input``
        (:func:`numpyro_dgp.sde.temporal_inducing_inputs`).
    :param time_input: time-dependent vector field ("temporal DiffGP"): the flow layer sees
        ``[x, t]``; give ``flow_kernel`` over ``D + 1`` inputs (the default ARD RBF adapts).
    :param jitter: Cholesky jitter (default by dtype).
    :param num_outputs: target columns (see :func:`deep_gp_regression`).
    :param num_classes: ``C`` for ``"softmax"`` and ``"robust_max"``.
    :param missing_targets: ``"raise"`` or ``"mask"`` (see :func:`deep_gp_regression`).
    :return: the :class:`~numpyro_dgp.handlers.sde_flow`-wrapped model
        ``model(X, y=None, batch_size=None)``.
    :raises ValueError: for an invalid argument (naming it).
    :raises NotImplementedError: for an unknown ``likelihood``.
    :raises TypeError: if a kernel is not a :class:`~numpyro_dgp.kernels.Kernel`.
    """
    config, observation = _observation(locals(), "diffgp")
    check_positive_number(T, "T", "diffgp", allow_zero=True)
    check_positive_int(num_steps, "num_steps", "diffgp")
    check_positive_int(num_inducing, "num_inducing", "diffgp")
    if flow_kernel is not None:
        check_kernel(flow_kernel, "flow_kernel", "diffgp")
    if time_input and flow_inducing_inputs is None:
        raise ValueError(
            "diffgp: time_input=True needs flow_inducing_inputs over (x, t), e.g. "
            "numpyro_dgp.sde.temporal_inducing_inputs(X, num_inducing, jnp.linspace(0, T, 3))"
        )
    flow_kernel = RBF(variance=0.01) if flow_kernel is None else flow_kernel
    kernel = RBF() if kernel is None else kernel

    def layers(X_batch, data):
        flow_in = X_batch
        if time_input:  # the flow's input [x, t] at t = 0
            flow_in = jnp.concatenate([X_batch, jnp.zeros((len(X_batch), 1), X_batch.dtype)], -1)
        h = gp_layer(
            "flow",
            flow_in,
            flow_kernel,
            num_inducing=None if flow_inducing_inputs is not None else num_inducing,
            inducing_inputs=flow_inducing_inputs,
            out_dim=X_batch.shape[-1],
            jitter=jitter,
        )
        return gp_layer(
            "g", h, kernel, num_inducing=num_inducing, out_dim=observation.width, jitter=jitter
        )

    model = _model("diffgp", observation, layers)
    flow = sde_flow(model, "flow", T, num_steps, estimator, diffusion, time_input)
    return attach_model_config(flow, "diffgp", config)


def amortized_dgp(
    widths: Sequence[int] = (16, 4, 1),
    num_inducing: Sequence[int] = (8, 4, 4),
    *,
    kernel: Kernel | None = None,
    likelihood: str = "gaussian",
    noise_init: float = 0.01,
    mean: str = "zero",
    average_kl: bool = True,
    jitter: float | None = None,
    num_outputs: int = 1,
    num_classes: int | None = None,
    missing_targets: str = "raise",
) -> Callable:
    """The amortized DGP of Meng & Zhang (2024) (AVDGP): every layer has per-point inducing
    sets (``gp_layer(..., inducing="amortized")``), fitted with
    :class:`numpyro_dgp.guides.AutoAmortizedDGP`.

    Layers ``h1 .. h{L}`` of widths ``widths`` (the last is the output, as wide as the
    likelihood needs: 1 for one Gaussian target, ``C`` for classes, ...) with
    ``num_inducing[l]`` inducing inputs per point, isotropic Matérn-5/2 kernels and zero mean
    functions (the settings of Meng & Zhang, App. C.1), then the likelihood.

    The returned ``model(X, y=None, batch_size=None, num_data=None)`` subsamples
    ``batch_size`` points per call when given (``num_data``: ``X`` is a minibatch, as for
    :func:`deep_gp_regression`).

    :param widths: output width per layer; the last is the likelihood's (1 for one Gaussian
        target, ``num_classes`` for classes, ``2 num_outputs`` for the heteroscedastic Gaussian).
    :param num_inducing: ``M`` per layer.
    :param kernel: kernel of every layer (initial values; default isotropic Matérn-5/2).
    :param likelihood: one of :data:`LIKELIHOODS` (see :func:`deep_gp_regression`).
    :param noise_init: initial Gaussian noise variance.
    :param mean: mean function of every layer (see :func:`~numpyro_dgp.gp_layer`).
    :param average_kl: the KL weighting of Meng & Zhang (averaged over points, ``1/N``);
        ``False`` gives the summed KL of a proper ELBO.
    :param jitter: Cholesky jitter (default by dtype).
    :param num_outputs: target columns (see :func:`deep_gp_regression`).
    :param num_classes: ``C`` for ``"softmax"`` and ``"robust_max"``.
    :param missing_targets: ``"raise"`` or ``"mask"`` (see :func:`deep_gp_regression`).
    :return: the model ``model(X, y=None, batch_size=None, num_data=None)``: ``X`` ``(N, D)``,
        ``y`` ``(N,)`` (``(N, T)`` for ``num_outputs = T > 1``).
    :raises ValueError: for an invalid argument (naming it).
    :raises TypeError: if ``kernel`` is not a :class:`~numpyro_dgp.kernels.Kernel`.
    """
    config, observation = _observation(locals(), "amortized_dgp")
    widths, num_inducing = tuple(widths), tuple(num_inducing)
    if not widths or widths[-1] != observation.width or len(num_inducing) != len(widths):
        raise ValueError(
            "amortized_dgp: widths and num_inducing need one entry per layer, the last width "
            f"the likelihood's {observation.width} output(s); got widths={widths!r}, "
            f"num_inducing={num_inducing!r}"
        )
    for i, (width, M) in enumerate(zip(widths, num_inducing)):
        check_positive_int(width, f"widths[{i}]", "amortized_dgp")
        check_positive_int(M, f"num_inducing[{i}]", "amortized_dgp")
    kernel = Matern52(ard=False) if kernel is None else kernel

    def layers(h, data):
        with data:
            for layer, (width, M) in enumerate(zip(widths, num_inducing), start=1):
                h = gp_layer(
                    f"h{layer}",
                    h,
                    kernel,
                    num_inducing=M,
                    out_dim=width,
                    mean=mean,
                    inducing="amortized",
                    average_kl=average_kl,
                    jitter=jitter,
                )
        return h

    model = _model("amortized_dgp", observation, layers)
    return attach_model_config(model, "amortized_dgp", config)


def _subsample(X, y, batch_size, caller, num_data):
    """The data plate and the minibatch: ``batch_size`` points of ``X`` (drawn here), or, with
    ``num_data``, ``X`` itself as a minibatch of a data set of ``num_data`` points (drawn by
    the caller, e.g. from host memory; the likelihood is scaled by ``num_data / len(X)``).
    Above :data:`WITH_REPLACEMENT_ABOVE` points the indices are drawn with replacement; below,
    by NumPyro's function.

    :raises ValueError: for a ``batch_size`` or ``num_data`` that is not a positive integer,
        both given, or ``num_data`` below ``N``.
    """
    N = X.shape[0]
    check_positive_int(batch_size, "batch_size", caller, allow_none=True)
    if num_data is not None:
        check_positive_int(num_data, "num_data", caller)
        if batch_size is not None:
            raise ValueError(
                f"{caller}: give batch_size (draw minibatches of X) or num_data (X is a "
                "minibatch), not both"
            )
        if num_data < N:
            raise ValueError(
                f"{caller}: num_data={num_data} is below the {N} points of the minibatch X"
            )
        with numpyro.handlers.substitute(data={"data": jnp.arange(N)}):  # the plate's indices
            return numpyro.plate("data", int(num_data), subsample_size=N), X, y
    subsample_size = batch_size if batch_size and batch_size < N else None
    key = numpyro.prng_key() if subsample_size and N > WITH_REPLACEMENT_ABOVE else None
    indices = None if key is None else jax.random.randint(key, (subsample_size,), 0, N)
    with numpyro.handlers.substitute(data={"data": indices}):  # None: NumPyro draws them
        data = numpyro.plate("data", N, subsample_size=subsample_size)
    with data:
        X_batch = numpyro.subsample(X, event_dim=1)
        # y (N,) or (N, T)
        y_batch = None if y is None else numpyro.subsample(y, event_dim=y.ndim - 1)
    return data, X_batch, y_batch
