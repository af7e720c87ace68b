"""Reconcile primitives: settle what every live worker applied, fire the scheduled resumes that
are due, settle right after a write what no live worker applies, and wait for a change to settle.

Agents, the sidecar's reconciler, the check job's repairs and ``wait=`` loops call these; each is
one compare-and-set write through :mod:`.writes`, planned purely (:mod:`.plans`) from the record
and, for a settle, from the worker list and acks read after it (the ``prepare`` step of the
write loop: model/README.md, finding 1).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime

from locstatus.backends.base import AckMap
from locstatus.errors import LocstatusError, NotFound
from locstatus.fsm import Event
from locstatus.models import LocationStatus, WorkerInfo, new_op_id
from locstatus.names import check_location

from .core import Core
from .liveness import lagging_workers, settle_timeout, worker_live
from .plans import (
    NOTHING,
    Decision,
    Plan,
    Refuse,
    ServiceArg,
    Write,
    plan_events,
    services_arg,
    targets,
)
from .writes import Prepare, WriteRequest

log = logging.getLogger("locstatus.manager")


SETTLE_BATCH = 1000
"""Locations one round of :func:`settle_many` reads and writes together (records, acks and
compare-and-sets: bounded in memory, a few requests per round rather than a few per location)."""


def settle(core: Core, location: str, service: ServiceArg = None) -> LocationStatus:
    """Settle pausing -> paused / resuming -> running for the targeted services whose current
    generation every live worker has acknowledged (see :meth:`Manager.settle`)."""
    check_location(location)
    names = services_arg(service, core.services)
    op_id = new_op_id()
    return core.writer.write(
        location, prepare=_settle_prepare(core, location, names, op_id), op_id=op_id
    )


def _settle_prepare(
    core: Core, location: str, names: Sequence[str] | None, op_id: str
) -> Prepare:
    """The settle's ``prepare``: the worker list and the acks read after the record given
    (model/README.md, finding 1), then a pure plan."""

    def prepare(rec: LocationStatus) -> Plan:
        pending = _pending(rec, names)
        if isinstance(pending, LocstatusError):
            error = pending
            return lambda _rec, _now: Refuse(error)
        if not pending:
            return lambda _rec, _now: NOTHING  # nothing to settle: no workers or acks read
        workers = core.backend.workers()
        acks = core.backend.acks(location)
        return _settle_ready(core, rec, pending, workers, acks, op_id)

    return prepare


def _pending(rec: LocationStatus, names: Sequence[str] | None) -> list[str] | LocstatusError:
    """The targeted services of ``rec`` that are pausing/resuming (or why none can be)."""
    chosen = targets(rec, names)
    if isinstance(chosen, LocstatusError):
        return chosen
    return [s for s in chosen if rec.services[s].state.transitional]


def _settle_ready(
    core: Core,
    rec: LocationStatus,
    pending: Sequence[str],
    workers: Sequence[WorkerInfo],
    acks: AckMap,
    op_id: str,
) -> Plan:
    """The plan settling those of ``pending`` every live worker of ``workers`` acknowledged
    at ``rec``'s generation (``workers`` and ``acks`` read after ``rec``)."""
    location = rec.location

    def plan(rec: LocationStatus, now: datetime) -> Decision:
        ready = [
            s
            for s in pending
            if not lagging_workers(
                location, s, rec.services[s].generation, workers, acks, core.time
            )
        ]
        return plan_events(
            rec, now, op_id, ready,
            lambda s: Event("settle", generation=rec.services[s].generation, acked=True),
        )

    return plan


def settle_many(
    core: Core,
    locations: Sequence[str],
    service: ServiceArg = None,
    *,
    known: Mapping[str, LocationStatus] | None = None,
) -> dict[str, LocationStatus | LocstatusError]:
    """:func:`settle` for many locations, :data:`SETTLE_BATCH` at a time: per batch the
    records read together (:meth:`~locstatus.backends.base.Backend.read_many`), then, after
    them, the worker list once and the acks of the transitional ones together
    (:meth:`~locstatus.backends.base.Backend.acks_many`), and the settles written together
    (:meth:`~.writes.Writer.write_batch`: each location its own compare-and-set on the version
    read, its history in the same write). The settle rules are :func:`settle`'s (docs/design.md
    §3): a location settles only when every live worker acknowledged its current generation.
    A location that conflicted is read again and settled alone, its workers and acks read
    again after that read; its conflict or error fails no other.

    Returns location -> its record after the settle (the one read when nothing was to settle),
    or the :class:`LocstatusError` it ended with (:class:`NotFound`, a corrupt record, an
    unknown service, a backend error of its batch's reads).

    ``known``: location -> a record of it this process holds (an agent's local copy). A batch
    first reads the workers and the acks alone, and a location where some live worker has not
    acknowledged the generation of ``known`` for any of its transitional services is not
    read (a burst's settler tries while the others still acknowledge): its record returned is
    the known one. Generations only grow within a life, so that check only ever skips an
    attempt that could not settle (or one of a location re-created since, tried again once the
    copy has its new life); the locations kept are settled as above.

    Raises :class:`InvalidInput` for a bad location name or service, before anything is
    read."""
    for loc in locations:
        check_location(loc)
    names = services_arg(service, core.services)
    op_id = new_op_id()
    out: dict[str, LocationStatus | LocstatusError] = {}
    wanted = list(dict.fromkeys(locations))
    for i in range(0, len(wanted), SETTLE_BATCH):
        chunk = wanted[i : i + SETTLE_BATCH]
        try:
            if known:
                chunk = _maybe_ready(core, chunk, names, known, out)
            requests = _settle_requests(core, chunk, names, op_id, out) if chunk else []
        except LocstatusError as exc:  # this batch's reads: each of its locations ends so
            for loc in chunk:
                out.setdefault(loc, exc)
            continue
        for req, after in core.writer.write_batch(requests):
            out[req.location] = after
    return out


def _maybe_ready(
    core: Core,
    chunk: Sequence[str],
    names: Sequence[str] | None,
    known: Mapping[str, LocationStatus],
    out: dict[str, LocationStatus | LocstatusError],
) -> list[str]:
    """The locations of ``chunk`` that may settle, judged from the workers and the acks read
    now against the ``known`` records; the others go to ``out`` as their known record."""
    judged = {loc: rec for loc in chunk if (rec := known.get(loc)) is not None}
    if not judged:
        return list(chunk)
    workers = core.backend.workers()
    acks = core.backend.acks_many(list(judged))
    kept: list[str] = []
    for loc in chunk:
        rec = judged.get(loc)
        pending = None if rec is None else _pending(rec, names)
        if rec is not None and isinstance(pending, list) and pending and all(
            lagging_workers(
                loc, s, rec.services[s].generation, workers, acks.get(loc, {}), core.time
            )
            for s in pending
        ):
            out[loc] = rec  # someone still to acknowledge what this copy holds: not read
        else:
            kept.append(loc)
    return kept


def _settle_requests(
    core: Core,
    chunk: Sequence[str],
    names: Sequence[str] | None,
    op_id: str,
    out: dict[str, LocationStatus | LocstatusError],
) -> list[WriteRequest]:
    """Read one batch of :func:`settle_many` and plan it: the settles to write; what needs no
    write goes to ``out``."""
    got = core.backend.read_many(chunk)
    pending: dict[str, tuple[LocationStatus, list[str]]] = {}
    for loc, rec in zip(chunk, got, strict=True):
        if isinstance(rec, LocstatusError):
            if isinstance(rec, NotFound):
                core.writer.hints.drop(loc)
            out[loc] = rec
            continue
        core.writer.hints.put(rec)
        svcs = _pending(rec, names)
        if isinstance(svcs, LocstatusError) or not svcs:
            out[loc] = svcs if isinstance(svcs, LocstatusError) else rec
            continue
        pending[loc] = (rec, svcs)
    if not pending:
        return []
    workers = core.backend.workers()  # after every record of the batch is read
    acks = core.backend.acks_many(list(pending))
    requests: list[WriteRequest] = []
    for loc, (rec, svcs) in pending.items():
        plan = _settle_ready(core, rec, svcs, workers, acks.get(loc, {}), op_id)
        if not isinstance(plan(rec, core.writer.clock()), Write):
            out[loc] = rec  # someone still to acknowledge: nothing written
            continue
        requests.append(
            WriteRequest(loc, plan, op_id, known=rec,
                         prepare=_settle_prepare(core, loc, names, op_id))
        )
    return requests


def fire_due_resumes(
    core: Core, location: str, services: ServiceArg = None, *, actor: str = "scheduler"
) -> LocationStatus:
    """Fire the scheduled resumes of ``location`` that are due, then settle what no live worker
    applies (see :meth:`Manager.fire_due_resumes`)."""
    check_location(location)
    only = services_arg(services, core.services)
    op_id = new_op_id()

    def plan(rec: LocationStatus, now: datetime) -> Decision:
        if rec.deleted:
            return NOTHING
        due = {
            s: st.resume_at
            for s, st in rec.services.items()
            if (only is None or s in only) and st.resume_due(core.time)
        }
        return plan_events(
            rec, now, op_id, list(due),
            lambda s: Event("resume_due", at=due[s], actor=actor, reason="scheduled resume"),
        )

    fired = core.writer.write(location, plan, op_id=op_id)
    return settle_unwatched(core, fired, op_id, actor, "scheduled resume")


def settle_unwatched(
    core: Core, stored: LocationStatus, op_id: str, actor: str | None, reason: str | None
) -> LocationStatus:
    """After a write of this call (``op_id``) left services pausing/resuming: settle those
    no live worker (:func:`~.liveness.worker_live`) applies, in a write of their own, and return
    the record as it then is (docs/design.md §3: no live worker counts as all). The settle's
    history rows name this call's ``actor`` and ``reason`` (docs/cli.md, "Reading state").

    The worker list is read *after* the transitional record is visible, never in the planning
    of the write that made it (the ``one_write_settle`` finding of model/README.md): a worker
    registering after that read reads the pausing record, not the one before it; one
    registered before it is listed (the backend's
    :meth:`~locstatus.backends.base.Backend.workers` is as fresh as the write). A service
    another write touched since (its ``op_id`` is no longer ours) is left to that write or to a
    later :func:`settle`. Returned: the record this call's settle wrote; when another process
    settled or changed it first (a sidecar's reconciler woken by the write), the record this
    call's own write stored, as after a lost reply: the caller still sees its ``op_id`` and
    version."""
    location = stored.location
    mine = [
        s
        for s, st in sorted(stored.services.items())
        if st.op_id == op_id and st.state.transitional
    ]
    if not mine or stored.deleted:
        return stored
    try:
        return _settle_mine(core, stored, mine, op_id, actor, reason)
    except LocstatusError as exc:
        # The call's own write landed: report that, not this error. What stays
        # transitional is settled by the next settle() (reconciler, check --repair,
        # wait=), as for any write whose settle did not happen.
        log.warning(
            "location %s: op %s left %s pausing/resuming and could not settle it (%s); "
            "the next settle does (sidecar reconciler, check --repair, wait=)",
            location, op_id, ", ".join(mine), exc,
        )
        return stored


def settle_unwatched_many(
    core: Core,
    stored: Sequence[LocationStatus],
    op_id: str,
    actor: str | None,
    reason: str | None,
) -> dict[str, LocationStatus]:
    """:func:`settle_unwatched` for the records a bulk operation's batch just wrote: the
    worker list read once for the batch, after every one of its writes is visible (so after
    each record's own write, as :func:`settle_unwatched` reads it), the settles written as
    one batch (:meth:`~.writes.Writer.write_batch`, planned from the records written).
    Returns location -> the record this settle wrote, for each record of ``stored`` that it
    settled (:func:`settle_unwatched` returns that one; for the others, the record given)."""
    out: dict[str, LocationStatus] = {}
    by_location: dict[str, LocationStatus] = {}
    mine: dict[str, list[str]] = {}
    for rec in stored:  # one pass, no sort for the usual one service
        if rec.deleted_at is not None:
            continue
        svcs = [
            s for s, st in rec.services.items() if st.op_id == op_id and st.state.transitional
        ]
        if svcs:
            by_location[rec.location] = rec
            mine[rec.location] = sorted(svcs) if len(svcs) > 1 else svcs
    if not mine:
        return out
    try:
        live = [w for w in core.backend.workers() if worker_live(w, core.time)]
    except LocstatusError as exc:
        log.warning(
            "op %s left %d locations pausing/resuming and could not read the workers to "
            "settle them (%s); the next settle does (sidecar reconciler, check --repair, wait=)",
            op_id, len(mine), exc,
        )
        return out
    requests: list[WriteRequest] = []
    wanted: dict[str, dict[str, int]] = {}
    # a service some live worker applies at every location is watched wherever it is: asked
    # once for the batch, not per location (the usual fleet: every location watched)
    everywhere = {
        s for w in live if w.locations is None and w.corrupt is None for s in w.services
    }
    filtered = [w for w in live if w.locations is not None or w.corrupt is not None]
    for location, svcs in mine.items():
        rec = by_location[location]
        left = [s for s in svcs if s not in everywhere]
        unwatched = _unwatched(rec, left, filtered) if left else {}
        if unwatched:
            wanted[location] = unwatched
            requests.append(
                WriteRequest(location, _settle_plan(unwatched, op_id, actor, reason), op_id,
                             known=rec)
            )
    for req, after in core.writer.write_batch(requests):
        if isinstance(after, LocstatusError):
            log.warning(
                "location %s: op %s left %s pausing/resuming and could not settle it (%s); "
                "the next settle does (sidecar reconciler, check --repair, wait=)",
                req.location, op_id, ", ".join(mine[req.location]), after,
            )
        elif _settled_by(after, wanted[req.location], op_id):
            out[req.location] = after
    return out


def _unwatched(
    stored: LocationStatus, mine: Sequence[str], live: Sequence[WorkerInfo]
) -> dict[str, int]:
    """The services of ``mine`` no live worker applies at the record's location, with the
    generation to settle."""
    location = stored.location
    return {
        s: stored.services[s].generation
        for s in mine
        if not any(w.applies(location, s) for w in live)
    }


def _settle_plan(
    unwatched: Mapping[str, int], op_id: str, actor: str | None, reason: str | None
) -> Plan:
    def plan(rec: LocationStatus, now: datetime) -> Decision:
        if rec.deleted:
            return NOTHING
        ready = [
            s
            for s, generation in unwatched.items()
            if (st := rec.services.get(s)) is not None
            and st.op_id == op_id
            and st.generation == generation
            and st.state.transitional
        ]
        return plan_events(
            rec, now, op_id, ready,
            lambda s: Event(
                "settle", generation=unwatched[s], acked=True, actor=actor, reason=reason
            ),
        )

    return plan


def _settled_by(after: LocationStatus, unwatched: Mapping[str, int], op_id: str) -> bool:
    return any(
        (st := after.services.get(s)) is not None and st.op_id == op_id
        and not st.state.transitional
        for s in unwatched
    )


def _settle_mine(
    core: Core,
    stored: LocationStatus,
    mine: Sequence[str],
    op_id: str,
    actor: str | None,
    reason: str | None,
) -> LocationStatus:
    live = [w for w in core.backend.workers() if worker_live(w, core.time)]
    unwatched = _unwatched(stored, mine, live)
    if not unwatched:
        return stored
    plan = _settle_plan(unwatched, op_id, actor, reason)
    after = core.writer.write(stored.location, plan, op_id=op_id, use_hint=True)
    if _settled_by(after, unwatched, op_id):
        return after  # settled by this call
    return stored  # settled or changed by another call first: what this call wrote


def wait_settled(
    core: Core, location: str, service: ServiceArg = None, *, timeout: float
) -> LocationStatus:
    """Block until the targeted services of ``location`` are no longer pausing/resuming (see
    :meth:`Manager.wait_settled`)."""
    names = services_arg(service, core.services)
    outcome = wait_all(core, {location: names}, timeout=timeout)[location]
    if isinstance(outcome, LocstatusError):
        raise outcome
    return outcome


def wait_all(
    core: Core, pending: Mapping[str, Sequence[str] | None], *, timeout: float
) -> dict[str, LocationStatus | LocstatusError]:
    """Wait for several locations at once until one shared deadline, ``timeout`` seconds from
    now on this process's monotonic clock: ``pending`` maps each location to the services to
    wait for (canonical names, or None: all of the location's). Each round settles every
    location still pending (:func:`settle_many`, in batches), then sleeps until a change hint
    or at most 0.25 s. Returns location -> its settled record, or the error it ended with: a
    :class:`SettleTimeout` naming its lagging (and stuck) workers when the deadline passed, or
    what the settle raised (:class:`NotFound` for a location removed from the store...)."""
    deadline = time.monotonic() + timeout
    woken = threading.Event()
    left = dict(pending)
    out: dict[str, LocationStatus | LocstatusError] = {}
    unsubscribe = core.backend.subscribe(lambda _hint: woken.set())
    try:
        while left:
            woken.clear()
            late: dict[str, tuple[LocationStatus, list[str]]] = {}
            for location, settled in _settle_each(core, left).items():
                names = left[location]
                if isinstance(settled, LocstatusError):
                    out[location] = settled
                    del left[location]
                    continue
                rec = settled
                chosen = targets(rec, names)
                if isinstance(chosen, LocstatusError):
                    out[location] = chosen
                    del left[location]
                    continue
                still = [s for s in chosen if rec.services[s].state.transitional]
                if not still:
                    out[location] = rec
                    del left[location]
                else:
                    late[location] = (rec, still)
            if not left:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                workers = core.backend.workers()
                for location, (rec, still) in late.items():
                    try:
                        acks = core.backend.acks(location)
                    except LocstatusError as exc:
                        out[location] = exc
                        continue
                    out[location] = settle_timeout(
                        rec, still, timeout, workers, acks, core.time
                    )
                break
            woken.wait(min(remaining, 0.25))
    finally:
        unsubscribe()
    return out



def _settle_each(
    core: Core, pending: Mapping[str, Sequence[str] | None]
) -> dict[str, LocationStatus | LocstatusError]:
    """One :func:`settle_many` per distinct service selection of ``pending`` (a bulk
    operation's wait has one), every location's outcome."""
    groups: dict[tuple[str, ...] | None, list[str]] = {}
    for location, names in pending.items():
        groups.setdefault(None if names is None else tuple(names), []).append(location)
    out: dict[str, LocationStatus | LocstatusError] = {}
    for names, locations in groups.items():
        out.update(settle_many(core, locations, None if names is None else list(names)))
    return out
