"""numpyro-dgp: deep Gaussian processes written as ordinary NumPyro programs.

Write a DGP with :func:`gp_layer`; choose inference by choosing a guide
(:mod:`numpyro_dgp.guides`: factorized, joint, chain-structured, amortized), an objective
(:class:`DGPElbo`, :class:`PredictiveObjective`, :class:`NestedCompressionElbo`,
:class:`CollapsedSparseGP` or NumPyro's own ELBOs) or a handler
(:mod:`numpyro_dgp.handlers`: SDE flows, quadrature branches, exact layers); train with
:func:`fit`; predict with :func:`predict` (or, deterministically, :func:`predict_moment_matched`
and :func:`predict_collapsed`). Parameters handed to :func:`predict`,
:func:`fit` or :func:`load_params` are checked against the model (:func:`check_params`,
:class:`ParameterMismatchError`); data are checked at the door (:class:`InputScaleWarning`). Run MCMC on the same model (NUTS on
:class:`~numpyro_dgp.handlers.exact_layers` / :class:`~numpyro_dgp.handlers.latent_conditionals`,
or :class:`~numpyro_dgp.infer.SGHMC`) and compare layer by layer with
:mod:`numpyro_dgp.diagnostics`.

The submodules :mod:`~numpyro_dgp.diagnostics` (ArviZ), :mod:`~numpyro_dgp.plots`
(matplotlib), :mod:`~numpyro_dgp.datasets`, :mod:`~numpyro_dgp.recipes` and
:mod:`~numpyro_dgp.cli` are imported on first use.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from numpyro_dgp import core, guides, handlers, infer, io, kernels, layers, likelihoods, models, objectives, posteriors, sde
from numpyro_dgp._deterministic_prediction import predict_collapsed, predict_moment_matched
from numpyro_dgp._metrics import gaussian_mixture_crps, log_likelihood, metrics
from numpyro_dgp._params import ParameterMismatchError, check_params
from numpyro_dgp._prediction import (
    NonFinitePredictionWarning,
    Prediction,
    predict,
    predict_from_samples,
    sample_layers,
)
from numpyro_dgp._saved_model import (
    ModelFileError,
    SavedModel,
    Standardization,
    load_model,
    predictive_quantiles,
    save_model,
)
from numpyro_dgp._validation import InputScaleWarning
from numpyro_dgp.infer import FitResult, fit
from numpyro_dgp.io import load_params, save_params
from numpyro_dgp.layers import gp_layer
from numpyro_dgp.likelihoods import bernoulli_probit
from numpyro_dgp.objectives import CollapsedSparseGP, DGPElbo, NestedCompressionElbo, PredictiveObjective

__version__ = "0.1.0"

#: submodules loaded on first attribute access (they pull in ArviZ, matplotlib or file I/O)
_LAZY_SUBMODULES = ("cli", "datasets", "diagnostics", "plots", "recipes")

__all__ = [
    "CollapsedSparseGP",
    "DGPElbo",
    "FitResult",
    "InputScaleWarning",
    "ModelFileError",
    "NestedCompressionElbo",
    "NonFinitePredictionWarning",
    "ParameterMismatchError",
    "Prediction",
    "PredictiveObjective",
    "SavedModel",
    "Standardization",
    "bernoulli_probit",
    "check_params",
    "cli",
    "core",
    "datasets",
    "diagnostics",
    "fit",
    "gaussian_mixture_crps",
    "gp_layer",
    "guides",
    "handlers",
    "infer",
    "io",
    "kernels",
    "layers",
    "likelihoods",
    "load_model",
    "load_params",
    "log_likelihood",
    "metrics",
    "models",
    "objectives",
    "plots",
    "posteriors",
    "predict",
    "predict_collapsed",
    "predict_from_samples",
    "predict_moment_matched",
    "predictive_quantiles",
    "recipes",
    "sample_layers",
    "save_model",
    "save_params",
    "sde",
]


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
