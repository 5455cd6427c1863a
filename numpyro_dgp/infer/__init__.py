"""Inference drivers."""

from numpyro_dgp.infer.fit import FitResult, fit

__all__ = ["FitResult", "fit"]
