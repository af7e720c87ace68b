"""Batches on MongoDB: many compare-and-sets as one unordered ``bulk_write``, many creates as
unordered inserts (backend invariant 12; docs/mongodb.md, "Batches").

Why it is shaped so: a bulk pause of 100 000 locations one ``findAndModify`` after another is
one round trip (and one majority commit) per location. Here a batch of up to :data:`CHUNK`
locations is one ``bulk_write(ordered=False)`` of version-guarded updates, each the same
update as the single write (:meth:`Records.compare_and_set`), then one ``insert_many`` of the
landed writes into the history collection. Each item stays its own single-document write:

- **Which items landed.** A bulk write answers with counts, not documents. When every item
  matched, every item landed. Otherwise (a conflict, a history copy lagging, an answer lost)
  the items are read back in one query and each is told apart by its own record: at its
  version + 1 carrying its op_ids, it landed; at another version, it conflicted (the write at
  exactly version + 1 is read to tell "landed, then overwritten" from "someone else's");
  missing, :class:`NotFound`; still at its expected version, it did not land (yet), and goes in
  the next round, where the version guard makes a second landing impossible. Never a blind
  retry (docs/design.md §3.2).
- **The history copy.** As for single writes, the embedded ``recent_history`` is written first
  and is authoritative; the copy to ``<collection>_history`` follows, best effort, one
  ``insert_many`` per batch. The filter lets a write in only when the copy is at most
  ``recent_history // 2`` versions behind (a bulk write returns no ``history_copied`` to
  decide a catch-up after it, as the single write does): the refused items are caught up
  together (:meth:`HistoryCopy.catch_up_many`: one count of the collection's writes, one bulk
  ``$max`` of the watermark; :meth:`HistoryCopy.catch_up` for a record whose copy lacks a
  write) and sent again; one that cannot catch up goes alone through the single write, which
  decides as it always does.
- **Errors are per item.** A write error names its index and fails that item only; a lost
  connection, a write-concern error or a timeout leaves every unconfirmed item to be read back
  (a read, tried again while the connection comes back); a read back that still fails leaves
  them :class:`AmbiguousCommit`: the manager looks for their op_id, and a landed one's copy to
  the history collection is then left to the next catch-up (it stays embedded until then, as
  after a writer that died between its two writes). An item without history entries carries
  no op_id to find it by: it goes alone.
- **Creates** insert the creation counters (``{_id, n: 1}``), the records and their history with
  unordered ``insert_many``: a duplicate key is that one location's answer. A location that
  had a counter already (an earlier life) goes through the single ``create``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo import UpdateOne
from pymongo.errors import BulkWriteError

from locstatus import monotonic
from locstatus.backends import codec
from locstatus.backends.base import CasItem, CasResult, CreateItem, distinct_locations
from locstatus.backends.mongo.history import HistoryCopy, write_doc, writes_of
from locstatus.backends.mongo.records import Records
from locstatus.backends.mongo.store import Doc, Store, short
from locstatus.backends.versions import LIVES
from locstatus.errors import (
    AlreadyExists,
    AmbiguousCommit,
    BackendUnavailable,
    InvalidInput,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.models import LocationStatus

log = logging.getLogger(__name__)

CHUNK = 1000
"""Locations per ``bulk_write`` (and the backend's ``batch_size``): what one batch holds."""
ROUNDS = 3
"""Bulk rounds per chunk: items found still at their version (a lost answer, a copy caught
up) are sent again at most this many times in all, then go alone."""
READ_BACK_ATTEMPTS = 3
READ_BACK_PAUSE = 0.2
"""Seconds between two reads back of a batch whose answer was lost."""
_DUPLICATE_KEY = 11000
_TOO_LARGE = {10334, 17419, 17420}


@dataclass
class _Cas:
    """One compare-and-set of a chunk: its index in the caller's list, its item, and its
    history as stored (stamped with ``version``)."""

    index: int
    item: CasItem
    entries: list[Doc]

    @property
    def location(self) -> str:
        return self.item.record.location

    @property
    def version(self) -> int:
        return self.item.expected_version + 1

    @property
    def op_ids(self) -> set[str]:
        return {e.op_id for e in self.item.history}

    def stored(self) -> LocationStatus:
        return self.item.record.model_copy(update={"version": self.version})


class Batches:
    """:meth:`Backend.compare_and_set_many` and :meth:`Backend.create_many` over one
    :class:`Store`; a single write (``records``) for what goes alone."""

    def __init__(self, store: Store, records: Records, history: HistoryCopy) -> None:
        self.store = store
        self.records = records
        self.history = history

    # -- compare-and-set ---------------------------------------------------------------------

    def compare_and_set_many(self, items: Sequence[CasItem]) -> list[CasResult]:
        distinct_locations(item.record.location for item in items)
        out: list[CasResult | None] = [None] * len(items)
        for start in range(0, len(items), CHUNK):
            with self.store.deadline():  # one deadline per chunk (store.py)
                self._chunk(items, range(start, min(start + CHUNK, len(items))), out)
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]

    def _chunk(self, items: Sequence[CasItem], indices: range,
               out: list[CasResult | None]) -> None:
        pending: list[_Cas] = []
        for i in indices:
            item = items[i]
            if not item.history:
                out[i] = self._alone(item)  # no op_id to find it by after a lost answer
            else:
                pending.append(_Cas(i, item, write_doc(item.history, item.expected_version + 1)))
        landed: list[_Cas] = []
        for _ in range(ROUNDS):
            if not pending:
                break
            pending = self._round(pending, out, landed)
        for cas in pending:
            out[cas.index] = self._alone(cas.item)
        self._copy_history(landed)

    def _update(self, cas: _Cas) -> UpdateOne:
        window = self.store.settings.recent_history
        half = max(1, window // 2)
        return UpdateOne(
            {"_id": cas.location, "version": cas.item.expected_version,
             # at most half a window behind once written: every write the $slice may drop is
             # in the collection, and the copy is caught up before it lags further
             "history_copied": {"$gte": cas.version - half}},
            {"$set": codec.record_payload(cas.item.record), "$inc": {"version": 1},
             "$push": {"recent_history": {
                 "$each": [{"version": cas.version, "entries": cas.entries}],
                 "$slice": -window}}},
        )

    def _round(self, pending: list[_Cas], out: list[CasResult | None],
               landed: list[_Cas]) -> list[_Cas]:
        """One ``bulk_write`` of ``pending``; returns the items to send again."""
        what = f"batch compare-and-set of {len(pending)} locations"
        try:
            with self.store.io(what, write=True):
                try:
                    result = self.store.records.bulk_write(
                        [self._update(c) for c in pending], ordered=False
                    )
                    details: Mapping[str, Any] = result.bulk_api_result
                except BulkWriteError as exc:
                    details = exc.details
        except AmbiguousCommit as exc:  # the answer was lost: nothing is known
            return self._read_back(pending, out, landed, exc)
        except InvalidInput as exc:
            # the driver refused to encode an update (too large...); earlier commands of the
            # batch may have been sent: find what landed, the rest goes alone
            partly = AmbiguousCommit(f"{what}: sent in part ({exc})")
            for cas in self._read_back(pending, out, landed, partly):
                out[cas.index] = self._alone(cas.item)
            return []
        except LocstatusError as exc:  # nothing was sent
            for cas in pending:
                out[cas.index] = exc
            return []
        failed = {int(e["index"]): e for e in details.get("writeErrors", [])}
        for k, error in failed.items():
            cas = pending[k]
            out[cas.index] = _item_error(self.store, f"compare-and-set of {cas.location!r}", error)
        rest = [c for k, c in enumerate(pending) if k not in failed]
        if details.get("writeConcernErrors"):
            wce = details["writeConcernErrors"][0]
            return self._read_back(rest, out, landed, AmbiguousCommit(
                f"MongoDB at {self.store.where}: outcome of {what} unknown (write concern "
                f"error: {wce.get('errmsg', wce)})"
            ))
        if int(details.get("nMatched", -1)) == len(rest):
            for cas in rest:
                out[cas.index] = cas.stored()
                landed.append(cas)
            return []
        return self._read_back(rest, out, landed, None)

    def _read_back(self, pending: list[_Cas], out: list[CasResult | None], landed: list[_Cas],
                   unknown: AmbiguousCommit | None) -> list[_Cas]:
        """Decide each item by its record (see the module docstring). ``unknown``: the bulk's
        answer was lost (else it matched fewer items than it sent). Returns the items still at
        their expected version, to send again (after a catch-up of their history copy when the
        answer was not lost: then the filter refused them for it)."""
        if not pending:
            return []
        try:
            docs = self._records_of([c.location for c in pending])
        except LocstatusError as exc:
            for cas in pending:
                out[cas.index] = _unresolved(cas, unknown or exc)
            return []
        again: list[_Cas] = []
        for cas in pending:
            try:
                verdict = self._verdict(cas, docs.get(cas.location))
            except LocstatusError as exc:
                out[cas.index] = _unresolved(cas, unknown or exc)
                continue
            if verdict is None:
                again.append(cas)
            elif isinstance(verdict, LocationStatus):
                out[cas.index] = verdict
                landed.append(cas)
            else:
                out[cas.index] = verdict
        if unknown is None and again:
            again = self._catch_up(again, docs, out)
        return again

    def _records_of(self, locations: list[str]) -> dict[str, Doc]:
        """The records as the read back needs them, by location. A read is safe to repeat:
        after a lost answer the connection is often still coming back, so up to
        :data:`READ_BACK_ATTEMPTS` reads (pymongo retries each once), :data:`READ_BACK_PAUSE`
        seconds apart, before the items are left to the caller as :class:`AmbiguousCommit`."""
        for attempt in range(READ_BACK_ATTEMPTS):
            try:
                with self.store.io(f"read back of a batch of {len(locations)} locations"):
                    return {
                        d["_id"]: d for d in self.store.records.find(
                            {"_id": {"$in": locations}},
                            {"version": 1, "born": 1, "history_copied": 1,
                             "recent_history": {"$slice": -1}},
                            max_time_ms=self.store.mt,
                        )
                    }
            except LocstatusError:
                if attempt + 1 == READ_BACK_ATTEMPTS:
                    raise
                monotonic.sleep(READ_BACK_PAUSE)
        raise AssertionError("unreachable")  # pragma: no cover

    def _catch_up(self, refused: list[_Cas], docs: Mapping[str, Doc],
                  out: list[CasResult | None]) -> list[_Cas]:
        """The filter refused ``refused`` (still at their version): their history copies lag.
        Catch them up (together where the collection is whole, else one by one) and return
        those to send again; one that cannot catch up goes alone through the single write,
        which writes while its wider bound allows."""
        try:
            alone = set(self.history.catch_up_many([docs[c.location] for c in refused]))
        except LocstatusError as exc:
            log.warning("history of a batch not caught up together: %s", exc)
            alone = {c.location for c in refused}
        again: list[_Cas] = []
        for cas in refused:
            if cas.location in alone:
                try:
                    self.history.catch_up(cas.location)
                except LocstatusError as exc:
                    log.warning("history of %s not caught up in a batch: %s", cas.location, exc)
                    out[cas.index] = self._alone(cas.item)
                    continue
            again.append(cas)
        return again

    def _verdict(self, cas: _Cas, doc: Doc | None) -> CasResult | None:
        """The item's result from its record read back: stored, an error, or None (still at
        its expected version: not landed)."""
        if doc is None:
            return NotFound(f"unknown location {cas.location!r}")
        current = doc.get("version")
        expected = cas.item.expected_version
        if current == expected:
            return None
        if current == cas.version:
            last = writes_of(cas.location, doc.get("recent_history"))
            if last and last[-1][0] == cas.version and _op_ids(last[-1][1]) == cas.op_ids:
                return cas.stored()
        elif isinstance(current, int) and current > cas.version:
            # landed, then overwritten? the write at exactly our version says (invariant 9)
            written = self.history.write(cas.location, cas.version)
            if written and {e.op_id for e in written} == cas.op_ids:
                return cas.stored()
        return VersionConflict(
            f"location {cas.location!r} is at version {current}, expected {expected}"
        )

    def _alone(self, item: CasItem) -> CasResult:
        try:
            return self.records.compare_and_set(item.record, item.expected_version, item.history)
        except LocstatusError as exc:
            return exc

    def _copy_history(self, landed: list[_Cas]) -> None:
        """The landed writes into the history collection: one unordered ``insert_many``,
        best effort (duplicates skipped; a failure is caught up by a later write, as for a
        single write)."""
        self._insert_history(
            [{"location": c.location, "version": c.version, "entries": c.entries}
             for c in landed]
        )

    def _insert_history(self, docs: list[Doc]) -> None:
        if not docs:
            return
        try:
            with self.store.io(f"history insert of a batch of {len(docs)} writes"):
                try:
                    self.store.history.insert_many(docs, ordered=False)
                except BulkWriteError as exc:
                    errors = exc.details.get("writeErrors", [])
                    if any(e.get("code") != _DUPLICATE_KEY for e in errors) or \
                            exc.details.get("writeConcernErrors"):
                        raise
        except LocstatusError as exc:
            log.warning("history of a batch of %d writes not all copied yet (later writes "
                        "copy it): %s", len(docs), exc)

    # -- create ------------------------------------------------------------------------------

    def create_many(self, items: Sequence[CreateItem]) -> list[CasResult]:
        distinct_locations(record.location for record, _ in items)
        out: list[CasResult | None] = [None] * len(items)
        for start in range(0, len(items), CHUNK):
            with self.store.deadline():  # one deadline per chunk (store.py)
                self._create_chunk(items, range(start, min(start + CHUNK, len(items))), out)
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]

    def _create_chunk(self, items: Sequence[CreateItem], indices: range,
                      out: list[CasResult | None]) -> None:
        """First lives in three unordered inserts (counters, records, history); every other
        location through the single :meth:`Records.create`."""
        alone: list[int] = []
        first: list[int] = []
        try:
            with self.store.io(f"creation counters of a batch of {len(indices)} locations",
                               write=True):
                taken = _inserted(self.store.incarnations.insert_many,
                                  [{"_id": items[i][0].location, "n": 1} for i in indices])
        except AmbiguousCommit:
            # which counters were inserted is unknown: each goes alone (it bumps the counter
            # again: a life number wasted, never one reused)
            taken = set()
        except LocstatusError as exc:  # nothing was written
            for i in indices:
                out[i] = exc
            return
        for k, i in enumerate(indices):
            (first if k in taken else alone).append(i)
        version = LIVES.first(0)
        docs: list[Doc] = []
        entries: dict[int, list[Doc]] = {}
        for i in first:
            record, history = items[i]
            entries[i] = write_doc(history, version)
            docs.append({"_id": record.location, "version": version, "born": version,
                         **codec.record_payload(record),
                         "recent_history": [{"version": version, "entries": entries[i]}],
                         "history_copied": version - 1})
        created: list[int] = []
        if docs:
            created = self._insert_records(items, first, docs, version, out)
        self._insert_history([
            {"location": items[i][0].location, "version": version, "entries": entries[i]}
            for i in created
        ])
        for i in alone:
            out[i] = self._create_alone(items[i])

    def _insert_records(self, items: Sequence[CreateItem], first: list[int], docs: list[Doc],
                        version: int, out: list[CasResult | None]) -> list[int]:
        """Insert the records of ``first``; returns the indices created."""
        what = f"create of a batch of {len(docs)} locations"
        unknown: LocstatusError | None = None
        partly: LocstatusError | None = None
        failed: dict[int, Mapping[str, Any]] = {}
        try:
            with self.store.io(what, write=True):
                try:
                    self.store.records.insert_many(docs, ordered=False)
                except BulkWriteError as exc:
                    failed = {int(e["index"]): e for e in exc.details.get("writeErrors", [])}
                    if exc.details.get("writeConcernErrors"):
                        unknown = AmbiguousCommit(f"outcome of {what} unknown (write concern)")
        except AmbiguousCommit as exc:
            unknown = exc
        except InvalidInput as exc:
            # the driver refused to encode a record: the others may have been sent in part;
            # those not stored go alone (the one refused gets its own InvalidInput there)
            unknown = partly = AmbiguousCommit(f"{what}: sent in part ({exc})")
        except LocstatusError as exc:  # nothing sent (or refused whole)
            for i in first:
                out[i] = exc
            return []
        created: list[int] = []
        check: list[int] = []
        for k, i in enumerate(first):
            loc = items[i][0].location
            error = failed.get(k)
            if error is not None and error.get("code") == _DUPLICATE_KEY:
                out[i] = AlreadyExists(f"location {loc!r} already exists")
            elif error is not None:
                out[i] = _item_error(self.store, f"create of {loc!r}", error)
            elif unknown is not None:
                check.append(i)
            else:
                out[i] = items[i][0].model_copy(update={"version": version})
                created.append(i)
        if check:
            created += self._created_after_all(items, check, version, out, unknown)
        if partly is not None:
            for i in check:
                if isinstance(out[i], BackendUnavailable):  # not stored: alone
                    out[i] = self._create_alone(items[i])
        return created

    def _create_alone(self, item: CreateItem) -> CasResult:
        try:
            return self.records.create(*item)
        except LocstatusError as exc:
            return exc

    def _created_after_all(
        self, items: Sequence[CreateItem], check: list[int], version: int,
        out: list[CasResult | None], unknown: LocstatusError | None,
    ) -> list[int]:
        """After a lost answer: a record born at ``version`` is ours (the counter value 1 was
        this call's), another one a racing creator's, none a create that did not complete."""
        locs = [items[i][0].location for i in check]
        try:
            with self.store.io(f"re-read after a create of {len(locs)} locations"):
                born = {d["_id"]: d.get("born") for d in self.store.records.find(
                    {"_id": {"$in": locs}}, {"born": 1}, max_time_ms=self.store.mt)}
        except LocstatusError as exc:
            for i in check:
                out[i] = AmbiguousCommit(f"create of {items[i][0].location!r}: outcome "
                                         f"unknown ({unknown}); re-read failed: {exc}")
            return []
        created: list[int] = []
        for i in check:
            loc = items[i][0].location
            if loc not in born:
                out[i] = BackendUnavailable(f"create of {loc!r} did not complete: {unknown}")
            elif born[loc] != version:
                out[i] = AlreadyExists(f"location {loc!r} already exists")
            else:
                out[i] = items[i][0].model_copy(update={"version": version})
                created.append(i)
        return created


def _inserted(insert: Callable[..., Any], docs: list[Doc]) -> set[int]:
    """Indices of ``docs`` an unordered insert stored (duplicates left out); raises
    :class:`BulkWriteError` for any other failure."""
    try:
        insert(docs, ordered=False)
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if exc.details.get("writeConcernErrors") or any(
            e.get("code") != _DUPLICATE_KEY for e in errors
        ):
            raise
        dup = {int(e["index"]) for e in errors}
        return {k for k in range(len(docs)) if k not in dup}
    return set(range(len(docs)))


def _op_ids(raw: object) -> set[str]:
    written = raw if isinstance(raw, list) else []
    return {str(e.get("op_id")) for e in written if isinstance(e, dict)}


def _item_error(store: Store, what: str, error: Mapping[str, Any]) -> LocstatusError:
    """One item's write error (nothing written for it)."""
    code, message = error.get("code"), short(Exception(error.get("errmsg", "")))
    if code in _TOO_LARGE:
        return InvalidInput(f"{what}: the document is too large for MongoDB ({message}; a "
                            "document holds at most 16 MB); nothing was written")
    return BackendUnavailable(f"MongoDB at {store.where} refused {what}: {message} "
                              f"(code {code})")


def _unresolved(cas: _Cas, cause: LocstatusError) -> LocstatusError:
    """An item whose outcome could not be read back."""
    if isinstance(cause, AmbiguousCommit):
        return AmbiguousCommit(f"location {cas.location!r}: {cause}; the write may or may not "
                               "have been applied: look for its op_id in the history")
    return AmbiguousCommit(f"location {cas.location!r}: the batch was sent, but which of its "
                           f"writes landed could not be read back ({cause})")


__all__ = ["CHUNK", "Batches"]
