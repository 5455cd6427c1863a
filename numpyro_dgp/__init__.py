"""numpyro-dgp: deep Gaussian processes written as ordinary NumPyro programs.

Write a DGP with :func:`gp_layer`; choose inference by choosing a guide
(:mod:`numpyro_dgp.guides`: factorised, joint, chain-structured, amortized), an objective
(:class:`DGPElbo`, :class:`PredictiveObjective` or NumPyro's own ELBOs) or a handler
(:mod:`numpyro_dgp.handlers`: SDE flows, quadrature branches, exact layers); train with
:func:`fit`; predict with :func:`predict`.
Run MCMC on the same model (NUTS on :class:`handlers.exact_layers` /
:class:`handlers.latent_conditionals`, or :class:`infer.SGHMC`) and compare layer by layer
with :mod:`numpyro_dgp.diagnostics`.
"""

from numpyro_dgp import (
    compositional,
    core,
    datasets,
    diagnostics,
    experiments,
    guides,
    handlers,
    kernels,
    likelihoods,
    models,
    plots,
    sde,
    signflip,
)
from numpyro_dgp.infer import FitResult, fit
from numpyro_dgp.io import load_params, save_params
from numpyro_dgp.layers import gp_layer
from numpyro_dgp.likelihoods import bernoulli_probit
from numpyro_dgp.objectives import DGPElbo, PredictiveObjective
from numpyro_dgp.predict import (
    NonFinitePredictionWarning,
    Prediction,
    gaussian_mixture_crps,
    log_likelihood,
    metrics,
    predict,
    predict_from_samples,
    sample_layers,
)

__version__ = "0.1.0"

__all__ = [
    "DGPElbo",
    "FitResult",
    "NonFinitePredictionWarning",
    "Prediction",
    "PredictiveObjective",
    "bernoulli_probit",
    "compositional",
    "core",
    "datasets",
    "diagnostics",
    "experiments",
    "fit",
    "gaussian_mixture_crps",
    "gp_layer",
    "guides",
    "handlers",
    "kernels",
    "likelihoods",
    "load_params",
    "log_likelihood",
    "metrics",
    "models",
    "plots",
    "predict",
    "predict_from_samples",
    "sample_layers",
    "save_params",
    "sde",
    "signflip",
]
