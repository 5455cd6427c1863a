"""A user's own table: a CSV file with a header row, or an ``.npz`` of named columns
(re-exported by :mod:`numpyro_dgp.datasets`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["Table", "read_table"]


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
        names = _check_target_columns(target, self.columns)
        chosen = [self.columns.index(name) for name in names]
        keep = [i for i in range(len(self.columns)) if i not in chosen]
        y = self.data[:, chosen[0]] if isinstance(target, str) else self.data[:, chosen]
        return self.data[:, keep], y, [self.columns[i] for i in keep]


def _check_target_columns(target: str | list[str], columns: list) -> list[str]:
    """The target column names, checked to be columns of the table, each named once.

    :raises ValueError: a name that is not a column (the message lists the columns), or a
        column named twice.
    """
    names = [target] if isinstance(target, str) else list(target)
    missing = [name for name in names if name not in columns]
    if missing:
        listed = repr(missing[0]) if len(missing) == 1 else str(missing)
        raise ValueError(f"--target {listed} is not a column; the columns are {list(columns)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--target names a column twice: {names}")
    return names


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
    _check_data_file(path)
    if path.suffix.lower() == ".npz":
        return _read_npz(path, tuple(allow_missing))
    return _read_csv(path, tuple(allow_missing))


def _check_data_file(path: Path) -> None:
    """Raise unless the data file ``path`` is a file.

    :raises FileNotFoundError: otherwise.
    """
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")


def _read_npz(path: Path, allow_missing: tuple[str, ...]) -> Table:
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    _check_some_arrays(path, arrays)
    columns: list[str]
    parts: list[np.ndarray]
    if "X" in arrays and arrays["X"].ndim == 2:
        X = arrays.pop("X")
        columns = [f"x{i}" for i in range(X.shape[1])]
        parts = [X[:, i] for i in range(X.shape[1])]
        for name, value in arrays.items():
            columns.append(name)
            parts.append(value.reshape(-1) if value.ndim == 2 and value.shape[1] == 1 else value)
    else:
        columns, parts = list(arrays), list(arrays.values())
    _check_npz_columns(path, columns, parts)
    data = np.stack([p.astype(np.float64) for p in parts], axis=1)
    _check_finite_columns(path, columns, data, allow_missing)
    return Table(columns, data)


def _check_some_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Raise unless the ``.npz`` archive at ``path`` held some arrays.

    :raises ValueError: otherwise.
    """
    if not arrays:
        raise ValueError(f"{str(path)!r} holds no arrays")


def _check_npz_columns(path: Path, columns: list[str], parts: list[np.ndarray]) -> None:
    """Raise unless the arrays ``parts`` are numeric columns of the same length.

    :raises ValueError: otherwise, naming the columns at fault.
    """
    bad_shape = [
        c for c, p in zip(columns, parts) if p.ndim != 1 or p.shape[0] != parts[0].shape[0]
    ]
    if bad_shape:
        raise ValueError(
            f"{str(path)!r}: every array must be one column of the same length (or X (N, D) with y "
            f"(N,)); these are not: {bad_shape}"
        )
    not_numeric = [c for c, p in zip(columns, parts) if p.dtype.kind not in "biuf"]
    if not_numeric:
        raise ValueError(f"{str(path)!r}: columns that are not numeric: {not_numeric}")


def _read_csv(path: Path, allow_missing: tuple[str, ...]) -> Table:
    import csv

    text = path.read_text(encoding="utf-8-sig")
    lines = [line for line in text.splitlines() if line.strip()]
    _check_csv_lines(path, lines)
    try:
        dialect = csv.Sniffer().sniff(lines[0], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    rows = list(csv.reader(lines, dialect))
    columns = _check_csv_rows(path, rows)
    values = np.empty((len(rows) - 1, len(columns)))
    bad: dict[str, tuple[int, str]] = {}
    for r, row in enumerate(rows[1:], start=2):
        for c, cell in enumerate(row):
            if columns[c] in allow_missing and not cell.strip():
                values[r - 2, c] = np.nan
                continue
            try:
                values[r - 2, c] = float(cell)
            except ValueError:
                bad.setdefault(columns[c], (r, cell))
    _check_numeric_cells(path, bad)
    _check_finite_columns(path, columns, values, allow_missing)
    return Table(columns, values)


def _check_csv_lines(path: Path, lines: list[str]) -> None:
    """Raise unless the CSV file has a header row and a row of data (``lines``: its non-blank
    lines).

    :raises ValueError: otherwise.
    """
    if len(lines) < 2:
        raise ValueError(f"{str(path)!r} needs a header row and at least one row of data")


def _check_csv_rows(path: Path, rows: list[list[str]]) -> list[str]:
    """The column names of the header ``rows[0]``, checked to be distinct and as many as the
    fields of every row.

    :raises ValueError: a repeated column name, or a row of another length (the first one).
    """
    columns = [c.strip() for c in rows[0]]
    if len(set(columns)) != len(columns):
        raise ValueError(f"{str(path)!r}: the header repeats column names: {columns}")
    for r, row in enumerate(rows[1:], start=2):
        if len(row) != len(columns):
            raise ValueError(
                f"{str(path)!r}: line {r} has {len(row)} fields, the header has {len(columns)}"
            )
    return columns


def _check_numeric_cells(path: Path, bad: dict[str, tuple[int, str]]) -> None:
    """Raise if some cells were not numbers (``bad``: column -> the first ``(line, cell)``).

    :raises ValueError: naming the columns.
    """
    if bad:
        listed = ", ".join(
            f"{name!r} (line {line}: {cell!r})" for name, (line, cell) in bad.items()
        )
        raise ValueError(
            f"{str(path)!r}: columns that are not numeric: {listed}. Drop them or encode them as "
            "numbers first"
        )


def _check_finite_columns(
    path: Path, columns: list[str], data: np.ndarray, allow_missing: tuple[str, ...] = ()
) -> None:
    """Raise if a column holds NaN or infinite values (NaN allowed in ``allow_missing``'s columns).

    :raises ValueError: naming the columns.
    """
    may_miss = np.array([name in allow_missing for name in columns], bool)
    bad = ~np.isfinite(data) & ~(np.isnan(data) & may_miss)
    if bad.any():
        names = [columns[j] for j in np.flatnonzero(bad.any(axis=0))]
        raise ValueError(f"{str(path)!r}: columns with missing, NaN or infinite values: {names}")
