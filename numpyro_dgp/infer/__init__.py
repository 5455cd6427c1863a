"""Inference drivers: :func:`fit` (compiled SVI), :func:`init` (compiled ``svi.init``) and
:class:`SGHMC` (an MCMC kernel)."""

from __future__ import annotations

from numpyro_dgp.infer._fit import FitResult, fit
from numpyro_dgp.infer._init import init
from numpyro_dgp.infer._sghmc import SGHMC, SGHMCState

__all__ = ["FitResult", "SGHMC", "SGHMCState", "fit", "init"]
