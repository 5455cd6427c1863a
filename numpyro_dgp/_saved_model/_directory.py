"""The checks of a saved model's directory and its ``model.json``: NumPy only, so that the
command line checks its paths and a saved model's metadata before JAX loads."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from numpyro_dgp import __version__
from numpyro_dgp.io import check_format

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
