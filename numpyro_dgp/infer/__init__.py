"""Inference drivers: :func:`fit` (compiled SVI), :func:`fit_minibatches` (SVI on minibatches
from the host, memory-mapped files or several processes), :func:`init` (compiled
``svi.init``), :func:`natural_gradients` (an optimizer taking natural-gradient steps on the
layers' ``q(u)``), and the MCMC kernels :class:`SGHMC` and :class:`EllipticalSlice` (and
:func:`elliptical_slice_gibbs` for NumPyro's ``HMCGibbs``)."""

from __future__ import annotations

from numpyro_dgp.infer._elliptical import (
    EllipticalSlice,
    EllipticalSliceState,
    elliptical_slice_gibbs,
)
from numpyro_dgp.infer._fit import FitResult, fit, init
from numpyro_dgp.infer._natural import (
    NaturalGradientState,
    natural_gradient_ramp,
    natural_gradients,
)
from numpyro_dgp.infer._sghmc import SGHMC, SGHMCState
from numpyro_dgp.infer._stream import HostMinibatches, fit_minibatches

__all__ = [
    "EllipticalSlice",
    "EllipticalSliceState",
    "FitResult",
    "HostMinibatches",
    "NaturalGradientState",
    "SGHMC",
    "SGHMCState",
    "elliptical_slice_gibbs",
    "fit",
    "fit_minibatches",
    "init",
    "natural_gradient_ramp",
    "natural_gradients",
]
