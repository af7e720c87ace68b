"""History pages: the entries of stored writes, newest first, whole writes at a time, up to a
limit (contract invariant 3, :meth:`Backend.history`).

Why it is shaped so: every backend stores one history write per version (a row, a document, a
znode, a list item) and pages through them the same way: walk the writes newest first, decode
each, add its entries newest first, stop once ``limit`` entries are gathered, never in the
middle of a write. Five copies of that loop (SQLite, memory, ZooKeeper, and MongoDB's two
copies) had grown small differences; :class:`HistoryPage` is the loop, once. Where the writes
come from (a query, a children list, an embedded array) stays with the backend.

Usage::

    page = HistoryPage(location, limit=50)
    page.take(writes_newest_first)          # [(version, stored text), ...], stops when full
    if not page.full:
        page.take(older_writes)             # a second source (MongoDB's full history)
    return page.entries
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from locstatus.backends import codec
from locstatus.models import HistoryEntry

Decode = Callable[[str, object, int], list[HistoryEntry]]
"""``decode(location, stored, version)``: the entries of one write, oldest first; raises
:class:`~locstatus.errors.CorruptRecord` (default :func:`codec.decode_history`)."""


class HistoryPage:
    """Entries gathered newest first from writes given newest first, each write whole, until
    ``limit`` entries are held; at least one write is read (``limit`` 0 reads exactly one).

    ``before``: leave out writes at this version and above (None: none left out).
    """

    def __init__(
        self,
        location: str,
        limit: int,
        *,
        before: int | None = None,
        decode: Decode = codec.decode_history,
    ) -> None:
        self.location = location
        self.limit = limit
        self.before = before
        self.decode = decode
        self.entries: list[HistoryEntry] = []
        self._read = False  # a write was read: only then can the page be full

    @property
    def full(self) -> bool:
        """True once a write was read and ``limit`` entries are held: no further write is."""
        return self._read and len(self.entries) >= self.limit

    def take(self, writes: Iterable[tuple[int, object]]) -> bool:
        """Add the entries of ``writes`` (``(version, stored)``, newest first) until full;
        writes after that are not decoded (nor drawn from ``writes``). Returns :attr:`full`.
        Raises what ``decode`` raises for a write that does not parse."""
        if self.full:
            return True
        for version, stored in writes:
            if self.before is not None and version >= self.before:
                continue
            self.entries.extend(reversed(self.decode(self.location, stored, version)))
            self._read = True
            if self.full:
                return True
        return False
