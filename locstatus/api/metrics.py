"""Prometheus metrics of the sidecar (``GET /metrics``, docs/design.md §5.3).

Why it is shaped so: each app gets its own :class:`~prometheus_client.CollectorRegistry` (several
apps in one test process never collide). Request counts and latencies and transition outcomes are
counted as they happen; everything that describes the *stored* state (services per state,
scheduled resumes pending and overdue, lagging workers, live workers) is read from the backend at
scrape time by a collector, so it is true for the whole fleet, not just for this process. If the
backend is down the scrape still answers, with ``locstatus_backend_up 0``.

Series (every label takes a bounded set of values, whatever clients send: ``route`` is the
route template, never the raw path, and ``unmatched`` for every path no route serves;
``method`` is one of :data:`HTTP_METHODS` or ``other``, since any token is a valid method to
HTTP and each new label value would be a new series kept forever):

- ``locstatus_http_requests_total{method,route,status}``,
  ``locstatus_http_request_duration_seconds{method,route}``
- ``locstatus_transitions_total{event,result}``: result ``applied | noop | <ErrorClass>``
- ``locstatus_cas_writes_total``, ``locstatus_cas_conflicts_total`` (each one retried),
  ``locstatus_cas_ambiguous_total``, ``locstatus_conflicts_exhausted_total``: this process
- ``locstatus_services{service,state}``, ``locstatus_scheduled_resumes_pending{service}``,
  ``locstatus_scheduled_resumes_overdue{service}``, ``locstatus_lagging_workers{service}``,
  ``locstatus_workers{alive}``, ``locstatus_locations{removed}``, ``locstatus_backend_up``,
  ``locstatus_backend_full`` (this process's latest write found the store full)
- ``locstatus_corrupt_records`` (location records that do not read: never left out of a count
  silently, docs/http.md "Corrupt records in listings"), ``locstatus_corrupt_workers``
  (registrations that do not read, each counted as a live worker applying everything:
  docs/agent.md "Unreadable registrations and acknowledgements")
- ``locstatus_reconciler_{runs,fired,settled,errors}_total``, ``..._last_run_timestamp_seconds``
- what on-call alerts read (:mod:`.series`): ``locstatus_service_seconds_in_state_max{service,
  state}``, and for the services not running, capped: ``locstatus_service_seconds_in_state{
  location,service,state}``, ``locstatus_scheduled_resume_timestamp_seconds{location,service}``,
  ``locstatus_transition_lagging_workers{location,service,state}``,
  ``locstatus_location_series_omitted``; per live worker ``locstatus_worker_lagging_transitions``
  and ``locstatus_worker_clock_offset_seconds``; after a periodic check ``locstatus_check_up``
  and the ``locstatus_check_*`` families of ``check --metrics-file``
- ``locstatus_clock_offset_seconds`` (this host's wall clock minus the backend's time),
  ``locstatus_clock_uncertainty_seconds`` (how far this process's estimate of the backend's
  time may be off), ``locstatus_clock_max_uncertainty_seconds`` (above it deadlines are
  refused), ``locstatus_clock_refusals_total`` (deadline decisions refused): docs/time.md
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from locstatus.errors import LocstatusError
from locstatus.fsm.table import EVENTS
from locstatus.manager import Manager, lagging_workers, worker_live
from locstatus.models import LocationStatus, State, WorkerInfo

from .series import DEFAULT_LIMIT, CheckView, check_series, location_series

if TYPE_CHECKING:
    from locstatus.reconciler import Reconciler

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
"""Methods counted under their own name; any other is counted as ``other``."""

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class _StateCollector(Collector):
    """Reads the stored state at scrape time."""

    def __init__(
        self,
        mgr: Manager,
        reconciler: Callable[[], Reconciler | None],
        check: Callable[[], CheckView | None],
        limit: int,
    ) -> None:
        self.mgr = mgr
        self.reconciler = reconciler
        self.check = check
        self.limit = limit

    def collect(self) -> Iterator[Metric]:
        stats = self.mgr.stats
        for name, key, doc in (
            ("locstatus_cas_writes", "writes", "Compare-and-set writes committed by this process"),
            ("locstatus_cas_conflicts", "conflicts",
             "Compare-and-set version conflicts (each one re-read and retried), this process"),
            ("locstatus_cas_ambiguous", "ambiguous",
             "Writes with an unknown outcome, resolved by op_id, this process"),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(stats.get(key, 0)))
            yield c
        yield from self._reconciler()
        full = GaugeMetricFamily(
            "locstatus_backend_full",
            "1 while this process's latest write found the store full (reads still work)",
        )
        full.add_metric([], 0.0 if self.mgr.backend.store_full is None else 1.0)
        yield full
        yield from check_series(self.check)
        up = GaugeMetricFamily("locstatus_backend_up", "1 if the last scrape read the backend")
        try:
            records, corrupt = self.mgr.listing(include_removed=True)
            workers = self.mgr.workers()
            acks = self.mgr.backend.all_acks()
            now = self.mgr.clock()
        except LocstatusError:
            up.add_metric([], 0.0)
            yield up
            yield from self._clock()
            return
        up.add_metric([], 1.0)
        yield up
        yield from self._clock()
        yield from self._state(records, workers, acks, now)
        yield from location_series(
            records, workers, acks, now, self.mgr.time,
            sorted(set(self.mgr.services) | {s for r in records for s in r.services}),
            self.limit,
        )
        g = GaugeMetricFamily(
            "locstatus_corrupt_records",
            "Location records that do not parse or validate (see 'locstatus check')",
        )
        g.add_metric([], float(len(corrupt)))
        yield g
        g = GaugeMetricFamily(
            "locstatus_corrupt_workers",
            "Worker registrations that do not parse, each counted as a live worker applying "
            "every service at every location",
        )
        g.add_metric([], float(sum(1 for w in workers if w.corrupt is not None)))
        yield g

    def _clock(self) -> Iterator[Metric]:
        """This process's view of the backend's time (docs/time.md)."""
        t = self.mgr.time
        offset = t.offset_seconds()
        if offset is not None:
            g = GaugeMetricFamily(
                "locstatus_clock_offset_seconds",
                "This host's wall clock minus the backend's time, seconds (positive: ahead)",
            )
            g.add_metric([], offset)
            yield g
        g = GaugeMetricFamily(
            "locstatus_clock_uncertainty_seconds",
            "How far this process's estimate of the backend's time may be off, seconds",
        )
        g.add_metric([], t.uncertainty_seconds())
        yield g
        g = GaugeMetricFamily(
            "locstatus_clock_max_uncertainty_seconds",
            "Uncertainty above which this process refuses to act on a deadline, seconds",
        )
        g.add_metric([], t.max_uncertainty_seconds)
        yield g
        c = CounterMetricFamily(
            "locstatus_clock_refusals",
            "Deadline decisions refused because the backend's time was not known within the bound",
        )
        c.add_metric([], float(t.refusals))
        yield c

    def _reconciler(self) -> Iterator[Metric]:
        rec = self.reconciler()
        if rec is None:
            return
        for key, doc in (
            ("runs", "Full reconcile passes"),
            ("fired", "Scheduled resumes fired by this sidecar"),
            ("settled", "Transitions settled by this sidecar"),
            ("errors", "Reconcile errors"),
        ):
            c = CounterMetricFamily(f"locstatus_reconciler_{key}", doc)
            c.add_metric([], float(rec.stats.get(key, 0)))
            yield c
        g = GaugeMetricFamily(
            "locstatus_reconciler_last_run_timestamp_seconds",
            "When the last full reconcile pass finished (unix time)",
        )
        g.add_metric([], rec.last_run.timestamp() if rec.last_run else 0.0)
        yield g

    def _state(
        self,
        records: list[LocationStatus],
        workers: list[WorkerInfo],
        acks: dict[str, dict[str, dict[str, int]]],
        now: datetime,
    ) -> Iterator[Metric]:
        time_source = self.mgr.time
        services = sorted(set(self.mgr.services) | {s for r in records for s in r.services})
        states = {(s, st.value): 0 for s in services for st in State}
        pending = dict.fromkeys(services, 0)
        overdue = dict.fromkeys(services, 0)
        lagging: dict[str, set[str]] = {s: set() for s in services}
        removed = 0
        for rec in records:
            if rec.deleted:
                removed += 1
                continue
            for svc, st in rec.services.items():
                states[(svc, st.state.value)] += 1
                if st.scheduled_resume is not None:
                    pending[svc] += 1
                    if st.resume_overdue(now):
                        overdue[svc] += 1
                if st.state.transitional:
                    lagging[svc].update(
                        lagging_workers(
                            rec.location, svc, st.generation, workers,
                            acks.get(rec.location, {}), time_source,
                        )
                    )
        g = GaugeMetricFamily(
            "locstatus_services", "Services per state, over every location",
            labels=["service", "state"],
        )
        for (svc, state), n in sorted(states.items()):
            g.add_metric([svc, state], float(n))
        yield g
        for name, values, doc in (
            ("locstatus_scheduled_resumes_pending", pending, "Scheduled resumes not fired yet"),
            ("locstatus_scheduled_resumes_overdue", overdue,
             "Scheduled resumes whose time has passed but that have not fired"),
        ):
            g = GaugeMetricFamily(name, doc, labels=["service"])
            for svc, n in sorted(values.items()):
                g.add_metric([svc], float(n))
            yield g
        g = GaugeMetricFamily(
            "locstatus_lagging_workers",
            "Live workers that have not acknowledged a pending transition",
            labels=["service"],
        )
        for svc, ids in sorted(lagging.items()):
            g.add_metric([svc], float(len(ids)))
        yield g
        g = GaugeMetricFamily("locstatus_workers", "Registered workers", labels=["alive"])
        alive = sum(1 for w in workers if worker_live(w, time_source))
        g.add_metric(["true"], float(alive))
        g.add_metric(["false"], float(len(workers) - alive))
        yield g
        g = GaugeMetricFamily("locstatus_locations", "Location records", labels=["removed"])
        g.add_metric(["false"], float(len(records) - removed))
        g.add_metric(["true"], float(removed))
        yield g


class Metrics:
    """The sidecar's metrics; one per app.

    Usage::

        metrics = Metrics(mgr)
        metrics.request("GET", "/v1/locations", 200, 0.002)
        body, content_type = metrics.render()
    """

    def __init__(
        self,
        mgr: Manager,
        *,
        reconciler: Callable[[], Reconciler | None] = lambda: None,
        check: Callable[[], CheckView | None] = lambda: None,
        location_series: int = DEFAULT_LIMIT,
    ) -> None:
        """``check``: the sidecar's last periodic check, if it runs one; ``location_series``:
        at most this many per-location (and per-worker) series, the oldest (0: none;
        :mod:`.series`). Raises :class:`ValueError` for a negative limit."""
        if location_series < 0:
            raise ValueError(f"location_series must be >= 0, got {location_series}")
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "locstatus_http_requests", "HTTP requests",
            ["method", "route", "status"], registry=self.registry,
        )
        self._latency = Histogram(
            "locstatus_http_request_duration_seconds", "HTTP request latency (seconds)",
            ["method", "route"], buckets=_BUCKETS, registry=self.registry,
        )
        self._transitions = Counter(
            "locstatus_transitions", "State-machine events by event and result",
            ["event", "result"], registry=self.registry,
        )
        for event in EVENTS:  # present from the start: a rate() over them is 0, not "no data"
            for result in ("applied", "noop"):
                self._transitions.labels(event, result)
        self._exhausted = Counter(
            "locstatus_conflicts_exhausted",
            "Operations refused because compare-and-set kept conflicting (409)",
            registry=self.registry,
        )
        self.registry.register(_StateCollector(mgr, reconciler, check, location_series))
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one request and its latency (seconds). ``route`` must be a route template or
        ``unmatched``; ``method`` is counted as ``other`` unless it is in :data:`HTTP_METHODS`."""
        if method not in HTTP_METHODS:
            method = "other"
        key = (method, route, status)
        child = self._children.get(key)
        if child is None:
            child = (
                self._requests.labels(method, route, str(status)),
                self._latency.labels(method, route),
            )
            self._children[key] = child
        child[0].inc()
        child[1].observe(seconds)

    def transition(self, event: str, result: str) -> None:
        """Count one state-machine event outcome (``applied``, ``noop`` or an error class)."""
        self._transitions.labels(event, result).inc()
        if result == "ConflictError":
            self._exhausted.inc()

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
