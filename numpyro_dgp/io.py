"""Saving and loading parameter dictionaries as ``.npz`` files.

(A whole model, with its configuration and standardization, is saved by
:func:`numpyro_dgp.save_model` and loaded by :func:`numpyro_dgp.load_model`, which write and
read its parameters in this format.)

:func:`save_params` writes a (possibly nested) dict of arrays such that :func:`load_params`
gives back exactly the same tree: same keys and nesting, dtypes, shapes and bit-identical
values (NaN payloads and ``-0.0`` included). Keys may be any strings, including ones with
dots or slashes such as ``"h1.kernel.lengthscale"``: array members of the archive get
generated names and the tree is described by a JSON header, so keys are never parsed.

Writes are atomic: the archive goes to a temporary file in the target's directory, is
flushed to disk and then renamed onto the target, so a failed save leaves any previous file
untouched (``write_atomically``, which ``model.json`` and the command line's predictions
are written with too; ``check_format`` checks the header of a parameter file and of a
``model.json``). NumPy only at import: JAX and NumPyro are imported by the functions that run
them, so the command line checks a saved model's files before JAX loads.

``load_params(path, model=..., guide=..., args=(X, y))`` also checks the loaded entries
against the parameters the model and guide create (names, shapes, dtypes), so a file from
another model fails at loading with :class:`~numpyro_dgp.ParameterMismatchError` instead of
predicting with initial values. :func:`numpyro_dgp.fit` writes its checkpoints in this format.

Checks of parameters against a model: :func:`param_specs` runs the guide and then the model
(replayed on the guide) under ``jax.eval_shape``, so the ``numpyro.param`` sites only report
the shape and dtype of their initial values; the result is cached per guide (or per model),
keyed by the model, the non-array arguments and the arrays' shapes and dtypes, so a check costs
one abstract run per new situation and a dictionary comparison after that.

File layout (format version 1): an uncompressed ``.npz`` holding ``a0``, ``a1``, ... (one
member per leaf array) and ``__numpyro_dgp_header__``, a 0-d unicode array with a JSON
object ``{"format", "format_version", "library_version", "tree", "metadata"}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from numpyro_dgp import __version__
from numpyro_dgp._cache import OwnerCache

if TYPE_CHECKING:
    import jax

__all__ = ["FORMAT_VERSION", "save_params", "load_params"]

#: Version of the on-disk layout written by :func:`save_params`.
FORMAT_VERSION = 1

_FORMAT_NAME = "numpyro_dgp.params"
_HEADER_KEY = "__numpyro_dgp_header__"


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

    key = (tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in kwargs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


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


def _check_against_model(
    model: Callable,
    guide: Callable | None,
    params: Mapping[str, Any],
    args: tuple,
    kwargs: dict,
    strict: bool,
    caller: str,
) -> None:
    """:func:`check_params` with the caller named in the message (``load_params`` runs it)."""
    import jax

    if guide is not None:
        set_up_guide(guide, jax.random.PRNGKey(0), args, kwargs)
    check_params_against(
        param_specs(model, guide, args, kwargs),
        params,
        caller,
        allow_missing=not strict,
        allow_unexpected=not strict,
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
    _check_against_model(model, guide, params, args, kwargs, strict, "check_params")


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


def check_format(
    document: Any, name: str, version: int, shown: str, what: str, error: type = ValueError
) -> None:
    """Raise ``error`` unless ``document`` (a parsed JSON header, of the file named ``shown`` in
    messages) describes numpyro_dgp ``what`` in the format ``name``, of a version from 1 to
    ``version`` (the message says to upgrade the library when it is newer)."""
    if not isinstance(document, dict) or document.get("format") != name:
        raise error(f"{shown} does not describe a numpyro_dgp {what}")
    found = document.get("format_version")
    if not isinstance(found, int) or not 1 <= found <= version:
        raise error(
            f"{shown} has format_version={found!r}, written by numpyro_dgp "
            f"{document.get('library_version')!r}; this library ({__version__}) reads versions "
            f"1..{version} (upgrade numpyro_dgp to load it)"
        )


def write_atomically(path: Path, write: Callable[[Any], object], binary: bool = False) -> None:
    """Write the file ``path`` by ``write(file)`` into a temporary file in its directory, flushed
    to disk and renamed onto ``path`` (the rename made durable where POSIX allows): a failed
    write leaves any previous file whole. A replaced file keeps its permissions; a new one gets
    those ``open`` would give it.

    :param path: the file to write (its directory exists).
    :param write: writes the contents to the open file.
    :param binary: open the file in binary mode (else text, UTF-8, no newline translation).
    """
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0o022)  # mkstemp creates 0600 files; open() would not
        os.umask(umask)
        mode = 0o666 & ~umask
    text: dict[str, Any] = {} if binary else {"encoding": "utf-8", "newline": ""}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with open(fd, "wb" if binary else "w", **text) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if os.name == "posix":  # makes the rename itself durable
        with contextlib.suppress(OSError):
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _where(key_path: tuple[str, ...]) -> str:
    # Subscript notation stays unambiguous for keys that contain dots or slashes.
    return "params" + "".join(f"[{k!r}]" for k in key_path)


def _is_ml_dtype(dtype: np.dtype) -> bool:
    # bfloat16, float8_* etc. come from ml_dtypes (a jax dependency); np.save would store
    # them as opaque void bytes, so they are stored as their raw bytes.
    return dtype.kind == "V" and getattr(dtype.type, "__module__", "").startswith("ml_dtypes")


def _encode(tree: Mapping, key_path: tuple[str, ...], members: dict[str, np.ndarray]) -> dict:
    """The header's tree of ``tree``, its arrays put in ``members`` (named ``a0``, ``a1``, ...).

    :raises TypeError: a key that is not a string, or a value that is not a numeric or boolean
        array.
    """
    items: list[list[Any]] = []
    for key, value in tree.items():
        if not isinstance(key, str):
            raise TypeError(
                f"keys must be strings, got {type(key).__name__} key {key!r} in {_where(key_path)}"
            )
        if isinstance(value, Mapping):
            items.append([key, _encode(value, key_path + (key,), members)])
            continue
        where = _where(key_path + (key,))
        try:
            arr = np.asarray(value)
        except Exception as err:  # noqa: BLE001 - tracers, PRNG key arrays, arbitrary objects
            raise TypeError(
                f"{where} must be a numeric or boolean array, got {type(value).__name__}: {err}"
            ) from err
        name = f"a{len(members)}"
        node = {"type": "array", "name": name, "dtype": arr.dtype.str, "shape": list(arr.shape)}
        node["encoding"] = "npy"
        if _is_ml_dtype(arr.dtype):
            node["dtype"], node["encoding"] = arr.dtype.name, "raw"
            # Bytes as uint8 keep the exact bits; reshape(-1) first so 0-d arrays can be viewed.
            arr = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        elif arr.dtype.kind not in "biufc":
            raise TypeError(
                f"{where} must be a numeric or boolean array, got {type(value).__name__} "
                f"with dtype {arr.dtype}"
            )
        members[name] = arr
        items.append([key, node])
    return {"type": "dict", "items": items}


def save_params(
    path: os.PathLike | str, params: Mapping[str, Any], metadata: Mapping[str, Any] | None = None
) -> Path:
    """Atomically save a (nested) dict of arrays to an ``.npz`` file.

    Leaves may be JAX or NumPy arrays of any numeric or boolean dtype (``bfloat16`` and other
    ``ml_dtypes`` included), NumPy scalars, Python numbers or nested sequences of numbers;
    they are stored as NumPy arrays (Python numbers as 0-d arrays). Nested dicts (any
    :class:`~collections.abc.Mapping`) are kept as nesting, empty ones included.

    The file is written exactly at ``path``: no ``.npz`` suffix is appended.

    :param path: target file path (``str`` or :class:`pathlib.Path`); its directory must exist.
    :param params: mapping from string keys to arrays or nested mappings.
    :param metadata: JSON-serializable mapping stored alongside (e.g. library version, model
        description); returned by ``load_params(..., return_metadata=True)``.
    :return: the path written.
    :raises TypeError: a non-string key, a leaf that is not a numeric/boolean array, or
        metadata that is not a JSON-serializable mapping.
    :raises FileNotFoundError: the target directory does not exist.
    :raises IsADirectoryError: ``path`` is a directory.
    """
    path = Path(os.fspath(path)).expanduser()
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of str -> array, got {type(params).__name__}")
    # Convert and validate everything before touching the file system.
    members: dict[str, np.ndarray] = {}
    header = {
        "format": _FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "library_version": __version__,
        "tree": _encode(params, (), members),
        "metadata": dict(metadata or {}),
    }
    try:
        members[_HEADER_KEY] = np.array(json.dumps(header), dtype=np.str_)
    except (TypeError, ValueError) as err:
        raise TypeError(f"metadata must be JSON-serializable: {err}") from err
    from numpyro_dgp._validation import check_directory

    check_directory(path.parent, "directory", "save_params")
    # Writing through a file object stops np.savez from appending ".npz" to the name.
    write_atomically(path, lambda f: np.savez(f, allow_pickle=False, **members), binary=True)
    return path


def _decode(node: dict, key_path: tuple[str, ...], members: Mapping[str, np.ndarray]) -> Any:
    """The tree the header's ``node`` describes, its arrays taken from ``members``.

    :raises ValueError: an array that is missing or differs from what the header records.
    """
    if node["type"] == "dict":
        return {key: _decode(item, key_path + (key,), members) for key, item in node["items"]}
    where, name, shape = _where(key_path), node["name"], tuple(node["shape"])
    if node["type"] != "array" or node["encoding"] not in ("raw", "npy"):
        raise ValueError(f"malformed tree entry at {where}")
    if name not in members:
        raise ValueError(f"array for {where} (member {name!r}) is missing")
    arr = members[name]
    if node["encoding"] == "raw":
        import ml_dtypes

        dtype = np.dtype(getattr(ml_dtypes, node["dtype"]))
        if arr.dtype != np.uint8 or arr.size != int(np.prod(shape)) * dtype.itemsize:
            raise ValueError(f"array for {where} does not match its recorded dtype/shape")
        return arr.view(dtype).reshape(shape)
    if arr.dtype != np.dtype(node["dtype"]) or arr.shape != shape:
        raise ValueError(
            f"array for {where} has dtype {arr.dtype} and shape {arr.shape}, but the "
            f"header records {node['dtype']} and {shape}"
        )
    return arr


def _read(path: Path) -> tuple[dict, dict]:
    """``(header, params)`` of the parameter file at ``path`` (NumPy arrays).

    :raises ValueError: a file that is truncated, corrupt, not written by :func:`save_params`
        or written in a newer format version.
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            # Read every member now: truncation/CRC errors surface here, not later.
            members = {name: npz[name] for name in npz.files}
        header = json.loads(str(members.pop(_HEADER_KEY)[()]))
    except (PermissionError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - zipfile, zlib, EOF, JSON errors, no header
        raise ValueError(
            f"could not read parameter file {str(path)!r} (truncated, corrupt or not an "
            f"npz written by save_params): {type(err).__name__}: {err}"
        ) from err
    check_format(
        header, _FORMAT_NAME, FORMAT_VERSION, f"load_params: {str(path)!r}", "parameter file"
    )
    try:
        params = _decode(header["tree"], (), members)
        if not isinstance(params, dict):
            raise ValueError("its tree is not a dict of parameters")
    except (ValueError, TypeError, AttributeError, KeyError) as err:  # ml_dtypes names too
        raise ValueError(f"parameter file {str(path)!r} is corrupt: {err}") from err
    return header, params


def _to_jax(tree: dict) -> dict:
    # keeps the keys' order (jax.tree_util.tree_map would sort them)
    import jax.numpy as jnp

    return {k: _to_jax(v) if isinstance(v, dict) else jnp.asarray(v) for k, v in tree.items()}


def load_params(
    path: os.PathLike | str,
    return_metadata: bool = False,
    *,
    as_numpy: bool = False,
    model: Callable | None = None,
    guide: Callable | None = None,
    args: tuple = (),
    strict: bool = True,
) -> Any:
    """Load a parameter dict written by :func:`save_params`, optionally checked against a model.

    With ``model`` (and ``guide``, for SVI parameters) the loaded entries are compared with
    what the model and guide create when run on ``args`` (an abstract run: nothing
    is computed): the same names, shapes and dtypes, or
    :class:`~numpyro_dgp.ParameterMismatchError` lists the missing, unexpected and mis-shaped
    entries. A guide that is not set up yet is set up here on ``args`` (pass the
    training arguments, ``y`` included, as to ``svi.init``), ready for
    :func:`~numpyro_dgp.predict`.

    :param path: file path (``str`` or :class:`pathlib.Path`), exactly as given to
        :func:`save_params`.
    :param return_metadata: also return the stored metadata dict (``{}`` if none was saved).
    :param as_numpy: return NumPy arrays instead of JAX arrays (no 64-bit check needed).
    :param model: check the parameters against this model (``None``: no check).
    :param guide: and against this guide (``None``: the model's own ``numpyro.param`` sites,
        e.g. for values substituted into MCMC).
    :param args: the model's positional arguments for the check (the training data).
    :param strict: ``False`` accepts missing and unexpected entries (a partial file, e.g. for
        ``fit(init_params=..., strict=False)``); shapes and dtypes are always checked.
    :return: nested dict of arrays (``jax.Array``, or ``np.ndarray`` with ``as_numpy``) with
        the saved keys, dtypes, shapes and bits; or ``(params, metadata)`` when
        ``return_metadata`` is true.
    :raises FileNotFoundError: ``path`` does not exist or is a directory.
    :raises ValueError: the file is truncated, corrupt, not written by :func:`save_params`,
        written by a newer format version, or holds 64-bit arrays while JAX's 64-bit mode
        is off (and ``as_numpy`` is false); ``guide`` or ``args`` without ``model``.
    :raises ~numpyro_dgp.ParameterMismatchError: with ``model``, parameters that do not match it.
    """
    import jax

    from numpyro_dgp._validation import check_file

    if model is None and (guide is not None or args):
        raise ValueError(
            "load_params: guide= and args= are for the check against model=; pass model= too"
        )
    path = Path(os.fspath(path)).expanduser()
    check_file(path, "parameter file", "load_params")
    header, params = _read(path)
    if not as_numpy:
        # Check every leaf first so nothing is transferred when one of them would fail.
        for key_path, arr in jax.tree_util.tree_flatten_with_path(params)[0]:
            canonical = np.dtype(jax.dtypes.canonicalize_dtype(arr.dtype))
            if canonical != arr.dtype.newbyteorder("="):
                where = "params" + jax.tree_util.keystr(key_path)
                raise ValueError(
                    f"{str(path)!r}: {where} has dtype {arr.dtype.name}, which JAX would silently "
                    f"turn into {canonical.name} because 64-bit mode is off. Call "
                    'jax.config.update("jax_enable_x64", True) before loading, or pass '
                    "as_numpy=True to get NumPy arrays."
                )
        params = _to_jax(params)
    if model is not None:
        where = f"load_params({str(path)!r})"
        _check_against_model(model, guide, params, tuple(args), {}, strict, where)
    if return_metadata:
        return params, header.get("metadata") or {}
    return params
