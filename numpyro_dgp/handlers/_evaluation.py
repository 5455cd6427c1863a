"""Evaluating a fitted model differently: coherent function samples, layers at chosen inputs.

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from jax.typing import ArrayLike
from numpyro.primitives import Messenger

from numpyro_dgp._protocol import (
    LAYER_MESSAGE,
    layer_call,
    replace_layer_inputs,
    request_full_cov,
)
from numpyro_dgp._validation import check_mapping
from numpyro_dgp.handlers._base import PerRunMessenger

__all__ = ["coherent_layers", "layer_inputs"]


class coherent_layers(Messenger):
    """Draw every layer's output jointly over its input points (full covariance).

    Function samples drawn this way are smooth curves; the default point-by-point draw is
    enough for the ELBO but looks like noise when plotted. Cost ``O(N^3)`` per layer.

    :param fn: the model.
    """

    def process_message(self, msg: dict) -> None:
        """Ask every layer message for a joint draw (``full_cov=True``)."""
        if msg["type"] == LAYER_MESSAGE:
            request_full_cov(msg)


class layer_inputs(PerRunMessenger):
    """Evaluate the named layers at given inputs instead of the previous layer's output.

    A DGP layer is a function of its own input; ``layer_inputs(model, {"h2": H})`` runs
    ``model`` with layer ``h2`` evaluated at ``H``, so the moments a handler such as the
    objectives and :func:`numpyro_dgp.predict` records for ``h2`` are those of ``f_2(H)``
    under the fitted ``q`` (the ``Var[f_2(0)]`` of Ustyuzhaninov et al. 2020). The rest of
    the run is unchanged: the layers before still draw their outputs (a guide that correlates
    layers conditions ``f_2``'s inducing values on them, so the law of total variance over runs
    gives ``f_2(H)``'s marginal), and the layers after see ``f_2(H)``.

    Enter it inside the handlers that should see the replaced input (wrap the model itself).

    :param fn: the model.
    :param inputs: ``{layer name: array}``; each array must broadcast to the shape of that
        layer's usual input (the number of points and the input width stay as they are).
    :raises ValueError: if ``inputs`` is not a non-empty dict; on exit, if the model ran no
        layer of a given name; during the run, if an input does not broadcast to its layer's
        input shape.
    """

    def __init__(
        self, fn: Callable | None = None, inputs: dict[str, ArrayLike] | None = None
    ) -> None:
        check_mapping(inputs, "inputs", "layer_inputs")
        assert inputs is not None  # refused above
        self.inputs = {name: jnp.asarray(value) for name, value in inputs.items()}
        super().__init__(fn)

    def _reset(self) -> None:
        self._seen: set[str] = set()

    def _problem_after_run(self) -> str | None:
        missing = sorted(set(self.inputs) - self._seen)
        if missing:
            return (
                f"layer_inputs: the model has no layer named {missing} (inputs were given for them)"
            )
        return None

    def process_message(self, msg: dict) -> None:
        """Replace the input of the named layers' messages."""
        if msg["type"] != LAYER_MESSAGE:
            return
        layer, X, _ = layer_call(msg)
        if layer.name not in self.inputs:
            return
        self._seen.add(layer.name)
        value = self.inputs[layer.name]
        try:
            value = jnp.broadcast_to(value.astype(X.dtype), X.shape)
        except ValueError:
            raise ValueError(
                f"layer_inputs: the input for layer {layer.name!r} has shape {value.shape}, which "
                f"does not broadcast to the layer's input shape {X.shape}"
            ) from None
        replace_layer_inputs(msg, value)
