"""Bookkeeping of benchmark result files written by separate processes."""

from __future__ import annotations

__all__ = ["extend_by_split"]


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
    clash = {r["split"] for r in rows} & {r["split"] for r in more}
    if clash:
        raise ValueError(f"{what}: split(s) {sorted(clash)} appear in more than one file")
    rows += more
    rows.sort(key=lambda r: r["split"])
    return rows
