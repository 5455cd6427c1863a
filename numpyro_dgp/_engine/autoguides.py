"""Reading the Gaussian of NumPyro's own autoguides over a DGP's inducing values.

NumPyro's ``AutoContinuous`` guides (``AutoDiagonalNormal``, ``AutoMultivariateNormal``,
``AutoLowRankMultivariateNormal``, ``AutoIAFNormal``, ``AutoBNAF``) draw one flat latent
vector on an auxiliary site and hand each model site a ``Delta`` of its slice; the density
lives on the auxiliary site. Where that latent distribution is Gaussian, the inducing values'
joint Gaussian (cross-layer covariances included) is read off it, so the objectives and
``predict`` integrate the inducing values out exactly, as for the library's own guides; where
it is not, the objectives that need it refuse (:func:`refusal`).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.infer.autoguide import AutoContinuous

from numpyro_dgp._compat import autocontinuous_layout
from numpyro_dgp.posteriors import JointBlock, unwrap_distribution

__all__ = ["autocontinuous_posteriors", "latent_site_name"]


def latent_site_name(guide: AutoContinuous) -> str:
    """The auxiliary site on which an ``AutoContinuous`` guide draws its flat latent vector."""
    return f"_{guide.prefix}_latent"


def autocontinuous_posteriors(
    guide: AutoContinuous,
    guide_trace: dict,
    model_u_sites: dict[str, tuple[int, int]],
    objective: str,
) -> dict[str, Any]:
    """The Gaussian over the inducing sites of an ``AutoContinuous`` guide's run.

    A diagonal latent Gaussian (``AutoDiagonalNormal``) gives each inducing site its own
    ``(loc (P, M), scale (P, M))``; a full or low-rank one gives one
    :class:`~numpyro_dgp.posteriors.JointBlock` over all inducing sites in the model's
    execution order (the order NumPyro packs them in).

    :param guide: the set-up guide.
    :param guide_trace: a trace of its run.
    :param model_u_sites: ``{u-site: (P, M)}`` of the model, in execution order.
    :param objective: the objective's name, for error messages.
    :return: ``{u-site: posterior}``.
    :raises ValueError: the latent vector holds sites other than inducing values (their
        correlation with the inducing values would be dropped), or its distribution is not
        Gaussian.
    """
    layout = autocontinuous_layout(guide)
    latent, sites = _check_gaussian_latent(guide, guide_trace, layout, model_u_sites, objective)
    if isinstance(latent, dist.Normal):
        loc, scale = jnp.broadcast_arrays(latent.loc, latent.scale)
        out: dict[str, Any] = {}
        for s in sites:
            start, stop, shape = layout[s]
            out[s] = (loc[start:stop].reshape(shape), scale[start:stop].reshape(shape))
        return out
    block = JointBlock(
        tuple(sites), tuple(tuple(layout[s][2]) for s in sites), latent.loc, latent.scale_tril
    )
    return {s: block for s in sites}


def _check_gaussian_latent(
    guide: AutoContinuous,
    guide_trace: dict,
    layout: dict,
    model_u_sites: dict[str, tuple[int, int]],
    objective: str,
) -> tuple[dist.Distribution, list[str]]:
    """The guide's latent distribution and the inducing sites its vector holds (execution order),
    refused where the objective cannot integrate the inducing values over it.

    :raises ValueError: the latent vector holds sites other than inducing values, packs the
        inducing sites out of execution order, or its distribution is not Gaussian.
    """
    name = type(guide).__name__
    others = [s for s in layout if s not in model_u_sites]
    if others:
        raise ValueError(
            f"{objective} with {name}: the guide's latent vector also holds {others}, whose "
            f"correlation with the inducing values {objective} cannot integrate over. Use "
            "numpyro_dgp.guides.AutoJointDGP (a joint Gaussian over the inducing values; other "
            "latent sites get their own AutoNormal), or NumPyro's Trace_ELBO with this guide"
        )
    latent = unwrap_distribution(guide_trace[latent_site_name(guide)]["fn"])
    sites = [s for s in model_u_sites if s in layout]
    if isinstance(latent, dist.Normal):
        return latent, sites
    if isinstance(latent, (dist.MultivariateNormal, dist.LowRankMultivariateNormal)):
        order = [layout[s][0] for s in sites]
        if order != sorted(order):
            raise ValueError(
                f"{objective} with {name}: the guide packs the inducing sites "
                "out of execution order"
            )
        return latent, sites
    raise ValueError(
        f"{objective} with {name}: the guide's distribution over the inducing values is not "
        f"Gaussian ({type(latent).__name__}), so {objective} cannot integrate them out. Use "
        "NumPyro's Trace_ELBO with this guide, or a Gaussian guide "
        "(numpyro_dgp.guides.AutoFactorizedDGP, AutoJointDGP, NumPyro's AutoNormal, "
        "AutoMultivariateNormal) with this objective"
    )
