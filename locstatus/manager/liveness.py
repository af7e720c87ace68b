"""Liveness: which workers count, which lag behind a change, and how a wait that ran out says so.

The settle rule (docs/fsm.md, docs/design.md §3): a pausing/resuming service settles once every
*live* worker that applies it has acknowledged its current generation; none live counts as all.
A worker is dead only once its lease deadline has passed by the backend's time beyond doubt
(docs/time.md), so a clock that cannot tell keeps it alive. Pure functions over what was read:
the manager, the check job, the status page and the metrics all judge with these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from locstatus.backends.base import AckMap
from locstatus.clock import TimeSource
from locstatus.errors import SettleTimeout
from locstatus.models import LocationStatus, WorkerInfo


def worker_live(worker: WorkerInfo, time_source: TimeSource) -> bool:
    """True unless the worker's lease deadline has passed by the backend's time beyond doubt
    (docs/time.md): a worker is dead (may be settled without, dropped as expired) only then;
    while the clock cannot tell, it is alive. A session-held registration (no deadline) is
    alive while it is listed."""
    expires = worker.lease_expires_at
    return expires is None or not time_source.is_past(expires)


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
    stuck), and the clock's problem when it refused to count a lapsed lease (docs/time.md)."""
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
    named = [w + (f" ({stuck[w]})" if w in stuck else "") for w in lagging]
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
