"""Finding and reading folders in the standard UCI split layout (behind
:func:`numpyro_dgp.datasets.load_uci`).

NumPy only, no JAX: the command line checks ``--splits``, the data directory and the data set's
name with these before it imports JAX. :mod:`numpyro_dgp.datasets` re-exports the public names.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

#: The files of the standard split layout that every data set folder must hold.
_LAYOUT_FILES = ("data.txt", "index_features.txt", "index_target.txt")


def _is_layout_folder(path: Path) -> bool:
    return path.is_dir() and all((path / f).is_file() for f in _LAYOUT_FILES)


def _available(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if _is_layout_folder(p))


#: Canonical names, equal to the folder names under the data directory.
UCI_DATASETS: tuple[str, ...] = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "power-plant",
    "wine-quality-red",
    "yacht",
)

#: Accepted short names (matched case-insensitively) -> canonical names.
UCI_ALIASES: dict[str, str] = {
    "boston": "bostonHousing",
    "boston-housing": "bostonHousing",
    "housing": "bostonHousing",
    "power": "power-plant",
    "powerplant": "power-plant",
    "ccpp": "power-plant",
    "wine": "wine-quality-red",
    "wine-red": "wine-quality-red",
    "winered": "wine-quality-red",
    "red-wine": "wine-quality-red",
}

#: Environment variable consulted by :func:`default_data_dir`.
DATA_DIR_ENV_VAR = "NUMPYRO_DGP_DATA"


def _check_uci_name(name: str) -> None:
    """Raise unless ``name`` is a non-empty string (NumPy only: :mod:`numpyro_dgp._validation`
    imports JAX, which the command line loads only after these checks).

    :raises ValueError: otherwise.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string, got {name!r}")


def resolve_uci_name(name: str) -> str:
    """Map a known data set name or alias to its folder name; other names pass unchanged.

    Matching is case-insensitive, so ``"Boston"``, ``"bostonhousing"`` and
    ``"bostonHousing"`` all give ``"bostonHousing"``. A name that is neither a known set nor
    an alias (e.g. ``"protein"``) is returned as given: it is looked up as a folder name.

    :param name: a name from :data:`UCI_DATASETS`, an alias from :data:`UCI_ALIASES`, or the
        name of any folder in the standard layout.
    :return: the folder name.
    :raises ValueError: ``name`` is not a non-empty string.
    """
    _check_uci_name(name)
    if name in UCI_DATASETS:
        return name
    key = name.strip().lower()
    for canonical in UCI_DATASETS:
        if canonical.lower() == key:
            return canonical
    return UCI_ALIASES.get(key, name.strip())


def default_data_dir(data_dir: os.PathLike | str | None = None) -> Path:
    """The folder that holds the data sets: ``data_dir``, else ``$NUMPYRO_DGP_DATA``.

    There is no built-in default: the data live wherever you keep them. An explicit argument
    or a set environment variable that points nowhere is an error rather than being skipped,
    so a typo never silently loads other data.

    :param data_dir: explicit data directory, or ``None`` to read the environment variable.
    :return: absolute path of the data directory.
    :raises FileNotFoundError: the directory does not exist, or neither is given.
    """
    return _check_data_dir(data_dir, os.environ.get(DATA_DIR_ENV_VAR, "")).resolve()


def _check_data_dir(data_dir: os.PathLike | str | None, env_value: str) -> Path:
    """The data directory ``data_dir``, else ``env_value`` (the environment variable's value),
    checked to exist.

    :raises FileNotFoundError: the directory does not exist, or neither is given.
    """
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data_dir={str(path)!r} is not an existing directory")
        return path
    if env_value:
        path = Path(env_value).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"{DATA_DIR_ENV_VAR}={env_value!r} is not an existing directory; "
                f"fix it, unset it, or pass --data-dir"
            )
        return path
    raise FileNotFoundError(
        "no data directory given: pass data_dir= (--data-dir on the command line), set the "
        f"{DATA_DIR_ENV_VAR} environment variable, or pass the path of a data set folder"
    )


def _check_layout_folder(folder: Path) -> None:
    """Raise unless ``folder`` is a folder holding the files of the standard split layout.

    :raises FileNotFoundError: otherwise, naming the missing files.
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"data set folder {str(folder)!r} does not exist")
    missing = [f for f in _LAYOUT_FILES if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{str(folder)!r} is not a folder in the standard split layout: it lacks {missing} "
            "(expected data.txt, index_features.txt, index_target.txt, index_train_<i>.txt, "
            "index_test_<i>.txt)"
        )


def _check_named_folder(folder: Path, canonical: str, base: Path) -> None:
    """Raise unless the data set ``canonical`` has its folder under the data directory ``base``.

    :raises FileNotFoundError: otherwise, listing the data sets there.
    """
    if not folder.is_dir():
        raise FileNotFoundError(
            f"data set folder for name={canonical!r} not found: {folder} does not exist "
            f"(data sets in {str(base)!r}: {', '.join(_available(base)) or 'none'})"
        )


def dataset_dir(name: str | os.PathLike, data_dir: os.PathLike | str | None) -> tuple[str, Path]:
    """``(name, folder)`` of a data set given by path, or by name under the data directory."""
    if isinstance(name, os.PathLike) or (
        isinstance(name, str) and (os.sep in name or name.startswith("~"))
    ):
        folder = Path(name).expanduser()
        _check_layout_folder(folder)
        return folder.resolve().name, folder.resolve()
    canonical = resolve_uci_name(name)
    base = default_data_dir(data_dir)
    folder = base / canonical
    _check_named_folder(folder, canonical, base)
    return canonical, folder


def num_uci_splits(name: os.PathLike | str, data_dir: os.PathLike | str | None = None) -> int:
    """Number of train/test splits of a data set (20 for the standard sets).

    :param name: data set name or alias under the data directory, or a folder path.
    :param data_dir: data directory; see :func:`default_data_dir`.
    :return: number of splits, read from ``n_splits.txt`` where the folder has one, else the
        number of ``index_train_<i>.txt`` files.
    """
    _, folder = dataset_dir(name, data_dir)
    path = folder / "n_splits.txt"
    if not path.is_file():
        return _check_split_files(folder)
    return _check_split_count(path, path.read_text().strip())


def _check_split_files(folder: Path) -> int:
    """The number of ``index_train_<i>.txt`` files in ``folder``.

    :raises FileNotFoundError: there are none.
    """
    count = len(list(folder.glob("index_train_*.txt")))
    if count == 0:
        raise FileNotFoundError(f"{folder} holds no index_train_<i>.txt split files")
    return count


def _check_split_count(path: Path, text: str) -> int:
    """The number of splits ``text`` (the stripped content of ``n_splits.txt`` at ``path``) holds.

    :raises ValueError: ``text`` does not start with a positive integer.
    """
    try:
        value = float(text.split()[0])
    except (ValueError, IndexError) as err:
        raise ValueError(f"split count file {path} does not hold a number: {text!r}") from err
    if value != int(value) or value < 1:
        raise ValueError(f"split count file {path} must hold a positive integer, got {text!r}")
    return int(value)


def read_indices(path: Path, upper: int | None = None) -> np.ndarray:
    """Read a whitespace-separated index file; tolerates floats such as ``3.0``."""
    return _check_indices(_check_index_file(path), path, upper)


def _check_index_file(path: Path) -> np.ndarray:
    """The numbers of the index file ``path``, flattened.

    :raises FileNotFoundError: a missing file.
    :raises ValueError: a file that does not parse as numbers, or an empty one.
    """
    if not path.is_file():
        raise FileNotFoundError(f"index file {path} does not exist")
    try:
        raw = np.loadtxt(path, dtype=np.float64, ndmin=1)
    except ValueError as err:
        raise ValueError(f"index file {path} could not be parsed as numbers: {err}") from err
    raw = raw.reshape(-1)
    if raw.size == 0:
        raise ValueError(f"index file {path} is empty")
    return raw


def _check_indices(raw: np.ndarray, path: Path, upper: int | None) -> np.ndarray:
    """``raw`` (the numbers of the index file ``path``) as ``int64`` indices, checked to be
    whole, non-negative and below ``upper``.

    :raises ValueError: otherwise.
    """
    if not np.all(np.isfinite(raw)) or not np.all(raw == np.round(raw)):
        raise ValueError(f"index file {path} holds non-integer indices")
    idx = raw.astype(np.int64)
    if np.any(idx < 0):
        raise ValueError(f"index file {path} holds negative indices (they must be 0-based)")
    if upper is not None and np.any(idx >= upper):
        raise ValueError(
            f"index file {path} holds index {int(idx.max())} but only {upper} are valid"
        )
    return idx


def _read_data(path: Path) -> np.ndarray:
    """The rows of the data file ``path``, checked to be finite numbers."""
    data = _check_data_text(path)
    _check_data_rows(data, path)
    return data


def _check_data_text(path: Path) -> np.ndarray:
    """The ``(rows, columns)`` numbers of the data file ``path``.

    :raises FileNotFoundError: a missing file.
    :raises ValueError: a file that does not parse as rows of numbers.
    """
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    try:
        return np.loadtxt(path, dtype=np.float64, ndmin=2)
    except ValueError as err:
        raise ValueError(f"data file {path} could not be parsed: {err}") from err


def _check_data_rows(data: np.ndarray, path: Path) -> None:
    """Raise unless ``data`` (of the data file ``path``) has rows, all finite.

    :raises ValueError: otherwise, naming the first bad rows.
    """
    if data.size == 0:
        raise ValueError(f"data file {path} holds no rows")
    bad_rows = np.flatnonzero(~np.all(np.isfinite(data), axis=1))
    if bad_rows.size:
        shown = ", ".join(str(int(r)) for r in bad_rows[:5])
        more = "" if bad_rows.size <= 5 else f" and {bad_rows.size - 5} more"
        raise ValueError(
            f"data file {path} has {bad_rows.size} row(s) with NaN/inf values "
            f"(0-based rows {shown}{more})"
        )


def check_split(split: int, n_splits: int, canonical: str) -> int:
    """``split`` as an ``int``, checked to be an index of one of ``n_splits`` splits of
    ``canonical``.

    :raises ValueError: otherwise.
    """
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)):
        raise ValueError(f"split must be an integer, got {type(split).__name__}")
    if not 0 <= split < n_splits:
        raise ValueError(
            f"split={split} is out of range for {canonical!r}: valid splits are 0..{n_splits - 1}"
        )
    return int(split)


def standardize_stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = values.mean(axis=0)
    std = values.std(axis=0)
    # A constant training column would divide by zero; scaling by 1 maps it to zeros.
    std = np.where(std > 0.0, std, 1.0)
    return mean, std


def _check_target_index(target: np.ndarray, features: np.ndarray, folder: Path) -> None:
    """Raise unless ``target`` names one column, not one of the ``features``.

    :raises ValueError: otherwise.
    """
    if target.size != 1:
        raise ValueError(
            f"index file {folder / 'index_target.txt'} must hold exactly one column, "
            f"got {target.size}"
        )
    if target[0] in features:
        raise ValueError(
            f"target column {int(target[0])} is also listed in {folder / 'index_features.txt'}"
        )


def read_features_and_target(folder: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """``(X, y, number of rows)`` of the data set in ``folder``, by its feature and target
    indices."""
    data = _read_data(folder / "data.txt")
    num_rows, num_cols = data.shape
    features = read_indices(folder / "index_features.txt", upper=num_cols)
    target = read_indices(folder / "index_target.txt", upper=num_cols)
    _check_target_index(target, features, folder)
    return data[:, features], data[:, target[0]], num_rows


def parse_splits(text: str) -> list[int]:
    """Split indices from a command-line string: ``"0-4"`` -> ``[0, 1, 2, 3, 4]``;
    ``"0,3,7"`` -> ``[0, 3, 7]``; ranges and lists combine (``"0-2,7"``).

    :param text: comma-separated non-negative indices and inclusive ranges ``a-b`` (``a <= b``).
    :return: the indices in the order given (not sorted, not deduplicated).
    :raises ValueError: no indices, or a part that is not a non-negative integer or an
        increasing range (e.g. ``-1``, ``3-1``, ``a``), named in the message.
    """
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        a, b = _check_split_part(part, text)
        out.extend(range(a, b + 1))
    _check_some_splits(out, text)
    return out


def _check_split_part(part: str, text: str) -> tuple[int, int]:
    """The first and last index of ``part`` (an index or a range ``a-b`` of ``text``).

    :raises ValueError: a part that is not a non-negative integer or an increasing range.
    """
    bounds = part.split("-")
    if not (1 <= len(bounds) <= 2 and all(b.strip().isdigit() for b in bounds)):
        raise ValueError(
            f"{part!r} is not a split index or a range: use non-negative integers and inclusive "
            f"ranges a-b, e.g. '0-4' or '0,3,7' (got {text!r})"
        )
    a, b = int(bounds[0]), int(bounds[-1])
    if b < a:
        raise ValueError(
            f"the range {part!r} is empty: write it low-high, e.g. '{b}-{a}' (got {text!r})"
        )
    return a, b


def _check_some_splits(splits: list[int], text: str) -> None:
    """Raise unless ``text`` gave some split indices (``splits``).

    :raises ValueError: otherwise.
    """
    if not splits:
        raise ValueError(f"no split indices in {text!r}: use e.g. '0-4' or '0,3,7'")
