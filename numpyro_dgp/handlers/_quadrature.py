"""Weighted branches at learned quadrature points through a DGP's inner layers (AR2P for any guide).

**References:**

* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

from typing import Callable

from jax.typing import ArrayLike
from numpyro.primitives import Messenger

from numpyro_dgp._protocol import LAYER_MESSAGE, LAYER_RULE, get_tag, message_layer, with_tag
from numpyro_dgp._validation import check_positive_int
from numpyro_dgp.posteriors import (
    check_points,
    check_weights,
    quadrature_log_weights,
    quadrature_points,
)

__all__ = ["quadrature"]


class _WeightedPoints:
    """The :class:`~numpyro_dgp._protocol.LayerRule` of a :class:`quadrature` layer: its
    outputs become a weighted mixture at ``mixture = (points (S, P), log_weights (S,))``."""

    what = "a quadrature layer"
    computes_layer = False

    def __init__(self, mixture: tuple) -> None:
        self.mixture = mixture


class quadrature(Messenger):
    """Propagate ``S`` weighted branches through a DGP's inner layers: the AR2P rule of Meng &
    Zhang (2024) for any guide.

    Every inner layer's output becomes ``S`` branches ``mean + xi_s * std`` (per point; a
    branch keeps its own path through the later layers) with points ``xi (S, P)`` per layer
    and weights ``w (S,)`` -- learnable (``numpyro.param``s ``"quadrature.<layer>.points"``,
    bounded to (-5, 5), and ``"quadrature.logits"``) or fixed. The objective is
    ``sum_s w_s E[log p(y | branch s)]`` (:class:`numpyro_dgp.DGPElbo`) or
    ``log sum_s w_s p(y | branch s)`` (:class:`numpyro_dgp.PredictiveObjective`), and
    :func:`numpyro_dgp.predict` returns the weighted mixture. With one inner output and the
    points fixed at Gauss-Hermite nodes with their weights this is Gauss-Hermite quadrature
    of the expectation over that layer. It acts where the inducing values are marginalized
    (:class:`numpyro_dgp.DGPElbo`, :class:`numpyro_dgp.PredictiveObjective`,
    :func:`numpyro_dgp.predict`; the last layer is integrated by Gauss-Hermite as always, so
    its points are registered but unused); a plain run of the model (``Trace_ELBO``,
    ``Predictive``) does not branch.

    :param fn: the model.
    :param num_points: ``S``.
    :param points: initial points: ``{layer: (S, P)}``, one ``(S,)`` array for every layer
        (each output gets the same points), or ``None`` (standard-normal draws, a fixed key).
    :param weights: ``(S,)`` initial weights (default uniform).
    :param learnable: learn points and weights (else they stay fixed).
    :raises ValueError: if ``num_points`` is not a positive integer or ``weights`` are not
        ``num_points`` positive numbers.
    """

    def __init__(
        self,
        fn: Callable | None = None,
        num_points: int = 32,
        points: dict[str, ArrayLike] | ArrayLike | None = None,
        weights: ArrayLike | None = None,
        learnable: bool = True,
    ) -> None:
        check_positive_int(num_points, "num_points", "quadrature")
        self.weights = check_weights(weights, num_points, "quadrature")
        self.num_points = num_points
        self.points = points
        self.learnable = bool(learnable)
        super().__init__(fn)

    def process_message(self, msg: dict) -> None:
        """Tag every layer message with its points and weights (its
        :class:`~numpyro_dgp._protocol.LayerRule`)."""
        if msg["type"] != LAYER_MESSAGE:
            return
        layer = message_layer(msg)
        rule = get_tag(msg, LAYER_RULE)
        if rule is not None and rule.computes_layer:
            raise NotImplementedError(
                f"quadrature: layer {layer.name!r} is {rule.what}, which quadrature does not branch"
            )
        # registered on every run (SVI's initial run is a plain model run); the last layer's
        # points go unused: marginalize_inducing integrates that layer by Gauss-Hermite
        points = quadrature_points(
            f"quadrature.{layer.name}.points",
            check_points(self.points, layer.name, self.num_points, layer.out_dim, "quadrature"),
            self.learnable,
        )
        log_weights = quadrature_log_weights("quadrature.logits", self.weights, self.learnable)
        with_tag(msg, LAYER_RULE, _WeightedPoints((points, log_weights)))
