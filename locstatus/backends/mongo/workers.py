"""Worker registrations and acknowledgements on MongoDB (docs/mongodb.md, "Workers, leases,
acknowledgements").

Why it is shaped so:

- **Workers** are heartbeat documents ``{_id: worker_id, info, expires_at}`` with a TTL index on
  ``expires_at`` (``expireAfterSeconds=worker_ttl``, default 3600 s after the lease ran out).
  TTL deletion is lazy (MongoDB sweeps once a minute), so nothing trusts a document's presence:
  readers test ``lease_expires_at`` explicitly (:meth:`WorkerInfo.alive`), and an expired worker
  stays listed with its past lease until the sweep, which lets the check job report it. A
  standing registration (docs/agent.md "Standing registrations") has no ``expires_at``: its
  lease deadline is kept in ``info`` alone, so the TTL monitor never deletes it.
- **Acknowledgements** live in ``<collection>_acks``, ``_id = "location/worker/service"``, each
  judged on the record read just before it is written (never ahead of it) and stamped with
  that record's life (its ``born``): reads count only those of the record's current life, so
  an earlier life's never counts and ``create`` deletes them only once its own record is stored
  (a losing creator once deleted the winner's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, ReplaceOne
from pymongo.errors import BulkWriteError, DuplicateKeyError

from locstatus.backends import codec
from locstatus.backends.base import (
    AckItem,
    AckMap,
    AckResult,
    ack_each,
    check_ack,
    stale_ack,
)
from locstatus.backends.mongo.store import Doc, Store
from locstatus.errors import BackendUnavailable, LocstatusError
from locstatus.models import LocationStatus, WorkerInfo

log = logging.getLogger(__name__)


class Workers:
    """The registrations and acknowledgements of one
    :class:`~locstatus.backends.mongo.store.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def put(self, info: WorkerInfo) -> None:
        """:meth:`Backend.put_worker`: one upsert of the heartbeat document."""
        stored, _ = codec.bounded_worker(info)  # errors trimmed; InvalidInput if too large
        doc: Doc = {
            "_id": info.worker_id,
            "info": stored.model_dump(mode="json", exclude=codec.not_stored(stored)),
        }
        if info.lease_expires_at is not None and not info.standing:
            # the TTL field; a standing registration carries none (it outlives its lease, its
            # deadline kept in ``info`` only), so the TTL monitor never deletes it
            doc["expires_at"] = info.lease_expires_at
        # an ordinary registration never replaces a standing one (docs/agent.md "Standing
        # registrations"): the filter leaves it out, so the upsert's insert of the same _id
        # fails with a duplicate key, and nothing is written
        query: Doc = {"_id": info.worker_id}
        if not info.standing:
            query["info.standing"] = {"$ne": True}
        with self.store.io(f"registration of worker {info.worker_id!r}"):
            try:
                self.store.workers.replace_one(query, doc, upsert=True)
            except DuplicateKeyError:
                raise codec.standing_refusal(info.worker_id, registering=True) from None

    def remove(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        """See :meth:`Backend.remove_worker`. With ``if_expires``: read the registration, and
        delete it only while its whole stored document is still the one read (a renewal or a
        new registration rewrites it); the acknowledgements go in a second request, so a
        worker registering again in between may lose acknowledgements it wrote then: a live
        worker missing an acknowledgement is waited for (safe), never settled without.
        Without ``retire`` a standing registration is left out by the delete's filter, and
        kept with its acknowledgements."""
        with self.store.io(f"removal of worker {worker_id!r}"):
            if if_expires is None and retire:
                removed = self.store.workers.delete_one({"_id": worker_id}).deleted_count > 0
            elif if_expires is None:
                removed = self.store.workers.delete_one(
                    {"_id": worker_id, "info.standing": {"$ne": True}}
                ).deleted_count > 0
                if not removed and self.store.workers.find_one(
                    {"_id": worker_id, "info.standing": True}, max_time_ms=self.store.mt
                ) is not None:
                    return False  # standing: only a retirement ends it
            else:
                doc = self.store.workers.find_one({"_id": worker_id}, max_time_ms=self.store.mt)
                if doc is None or not codec.is_registration(
                    worker_id, doc.get("info"), if_expires, retire=retire
                ):
                    return False
                removed = self.store.workers.delete_one(
                    {"_id": worker_id, "info": doc.get("info")}
                ).deleted_count > 0
                if not removed:
                    return False  # rewritten since it was read: renewed or registered again
            self.store.acks.delete_many({"worker_id": worker_id})
        return removed

    def listed(self) -> list[WorkerInfo]:
        """:meth:`Backend.workers`, sorted by id."""
        with self.store.io("read of workers"):
            docs = list(
                self.store.workers.find({}, max_time_ms=self.store.mt).sort("_id", ASCENDING)
            )
        # An unreadable document is listed as the live worker it may be, never left out and
        # never an error hiding the others (codec.corrupt_worker).
        return [codec.decode_worker(str(doc.get("_id")), doc.get("info")) for doc in docs]

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
        decode: Callable[[Mapping[str, Any]], LocationStatus],
    ) -> None:
        """Read the record (its version for ``if_version``, its generations, its life), judge
        the acknowledgement on it (contract invariant 13, :func:`check_ack`), then write it
        stamped with that life (``born``): an acknowledgement read for another life of the
        record never counts (:meth:`acks`), and within one life generations only grow, so a
        generation the record had at the read it still has at the write (no multi-document
        transaction needed). ``decode`` reads a record document (:meth:`Records.decode`).
        Raises :class:`VersionConflict` (nothing written: no record, not at ``if_version``, a
        generation it does not have), :class:`CorruptRecord`, :class:`BackendUnavailable`."""
        with self.store.io(f"read of {location!r}"):
            doc = self.store.records.find_one(
                {"_id": location}, {"recent_history": 0}, max_time_ms=self.store.mt
            )
        if if_version is not None and (doc is None or doc.get("version") != if_version):
            raise stale_ack(location, if_version)
        check_ack(location, None if doc is None else decode(doc), service, generation, if_version)
        assert doc is not None  # check_ack refuses a missing record
        ack: Doc = {"location": location, "worker_id": worker_id, "service": service,
                    "generation": generation}
        if _is_int(doc.get("born")):
            ack["born"] = doc["born"]
        with self.store.io(f"ack of {location!r}/{service} by {worker_id!r}"):
            self.store.acks.replace_one(
                {"_id": f"{location}/{worker_id}/{service}"}, ack, upsert=True
            )

    def ack_many(
        self, worker_id: str, items: Sequence[AckItem], *,
        decode: Callable[[Mapping[str, Any]], LocationStatus], chunk: int = 1000,
    ) -> list[AckResult]:
        """:meth:`ack` of each item, ``chunk`` at a time: the records of a chunk read with one
        ``find({_id: {$in}})``, each item judged on its record as :meth:`ack` judges it, then
        the accepted ones written with one unordered ``bulk_write`` of the same upserting
        ``replace_one`` each, stamped with its record's life (docs/agent.md "Bursts": one by
        one, a burst of 10 000 acknowledgements was 20 000 round trips per worker). An item
        whose write the server refused, and a second item of one acknowledgement document in
        the chunk, go alone through :meth:`ack` after it. A read or a ``bulk_write`` that
        failed as a whole gives each of its items the error (an acknowledgement is idempotent:
        the agent writes it again)."""
        out: list[AckResult] = [None] * len(items)
        for start in range(0, len(items), chunk):
            part = range(start, min(start + chunk, len(items)))
            alone = self._ack_chunk(worker_id, items, part, out, decode)
            ack_each(
                lambda item: self.ack(worker_id, item.location, item.service, item.generation,
                                      if_version=item.if_version, decode=decode),
                items, alone, out,
            )
        return out

    def _ack_chunk(
        self, worker_id: str, items: Sequence[AckItem], part: range, out: list[AckResult],
        decode: Callable[[Mapping[str, Any]], LocationStatus],
    ) -> list[int]:
        """One chunk of :meth:`ack_many`; returns the indexes of the items to write alone."""
        locations = list(dict.fromkeys(items[n].location for n in part))
        try:
            with self.store.io(f"read of {len(locations)} locations to acknowledge"):
                docs = {d["_id"]: d for d in self.store.records.find(
                    {"_id": {"$in": locations}}, {"recent_history": 0},
                    max_time_ms=self.store.mt,
                )}
        except LocstatusError as exc:
            for n in part:
                out[n] = exc
            return []
        writes: list[ReplaceOne[Doc]] = []
        sent: list[int] = []
        alone: list[int] = []
        ids: set[str] = set()
        for n in part:
            item = items[n]
            doc = docs.get(item.location)
            try:
                if item.if_version is not None and (
                    doc is None or doc.get("version") != item.if_version
                ):
                    raise stale_ack(item.location, item.if_version)
                check_ack(item.location, None if doc is None else decode(doc), item.service,
                          item.generation, item.if_version)
            except LocstatusError as exc:
                out[n] = exc
                continue
            assert doc is not None  # check_ack refuses a missing record
            ack_id = f"{item.location}/{worker_id}/{item.service}"
            if ack_id in ids:  # an unordered bulk may apply two writes of one id in any order
                alone.append(n)
                continue
            ids.add(ack_id)
            ack: Doc = {"location": item.location, "worker_id": worker_id,
                        "service": item.service, "generation": item.generation}
            if _is_int(doc.get("born")):
                ack["born"] = doc["born"]
            writes.append(ReplaceOne({"_id": ack_id}, ack, upsert=True))
            sent.append(n)
        if not writes:
            return alone
        try:
            with self.store.io(f"{len(writes)} acknowledgements by {worker_id!r}"):
                try:
                    self.store.acks.bulk_write(writes, ordered=False)
                    refused: set[int] = set()
                except BulkWriteError as exc:
                    refused = {int(e["index"]) for e in exc.details.get("writeErrors", [])}
                    if exc.details.get("writeConcernErrors"):
                        raise BackendUnavailable(
                            f"MongoDB at {self.store.where}: {len(writes)} acknowledgements "
                            f"by {worker_id!r}: write concern error "
                            f"{exc.details['writeConcernErrors'][0].get('errmsg', '')}"
                        ) from exc
        except LocstatusError as exc:
            for n in sent:
                out[n] = exc
            return alone
        alone.extend(sent[k] for k in sorted(refused))  # e.g. two upserts racing: again alone
        return sorted(alone)

    def acks(self, location: str) -> AckMap:
        """The acknowledgements of the record's current life: the record's ``born`` is read
        first, and one stamped with another life is left out (an earlier life's, left by an
        interrupted purge or a record deleted by hand; one written just after a purge by a
        worker that read the record before it). One with no life (written before
        acknowledgements carried one) counts, as it always did."""
        with self.store.io(f"read of acks of {location!r}"):
            rec = self.store.records.find_one(
                {"_id": location}, {"born": 1}, max_time_ms=self.store.mt
            )
            docs = list(self.store.acks.find({"location": location}, {"_id": 0},
                                        max_time_ms=self.store.mt))
        if rec is None:
            return {}
        out: AckMap = {}
        for d in docs:
            key = _ack_key(d, rec.get("born"))
            if key is not None:
                out.setdefault(key[1], {})[key[2]] = key[3]
        return out

    def all_acks(self) -> dict[str, AckMap]:
        """:meth:`acks` of every record (two reads: every record's ``born``, every ack)."""
        with self.store.io("read of every ack"):
            born = {
                d["_id"]: d.get("born")
                for d in self.store.records.find({}, {"born": 1}, max_time_ms=self.store.mt)
            }
            docs = list(self.store.acks.find({}, {"_id": 0}, max_time_ms=self.store.mt))
        out: dict[str, AckMap] = {}
        for d in docs:
            location = d.get("location")
            if location not in born:
                continue
            key = _ack_key(d, born[location])
            if key is not None:
                out.setdefault(key[0], {}).setdefault(key[1], {})[key[2]] = key[3]
        return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ack_key(doc: Mapping[str, Any], life: object) -> tuple[str, str, str, int] | None:
    """``(location, worker_id, service, generation)`` of an acknowledgement document of the
    record life ``life`` (the record's ``born``), or None: stamped with another life, or a
    field missing or of the wrong type (a hand edit: an unreadable acknowledgement acknowledges
    nothing, contract invariant 6, and never hides the others)."""
    if "born" in doc and _is_int(life) and doc["born"] != life:
        return None  # another life of the record
    location, worker, service = doc.get("location"), doc.get("worker_id"), doc.get("service")
    gen = codec.ack_generation(doc.get("generation"))
    if (
        isinstance(location, str) and isinstance(worker, str) and isinstance(service, str)
        and gen is not None
    ):
        return location, worker, service, gen
    log.warning("ignoring an unreadable acknowledgement: %r", dict(doc))
    return None
