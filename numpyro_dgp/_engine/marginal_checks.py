"""The option and refusal checks of :class:`~numpyro_dgp._engine.marginal.marginalize_inducing`.

Its options (a quadrature layer needs weights; the ``latent_mode``), the layers the
importance-weighted bound refuses, and ``full_cov`` for a guide that correlates the layers.
"""

from __future__ import annotations

from typing import Any

from jax.typing import ArrayLike

from numpyro_dgp._protocol import BRANCHES, get_tag
from numpyro_dgp.layers import Layer
from numpyro_dgp.posteriors import ChainLink, JointBlock

__all__ = [
    "check_correlated_full_cov",
    "check_importance_layer",
    "check_marginalize_options",
]


def check_marginalize_options(
    quadrature_layer: str | None, quadrature_weights: ArrayLike | None, latent_mode: str
) -> None:
    """Refuse a quadrature layer without weights and an unknown ``latent_mode``
    (:class:`~numpyro_dgp._engine.marginal.marginalize_inducing`).

    :raises ValueError: for either.
    """
    if quadrature_layer is not None and quadrature_weights is None:
        raise ValueError(
            "marginalize_inducing: quadrature_layer needs quadrature_weights "
            "(with quadrature_nodes, "
            "or without them for as many Monte Carlo draws per point)"
        )
    if latent_mode not in ("posterior", "prior"):
        raise ValueError(
            f"marginalize_inducing: latent_mode must be 'posterior' or 'prior', got {latent_mode!r}"
        )


def check_importance_layer(
    num_importance: int | None, layer: Layer, post: Any, flow: Any, msg: dict
) -> None:
    """Refuse, under the importance-weighted bound, a layer that is a flow, has branches or a
    guide that correlates the layers.

    :raises ValueError: for such a layer.
    """
    if num_importance and (
        flow is not None
        or isinstance(post, (ChainLink, JointBlock))
        or get_tag(msg, BRANCHES) is not None
    ):
        raise ValueError(
            f"ImportanceWeightedElbo: layer {layer.name!r} is an SDE flow, has branches or a "
            "guide that correlates the layers; the importance-weighted bound takes independent "
            "Gaussian layers "
            "(AutoFactorizedDGP, AutoNormal) without handlers"
        )


def check_correlated_full_cov(layer: Layer, full_cov: bool) -> None:
    """Refuse ``full_cov`` for a layer whose guide correlates the layers.

    :raises NotImplementedError: if ``full_cov``.
    """
    if full_cov:
        raise NotImplementedError(
            f"marginalize_inducing: layer {layer.name!r} has a guide that correlates layers; "
            "its marginals are per point (full_cov=False). For coherent function samples "
            "use numpyro_dgp.sample_layers, which samples the inducing values."
        )
