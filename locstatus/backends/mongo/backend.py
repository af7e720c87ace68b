"""The MongoDB backend: :class:`MongoBackend`, the contract of
:class:`~locstatus.backends.base.Backend` over one pymongo client.

Why it is shaped so: like the ZooKeeper package, the class here is thin, each public method one
call into the part that does it (:class:`~.records.Records`, :class:`~.history.HistoryCopy`,
:class:`~.workers.Workers`, :class:`~.watch.Watcher`), all over one
:class:`~.store.Store`, the single edge where pymongo's errors become locstatus errors. What is
left here is the lifecycle: connect, create the indexes, tell the time, close without hanging
on a server that does not answer.
"""

from __future__ import annotations

import collections.abc as cabc
import threading
from collections.abc import Sequence
from datetime import UTC, datetime

from locstatus.backends.base import (
    AckItem,
    AckMap,
    AckResult,
    Backend,
    CasItem,
    CasResult,
    CreateItem,
    HintCallback,
    HistoryGaps,
    ReadResult,
    Unsubscribe,
)
from locstatus.backends.mongo.batches import CHUNK, Batches
from locstatus.backends.mongo.history import HistoryCopy
from locstatus.backends.mongo.records import Records
from locstatus.backends.mongo.store import Store
from locstatus.backends.mongo.url import parse_mongo_url
from locstatus.backends.mongo.watch import Watcher
from locstatus.backends.mongo.workers import Workers
from locstatus.errors import BackendUnavailable, CorruptRecord
from locstatus.models import HistoryEntry, LocationStatus, WorkerInfo

_CLOSE_WAIT = 0.2
"""Seconds :meth:`MongoBackend.close` waits for the driver's own close (one round trip to a
server that answers) before leaving it to finish in the background."""


class MongoBackend(Backend):
    """MongoDB backend (docs/design.md §4). Safe for many threads and processes on many hosts.

    Usage::

        backend = MongoBackend("mongodb://db1:27017,db2:27017/?replicaSet=rs0"
                               "&database=locstatus&collection=locations")
        rec = backend.read("us-east-1")
        backend.compare_and_set(new_rec, rec.version, [entry])  # VersionConflict if raced

    Raises :class:`InvalidInput` for a malformed URL or name and :class:`BackendUnavailable`
    (naming the server) when no server answers within ``serverSelectionTimeoutMS``.
    """

    two_history_copies = True  # embedded recent history + the history collection
    batch_size = CHUNK  # locations per bulk_write (batches.py)

    def __init__(self, url: str) -> None:
        self.url = url
        self.settings = parse_mongo_url(url)
        self._store = store = Store(self.settings, url)
        self._history = HistoryCopy(store)
        self._records = Records(store, self._history)
        self._batches = Batches(store, self._records, self._history)
        self._workers = Workers(store)
        self._watcher = Watcher(store)
        try:
            store.ensure_indexes()
        except BaseException:
            store.client.close()
            raise

    @property
    def hint_mode(self) -> str | None:
        """``changestream`` or ``poll`` once hints are armed (for operators and tests)."""
        return self._watcher.mode

    # -- records (records.py) and history (history.py) -------------------------------------

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        with self._store.deadline():  # one deadline for the whole call
            return self._records.create(record, history)

    def read(self, location: str) -> LocationStatus:
        with self._store.deadline():  # one deadline for the whole call
            return self._records.read(location)

    def read_many(self, locations: cabc.Sequence[str]) -> list[ReadResult]:
        """See :meth:`Records.read_many` (``$in`` queries)."""
        return self._records.read_many(locations)

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        return self._records.read_all()

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        """One ``findAndModify`` (see :mod:`~locstatus.backends.mongo.records`), then this
        write's copy to the history collection, and every ``recent_history // 2`` writes a
        catch-up (:meth:`HistoryCopy.catch_up`)."""
        with self._store.deadline():  # one deadline for the whole call
            return self._records.compare_and_set(record, expected_version, history)

    def compare_and_set_many(self, items: Sequence[CasItem]) -> list[CasResult]:
        """Unordered ``bulk_write`` of version-guarded updates, :data:`CHUNK` at a time, then
        one history insert per chunk (see :mod:`~locstatus.backends.mongo.batches`)."""
        return self._batches.compare_and_set_many(items)

    def create_many(
        self, items: Sequence[CreateItem], *, texts: Sequence[tuple[str, str]] | None = None
    ) -> list[CasResult]:
        """Unordered inserts of first lives; other locations through :meth:`create` (see
        :mod:`~locstatus.backends.mongo.batches`)."""
        return self._batches.create_many(items)  # documents, not texts

    def delete(self, location: str, expected_version: int) -> None:
        with self._store.deadline():  # one deadline for the whole call
            self._records.delete(location, expected_version)

    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        with self._store.deadline():  # one deadline for the whole call
            return self._history.page(location, limit=limit, before_version=before_version)

    def history_write(self, location: str, version: int) -> list[HistoryEntry]:
        """The embedded copy when it still holds ``version`` (the authoritative one, and the
        only one after a crash between the two writes), else the history collection."""
        with self._store.deadline():  # one deadline for the whole call
            return self._history.write(location, version)

    def history_gaps(self, location: str) -> HistoryGaps:
        """See :meth:`HistoryCopy.gaps`."""
        with self._store.deadline():  # one deadline for the whole call
            return self._history.gaps(location)

    def restore_history(self, location: str) -> list[int]:
        with self._store.deadline():  # one deadline for the whole call
            return self._history.catch_up(location)

    # -- workers and acknowledgements (workers.py) -------------------------------------------

    def put_worker(self, info: WorkerInfo) -> None:
        with self._store.deadline():  # one deadline for the whole call
            self._workers.put(info)

    def remove_worker(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        """See :meth:`Backend.remove_worker` and :meth:`Workers.remove`."""
        with self._store.deadline():  # one deadline for the whole call
            return self._workers.remove(worker_id, if_expires=if_expires, retire=retire)

    def workers(self) -> list[WorkerInfo]:
        return self._workers.listed()

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        """See :meth:`Workers.ack`: judged on the record read just before the write (invariant
        13) and stamped with its life."""
        with self._store.deadline():  # one deadline for the whole call
            self._workers.ack(
                worker_id, location, service, generation, if_version=if_version,
                decode=self._records.decode,
            )

    def ack_many(self, worker_id: str, items: Sequence[AckItem]) -> list[AckResult]:
        """See :meth:`Workers.ack_many`: per 1 000 items one read of their records and one
        unordered ``bulk_write`` of the acknowledgements, each judged as :meth:`ack` judges
        it."""
        return self._workers.ack_many(worker_id, items, decode=self._records.decode)

    def acks(self, location: str) -> AckMap:
        with self._store.deadline():  # one deadline for the whole call
            return self._workers.acks(location)

    def all_acks(self) -> dict[str, AckMap]:
        return self._workers.all_acks()

    # -- hints (watch.py) --------------------------------------------------------------------

    def subscribe(
        self, callback: HintCallback, *, kinds: cabc.Collection[str] | None = None
    ) -> Unsubscribe:
        """Every kind is delivered (``kinds`` is advisory: one stream carries them all)."""
        if self._store.closed:
            raise BackendUnavailable(f"MongoDB backend {self.settings.where} is closed")
        return self._watcher.subscribe(callback)

    # -- lifecycle ---------------------------------------------------------------------------

    def probe_time(self) -> datetime:
        """The server's time: ``localTime`` of its ``hello`` reply (milliseconds; on a replica
        set the primary's clock, the one its TTL monitor expires worker documents by;
        docs/time.md)."""
        store = self._store
        with store.deadline(), store.io("read of the server's time"):
            hello = store.client.admin.command("hello", maxTimeMS=store.mt)
        at = hello.get("localTime")
        if not isinstance(at, datetime):
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} answered hello without its localTime "
                f"({type(at).__name__}): cannot read its time"
            )
        # command() decodes with the driver's default codec options: a BSON date, which is
        # always UTC, comes back naive
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)

    def ping(self) -> None:
        store = self._store
        with store.deadline(), store.io("ping"):
            store.client.admin.command("ping", maxTimeMS=store.mt)

    def close(self) -> None:
        """Stop the hints and close the client. Returns within :data:`_CLOSE_WAIT` seconds
        even while the server is down or frozen (a process shutting down during an outage
        must not hang on it): whatever of the driver's close is left then (ending its server
        sessions, which needs the server) goes on in the background, bounded by
        :data:`~locstatus.backends.mongo.store.CLOSE_TIMEOUT`. Once closed, every call raises
        :class:`BackendUnavailable` and no hint is delivered."""
        store = self._store
        if store.closed:
            return
        self._watcher.stop()
        store.closed = True
        # The driver's close() first sends endSessions, which selects a server: with none
        # reachable that waits out the operation timeout (in the driver's 0.5 s steps, so 0.5
        # to 1 s for CLOSE_TIMEOUT), and on a frozen server the command waits for a reply.
        # The driver ignores that command's errors anyway; close() does not wait for them.
        closing = threading.Thread(
            target=store.close_client, name="locstatus-mongo-close", daemon=True
        )
        closing.start()
        closing.join(_CLOSE_WAIT)
        # The hint thread is not waited for either (Watcher.stop): it delivers nothing more.
