"""``fit``'s check of the observed values: one abstract run of the model (``jax.eval_shape``;
nothing is computed), whose observed sites are refused when the likelihood reads values outside
their distribution's support, and warned about (:class:`~numpyro_dgp.TargetScaleWarning`) when
a Gaussian or Student-t target is far from standardized."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from numpyro_dgp._validation import concrete, warn_if_target_not_standardized

__all__ = ["check_observed"]


def _base_distribution(fn: Any) -> Any:
    while hasattr(fn, "base_dist"):  # Independent, Expanded, Masked wrappers
        fn = fn.base_dist
    return fn


def _argument_name(value: Any, args: tuple, kwargs: dict) -> str:
    """`` (args[i])`` or `` (name=)`` when ``value`` is that argument itself, else ``""``."""
    for i, a in enumerate(args):
        if a is value:
            return f" (args[{i}])"
    return next((f" ({k}=)" for k, v in kwargs.items() if v is value), "")


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
    computed; about 20 ms): values the likelihood reads (its mask's, not NaN) outside their
    distribution's support are refused, and a Gaussian or Student-t target far from standardized
    gets a :class:`TargetScaleWarning`. Only values the model observes as they were passed
    (``obs=y``) are concrete here; an observation computed from the arguments inside the model
    (a minibatch, a cast) is left to the model's own checks (the factories of
    :mod:`numpyro_dgp.models` check theirs).

    :raises ValueError: an observed value outside its distribution's support, naming the site
        and the argument.
    """
    from numpyro import handlers
    from numpyro.distributions import Normal, StudentT

    found = []

    def probe():
        with handlers.block():
            tr = handlers.trace(handlers.seed(model, 0)).get_trace(*args, **kwargs)
        for name, site in tr.items():
            if site["type"] == "sample" and site["is_observed"]:
                value = concrete(site["value"])
                if value is not None and value.size:
                    where = _argument_name(site["value"], args, kwargs)
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
