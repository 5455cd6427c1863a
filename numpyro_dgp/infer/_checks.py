"""What the training drivers check in their data, and how they find a layer to blame.

Before any work, :func:`check_data` refuses empty or non-finite model arguments and
:func:`check_observed` runs the model once abstractly (``jax.eval_shape``; nothing is
computed): observed values outside their distribution's support are refused, and a Gaussian or
Student-t target far from standardized is warned about
(:class:`~numpyro_dgp.TargetScaleWarning`).

A failed Cholesky factorization inside a compiled step gives NaN, which the guarded update
skips; on its own that says nothing about where. After a fit that skipped steps (or a model that
cannot be initialized), one eager run of the guide and the model at the parameters checks every
layer's ``Kmm_chol`` and names the first that is not finite (:func:`failed_layer`).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.distributions import Normal, StudentT
from numpyro.handlers import block, replay, seed, substitute, trace
from numpyro.primitives import Messenger

from numpyro_dgp._protocol import LAYER_MESSAGE, message_layer, model_config
from numpyro_dgp._validation import (
    concrete,
    is_array,
    non_finite_entries,
    warn_if_not_standardized,
    warn_if_target_not_standardized,
)


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
