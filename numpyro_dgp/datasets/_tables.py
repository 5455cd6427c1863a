"""A user's own table: a CSV file with a header row, or an ``.npz`` of named columns, read with
NumPy only (the command line reads it before JAX loads)."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np


class Table(NamedTuple):
    """A numeric table read by :func:`read_table`.

    :ivar columns: the column names, in file order.
    :ivar data: ``(N, C)`` float64 values, one column per name.
    """

    columns: list
    data: np.ndarray

    def split(self, target: str | list[str]) -> tuple[np.ndarray, np.ndarray, list]:
        """Features and target: ``(X (N, D), y, feature names)``, ``y`` ``(N,)`` for one target
        column, ``(N, T)`` for a list of ``T``.

        :param target: the target column or columns.
        :return: ``(X, y, feature_names)``.
        :raises ValueError: a target that is not a column (the message lists the columns), or a
            column named twice.
        """
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
