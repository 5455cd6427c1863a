"""Inference drivers."""

from numpyro_dgp.infer.fit import FitResult, fit
from numpyro_dgp.infer.sghmc import SGHMC, SGHMCState

__all__ = ["FitResult", "SGHMC", "SGHMCState", "fit"]
