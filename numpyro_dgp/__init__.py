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
:mod:`~numpyro_dgp.plots` matplotlib), so ``import numpyro_dgp`` and the command line's
``--help`` answer at once.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The one list of public names: the imports below are what type checkers and editors see; at
# run time nothing here is imported (``import numpyro_dgp`` loads neither JAX nor NumPyro), and
# each name loads its module on first access (see ``_public_names``). A new public name is one
# more import here.
if TYPE_CHECKING:
    from numpyro_dgp import cli as cli
    from numpyro_dgp import core as core
    from numpyro_dgp import datasets as datasets
    from numpyro_dgp import diagnostics as diagnostics
    from numpyro_dgp import guides as guides
    from numpyro_dgp import handlers as handlers
    from numpyro_dgp import infer as infer
    from numpyro_dgp import io as io
    from numpyro_dgp import kernels as kernels
    from numpyro_dgp import layers as layers
    from numpyro_dgp import likelihoods as likelihoods
    from numpyro_dgp import models as models
    from numpyro_dgp import objectives as objectives
    from numpyro_dgp import plots as plots
    from numpyro_dgp import posteriors as posteriors
    from numpyro_dgp import recipes as recipes
    from numpyro_dgp import sde as sde
    from numpyro_dgp._predict.metrics import gaussian_mixture_crps as gaussian_mixture_crps
    from numpyro_dgp._predict.metrics import log_likelihood as log_likelihood
    from numpyro_dgp._predict.metrics import metrics as metrics
    from numpyro_dgp._predict.metrics import predictive_quantiles as predictive_quantiles
    from numpyro_dgp._predict.prediction import (
        NonFinitePredictionWarning as NonFinitePredictionWarning,
    )
    from numpyro_dgp._predict.prediction import Prediction as Prediction
    from numpyro_dgp._predict.prediction import predict as predict
    from numpyro_dgp._predict.prediction import sample_layers as sample_layers
    from numpyro_dgp._predict.variants import predict_collapsed as predict_collapsed
    from numpyro_dgp._predict.variants import predict_from_samples as predict_from_samples
    from numpyro_dgp._predict.variants import predict_moment_matched as predict_moment_matched
    from numpyro_dgp._saved_model import ModelFileError as ModelFileError
    from numpyro_dgp._saved_model import SavedModel as SavedModel
    from numpyro_dgp._saved_model import Standardization as Standardization
    from numpyro_dgp._saved_model import load_model as load_model
    from numpyro_dgp._saved_model import save_model as save_model
    from numpyro_dgp._validation import InputScaleWarning as InputScaleWarning
    from numpyro_dgp._validation import TargetScaleWarning as TargetScaleWarning
    from numpyro_dgp.infer import FitResult as FitResult
    from numpyro_dgp.infer import fit as fit
    from numpyro_dgp.io import ParameterMismatchError as ParameterMismatchError
    from numpyro_dgp.io import check_params as check_params
    from numpyro_dgp.io import load_params as load_params
    from numpyro_dgp.io import save_params as save_params
    from numpyro_dgp.layers import gp_layer as gp_layer
    from numpyro_dgp.layers import latent_input as latent_input
    from numpyro_dgp.likelihoods import bernoulli_probit as bernoulli_probit
    from numpyro_dgp.objectives import CollapsedSparseGP as CollapsedSparseGP
    from numpyro_dgp.objectives import DGPElbo as DGPElbo
    from numpyro_dgp.objectives import ImportanceWeightedElbo as ImportanceWeightedElbo
    from numpyro_dgp.objectives import NestedCompressionElbo as NestedCompressionElbo
    from numpyro_dgp.objectives import PredictiveObjective as PredictiveObjective


@functools.cache  # read once, on the first public name used
def _public_names() -> dict[str, str]:
    """``{public name: the module to import}``, read from the imports under ``TYPE_CHECKING``
    above (a submodule ``numpyro_dgp.<name>`` maps to itself)."""
    import ast

    with open(__file__, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    block = next(node for node in tree.body if isinstance(node, ast.If))
    names = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names:
            module = node.module
            names[alias.name] = f"{module}.{alias.name}" if module == __name__ else module
    return names


def __getattr__(name: str) -> Any:
    public = _public_names()
    if name == "__all__":
        value: Any = sorted(public)
    elif name not in public:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    elif public[name] == f"{__name__}.{name}":
        value = importlib.import_module(public[name])
    else:
        value = getattr(importlib.import_module(public[name]), name)
    globals()[name] = value  # later accesses are plain attribute lookups
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_public_names()))
