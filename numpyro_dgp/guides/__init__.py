"""Guides over the inducing values of ``gp_layer`` models."""

from numpyro_dgp.guides._base import DGPGuide, InducingSite
from numpyro_dgp.guides.factorised import AutoFactorisedDGP

__all__ = ["AutoFactorisedDGP", "DGPGuide", "InducingSite"]
