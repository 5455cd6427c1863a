"""What the training drivers check in their data and checkpoints, and how they find a layer to
blame.

Before any work, :func:`check_data` refuses empty or non-finite model arguments and
:func:`check_observed` runs the model once abstractly (``jax.eval_shape``; nothing is
computed): observed values outside their distribution's support are refused, and a Gaussian or
Student-t target far from standardized is warned about
(:class:`~numpyro_dgp.TargetScaleWarning`).

A failed Cholesky factorization inside a compiled step gives NaN, which the guarded update
skips; on its own that says nothing about where. After a fit that skipped steps (or a model that
cannot be initialized), one eager run of the guide and the model at the parameters checks every
layer's ``Kmm_chol`` and names the first that is not finite (:func:`failed_layer`).

The checkpoints of a running :func:`~numpyro_dgp.fit` (:class:`Checkpoints`) hold everything
needed to continue it bit for bit. A checkpoint is a parameter file of :mod:`numpyro_dgp.io`
(written atomically: a temporary file in the same folder, flushed, then renamed over the
previous checkpoint), holding

* every leaf of the ``SVIState`` (the optimizer state, its step count, any mutable state and
  the random key, as raw key data) and of the averaging state (running mean and count);
* the losses of the steps done so far;
* metadata: the number of steps done, the fit's ``num_steps``, the number of skipped steps,
  and what identifies the fit (:func:`fit_identity`, then :meth:`Checkpoints.start`: the
  data's shapes, dtypes and SHA-256, ``average_from``, the guide, the objective, the optimizer,
  the parameters' names, shapes and dtypes and the state's structure), so that ``resume=True``
  refuses another fit's checkpoint before any work, naming what differs.

The tree itself is not stored: resuming rebuilds it from ``svi.init`` on the same model, guide
and optimizer (the identity recorded its structure and every array's shape and dtype), then
fills in the stored leaves.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.distributions import Normal, StudentT
from numpyro.handlers import block, replay, seed, substitute, trace
from numpyro.primitives import Messenger

from numpyro_dgp._compat import innermost_guide
from numpyro_dgp._protocol import LAYER_MESSAGE, message_layer, model_config
from numpyro_dgp._validation import (
    concrete,
    is_array,
    non_finite_entries,
    warn_if_not_standardized,
    warn_if_target_not_standardized,
)
from numpyro_dgp.io import load_params, save_params


def _base_distribution(fn: Any) -> Any:
    while hasattr(fn, "base_dist"):  # Independent, Expanded, Masked wrappers
        fn = fn.base_dist
    return fn


def named_arguments(args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """``[(name, value)]`` of the model's arguments as messages name them: ``args[i]``, ``k=``."""
    return [(f"args[{i}]", a) for i, a in enumerate(args)] + [
        (f"{k}=", v) for k, v in kwargs.items()
    ]


def _observed_entries(fn: Any, value: np.ndarray, mask: Any) -> np.ndarray | None:
    """The entries of ``value`` the likelihood reads: those its masks keep (the site's
    ``handlers.mask``, a masked distribution's, ``obs_mask``'s) that are not NaN (missing
    targets); flattened for a scalar event, the whole value for a vector one; ``None`` when that
    cannot be told here (a traced mask, or a vector event with entries left out)."""
    masks = [mask]
    while fn is not None:  # a masked distribution's mask, inside its wrappers
        masks.append(getattr(fn, "_mask", None))
        fn = getattr(fn, "base_dist", None)
    keep = np.ones(value.shape, bool)
    for m in masks:
        if m is None or m is True:
            continue
        if m is False:  # the site is left out of the density: nothing is read
            keep[...] = False
            continue
        m = concrete(m)
        if m is None:
            return None
        keep &= np.broadcast_to(m.reshape(m.shape + (1,) * (value.ndim - m.ndim)), value.shape)
    if np.issubdtype(value.dtype, np.floating):
        keep &= ~np.isnan(value)
    return value if keep.all() else value[keep]


def _check_support(name: str, where: str, fn: Any, value: np.ndarray, caller: str) -> None:
    """Refuse observed values (the entries the likelihood reads) outside ``fn``'s support.

    :raises ValueError: naming the site, the argument and a value.
    """
    try:
        support = fn.support
        inside = np.asarray(support(value))
    except Exception:  # noqa: BLE001 - a support with traced bounds: left to the model
        return
    if inside.all():
        return
    example = f", e.g. {value[~inside].ravel()[0].item()!r}" if inside.shape == value.shape else ""
    raise ValueError(
        f"{caller}: observed site {name!r}{where} holds {int(np.sum(~inside))} value(s) outside "
        f"the support of its {type(_base_distribution(fn)).__name__} ({support}){example}"
    )


def check_observed(model: Any, args: tuple, kwargs: dict, caller: str) -> None:
    """Check the observed values of one abstract run of ``model`` (``jax.eval_shape``: nothing is
    computed): values the likelihood reads (its mask's, not NaN) outside their
    distribution's support are refused, and a Gaussian or Student-t target far from standardized
    gets a :class:`TargetScaleWarning`. Only values the model observes as they were passed
    (``obs=y``) are concrete here; an observation computed from the arguments inside the model
    (a minibatch, a cast) is left to the model's own checks (the factories of
    :mod:`numpyro_dgp.models` check theirs).

    :raises ValueError: an observed value outside its distribution's support, naming the site
        and the argument.
    """
    found = []

    def probe():
        with block():
            tr = trace(seed(model, 0)).get_trace(*args, **kwargs)
        for name, site in tr.items():
            if site["type"] == "sample" and site["is_observed"]:
                value = concrete(site["value"])
                if value is not None and value.size:
                    named = named_arguments(args, kwargs)
                    where = next((f" ({w})" for w, v in named if v is site["value"]), "")
                    found.append((name, site["fn"], value, site.get("mask"), where))
        return 0

    jax.eval_shape(probe)
    for name, fn, value, mask, where in found:
        read = _observed_entries(fn, value, mask)
        if read is None or (fn.event_dim and read.shape != value.shape):
            continue  # what the likelihood reads of a vector event: the model's to check
        _check_support(name, where, fn, read, caller)
        if isinstance(_base_distribution(fn), (Normal, StudentT)):
            warn_if_target_not_standardized(read, f"{name!r}{where}", caller, stacklevel=4)


def check_data(model, args, kwargs, allow_missing):
    """Refuse the model's array arguments with no rows or with NaN or inf; with
    ``allow_missing`` (or a model of :mod:`numpyro_dgp.models` built with
    ``missing_targets="mask"``), NaN (but not inf) in those after the first (the inputs), which
    the model masks as missing targets. Each argument is checked in turn. Warn about inputs
    ``X`` far from standardized."""
    config = model_config(model) or {}
    allow_missing |= (config.get("arguments") or {}).get("missing_targets") == "mask"
    for where, value in named_arguments(args, kwargs):
        if is_array(value) and value.ndim >= 1 and value.shape[0] == 0:
            raise ValueError(f"fit: {where} has no rows (shape {tuple(value.shape)})")
        if not (is_array(value) and jnp.issubdtype(value.dtype, jnp.floating)):
            continue
        # on the host (NumPy): an eager jnp check would compile a program per argument shape
        value = concrete(value)  # None: another process's shard (that process checks it)
        if value is None:
            continue
        if allow_missing and where != "args[0]":
            if np.isinf(value).any():
                raise ValueError(f"fit: model argument {where} contains inf values")
        elif non_finite_entries(value, max_first=0)[0]:
            hint = "" if where == "args[0]" else _MISSING_HINT
            raise ValueError(f"fit: model argument {where} contains NaN or inf values{hint}")
    X = args[0] if args else None
    if is_array(X) and X.ndim == 2 and jnp.issubdtype(X.dtype, jnp.floating):
        warn_if_not_standardized(X, "X (its first argument)", "fit", stacklevel=4)


_MISSING_HINT = (
    "; if they are missing targets, mask them in the model (numpyro_dgp.models' "
    "missing_targets='mask', or numpyro.handlers.mask in your own) and pass "
    "fit(..., allow_missing=True)"
)


class _Stop(Exception):
    """Ends the diagnostic run at the first failed layer."""


class _check_factors(Messenger):
    """Records the first layer whose ``Kmm_chol`` holds NaN or inf, and stops the run there."""

    failed: str | None = None

    def process_message(self, msg: dict) -> None:
        if msg["type"] != LAYER_MESSAGE:
            return
        layer = message_layer(msg)
        if not np.all(np.isfinite(np.asarray(layer.Kmm_chol))):
            self.failed = layer.name
            raise _Stop


def failed_layer(
    model: Callable, guide: Callable | None, params: dict, args: tuple, kwargs: dict
) -> tuple[str | None, str | None]:
    """``(layer, error)``: the first layer whose ``K(Z, Z)`` factor is not finite at ``params``
    (``None`` if every layer's is), and the error that stopped the check early, if any."""
    rng_key = jax.random.PRNGKey(0)
    model_run = substitute(seed(model, rng_key), data=params)
    with numpyro.validation_enabled(False):
        if guide is not None:
            try:
                guide_trace = trace(
                    substitute(seed(guide, jax.random.fold_in(rng_key, 1)), data=params)
                ).get_trace(*args, **kwargs)
                model_run = replay(model_run, guide_trace)
            except Exception:  # noqa: BLE001
                # the guide itself may fail at these values: check the model alone
                pass
        checker = _check_factors(model_run)
        try:
            checker(*args, **kwargs)
        except _Stop:
            pass
        except Exception as err:  # noqa: BLE001 - report, do not mask the fit's own message
            return checker.failed, f"{type(err).__name__}: {err}"
    return checker.failed, None


def diagnosis(svi: Any, params: dict, args: tuple, kwargs: dict) -> str:
    """A sentence for the warning or error about skipped steps: the layer whose ``K(Z, Z)``
    cannot be factorized at the final parameters, with what to do, or that every layer's can."""
    model_kwargs = {**kwargs, **svi.static_kwargs}
    layer, error = failed_layer(svi.model, svi.guide, params, args, model_kwargs)
    if layer is not None:
        return (
            f" The Cholesky factorization of K(Z, Z) fails in layer {layer!r} at the final "
            "parameters (a near-singular K(Z, Z): inducing inputs too close for the kernel's "
            "lengthscale, or too small a jitter): raise that layer's jitter "
            f"(gp_layer({layer!r}, ..., jitter=...)) or use float64 "
            "(jax.config.update('jax_enable_x64', True))."
        )
    if error is not None:
        return f" (Checking each layer's K(Z, Z) at the final parameters failed: {error}.)"
    return (
        " Every layer's K(Z, Z) factorizes at the final parameters, so the non-finite values came "
        "from elsewhere: a NaN or inf in a minibatch, the likelihood or the objective, or too "
        "large a learning rate."
    )


def check_start(caller: str, rng_key: Any, init_state: Any, init_params: Any = None) -> None:
    """Refuse a run with nothing to start from, or two starts."""
    if init_state is None and rng_key is None:
        raise ValueError(
            f"{caller}: rng_key is None; pass a PRNG key (or init_state= to continue a fit)"
        )
    if init_state is not None and init_params is not None:
        raise ValueError(
            f"{caller}: give init_state (continue a fit) or init_params (start from values), "
            "not both"
        )


def non_finite_params(params: dict) -> list[str]:
    """Names of the entries of ``params`` holding NaN or inf (checked on the host)."""
    return [k for k, v in params.items() if non_finite_entries(np.asarray(v), max_first=0)[0]]


def report_skipped(
    log: Any, svi: Any, params: dict, args: tuple, kwargs: dict, diagnose: bool = True
) -> None:
    """Warn about the skipped updates of a run (its ``TrainingLog``); raise when the run
    diverged: every update skipped, or final (constrained) parameters ``params`` that are not
    finite, which no model can be loaded or predict with. With ``diagnose``, an eager run at
    the final parameters names the layer whose ``K(Z, Z)`` fails."""
    bad = non_finite_params(params)
    if not (log.num_skipped or bad):
        return
    why = diagnosis(svi, params, args, kwargs) if diagnose else ""
    if log.num_skipped == log.num_steps:
        raise FloatingPointError(
            f"{log.caller}: every update produced a non-finite loss or parameters; check the data "
            "scale, the jitter (numpyro_dgp.core.default_jitter) and the learning rate." + why
        )
    if bad:
        first = np.flatnonzero(~np.isfinite(log.losses))
        at = " at its last step"
        if first.size:
            at = (
                f" at step {first[0] + 1} (the first whose loss was not finite; "
                f"{log.num_skipped} of {log.num_steps} updates skipped)"
            )
        raise FloatingPointError(
            f"{log.caller}: the fit diverged{at}: the final parameters {bad} are not finite. "
            "Lower the learning rate or clip the updates (optax.clip_by_global_norm), and check "
            "the data scale." + why
        )
    warnings.warn(
        f"{log.caller}: skipped {log.num_skipped} of {log.num_steps} updates with non-finite loss "
        "or parameters (not applied)." + why,
        RuntimeWarning,
        stacklevel=4,
    )


#: the ``metadata["format"]`` of a fit checkpoint
CHECKPOINT_FORMAT = "numpyro_dgp.fit_checkpoint"


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
    :meth:`Checkpoints.start` adds the parameters and the state's structure once they exist. Hashing
    reads the data once (time linear in its size)."""
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
        path = Path(os.fspath(path)).expanduser()
        self.resume = resume and path.exists()  # a new file: nothing to resume
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
        if resume:
            self._step(meta)

    def start(self, svi: Any, carry: tuple) -> tuple[int, tuple, np.ndarray, int]:
        """Where the fit starts, ``(step, carry, losses, num_skipped)``: ``carry`` (the fit's
        ``(state, mean, count)`` at a new start, whose structure the identity records) before
        any step, or the checkpoint's progress, rebuilt on that structure, when resuming.

        :raises ValueError: a checkpoint written by another fit (other parameters or state).
        """
        params = svi.optim.get_params(carry[0].optim_state)
        # the identity adds the parameters (names, shapes, dtypes) and the structure of the state
        # a checkpoint holds (the optimizer's state, the key, the averaging state; each array's
        # shape and dtype)
        self.identity["params"] = {
            k: [list(np.shape(v)), str(jnp.result_type(v))] for k, v in sorted(params.items())
        }
        arrays, treedef = _carried(carry)
        self.identity["state"] = {
            "structure": str(treedef),
            "arrays": [[list(np.shape(a)), str(jnp.result_type(a))] for a in arrays],
        }
        if not self.resume:
            return 0, carry, np.empty(0), 0
        stored, meta = load_params(self.path, return_metadata=True, as_numpy=True)
        step = self._step(meta)
        # the same fit: the stored arrays are those of this structure (its identity says so)
        template_leaves, treedef = jax.tree_util.tree_flatten(carry)
        given = stored["leaves"]
        leaves = [
            jax.random.wrap_key_data(given[str(i)], impl=jax.random.key_impl(like))
            if _is_key(like)
            else jnp.asarray(given[str(i)])
            for i, like in enumerate(template_leaves)
        ]
        carry = jax.tree_util.tree_unflatten(treedef, leaves)
        return step, carry, np.asarray(stored["losses"]), int(meta["num_skipped"])

    def _step(self, meta: dict) -> int:
        """The step the checkpoint (its metadata ``meta``) stands at, checked to record this fit
        (its identity: :func:`fit_identity`, and what :meth:`start` adds once the state exists)
        and to be no further on than ``num_steps``.

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
