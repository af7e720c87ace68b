"""When a removed location's tombstone may be purged (docs/design.md §3.5, docs/check.md).

A tombstone stays until every live worker whose location filter admits the location has run its
``on_remove`` and acknowledged the removal, or until it is older than the TTL (a worker that
never acknowledges must not keep it forever). The scan asks this to report ``tombstone_ready``,
and the repair asks it again, on a fresh read, before it purges a tombstone that changed since
the scan. One rule for both, judged on the backend's time (docs/time.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

from locstatus.backends.base import AckMap
from locstatus.clock import TimeSource
from locstatus.manager import worker_live
from locstatus.models import TOMBSTONE_ACK, LocationStatus, WorkerInfo, tombstone_generation

Readiness = tuple[Literal["ttl", "acknowledged"], list[str], list[str]]
"""``(why, acknowledged_by, not_acknowledged_by)``: worker ids."""


def readiness(
    rec: LocationStatus,
    workers: Sequence[WorkerInfo],
    acks: AckMap,
    time_source: TimeSource,
    ttl: timedelta,
) -> Readiness | None:
    """``(why, acked, waiting)`` when the tombstone ``rec`` may be purged, else None.

    - ``workers``: every registration; those whose lease holds (:func:`worker_live`) and whose
      location filter admits ``rec.location`` must acknowledge it; as for settle, no such
      worker counts as all acknowledged (``why`` is ``acknowledged``, nobody waited for).
    - ``acks``: the location's acknowledgements; a worker acknowledged this removal when its
      ``_tombstone`` acknowledgement is at least :func:`tombstone_generation` of
      ``rec.deleted_at`` (an acknowledgement of an earlier removal never counts).
    - ``ttl``: older than the TTL means ``deleted_at + ttl`` passed by the backend's time beyond
      doubt (``time_source.is_past``, docs/time.md); ``why`` is then ``ttl``, whoever waits.

    ``rec`` must be a tombstone (``deleted_at`` set)."""
    assert rec.deleted_at is not None
    applying = [
        w
        for w in workers
        if (w.locations is None or rec.location in w.locations) and worker_live(w, time_source)
    ]
    removal = tombstone_generation(rec.deleted_at)
    acked = [
        w.worker_id
        for w in applying
        if acks.get(w.worker_id, {}).get(TOMBSTONE_ACK, 0) >= removal
    ]
    waiting = [w.worker_id for w in applying if w.worker_id not in acked]
    if time_source.is_past(rec.deleted_at + ttl):
        return "ttl", acked, waiting
    if not waiting:
        return "acknowledged", acked, waiting
    return None
