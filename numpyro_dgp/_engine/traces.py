"""Reading a model's or a guide's trace for the inducing-marginalization engine.

The model's layers by their ``u`` sites, the shapes of those sites, its last layer and whether
it uses inducing locations; the guide's Gaussian over each inducing site. Used by
:mod:`~numpyro_dgp._engine.run`, :mod:`~numpyro_dgp._engine.moments`, the objectives and
prediction.
"""

from __future__ import annotations

from typing import Any

import jax

from numpyro_dgp._protocol import (
    CONDITIONAL,
    GAUSSIAN,
    get_tag,
    trace_layer_names,
    trace_layers,
)
from numpyro_dgp.layers import Layer
from numpyro_dgp.posteriors import ChainLink, JointBlock, site_gaussian

__all__ = [
    "final_layer_name",
    "guide_posteriors",
    "layers_by_u_site",
    "site_posterior",
    "uses_inducing_locations",
]


def guide_posteriors(
    guide_trace: dict, model_u_sites: dict[str, tuple[int, int]], structured: bool = True
) -> dict[str, Any]:
    """The guide's Gaussian over every inducing site it samples.

    :param guide_trace: a trace of the guide.
    :param model_u_sites: ``{u-site name: value shape (P, M)}`` from the model.
    :param structured: use the structure a guide declares in ``infer[GAUSSIAN]``
        (:class:`~numpyro_dgp.posteriors.ChainLink`, :class:`~numpyro_dgp.posteriors.JointBlock`:
        the marginal over the layers); otherwise read each site's distribution as it is (for
        a chain or joint guide that is the Gaussian *given* the sampled earlier layers).
    :return: ``{u-site name: posterior}`` for the sites whose guide distribution is Gaussian
        over the inducing values (others are left to sampling).
    """
    out = {}
    for name, shape in model_u_sites.items():
        site = guide_trace.get(name)
        if site is None or site["type"] != "sample":
            continue
        params = site_posterior(site, shape, structured)
        if params is not None:
            out[name] = params
    return out


def site_posterior(
    site: dict, shape: tuple[int, int], structured: bool = True
) -> tuple[jax.Array, jax.Array] | ChainLink | JointBlock | None:
    """A guide site's Gaussian over its ``(P, M)`` inducing values.

    :param site: the guide's site.
    :param shape: ``(P, M)``.
    :param structured: prefer the structure the site declares (``infer[GAUSSIAN]``).
    :return: the declared structure if ``structured``, else the site's Gaussian given the
        earlier samples (``infer[CONDITIONAL]``, or the site distribution itself); ``None`` if
        neither is Gaussian.
    """
    declared = get_tag(site, GAUSSIAN)
    if structured and declared is not None:
        return declared
    conditional = get_tag(site, CONDITIONAL)
    if conditional is not None:
        return conditional
    return site_gaussian(site["name"], site["fn"], shape)


def layers_by_u_site(model_trace: dict) -> dict[str, Layer]:
    """``{u-site name: Layer}`` from the layer messages of a model trace.

    (The ``infer`` tags of the ``u`` sites cannot be used: ``replay`` overwrites them with
    the guide's.)

    :param model_trace: a trace of the model.
    :return: the layers by the names of their u sites.
    """
    return {layer.u_site: layer for layer in trace_layers(model_trace)}


def uses_inducing_locations(model_trace: dict) -> bool:
    """Whether any ``gp_layer`` of the trace has ``inducing="locations"``.

    :param model_trace: a trace of the model.
    """
    return any(layer.inducing == "locations" for layer in layers_by_u_site(model_trace).values())


def model_u_sites(model_trace: dict) -> dict[str, tuple[int, int]]:
    return {
        name: (layer.out_dim, layer.inducing_inputs.shape[0])
        for name, layer in layers_by_u_site(model_trace).items()
    }


def final_layer_name(model_trace: dict) -> str:
    """Name of the last ``gp_layer`` run in ``model_trace`` (execution order).

    :param model_trace: a trace of the model.
    :raises ValueError: if the model ran no ``gp_layer``.
    """
    names = trace_layer_names(model_trace)
    if not names:
        raise ValueError(
            "the model has no gp_layer: DGPElbo and predict need a model built with "
            "numpyro_dgp.gp_layer"
        )
    return names[-1]
