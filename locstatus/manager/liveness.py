"""Liveness: which workers count, which lag behind a change, and how a wait that ran out says so.

The settle rule (docs/fsm.md, docs/design.md §3): a pausing/resuming service settles once every
*live* worker that applies it has acknowledged its current generation; none live counts as all.
A standing registration is live whatever its lease (docs/agent.md "Standing registrations").
A worker is dead only once its lease deadline has passed by the backend's time beyond doubt
(docs/time.md), so a clock that cannot tell keeps it alive. Pure functions over what was read:
the manager, the check job, the status page and the metrics all judge with these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from locstatus.backends.base import AckMap
from locstatus.clock import TimeSource
from locstatus.errors import SettleTimeout
from locstatus.models import LocationStatus, WorkerInfo


def worker_live(worker: WorkerInfo, time_source: TimeSource) -> bool:
    """True unless the worker's lease deadline has passed by the backend's time beyond doubt
    (docs/time.md): a worker is dead (may be settled without, dropped as expired) only then;
    while the clock cannot tell, it is alive. A session-held registration (no deadline) is
    alive while it is listed. A standing registration is always live, whatever its lease
    (docs/agent.md "Standing registrations"): nothing settles without it while it is away."""
    if worker.standing:
        return True
    expires = worker.lease_expires_at
    return expires is None or not time_source.is_past(expires)


def holder_away(worker: WorkerInfo, time_source: TimeSource) -> bool:
    """True when ``worker`` is a standing registration whose holder is away: no session holds
    it (ZooKeeper, :attr:`~locstatus.models.WorkerInfo.away`) or its lease deadline has passed
    by the backend's time beyond doubt. Always False for an ordinary registration."""
    if not worker.standing:
        return False
    expires = worker.lease_expires_at
    return worker.away or (expires is not None and time_source.is_past(expires))


def acks_lapsed(worker: WorkerInfo, session_leases: bool) -> bool:
    """True when what ``worker`` acknowledged is not known any more: a standing registration
    no session holds (:attr:`~locstatus.models.WorkerInfo.away`) on a store whose
    acknowledgements live as long as the session that wrote them (``session_leases``:
    ZooKeeper's ephemeral ack nodes went with its holder's session). Its lag then reads
    "unknown", not "acknowledged nothing" (docs/agent.md "Standing registrations"); the settle
    rule is the same (it still counts as not acknowledged)."""
    return session_leases and worker.standing and worker.away


def holder_present(worker: WorkerInfo, time_source: TimeSource) -> bool:
    """True when ``worker`` is a standing registration whose holder is present beyond doubt:
    on ZooKeeper its holder node exists, elsewhere its lease deadline is still ahead even at
    the worst end of the clock's uncertainty. A lease its holder ended when it stopped (the
    deadline it wrote is *now*) is not present, though it may not read as away yet
    (:func:`holder_away` waits until it passed beyond doubt). While the clock's uncertainty
    is above its bound (docs/time.md), a holder not away is present: a live holder's lease
    could read as ended then. What ``retire_worker`` never removes. Always False for an
    ordinary registration."""
    if not worker.standing or holder_away(worker, time_source):
        return False
    expires = worker.lease_expires_at
    if expires is None:
        return True
    try:
        slack = max(0.0, time_source.uncertainty_seconds())
    except Exception:  # a source that cannot say: judge on its estimate alone
        slack = 0.0
    if slack > time_source.max_uncertainty_seconds:
        return True  # cannot tell beyond doubt that its holder ended it
    return time_source.now() + timedelta(seconds=slack) < expires


RETIRE_ADVICE = ("retire it only once what it stands for is gone for good (the pauses it "
                 "holds back then settle without it)")
"""When to retire a standing registration whose holder is away, as every message that names
one says it (the wait= timeout, ``locstatus workers``, the check's repair plan): retiring one
whose Backbeat processor still runs lets a pause settle while that processor works on."""


def away_note(worker: WorkerInfo, time_source: TimeSource) -> str | None:
    """``"standing registration, holder away since 2026-05-01T10:00:00Z"`` for a standing
    registration whose holder is away (:func:`holder_away`): since its lease ran out, or, on
    ZooKeeper, ``"holder away (no session holds it)"``; None otherwise. Names the host and pid
    that held it last."""
    if not holder_away(worker, time_source):
        return None
    expires = worker.lease_expires_at
    since = (
        f"since {expires.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"
        if expires is not None and time_source.is_past(expires)
        else "(no session holds it)"
    )
    last = f"host {worker.host or '?'}, pid {worker.pid}"
    return (
        f"standing registration, holder away {since}: its holder ({last}) is not running; "
        f"start it again; {RETIRE_ADVICE}: locstatus workers retire {worker.worker_id}"
    )


def lagging_workers(
    location: str,
    service: str,
    generation: int,
    workers: Sequence[WorkerInfo],
    acks: AckMap,
    time_source: TimeSource,
) -> list[str]:
    """Ids of live workers (:func:`worker_live`) that apply ``service`` at ``location`` and
    have not acknowledged ``generation`` yet (the settle rule, docs/fsm.md)."""
    return [
        w.worker_id
        for w in workers
        if w.applies(location, service)
        and acks.get(w.worker_id, {}).get(service, -1) < generation
        and worker_live(w, time_source)
    ]


def stuck_handlers(
    workers: Sequence[WorkerInfo], ids: Iterable[str], now: datetime
) -> dict[str, str]:
    """For each of ``ids`` with a handler stuck past its deadline, where: ``"stuck 12s in
    pause handler mod.fn at us-east-1/replication"`` (several joined with ``; ``)."""
    wanted = set(ids)
    out: dict[str, str] = {}
    for w in workers:
        if w.worker_id in wanted and w.stuck:
            out[w.worker_id] = "; ".join(
                f"stuck {max(0.0, (now - h.since).total_seconds()):.0f}s in {h.event} handler "
                f"{h.handler} at {key}"
                for key, h in sorted(w.stuck.items())
            )
    return out


def away_notes(
    workers: Sequence[WorkerInfo], ids: Iterable[str], time_source: TimeSource
) -> dict[str, str]:
    """:func:`away_note` of each of ``ids`` that is a standing registration with its holder
    away."""
    wanted = set(ids)
    out: dict[str, str] = {}
    for w in workers:
        note = away_note(w, time_source) if w.worker_id in wanted else None
        if note is not None:
            out[w.worker_id] = note
    return out


def handler_errors(
    workers: Sequence[WorkerInfo], ids: Iterable[str], location: str, services: Iterable[str]
) -> dict[str, str]:
    """The last handler error each of ``ids`` published (``WorkerInfo.errors``) for one of
    ``services`` at ``location`` (several joined with ``; ``), e.g. the Backbeat bridge's
    ``its state node says paused: false; 0 subscriber(s) on backbeat-replication-zenko``."""
    wanted = set(ids)
    keys = [f"{location}/{s}" for s in services]
    out: dict[str, str] = {}
    for w in workers:
        found = [w.errors[k] for k in keys if k in w.errors]
        if w.worker_id in wanted and found:
            out[w.worker_id] = "; ".join(found)
    return out


def settle_timeout(
    rec: LocationStatus,
    pending: Sequence[str],
    timeout: float,
    workers: Sequence[WorkerInfo],
    acks: AckMap,
    time_source: TimeSource,
) -> SettleTimeout:
    """The :class:`SettleTimeout` of a wait for ``pending`` services of ``rec`` that ran out
    after ``timeout`` seconds: it names the lagging workers (and where a handler of theirs is
    stuck, or that a standing registration's holder is away, :func:`away_note`, and the last
    error its handler published there, :func:`handler_errors`), and the
    clock's problem when it refused to count a lapsed lease (docs/time.md)."""
    location = rec.location
    lagging = sorted(
        {
            w
            for s in pending
            for w in lagging_workers(
                location, s, rec.services[s].generation, workers, acks, time_source
            )
        }
    )
    stuck = stuck_handlers(workers, lagging, time_source.now())
    notes = {**away_notes(workers, lagging, time_source), **stuck}
    errors = handler_errors(workers, lagging, location, pending)
    for w, error in errors.items():
        notes[w] = "; ".join(n for n in (notes.get(w), f"last handler error: {error}") if n)
    named = [w + (f" ({notes[w]})" if w in notes else "") for w in lagging]
    problem = time_source.problem()
    return SettleTimeout(
        f"{location}: {', '.join(pending)} still "
        f"{'/'.join(sorted({rec.services[s].state.value for s in pending}))} "
        f"after {timeout:g}s; lagging workers: {', '.join(named) or 'none'}"
        + (
            f"; not settling without them while the {problem} (docs/time.md)"
            if problem
            else ""
        ),
        lagging,
        {w.worker_id: sorted(w.stuck) for w in workers if w.worker_id in stuck},
    )
