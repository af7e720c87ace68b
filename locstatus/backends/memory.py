"""``memory://[name]``: an in-process backend for unit tests and simulation.

It keeps the same encoded payloads as the durable backends (so corrupt data can be injected and
decoding is exercised) under one lock, and honours the whole contract of
:class:`~locstatus.backends.base.Backend`. ``memory://name`` shares one store between every
backend opened with that name in the process (several managers and agents in one test);
``memory://`` is private. Hints are delivered on the writer's own thread, after its write
(:class:`~locstatus.backends.hints.Subscribers`: a subscriber that raises never fails the write).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from locstatus.backends import codec
from locstatus.backends.base import (
    AckItem,
    AckMap,
    AckResult,
    Backend,
    HintCallback,
    ReadResult,
    ScanItem,
    Unsubscribe,
    check_ack,
    stale_ack,
    stale_version,
)
from locstatus.backends.hints import Subscribers
from locstatus.backends.history import HistoryPage
from locstatus.backends.versions import LIVES
from locstatus.errors import (
    AlreadyExists,
    BackendUnavailable,
    CorruptRecord,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.models import Hint, HistoryEntry, LocationStatus, WorkerInfo, utcnow


@dataclass
class _Store:
    lock: threading.Lock = field(default_factory=threading.Lock)
    records: dict[str, tuple[int, str]] = field(default_factory=dict)
    history: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    workers: dict[str, str] = field(default_factory=dict)
    acks: dict[str, AckMap] = field(default_factory=dict)
    subscribers: Subscribers = field(default_factory=lambda: Subscribers("memory://"))
    incarnation: int = 0
    """Versions of a recreated record start above every earlier one (contract invariant 1)."""


def _readable(per_worker: AckMap) -> AckMap:
    """A copy of one location's acknowledgements without the unreadable ones (a generation
    that is not an integer, as a test writes it into the store): they acknowledge nothing."""
    out: AckMap = {}
    for worker, services in per_worker.items():
        for service, raw in services.items():
            gen = codec.ack_generation(raw)
            if gen is not None:
                out.setdefault(worker, {})[service] = gen
    return out


_SHARED: dict[str, _Store] = {}
_SHARED_LOCK = threading.Lock()


class MemoryBackend(Backend):
    """In-process backend. ``MemoryBackend("memory://test")`` shares the store named test."""

    local_clock = True
    clock_resolution = 0.0
    local_reads = True

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        name = url.removeprefix("memory://").strip("/")
        if name:
            with _SHARED_LOCK:
                self._store = _SHARED.setdefault(name, _Store())
        else:
            self._store = _Store()
        self._closed = False

    # -- helpers ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable(f"backend {self.url} is closed")

    def _notify(self, hint: Hint) -> None:
        self._store.subscribers.emit(hint)

    def _decode(self, location: str) -> LocationStatus:
        try:
            version, raw = self._store.records[location]
        except KeyError:
            raise NotFound(f"unknown location {location!r}") from None
        return codec.decode_record(location, version, raw)

    # -- records ---------------------------------------------------------------------------

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        self._check_open()
        loc = record.location
        with self._store.lock:
            if loc in self._store.records:
                raise AlreadyExists(f"location {loc!r} already exists")
            self._store.incarnation += 1
            version = LIVES.first(self._store.incarnation - 1)
            self._store.records[loc] = (version, codec.encode_record(record))
            stamped = codec.encode_history(codec.stamp(history, version))
            self._store.history[loc] = [(version, stamped)]
        self._notify(Hint(kind="location", location=loc))
        return record.model_copy(update={"version": version})

    def read(self, location: str) -> LocationStatus:
        self._check_open()
        with self._store.lock:
            return self._decode(location)

    def read_many(self, locations: Sequence[str]) -> list[ReadResult]:
        """One hold of the lock for the batch; decoded outside it."""
        self._check_open()
        with self._store.lock:
            raws = [self._store.records.get(loc) for loc in locations]
        return [
            NotFound(f"unknown location {loc!r}")
            if raw is None
            else codec.decode_record_or_error(loc, *raw)
            for loc, raw in zip(locations, raws, strict=True)
        ]

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        return [rec for rec, _ in self._snapshot(with_history=False)]

    def scan_with_history(self) -> list[ScanItem]:
        return self._snapshot(with_history=True)

    def _snapshot(self, *, with_history: bool) -> list[ScanItem]:
        self._check_open()
        with self._store.lock:
            items = sorted(self._store.records.items())
            newest = (
                {  # the newest writes, newest first, as (version, text)
                    loc: writes[-1:-5:-1] for loc, writes in self._store.history.items()
                }
                if with_history
                else {}
            )
        out: list[ScanItem] = []
        for loc, (version, raw) in items:
            rec = codec.decode_record_or_error(loc, version, raw)
            if not with_history:
                out.append((rec, None))
                continue
            out.append((rec, codec.decode_newest_writes(loc, rec, newest.get(loc, ()))))
        return out

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        self._check_open()
        loc = record.location
        with self._store.lock:
            current = self._store.records.get(loc)
            if current is None:
                raise NotFound(f"unknown location {loc!r}")
            if current[0] != expected_version:
                raise stale_version(
                    f"location {loc!r} is at version {current[0]}, expected {expected_version}",
                    codec.decode_record_or_error(loc, *current),
                )
            version = expected_version + 1
            self._store.records[loc] = (version, codec.encode_record(record))
            if history:
                self._store.history.setdefault(loc, []).append(
                    (version, codec.encode_history(codec.stamp(history, version)))
                )
        self._notify(Hint(kind="location", location=loc))
        return record.model_copy(update={"version": version})

    def delete(self, location: str, expected_version: int) -> None:
        self._check_open()
        with self._store.lock:
            current = self._store.records.get(location)
            if current is None:
                raise NotFound(f"unknown location {location!r}")
            if current[0] != expected_version:
                raise VersionConflict(
                    f"location {location!r} is at version {current[0]}, expected {expected_version}"
                )
            del self._store.records[location]
            self._store.history.pop(location, None)
            self._store.acks.pop(location, None)
        self._notify(Hint(kind="location", location=location))

    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        self._check_open()
        with self._store.lock:
            writes = list(self._store.history.get(location, ()))
        page = HistoryPage(location, limit, before=before_version)
        page.take(reversed(writes))
        return page.entries

    def history_write(self, location: str, version: int) -> list[HistoryEntry]:
        self._check_open()
        with self._store.lock:
            raw = next((t for v, t in self._store.history.get(location, ()) if v == version), None)
        if raw is None:
            return []
        return list(reversed(codec.decode_history(location, raw, version)))

    # -- workers -----------------------------------------------------------------------------

    def put_worker(self, info: WorkerInfo) -> None:
        self._check_open()
        data = codec.encode_worker(info)
        with self._store.lock:  # judged and written under the store's one lock
            if codec.refuses_put(info.worker_id, self._store.workers.get(info.worker_id), info):
                raise codec.standing_refusal(info.worker_id, registering=True)
            self._store.workers[info.worker_id] = data
        self._notify(Hint(kind="workers"))

    def remove_worker(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        self._check_open()
        with self._store.lock:
            raw = self._store.workers.get(worker_id)
            if raw is None or not codec.is_registration(worker_id, raw, if_expires, retire=retire):
                return False
            del self._store.workers[worker_id]
            for per_loc in self._store.acks.values():
                per_loc.pop(worker_id, None)
        self._notify(Hint(kind="workers"))
        return True

    def workers(self) -> list[WorkerInfo]:
        self._check_open()
        with self._store.lock:
            raws = sorted(self._store.workers.items())
        return [codec.decode_worker(wid, raw) for wid, raw in raws]

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        self._check_open()
        with self._store.lock:  # judged and written under the store's one lock (invariant 13)
            current = self._store.records.get(location)
            if if_version is not None and (current is None or current[0] != if_version):
                raise stale_ack(location, if_version)
            record = None if current is None else self._decode(location)
            check_ack(location, record, service, generation, if_version)
            per_worker = self._store.acks.setdefault(location, {}).setdefault(worker_id, {})
            per_worker[service] = generation
        self._notify(Hint(kind="acks", location=location))

    def ack_many(self, worker_id: str, items: Sequence[AckItem]) -> list[AckResult]:
        """One hold of the lock for the batch, each item checked as :meth:`ack` checks it."""
        self._check_open()
        out: list[AckResult] = []
        with self._store.lock:
            for item in items:
                current = self._store.records.get(item.location)
                if item.if_version is not None and (
                    current is None or current[0] != item.if_version
                ):
                    out.append(stale_ack(item.location, item.if_version))
                    continue
                try:
                    record = None if current is None else self._decode(item.location)
                    check_ack(item.location, record, item.service, item.generation,
                              item.if_version)
                except LocstatusError as exc:  # corrupt, or a generation it does not have
                    out.append(exc)
                    continue
                acks = self._store.acks.setdefault(item.location, {})
                acks.setdefault(worker_id, {})[item.service] = item.generation
                out.append(None)
        written = (i.location for i, r in zip(items, out, strict=True) if r is None)
        for location in dict.fromkeys(written):
            self._notify(Hint(kind="acks", location=location))
        return out

    def acks(self, location: str) -> AckMap:
        self._check_open()
        with self._store.lock:
            return _readable(self._store.acks.get(location, {}))

    def all_acks(self) -> dict[str, AckMap]:
        self._check_open()
        with self._store.lock:
            return {loc: _readable(per) for loc, per in self._store.acks.items()}

    # -- hints -----------------------------------------------------------------------------

    def subscribe(
        self, callback: HintCallback, *, kinds: Collection[str] | None = None
    ) -> Unsubscribe:
        """Every kind is delivered (``kinds`` is advisory; a hint costs nothing here)."""
        return self._store.subscribers.add(callback)

    def probe_time(self) -> datetime:
        """The store lives in this process: its time is this process's clock."""
        self._check_open()
        return utcnow()

    def ping(self) -> None:
        self._check_open()

    def close(self) -> None:
        self._closed = True

    # -- test hooks ------------------------------------------------------------------------

    def write_raw(self, location: str, payload: str) -> None:
        """Store ``payload`` verbatim as the record of ``location`` (corruption tests)."""
        with self._store.lock:
            version = self._store.records.get(location, (0, ""))[0] + 1
            self._store.records[location] = (version, payload)
        self._notify(Hint(kind="location", location=location))
