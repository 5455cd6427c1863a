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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import numpy as np

from numpyro_dgp import __version__

# the library's modules take the checks from here (numpyro_dgp.io._checks is private)
from numpyro_dgp.io._checks import (  # noqa: F401
    PREDICT_HINT,
    STRICT_HINT,
    ParameterMismatchError,
    check_against_model,
    check_params,
    check_params_against,
    param_specs,
    set_up_guide,
    training_arguments,
)

__all__ = ["FORMAT_VERSION", "save_params", "load_params"]

#: Version of the on-disk layout written by :func:`save_params`.
FORMAT_VERSION = 1

_FORMAT_NAME = "numpyro_dgp.params"
_HEADER_KEY = "__numpyro_dgp_header__"


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
        # bfloat16, float8_* etc. come from ml_dtypes (a jax dependency); np.save would store
        # them as opaque void bytes, so they are stored as their raw bytes
        if arr.dtype.kind == "V" and arr.dtype.type.__module__.startswith("ml_dtypes"):
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
    if not path.parent.is_dir():
        state = "is a file, not a directory" if path.parent.exists() else "does not exist"
        raise FileNotFoundError(f"save_params: directory {str(path.parent)!r} {state}")
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

    if model is None and (guide is not None or args):
        raise ValueError(
            "load_params: guide= and args= are for the check against model=; pass model= too"
        )
    path = Path(os.fspath(path)).expanduser()
    if not path.is_file():
        state = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"load_params: parameter file {str(path)!r} {state}")
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
        check_against_model(model, guide, params, tuple(args), {}, strict, where)
    if return_metadata:
        return params, header.get("metadata") or {}
    return params
