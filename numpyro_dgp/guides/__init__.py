"""Guides over the inducing values of ``gp_layer`` models: swap one for another on the same model.

* :class:`AutoFactorisedDGP` -- independent layers (DSVI).
* :class:`AutoJointDGP` -- one Gaussian over all layers.
* :class:`AutoChainDGP` -- chain-structured ``q(u_1) prod q(u_l | u_{l-1})``.
* :class:`AutoAmortizedDGP` -- per-point inducing sets from encoder networks (paper 003).
"""

from numpyro_dgp.guides._base import DGPGuide, InducingSite
from numpyro_dgp.guides.amortized import AutoAmortizedDGP
from numpyro_dgp.guides.correlated import AutoChainDGP, AutoJointDGP
from numpyro_dgp.guides.factorised import AutoFactorisedDGP

__all__ = ["AutoAmortizedDGP", "AutoChainDGP", "AutoFactorisedDGP", "AutoJointDGP", "DGPGuide", "InducingSite"]
