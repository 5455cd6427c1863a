"""Plots of per-layer function samples (matplotlib, imported lazily).

**References:**

* Ustyuzhaninov, Kazlauskaite, Kaiser, Bodin, Campbell, Ek (2020). Compositional uncertainty
  in deep Gaussian processes. UAI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence, cast

import numpy as np
from jax.typing import ArrayLike

if TYPE_CHECKING:
    import matplotlib.axes
    import matplotlib.figure

__all__ = ["plot_layer_samples"]


def plot_layer_samples(
    grid: ArrayLike,
    samples: Mapping[str, ArrayLike],
    X: ArrayLike | None = None,
    y: ArrayLike | None = None,
    axes: Sequence[matplotlib.axes.Axes] | np.ndarray | None = None,
) -> matplotlib.figure.Figure:
    """Each layer's samples and their composition (in the style of Fig. 5 of Ustyuzhaninov et
    al., 2020).

    Panels: the first layer against ``x``; every later layer against its own input, drawn
    along the range each sample of the previous layer covers (joined by lines where that
    layer has one output, else small markers); the composition against ``x`` (with the data,
    if given). Only each layer's first output is shown.

    :param grid: ``(N, 1)`` inputs the samples were drawn at.
    :param samples: ``{layer: (S, N, P)}`` from :func:`numpyro_dgp.sample_layers`, the layers
        in order.
    :param X: ``(n, 1)`` training inputs to scatter on the composition panel.
    :param y: ``(n,)`` training targets.
    :param axes: ``len(layers) + 1`` matplotlib axes to draw on (default: a new figure).
    :return: the matplotlib figure.
    :raises ValueError: for a ``grid`` of more than one input dimension (lines joined along
        one coordinate of several would mislead): for those, draw
        :func:`numpyro_dgp.diagnostics.plot_layers` on trees from
        :func:`~numpyro_dgp.diagnostics.from_layer_samples`, which puts a chosen coordinate or
        projection on the horizontal axis.
    """
    import matplotlib.pyplot as plt

    if np.ndim(grid) != 2 or np.shape(grid)[1] != 1:
        raise ValueError(
            f"plot_layer_samples: grid must have shape (N, 1), got {np.shape(grid)}; for inputs "
            "of several dimensions use numpyro_dgp.diagnostics.plot_layers(..., x=...)"
        )
    layers = {name: np.asarray(values) for name, values in samples.items()}
    if axes is None:
        fig, axes = plt.subplots(1, len(layers) + 1, figsize=(4.3 * (len(layers) + 1), 3.7))
    # a Figure, unless the caller's axes sit on a SubFigure (then that is what is returned)
    fig = cast("matplotlib.figure.Figure", axes[0].figure)
    draw_layers(axes, layers, (np.asarray(grid)[:, 0], "x", True), "C0")
    if X is not None and y is not None:
        last = axes[len(layers)]
        last.scatter(np.asarray(X)[:, 0], np.asarray(y), s=8, color="k", zorder=3, label="train")
        last.legend(loc="upper left")
    fig.tight_layout()
    return fig


def _draw(ax, h: np.ndarray, v: np.ndarray, joined: bool, color: str) -> None:
    """Samples ``v (S, G)`` on ``ax`` against ``h (S, G)`` or ``(G,)``, each sorted by its
    ``h``; lines if ``joined``, else small translucent markers (the horizontal value does not
    determine the point)."""
    for hs, vs in zip(np.broadcast_to(h, v.shape), v):
        order = np.argsort(hs, kind="stable")
        if joined:
            ax.plot(hs[order], vs[order], lw=0.7, alpha=0.6, color=color)
        else:
            ax.scatter(hs[order], vs[order], s=4, alpha=0.35, color=color, linewidths=0)


def output_label(name: str, P: int) -> str:
    """Axis label of a layer's first output (of ``P``)."""
    return name if P == 1 else f"{name}[0] (output 0 of {P})"


def draw_layers(axes, layers: Mapping[str, np.ndarray], horizontal: tuple, color: str) -> None:
    """One row of panels: each layer's first output against its own input (the first layer
    against the grid's horizontal values), then the composition against those; points sorted by
    their horizontal value, joined by lines only where that value determines the point.

    :param axes: ``len(layers) + 1`` matplotlib axes.
    :param layers: ``{layer: (S, G, P)}`` samples, the layers in order.
    :param horizontal: ``(x (G,), its axis label, whether x determines the grid point)``.
    :param color: the samples' color.
    """
    x, x_label, joined = horizontal
    inputs, label, lines = x, x_label, joined
    for c, (name, values) in enumerate(layers.items()):
        out, P = values[:, :, 0], values.shape[-1]
        _draw(axes[c], inputs, out, lines, color)
        axes[c].set(title=f"{name} vs its input", xlabel=label, ylabel=output_label(name, P))
        inputs, label, lines = out, output_label(name, P), P == 1
    _draw(axes[len(layers)], x, inputs, joined, color)
    axes[len(layers)].set(title="composition vs x", xlabel=x_label, ylabel=label)
