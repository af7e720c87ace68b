"""Location records on MongoDB: one document per location, created, read, compared-and-set and
deleted (docs/mongodb.md, "Compare-and-set, history, versions").

Why it is shaped so:

- **One document per location**, ``{_id: location, version, born, services, deleted_at,
  recent_history, history_copied}``. Compare-and-set is one ``findAndModify``:
  ``find_one_and_update({_id, version: v}, {$set, $inc: {version: 1}, $push: {recent_history:
  {$each: [write], $slice: -N}}})``. The state and the write's history entries change in that
  one single-document write, atomic on every MongoDB (docs/design.md §2). A ``None`` result is
  told apart (conflict, missing, or our own write already applied by a driver retry) by a
  re-read. There is never an upsert with a version filter (it would create a second record on
  a conflict); creation is ``insert_one``, a ``DuplicateKeyError`` is :class:`AlreadyExists`.
  The ``findAndModify`` matches only when every write its ``$slice`` may drop is in the history
  collection (``history_copied``, :mod:`~locstatus.backends.mongo.history`).
- **Versions strictly increase across delete and recreate**: ``<collection>_incarnations``
  keeps, per location, a creation counter ``n`` and a ``floor`` raised before each purge. A new
  life starts at ``max(LIVES.first(n - 1), floor)`` (the scheme of
  :mod:`~locstatus.backends.versions`, plus the floor), above every version of an earlier
  life; ``born`` keeps the first version of the life, so leftovers of an interrupted purge are
  never read as this life's history.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo import ASCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError

from locstatus.backends import codec
from locstatus.backends.base import ReadResult, stale_version
from locstatus.backends.mongo.history import HistoryCopy, write_doc, writes_of
from locstatus.backends.mongo.store import Doc, Store
from locstatus.backends.versions import LIVES
from locstatus.errors import (
    AlreadyExists,
    AmbiguousCommit,
    BackendUnavailable,
    CorruptRecord,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.models import HistoryEntry, LocationStatus

log = logging.getLogger(__name__)

_META = ("_id", "version", "born", "recent_history", "history_copied")
_CATCH_UP_ATTEMPTS = 3
IN_CHUNK = 1000
"""Locations per ``$in`` query of a batch read."""
"""compare-and-set rounds when the history copy lags (catch up, then write)."""


class Records:
    """The location records of one :class:`~locstatus.backends.mongo.store.Store`; each write
    also records its history through ``history``."""

    def __init__(self, store: Store, history: HistoryCopy) -> None:
        self.store = store
        self.history = history

    def decode(self, doc: Mapping[str, Any]) -> LocationStatus:
        location = str(doc["_id"])
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise CorruptRecord(location, f"version: expected an integer, got {version!r}")
        payload = {k: v for k, v in doc.items() if k not in _META}
        return codec.decode_record(location, version, payload)

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        loc = record.location
        with self.store.io(f"create of {loc!r}"):
            if self.store.records.find_one({"_id": loc}, {"_id": 1}, max_time_ms=self.store.mt):
                raise AlreadyExists(f"location {loc!r} already exists")
            inc = self._next_incarnation(loc)
            n = int(inc["n"])
            version = max(LIVES.first(n - 1), int(inc.get("floor", 1)))
            if n > 1:
                # Acknowledgements of an earlier life (a purge interrupted, a record deleted by
                # hand) name that life's ``born`` and are never read for this one (:meth:`acks`).
                # Only those of no life (written before acknowledgements carried one) are
                # deleted before the insert: an acknowledgement of a racing creator's record,
                # which carries its life, is never one of them.
                self.store.acks.delete_many({"location": loc, "born": {"$exists": False}})
        entries = write_doc(history, version)
        doc: Doc = {"_id": loc, "version": version, "born": version, **codec.record_payload(record),
                    "recent_history": [{"version": version, "entries": entries}],
                    "history_copied": version - 1}
        try:
            with self.store.io(f"create of {loc!r}", write=True):
                try:
                    self.store.records.insert_one(doc)
                except DuplicateKeyError:
                    raise AlreadyExists(f"location {loc!r} already exists") from None
        except AmbiguousCommit as exc:
            # Resolve it here: the version is unique to this attempt (one incarnation each).
            with self.store.io(f"re-read after create of {loc!r}"):
                found = self.store.records.find_one({"_id": loc}, {"version": 1, "born": 1},
                                               max_time_ms=self.store.mt)
            if found is None:
                raise BackendUnavailable(f"create of {loc!r} did not complete: {exc}") from exc
            if found.get("born") != version:
                raise AlreadyExists(f"location {loc!r} already exists") from None
        self.history.insert(loc, version, entries)
        if n > 1:
            # History and acknowledgements of earlier lives (a purge interrupted before its
            # last step; ``born`` already hides them from reads). Only once this life's record
            # is stored: before it, a racing creator's new record could be the one whose history
            # and acknowledgements this deletes. Best effort: the record is created, and the
            # next create of a life tries again.
            try:
                with self.store.io(f"clean-up of earlier lives of {loc!r}"):
                    self.store.history.delete_many({"location": loc, "version": {"$lt": version}})
                    self.store.acks.delete_many({"location": loc, "born": {"$lt": version}})
            except BackendUnavailable as exc:
                log.warning("history of earlier lives of %s left for later: %s", loc, exc)
        return record.model_copy(update={"version": version})

    def _next_incarnation(self, loc: str) -> Doc:
        """Bump and return the creation counter of ``loc`` (``{n, floor?}``).

        An upserting ``findAndModify`` with ``new: true`` always returns the document on
        MongoDB; SecantusDB returns null to the loser of two racing upserts although it
        applied the ``$inc`` (docs/mongodb.md). Bumping again then is harmless (a counter
        value is only ever used once) and gives this caller a value of its own."""
        for _ in range(5):
            inc = self.store.incarnations.find_one_and_update(
                {"_id": loc}, {"$inc": {"n": 1}}, upsert=True,
                return_document=ReturnDocument.AFTER, maxTimeMS=self.store.mt,
            )
            if inc is not None:
                return inc
        raise BackendUnavailable(
            f"MongoDB at {self.store.where}: the creation counter of {loc!r} was not returned"
        )

    def read(self, location: str) -> LocationStatus:
        with self.store.io(f"read of {location!r}"):
            doc = self.store.records.find_one(
                {"_id": location}, {"recent_history": 0, "born": 0}, max_time_ms=self.store.mt
            )
        if doc is None:
            raise NotFound(f"unknown location {location!r}")
        return self.decode(doc)

    def read_many(self, locations: Sequence[str]) -> list[ReadResult]:
        """One ``find({_id: {$in: [...]}})`` per :data:`IN_CHUNK` locations."""
        found: dict[object, ReadResult] = {}
        for i in range(0, len(locations), IN_CHUNK):
            chunk = list(locations[i : i + IN_CHUNK])
            with self.store.io(f"read of {len(chunk)} locations"):
                docs = list(self.store.records.find(
                    {"_id": {"$in": chunk}}, {"recent_history": 0, "born": 0},
                    max_time_ms=self.store.mt,
                ))
            for doc in docs:
                try:
                    found[doc["_id"]] = self.decode(doc)
                except CorruptRecord as exc:
                    found[doc["_id"]] = exc
        return [
            found[loc] if loc in found else NotFound(f"unknown location {loc!r}")
            for loc in locations
        ]

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        out: list[LocationStatus | CorruptRecord] = []
        with self.store.io("read of every location"):
            docs = list(
                self.store.records.find(
                    {}, {"recent_history": 0, "born": 0}, max_time_ms=self.store.mt
                ).sort("_id", ASCENDING)
            )
        for doc in docs:
            try:
                out.append(self.decode(doc))
            except CorruptRecord as exc:
                out.append(exc)
        return out

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        """One ``findAndModify`` (see the module docstring), which pushes this write into the
        embedded history and lets the oldest embedded write go only if the history collection
        is known to hold it (``history_copied``); then this write's copy to the collection, and
        every ``recent_history // 2`` writes a catch-up (:meth:`HistoryCopy.catch_up`)."""
        loc = record.location
        version = expected_version + 1
        window = self.store.settings.recent_history
        entries = write_doc(history, version)
        update: Doc = {
            "$set": codec.record_payload(record),
            "$inc": {"version": 1},
            "$push": {"recent_history": {
                "$each": [{"version": version, "entries": entries}], "$slice": -window,
            }},
        }
        query: Doc = {
            "_id": loc, "version": expected_version,
            # every write the $slice may drop (<= version - window) is in the collection
            "history_copied": {"$gte": version - window},
        }
        for _ in range(_CATCH_UP_ATTEMPTS):
            with self.store.io(
                f"compare-and-set of {loc!r} at version {expected_version}", write=True
            ):
                after = self.store.records.find_one_and_update(
                    query, update, projection={"_id": 0, "version": 1, "history_copied": 1},
                    return_document=ReturnDocument.AFTER, maxTimeMS=self.store.mt,
                )
            if after is not None:
                break
            landed = self._resolve_miss(loc, expected_version, history)  # or raises
            if landed is not None:
                self.history.insert(loc, version, entries)
                return landed
            # The copy lags (a writer died before copying, or a record written before the
            # watermark existed): copy now, from the embedded writes still there, and retry.
            self.history.catch_up(loc)
        else:
            raise BackendUnavailable(
                f"MongoDB at {self.store.where}: the history collection of {loc!r} could not "
                f"catch up with its embedded history; compare-and-set not applied"
            )
        if after.get("version") != version:  # pragma: no cover - would be a server bug
            raise CorruptRecord(loc, f"version {after.get('version')!r} after CAS, not {version}")
        self.history.insert(loc, version, entries)
        copied = after.get("history_copied")
        if not isinstance(copied, int) or version - copied >= max(1, window // 2):
            try:
                self.history.catch_up(loc)
            except LocstatusError as exc:  # the write is done; a later one catches up
                log.warning("history of %s not caught up yet: %s", loc, exc)
        return record.model_copy(update={"version": version})

    def _resolve_miss(
        self, loc: str, expected: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus | None:
        """The CAS matched nothing: re-read to tell a missing record from a conflict, from our
        own write applied by an earlier attempt (a driver retry: then return it), or from a
        history copy that lags (the record is still at ``expected``: return None). A conflict
        is a :class:`~locstatus.backends.base.StaleVersion` carrying the record this
        re-read found."""
        with self.store.io(f"re-read of {loc!r} after a failed compare-and-set"):
            doc = self.store.records.find_one(
                {"_id": loc}, {"born": 0, "recent_history": {"$slice": -1}},
                max_time_ms=self.store.mt,
            )
        if doc is None:
            raise NotFound(f"unknown location {loc!r}")
        current = doc.get("version")
        if current == expected:
            return None
        if current == expected + 1 and history:
            last = writes_of(loc, doc.pop("recent_history", None))
            if last and last[-1][0] == current:
                raw = last[-1][1]
                written = raw if isinstance(raw, list) else []
                ops = {e.get("op_id") for e in written if isinstance(e, dict)}
                if ops == {e.op_id for e in history}:
                    return self.decode(doc)
        doc.pop("recent_history", None)
        try:  # this re-read is the record as it is now: the manager plans from it (§3.1)
            found: LocationStatus | None = self.decode(doc)
        except CorruptRecord:
            found = None  # the manager's own read says so
        raise stale_version(f"location {loc!r} is at version {current}, expected {expected}", found)

    def delete(self, location: str, expected_version: int) -> None:
        with self.store.io(f"delete of {location!r}"):
            # Raise the floor first: a crash after it only wastes versions, never reuses one.
            self.store.incarnations.update_one(
                {"_id": location}, {"$max": {"floor": expected_version + 1}}, upsert=True
            )
            res = self.store.records.delete_one({"_id": location, "version": expected_version})
            if res.deleted_count != 1:
                doc = self.store.records.find_one({"_id": location}, {"version": 1},
                                             max_time_ms=self.store.mt)
                if doc is None:
                    raise NotFound(f"unknown location {location!r}")
                raise VersionConflict(
                    f"location {location!r} is at version {doc.get('version')}, "
                    f"expected {expected_version}"
                )
            self.store.history.delete_many(
                {"location": location, "version": {"$lte": expected_version}}
            )
            self.store.acks.delete_many({"location": location})

