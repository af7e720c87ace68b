"""The history of MongoDB records: the embedded recent writes, the history collection, and the
watermark that keeps the collection whole (docs/mongodb.md, "Compare-and-set, history,
versions").

Why it is shaped so: every write lands in the record's embedded ``recent_history`` (the last
``recent_history=N`` writes, authoritative, in the same ``findAndModify`` as the state) and is
then copied to ``<collection>_history`` (one document per write, unique on ``(location,
version)``), which serves older pages. A writer can die between its two writes, so nothing may
leave the embedded copy before the collection holds it: the record's ``history_copied`` says up
to which version the collection is known whole, raised by :meth:`HistoryCopy.catch_up` (copy
what the collection lacks from the embedded copy, then ``$max``). :meth:`HistoryCopy.gaps`
verifies the chain for the check job, which repairs it with ``catch_up``. ``born`` (the first
version of the record's life) keeps leftovers of an interrupted purge out of every read.

Pages are gathered by :class:`~locstatus.backends.history.HistoryPage`: the embedded writes
first, then, when they do not reach back to ``born``, the collection below them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import cast

from pydantic import TypeAdapter, ValidationError
from pymongo import UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError

from locstatus.backends import codec
from locstatus.backends.base import GAPS_LISTED, HistoryGaps
from locstatus.backends.history import HistoryPage
from locstatus.backends.mongo.store import Doc, Store
from locstatus.errors import BackendUnavailable, CorruptRecord, LocstatusError
from locstatus.models import HistoryEntry

log = logging.getLogger(__name__)

_ENTRIES = TypeAdapter(list[HistoryEntry])


def entries_of(location: str, raw: object, version: object) -> list[HistoryEntry]:
    """The entries of the write stored as ``version`` (see :func:`codec.check_write`)."""
    key = codec.write_version(location, version)
    try:
        entries = _ENTRIES.validate_python(raw)
    except ValidationError as exc:
        raise CorruptRecord(
            location, codec.history_error(key, codec._short(exc, "entries"))
        ) from exc
    return codec.check_write(location, entries, key)

def writes_of(location: str, raw: object) -> list[tuple[int, object]]:
    """``(version, entries)`` of embedded writes; a malformed list is corrupt."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise CorruptRecord(location, "recent_history: expected a list")
    out: list[tuple[int, object]] = []
    for w in raw:
        v = w.get("version") if isinstance(w, dict) else None
        if not isinstance(v, int) or isinstance(v, bool):
            raise CorruptRecord(location, f"recent_history: malformed write {w!r:.80}")
        out.append((v, w.get("entries")))
    return out

def write_doc(entries: Sequence[HistoryEntry], version: int) -> list[Doc]:
    return [e.model_dump(mode="json") for e in codec.stamp(entries, version)]

# -- records -------------------------------------------------------------------------


class HistoryCopy:
    """The history of every record of one :class:`~locstatus.backends.mongo.store.Store`:
    pages, single writes, the copy to the collection and its verification."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def catch_up(self, location: str) -> list[int]:
        """Copy every embedded write the history collection lacks, then raise the record's
        ``history_copied`` to the version read: every write up to it is then in the collection
        (the embedded ones were just checked, older ones left the embedded history only at or
        below an earlier ``history_copied``). Returns the versions copied. Raises
        :class:`BackendUnavailable`, :class:`CorruptRecord`."""
        with self.store.io(f"history catch-up of {location!r}"):
            doc = self.store.records.find_one(
                {"_id": location},
                {"recent_history": 1, "born": 1, "version": 1, "history_copied": 1},
                max_time_ms=self.store.mt,
            )
        if doc is None:
            return []
        born, version = doc.get("born"), doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise CorruptRecord(location, f"version: expected an integer, got {version!r}")
        floor = born if isinstance(born, int) else 0
        writes = [w for w in writes_of(location, doc.get("recent_history")) if w[0] >= floor]
        missing = self._missing(location, writes)
        current = doc.get("history_copied")
        op = "$max" if isinstance(current, int) and not isinstance(current, bool) else "$set"

        def raise_to(copied_to: int) -> None:
            with self.store.io(f"history catch-up of {location!r}"):
                self.store.records.update_one(
                    {"_id": location, "born": born}, {op: {"history_copied": copied_to}}
                )

        try:
            copied = self._copy(location, missing)
        except LocstatusError:
            if missing:  # everything below the first missing write is copied: keep that much
                with contextlib.suppress(LocstatusError):
                    raise_to(min(v for v, _ in missing) - 1)
            raise
        raise_to(version)
        return copied

    def catch_up_many(self, records: Sequence[Doc]) -> list[str]:
        """:meth:`catch_up` of many records in two requests, from their ``{_id, born,
        version, history_copied}`` as just read: one count per record of the collection's
        writes above ``history_copied`` up to ``version`` (an aggregation on the unique index),
        and, for every record whose count is whole, one ``bulk_write`` of ``$max:
        {history_copied: version}``. Returns the locations left for :meth:`catch_up` one by
        one: a write missing from the collection (copied from the embedded history there), a
        record without ``born`` or ``history_copied``. Raises :class:`BackendUnavailable`."""
        alone: list[str] = []
        spans: dict[str, tuple[object, int, int]] = {}  # loc -> (born, copied, version)
        for doc in records:
            loc, born = str(doc["_id"]), doc.get("born")
            version, copied = doc.get("version"), doc.get("history_copied")
            if type(born) is not int or type(version) is not int or type(copied) is not int:
                alone.append(loc)
            elif copied < version:
                spans[loc] = (born, copied, version)
        if not spans:
            return alone
        match = {"$or": [{"location": loc, "version": {"$gt": c, "$lte": v}}
                         for loc, (_, c, v) in spans.items()]}
        with self.store.io(f"history check of a batch of {len(spans)} locations"):
            counted = {
                d["_id"]: d["n"] for d in self.store.history.aggregate(
                    [{"$match": match}, {"$group": {"_id": "$location", "n": {"$sum": 1}}}],
                    maxTimeMS=self.store.mt,
                )
            }
        whole: list[UpdateOne] = []
        for loc, (born, copied, version) in spans.items():
            if counted.get(loc) == version - copied:
                whole.append(UpdateOne({"_id": loc, "born": born},
                                       {"$max": {"history_copied": version}}))
            else:
                alone.append(loc)
        if whole:
            with self.store.io(f"history catch-up of a batch of {len(whole)} locations"):
                self.store.records.bulk_write(whole, ordered=False)
        return alone

    def insert(self, loc: str, version: int, entries: list[Doc]) -> None:
        """Copy one write to the history collection. Best effort: the embedded copy is
        authoritative, and a later write (or the check's repair) copies what a failure here
        left out, before it can leave the embedded copy (:meth:`catch_up`)."""
        try:
            with (
                self.store.io(f"history insert of {loc!r}"),
                contextlib.suppress(DuplicateKeyError),
            ):
                self.store.history.insert_one(
                    {"location": loc, "version": version, "entries": entries}
                )
        except BackendUnavailable as exc:
            log.warning("history of %s v%s not copied yet (a later write copies it): %s",
                        loc, version, exc)

    def page(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        """:meth:`Backend.history`: the embedded writes newest first, then the collection
        below them when they do not reach back to the life's first write."""
        upper = before_version if before_version is not None else 2**62
        with self.store.io(f"history of {location!r}"):
            doc = self.store.records.find_one(
                {"_id": location}, {"recent_history": 1, "born": 1}, max_time_ms=self.store.mt
            )
        if doc is None:
            return []
        born = doc.get("born", 0) if isinstance(doc.get("born"), int) else 0
        writes = [w for w in writes_of(location, doc.get("recent_history")) if w[0] >= born]
        page = HistoryPage(location, limit, decode=entries_of)
        if page.take(sorted((w for w in writes if w[0] < upper), key=lambda w: w[0],
                            reverse=True)):
            return page.entries
        if any(v == born for v, _ in writes):
            # The embedded list still holds the life's first write, so it holds them all.
            # Never judged by how many it holds: the writers' ``recent_history`` decides that,
            # and it need not be this reader's.
            return page.entries
        below = min([upper, *(v for v, _ in writes)])
        with self.store.io(f"history of {location!r}"):
            cursor = self.store.history.find(
                {"location": location, "version": {"$gte": born, "$lt": below}},
                {"_id": 0, "version": 1, "entries": 1}, max_time_ms=self.store.mt,
            ).sort("version", -1).batch_size(max(2, min(limit, 1000)))
            try:  # each version is checked by entries_of (a hand edit may have made it a string)
                page.take((cast(int, d.get("version")), d.get("entries")) for d in cursor)
            finally:
                cursor.close()
        return page.entries

    def write(self, location: str, version: int) -> list[HistoryEntry]:
        """The embedded copy when it still holds ``version`` (the authoritative one, and the
        only one after a crash between the two writes), else the history collection."""
        with self.store.io(f"history of {location!r}"):
            doc = self.store.records.find_one(
                {"_id": location}, {"recent_history": 1, "born": 1, "version": 1},
                max_time_ms=self.store.mt,
            )
        if doc is None:
            return []
        born = doc.get("born", 0) if isinstance(doc.get("born"), int) else 0
        current = doc.get("version")
        if version < born or (isinstance(current, int) and version > current):
            return []
        for v, raw in writes_of(location, doc.get("recent_history")):
            if v == version:
                return list(reversed(entries_of(location, raw, v)))
        with self.store.io(f"history of {location!r}"):
            hdoc = self.store.history.find_one(
                {"location": location, "version": version}, {"_id": 0, "entries": 1},
                max_time_ms=self.store.mt,
            )
        if hdoc is None:
            return []
        return list(reversed(entries_of(location, hdoc.get("entries"), version)))

    def gaps(self, location: str) -> HistoryGaps:
        """The version chain of the history collection from ``born`` to the record's version,
        counted on the unique index (one count when whole); a version it lacks is
        ``restorable`` while embedded, else ``lost``. A document without ``born`` (not made by
        this backend) has no chain to verify."""
        with self.store.io(f"history check of {location!r}"):
            doc = self.store.records.find_one(
                {"_id": location}, {"recent_history.version": 1, "born": 1, "version": 1},
                max_time_ms=self.store.mt,
            )
        if doc is None:
            return HistoryGaps()
        born, version = doc.get("born"), doc.get("version")
        if type(born) is not int or type(version) is not int:
            return HistoryGaps()
        span = {"location": location, "version": {"$gte": born, "$lte": version}}
        with self.store.io(f"history check of {location!r}"):
            counted = self.store.history.count_documents(span, maxTimeMS=self.store.mt)
            if counted == version - born + 1:
                return HistoryGaps()
            present = {
                d.get("version")
                for d in self.store.history.find(
                    span, {"_id": 0, "version": 1}, max_time_ms=self.store.mt
                )
            }
        embedded = {v for v, _ in writes_of(location, doc.get("recent_history"))}
        restorable: list[int] = []
        lost: list[int] = []
        for v in range(born, version + 1):
            if v not in present:
                kind = restorable if v in embedded else lost
                if len(kind) < GAPS_LISTED:
                    kind.append(v)
                elif len(restorable) >= GAPS_LISTED and len(lost) >= GAPS_LISTED:
                    break
        return HistoryGaps(tuple(restorable), tuple(lost))

    def _missing(self, location: str, writes: list[tuple[int, object]]) -> list[tuple[int, object]]:
        if not writes:
            return []
        with self.store.io(f"history check of {location!r}"):
            have = {
                d["version"] for d in self.store.history.find(
                    {"location": location, "version": {"$in": [v for v, _ in writes]}},
                    {"_id": 0, "version": 1}, max_time_ms=self.store.mt,
                )
            }
        return [w for w in writes if w[0] not in have]

    def _copy(self, location: str, writes: list[tuple[int, object]]) -> list[int]:
        """Insert ``writes`` into the history collection (duplicates, copied by another process
        meanwhile, are skipped). Returns the versions this call inserted, sorted."""
        if not writes:
            return []
        docs = [{"location": location, "version": v, "entries": e} for v, e in writes]
        skipped: set[int] = set()
        try:
            with self.store.io(f"history copy of {location!r}"):
                self.store.history.insert_many(docs, ordered=False)
        except BackendUnavailable as exc:
            errors = (
                exc.__cause__.details.get("writeErrors", [])
                if isinstance(exc.__cause__, BulkWriteError) else None
            )
            if errors is None or any(e.get("code") != 11000 for e in errors):
                raise
            skipped = {int(e["index"]) for e in errors}
        copied = sorted(w[0] for i, w in enumerate(writes) if i not in skipped)
        if copied:
            log.info("copied %d history writes of %s to the collection", len(copied), location)
        return copied

    # -- workers, leases and acknowledgements ----------------------------------------------
