"""Bookkeeping of benchmark result files written by separate processes."""

from __future__ import annotations

__all__ = ["extend_by_split", "merge_by_split"]


def _check_distinct_splits(rows: list[dict], more: list[dict], what: str) -> None:
    """Raise if a split has rows in both ``rows`` and ``more``.

    :raises ValueError: naming the splits and ``what``.
    """
    clash = {r["split"] for r in rows} & {r["split"] for r in more}
    if clash:
        raise ValueError(f"{what}: split(s) {sorted(clash)} appear in more than one file")


def extend_by_split(rows: list[dict], more: list[dict], what: str) -> list[dict]:
    """Append the per-split result rows ``more`` to ``rows`` (both lists of dicts with a
    ``"split"`` key), kept sorted by split; a split in both is an error naming ``what``
    (merging the results files of runs made by separate processes).

    :param rows: result rows so far; extended and sorted in place.
    :param more: result rows to add.
    :param what: the name of the results, for the error message.
    :return: ``rows`` (the same list).
    :raises ValueError: a split appears in both ``rows`` and ``more``.
    """
    _check_distinct_splits(rows, more, what)
    rows += more
    rows.sort(key=lambda r: r["split"])
    return rows


def merge_by_split(results: list[dict], what: str) -> dict:
    """Merge results files' ``{data set: {label: [rows]}}`` tables into one, the rows of each
    data set and label joined by :func:`extend_by_split`.

    :param results: the tables, in the order their rows are added.
    :param what: the name of the merge, for error messages (e.g. ``"--combine"``).
    :return: the merged table.
    :raises ValueError: a split appears in more than one table for a data set and label.
    """
    merged: dict = {}
    for table in results:
        for name, by_label in table.items():
            for label, rows in by_label.items():
                extend_by_split(
                    merged.setdefault(name, {}).setdefault(label, []),
                    rows,
                    f"{what}: {name} {label}",
                )
    return merged
