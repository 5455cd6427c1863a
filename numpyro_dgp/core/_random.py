"""Standard-normal draws as XLA's CPU backend generates them fastest (pure JAX)."""

from __future__ import annotations

import math

import jax
from jax.typing import DTypeLike


def standard_normal(rng_key: jax.Array, shape: tuple[int, ...], dtype: DTypeLike) -> jax.Array:
    """``jax.random.normal(rng_key, shape, dtype)``, drawn as one flat vector and reshaped.

    JAX's threefry generator counts the draws by their flattened position, so the flat draw
    has the same random bits in the same places (the same uniforms; the normals agree to the
    last bit, or within one unit in the last place where XLA vectorizes the transform of
    another shape differently). On CPU the generator's rolled loop over a 2-D counter array
    with a narrow last axis is several times slower than over a vector, and a layer draws once
    per training step.

    :param rng_key: PRNG key.
    :param shape: shape of the draw.
    :param dtype: floating dtype.
    :return: ``shape`` standard-normal values.
    """
    return jax.random.normal(rng_key, (math.prod(shape),), dtype).reshape(shape)
