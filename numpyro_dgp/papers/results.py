"""Bookkeeping of benchmark result files written by separate processes."""

from __future__ import annotations

__all__ = ["extend_by_split"]


def extend_by_split(rows, more, what):
    """Append the per-split result rows ``more`` to ``rows`` (both lists of dicts with a
    ``"split"`` key), kept sorted by split; a split in both is an error naming ``what``
    (merging the results files of runs made by separate processes)."""
    clash = {r["split"] for r in rows} & {r["split"] for r in more}
    if clash:
        raise ValueError(f"{what}: split(s) {sorted(clash)} appear in more than one file")
    rows += more
    rows.sort(key=lambda r: r["split"])
    return rows
