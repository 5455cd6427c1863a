"""Checkpoints of a running :func:`~numpyro_dgp.fit`: everything needed to continue it bit for bit.

A checkpoint is a parameter file of :mod:`numpyro_dgp.io` (written atomically: a temporary
file in the same folder, flushed, then renamed over the previous checkpoint), holding

* every leaf of the ``SVIState`` (the optimizer state, its step count, any mutable state and
  the random key, as raw key data) and of the averaging state (running mean and count);
* the losses of the steps done so far;
* metadata: the number of steps done, the fit's ``num_steps`` and ``average_from``, the
  number of skipped steps, and the parameter names (to refuse another model's checkpoint).

The tree structure itself is not stored: resuming rebuilds it from ``svi.init`` on the same
model, guide and optimizer, then fills in the stored leaves, checking their number, shapes
and dtypes.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.svi import SVIState

from numpyro_dgp.io import load_params, save_params

__all__ = ["CHECKPOINT_FORMAT", "Progress", "read_checkpoint", "write_checkpoint"]

#: the ``metadata["format"]`` of a fit checkpoint
CHECKPOINT_FORMAT = "numpyro_dgp.fit_checkpoint"


class Progress(NamedTuple):
    """Where a fit stands after ``step`` of its steps (what a checkpoint holds).

    :ivar step: steps of the fit done.
    :ivar state: the ``SVIState``.
    :ivar mean: running mean of the unconstrained parameters (``{}`` without averaging).
    :ivar count: steps in the running mean.
    :ivar losses: ``(step,)`` losses so far.
    :ivar num_skipped: steps skipped so far.
    """

    step: int
    state: SVIState
    mean: dict
    # a field named like tuple.count: the checker's clash, not a bug
    count: jax.Array  # type: ignore[assignment]
    losses: np.ndarray
    num_skipped: int


def _is_key(leaf: Any) -> bool:
    return jnp.issubdtype(getattr(leaf, "dtype", np.float64), jax.dtypes.prng_key)


def _leaves(progress: Progress) -> list:
    return jax.tree_util.tree_leaves((progress.state, progress.mean, progress.count))


def write_checkpoint(
    path: os.PathLike | str,
    progress: Progress,
    num_steps: int,
    average_from: int | None,
    names: list[str],
) -> None:
    """Write ``progress`` to ``path`` atomically (see the module docstring)."""
    leaves = {
        str(i): np.asarray(jax.random.key_data(leaf) if _is_key(leaf) else leaf)
        for i, leaf in enumerate(_leaves(progress))
    }
    metadata = {
        "format": CHECKPOINT_FORMAT,
        "step": int(progress.step),
        "num_steps": int(num_steps),
        "average_from": average_from,
        "num_skipped": int(progress.num_skipped),
        "params": sorted(names),
    }
    save_params(
        path,
        {"leaves": leaves, "losses": np.asarray(progress.losses, np.float64)},
        metadata=metadata,
    )


def _check_metadata(
    meta: dict[str, Any], where: str, num_steps: int, average_from: int | None, names: list[str]
) -> int:
    """The step a checkpoint stands at, its metadata ``meta`` checked against this fit.

    :raises ValueError: a file that is not a fit checkpoint, one of a fit with other parameters
        or another ``average_from``, or one beyond ``num_steps``.
    """
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{where} is not a fit checkpoint (written by save_params, not by fit?)")
    if meta.get("params") != sorted(names):
        raise ValueError(
            f"{where} was written by a fit with other parameters ({meta.get('params')}); this "
            f"model and guide have {sorted(names)}"
        )
    if meta.get("average_from") != average_from:
        raise ValueError(
            f"{where} was written with average_from={meta.get('average_from')!r}, "
            f"this fit has average_from={average_from!r}"
        )
    step = int(meta["step"])
    if step > num_steps:
        raise ValueError(f"{where} is at step {step}, beyond this fit's num_steps={num_steps}")
    return step


def _check_leaves(given: dict[str, np.ndarray], template_leaves: list, where: str) -> None:
    """Raise unless the stored state arrays ``given`` are as many as the leaves of this fit's
    state, each of the same shape and dtype (PRNG keys as their raw key data).

    :raises ValueError: otherwise, naming the first array that differs.
    """
    if len(given) != len(template_leaves):
        raise ValueError(
            f"{where} holds {len(given)} state arrays, this fit's state has {len(template_leaves)} "
            "(another optimizer?)"
        )
    for i, like in enumerate(template_leaves):
        value = given[str(i)]
        expected = jax.random.key_data(like) if _is_key(like) else like
        if value.shape != tuple(expected.shape) or value.dtype != expected.dtype:
            raise ValueError(
                f"{where}: state array {i} has shape {value.shape} {value.dtype}, this fit's has "
                f"{tuple(expected.shape)} {expected.dtype} (another optimizer or precision?)"
            )


def read_checkpoint(
    path: os.PathLike | str,
    template: Progress,
    num_steps: int,
    average_from: int | None,
    names: list[str],
) -> Progress:
    """The :class:`Progress` stored at ``path``, rebuilt on the structure of ``template`` (a fresh
    start of the same fit).

    :raises ValueError: a file that is not a fit checkpoint, or one written by another model,
        optimizer or averaging setting, or one further on than ``num_steps``.
    """
    stored, meta = load_params(path, return_metadata=True, as_numpy=True)
    where = f"fit: checkpoint {os.fspath(path)!r}"
    step = _check_metadata(meta, where, num_steps, average_from, names)
    template_leaves, treedef = jax.tree_util.tree_flatten(
        (template.state, template.mean, template.count)
    )
    given = stored["leaves"]
    _check_leaves(given, template_leaves, where)
    leaves = [
        jax.random.wrap_key_data(given[str(i)], impl=jax.random.key_impl(like))
        if _is_key(like)
        else jnp.asarray(given[str(i)])
        for i, like in enumerate(template_leaves)
    ]
    state, mean, count = jax.tree_util.tree_unflatten(treedef, leaves)
    return Progress(
        step, state, mean, count, np.asarray(stored["losses"]), int(meta["num_skipped"])
    )
