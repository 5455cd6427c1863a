"""Training helpers: fast minibatch indices and data-parallel sharding of the data plate."""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from numpyro.primitives import Messenger

from numpyro_dgp._compat import numpyro_subsample_fn

__all__ = ["data_parallel", "fast_subsample"]


def _top_k_subsample(size: int, subsample_size: int, rng_key: jax.Array | None = None) -> jax.Array:
    if rng_key is None:
        raise ValueError(
            "Missing random key to generate subsample indices: run the model under "
            "numpyro.handlers.seed (SVI does this); HMC/NUTS do not support subsampling"
        )
    # The positions of the subsample_size largest of size iid uniforms: a uniformly random
    # subset in random order, as NumPyro's Fisher-Yates shuffle gives.
    # float32 draws whatever the default precision: half the sort width; ties are harmless
    uniforms = jax.random.uniform(rng_key, (size,), jnp.float32)
    return _top_k_positions(uniforms, subsample_size).astype(jnp.arange(0).dtype)


#: Standard deviations of the candidate count between its mean and each end of the window in
#: which :func:`_top_k_positions` takes its short path (outside it, about 2e-9 of the draws at
#: 1,000 of 10,000 and more often for small subsamples, the full ``top_k`` runs: the result is
#: the same either way).
_CANDIDATE_MARGIN = 6.0


def _candidate_window(size: int, k: int, margin: float) -> tuple[float, int]:
    """``(t, capacity)``: the uniforms at or above ``1 - t`` are the candidates (``k +
    margin sqrt(k)`` of ``size`` expected), and at most ``capacity`` of them fit the buffer
    (``margin`` standard deviations above that mean)."""
    expected = k + margin * math.sqrt(k)
    return expected / size, math.ceil(expected + margin * math.sqrt(expected))


def _top_k_positions(uniforms: jax.Array, k: int, margin: float = _CANDIDATE_MARGIN) -> jax.Array:
    """``lax.top_k(uniforms, k)[1]`` for ``(size,)`` values in ``[0, 1)``, the same positions
    in the same order, from the candidates above a threshold.

    ``top_k`` over all ``size`` values was the largest single operation of a small training
    step (0.3-0.4 ms for 1,000 of 10,000 on a 2-core CPU, 14% of the step at M = 50). The
    ``k + margin sqrt(k)`` expected largest values are gathered, in index order, into a buffer
    (their positions found by a binary search in the running count) and ``top_k`` runs on it:
    when the candidates number at least ``k`` they hold the ``k`` largest values, and when they
    fit the buffer every one of those is in it, in the order ``top_k`` breaks ties in (the
    lower position first). Otherwise (about ``2e-9`` of the draws at 1,000 of 10,000 with the
    default margin) the full ``top_k`` runs. The values decide only which path is faster: the
    result is exact for any values in ``[0, 1)``.
    """
    size = uniforms.shape[-1]
    t, capacity = _candidate_window(size, k, margin)

    def from_all(uniforms: jax.Array) -> jax.Array:
        return jax.lax.top_k(uniforms, k)[1]

    if 2 * capacity > size:  # the buffer would not be much smaller than the values
        return from_all(uniforms)
    candidate = uniforms >= jnp.asarray(1.0 - t, uniforms.dtype)
    running = jnp.cumsum(candidate, dtype=jnp.int32)
    count = running[-1]

    def from_candidates(uniforms: jax.Array) -> jax.Array:
        # the position of the j-th candidate: the first where the running count reaches j
        ranks = jnp.arange(1, capacity + 1, dtype=jnp.int32)
        positions = jnp.minimum(jnp.searchsorted(running, ranks), size - 1).astype(jnp.int32)
        values = jnp.where(ranks <= count, uniforms[positions], -jnp.inf)
        return positions[jax.lax.top_k(values, k)[1]]

    short = (count >= k) & (count <= capacity)
    return jax.lax.cond(short, from_candidates, from_all, uniforms)


class fast_subsample(Messenger):
    """Draw ``numpyro.plate(..., subsample_size=B)`` indices as the ``lax.top_k`` of uniforms.

    On CPU NumPyro shuffles with a sequential loop of ``B`` steps (a ``lax.scan`` of
    Fisher-Yates swaps), which costs a DGP training step about 1 ms at ``B = 1000``
    (measured with the project's benchmarks); the positions of the ``B`` largest of ``N``
    uniforms are a subset with the same (uniform) distribution, in random order, found in a few
    vectorized passes (``top_k`` runs on the ``B + 6 sqrt(B)`` or so largest: 0.42 -> 0.31 ms
    at 1,000 of 10,000, the same indices). Subsamples that are already set (replayed from a
    guide, or substituted) are left alone.

    :param fn: the model or guide.
    """

    def process_message(self, msg: dict) -> None:
        """Swap NumPyro's subsample function of a plate message for the ``top_k`` one."""
        if msg["type"] == "plate" and msg["value"] is None and msg["fn"] is numpyro_subsample_fn:
            msg["fn"] = _top_k_subsample


class data_parallel(Messenger):
    """Data-parallel training: shard the points of the plate ``"data"`` across devices.

    The plate's indices (the minibatch drawn inside the step, or all points) get a sharding
    constraint over ``mesh`` (default: every device on one axis), so XLA's partitioner runs
    everything computed from them -- for a model that takes its inputs through the plate
    (``numpyro.subsample(X, event_dim=1)``, as :func:`numpyro_dgp.models.deep_gp_regression`
    does) the layer inputs, the per-point conditionals, the Monte Carlo draws and the
    likelihood -- on each device's share; a model that feeds the whole ``X`` to its layers
    outside the plate only gets its likelihood split. It replicates the small global parts
    (inducing values, kernel matrices, KL terms), and reduces the sums over points and their
    gradients across devices. The model is unchanged and so is the loss: JAX's partitionable
    random numbers give every point the same draw as on one device, so the sharded loss
    equals the single-device loss on the same minibatch up to the order of the reductions
    (checked by the package's tests). Wrap the model (and the guide, if it has the plate) before
    building ``SVI``; use with :func:`numpyro_dgp.fit` as usual::

        svi = SVI(data_parallel(model), guide, optimizer, DGPElbo())

    On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` (set before JAX starts)
    gives two devices to test with; the speed-up is for several accelerators (see
    the project's benchmarks for what it gives on a 2-core CPU).

    :param fn: the model or guide.
    :param mesh: a ``jax.sharding.Mesh``; default one axis over ``jax.devices()``.
    :param axis_name: the mesh axis the points are split over.
    :raises ValueError: if ``axis_name`` is not an axis of ``mesh``.
    """

    def __init__(
        self,
        fn: Callable | None = None,
        mesh: Mesh | None = None,
        axis_name: str | None = None,
    ) -> None:
        if mesh is None:
            axis_name = axis_name or "data"
            mesh = Mesh(np.asarray(jax.devices()), (axis_name,))
        elif axis_name is None:
            axis_name = mesh.axis_names[0]
        if axis_name not in mesh.axis_names:
            raise ValueError(
                f"data_parallel: axis_name {axis_name!r} is not an axis of the mesh "
                f"{mesh.axis_names}"
            )
        self.mesh, self.axis_name = mesh, axis_name
        super().__init__(fn)

    def postprocess_message(self, msg: dict) -> None:
        """Constrain the plate's indices to be sharded over the mesh axis."""
        if msg["type"] == "plate" and msg["name"] == "data" and msg["value"] is not None:
            sharding = NamedSharding(self.mesh, PartitionSpec(self.axis_name))
            msg["value"] = jax.lax.with_sharding_constraint(msg["value"], sharding)
