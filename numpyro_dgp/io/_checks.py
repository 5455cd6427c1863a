"""The checks of given parameters against the parameter sites a model and guide create
(names, shapes, dtypes and finiteness, from one abstract run), and the error that lists what
differs. NumPy only at import: JAX and NumPyro load when a check runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from numpyro_dgp._cache import OwnerCache

if TYPE_CHECKING:
    import jax

#: entries of each kind listed in an error message before "... and N more"
_MAX_LISTED = 12

#: abstract parameter specifications per guide (or model), weakly keyed
_SPECS = OwnerCache(max_entries=16)


class ParameterMismatchError(ValueError):
    """Parameters that do not match what the model (and guide) create: missing entries,
    unexpected entries, entries of the wrong shape or dtype, or (for prediction) non-finite
    values. The message lists each kind; the attributes hold them.

    Raised by :func:`numpyro_dgp.predict`, :func:`numpyro_dgp.predict_from_samples`,
    :func:`numpyro_dgp.fit` (``init_params=``), :func:`numpyro_dgp.load_params` (``model=``)
    and :func:`numpyro_dgp.check_params`.

    :param caller: the function in the message.
    :param missing: names the model or guide creates that are absent.
    :param unexpected: names given that neither creates.
    :param mismatched: ``{name: (given, expected)}`` descriptions (shape and dtype).
    :param non_finite: names whose values hold NaN or infinities.
    :param hint: a closing sentence (what to do).
    """

    def __init__(
        self,
        caller: str,
        missing: list[str],
        unexpected: list[str],
        mismatched: dict[str, tuple[str, str]],
        non_finite: Sequence[str] = (),
        hint: str = "",
    ) -> None:
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = dict(mismatched)
        self.non_finite = list(non_finite)
        lines = [f"{caller}: the parameters do not match those the model (and guide) create:"]
        listed = {
            "missing (the model/guide would silently use initial values)": self.missing,
            "unexpected (no such parameter: misspelt, renamed or from another model?)": (
                self.unexpected
            ),
        }
        lines += [f"  {kind}: {_listed(names)}" for kind, names in listed.items() if names]
        for name, (given, expected) in list(self.mismatched.items())[:_MAX_LISTED]:
            lines.append(
                f"  mis-shaped {name!r}: given {given}, the model/guide creates {expected}"
            )
        if len(self.mismatched) > _MAX_LISTED:
            lines.append(f"  ... and {len(self.mismatched) - _MAX_LISTED} more mis-shaped entries")
        if self.non_finite:
            lines.append(f"  not finite (NaN or inf values): {_listed(self.non_finite)}")
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines))


def _listed(names: list[str]) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return repr(names[:_MAX_LISTED]) + more


def _describe(shape: tuple, dtype: Any) -> str:
    return f"shape {tuple(shape)} {np.dtype(dtype).name}"


def set_up_guide(guide: Callable, rng_key: jax.Array, args: tuple, kwargs: dict) -> None:
    """Build an autoguide's structure (its prototype trace) from the model run on the training
    arguments, if it has not been built. The library's guides read it from an abstract run;
    NumPyro's autoguides get one eager, blocked run under ``rng_key``, so that later runs
    (``svi.init``) draw the same random numbers whether or not the guide was already set up
    (they take their prototype key from the enclosing seed on the first call only).

    :param guide: the guide (anything without a ``prototype_trace`` attribute is left alone).
    :param rng_key: PRNG key of the set-up run.
    :param args: the model's positional (training) arguments.
    :param kwargs: the model's keyword arguments.
    """
    if getattr(guide, "prototype_trace", "absent") is not None:
        return
    from numpyro import handlers

    from numpyro_dgp._compat import innermost_guide
    from numpyro_dgp.guides import DGPGuide

    inner = innermost_guide(guide)
    if isinstance(inner, DGPGuide):
        # the library's guides read their structure abstractly and draw the same keys
        # whether or not it was built before: no run, no key
        inner._setup_prototype(*args, **kwargs)
        return
    with handlers.block():
        handlers.seed(guide, rng_key)(*args, **kwargs)


def _signature(args: tuple, kwargs: dict) -> tuple | None:
    """A hashable summary: arrays by shape and dtype, other values as they are."""
    import jax

    def one(v):
        if isinstance(v, (jax.Array, np.ndarray)):
            return ("array", tuple(v.shape), str(v.dtype))
        return v

    from numpyro_dgp._validation import hashable

    key = (tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in kwargs.items())))
    return key if hashable(key) else None


def training_arguments(model: Callable, guide: Callable | None) -> tuple[tuple, dict] | None:
    """The (abstract) arguments a library guide's structure was built from, when it was built
    on ``model``: the guide's parameters are those it creates on them, whatever the inputs of
    a later call (initial values computed from the data, such as k-means inducing inputs, must
    never be computed from prediction inputs: fewer points than ``num_inducing`` would fail)."""
    if guide is None or getattr(guide, "model", None) is not model:
        return None
    from numpyro_dgp._compat import innermost_guide

    return getattr(innermost_guide(guide), "prototype_args", None)


def _guide_run_arguments(args: tuple, kwargs: dict, training: tuple[tuple, dict] | None):
    """``(arrays, rebuild)``: the arguments the guide runs on (the training ones where known)
    split into abstract arrays (the inputs of ``jax.eval_shape``) and a function that puts them
    back with the other values (kept concrete: subsample sizes, flags)."""
    import jax

    if training is None:
        return (), lambda arrays: (args, kwargs)
    leaves, treedef = jax.tree_util.tree_flatten(training)
    is_array = [isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves]

    def rebuild(arrays):
        it = iter(arrays)
        return jax.tree_util.tree_unflatten(
            treedef, [next(it) if a else leaf for leaf, a in zip(leaves, is_array)]
        )

    return tuple(leaf for leaf, a in zip(leaves, is_array) if a), rebuild


def param_specs(
    model: Callable, guide: Callable | None, args: tuple, kwargs: dict
) -> dict[str, jax.ShapeDtypeStruct]:
    """What the guide and the model create: ``{param site: ShapeDtypeStruct}`` from an abstract
    run (``jax.eval_shape``; the guide must be set up).

    The guide's parameters come from a run of the guide on the arguments its structure was
    built from (the library's guides record the training arguments' shapes), else on ``args``.
    The model's come from the guide's prototype trace when it has one (the model's run on the
    *training* arguments, so that prediction at new inputs checks against the shapes the fit
    created, even for initial values computed from the data, e.g. ``inducing_inputs=X[::3]``),
    else from a run of the model on ``args`` (replayed on the guide's). No initial value is
    ever computed from ``args`` when the guide was set up on the model: prediction at one
    point, or at fewer points than ``num_inducing``, checks the fitted parameters as well.

    :param model: the model.
    :param guide: the guide, or ``None`` (the model's own parameters only).
    :param args: the model's positional arguments.
    :param kwargs: the model's keyword arguments.
    :return: ``{name: ShapeDtypeStruct}`` (weak types kept: a Python-number initial value takes any
        dtype of its kind).
    """
    import jax
    import jax.numpy as jnp
    from numpyro import handlers

    owner = model if guide is None else guide
    # the prototype records this model only if the guide was built on it
    prototype = (
        getattr(guide, "prototype_trace", None) if getattr(guide, "model", None) is model else None
    )
    training = training_arguments(model, guide)
    signature = _signature(*(training if training is not None else (args, kwargs)))
    key = None if signature is None else (model, signature)
    entry = None if key is None else _SPECS.get(owner, key)
    if entry is not None and entry[0] is prototype:
        return entry[1]
    guide_arrays, guide_arguments = _guide_run_arguments(args, kwargs, training)

    def run(guide_arrays):
        guide_key, model_key = jax.random.split(jax.random.PRNGKey(0))
        specs = {}
        seeded = handlers.seed(model, model_key)
        if guide is not None:
            guide_args, guide_kwargs = guide_arguments(guide_arrays)
            guide_trace = handlers.trace(handlers.seed(guide, guide_key)).get_trace(
                *guide_args, **guide_kwargs
            )
            specs.update({n: s["value"] for n, s in guide_trace.items() if s["type"] == "param"})
            seeded = handlers.replay(seeded, guide_trace)
        if prototype is None:
            model_trace = handlers.trace(seeded).get_trace(*args, **kwargs)
            for name, site in model_trace.items():
                if site["type"] == "param":
                    specs.setdefault(name, site["value"])
        return {n: jnp.asarray(v) for n, v in specs.items()}

    # closing over the arguments keeps non-array ones (subsample sizes) concrete
    try:
        specs = jax.eval_shape(run, guide_arrays)
    except TypeError as err:  # JAX's shape errors: e.g. a guide built on another model
        raise ValueError(
            f"the model cannot run with these arguments{' and this guide' if guide else ''} "
            f"(do they belong together?): {err}"
        ) from err
    if prototype is not None:
        # abstract values (the library's guides keep ShapeDtypeStructs in their prototype)
        model_params = {
            n: s["value"] for n, s in prototype.items() if s["type"] == "param" and n not in specs
        }
        specs.update(jax.eval_shape(lambda values: values, model_params))
    if key is not None:
        _SPECS.put(owner, key, (prototype, specs))
    return specs


def check_params_against(
    specs: Mapping[str, jax.ShapeDtypeStruct],
    params: Mapping[str, Any],
    caller: str,
    *,
    allow_missing: bool = False,
    allow_unexpected: bool = False,
    require_finite: bool = False,
    leading: int = 0,
    hint: str = "",
) -> None:
    """Compare ``params`` with ``specs`` (see :func:`param_specs`); raise
    :class:`ParameterMismatchError` listing every problem at once.

    :param specs: the expected entries.
    :param params: the given entries.
    :param caller: the function in the message.
    :param allow_missing: accept a subset (partial initialization).
    :param allow_unexpected: accept names the model does not have.
    :param require_finite: also refuse NaN or infinite values (concrete arrays only).
    :param leading: leading axes of the given arrays beyond the expected shape (samples).
    :param hint: closing sentence of the message.
    :raises ParameterMismatchError: if anything does not match.
    :raises TypeError: if ``params`` is not a mapping.
    """
    from numpyro_dgp._validation import concrete

    if not isinstance(params, Mapping):
        raise TypeError(
            f"{caller}: params must be a dict {{site name: array}}, got {type(params).__name__}"
        )
    missing = [] if allow_missing else [n for n in specs if n not in params]
    unexpected = [] if allow_unexpected else [n for n in params if n not in specs]
    mismatched, non_finite = {}, []
    for name, value in params.items():
        if name not in specs:
            continue
        spec = specs[name]
        if isinstance(value, Mapping):
            mismatched[name] = ("a nested dict", _describe(spec.shape, spec.dtype))
            continue
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            value = np.asarray(value)
        shape, dtype = tuple(value.shape)[leading:], np.dtype(value.dtype)
        # a Python-number initial value (weakly typed) takes any dtype of its kind
        same_kind = getattr(spec, "weak_type", False) and dtype.kind == np.dtype(spec.dtype).kind
        if shape != tuple(spec.shape) or not (dtype == spec.dtype or same_kind):
            mismatched[name] = (_describe(shape, dtype), _describe(spec.shape, spec.dtype))
        elif require_finite and np.issubdtype(dtype, np.inexact):
            array = concrete(value)
            if array is not None and not np.all(np.isfinite(array)):
                non_finite.append(name)
    if missing or unexpected or mismatched or non_finite:
        raise ParameterMismatchError(caller, missing, unexpected, mismatched, non_finite, hint)


def check_against_model(
    model: Callable,
    guide: Callable | None,
    params: Mapping[str, Any],
    args: tuple,
    kwargs: dict,
    strict: bool,
    caller: str,
    require_finite: bool = False,
) -> None:
    """:func:`check_params` with the caller named in the message (``load_params`` and ``fit``'s
    ``init_params`` run it)."""
    import jax

    if guide is not None:
        set_up_guide(guide, jax.random.PRNGKey(0), args, kwargs)
    check_params_against(
        param_specs(model, guide, args, kwargs),
        params,
        caller,
        allow_missing=not strict,
        allow_unexpected=not strict,
        require_finite=require_finite,
        hint=STRICT_HINT,
    )


def check_params(
    model: Callable,
    guide: Callable | None,
    params: Mapping[str, Any],
    *args: Any,
    strict: bool = True,
    **kwargs: Any,
) -> None:
    """Check parameters against what ``model`` (and ``guide``) create at these arguments:
    the same names, shapes and dtypes (an abstract run, nothing computed; cached per guide).

    ``predict``, ``predict_from_samples``, ``fit(init_params=...)`` and
    ``load_params(..., model=...)`` run this check themselves; call it directly to validate a
    parameter dict before use.

    :param model: the model.
    :param guide: the guide (set up by ``svi.init`` / :func:`~numpyro_dgp.fit`, or it is set up
        here on ``args``, which must then be the training arguments, ``y`` included); ``None``
        checks the model's own ``numpyro.param`` sites only.
    :param params: ``{site: array}``, e.g. ``FitResult.params``.
    :param args: the model's positional arguments (their shapes fix the parameters' shapes).
    :param strict: ``False`` accepts missing and unexpected entries (shapes and dtypes of the
        entries given are still checked).
    :param kwargs: the model's keyword arguments.
    :raises ParameterMismatchError: listing missing, unexpected and mis-shaped entries.
    """
    check_against_model(model, guide, params, args, kwargs, strict, "check_params")


#: the closing sentence of errors that ``strict=False`` would relax
STRICT_HINT = (
    "Pass parameters saved from this model and guide (same layer names, num_inducing, widths "
    "and dtype), or strict=False to accept a partial or larger dict."
)

#: the closing sentence of prediction errors (missing entries are never accepted there)
PREDICT_HINT = (
    "Pass the parameters fitted with this model and guide (same layer names, num_inducing, widths "
    "and dtype); strict=False ignores unexpected entries."
)
