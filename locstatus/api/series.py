"""The series an on-call engineer alerts on (docs/http.md "Metrics to alert on"): per location
and service, per worker, and the sidecar's own consistency check.

Why it is shaped so: a Prometheus series is kept for every label set it ever saw, so every
label set here is bounded whatever the store holds.

- Fleet-wide aggregates carry only ``service`` and ``state`` labels and are always present
  (0 when nothing matches): ``locstatus_service_seconds_in_state_max{service,state}`` (the
  longest time any location has been in that state) is what the shipped alerts read
  (``deploy/prometheus/alerts.yml``), so they hold at 100 000 locations.
- Per-location series (``location`` and ``service`` labels) exist only for services that are
  not ``running`` (the normal state says nothing to an on-call engineer), at most ``limit``
  of them (default 1000, ``serve --location-series``; 0 turns them off): every pausing and
  resuming one first (a stuck transition is never left out below the limit), then the ones
  that changed longest ago (a location paused too long is among them); the ones left out are
  counted in ``locstatus_location_series_omitted``. 100 000 paused locations are then 1000
  series, not 300 000, and the set only changes when a service changes state.
- Per-worker series exist for registered workers only (a fleet's size), under the same limit.
- The check's series have the names ``locstatus check --metrics-file`` writes
  (:func:`locstatus.check.report_families`), so one rule reads either.

Ages are by the backend's time (``mgr.clock()``, docs/time.md), never this host's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from locstatus.backends import AckMap
from locstatus.clock import TimeSource
from locstatus.manager import lagging_workers, worker_live
from locstatus.models import LocationStatus, ServiceStatus, State, WorkerInfo

DEFAULT_LIMIT = 1000
"""Per-location (and per-worker) series kept by default: the oldest ones."""
_TRANSITIONAL = frozenset(s for s in State if s.transitional)


@dataclass(frozen=True)
class CheckView:
    """The sidecar's last periodic check as the metrics see it: the report (a
    :class:`~locstatus.check.CheckReport`) or None, and the error of the last run or None."""

    report: Any
    error: str | None


def location_series(
    records: Sequence[LocationStatus],
    workers: Sequence[WorkerInfo],
    acks: dict[str, AckMap],
    now: datetime,
    time_source: TimeSource,
    services: Sequence[str],
    limit: int,
) -> Iterator[Metric]:
    """The per-location and per-worker families, and their fleet-wide maxima.

    ``records``: every record read (tombstones are skipped); ``acks``: location -> worker ->
    service -> generation acknowledged; ``now``: the backend's time; ``limit``: at most this
    many per-location series per family (the oldest), and per-worker ones.
    """
    longest = {(s, st.value): 0.0 for s in services for st in State}
    # (age, location, service, state, scheduled resume, lagging workers); transitions apart
    moving: list[tuple[float, str, str, str, datetime | None, int]] = []
    resting: list[tuple[float, str, str, ServiceStatus]] = []  # (-age, ...): oldest first
    lagging_of: dict[str, int] = {}
    running, transitional = State.RUNNING, _TRANSITIONAL
    now_ts = now.timestamp()
    for rec in records:
        if rec.deleted:
            continue
        for svc, st in rec.services.items():
            state = st.state
            if state is running:
                continue
            at = st.updated_at
            age = now_ts - at.timestamp() if at is not None else 0.0
            if age < 0.0:
                age = 0.0
            key = (svc, state.value)
            if age > longest.get(key, 0.0):
                longest[key] = age
            if state not in transitional:
                resting.append((-age, rec.location, svc, st))
                continue
            ids = lagging_workers(
                rec.location, svc, st.generation, workers, acks.get(rec.location, {}),
                time_source,
            )
            for w in ids:
                lagging_of[w] = lagging_of.get(w, 0) + 1
            moving.append((age, rec.location, svc, state.value, st.scheduled_resume, len(ids)))
    g = GaugeMetricFamily(
        "locstatus_service_seconds_in_state_max",
        "Longest time any location's service has been in this state, seconds by the backend's "
        "time (0: none; running is not measured)",
        labels=["service", "state"],
    )
    for (svc, name), age in sorted(longest.items()):
        if name != running.value:
            g.add_metric([svc, name], age)
    yield g
    # pausing and resuming first (a stuck transition is always there), then the oldest
    limit = max(0, limit)
    moving.sort(reverse=True)
    kept = moving[:limit]
    if len(kept) < limit:
        resting.sort()  # in C: cheaper than a heap with a key over 100 000s of services
        kept += [
            (-neg, loc, svc, st.state.value, st.scheduled_resume, 0)
            for neg, loc, svc, st in resting[: limit - len(kept)]
        ]
    omitted = len(moving) + len(resting) - len(kept)
    kept.sort(key=lambda r: (r[1], r[2]))
    g = GaugeMetricFamily(
        "locstatus_service_seconds_in_state",
        "Seconds since this service of this location last changed, for services not running "
        "(the oldest ones, up to the series limit)",
        labels=["location", "service", "state"],
    )
    for age, loc, svc, name, _, _ in kept:
        g.add_metric([loc, svc, name], age)
    yield g
    g = GaugeMetricFamily(
        "locstatus_scheduled_resume_timestamp_seconds",
        "When the scheduled resume of this service of this location is due (Unix time)",
        labels=["location", "service"],
    )
    for _, loc, svc, _, at, _ in kept:
        if at is not None:
            g.add_metric([loc, svc], at.timestamp())
    yield g
    g = GaugeMetricFamily(
        "locstatus_transition_lagging_workers",
        "Live workers that have not acknowledged this pausing or resuming service",
        labels=["location", "service", "state"],
    )
    for _, loc, svc, name, _, behind in kept:
        if name in (State.PAUSING.value, State.RESUMING.value):
            g.add_metric([loc, svc, name], float(behind))
    yield g
    g = GaugeMetricFamily(
        "locstatus_location_series_omitted",
        "Services not running whose per-location series were left out by the series limit",
    )
    g.add_metric([], float(omitted))
    yield g
    yield from _worker_series(workers, lagging_of, time_source, limit)


def _worker_series(
    workers: Sequence[WorkerInfo],
    lagging_of: dict[str, int],
    time_source: TimeSource,
    limit: int,
) -> Iterator[Metric]:
    live = sorted(
        (w for w in workers if worker_live(w, time_source) and w.corrupt is None),
        key=lambda w: (-lagging_of.get(w.worker_id, 0), w.worker_id),
    )[: max(0, limit)]
    g = GaugeMetricFamily(
        "locstatus_worker_lagging_transitions",
        "Pausing or resuming location-services this live worker has not acknowledged",
        labels=["worker"],
    )
    for w in live:
        g.add_metric([w.worker_id], float(lagging_of.get(w.worker_id, 0)))
    yield g
    g = GaugeMetricFamily(
        "locstatus_worker_clock_offset_seconds",
        "The clock offset a live worker published: its host's clock minus the backend's time",
        labels=["worker"],
    )
    for w in live:
        if w.clock_offset_seconds is not None:
            g.add_metric([w.worker_id], w.clock_offset_seconds)
    yield g


def check_series(view: Callable[[], CheckView | None]) -> Iterator[Metric]:
    """The sidecar's periodic check (``serve --check-interval``), once it ran: every family of
    its last report (:func:`locstatus.check.report_families`) and ``locstatus_check_up`` (0
    when the last run failed). Nothing without a periodic check."""
    state = view()
    if state is None:
        return
    up = GaugeMetricFamily(
        "locstatus_check_up", "1 if the sidecar's last periodic consistency check ran"
    )
    up.add_metric([], 0.0 if state.error is not None or state.report is None else 1.0)
    yield up
    if state.report is None:
        return
    from locstatus.check import report_families

    for name, help_, samples in report_families(state.report):
        labels = sorted({k for lab, _ in samples for k in lab})
        g = GaugeMetricFamily(name, help_, labels=labels)
        for lab, value in samples:
            g.add_metric([lab[k] for k in labels], value)
        yield g
