"""Guides over the inducing values of ``gp_layer`` models: swap one for another on the same model.

* :class:`AutoFactorizedDGP` -- independent layers (DSVI, Salimbeni & Deisenroth 2017).
* :class:`AutoJointDGP` -- one Gaussian over all layers.
* :class:`AutoChainDGP` -- chain-structured ``q(u_1) prod q(u_l | u_{l-1})``.
* :class:`AutoAmortizedDGP` -- per-point inducing sets from encoder networks (Meng & Zhang 2024).
"""

from numpyro_dgp.guides._amortized import AutoAmortizedDGP
from numpyro_dgp.guides._base import DGPGuide, InducingSite
from numpyro_dgp.guides._correlated import AutoChainDGP, AutoJointDGP
from numpyro_dgp.guides._factorized import AutoFactorizedDGP

__all__ = [
    "AutoAmortizedDGP",
    "AutoChainDGP",
    "AutoFactorizedDGP",
    "AutoJointDGP",
    "DGPGuide",
    "InducingSite",
]
