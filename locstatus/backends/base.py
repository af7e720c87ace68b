"""The storage contract every backend implements (docs/design.md §4). Backends know nothing of the
state machine: they store versioned location records, their history, worker leases and
acknowledgements, and emit change hints.

Invariants (checked by ``tests/test_backend_contract.py``, one suite run against every backend):

1. **Compare-and-set.** :meth:`Backend.compare_and_set` writes only if the stored version equals
   ``expected_version``, and the new version is exactly ``expected_version + 1``. Otherwise it
   raises :class:`VersionConflict` (or :class:`NotFound` if the record is gone) and writes
   nothing. A record deleted and created again never matches a version of its earlier life.
2. **Atomic state and history.** The record and its history entries are one atomic write: there
   is never a state change without its history, nor the reverse. The backend stamps each entry
   with the version the write produced.
3. **Versions strictly increase** per record; history pages come newest first, whole writes at a
   time.
4. **Ambiguity is reported, not hidden.** If a write's outcome is unknown (connection lost after
   send), the backend raises :class:`AmbiguousCommit`; the manager resolves it by reading the
   history write at the version the write would have produced and looking for its op_id there
   (invariant 9). :class:`BackendUnavailable` means nothing was sent or the backend is down.
5. **Corrupt data never breaks its neighbours.** :meth:`read` raises :class:`CorruptRecord` naming
   the location; :meth:`read_all` returns the error in place of that record and carries on.
6. **Leases.** A worker is alive while its lease holds (``lease_expires_at`` ahead of the store's
   time, invariant 11, or a session-held registration that is still listed). Removing a worker
   removes its acknowledgements. An expired worker is either listed with its past lease or not
   listed. A registration is stored bounded the same way everywhere
   (:func:`codec.bounded_worker`): its handler errors trimmed, and refused whole when too large
   without them. A conditional removal (``remove_worker(if_expires=)``) removes only the
   registration whose lease the caller saw run out, checked in the same atomic step as the
   removal: a worker that renewed or registered again after the caller's read is kept, with
   its acknowledgements.
   **A standing registration** (``WorkerInfo.standing``, docs/agent.md "Standing
   registrations") outlives its holder: it stays listed, standing, with its last lease, after
   that lease lapsed or its holder's session ended (nothing drops it: MongoDB's TTL index
   never matches it, ZooKeeper keeps it in a persistent node and lists it ``away`` while no
   session holds it); a new holder's ``put_worker`` takes it over; only a retirement
   (``remove_worker(retire=True)``) ends it: an ordinary or conditional removal keeps it, and
   an ordinary registration of its id (``put_worker`` without ``standing``) is refused with
   :class:`~locstatus.errors.StandingRegistered`, judged in the write's atomic step (memory:
   the store's lock; SQLite: the transaction; ZooKeeper: a multi-op checking the
   registrations' creation count; MongoDB: a filtered write).
   **An unreadable registration never lets a transition settle without its worker**: a stored
   registration that does not parse or validate (a hand edit, a field a newer version wrote,
   another worker's id) may belong to a running worker, so :meth:`workers` lists it, in its
   place, as :func:`codec.corrupt_worker`'s stand-in: its id, ``corrupt`` naming what is wrong,
   applying every service at every location, alive while listed unless the lease it carries
   still reads (then that lease counts, and lapses as any other). Never left out, never an
   error hiding the other workers; :meth:`put_worker` refuses to store it back. An
   unreadable acknowledgement acknowledges nothing: :meth:`acks` and :meth:`all_acks` leave
   it out and return the others (docs/agent.md "Unreadable registrations and
   acknowledgements"; the check reports the registration as ``corrupt_worker``).
7. **Hints may coalesce.** :meth:`subscribe` delivers :class:`Hint` values on a backend thread;
   hints can be merged or dropped, never relied on for every intermediate version. A
   ``resync`` hint asks subscribers to re-read everything (reconnect, overflow). Callbacks must
   return quickly and must not block the backend's thread. A callback that raises is logged
   and skipped: neither the write that caused the hint nor the other subscribers notice
   (:class:`~locstatus.backends.hints.Subscribers`, the one fan-out every backend uses).
8. **Errors are locstatus errors.** Every failure met inside a call (a driver's exception, an
   OS error such as a full disk, a document the store cannot hold) reaches the caller as a
   :class:`~locstatus.errors.LocstatusError` naming what failed: :class:`BackendUnavailable`
   (:class:`~locstatus.errors.BackendFull` for a full store) when nothing was written,
   :class:`AmbiguousCommit` when a write may have landed, :class:`InvalidInput` for what no
   backend can store. After the fault clears, the same backend object works again (real
   faults: ``tests/test_backend_faults.py``).

9. **Every write's history is found by its version, however old.** :meth:`history_write`
   returns exactly the entries the write that produced ``version`` stored (stamped with it),
   however many writes followed, and ``[]`` when the record's current life has no write at that
   version (not reached yet, an earlier life, or a write without history). This is what makes an
   ambiguous commit resolvable with no window (a search of the newest N entries applies a write
   twice once N entries were written since).

10. **Two history copies lose nothing** (``two_history_copies``): a write whose copy to the full
   history did not happen (the writer died between its two writes) stays in the recent copy
   until a later write, :meth:`restore_history` or the check copies it; :meth:`history_gaps`
   tells such writes (``restorable``) from versions neither copy holds (``lost``, a hand edit).

11. **The backend tells its own time.** :meth:`Backend.probe_time` returns the store's clock
   (a server's stamp, the kernel's file stamp), never the calling process's own clock, in one
   round trip; every deadline is judged on it (docs/time.md).

12. **A batch is many compare-and-sets, never one.** :meth:`Backend.compare_and_set_many`
   (and :meth:`Backend.create_many`) keep invariants 1-4 per item: each item writes only at its
   own expected version, with its own history in the same atomic write as its record, and its
   result is its own (the stored record, or the error :meth:`compare_and_set` would have
   raised for it alone); a conflict or an error at one item never fails, undoes or delays
   another. How the items travel (one SQLite transaction, pipelined ZooKeeper requests, one
   MongoDB ``bulk_write``) is the backend's; the default is one call per item.

13. **An acknowledgement never runs ahead of its record.** :meth:`Backend.ack` stores a
   generation only if the record has it *as it is at the write* (judged inside the write's
   transaction, multi-op, or, on MongoDB, against the record's life the acknowledgement is
   stamped with): at most the service's current generation (for ``_tombstone``, the removal
   generation of a removed record), exactly it with ``if_version``. An acknowledgement ahead
   of the record would count for a transition not made yet, which would then settle without
   that worker (docs/agent.md "Acknowledge only what was applied").

14. **A batch read or acknowledgement is many single ones.** :meth:`Backend.read_many` answers
   each location as :meth:`read` would (the record, or its :class:`NotFound` /
   :class:`CorruptRecord` in its place: one corrupt record never hides the others), and
   :meth:`Backend.ack_many` each acknowledgement as :meth:`ack` would, ``if_version``
   included, judged against its record as :meth:`ack` judges it (invariant 13; a refused
   one refused alone, the others written). How they travel (one SQLite
   query or transaction, pipelined ZooKeeper requests, a MongoDB ``$in``) is the backend's;
   the default is one call per item. An agent reads and acknowledges a burst of hints (a bulk
   pause of every location) this way (docs/agent.md "Bursts").

History of the design: one record per location (not per service) so that a bulk pause of every
service of a location is one compare-and-set, and so that a tombstone is one field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from locstatus.errors import (
    BackendFull,
    CorruptRecord,
    InvalidInput,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.models import (
    TOMBSTONE_ACK,
    Hint,
    HistoryEntry,
    LocationStatus,
    WorkerInfo,
    tombstone_generation,
)

HintCallback = Callable[[Hint], None]
Unsubscribe = Callable[[], None]
AckMap = dict[str, dict[str, int]]
"""worker_id -> service -> observed generation."""
ScanItem = tuple[LocationStatus | CorruptRecord, list[HistoryEntry] | CorruptRecord | None]
"""A record (or its error) and its newest history writes, see :meth:`Backend.scan_with_history`."""


class StaleVersion(VersionConflict):
    """A compare-and-set refused because the record moved on, carrying the record as the
    backend found it when it refused the write (``current``), got within the refused write's
    own round trip: a SQLite transaction, the re-read of a MongoDB ``findAndModify`` that
    matched nothing, the memory store's lock (ZooKeeper's multi-op answers no data: a plain
    :class:`VersionConflict`).
    Read at or after the refusal, it is as fresh as a read the caller would make next: the
    manager plans its next attempt from it instead of reading again (docs/design.md §3.1).
    A backend raises a plain :class:`VersionConflict` when it has no record to give (a
    record that does not decode, an answer lost): the manager then reads."""

    def __init__(self, message: str, current: LocationStatus) -> None:
        super().__init__(message)
        self.current = current


def stale_version(
    message: str, found: LocationStatus | CorruptRecord | None
) -> VersionConflict:
    """The error of a compare-and-set refused at another version: :class:`StaleVersion`
    carrying ``found`` when it is a record, a plain :class:`VersionConflict` otherwise."""
    if isinstance(found, LocationStatus):
        return StaleVersion(message, found)
    return VersionConflict(message)


def stale_ack(location: str, if_version: int) -> VersionConflict:
    """The error of an acknowledgement refused by ``if_version`` (see :meth:`Backend.ack`)."""
    return VersionConflict(
        f"location {location!r} is not at version {if_version}: not acknowledged"
    )


def check_ack(
    location: str,
    record: LocationStatus | None,
    service: str,
    generation: int,
    if_version: int | None,
) -> None:
    """Judge an acknowledgement against ``record``, the record as it is at the
    acknowledgement's write (None: there is none), for :meth:`Backend.ack` (invariant 13).
    ``if_version`` is the caller's: a backend compares the stored version itself, in its own
    terms, before calling this.

    Raises :class:`VersionConflict` (nothing may be written) when there is no record, when
    ``service`` is ``_tombstone`` and the record is not removed, when the record has no
    ``service``, or when ``generation`` is not one the record has: above the service's
    generation (the removal generation for ``_tombstone``), or, with ``if_version``, not
    exactly it (the worker applied the record at that version, so its generation). The caller
    reads the record again and applies it, as after any refused conditional write."""
    if record is None:
        raise VersionConflict(f"location {location!r} does not exist: not acknowledged")
    if service == TOMBSTONE_ACK:
        if record.deleted_at is None:
            raise VersionConflict(
                f"location {location!r} is not removed: its removal is not acknowledged"
            )
        have, what = tombstone_generation(record.deleted_at), "the removal generation"
    else:
        status = record.services.get(service)
        if status is None:
            raise VersionConflict(
                f"location {location!r} has no service {service!r}: not acknowledged"
            )
        have, what = status.generation, f"the generation of {service}"
    if generation > have or (if_version is not None and generation != have):
        at = f" at version {if_version}" if if_version is not None else ""
        raise VersionConflict(
            f"generation {generation} is not one location {location!r} has: {what}{at} is "
            f"{have}: not acknowledged"
        )


@dataclass(frozen=True, slots=True)
class CasItem:
    """One compare-and-set of a batch (:meth:`Backend.compare_and_set_many`): the arguments of
    :meth:`Backend.compare_and_set`. ``texts``, when the caller has them: the record's and the
    history's stored texts, exactly ``codec.encode_record(record)`` and
    ``codec.encode_history(codec.stamp(history, expected_version + 1))``; a backend storing
    the codec's text may store them as they are instead of encoding again (a bulk operation
    makes them from templates, locstatus.manager.bulkplan)."""

    record: LocationStatus
    expected_version: int
    history: Sequence[HistoryEntry]
    texts: tuple[str, str] | None = None


CasResult = LocationStatus | LocstatusError
"""One item's result in a batch: the stored record (written), or the error the item alone
would have raised: :class:`VersionConflict` (a conflict), any other
:class:`~locstatus.errors.LocstatusError` (:class:`NotFound`, :class:`AmbiguousCommit`,
:class:`BackendUnavailable`, :class:`CorruptRecord`...)."""

ReadResult = LocationStatus | NotFound | CorruptRecord
"""One location's answer in :meth:`Backend.read_many`: its record, or the error :meth:`Backend.
read` would have raised for it alone."""


@dataclass(frozen=True, slots=True)
class AckItem:
    """One acknowledgement of a batch (:meth:`Backend.ack_many`): the arguments of
    :meth:`Backend.ack` after the worker id."""

    location: str
    service: str
    generation: int
    if_version: int | None = None


AckResult = LocstatusError | None
"""One acknowledgement's result in :meth:`Backend.ack_many`: None (written), or the error
:meth:`Backend.ack` would have raised for it alone (:class:`VersionConflict` for a stale
``if_version``, :class:`BackendUnavailable`, ...)."""

CreateItem = tuple[LocationStatus, Sequence[HistoryEntry]]
"""One create of a batch (:meth:`Backend.create_many`): the arguments of :meth:`Backend.create`."""


def ack_each(
    ack: Callable[[AckItem], None], items: Sequence[AckItem], indices: Iterable[int],
    out: list[AckResult],
) -> None:
    """Acknowledge ``items[n]`` alone for each ``n`` of ``indices``, through ``ack`` (a
    backend's one-item acknowledgement), and put its result in ``out[n]``: None when written,
    else the :class:`~locstatus.errors.LocstatusError` it raised. What an :meth:`Backend.ack_many`
    runs item by item: all of a batch by default, the items a batched write could not decide
    on the backends that batch."""
    for n in indices:
        try:
            ack(items[n])
        except LocstatusError as exc:
            out[n] = exc
        else:
            out[n] = None


@dataclass(frozen=True)
class HistoryGaps:
    """What :meth:`Backend.history_gaps` finds: versions missing from the full history of a
    record's current life, ascending, at most :data:`GAPS_LISTED` of each kind."""

    restorable: tuple[int, ...] = ()
    """Missing from the full history, still held by the recent copy: :meth:`Backend.
    restore_history` copies them."""
    lost: tuple[int, ...] = ()
    """Held by neither copy: that history is gone (a hand edit, or data of a version that did
    not copy before it let writes leave the recent copy)."""

    def __bool__(self) -> bool:
        return bool(self.restorable or self.lost)


GAPS_LISTED = 1000
"""At most this many versions of each kind in one :class:`HistoryGaps`."""

DOWN_GRACE = 0.5
"""Seconds a network backend's call waits, counted from when its connection was seen going
down (ZooKeeper SUSPENDED or LOST, no MongoDB server selectable), for it to come back before
:class:`BackendUnavailable`. A blip (a leader failover, a cut TCP connection) is ridden
through; an outage is answered within a second, never after the full ``timeout``
(docs/reliability.md, "Failing fast while the backend is down")."""


def distinct_locations(locations: Iterable[str]) -> None:
    """Refuse a batch naming a location twice (its two writes would race each other): raises
    :class:`InvalidInput` naming it. Every :meth:`Backend.compare_and_set_many` and
    :meth:`Backend.create_many` calls it before writing anything."""
    seen: set[str] = set()
    for location in locations:
        if location in seen:
            raise InvalidInput(f"location {location!r} appears twice in one batch")
        seen.add(location)


class Scan(Protocol):
    """What :meth:`Backend.scan_with_history` returns: iterable once, sized (``len`` may be an
    estimate when records are created or removed while the scan runs; it sizes progress bars).
    A list is one."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[ScanItem]: ...


class Backend(ABC):
    """Versioned storage of location records, history, workers and acknowledgements.

    Usage::

        backend = open_backend("sqlite:///./locstatus.db")
        rec = backend.read("us-east-1")
        backend.compare_and_set(new_rec, rec.version, [entry])  # VersionConflict if raced
    """

    url: str
    session_leases: bool = False
    """True when a worker's registration lives exactly as long as its client's session
    (ZooKeeper ephemeral nodes): agents then register without a lease deadline and do not
    rewrite their registration to renew it (a rewrite would wake every watcher of the worker
    list). False: the lease is ``lease_expires_at``, renewed by heartbeats."""

    session_timeout: float | None = None
    """With ``session_leases``: the session timeout in seconds, the longest the server keeps a
    session it has not heard from. An agent's lease then holds, by its own monotonic clock,
    that long after its last successful round trip (minus a margin, docs/agent.md
    "Self-fencing"). None: not known, or no sessions."""

    store_full: BackendFull | None = None
    """The error of this client's latest write when the store refused it as full
    (:class:`~locstatus.errors.BackendFull`, nothing written); None before any such failure
    and again once a write succeeds. A full store still answers reads, so :meth:`ping` cannot
    tell: ``/readyz`` reports it as ``degraded`` (still 200) and ``/metrics`` as
    ``locstatus_backend_full`` (docs/http.md "Operations"). Only this client's own writes set
    it. Backends that can tell a full store (SQLite) keep it."""

    two_history_copies: bool = False
    """True when history is kept in two copies that may disagree after a crash (MongoDB: recent
    writes embedded in the record, authoritative, and the full history collection); the check
    job then verifies the full copy's version chain through :meth:`history_gaps` for every
    record and repairs it with :meth:`restore_history`. Such a backend never lets a write leave
    the recent copy before the full copy holds it (invariant 10)."""

    local_clock: bool = False
    """True when the store lives in this process (``memory://``): its time *is* this process's
    clock, exactly, and no measuring is needed (docs/time.md)."""

    clock_resolution: float = 0.001
    """Seconds: how coarse the stamps :meth:`probe_time` returns are (ZooKeeper's ``mtime`` and
    MongoDB's ``localTime`` are milliseconds); added to the time source's uncertainty."""

    local_reads: bool = False
    """True when a single read is served on this host without a network round trip (an
    in-process store, a database file on a local disk: memory, SQLite in WAL mode, where a
    reader never waits for a writer): quick enough for an event loop to run it inline (the
    sidecar does, docs/http.md "Performance"). False: a network store, whose reads belong in a
    thread pool."""

    batch_size: int = 1
    """How many locations a bulk operation hands :meth:`compare_and_set_many` (and
    :meth:`create_many`) at once: 1 when the backend writes one item per call anyway (an
    interrupted operation then knows exactly which location was in flight); a batching backend
    sets what suits it. Bounds what a bulk operation holds and has in flight."""

    @classmethod
    def missing_store(cls, url: str) -> str | None:
        """Where the store named by ``url`` should be and is not, for a backend that would
        create it empty on open (a SQLite file): a front end refuses to open it then, so a
        typo in a path does not look like an empty store. None when it exists, or when this
        backend has no such store (a server, memory). Raises :class:`InvalidInput` for a
        malformed URL of this backend."""
        return None

    # -- location records -------------------------------------------------------------------

    @abstractmethod
    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        """Store a new record (its ``version`` is ignored) with its history.

        Returns the stored record with its first version. Raises :class:`AlreadyExists`.
        """

    @abstractmethod
    def read(self, location: str) -> LocationStatus:
        """Return the record. Raises :class:`NotFound`, :class:`CorruptRecord`."""

    def read_many(self, locations: Sequence[str]) -> list[ReadResult]:
        """Many :meth:`read` calls in one (invariant 14): ``result[i]`` is ``locations[i]``'s
        record, or its :class:`NotFound` / :class:`CorruptRecord`. Raises
        :class:`BackendUnavailable` (for the whole batch: nothing could be read). The default
        runs :meth:`read` per location; a backend that can read many at once overrides it for
        speed, never for meaning."""
        out: list[ReadResult] = []
        for location in locations:
            try:
                out.append(self.read(location))
            except (NotFound, CorruptRecord) as exc:
                out.append(exc)
        return out

    @abstractmethod
    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        """Every record, sorted by location; a corrupt one appears as its error."""

    @abstractmethod
    def compare_and_set(
        self,
        record: LocationStatus,
        expected_version: int,
        history: Sequence[HistoryEntry],
    ) -> LocationStatus:
        """Replace the record if its stored version is ``expected_version``; append ``history``
        in the same atomic write. Returns the stored record (version ``expected_version + 1``).

        Raises :class:`VersionConflict`, :class:`NotFound`, :class:`AmbiguousCommit`,
        :class:`BackendUnavailable`.
        """

    def compare_and_set_many(self, items: Sequence[CasItem]) -> list[CasResult]:
        """Many compare-and-sets in one call (invariant 12): ``result[i]`` is item ``i``'s, as
        :data:`CasResult`. Each item is its own :meth:`compare_and_set`: written only at its
        own ``expected_version``, its history in the same atomic write, a conflict or an error
        at one item leaving the others as they would be without it. Never raises for one
        item; the locations of ``items`` are distinct (:class:`InvalidInput` otherwise,
        nothing written). The default runs :meth:`compare_and_set` per item; a backend that
        can send many at once (one transaction, pipelined requests, a bulk write) overrides
        it for speed, never for meaning."""
        distinct_locations(item.record.location for item in items)
        out: list[CasResult] = []
        for item in items:
            try:
                out.append(
                    self.compare_and_set(item.record, item.expected_version, item.history)
                )
            except LocstatusError as exc:
                out.append(exc)
        return out

    def create_many(
        self, items: Sequence[CreateItem], *, texts: Sequence[tuple[str, str]] | None = None
    ) -> list[CasResult]:
        """Many :meth:`create` calls in one (invariant 12): ``result[i]`` is item ``i``'s stored
        record, or its error (:class:`AlreadyExists`, :class:`BackendUnavailable`...); one
        item's error never fails another. Distinct locations (:class:`InvalidInput`
        otherwise, nothing written). ``texts``, when the caller has them: each item's record
        and history stored texts, exactly ``codec.encode_record(record)`` and
        ``codec.encode_history(codec.stamp(history, 1))`` (a first life's create); a backend
        storing the codec's text may store them as they are instead of encoding again (a
        sync makes them from templates, locstatus.manager.creates). The default runs
        :meth:`create` per item."""
        distinct_locations(record.location for record, _ in items)
        out: list[CasResult] = []
        for record, history in items:
            try:
                out.append(self.create(record, history))
            except LocstatusError as exc:
                out.append(exc)
        return out

    @abstractmethod
    def delete(self, location: str, expected_version: int) -> None:
        """Delete a record (and its history and acks) if its version matches (tombstone purge,
        docs/design.md §3.5). Raises :class:`VersionConflict`, :class:`NotFound`."""

    @abstractmethod
    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        """History newest first: entries of versions below ``before_version`` (all if None), at
        least ``limit`` entries when there are that many, never splitting one write."""

    def history_write(self, location: str, version: int) -> list[HistoryEntry]:
        """The entries of the write stored under exactly ``version`` (invariant 9), in the
        order :meth:`history` gives them (newest first); ``[]`` when this life of the record
        has no write there, or no record exists. Raises :class:`CorruptRecord` when that write
        does not parse, :class:`BackendUnavailable`.

        The default pages with :meth:`history` (one page: the newest write below
        ``version + 1``); backends that can address a write by its key override it."""
        return [
            e
            for e in self.history(location, limit=1, before_version=version + 1)
            if e.version == version
        ]

    def scan_with_history(self) -> Scan:
        """Every record (as :meth:`read_all`, sorted by location) paired with the entries of its
        newest history writes, newest first, for the check job's single pass: at least the
        newest write (what ``history(location, limit=1)`` returns), and older ones the backend
        has at hand while some service of the record has no entry yet
        (:func:`codec.decode_newest_writes`); never part of a write. The caller pages on with
        :meth:`history` (``before_version`` = the oldest version returned) when it needs more.
        The history item is a :class:`CorruptRecord` when the newest write does not parse, and
        ``None`` when this backend does not fetch history with the records, or could not tell
        from what it fetched (an empty or unreadable newest write): the caller then pages
        through :meth:`history` itself.

        Backends that can read a record and its newest write in one query or snapshot override
        this, and may stream: records are then decoded while the caller iterates, so a scan of
        100 000 locations never holds them all (each item is as fresh as the batch it was read
        in). The default reads every record first and returns ``None`` for every history."""
        return [(rec, None) for rec in self.read_all()]

    def history_gaps(self, location: str) -> HistoryGaps:
        """The versions of the record's current life missing from its full history (invariant
        9), for the check job: empty when the chain from the life's first version to the
        record's is whole, or when the record does not exist. Backends that keep history in
        one place, written atomically with the state, have none. Raises
        :class:`BackendUnavailable`, :class:`CorruptRecord` (the recent copy is unreadable)."""
        return HistoryGaps()

    def restore_history(self, location: str) -> list[int]:
        """Copy to the full history every write the recent copy holds and the full one lacks
        (idempotent, safe while others write). Returns the versions this call copied, sorted
        (``[]`` when there was nothing to copy, another process copied them first, or the
        backend keeps one copy). Raises :class:`BackendUnavailable`, :class:`CorruptRecord`."""
        return []

    # -- workers, leases and acknowledgements ----------------------------------------------

    @abstractmethod
    def put_worker(self, info: WorkerInfo) -> None:
        """Register a worker or renew its lease (heartbeat): store ``info`` as
        :func:`codec.bounded_worker` bounds it (at most ``MAX_WORKER_ERRORS`` handler errors of
        ``MAX_ERROR_CHARS`` characters, in ``MAX_REGISTRATION_BYTES``), so a worker failing
        everywhere still renews its lease. Session backends (ZooKeeper) also bound the
        registration by the session (ephemeral node): a worker is alive while it is listed and
        its lease, if any, holds. Raises :class:`~locstatus.errors.InvalidInput` (nothing
        written) when the registration does not fit without its errors (a location filter of
        ~100 000 names), :class:`~locstatus.errors.StandingRegistered` (nothing written) for
        an ordinary registration over a standing one of the same id (invariant 6),
        :class:`~locstatus.errors.BackendUnavailable`."""

    @abstractmethod
    def remove_worker(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        """Unregister a worker and drop its acknowledgements. Returns True when this call
        removed a registration, False when there was none to remove (no error if unknown).

        ``retire``: a retirement (``Manager.retire_worker``), the only removal that ends a
        standing registration (docs/agent.md "Standing registrations"); without it a standing
        registration is kept, with its acknowledgements (False), judged in the removal's
        atomic step as ``if_expires`` is. With ``if_expires`` too, a conditional retirement
        (``Manager.retire_worker`` on heartbeat backends: a holder that took the registration
        over since it was judged wrote another deadline, and keeps it). On ZooKeeper, where a
        standing registration's lease is its holder's session, a retirement keeps one whose
        ``holder`` node another session holds (its holder is present, False), judged in the
        delete's multi-op; it keeps a standing one given ``if_expires`` (False): the manager
        retires there without it.

        ``if_expires`` (aware UTC): remove only while the stored registration's
        ``lease_expires_at`` is exactly this deadline, the one the caller saw pass; a renewed
        or re-registered worker carries another one and is kept (False), with its
        acknowledgements (invariant 6). This is how the check job drops an expired worker:
        a worker that came back between the check's read and its removal must not be
        dropped while live, or a pause settles without it (model/README.md, finding
        ``remove_race``). SQLite and memory check it in the removal's transaction, ZooKeeper
        with a versioned delete in one multi-op with the acknowledgements, MongoDB with a
        delete conditional on the whole registration document it read (its acknowledgements
        are dropped right after, in a second request). An unreadable registration is judged by
        the lease its stand-in carries, as :meth:`workers` lists it (:func:`codec.corrupt_worker`).
        None: unconditional (a worker unregistering itself)."""

    def has_worker(self, worker_id: str) -> bool:
        """True while ``worker_id`` is registered (listed by :meth:`workers`): how a running
        standing registration's holder notices it was retired or removed behind its back and
        registers again (docs/agent.md "Standing registrations"). The default lists every
        worker; SQLite and ZooKeeper read the one registration. Raises
        :class:`~locstatus.errors.BackendUnavailable`."""
        return any(w.worker_id == worker_id for w in self.workers())

    @abstractmethod
    def workers(self) -> list[WorkerInfo]:
        """Registered workers, sorted by id (expired ones may still be listed); one whose
        stored registration does not read as its stand-in (``corrupt`` set, invariant 6).
        Raises :class:`BackendUnavailable`, never for one registration's content."""

    @abstractmethod
    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        """Record that ``worker_id`` applied ``generation`` of ``service`` at ``location``.

        ``generation``: one the record has at the write (invariant 13, :func:`check_ack`): at
        most the service's current generation, for ``_tombstone`` (``service``) the removal
        generation of a removed record; else :class:`VersionConflict`, nothing written (also
        when the record does not exist or has no such service). An acknowledgement ahead of
        the record would count for a pause not made yet (docs/agent.md "Acknowledge only what
        was applied").

        ``if_version``: only if the record is still at that version (the one whose state the
        worker applied), and then ``generation`` must be exactly the one it has there;
        otherwise raise :class:`VersionConflict` and write nothing. This is how an agent
        acknowledges "still current after my handler ran" in one write instead of a read and a
        write (docs/design.md §3.4). SQLite and memory judge both in the write's transaction,
        ZooKeeper in its multi-op (a check of the record's znode version, and of its
        incarnation with ``if_version``, at the content it judged); MongoDB judges the record
        it reads just before the write and stamps the acknowledgement with that record's life,
        which is the only one it counts for (generations only grow within a life).
        Raises :class:`VersionConflict`, :class:`CorruptRecord` (the record does not read: its
        generations cannot be judged, nothing written), :class:`BackendUnavailable`."""

    def ack_many(self, worker_id: str, items: Sequence[AckItem]) -> list[AckResult]:
        """Many :meth:`ack` calls of one worker in one (invariant 14): ``result[i]`` is None
        when item ``i`` was written, else the error :meth:`ack` would have raised for it alone
        (a stale ``if_version``: :class:`VersionConflict`, nothing written for it). Never
        raises for one item; one item's refusal never fails another. The default runs
        :meth:`ack` per item; a backend that can write many at once overrides it for speed,
        never for meaning."""
        out: list[AckResult] = [None] * len(items)
        ack_each(
            lambda item: self.ack(worker_id, item.location, item.service, item.generation,
                                  if_version=item.if_version),
            items, range(len(items)), out,
        )
        return out

    @abstractmethod
    def acks(self, location: str) -> AckMap:
        """Acknowledgements for one location: worker_id -> service -> generation (integers);
        an unreadable one is left out (invariant 6)."""

    def acks_many(self, locations: Sequence[str]) -> dict[str, AckMap]:
        """:meth:`acks` of each of ``locations`` (location -> its AckMap; every one given is
        in the result, an empty map when none are), as fresh as a call of :meth:`acks` made
        now for each. A batched settle reads them together (docs/design.md §4, "Batches");
        this default asks one location after the other, a backend overrides it with fewer
        requests."""
        return {loc: self.acks(loc) for loc in dict.fromkeys(locations)}

    @abstractmethod
    def all_acks(self) -> dict[str, AckMap]:
        """Acknowledgements for every location: location -> worker_id -> service -> gen;
        unreadable ones left out (invariant 6)."""

    # -- hints and lifecycle -----------------------------------------------------------------

    @abstractmethod
    def subscribe(
        self, callback: HintCallback, *, kinds: Collection[str] | None = None
    ) -> Unsubscribe:
        """Deliver change hints to ``callback`` until the returned function is called.

        ``kinds``: the hint kinds the subscriber acts on (None: every kind). A backend need not
        watch what no subscriber asked for (ZooKeeper then sets no watch on acknowledgements,
        which every worker's acknowledgement would fire in every process), and may still
        deliver other kinds: hints are advisory."""

    @abstractmethod
    def probe_time(self) -> datetime:
        """The store's current time (aware UTC), stamped by the store itself in one round trip:
        the caller measures the round trip around this call and takes the stamp as the store's
        time somewhere inside it (docs/time.md "Reading the backend's time"). Raises
        :class:`BackendUnavailable` when the store does not answer."""

    @abstractmethod
    def ping(self) -> None:
        """Raise :class:`BackendUnavailable` unless the backend answers now."""

    @abstractmethod
    def close(self) -> None:
        """Release connections and threads. Idempotent."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
