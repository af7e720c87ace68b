"""What every request handler of the sidecar shares: the per-app :class:`Context` (the manager,
the token, metrics, the reconciler and the last check) and the mutation path of one location
or of ``all``.

Why it is its own module: the native routes (:mod:`.routes`) and the Backbeat routes
(:mod:`.backbeat`) both run their mutations through it, and the app factory (:mod:`.app`) builds
it; keeping it below all three means no route module imports the app (no api/app <-> backbeat
cycle). A mutation is a manager :class:`~locstatus.manager.Operation`: run on one location
(:meth:`~locstatus.manager.Manager.apply`) or on ``all`` by the manager's one bulk operation
(:meth:`~locstatus.manager.Manager.bulk`); this module maps the outcome to responses and
counts it in the metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from locstatus.errors import (
    CorruptRecord,
    InvalidInput,
    LocstatusError,
    NotFound,
    PreconditionFailed,
)
from locstatus.manager import BulkItem, BulkReport, Manager, Operation, Outcome
from locstatus.models import LocationStatus
from locstatus.names import BULK_LOCATION, SERVICE_ALIASES, check_location

from . import problems
from .metrics import Metrics
from .principals import Principals
from .responses import bulk_response, dump, location_response, parse_if_match

if TYPE_CHECKING:
    from locstatus.reconciler import Reconciler

log = logging.getLogger("locstatus.api")

ALL = BULK_LOCATION
"""The location (and service) name that means "every one" in mutating routes."""

T = TypeVar("T")

@dataclass
class CheckState:
    """Where the server's periodic check stores its last outcome (read by ``/v1/check``)."""

    result: Any = None
    at: datetime | None = None
    duration: float = 0.0
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


# -- the per-app context ----------------------------------------------------------------------


class Context:
    """What the routes share: the manager, the token, metrics and helpers. Every time is the
    manager's (``mgr.time``, the backend's; docs/time.md)."""

    def __init__(
        self,
        mgr: Manager,
        *,
        token: str | None,
        metrics: Metrics,
        reconciler: Reconciler | None,
        check: CheckState | None,
        inline_reads: bool | None = None,
        principals: Principals | None = None,
    ) -> None:
        self.mgr = mgr
        self.token = token
        self.principals = principals or Principals.from_settings(tokens_file=None, token=token)
        """Who may call (docs/http.md "Callers and roles")."""
        self.metrics = metrics
        self.reconciler = reconciler
        self.check = check
        local = mgr.backend.local_reads
        self.inline_reads = inline_reads if inline_reads is not None else local
        """Run single reads on the event loop: true for backends whose reads stay on this host
        (:attr:`Backend.local_reads`: SQLite in WAL mode, memory), false for network ones."""

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call a quick backend read: inline for local backends, else in the thread pool."""
        if self.inline_reads:
            return fn(*args, **kwargs)
        return await run_in_threadpool(fn, *args, **kwargs)

    # -- names ----------------------------------------------------------------------------

    def service_arg(self, name: str) -> str | None:
        """``all`` -> None (every service); else the canonical configured name.
        Raises :class:`NotFound` for a service that is not configured."""
        if name == ALL:
            return None
        canon = SERVICE_ALIASES.get(name, name)
        if canon not in self.mgr.services:
            shown = name if len(name) <= 64 else name[:61] + "..."
            raise NotFound(
                f"unknown service {shown!r}: expected one of {', '.join(self.mgr.services)}, "
                "crr or all"
            )
        return canon

    # -- mutations ------------------------------------------------------------------------

    def single(
        self,
        location: str,
        operation: Operation,
        *,
        if_match: str | None = None,
        wait: float | None = None,
    ) -> LocationStatus:
        """Run ``operation`` on one location (:meth:`Manager.apply
        <locstatus.manager.Manager.apply>`); ``if_match`` is the raw header. Raises the
        manager's errors (:class:`PreconditionFailed` on a stale If-Match)."""
        check_location(location)
        versions = parse_if_match(if_match) if if_match is not None else None
        before = self.mgr.status(location)
        if_version: int | None = None
        if versions:
            if len(versions) == 1:
                if_version = versions[0]
            elif before.version in versions:
                if_version = before.version  # still checked by the compare-and-set
            else:
                raise PreconditionFailed(
                    f"location {location!r} is at version {before.version}, "
                    f"not one of {', '.join(map(str, versions))}"
                )
        event = operation.event
        try:
            after = self.mgr.apply(location, operation, if_version=if_version)
        except LocstatusError as exc:
            self.metrics.transition(event, type(exc).__name__)
            raise
        self.metrics.transition(event, "applied" if after.version != before.version else "noop")
        _log_changes(event, before, after)
        if wait is not None:
            after = self.mgr.wait_settled(location, operation.service, timeout=wait)
        return after

    def bulk(
        self,
        operation: Operation,
        *,
        wait: float | None = None,
        moved: dict[str, dict[str, str]] | None = None,
        refuse: bool = False,
    ) -> dict[str, LocationStatus | LocstatusError]:
        """Run ``operation`` on every location that is not removed: the manager's one bulk
        operation (:meth:`Manager.bulk <locstatus.manager.Manager.bulk>`). Returns location
        -> stored record or error for every location the operation concerns: a location
        without the service, or (a schedule) with nothing paused, is skipped and left out; a
        corrupt record is there as its :class:`CorruptRecord` (whether it has the service is
        unknown: never silently outside). With ``wait``, every write is done first, then
        every location is waited for until one shared deadline. Each location's write is
        counted in the transition metrics as it is decided. ``moved`` is filled with location
        -> {service: the ISO time its scheduled resume had} for every schedule this operation
        moved (the ``rescheduled`` member of docs/http.md, "Bulk operations"). ``refuse``:
        raise the report's refusal (:attr:`BulkReport.refusal
        <locstatus.manager.BulkReport.refusal>`: no location stored, or every one skipped),
        the rule ``locstatus pause all`` exits 1 by."""
        event = operation.event
        each = log.isEnabledFor(logging.DEBUG)

        def count(item: BulkItem, _done: int, _total: int | None) -> None:
            if item.outcome is Outcome.CHANGED:
                self.metrics.transition(event, "applied")
                if each and item.status is not None:
                    _log_changes(event, None, item.status, operation.service, logging.DEBUG)
            elif item.outcome is Outcome.UNCHANGED:
                self.metrics.transition(event, "noop")
            elif item.outcome is Outcome.FAILED and not isinstance(item.error, CorruptRecord):
                self.metrics.transition(event, type(item.error).__name__)

        started = time.monotonic()
        report = self.mgr.bulk(operation, wait=wait, progress=count)
        _log_bulk(report, time.monotonic() - started)
        if refuse and report.refusal is not None:
            raise report.refusal
        out: dict[str, LocationStatus | LocstatusError] = {}
        for item in report.items:
            if item.error is not None:
                out[item.location] = item.error
            elif item.outcome is not Outcome.SKIPPED and item.status is not None:
                out[item.location] = item.status
            if moved is not None and item.rescheduled:
                moved[item.location] = {
                    svc: was.isoformat().replace("+00:00", "Z") for svc, was in item.rescheduled
                }
        return out

    def respond(
        self,
        request: Request,
        location: str,
        operation: Operation,
        *,
        if_match: str | None,
        wait: float | None = None,
        render: Callable[[LocationStatus], Any] | None = None,
    ) -> Response:
        """Run a native mutation for one location (ETag'd record) or ``all`` (bulk). An
        ``all`` that concerns no location is refused as the CLI refuses it (docs/http.md,
        "Bulk operations"): 409 when every location was skipped (none has the service, or a
        schedule with nothing paused), 404 when no location is stored."""
        if location != ALL:
            rec = self.single(location, operation, if_match=if_match, wait=wait)
            return location_response(rec)
        if if_match is not None:
            raise InvalidInput("If-Match cannot be used with location 'all' (one version each)")
        moved: dict[str, dict[str, str]] = {}
        results = self.bulk(operation, wait=wait, moved=moved, refuse=True)
        return bulk_response(request, results, render or dump, rescheduled=moved)


LOGGED_FAILURES = 10
"""How many failed locations of one bulk operation are logged by name (each a WARNING)."""


def _log_bulk(report: BulkReport, seconds: float) -> None:
    """One INFO record per bulk operation (docs/http.md "Logs"): its counts by outcome, its
    duration, op_id and actor, then a WARNING for each of the first :data:`LOGGED_FAILURES`
    failed locations: at 100 000 locations a record per location was 100 000 lines for one
    call (each change stays at DEBUG)."""
    counts = Counter(item.outcome.value for item in report.items)
    op = report.operation
    label = f"{op.event} all"
    log.info(
        "%s: %s in %.1f s (op_id %s)", label,
        ", ".join(f"{counts[o.value]} {o.value}" for o in Outcome), seconds, report.op_id,
        extra={"event": op.event, "op_id": report.op_id, "actor": op.actor,
               "duration": round(seconds, 3), "locations": len(report.items),
               **{o.value: counts[o.value] for o in Outcome}},
    )
    failed = report.failed
    for item in failed[:LOGGED_FAILURES]:
        log.warning(
            "%s %s: %s", label, item.location,
            problems.redact(item.error.message if item.error else "failed"),
            extra={"event": op.event, "op_id": report.op_id, "location": item.location},
        )
    if len(failed) > LOGGED_FAILURES:
        log.warning("%s: %d more failed locations not logged (op_id %s)", label,
                    len(failed) - LOGGED_FAILURES, report.op_id,
                    extra={"event": op.event, "op_id": report.op_id})


def _log_changes(
    event: str, before: LocationStatus | None, after: LocationStatus,
    service: str | Iterable[str] | None = None, level: int = logging.INFO,
) -> None:
    """One record (at ``level``) per service this request changed (its last ``op_id``
    moved), with the location, service, op_id and actor (docs/http.md "Logs"). ``before``
    None (bulk): the services named by ``service`` (None: every one) whose last change is
    ``after``'s."""
    named = None if service is None else {service} if isinstance(service, str) else set(service)
    for svc, st in after.services.items():
        if before is not None:
            old = before.services.get(svc)
            if old is not None and old.op_id == st.op_id:
                continue
        elif named is not None and svc not in named:
            continue
        log.log(
            level, "%s %s/%s: %s (version %d)", event, after.location, svc, st.state.value,
            after.version,
            extra={"location": after.location, "service": svc, "op_id": st.op_id,
                   "actor": st.actor, "event": event, "state": st.state.value,
                   "version": after.version},
        )


async def context(request: Request) -> Context:
    """The app's :class:`Context` (an ``async`` dependency: no thread-pool hop)."""
    ctx: Context = request.app.state.locstatus
    return ctx


Ctx = Annotated[Context, Depends(context)]
