"""Reading folders in the standard UCI split layout (the files behind :func:`numpyro_dgp.datasets.load_uci`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The files of the standard split layout that every data set folder must hold.
_LAYOUT_FILES = ("data.txt", "index_features.txt", "index_target.txt")


def _is_layout_folder(path: Path) -> bool:
    return path.is_dir() and all((path / f).is_file() for f in _LAYOUT_FILES)


def _available(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if _is_layout_folder(p))


def _read_indices(path: Path, upper: int | None = None) -> np.ndarray:
    """Read a whitespace-separated index file; tolerates floats such as ``3.0``."""
    if not path.is_file():
        raise FileNotFoundError(f"index file {path} does not exist")
    try:
        raw = np.loadtxt(path, dtype=np.float64, ndmin=1)
    except ValueError as err:
        raise ValueError(f"index file {path} could not be parsed as numbers: {err}") from err
    raw = raw.reshape(-1)
    if raw.size == 0:
        raise ValueError(f"index file {path} is empty")
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
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    try:
        data = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except ValueError as err:
        raise ValueError(f"data file {path} could not be parsed: {err}") from err
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
    return data


def _check_split(split: int, n_splits: int, canonical: str) -> int:
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)):
        raise ValueError(f"split must be an integer, got {type(split).__name__}")
    if not 0 <= split < n_splits:
        raise ValueError(
            f"split={split} is out of range for {canonical!r}: valid splits are 0..{n_splits - 1}"
        )
    return int(split)


def _standardize_stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = values.mean(axis=0)
    std = values.std(axis=0)
    # A constant training column would divide by zero; scaling by 1 maps it to zeros.
    std = np.where(std > 0.0, std, 1.0)
    return mean, std


def _read_features_and_target(folder: Path):
    data = _read_data(folder / "data.txt")
    num_rows, num_cols = data.shape
    features = _read_indices(folder / "index_features.txt", upper=num_cols)
    target = _read_indices(folder / "index_target.txt", upper=num_cols)
    if target.size != 1:
        raise ValueError(
            f"index file {folder / 'index_target.txt'} must hold exactly one column, "
            f"got {target.size}"
        )
    if target[0] in features:
        raise ValueError(
            f"target column {int(target[0])} is also listed in {folder / 'index_features.txt'}"
        )

    return data[:, features], data[:, target[0]], num_rows


def parse_splits(text: str) -> list[int]:
    """Split indices from a command-line string: ``"0-4"`` -> ``[0, 1, 2, 3, 4]``;
    ``"0,3,7"`` -> ``[0, 3, 7]``; ranges and lists combine (``"0-2,7"``).

    :param text: comma-separated non-negative indices and inclusive ranges ``a-b`` (``a <= b``).
    :return: the indices in the order given (not sorted, not deduplicated).
    :raises ValueError: no indices, or a part that is not a non-negative integer or an
        increasing range (e.g. ``-1``, ``3-1``, ``a``), named in the message.
    """
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        bounds = part.split("-")
        if not (1 <= len(bounds) <= 2 and all(b.strip().isdigit() for b in bounds)):
            raise ValueError(
                f"{part!r} is not a split index or a range: use non-negative integers and inclusive ranges "
                f"a-b, e.g. '0-4' or '0,3,7' (got {text!r})"
            )
        a, b = int(bounds[0]), int(bounds[-1])
        if b < a:
            raise ValueError(f"the range {part!r} is empty: write it low-high, e.g. '{b}-{a}' (got {text!r})")
        out.extend(range(a, b + 1))
    if not out:
        raise ValueError(f"no split indices in {text!r}: use e.g. '0-4' or '0,3,7'")
    return out
