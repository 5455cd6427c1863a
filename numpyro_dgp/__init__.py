"""numpyro-dgp: deep Gaussian processes written as ordinary NumPyro programs.

Write a DGP with :func:`gp_layer`; choose inference by choosing a guide
(:mod:`numpyro_dgp.guides`: factorized, joint, chain-structured, amortized), an objective
(:class:`DGPElbo`, :class:`PredictiveObjective`, :class:`NestedCompressionElbo`,
:class:`CollapsedSparseGP` or NumPyro's own ELBOs) or a handler
(:mod:`numpyro_dgp.handlers`: SDE flows, quadrature branches, exact layers); train with
:func:`fit`; predict with :func:`predict` (or, deterministically, :func:`predict_moment_matched`
and :func:`predict_collapsed`). Parameters handed to :func:`predict`,
:func:`fit` or :func:`load_params` are checked against the model (:func:`check_params`,
:class:`ParameterMismatchError`); data are checked at the door (:class:`InputScaleWarning`).
Run MCMC on the same model (NUTS on
:class:`~numpyro_dgp.handlers.exact_layers` / :class:`~numpyro_dgp.handlers.latent_conditionals`,
or :class:`~numpyro_dgp.infer.SGHMC`) and compare layer by layer with
:mod:`numpyro_dgp.diagnostics`.

Importing the package imports nothing else: each submodule and name is loaded on first use
(``numpyro_dgp.fit`` imports JAX and NumPyro; :mod:`~numpyro_dgp.diagnostics` ArviZ;
:mod:`~numpyro_dgp.plots` matplotlib).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Nothing heavy is imported here: the public names below load their module (and JAX, NumPyro,
# ArviZ or matplotlib with it) on first access, so ``import numpyro_dgp`` and the
# ``numpyro-dgp`` command's ``--help`` and argument errors answer at once.

#: public submodules, imported on first attribute access
_SUBMODULES = (
    "cli",
    "core",
    "datasets",
    "diagnostics",
    "guides",
    "handlers",
    "infer",
    "io",
    "kernels",
    "layers",
    "likelihoods",
    "models",
    "objectives",
    "plots",
    "posteriors",
    "recipes",
    "sde",
)

#: public names defined in submodules: name -> the module that defines it
_ATTRIBUTES = {
    "predict_collapsed": "_predict.deterministic",
    "predict_moment_matched": "_predict.deterministic",
    "gaussian_mixture_crps": "_predict.metrics",
    "log_likelihood": "_predict.metrics",
    "metrics": "_predict.metrics",
    "ParameterMismatchError": "io",
    "check_params": "io",
    "NonFinitePredictionWarning": "_predict.prediction",
    "Prediction": "_predict.prediction",
    "predict": "_predict.prediction",
    "predict_from_samples": "_predict.samples",
    "sample_layers": "_predict.prediction",
    "ModelFileError": "_saved_model",
    "SavedModel": "_saved_model",
    "Standardization": "_saved_model",
    "load_model": "_saved_model",
    "predictive_quantiles": "_predict.quantiles",
    "save_model": "_saved_model",
    "InputScaleWarning": "_validation",
    "TargetScaleWarning": "_validation",
    "FitResult": "infer",
    "fit": "infer",
    "load_params": "io",
    "save_params": "io",
    "gp_layer": "layers",
    "latent_input": "_layers.latent",
    "bernoulli_probit": "likelihoods",
    "CollapsedSparseGP": "objectives",
    "DGPElbo": "objectives",
    "ImportanceWeightedElbo": "objectives",
    "NestedCompressionElbo": "objectives",
    "PredictiveObjective": "objectives",
}

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from numpyro_dgp import (
        cli,
        core,
        datasets,
        diagnostics,
        guides,
        handlers,
        infer,
        io,
        kernels,
        layers,
        likelihoods,
        models,
        objectives,
        plots,
        posteriors,
        recipes,
        sde,
    )
    from numpyro_dgp._layers.latent import latent_input
    from numpyro_dgp._predict.deterministic import predict_collapsed, predict_moment_matched
    from numpyro_dgp._predict.metrics import gaussian_mixture_crps, log_likelihood, metrics
    from numpyro_dgp._predict.prediction import (
        NonFinitePredictionWarning,
        Prediction,
        predict,
        sample_layers,
    )
    from numpyro_dgp._predict.quantiles import predictive_quantiles
    from numpyro_dgp._predict.samples import predict_from_samples
    from numpyro_dgp._saved_model import (
        ModelFileError,
        SavedModel,
        Standardization,
        load_model,
        save_model,
    )
    from numpyro_dgp._validation import InputScaleWarning, TargetScaleWarning
    from numpyro_dgp.infer import FitResult, fit
    from numpyro_dgp.io import ParameterMismatchError, check_params, load_params, save_params
    from numpyro_dgp.layers import gp_layer
    from numpyro_dgp.likelihoods import bernoulli_probit
    from numpyro_dgp.objectives import (
        CollapsedSparseGP,
        DGPElbo,
        ImportanceWeightedElbo,
        NestedCompressionElbo,
        PredictiveObjective,
    )

__all__ = [
    "CollapsedSparseGP",
    "DGPElbo",
    "FitResult",
    "ImportanceWeightedElbo",
    "InputScaleWarning",
    "ModelFileError",
    "NestedCompressionElbo",
    "NonFinitePredictionWarning",
    "ParameterMismatchError",
    "Prediction",
    "PredictiveObjective",
    "SavedModel",
    "Standardization",
    "TargetScaleWarning",
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
    "latent_input",
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


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif name in _ATTRIBUTES:
        value = getattr(importlib.import_module(f"{__name__}.{_ATTRIBUTES[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later accesses are plain attribute lookups
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
