"""Checkpoints of a running :func:`~numpyro_dgp.fit`: everything needed to continue it bit for bit.

A checkpoint is a parameter file of :mod:`numpyro_dgp.io` (written atomically: a temporary
file in the same folder, flushed, then renamed over the previous checkpoint), holding

* every leaf of the ``SVIState`` (the optimizer state, its step count, any mutable state and
  the random key, as raw key data) and of the averaging state (running mean and count);
* the losses of the steps done so far;
* metadata: the number of steps done, the fit's ``num_steps``, the number of skipped steps,
  and what identifies the fit (:func:`fit_identity`, :func:`with_state`: the data's shapes,
  dtypes and SHA-256, ``average_from``, the guide, the objective, the optimizer, the
  parameters' names, shapes and dtypes and the state's structure), so that ``resume=True``
  refuses another fit's checkpoint before any work, naming what differs.

The tree itself is not stored: resuming rebuilds it from ``svi.init`` on the same model, guide
and optimizer (the identity recorded its structure and every array's shape and dtype), then
fills in the stored leaves.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer.svi import SVIState

from numpyro_dgp.infer._checks import named_arguments
from numpyro_dgp.io import load_params, save_params

#: the ``metadata["format"]`` of a fit checkpoint
CHECKPOINT_FORMAT = "numpyro_dgp.fit_checkpoint"


class Progress(NamedTuple):
    """Where a fit stands after ``step`` of its steps (what a checkpoint holds).

    :ivar step: steps of the fit done.
    :ivar carry: what the fit's steps carry: ``(state, mean, count)``, the ``SVIState``, the
        running mean of the unconstrained parameters (``{}`` without averaging) and the number
        of steps in it.
    :ivar losses: ``(step,)`` losses so far.
    :ivar num_skipped: steps skipped so far.
    """

    step: int
    carry: tuple[SVIState, dict, jax.Array]
    losses: np.ndarray
    num_skipped: int

    @classmethod
    def fresh(cls, svi: Any, state: SVIState, average: bool) -> Progress:
        """A fit's start at ``state``, before any step; with ``average``, the running mean
        starts at the state's parameters (without, it is an empty placeholder)."""
        mean = svi.optim.get_params(state.optim_state) if average else {}
        return cls(0, (state, mean, jnp.zeros((), jnp.int32)), np.empty(0), 0)


def _is_key(leaf: Any) -> bool:
    return jnp.issubdtype(getattr(leaf, "dtype", np.float64), jax.dtypes.prng_key)


def _carried(carry: tuple) -> tuple[list, Any]:
    """What a checkpoint stores of a fit's ``carry`` (its state, running mean and count): its
    leaves (keys as raw key data) and their tree."""
    leaves, treedef = jax.tree_util.tree_flatten(carry)
    return [jax.random.key_data(leaf) if _is_key(leaf) else leaf for leaf in leaves], treedef


def _described(obj: Any) -> str:
    """``Name(setting=value, ...)``: the class and its plain settings (e.g. ``num_particles``)."""
    settings = {
        k: v
        for k, v in sorted(vars(obj).items())
        if not k.startswith("_") and isinstance(v, (bool, int, float, str))
    }
    return f"{type(obj).__name__}({', '.join(f'{k}={v!r}' for k, v in settings.items())})"


def fit_identity(svi: Any, args: tuple, kwargs: dict, average_from: int | None) -> dict:
    """What identifies a fit before it starts, as JSON: each model argument (arrays by shape,
    dtype and the SHA-256 of their bytes; other values as they are, or by type),
    ``average_from``, the guide's class, the objective and the optimizer (class and the settings
    it exposes: NumPyro's optimizers do not expose their step size).
    :func:`with_state` adds the parameters and the state's structure once they exist. Hashing
    reads the data once (time linear in its size)."""
    from numpyro_dgp._compat import innermost_guide
    from numpyro_dgp._validation import concrete, is_array

    data = {}
    for where, value in named_arguments(args, dict(sorted(kwargs.items()))):
        if is_array(value):
            host = concrete(value)  # None: another process's shard, known by its shape
            data[where] = {
                "shape": list(value.shape),
                "dtype": str(value.dtype),
                "sha256": None
                if host is None
                else hashlib.sha256(np.ascontiguousarray(host).tobytes()).hexdigest(),
            }
        else:
            # a plain setting as it is (JSON), anything else by its type: stable across processes
            plain = value is None or isinstance(value, (bool, int, float, str))
            data[where] = {"value": value if plain else type(value).__name__}
    return {
        "data": data,
        "average_from": None if average_from is None else int(average_from),
        "guide": type(innermost_guide(svi.guide)).__name__,
        "objective": _described(svi.loss),
        "optimizer": _described(svi.optim),
    }


def with_state(identity: dict, params: dict, carry: tuple) -> dict:
    """``identity`` with the optimizer's parameters (names, shapes, dtypes) and the structure of
    the state a checkpoint holds (``carry`` of a fresh start: the optimizer's state, the key,
    the averaging state; each array's shape and dtype)."""
    arrays, treedef = _carried(carry)
    return {
        **identity,
        "params": {
            k: [list(np.shape(v)), str(jnp.result_type(v))] for k, v in sorted(params.items())
        },
        "state": {
            "structure": str(treedef),
            "arrays": [[list(np.shape(a)), str(jnp.result_type(a))] for a in arrays],
        },
    }


def _difference(was: Any, now: Any, where: str) -> str | None:
    """The first entry where ``now`` (this fit's identity) differs from ``was`` (the
    checkpoint's), with both values; an unknown SHA-256 (another process's shard) matches.
    ``where`` is the entry's path (``""`` at the top)."""
    if isinstance(was, dict) and isinstance(now, dict):
        for key in {**now, **was}:  # in this fit's order: an array's shape before its SHA-256
            path = f"{where}.{key}" if where else key
            difference = _difference(was.get(key), now.get(key), path)
            if difference is not None:
                return difference
        return None
    if was == now or (where.endswith(".sha256") and None in (was, now)):
        return None
    # long values (the state's structure) are shown from a little before they part
    now_text, was_text = repr(now), repr(was)
    cut = max(len(os.path.commonprefix([now_text, was_text])) - 40, 0)
    lead = "..." if cut else ""
    return (
        f"{where} is {lead}{now_text[cut:][:200]} here, "
        f"{lead}{was_text[cut:][:200]} in the checkpoint's fit"
    )


class Checkpoints:
    """The checkpoints of one :func:`~numpyro_dgp.fit` at ``path``: made before any work (the
    path is checked, and with ``resume`` a checkpoint of another fit is refused, naming what
    differs), :meth:`start` once the initial state exists, :meth:`after_chunk` after chunks."""

    def __init__(self, path, svi, args, kwargs, average_from, resume, num_steps, every) -> None:
        """Raise unless a checkpoint can be written at ``path``: a new file in an existing
        folder, or a fit checkpoint (which the fit then replaces); never a folder or a file the
        library did not write. With ``resume``, refuse a checkpoint of another fit.

        :raises FileNotFoundError: the folder does not exist.
        :raises FileExistsError: ``path`` is a folder, or a file that is not a fit checkpoint.
        :raises ValueError: a checkpoint of another fit, or one beyond ``num_steps``.
        """
        self.path, self.num_steps, self.every = path, num_steps, every
        self.identity = fit_identity(svi, args, kwargs, average_from)
        self.resume = False
        path = Path(os.fspath(path)).expanduser()
        shown = f"fit: checkpoint_path {str(path)!r}"
        if path.is_dir():
            raise FileExistsError(f"{shown} is a folder; give the path of a checkpoint file")
        if not path.parent.is_dir():
            raise FileNotFoundError(f"{shown}: the folder {str(path.parent)!r} does not exist")
        if not path.exists():
            return
        try:
            _, meta = load_params(path, return_metadata=True, as_numpy=True)
        except ValueError:
            meta = {}
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise FileExistsError(
                f"{shown} exists and is not a fit checkpoint; a fit writes over only its own "
                "checkpoints, so nothing was touched: choose another path"
            )
        self.resume = resume
        if resume:
            self._step(meta)

    def start(self, svi: Any, fresh: Progress) -> Progress:
        """Where the fit starts: ``fresh`` (a new start, whose structure the identity records),
        or the checkpoint's progress, rebuilt on that structure, when resuming.

        :raises ValueError: a checkpoint written by another fit (other parameters or state).
        """
        params = svi.optim.get_params(fresh.carry[0].optim_state)
        self.identity = with_state(self.identity, params, fresh.carry)
        if not self.resume:
            return fresh
        stored, meta = load_params(self.path, return_metadata=True, as_numpy=True)
        step = self._step(meta)
        # the same fit: the stored arrays are those of this structure (its identity says so)
        template_leaves, treedef = jax.tree_util.tree_flatten(fresh.carry)
        given = stored["leaves"]
        leaves = [
            jax.random.wrap_key_data(given[str(i)], impl=jax.random.key_impl(like))
            if _is_key(like)
            else jnp.asarray(given[str(i)])
            for i, like in enumerate(template_leaves)
        ]
        carry = jax.tree_util.tree_unflatten(treedef, leaves)
        losses = np.asarray(stored["losses"])
        return Progress(step, carry, losses, int(meta["num_skipped"]))

    def _step(self, meta: dict) -> int:
        """The step the checkpoint (its metadata ``meta``) stands at, checked to record this fit
        (its identity: :func:`fit_identity`, and :func:`with_state` once the state exists) and to
        be no further on than ``num_steps``.

        :raises ValueError: a checkpoint of another fit (other data, ``average_from``, guide,
            objective, optimizer, parameters or state), naming what differs, or one beyond
            ``num_steps``.
        """
        where = f"fit: checkpoint {os.fspath(self.path)!r}"
        stored = meta.get("fit")
        if isinstance(stored, dict):
            # the parameters and the state are compared once this fit's identity has them
            stored = {key: stored.get(key) for key in self.identity}
            difference = _difference(stored, self.identity, "")
        else:
            difference = "the checkpoint does not record its fit (written by an older numpyro_dgp)"
        if difference is not None:
            raise ValueError(
                f"{where} was written by another fit: {difference}. resume=True continues only "
                "the same fit (the same data, model, guide, objective and optimizer); pass another "
                "checkpoint_path to start this one afresh"
            )
        step = int(meta["step"])
        if step > self.num_steps:
            raise ValueError(
                f"{where} is at step {step}, beyond this fit's num_steps={self.num_steps}"
            )
        return step

    def after_chunk(self, log: Any, carry: tuple) -> None:
        """Write a checkpoint, atomically (see the module docstring), where one is due: every
        ``every`` steps and at the end (``log``: the fit's ``TrainingLog``; ``carry``: its
        state, running mean and count)."""
        done = log.done
        if done < self.num_steps and not (self.every and done % self.every == 0):
            return
        leaves = {str(i): np.asarray(leaf) for i, leaf in enumerate(_carried(carry)[0])}
        metadata = {
            "format": CHECKPOINT_FORMAT,
            "step": int(done),
            "num_steps": int(self.num_steps),
            "num_skipped": int(log.num_skipped),
            "fit": self.identity,
        }
        arrays = {"leaves": leaves, "losses": np.asarray(log.losses[:done], np.float64)}
        save_params(self.path, arrays, metadata=metadata)
