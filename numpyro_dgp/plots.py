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
    along the range each sample of the previous layer covers; the composition against ``x``
    (with the data, if given). Only each layer's first output is shown.

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
    names = list(samples)
    values = [np.asarray(samples[n])[..., 0] for n in names]
    x = np.asarray(grid)[:, 0]
    if axes is None:
        fig, axes = plt.subplots(1, len(names) + 1, figsize=(4.3 * (len(names) + 1), 3.7))
    # a Figure, unless the caller's axes sit on a SubFigure (then that is what is returned)
    fig = cast("matplotlib.figure.Figure", axes[0].figure)
    axes[0].plot(x, values[0].T, color="C0", alpha=0.4, lw=1)
    axes[0].set(title=f"layer 1: {names[0]}(x)", xlabel="x", ylabel=names[0])
    for i in range(1, len(names)):
        ax, inputs, outputs = axes[i], values[i - 1], values[i]
        for s in range(outputs.shape[0]):
            order = np.argsort(inputs[s])
            ax.plot(inputs[s][order], outputs[s][order], color=f"C{i}", alpha=0.4, lw=1)
        ax.set(
            title=f"layer {i + 1}: {names[i]}({names[i - 1]}) along each sample",
            xlabel=names[i - 1],
            ylabel=names[i],
        )
    last = axes[len(names)]
    last.plot(x, values[-1].T, color="C2", alpha=0.4, lw=1)
    if X is not None and y is not None:
        last.scatter(np.asarray(X)[:, 0], np.asarray(y), s=8, color="k", zorder=3, label="train")
        last.legend(loc="upper left")
    last.set(title="composition", xlabel="x", ylabel="y")
    fig.tight_layout()
    return fig
