"""Compiled functions kept per user object (an ``SVI``, a guide), weakly keyed.

A table lives exactly as long as its owner: nothing is stored on the user's objects, and
nothing here keeps them alive. A cached value must therefore not hold its owner strongly
(close over ``weakref.ref(owner)`` instead), or the owner could never be collected.
"""

from __future__ import annotations

import weakref
from typing import Any, Hashable


class OwnerCache:
    """``{owner: {key: value}}`` with weak owners and at most ``max_entries`` keys per owner.

    :param max_entries: entries kept per owner; the table is cleared when it is full.
    """

    def __init__(self, max_entries: int = 16) -> None:
        self._tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.max_entries = int(max_entries)

    def get(self, owner: Any, key: Hashable) -> Any:
        """The value for ``(owner, key)``, or ``None``."""
        table = self._tables.get(owner)
        return None if table is None else table.get(key)

    def put(self, owner: Any, key: Hashable, value: Any) -> None:
        """Store ``value`` for ``(owner, key)`` (no-op for owners that cannot be weakly
        referenced)."""
        try:
            table = self._tables.setdefault(owner, {})
        except TypeError:
            return
        if len(table) >= self.max_entries:
            table.clear()
        table[key] = value
