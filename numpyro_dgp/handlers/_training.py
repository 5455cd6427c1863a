"""Training helpers: fast minibatch indices and data-parallel sharding of the data plate."""

from __future__ import annotations

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
    return jax.lax.top_k(uniforms, subsample_size)[1].astype(jnp.arange(0).dtype)


class fast_subsample(Messenger):
    """Draw ``numpyro.plate(..., subsample_size=B)`` indices as the ``lax.top_k`` of uniforms.

    On CPU NumPyro shuffles with a sequential loop of ``B`` steps (a ``lax.scan`` of
    Fisher-Yates swaps); the positions of the ``B`` largest of ``N`` uniforms are a subset with
    the same (uniform) distribution, in random order, found by one vectorized ``top_k``
    (``O(N log B)``). Subsamples that are already set (replayed from a
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
    gives two devices to test with; the speed-up is for several accelerators.

    :param fn: the model or guide.
    :param mesh: a ``jax.sharding.Mesh`` whose first axis the points are split over; default
        one axis over ``jax.devices()``.
    """

    def __init__(self, fn: Callable | None = None, mesh: Mesh | None = None) -> None:
        self.mesh = Mesh(np.asarray(jax.devices()), ("data",)) if mesh is None else mesh
        super().__init__(fn)

    def postprocess_message(self, msg: dict) -> None:
        """Constrain the plate's indices to be sharded over the mesh's first axis."""
        if msg["type"] == "plate" and msg["name"] == "data" and msg["value"] is not None:
            sharding = NamedSharding(self.mesh, PartitionSpec(self.mesh.axis_names[0]))
            msg["value"] = jax.lax.with_sharding_constraint(msg["value"], sharding)
