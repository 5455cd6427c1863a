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
untouched.

``load_params(path, model=..., guide=..., args=(X, y))`` also checks the loaded entries
against the parameters the model and guide create (names, shapes, dtypes), so a file from
another model fails at loading with :class:`~numpyro_dgp.ParameterMismatchError` instead of
predicting with initial values. :func:`numpyro_dgp.fit` writes its checkpoints in this format.

File layout (format version 1): an uncompressed ``.npz`` holding ``a0``, ``a1``, ... (one
member per leaf array) and ``__numpyro_dgp_header__``, a 0-d unicode array with a JSON
object ``{"format", "format_version", "library_version", "tree", "metadata"}``.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Literal, overload

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dgp import __version__

__all__ = ["FORMAT_VERSION", "save_params", "load_params"]

#: Version of the on-disk layout written by :func:`save_params`.
FORMAT_VERSION = 1

_FORMAT_NAME = "numpyro_dgp.params"
_HEADER_KEY = "__numpyro_dgp_header__"
# dtype kinds np.save stores natively: bool, signed/unsigned int, float, complex.
_NATIVE_KINDS = frozenset("biufc")


def _key_repr(key_path: tuple[str, ...]) -> str:
    # Subscript notation stays unambiguous for keys that contain dots or slashes.
    return "params" + "".join(f"[{k!r}]" for k in key_path)


def _is_ml_dtype(dtype: np.dtype) -> bool:
    # bfloat16, float8_* etc. come from ml_dtypes (a jax dependency); np.save would store
    # them as opaque void bytes, so they need the raw encoding below.
    return dtype.kind == "V" and getattr(dtype.type, "__module__", "").startswith("ml_dtypes")


def _check_ml_dtype(name: str) -> np.dtype:
    """The ``ml_dtypes`` dtype a raw-encoded member records by name.

    :raises ValueError: a name ``ml_dtypes`` does not define.
    """
    import ml_dtypes

    try:
        return np.dtype(getattr(ml_dtypes, name))
    except (AttributeError, TypeError) as err:
        raise ValueError(f"unsupported stored dtype {name!r}") from err


def _check_leaf(value: Any, key_path: tuple[str, ...]) -> np.ndarray:
    """``value`` as a NumPy array that :func:`save_params` can store.

    :raises TypeError: a value that is not a numeric or boolean array.
    """
    where = _key_repr(key_path)
    if value is None or isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"{where} must be array-like, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except Exception as err:  # noqa: BLE001 - tracers, PRNG key arrays, arbitrary objects
        raise TypeError(
            f"{where} must be array-like, got {type(value).__name__} that cannot be "
            f"converted to a NumPy array: {err}"
        ) from err
    if arr.dtype.kind not in _NATIVE_KINDS and not _is_ml_dtype(arr.dtype):
        raise TypeError(
            f"{where} must be a numeric or boolean array, got {type(value).__name__} "
            f"with dtype {arr.dtype}"
        )
    return arr


def _check_key(key: Any, key_path: tuple[str, ...]) -> None:
    """Raise unless ``key`` (an entry of the dict at ``key_path``) is a string.

    :raises TypeError: otherwise.
    """
    if not isinstance(key, str):
        raise TypeError(
            f"keys must be strings, got {type(key).__name__} key {key!r} in {_key_repr(key_path)}"
        )


def _encode(
    tree: Mapping, key_path: tuple[str, ...], members: dict[str, np.ndarray]
) -> dict[str, Any]:
    items: list[list[Any]] = []
    for key, value in tree.items():
        _check_key(key, key_path)
        child_path = key_path + (key,)
        if isinstance(value, Mapping):
            items.append([key, _encode(value, child_path, members)])
            continue
        arr = _check_leaf(value, child_path)
        name = f"a{len(members)}"
        node: dict[str, Any] = {
            "type": "array",
            "name": name,
            "dtype": arr.dtype.name,
            "shape": list(arr.shape),
        }
        if _is_ml_dtype(arr.dtype):
            node["encoding"] = "raw"
            # Bytes as uint8 keep the exact bits; reshape(-1) first so 0-d arrays can be viewed.
            arr = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        else:
            node["encoding"] = "npy"
            node["dtype"] = arr.dtype.str  # includes byte order, e.g. "<f8"
        members[name] = arr
        items.append([key, node])
    return {"type": "dict", "items": items}


def _default_file_mode() -> int:
    # NamedTemporaryFile creates 0600 files; give new files the mode open() would give them.
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable on POSIX; not possible (nor needed) everywhere.
    if os.name != "posix":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_save_arguments(params: Any, metadata: Any) -> None:
    """Raise unless ``params`` is a mapping and ``metadata`` a mapping or ``None``.

    :raises TypeError: otherwise.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of str -> array, got {type(params).__name__}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping or None, got {type(metadata).__name__}")


def _check_header_json(header: dict[str, Any]) -> str:
    """The header as JSON text.

    :raises TypeError: metadata that JSON cannot hold.
    """
    try:
        return json.dumps(header)
    except (TypeError, ValueError) as err:
        raise TypeError(f"metadata must be JSON-serializable: {err}") from err


def _check_target_path(path: Path) -> None:
    """Raise unless ``path`` can be written: its directory exists and it is not a directory.

    :raises FileNotFoundError: the directory does not exist.
    :raises IsADirectoryError: ``path`` is a directory.
    """
    directory = path.parent
    if not directory.is_dir():
        raise FileNotFoundError(
            f"directory {str(directory)!r} for path={str(path)!r} does not exist"
        )
    if path.is_dir():
        raise IsADirectoryError(f"path={str(path)!r} is a directory, expected a file path")


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
    _check_save_arguments(params, metadata)

    # Convert and validate everything before touching the file system.
    members: dict[str, np.ndarray] = {}
    tree = _encode(params, (), members)
    header = {
        "format": _FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "library_version": __version__,
        "tree": tree,
        "metadata": dict(metadata) if metadata is not None else {},
    }
    members[_HEADER_KEY] = np.array(_check_header_json(header), dtype=np.str_)
    _check_target_path(path)
    # Writing through a file object stops np.savez from appending ".npz" to the name.
    write_atomically(path, lambda f: np.savez(f, allow_pickle=False, **members), binary=True)
    return path


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
        mode = _default_file_mode()
    tmp = tempfile.NamedTemporaryFile(
        mode="wb" if binary else "w",
        encoding=None if binary else "utf-8",
        newline=None if binary else "",
        delete=False,
        dir=path.parent,
        prefix=f".{path.name}.",
        suffix=".tmp",
    )
    try:
        with tmp:
            write(tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp.name, mode)
        os.replace(tmp.name, path)
    except BaseException:
        try:
            os.unlink(tmp.name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(path.parent)


def _check_node(node: Any, key_path: tuple[str, ...]) -> None:
    """Raise unless ``node`` is a dict or array entry of the header's tree.

    :raises ValueError: otherwise.
    """
    if not isinstance(node, dict) or node.get("type") not in ("dict", "array"):
        raise ValueError(f"malformed tree entry at {_key_repr(key_path)}")


def _check_item(item: Any, key_path: tuple[str, ...]) -> None:
    """Raise unless ``item`` (of the dict entry at ``key_path``) is a ``[key, entry]`` pair.

    :raises ValueError: otherwise.
    """
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
        raise ValueError(f"malformed tree entry inside {_key_repr(key_path)}")


def _check_array_entry(
    node: dict[str, Any], where: str, members: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, tuple[int, ...], np.dtype | None]:
    """``(member, shape, dtype)`` of an array entry checked against its archive member
    (``dtype``: the ``ml_dtypes`` type of a raw-encoded member, else ``None``).

    :raises ValueError: a missing member, one that does not match the recorded dtype and shape,
        or an unknown encoding.
    """
    name = node.get("name")
    if name not in members:
        raise ValueError(f"array for {where} (member {name!r}) is missing")
    arr = members[node["name"]]
    shape = tuple(node.get("shape", ()))
    encoding = node.get("encoding")
    if encoding == "raw":
        dtype = _check_ml_dtype(node["dtype"])
        expected_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if arr.dtype != np.uint8 or arr.size != expected_bytes:
            raise ValueError(f"array for {where} does not match its recorded dtype/shape")
        return arr, shape, dtype
    if encoding == "npy":
        if arr.dtype != np.dtype(node["dtype"]) or arr.shape != shape:
            raise ValueError(
                f"array for {where} has dtype {arr.dtype} and shape {arr.shape}, but the "
                f"header records {node['dtype']} and {shape}"
            )
        return arr, shape, None
    raise ValueError(f"unknown encoding {encoding!r} for {where}")


def _decode(node: Any, key_path: tuple[str, ...], members: Mapping[str, np.ndarray]) -> Any:
    _check_node(node, key_path)
    if node["type"] == "dict":
        out = {}
        for item in node.get("items", []):
            _check_item(item, key_path)
            out[item[0]] = _decode(item[1], key_path + (item[0],), members)
        return out
    arr, shape, raw_dtype = _check_array_entry(node, _key_repr(key_path), members)
    return arr if raw_dtype is None else arr.view(raw_dtype).reshape(shape)


def _check_npz(loaded: Any) -> None:
    """Raise unless ``loaded`` (what ``np.load`` gave) is an archive holding the header (an
    archive without it is closed).

    :raises ValueError: otherwise.
    """
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError("file is a single .npy array, not an .npz archive")
    if _HEADER_KEY not in loaded.files:
        loaded.close()
        raise ValueError("no numpyro_dgp header found (not written by save_params?)")


def _check_header(header_arr: np.ndarray) -> dict[str, Any]:
    """The header read from its member.

    :raises ValueError: a member that is not a JSON string describing a parameter file.
    """
    if header_arr.dtype.kind != "U" or header_arr.shape != ():
        raise ValueError("header is not a JSON string")
    header = json.loads(str(header_arr[()]))
    if not isinstance(header, dict) or header.get("format") != _FORMAT_NAME:
        raise ValueError("header does not describe a numpyro_dgp parameter file")
    return header


def _read_archive(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    loaded = np.load(path, allow_pickle=False)
    _check_npz(loaded)
    with loaded as npz:
        # Read every member now: truncation/CRC errors surface here, not later.
        members = {name: npz[name] for name in npz.files}
    return _check_header(members.pop(_HEADER_KEY)), members


def _check_jax_representable(arr: np.ndarray, where: str, path: Path) -> None:
    canonical = np.dtype(jax.dtypes.canonicalize_dtype(arr.dtype))
    if canonical != arr.dtype.newbyteorder("="):
        raise ValueError(
            f"{str(path)!r}: {where} has dtype {arr.dtype.name}, which JAX would silently turn "
            f"into {canonical.name} because 64-bit mode is off. Call "
            f'jax.config.update("jax_enable_x64", True) before loading, or pass '
            f"as_numpy=True to get NumPy arrays."
        )


def _to_jax(tree: dict, key_path: tuple[str, ...], path: Path) -> dict:
    # Check every leaf first so nothing is transferred when one of them would fail.
    def check(node, kp):
        for key, value in node.items():
            if isinstance(value, dict):
                check(value, kp + (key,))
            else:
                _check_jax_representable(value, _key_repr(kp + (key,)), path)

    def convert(node):
        return {k: convert(v) if isinstance(v, dict) else jnp.asarray(v) for k, v in node.items()}

    check(tree, key_path)
    return convert(tree)


def _check_against_model(
    params: dict,
    model: Callable,
    guide: Callable | None,
    args: tuple,
    kwargs: dict,
    strict: bool,
    path: Path,
) -> None:
    # imported here: numpyro_dgp.io stays light (no model machinery) for plain loads
    from numpyro_dgp._persist.params import (
        STRICT_HINT,
        check_params_against,
        param_specs,
        set_up_guide,
    )

    if guide is not None:
        set_up_guide(guide, jax.random.PRNGKey(0), args, kwargs)
    check_params_against(
        param_specs(model, guide, args, kwargs),
        params,
        f"load_params({str(path)!r})",
        allow_missing=not strict,
        allow_unexpected=not strict,
        hint=STRICT_HINT,
    )


def _check_load_arguments(
    path: os.PathLike | str,
    model: Callable | None,
    guide: Callable | None,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
) -> Path:
    """``path`` as a :class:`~pathlib.Path`, checked to be a file; ``guide``, ``args`` and
    ``kwargs`` checked to come with ``model``.

    :raises ValueError: ``guide``, ``args`` or ``kwargs`` without ``model``.
    :raises FileNotFoundError: ``path`` does not exist.
    :raises IsADirectoryError: ``path`` is a directory.
    """
    if model is None and (guide is not None or args or kwargs):
        raise ValueError(
            "load_params: guide=, args= and kwargs= are for the check against model=; pass "
            "model= too"
        )
    path = Path(os.fspath(path)).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"parameter file path={str(path)!r} does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"path={str(path)!r} is a directory, expected a parameter file")
    return path


def _check_archive(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """``(header, members)`` of the parameter file at ``path``.

    :raises ValueError: a file that is truncated, corrupt or not written by :func:`save_params`.
    """
    try:
        return _read_archive(path)
    except (PermissionError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - zipfile, zlib, EOF, JSON and format errors
        raise ValueError(
            f"could not read parameter file {str(path)!r} (truncated, corrupt or not an "
            f"npz written by save_params): {type(err).__name__}: {err}"
        ) from err


def _check_format_version(header: dict, path: Path) -> None:
    """Raise unless the header's format version is one this library reads.

    :raises ValueError: otherwise.
    """
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise ValueError(
            f"parameter file {str(path)!r} has format_version={version!r}; this library "
            f"reads versions 1..{FORMAT_VERSION} (upgrade numpyro_dgp to read it)"
        )


def _check_tree(header: dict, members: dict[str, np.ndarray], path: Path) -> dict:
    """The parameter dict the header's tree describes, its arrays checked against the members.

    :raises ValueError: a corrupt tree, or one whose top level is not a dict.
    """
    try:
        params = _decode(header.get("tree"), (), members)
    except ValueError as err:
        raise ValueError(f"parameter file {str(path)!r} is corrupt: {err}") from err
    if not isinstance(params, dict):
        raise ValueError(f"parameter file {str(path)!r} is corrupt: top level is not a dict")
    return params


@overload
def load_params(
    path: os.PathLike | str,
    return_metadata: Literal[False] = False,
    *,
    as_numpy: bool = False,
    model: Callable | None = None,
    guide: Callable | None = None,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> dict: ...


@overload
def load_params(
    path: os.PathLike | str,
    return_metadata: Literal[True],
    *,
    as_numpy: bool = False,
    model: Callable | None = None,
    guide: Callable | None = None,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> tuple[dict, dict]: ...


@overload
def load_params(
    path: os.PathLike | str,
    return_metadata: bool = False,
    *,
    as_numpy: bool = False,
    model: Callable | None = None,
    guide: Callable | None = None,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> dict | tuple[dict, dict]: ...


def load_params(
    path: os.PathLike | str,
    return_metadata: bool = False,
    *,
    as_numpy: bool = False,
    model: Callable | None = None,
    guide: Callable | None = None,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    strict: bool = True,
) -> dict | tuple[dict, dict]:
    """Load a parameter dict written by :func:`save_params`, optionally checked against a model.

    With ``model`` (and ``guide``, for SVI parameters) the loaded entries are compared with
    what the model and guide create when run on ``args``/``kwargs`` (an abstract run: nothing
    is computed): the same names, shapes and dtypes, or
    :class:`~numpyro_dgp.ParameterMismatchError` lists the missing, unexpected and mis-shaped
    entries. A guide that is not set up yet is set up here on ``args``/``kwargs`` (pass the
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
    :param kwargs: the model's keyword arguments for the check.
    :param strict: ``False`` accepts missing and unexpected entries (a partial file, e.g. for
        ``fit(init_params=..., strict=False)``); shapes and dtypes are always checked.
    :return: nested dict of arrays (``jax.Array``, or ``np.ndarray`` with ``as_numpy``) with
        the saved keys, dtypes, shapes and bits; or ``(params, metadata)`` when
        ``return_metadata`` is true.
    :raises FileNotFoundError: ``path`` does not exist.
    :raises IsADirectoryError: ``path`` is a directory.
    :raises ValueError: the file is truncated, corrupt, not written by :func:`save_params`,
        written by a newer format version, or holds 64-bit arrays while JAX's 64-bit mode
        is off (and ``as_numpy`` is false); ``guide``, ``args`` or ``kwargs`` without ``model``.
    :raises ~numpyro_dgp.ParameterMismatchError: with ``model``, parameters that do not match it.
    """
    path = _check_load_arguments(path, model, guide, args, kwargs)
    header, members = _check_archive(path)
    _check_format_version(header, path)
    params = _check_tree(header, members, path)

    if not as_numpy:
        params = _to_jax(params, (), path)
    if model is not None:
        _check_against_model(params, model, guide, tuple(args), dict(kwargs or {}), strict, path)
    if return_metadata:
        metadata = header.get("metadata") or {}
        return params, metadata
    return params
