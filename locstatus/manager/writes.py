"""The compare-and-set write loop: the one short function every mutation goes through.

:meth:`Writer.write` is the loop of docs/design.md §3.1 and §3.2, the way kazoo's counter recipe
reads:

1. read the record and its version;
2. plan purely (:mod:`.plans`: a :data:`~.plans.Decision`, never I/O);
3. write with ``compare_and_set(expected_version)``, history in the same write;
4. on :class:`VersionConflict` re-apply to the fresh record under a bounded, jittered retry
   policy (tenacity), then raise :class:`ConflictError`: the record the refused write came back
   with (:class:`~locstatus.backends.base.StaleVersion`: got in the write's own round trip, at
   or after the refusal, so as fresh as a read), or else a read;
5. on :class:`AmbiguousCommit` (connection lost after send) re-read and look for the
   operation's op_id in the history write at the version it would have produced before trying
   again, never retrying blindly (:func:`_landed`).

Nothing is trusted between calls but one thing: a *known record*, either the version hint
(:class:`VersionHints`: the last record of a location this process read or wrote) or the record
a bulk operation's scan just read. The loop may skip step 1 and plan from it, but only to make a
write: that write's compare-and-set succeeds only if the record is still at that version (so the
known record was the current one), and any other decision (a conflict, a refusal, a no-op, a
precondition) is decided again from a fresh record. A process that pauses and resumes the same
locations (the sidecar, an operator script, ``wait=`` loops) so saves a read per write; and
when another process made its hint stale, the refused write brings the fresh record back, so
the write costs the refused attempt and the write, no read between, where the backend brings
it back (:class:`~locstatus.backends.base.StaleVersion`); and a location whose hint proved
stale is read first by the next operations (:class:`VersionHints`), not refused again
(docs/design.md §3.1).

Some plans need more than the record (a settle needs the worker list and the acks, read *after*
the record: model/README.md, finding 1): they come as a ``prepare(record) -> plan`` step, the I/O
done by the loop between the read and the pure plan.

:meth:`Writer.write_batch` is the shape a bulk operation writes through: many locations, each its
own compare-and-set on its own version. The locations planned from a known record go to the
backend in one :meth:`~locstatus.backends.base.Backend.compare_and_set_many` (many locations per
SQLite transaction, pipelined ZooKeeper requests, one MongoDB ``bulk_write``: backend invariant
12); a location that conflicted there, or that needs a fresh read, goes through
:meth:`Writer.write` alone, so only it is read again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from locstatus import monotonic
from locstatus.backends.base import Backend, CasItem, StaleVersion
from locstatus.clock import Clock
from locstatus.errors import (
    AmbiguousCommit,
    BackendUnavailable,
    ConflictError,
    CorruptRecord,
    LocstatusError,
    NotFound,
    PreconditionFailed,
    VersionConflict,
)
from locstatus.models import LocationStatus

from .plans import Plan, Refuse, Write

Prepare = Callable[[LocationStatus], Plan]
"""``prepare(record) -> plan``: the reads a plan needs beside the record, done after reading it
(one call per attempt); the plan it returns is pure."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded, jittered retry of compare-and-set conflicts (docs/design.md §3.1).

    ``max_attempts`` attempts or ``max_seconds`` seconds, whichever comes first; waits are
    random exponential between 0 and ``min(cap, base * 2**n)`` seconds.
    """

    max_attempts: int = 60
    max_seconds: float = 15.0
    base: float = 0.002
    cap: float = 0.2


class VersionHints:
    """The last record of each location this manager read or wrote (at most ``size``, least
    recently used dropped first). Only ever the *expected version* of a first compare-and-set
    attempt: never returned to a caller, never a reason to skip a write (see the module
    docstring). Thread-safe (the sidecar calls one manager from many threads).

    A hint another process made stale (:meth:`stale`: its compare-and-set was refused) is not
    offered again (:meth:`get` is None: the write reads first, one round trip, where the
    refused write and then the read were two) until a read finds the location where this
    manager left it (nobody else wrote between its calls): a location another process writes
    between every two of ours (the bridge's settle between two pauses) is read first, one
    written only by this manager planned from its hint (docs/design.md §3.1)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._records: OrderedDict[str, LocationStatus] = OrderedDict()
        self._stale: dict[str, str] = {}  # location -> the op_id whose write found it stale
        self._lock = threading.Lock()

    def get(self, location: str, op_id: str | None = None) -> LocationStatus | None:
        """The hint of ``location`` for a write of operation ``op_id``: None when there is
        none, or when it proved stale for another operation (the writes of the operation that
        found it stale, its settle after its pause, still plan from the record it wrote)."""
        with self._lock:
            found = self._stale.get(location)
            if found is not None and found != op_id:
                return None
            return self._records.get(location)

    def stale(self, location: str, op_id: str) -> None:
        """A write of ``op_id`` found the hint of ``location`` stale: other operations read it
        first from now on (see the class)."""
        with self._lock:
            if location in self._records:
                self._stale[location] = op_id

    def left_at(self, location: str, op_id: str | None = None) -> int | None:
        """The version of the hint :meth:`get` holds back from ``op_id``, else None."""
        with self._lock:
            rec = self._records.get(location)
            found = self._stale.get(location)
            if rec is None or found is None or found == op_id:
                return None
            return rec.version

    def found_as_left(self, location: str) -> None:
        """A write's first read found ``location`` at the held-back hint's version: nobody
        else wrote it between two calls of this manager; offer its hint again."""
        with self._lock:
            self._stale.pop(location, None)

    def put(self, rec: LocationStatus) -> None:
        self.put_many((rec,))

    def put_many(self, recs: Iterable[LocationStatus]) -> None:
        """:meth:`put` each, in order, under one lock (a bulk batch's records)."""
        records, size, stale = self._records, self.size, self._stale
        with self._lock:
            for rec in recs:
                location = rec.location
                old = records.get(location)
                if old is not None:
                    if old.version > rec.version:
                        continue  # a newer one is known already
                    records.move_to_end(location)
                records[location] = rec
                if len(records) > size:
                    stale.pop(records.popitem(last=False)[0], None)

    def drop(self, location: str) -> None:
        with self._lock:
            self._records.pop(location, None)
            self._stale.pop(location, None)


@dataclass
class _Ambiguity:
    """Writes of one operation whose outcome was unknown: version they would have produced ->
    the record they sent (docs/design.md §3.2)."""

    sent: dict[int, LocationStatus] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WriteRequest:
    """One location's write in a batch (:meth:`Writer.write_batch`); fields as the arguments
    of :meth:`Writer.write`. ``plan`` decides the batched attempt from the known record;
    ``prepare``, when given, decides every attempt of the location written alone (after a
    conflict, or from a fresh read) instead: a settle reads its workers and acks again after
    the fresh record (model/README.md, finding 1)."""

    location: str
    plan: Plan
    op_id: str
    known: LocationStatus | None = None
    use_hint: bool = False
    replaced: list[LocationStatus] | None = None
    prepare: Prepare | None = None


class Writer:
    """Runs plans against ``backend`` under ``retry``; counts what it did in ``stats``
    (``writes``, ``conflicts``, ``ambiguous``, ``stale_hints``, and ``replanned``: attempts
    planned from the record a refused write came back with, no read; the manager's
    ``stats``)."""

    def __init__(self, backend: Backend, clock: Clock, retry: RetryPolicy) -> None:
        self.backend = backend
        self.clock = clock
        self.retry = retry
        self.hints = VersionHints()
        self.stats = {
            "writes": 0, "conflicts": 0, "ambiguous": 0, "stale_hints": 0, "replanned": 0,
        }

    def read(self, location: str) -> LocationStatus:
        """The stored record (and remember it as the location's hint). Raises as
        :meth:`Backend.read`."""
        rec = self.backend.read(location)
        self.hints.put(rec)
        return rec

    def write(
        self,
        location: str,
        plan: Plan | None = None,
        *,
        op_id: str,
        prepare: Prepare | None = None,
        if_version: int | None = None,
        use_hint: bool = False,
        known: LocationStatus | None = None,
        replaced: list[LocationStatus] | None = None,
    ) -> LocationStatus:
        """Read, plan, compare-and-set; retry conflicts; resolve ambiguity by op_id. Returns
        the stored record (the one read when the plan decided nothing).

        ``plan`` or ``prepare`` (exactly one) decides each attempt. ``if_version``: refuse with
        :class:`PreconditionFailed` unless the record read is at that version. ``known`` (or
        the version hint, with ``use_hint``): plan the first attempt from it instead of a
        read (see the module docstring). ``replaced``: a list the record the landed write
        replaced is appended to (what a "rescheduled (was ...)" report compares with; nothing
        when no write landed or its landing was found by op_id). The first read attempt runs
        outside the retry policy (no contention is the common case); after a conflict,
        attempts continue under the bounded, jittered policy. Raises the plan's refusal,
        :class:`NotFound`, :class:`ConflictError`, :class:`AmbiguousCommit`,
        :class:`BackendUnavailable`."""
        prep = _prepared(plan, prepare)
        ambiguity = _Ambiguity()
        return self._write(
            location, prep, op_id, if_version, known, use_hint, ambiguity, replaced
        )

    def _write(
        self,
        location: str,
        prep: Prepare,
        op_id: str,
        if_version: int | None,
        known: LocationStatus | None,
        use_hint: bool,
        ambiguity: _Ambiguity,
        replaced: list[LocationStatus] | None = None,
    ) -> LocationStatus:
        """:meth:`write` with its ambiguity record given (a batch's ambiguous item arrives
        with what it sent, so the first read looks for its op_id)."""
        left: int | None = None
        if known is None and use_hint:
            known = self.hints.get(location, op_id)
            if known is None:
                left = self.hints.left_at(location, op_id)
        fresh: LocationStatus | None = None  # the record a refused write came back with
        if known is not None and (if_version is None or known.version == if_version):
            try:
                stored = self._from_known(known, prep, op_id, ambiguity, replaced)
            except VersionConflict as exc:
                if not ambiguity.sent:
                    self.stats["stale_hints"] += 1
                    self.hints.stale(location, op_id)
                fresh = _current(exc)
            except BackendUnavailable as exc:
                _raise_unresolved(exc, op_id, ambiguity)
            else:
                if stored is not None:
                    return stored
        try:
            return self._attempt(
                location, prep, op_id, if_version, ambiguity, replaced, fresh, left
            )
        except VersionConflict as exc:
            fresh = _current(exc)
        except BackendUnavailable as exc:
            _raise_unresolved(exc, op_id, ambiguity)
        policy = self.retry
        retrying = Retrying(
            retry=retry_if_exception_type(VersionConflict),
            stop=stop_after_attempt(policy.max_attempts - 1) | stop_after_delay(policy.max_seconds),
            wait=wait_random_exponential(multiplier=policy.base, max=policy.cap),
            sleep=monotonic.sleep,  # not time.sleep: it fails under libfaketime (docs/time.md)
        )
        try:
            for attempt in retrying:
                with attempt:
                    try:
                        return self._attempt(
                            location, prep, op_id, if_version, ambiguity, replaced, fresh
                        )
                    except VersionConflict as exc:
                        fresh = _current(exc)  # planned from by the next attempt, after the wait
                        raise
        except BackendUnavailable as exc:
            _raise_unresolved(exc, op_id, ambiguity)
        except RetryError as exc:
            raise ConflictError(
                f"location {location!r}: compare-and-set kept conflicting "
                f"({exc.last_attempt.attempt_number + 1} attempts); try again"
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def write_batch(
        self, requests: Sequence[WriteRequest]
    ) -> Iterator[tuple[WriteRequest, LocationStatus | LocstatusError]]:
        """Write many locations, each its own compare-and-set on its own version (its own
        conflicts and ambiguity), yielding each request with its stored record or the
        :class:`LocstatusError` it ended with, as each completes (not in request order).

        The requests planned from a known record (``known``, or the version hint with
        ``use_hint``) whose plan is a write go to the backend as one batch
        (:meth:`~locstatus.backends.base.Backend.compare_and_set_many`: one SQLite transaction,
        pipelined ZooKeeper requests...). Every other one, and every item of the batch that
        conflicted (a stale known record), goes through :meth:`write` alone: re-read,
        re-planned, retried under the policy, so only that location is read again. An item
        whose outcome is unknown (:class:`AmbiguousCommit`) is resolved by its op_id as in
        :meth:`write`. A conflict or error at one location never fails another."""
        batched: list[tuple[WriteRequest, LocationStatus]] = []
        items: list[CasItem] = []
        alone: list[WriteRequest] = []
        now = self.clock()
        for req in requests:
            known = req.known
            if known is None and req.use_hint:
                known = self.hints.get(req.location, req.op_id)
            decision = None if known is None else req.plan(known, now)
            if known is None or not isinstance(decision, Write):
                alone.append(req)  # "nothing to do" or a refusal is only true of a fresh read
                continue
            batched.append((req, known))
            items.append(
                CasItem(decision.record, known.version, decision.entries, decision.texts)
            )
        results = self.backend.compare_and_set_many(items) if items else []
        stored = [r for r in results if isinstance(r, LocationStatus)]
        self.stats["writes"] += len(stored)
        self.hints.put_many(stored)
        for (req, known), item, result in zip(batched, items, results, strict=True):
            if isinstance(result, LocationStatus):
                if req.replaced is not None:
                    req.replaced.append(known)  # the compare-and-set at its version replaced it
                yield req, result
                continue
            if isinstance(result, VersionConflict):
                self.stats["stale_hints"] += 1
                self.hints.stale(req.location, req.op_id)
                yield req, self._alone(req)  # re-read and re-apply this location only
                continue
            if not isinstance(result, AmbiguousCommit):
                yield req, result  # NotFound, unavailable...: as the write alone would end
                continue
            self.stats["ambiguous"] += 1
            ambiguity = _Ambiguity()  # the next read first looks for op_id (docs/design.md §3.2)
            version = known.version + 1
            ambiguity.sent[version] = item.record.model_copy(update={"version": version})
            yield req, self._alone(req, ambiguity=ambiguity)
        for req in alone:
            yield req, self._alone(req, known=req.known, use_hint=req.use_hint)

    def _alone(
        self,
        req: WriteRequest,
        *,
        ambiguity: _Ambiguity | None = None,
        known: LocationStatus | None = None,
        use_hint: bool = False,
    ) -> LocationStatus | LocstatusError:
        """One request written through the loop of :meth:`write` (from a fresh read unless
        ``known`` or ``use_hint`` says otherwise), its error as a value."""
        prep = req.prepare if req.prepare is not None else _prepared(req.plan, None)
        try:
            return self._write(
                req.location, prep, req.op_id, None, known, use_hint,
                ambiguity or _Ambiguity(), req.replaced,
            )
        except LocstatusError as exc:
            return exc

    def _from_known(
        self,
        known: LocationStatus,
        prepare: Prepare,
        op_id: str,
        ambiguity: _Ambiguity,
        replaced: list[LocationStatus] | None,
    ) -> LocationStatus | None:
        """The zeroth attempt, planned from a known record: the stored record when its plan was
        a write that landed, None when the plan decided anything else (decided again on a
        fresh read). Raises VersionConflict when the known record was stale."""
        decision = prepare(known)(known, self.clock())
        if not isinstance(decision, Write):
            return None  # "nothing to do" or a refusal is only true of a fresh read
        return self._cas(known, decision, ambiguity, replaced, count_conflict=False)

    def _attempt(
        self,
        location: str,
        prepare: Prepare,
        op_id: str,
        if_version: int | None,
        ambiguity: _Ambiguity,
        replaced: list[LocationStatus] | None,
        fresh: LocationStatus | None = None,
        left: int | None = None,
    ) -> LocationStatus:
        """One read-plan-write. Raises VersionConflict to be retried (also after an ambiguous
        commit, which records what was sent so the next read first looks for ``op_id``).

        ``fresh``: the record the previous attempt's refused write came back with
        (:class:`~locstatus.backends.base.StaleVersion`), read by the backend at or after
        that refusal: this attempt plans from it exactly as from its own read (the op_id
        look-up of an ambiguous commit, ``if_version``, a no-op or a refusal included), and
        reads only when there is none. ``left``: the version of a hint held back as stale
        (:class:`VersionHints`); a read that finds the record still there offers it again."""
        if fresh is not None:
            rec = fresh
            self.stats["replanned"] += 1
        else:
            try:
                rec = self.backend.read(location)
            except NotFound:
                self.hints.drop(location)
                raise
            if left is not None:  # nobody else wrote since our last call, or still stale
                if rec.version == left:
                    self.hints.found_as_left(location)
                else:
                    self.hints.stale(location, op_id)
        self.hints.put(rec)
        if ambiguity.sent:
            landed = _landed(self.backend, rec, op_id, ambiguity)
            if landed is not None:
                return landed
        if if_version is not None and rec.version != if_version:
            raise PreconditionFailed(
                f"location {location!r} is at version {rec.version}, not {if_version}"
            )
        decision = prepare(rec)(rec, self.clock())
        if isinstance(decision, Refuse):
            raise decision.error
        if not isinstance(decision, Write):
            return rec
        return self._cas(rec, decision, ambiguity, replaced, count_conflict=True)

    def _cas(
        self,
        rec: LocationStatus,
        write: Write,
        ambiguity: _Ambiguity,
        replaced: list[LocationStatus] | None,
        *,
        count_conflict: bool,
    ) -> LocationStatus:
        new = write.record
        try:
            stored = self.backend.compare_and_set(new, rec.version, write.entries)
        except VersionConflict:
            if count_conflict:
                self.stats["conflicts"] += 1
            raise
        except AmbiguousCommit as exc:
            self.stats["ambiguous"] += 1
            ambiguity.sent[rec.version + 1] = new.model_copy(update={"version": rec.version + 1})
            raise VersionConflict(f"ambiguous commit, resolving: {exc}") from exc
        self.stats["writes"] += 1
        self.hints.put(stored)
        if replaced is not None:
            replaced.append(rec)
        return stored


def _current(exc: VersionConflict) -> LocationStatus | None:
    """The record a refused compare-and-set came back with (:class:`StaleVersion`), if any."""
    return exc.current if isinstance(exc, StaleVersion) else None


def _prepared(plan: Plan | None, prepare: Prepare | None) -> Prepare:
    if prepare is not None:
        assert plan is None, "give plan or prepare, not both"
        return prepare
    assert plan is not None, "give plan or prepare"
    return lambda _rec: plan


def _raise_unresolved(exc: BackendUnavailable, op_id: str, ambiguity: _Ambiguity) -> NoReturn:
    """After an ambiguous commit, an unreachable backend leaves the outcome unknown: say so,
    with the op_id to look for (docs/design.md §3.2), rather than a plain 'unavailable'."""
    if ambiguity.sent and not isinstance(exc, AmbiguousCommit):
        raise AmbiguousCommit(
            f"{exc}; the write may or may not have been applied: look for op_id {op_id} "
            "in the history"
        ) from exc
    raise exc


def _landed(
    backend: Backend, rec: LocationStatus, op_id: str, ambiguity: _Ambiguity
) -> LocationStatus | None:
    """After an ambiguous commit: the record our write stored if it landed, else None.

    Each write whose outcome was unknown would have produced one version: it landed if and
    only if the history write at exactly that version carries ``op_id`` (Backend invariant 9),
    however many writes followed it, so the answer never depends on how far back a search
    looks. Found as the current record: that record. Found in an older write: the record
    exactly as our write stored it, so the caller still sees its op_id and version
    (docs/design.md §3.2). A version above the record's was not written (yet)."""
    for version in sorted(ambiguity.sent):
        if version > rec.version:
            continue
        if version == rec.version and any(s.op_id == op_id for s in rec.services.values()):
            return rec  # our write is the current record
        try:
            entries = backend.history_write(rec.location, version)
        except CorruptRecord as exc:
            raise AmbiguousCommit(
                f"location {rec.location!r}: the history write at version {version} does "
                f"not parse ({exc.detail}): the write may or may not have been applied: "
                f"look for op_id {op_id} in the history"
            ) from exc
        if any(e.op_id == op_id for e in entries):
            return ambiguity.sent[version]
    return None
