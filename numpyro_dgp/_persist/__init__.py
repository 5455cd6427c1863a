"""The files of persistence, NumPy only (the command line checks its paths, a saved model's
``model.json`` and a user's table with these before JAX loads):

* a saved model directory (``model.json`` + ``params.npz``, written by
  :func:`numpyro_dgp.save_model`): the file names and format version, the directory, the
  ``model.json`` entries, the parameters' checksum and the upgrade hint when a newer
  numpyro_dgp wrote it (raising :class:`ModelFileError`); the whole-model save and load
  (``numpyro_dgp._saved_model``) rebuild the model from what is read here;
* atomic writes of a file (:func:`write_atomically`);
* a user's own table (:func:`read_table`): a CSV file with a header row, or an ``.npz`` of named
  columns (re-exported by :mod:`numpyro_dgp.datasets`).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from numpyro_dgp import __version__

#: the format name and version written into ``model.json``
MODEL_FORMAT = "numpyro_dgp.model"
MODEL_FORMAT_VERSION = 1
CONFIG_FILE = "model.json"
PARAMS_FILE = "params.npz"


class ModelFileError(ValueError):
    """A saved model directory that cannot be loaded: a file missing, a checksum that does not
    match, an unreadable or unknown ``model.json``, or a format version this library does not
    read. Raised by :func:`load_model`.
    """


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _is_names(value: Any, single: bool = False) -> bool:
    """``value`` is ``None``, a list of strings or (``single``) one string."""
    if value is None or (single and isinstance(value, str)):
        return True
    return isinstance(value, list) and all(isinstance(n, str) for n in value)


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


def read_config(path: Path) -> dict:
    """``model.json`` of the model directory ``path``, read and checked to describe a model of a
    format version this library reads, with every entry loading needs.

    :raises ModelFileError: a missing file, one that is not valid JSON, or not such a model.
    """
    config_path = path / CONFIG_FILE
    shown = repr(str(config_path))
    if not config_path.is_file():
        raise ModelFileError(
            f"load_model: {str(path)!r} has no {CONFIG_FILE} (not a model directory written by "
            "save_model, or an incomplete copy)"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFileError(f"load_model: {shown} is corrupted (not valid JSON: {err})") from err
    check_format(
        config, MODEL_FORMAT, MODEL_FORMAT_VERSION, f"load_model: {shown}", "model", ModelFileError
    )
    required = ("model", "guide", "input_dim", "dtype", "files", "library_version")
    problems = [f"no {key!r} entry" for key in required if key not in config]
    if not _is_names(config.get("feature_names")):
        problems.append(f"feature_names {config['feature_names']!r} is not a list of names")
    if not _is_names(config.get("target_name"), single=True):
        problems.append(f"target_name {config['target_name']!r} is not a name or a list of names")
    if "library_version" in config and _version_tuple(config["library_version"]) is None:
        problems.append(f"library_version {config['library_version']!r} is not a version number")
    if problems:
        raise ModelFileError(f"load_model: {shown} is corrupted ({'; '.join(problems)})")
    return config


def _version_tuple(version: Any) -> tuple[int, ...] | None:
    """``"0.1.0"`` -> ``(0, 1, 0)`` (a pre-release or local suffix of the last part ignored);
    ``None`` for anything that is not a dotted version number."""
    if not isinstance(version, str):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)*)(?:[.+-]?[A-Za-z].*)?", version.strip())
    return None if match is None else tuple(int(part) for part in match.group(1).split("."))


def newer_library_hint(config: Mapping[str, Any]) -> str:
    """The upgrade hint when ``config`` was written by a newer numpyro_dgp than this one
    (empty otherwise): a newer release may describe models in ways this one cannot read."""
    written, ours = _version_tuple(config["library_version"]), _version_tuple(__version__)
    if written is None or ours is None or written <= ours:
        return ""
    return (
        f" (written by numpyro_dgp {config['library_version']}, newer than this library "
        f"{__version__}: upgrade numpyro_dgp to load it)"
    )


def check_model_directory(path: os.PathLike | str) -> Path:
    """``path`` as a :class:`~pathlib.Path`, checked to be a directory.

    :raises FileNotFoundError: ``path`` does not exist.
    :raises ModelFileError: ``path`` is a file.
    """
    path = Path(os.fspath(path)).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"load_model: the model directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise ModelFileError(
            f"load_model: {str(path)!r} is a file; a model is a directory written by save_model"
        )
    return path


def _foreign_entries(path: Path) -> list[str]:
    """The entries of the directory ``path`` that a model directory of this library does not
    hold (empty when it holds only ``model.json`` of this format and ``params.npz``, or nothing)."""
    foreign = sorted(p.name for p in path.iterdir() if p.name not in (CONFIG_FILE, PARAMS_FILE))
    config = path / CONFIG_FILE
    if not foreign and config.exists():
        try:
            ours = json.loads(config.read_text(encoding="utf-8")).get("format") == MODEL_FORMAT
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            ours = False
        if not ours:
            foreign = [f"{CONFIG_FILE} (not written by numpyro_dgp)"]
    elif not foreign and (path / PARAMS_FILE).exists():
        foreign = [f"{PARAMS_FILE} without {CONFIG_FILE}"]
    return foreign


def check_model_output(
    path: Path, overwrite: bool, name: str, flag: str, inputs: tuple = ()
) -> None:
    """Raise unless a model directory can be written at ``path``, before any work: its parent
    exists and is writable, it is no input of the same command, and it is new, an empty folder,
    or (with ``overwrite``) a model directory this library wrote (``model.json`` of this format
    and ``params.npz``, nothing else). A user's folder, a file, or a model directory with a file
    of the user's added are never replaced.

    :param path: the directory to write.
    :param overwrite: replace an existing model directory.
    :param name: how the caller names the path in messages (``"--output"``, ``"save_model: path"``).
    :param flag: how the caller names ``overwrite`` (``"--overwrite"``, ``"overwrite=True"``).
    :param inputs: files or folders the same command reads (a training table).
    :raises FileExistsError: an input, a file, a folder this library did not write, or a model
        directory without ``overwrite``.
    :raises FileNotFoundError: the parent directory does not exist.
    :raises PermissionError: the parent directory is not writable.
    """
    shown = f"{name} {str(path)!r}"
    check_output_place(path, shown, inputs)
    if path.exists() and not path.is_dir():
        raise FileExistsError(
            f"{shown} is a file, not a model directory; nothing was written: choose another path"
        )
    if path.is_dir():
        foreign = _foreign_entries(path)
        if foreign:
            raise FileExistsError(
                f"{shown} is not a model directory written by numpyro_dgp (it holds "
                f"{foreign[:5]}{' ...' if len(foreign) > 5 else ''}); {flag} replaces only such "
                "a directory, so nothing was touched: choose another path"
            )
        if not overwrite and any(path.iterdir()):
            raise FileExistsError(f"{shown} exists; pass {flag} to replace the model directory")


def check_output_place(path: Path, shown: str, inputs: tuple = ()) -> None:
    """Raise unless an output at ``path`` (named ``shown`` in messages) is no input of the same
    command (``inputs``: files or folders it reads; nor inside one of them) and its folder exists
    and is writable.

    :raises FileExistsError: ``path`` is an input, or inside one.
    :raises FileNotFoundError: the folder does not exist.
    :raises PermissionError: the folder is not writable.
    """
    target = path.resolve()
    for source in inputs:
        if Path(source).resolve() in (target, *target.parents):
            raise FileExistsError(
                f"{shown} is an input of this command ({str(source)!r}); nothing was written: "
                "choose another path"
            )
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{shown}: the directory {str(path.parent)!r} does not exist")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{shown}: the directory {str(path.parent)!r} is not writable")


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


class Table(NamedTuple):
    """A numeric table read by :func:`read_table`.

    :ivar columns: the column names, in file order.
    :ivar data: ``(N, C)`` float64 values, one column per name.
    """

    columns: list
    data: np.ndarray

    def split(self, target: str | list[str] | None) -> tuple[np.ndarray, np.ndarray | None, list]:
        """Features and target: ``(X (N, D), y, feature names)``, ``y`` ``(N,)`` for one target
        column, ``(N, T)`` for a list of ``T``, ``None`` without.

        :param target: the target column or columns (``None``: every column is a feature).
        :return: ``(X, y, feature_names)``.
        :raises ValueError: a target that is not a column (the message lists the columns), or a
            column named twice.
        """
        if target is None:
            return self.data, None, list(self.columns)
        names = [target] if isinstance(target, str) else list(target)
        missing = [name for name in names if name not in self.columns]
        if missing:
            listed = repr(missing[0]) if len(missing) == 1 else str(missing)
            raise ValueError(
                f"--target {listed} is not a column; the columns are {list(self.columns)}"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"--target names a column twice: {names}")
        chosen = [self.columns.index(name) for name in names]
        keep = [i for i in range(len(self.columns)) if i not in chosen]
        y = self.data[:, chosen[0]] if isinstance(target, str) else self.data[:, chosen]
        return self.data[:, keep], y, [self.columns[i] for i in keep]


def read_table(path: os.PathLike | str, allow_missing: tuple[str, ...] | list[str] = ()) -> Table:
    """Read a numeric table: a CSV file with a header row (comma separated; ``;`` and tab
    are detected), or an ``.npz`` archive of equal-length 1-D arrays (one per column) or of a
    2-D ``X`` with a 1-D ``y`` (columns ``x0 .. x{D-1}`` and ``y``).

    Every value must be a finite number: columns holding text, empty cells or NaN/inf are
    refused, and the error names them (with the first offending row); in the columns named by
    ``allow_missing``, empty cells and NaN are read as NaN (missing targets).

    :param path: the file (``.csv``, ``.txt`` or ``.npz``).
    :param allow_missing: columns that may have missing values.
    :return: the :class:`Table`.
    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: an empty file, a row of another length than the header, columns that
        are not numeric, or an ``.npz`` of another layout.
    """
    path = Path(os.fspath(path)).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    table = _read_npz(path) if path.suffix.lower() == ".npz" else _read_csv(path, allow_missing)
    may_miss = np.array([name in allow_missing for name in table.columns], bool)
    bad = ~np.isfinite(table.data) & ~(np.isnan(table.data) & may_miss)
    if bad.any():
        names = [table.columns[j] for j in np.flatnonzero(bad.any(axis=0))]
        raise ValueError(f"{str(path)!r}: columns with missing, NaN or infinite values: {names}")
    return table


def _read_npz(path: Path) -> Table:
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    if not arrays:
        raise ValueError(f"{str(path)!r} holds no arrays")
    columns, parts = list(arrays), list(arrays.values())
    if "X" in arrays and arrays["X"].ndim == 2:
        X = arrays.pop("X")
        columns = [f"x{i}" for i in range(X.shape[1])] + list(arrays)
        parts = list(X.T) + [
            v.reshape(-1) if v.ndim == 2 and v.shape[1] == 1 else v for v in arrays.values()
        ]
    bad_shape = [
        c for c, p in zip(columns, parts) if p.ndim != 1 or p.shape[0] != parts[0].shape[0]
    ]
    if bad_shape:
        raise ValueError(
            f"{str(path)!r}: every array must be one column of the same length (or X (N, D) with "
            f"y (N,)); these are not: {bad_shape}"
        )
    not_numeric = [c for c, p in zip(columns, parts) if p.dtype.kind not in "biuf"]
    if not_numeric:
        raise ValueError(f"{str(path)!r}: columns that are not numeric: {not_numeric}")
    return Table(columns, np.stack([p.astype(np.float64) for p in parts], axis=1))


def _read_csv(path: Path, allow_missing: tuple[str, ...] | list[str]) -> Table:
    lines = [line for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    if len(lines) < 2:
        raise ValueError(f"{str(path)!r} needs a header row and at least one row of data")
    try:
        dialect = csv.Sniffer().sniff(lines[0], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    rows = list(csv.reader(lines, dialect))
    columns = [c.strip() for c in rows[0]]
    if len(set(columns)) != len(columns):
        raise ValueError(f"{str(path)!r}: the header repeats column names: {columns}")
    values = np.empty((len(rows) - 1, len(columns)))
    bad: dict[str, tuple[int, str]] = {}
    for r, row in enumerate(rows[1:], start=2):
        if len(row) != len(columns):
            raise ValueError(
                f"{str(path)!r}: line {r} has {len(row)} fields, the header has {len(columns)}"
            )
        for c, cell in enumerate(row):
            missing = columns[c] in allow_missing and not cell.strip()
            try:
                values[r - 2, c] = np.nan if missing else float(cell)
            except ValueError:
                bad.setdefault(columns[c], (r, cell))
    if bad:
        listed = ", ".join(
            f"{name!r} (line {line}: {cell!r})" for name, (line, cell) in bad.items()
        )
        raise ValueError(
            f"{str(path)!r}: columns that are not numeric: {listed}. Drop them or encode them as "
            "numbers first"
        )
    return Table(columns, values)
