"""Helpers for SDE-flow models (DiffGP, Hegde et al. 2019): paths for plots, temporal inducing
inputs.

The flow itself is the handler :class:`numpyro_dgp.handlers.sde_flow`; a ready-made model
is :func:`numpyro_dgp.models.diffgp`.

**References:**

* Hegde, Heinonen, Lähdesmäki, Kaski (2019). Deep learning with differential Gaussian
  process flows. AISTATS.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from numpyro_dgp._engine.run import marginal_trace
from numpyro_dgp._protocol import LAYER_RULE, get_tag
from numpyro_dgp._validation import as_float_array, check_positive_int
from numpyro_dgp.core import kmeans
from numpyro_dgp.handlers import sde_flow

__all__ = ["flow_trajectories", "temporal_inducing_inputs"]


def flow_trajectories(
    model: sde_flow,
    guide: Callable,
    params: dict,
    rng_key: jax.Array,
    X: ArrayLike,
    *args,
    num_samples: int = 10,
    **kwargs,
) -> jax.Array:
    """Sample paths of the flow at inputs ``X``: ``(S, num_steps + 1, N, D)`` (``x_0 = X`` first).

    Paths follow the flow's estimator as in training (:class:`~numpyro_dgp.handlers.sde_flow`):
    the guide's marginal moments for ``"marginal"``, a sampled ``u`` per path for
    ``"ancestral"``.

    :param model: an :class:`~numpyro_dgp.handlers.sde_flow`-wrapped model.
    :param guide: the fitted guide (set up, e.g. by :func:`numpyro_dgp.fit`).
    :param params: fitted parameters.
    :param rng_key: PRNG key.
    :param X: ``(N, D)`` starting points (with the time column if ``time_input``).
    :param args: further positional arguments of the model.
    :param num_samples: ``S`` paths per point.
    :param kwargs: keyword arguments of the model.
    :return: ``(S, num_steps + 1, N, D)`` states of the flow at every Euler–Maruyama step.
    :raises TypeError: for a model that is not wrapped by ``sde_flow``.
    :raises ValueError: for the shape of ``X`` or ``num_samples``.
    """
    if not isinstance(model, sde_flow):
        raise TypeError(
            "flow_trajectories: model must be the sde_flow-wrapped model itself "
            f"(sde_flow(model, layer=..., T=...)), got {type(model).__name__}"
        )
    X = as_float_array(X, "X", "flow_trajectories", ndim=2)
    check_positive_int(num_samples, "num_samples", "flow_trajectories")
    recording = sde_flow(model.fn, **{**model.spec._asdict(), "record": True})  # its path too
    name = f"{recording.spec.layer}.layer"

    def one(key, params, X):
        run = marginal_trace(recording, guide, params, key, (X,) + args, kwargs, 3)
        return get_tag(run.model_trace[name], LAYER_RULE).record["path"]

    keys = jax.random.split(rng_key, num_samples)
    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))(keys, params, X)


def temporal_inducing_inputs(X: ArrayLike, num_inducing: int, times: ArrayLike) -> jax.Array:
    """Inducing inputs ``(num_inducing * len(times), D + 1)`` of a time-dependent flow layer:
    k-means centers of ``X`` (fixed key, as :func:`numpyro_dgp.gp_layer` does) at each time.

    :param X: ``(N, D)`` inputs.
    :param num_inducing: centers per time.
    :param times: ``(K,)`` inducing times (e.g. ``jnp.linspace(0, T, 3)``).
    :return: ``(num_inducing * K, D + 1)``: the centers at the first time, then at the
        second, ... (the time in the last column).
    :raises ValueError: for the shape of ``X`` or ``times``.
    """
    X = as_float_array(X, "X", "temporal_inducing_inputs", ndim=2)
    times = jnp.atleast_1d(jnp.asarray(times, X.dtype))
    if times.ndim != 1 or times.shape[0] < 1:
        raise ValueError(
            "temporal_inducing_inputs: times must be a non-empty 1-D array, got shape "
            f"{times.shape}"
        )
    centers = kmeans(jax.random.PRNGKey(0), X, int(num_inducing))
    grid_x = jnp.tile(centers, (times.shape[0], 1))
    grid_t = jnp.repeat(times, centers.shape[0])[:, None]
    return jnp.concatenate([grid_x, grid_t], axis=-1)
