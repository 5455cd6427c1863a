"""The letters toy classification of Meng & Zhang (2024): points on the unit square, label 1
inside the rendered word "DGP".

**References:**

* Meng, Zhang (2024). Amortized variational inference for deep Gaussian processes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dgp.datasets import Dataset

__all__ = ["letters_classification"]


def _check_sizes(num_train: int, num_test: int) -> None:
    """Raise unless ``num_train`` and ``num_test`` are positive integers.

    :raises ValueError: otherwise.
    """
    if not (isinstance(num_train, (int, np.integer)) and num_train >= 1):
        raise ValueError(f"num_train must be a positive integer, got {num_train!r}")
    if not (isinstance(num_test, (int, np.integer)) and num_test >= 1):
        raise ValueError(f"num_test must be a positive integer, got {num_test!r}")


def letters_classification(
    rng_key: jax.Array, num_train: int = 10000, num_test: int = 10000, text: str = "DGP"
) -> Dataset:
    """The toy classification of Meng & Zhang (2024): points uniform on the unit square,
    label 1 inside the rendered letters ``text`` (DejaVu Sans Bold, as matplotlib draws it;
    holes of D, P are outside), else 0.

    :param rng_key: JAX PRNG key (seeds the NumPy draws).
    :param num_train: number of training points.
    :param num_test: number of test points.
    :param text: the letters to render, fitted into ``[0.05, 0.95]`` horizontally and centered
        vertically.
    :return: :class:`~numpyro_dgp.datasets.Dataset` with ``X_train (num_train, 2)``,
        ``y_train (num_train,)``, ``X_test (num_test, 2)``, ``y_test (num_test,)``, labels in
        {0, 1} (float); name ``"letters"``.
    """
    from matplotlib.font_manager import FontProperties
    from matplotlib.path import Path as MplPath
    from matplotlib.textpath import TextPath

    _check_sizes(num_train, num_test)
    glyphs = TextPath(
        (0, 0), text, size=1, prop=FontProperties(family="DejaVu Sans", weight="bold")
    )
    polygons = glyphs.to_polygons()
    corners = np.concatenate(polygons)
    lo, hi = corners.min(0), corners.max(0)
    # fit the text's box into [0.05, 0.95] horizontally, centered vertically
    scale = 0.9 / (hi - lo)[0]
    offset = np.array([0.05, 0.5 - 0.5 * scale * (hi - lo)[1]]) - scale * lo
    outlines = [MplPath(poly * scale + offset) for poly in polygons]

    def label(X):
        # even-odd rule over the glyph outlines: holes (inner contours) flip back to outside
        crossings = sum(poly.contains_points(X).astype(int) for poly in outlines)
        return (crossings % 2).astype(np.float64)

    # a NumPy generator seeded from the key: float64 data whether or not jax_enable_x64 is set
    rng = np.random.default_rng(
        [int(s) for s in np.asarray(jax.random.bits(rng_key, (4,), jnp.uint32))]
    )
    X_train = rng.uniform(0, 1, (int(num_train), 2))
    X_test = rng.uniform(0, 1, (int(num_test), 2))
    return Dataset(X_train, label(X_train), X_test, label(X_test), "letters")
