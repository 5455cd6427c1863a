"""Guides over the inducing values of ``gp_layer`` models: swap one for another on the same model.

* :class:`AutoFactorizedDGP` -- independent layers (DSVI, Salimbeni & Deisenroth 2017).
* :class:`AutoJointDGP` -- one Gaussian over all layers.
* :class:`AutoChainDGP` -- chain-structured ``q(u_1) prod q(u_l | u_{l-1})``.
* :class:`AutoAmortizedDGP` -- per-point inducing sets from encoder networks (Meng & Zhang 2024).

Not in ``__all__`` and not public API (their interface may change without notice): the
plug-ins through which the inducing-marginalization engine runs what these guides' posteriors
need beyond independent Gaussians (``CorrelatedRecursion``, ``EncodedSets``, ``latent_draw``,
``latent_kl``).
"""

from numpyro_dgp.guides._amortized import AutoAmortizedDGP
from numpyro_dgp.guides._amortized import EncodedSets as EncodedSets
from numpyro_dgp.guides._base import AutoFactorizedDGP, DGPGuide, InducingSite
from numpyro_dgp.guides._base import latent_draw as latent_draw
from numpyro_dgp.guides._base import latent_kl as latent_kl
from numpyro_dgp.guides._correlated import AutoChainDGP, AutoJointDGP
from numpyro_dgp.guides._correlated import CorrelatedRecursion as CorrelatedRecursion

__all__ = [
    "AutoAmortizedDGP",
    "AutoChainDGP",
    "AutoFactorizedDGP",
    "AutoJointDGP",
    "DGPGuide",
    "InducingSite",
]
