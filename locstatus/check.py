"""The consistency check (docs/design.md §5.4, §3.5): find drift between what is stored and what
should hold, and repair what is safe to repair through the manager's compare-and-set path.

``locstatus check`` and the sidecar's periodic check (``GET /v1/check``) both call
:func:`run_check`. It reads everything once (workers, acknowledgements, every record), then
reports, per finding kind (:data:`KINDS`):

- ``stuck_transition``: a service ``pausing``/``resuming`` for longer than ``stuck_after``,
  naming the workers that have not acknowledged the generation and whether their leases hold;
- ``overdue_resume``: a scheduled resume whose time has passed and that nobody fired;
- ``missing_location`` / ``unknown_location``: a location (or a service of one) that the expected
  location list names but the store lacks or has removed, and a live location it does not name;
- ``corrupt_record``: a record (or its history) that does not parse or validate;
- ``history_mismatch``: the newest history entry of a service disagrees with the record
  (op_id, state, generation, resume_at), or the record's version has no history at all;
- ``history_gap``: on a backend with two history copies (MongoDB), versions of the record's
  life missing from its full history: restorable from the recent copy (once the write is
  ``stuck_after`` old: a younger one may still be in flight), or lost;
- ``expired_worker``: a registration whose heartbeat lease has run out;
- ``corrupt_worker``: a stored registration that does not parse or validate; it counts as a
  live worker applying everything (contract invariant 6), so it is removed only once the lease
  it still carries has run out;
- ``tombstone_ready``: a removed location every live worker acknowledged, or older than the TTL;
- ``clock_skew``: a worker whose published clock offset to the backend exceeds ``max_skew``, or
  this check's own process when its offset does, or when it cannot tell the backend's time
  within its bound (its deadline repairs are then refused; docs/time.md).

Why it is shaped so:

- **It only consumes the manager.** Reads go through :meth:`Manager.scan` and the
  :class:`~locstatus.backends.base.Backend` interface; every repair is a manager call
  (``settle``, ``fire_due_resumes``, ``add_location``, ``remove_location``, ``purge_location``)
  or ``Backend.remove_worker`` / ``Backend.restore_history`` (a copy, never a rewrite). Each
  of those is guarded (a compare-and-set on the version, the FSM's ``resume_at``/generation
  guards, the removal conditional on the lease deadline seen expired, the history
  collection's unique index), so any number of checks may repair at once
  from several hosts: each repair happens once and the others find it done.
- **Deadlines on the backend's time.** A worker is expired, a tombstone past its TTL, only when
  the deadline passed by the backend's time beyond doubt (``mgr.time.is_past``, docs/time.md);
  how long something has been stuck or overdue is reported against ``mgr.clock()``, the
  backend's time as this process estimates it. A check on a host whose clock is off judges
  exactly as one on a host whose clock is right, and reports the offset.
- **Re-check before repairing.** A scan is a snapshot that may be seconds old when a repair
  runs. Each repair re-reads what it is about to fix and reports ``already_done`` when someone
  else fixed it meanwhile, ``blocked`` when it is not safe (a live worker still lags, so a
  settle would lie), or ``applied``.
- **Report, never rewrite, what cannot be repaired safely.** A corrupt record is never deleted
  or rewritten and history is never rewritten: both stay findings (exit 1) until an operator
  acts (``locstatus history LOCATION`` shows what is known).
- **Confirm before reporting a history mismatch.** The newest history entry is read after the
  record; a write in between looks like drift, so a mismatch is re-read once with the fresh
  record before it is reported.
- **Stable output.** :class:`CheckReport` is a pydantic model: :meth:`CheckReport.as_dict` is its
  JSON dump, every key is always present (``null``/``0`` when not applicable), every finding
  kind is always counted, and ``docs/check.md`` documents each key.

Usage::

    from locstatus import connect
    from locstatus.check import render_report, run_check, write_metrics
    from rich.console import Console

    mgr = connect("sqlite:///./locstatus.db")
    report = run_check(mgr, repair=True, stuck_after=300)
    render_report(report, Console())
    write_metrics(report, "/var/lib/node_exporter/textfile/locstatus_check.prom")
    raise SystemExit(report.exit_code)      # 0 clean / all repaired, 1 findings left, 2 error
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from locstatus.backends import redact_url
from locstatus.backends.base import AckMap, Backend, HistoryGaps
from locstatus.clock import TimeSource
from locstatus.errors import (
    BackendUnavailable,
    CorruptRecord,
    InvalidInput,
    InvalidTransition,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.manager import Manager, lagging_workers, stuck_handlers, worker_live
from locstatus.models import (
    TOMBSTONE_ACK,
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
    tombstone_generation,
)
from locstatus.names import canonical_service, check_location

FORMAT = "locstatus.check/1"
"""Value of the report's ``format`` key; bumped only when a key changes meaning or goes away."""

PROGRESS_THRESHOLD = 2000
"""A progress bar is shown (when asked) only for scans of more records than this."""

_HISTORY_PAGES = (1, 8, 64, 512)
"""Entries asked per history page while looking for each service's newest entry (the last size
repeats). Most records are settled by the writes the scan brings with them."""

_CONFIRM_ATTEMPTS = 3
"""Re-reads of a record whose history looked inconsistent because it changed while read."""

_TRANSITIONAL = frozenset({State.PAUSING, State.RESUMING})

DEFAULT_MAX_SKEW = 1.0
"""Seconds of clock offset to the backend above which ``clock_skew`` is reported. Nothing in
locstatus acts on a host's own clock (docs/time.md), so an offset only shows a host whose time
sync is broken, which its other software (logs, TLS, schedulers) still suffers from."""

_actor_ids = itertools.count(1)


class Kind(StrEnum):
    """Finding kinds (docs/design.md §5.4), in report order."""

    STUCK_TRANSITION = "stuck_transition"
    OVERDUE_RESUME = "overdue_resume"
    MISSING_LOCATION = "missing_location"
    UNKNOWN_LOCATION = "unknown_location"
    CORRUPT_RECORD = "corrupt_record"
    HISTORY_MISMATCH = "history_mismatch"
    HISTORY_GAP = "history_gap"
    EXPIRED_WORKER = "expired_worker"
    CORRUPT_WORKER = "corrupt_worker"
    TOMBSTONE_READY = "tombstone_ready"
    CLOCK_SKEW = "clock_skew"


KINDS: tuple[str, ...] = tuple(k.value for k in Kind)
"""Every finding kind, in report order."""


class FindingState(StrEnum):
    """What became of a finding in this run.

    ``open``: found, not repaired (no ``repair``, or no safe repair exists);
    ``planned``: ``dry_run`` - the repair would be attempted;
    ``repaired``: this run's repair fixed it;
    ``resolved``: on re-read it was already fixed (another process, an operator, a worker);
    ``blocked``: a repair exists but is not safe now (e.g. a live worker still lags);
    ``failed``: the repair raised an error (named in its repair).
    ``open``, ``planned``, ``blocked`` and ``failed`` are *left* (exit 1).
    """

    OPEN = "open"
    PLANNED = "planned"
    REPAIRED = "repaired"
    RESOLVED = "resolved"
    BLOCKED = "blocked"
    FAILED = "failed"

    @property
    def left(self) -> bool:
        return self not in (FindingState.REPAIRED, FindingState.RESOLVED)


class Outcome(StrEnum):
    """Outcome of one repair: ``planned`` (dry run), ``applied`` (this run wrote it),
    ``already_done`` (found fixed on re-read), ``blocked`` (not safe now), ``failed`` (error),
    ``not_attempted`` (an earlier repair found the backend unavailable)."""

    PLANNED = "planned"
    APPLIED = "applied"
    ALREADY_DONE = "already_done"
    BLOCKED = "blocked"
    FAILED = "failed"
    NOT_ATTEMPTED = "not_attempted"


_FINDING_STATE = {
    Outcome.PLANNED: FindingState.PLANNED,
    Outcome.APPLIED: FindingState.REPAIRED,
    Outcome.ALREADY_DONE: FindingState.RESOLVED,
    Outcome.BLOCKED: FindingState.BLOCKED,
    Outcome.FAILED: FindingState.FAILED,
    Outcome.NOT_ATTEMPTED: FindingState.OPEN,
}


class Action(StrEnum):
    """The manager (or backend) call a repair makes."""

    SETTLE = "settle"
    FIRE_DUE_RESUMES = "fire_due_resumes"
    ADD_LOCATION = "add_location"
    REMOVE_LOCATION = "remove_location"
    REMOVE_WORKER = "remove_worker"
    PURGE_LOCATION = "purge_location"
    RESTORE_HISTORY = "restore_history"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RepairPlan(_Model):
    """The repair a finding would take: ``action`` (None when there is no safe one) and a
    sentence for the operator."""

    action: Action | None
    description: str


class Finding(_Model):
    """One inconsistency. ``location``/``service``/``worker_id`` say what it is about (None when
    not applicable: ``service`` is None for a whole location, ``worker_id`` is set only for
    ``expired_worker`` and ``corrupt_worker``). ``since`` (aware UTC) is when the condition
    started when known and ``age_seconds`` is ``now - since``. ``evidence`` holds kind-specific
    facts (documented in ``docs/check.md``)."""

    id: str
    """``kind:location:service-or-worker`` (``-`` for none): stable across runs."""
    kind: Kind
    location: str | None
    service: str | None
    worker_id: str | None
    since: datetime | None
    age_seconds: float | None
    message: str
    evidence: dict[str, Any]
    repair: RepairPlan
    state: FindingState = FindingState.OPEN


class Repair(_Model):
    """One repair attempted (or planned) for ``finding`` (its ``id``). ``version`` is the record
    version after the repair when one was written or read, else None."""

    finding: str
    kind: Kind
    action: Action
    location: str | None
    service: str | None
    worker_id: str | None
    outcome: Outcome
    detail: str
    version: int | None = None


class Options(_Model):
    """The options the check ran with (seconds)."""

    repair: bool
    dry_run: bool
    stuck_after_seconds: float
    tombstone_ttl_seconds: float
    max_skew_seconds: float
    """Clock offset to the backend above which a ``clock_skew`` finding is reported."""
    expected_locations: int | None
    """Number of expected locations given, or None when no location list was given (then no
    ``missing_location``/``unknown_location`` findings)."""


class Scanned(_Model):
    """What was read: records (all, including tombstones and corrupt ones), services of
    readable records, workers registered and those whose lease holds."""

    records: int = 0
    tombstones: int = 0
    corrupt: int = 0
    services: int = 0
    workers: int = 0
    live_workers: int = 0


class ClockView(_Model):
    """The check process's view of the backend's time (docs/time.md), when the run ended."""

    offset_seconds: float | None
    """This host's wall clock minus the backend's time; None when not measured."""
    uncertainty_seconds: float | None
    """How far the estimate of the backend's time may be off; None when unknown."""
    max_uncertainty_seconds: float
    """Above this, deadline repairs are refused."""
    refusals: int
    """Deadline decisions refused during this run because the bound could not be met."""
    problem: str | None
    """Why deadlines are refused, or None."""


class Summary(_Model):
    """Counts: every kind always present (0 when none)."""

    findings: int
    left: int
    repaired: int
    resolved: int
    by_kind: dict[str, int]
    left_by_kind: dict[str, int]
    repairs_by_outcome: dict[str, int]


class CheckReport(_Model):
    """The result of :func:`run_check`. ``as_dict()`` (also what ``GET /v1/check`` serves) is
    the JSON of this model; see ``docs/check.md`` for every key.

    ``exit_code``: 0 clean or everything repaired/resolved, 1 findings left, 2 the check could not
    complete its repairs (backend unavailable; a check that cannot even scan raises instead).
    """

    format: str = FORMAT
    backend: str
    """Backend URL with any credentials replaced by ``***``."""
    actor: str
    """Actor recorded on the writes this run made (``check:<host>:<pid>:<n>``)."""
    started_at: datetime
    finished_at: datetime
    duration_seconds: float
    now: datetime
    """The instant ages are measured from: the backend's time (as this process estimates it,
    ``mgr.clock()``) when the scan began."""
    clock: ClockView
    options: Options
    scanned: Scanned
    findings: list[Finding]
    repairs: list[Repair]
    summary: Summary
    status: str
    """``clean`` (no finding), ``repaired`` (all findings repaired or resolved), ``findings``
    (some left), ``error`` (exit 2)."""
    exit_code: int

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-able data with stable keys (datetimes as ISO 8601 strings)."""
        return self.model_dump(mode="json")


# -- entry points ------------------------------------------------------------------------------


def run_check(
    mgr: Manager,
    *,
    repair: bool = False,
    dry_run: bool = False,
    stuck_after: float = 300.0,
    expected: Mapping[str, Sequence[str]] | None = None,
    tombstone_ttl: float = 86400.0,
    progress: bool = False,
    max_skew: float = DEFAULT_MAX_SKEW,
) -> CheckReport:
    """Scan every record, worker and acknowledgement; report findings; repair when asked.

    - ``mgr``: the manager: its time source (``mgr.time``, the backend's time) decides what is
      expired and which tombstones are past their TTL, beyond doubt; ages are measured from
      ``mgr.clock()`` (docs/time.md).
    - ``repair``: fix what is safe (see the module docstring); ``dry_run``: only plan the repairs
      (no write at all; findings with a repair are ``planned``).
    - ``stuck_after``: seconds a service may stay ``pausing``/``resuming``, and a write may
      stay out of the full history while its recent copy holds it (>= 0).
    - ``expected``: location -> services that should exist (as returned by
      :func:`locstatus.locations.load_locations`); None skips missing/unknown locations. An empty
      mapping is refused: it would remove every location.
    - ``tombstone_ttl``: seconds after which a removed location is purged even if not every
      live worker acknowledged it (>= 0).
    - ``progress``: show a progress bar on stderr when there are more than
      :data:`PROGRESS_THRESHOLD` records.
    - ``max_skew``: seconds (>= 0) of clock offset to the backend above which a worker (or
      this process) is reported as ``clock_skew`` (default :data:`DEFAULT_MAX_SKEW`).

    Raises :class:`InvalidInput` for bad arguments and :class:`BackendUnavailable` when the
    backend cannot be read (exit 2 either way). Repairs that fail are reported, not raised.
    docs/design.md §5.4, §3.5.
    """
    stuck_after = _seconds("stuck_after", stuck_after)
    tombstone_ttl = _seconds("tombstone_ttl", tombstone_ttl)
    max_skew = _seconds("max_skew", max_skew)
    wanted = None if expected is None else _normalise_expected(expected, mgr.services)
    started = time.monotonic()
    now = mgr.clock()
    refusals = mgr.time.refusals
    actor = f"check:{socket.gethostname()}:{os.getpid()}:{next(_actor_ids)}"

    scan = _Scan(mgr, now, stuck_after, tombstone_ttl, wanted, max_skew)
    scan.run(progress)
    repairs: list[Repair] = []
    backend_down = False
    if repair or dry_run:
        repairer = _Repairer(mgr, actor, dry_run, tombstone_ttl)
        repairs = repairer.run(scan.findings, progress)
        backend_down = repairer.backend_down
    scan.own_clock(refusals)

    findings = sorted(
        scan.findings,
        key=lambda f: (KINDS.index(f.kind), f.location or "", f.service or "", f.worker_id or ""),
    )
    summary = _summary(findings, repairs)
    if backend_down:
        status, code = "error", 2
    elif summary.left:
        status, code = "findings", 1
    else:
        status, code = ("repaired" if findings else "clean"), 0
    return CheckReport(
        backend=redact_url(mgr.backend.url),
        actor=actor,
        started_at=now,
        finished_at=mgr.clock(),
        duration_seconds=round(time.monotonic() - started, 6),
        now=now,
        clock=_clock_view(mgr.time, mgr.time.refusals - refusals),
        options=Options(
            repair=repair,
            dry_run=dry_run,
            stuck_after_seconds=stuck_after,
            tombstone_ttl_seconds=tombstone_ttl,
            max_skew_seconds=max_skew,
            expected_locations=None if wanted is None else len(wanted),
        ),
        scanned=scan.scanned,
        findings=findings,
        repairs=repairs,
        summary=summary,
        status=status,
        exit_code=code,
    )


def render_report(report: CheckReport, console: Console) -> None:
    """Print ``report`` for a human: one table row per finding (kind, what, age, evidence,
    repair, state) and a summary line. Text from the store is printed as plain text, never
    as rich markup."""
    if report.findings:
        table = Table(title="consistency check", title_justify="left", expand=False)
        for col in ("Kind", "Location", "Service/worker", "Age", "Finding", "Repair", "State"):
            table.add_column(col, overflow="fold")
        repairs = {r.finding: r for r in report.repairs}
        for f in report.findings:
            done = repairs.get(f.id)
            repair_text = f.repair.description if done is None else f"{done.action}: {done.detail}"
            table.add_row(
                Text(f.kind.value),
                Text(f.location or ""),
                Text(f.service or f.worker_id or ""),
                Text(_human_age(f.age_seconds)),
                Text(f.message),
                Text(repair_text),
                Text(f.state.value, style=_STATE_STYLE[f.state]),
            )
        console.print(table)
    console.print(_summary_line(report))


def write_metrics(report: CheckReport, path: str) -> None:
    """Write ``report`` as Prometheus text format to ``path`` for node-exporter's textfile
    collector: written to a temporary file in the same directory (``.tmp`` suffix, ignored by the
    collector), flushed, fsynced, then renamed over ``path`` so a scrape never sees half a file.

    Raises :class:`InvalidInput` when the file cannot be written (missing directory, no
    permission).
    """
    text = metrics_text(report)
    directory = os.path.dirname(os.path.abspath(path))
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(
            prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory
        )
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InvalidInput(f"cannot write metrics file {path!r}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def metrics_text(report: CheckReport) -> str:
    """The Prometheus text exposition of ``report`` (what :func:`write_metrics` writes)."""
    out: list[str] = []

    def family(name: str, help_: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            out.append(f"{name}{{{inner}}} {_num(value)}" if inner else f"{name} {_num(value)}")

    s = report.summary
    family(
        "locstatus_check_findings",
        "Findings of the last consistency check, by kind.",
        (({"kind": k}, s.by_kind[k]) for k in KINDS),
    )
    family(
        "locstatus_check_findings_left",
        "Findings the last consistency check left unrepaired, by kind.",
        (({"kind": k}, s.left_by_kind[k]) for k in KINDS),
    )
    family(
        "locstatus_check_repairs",
        "Repairs of the last consistency check, by outcome.",
        (({"outcome": o.value}, s.repairs_by_outcome[o.value]) for o in Outcome),
    )
    sc = report.scanned
    family(
        "locstatus_check_records",
        "Records read by the last consistency check (all includes tombstones and corrupt).",
        (
            ({"kind": "all"}, sc.records),
            ({"kind": "tombstone"}, sc.tombstones),
            ({"kind": "corrupt"}, sc.corrupt),
        ),
    )
    family(
        "locstatus_check_workers",
        "Registered workers seen by the last consistency check, by lease.",
        (({"alive": "true"}, sc.live_workers), ({"alive": "false"}, sc.workers - sc.live_workers)),
    )
    if report.clock.offset_seconds is not None:
        family(
            "locstatus_check_clock_offset_seconds",
            "The check host's wall clock minus the backend's time (docs/time.md).",
            [({}, report.clock.offset_seconds)],
        )
    family(
        "locstatus_check_duration_seconds",
        "Wall time of the last consistency check.",
        [({}, report.duration_seconds)],
    )
    family(
        "locstatus_check_last_run_timestamp_seconds",
        "When the last consistency check finished (Unix time).",
        [({}, report.finished_at.timestamp())],
    )
    family(
        "locstatus_check_exit_code",
        "Exit code of the last consistency check: 0 clean, 1 findings left, 2 error.",
        [({}, report.exit_code)],
    )
    return "\n".join(out) + "\n"


# -- the scan ----------------------------------------------------------------------------------


class _Scan:
    """One pass over workers, acknowledgements and records, producing findings."""

    def __init__(
        self,
        mgr: Manager,
        now: datetime,
        stuck_after: float,
        tombstone_ttl: float,
        wanted: dict[str, tuple[str, ...]] | None,
        max_skew: float = 0.0,
    ) -> None:
        self.mgr = mgr
        self.backend = mgr.backend
        self.time: TimeSource = mgr.time
        self.now = now
        self.max_skew = max_skew
        self.stuck_after = timedelta(seconds=stuck_after)
        self.ttl = timedelta(seconds=tombstone_ttl)
        self.wanted = wanted
        self.findings: list[Finding] = []
        self.scanned = Scanned()
        self._services = 0
        self._tombstones = 0
        self.workers: list[WorkerInfo] = []
        self.live: list[WorkerInfo] = []
        self.acks: dict[str, AckMap] = {}
        self._gaps_possible = self.backend.two_history_copies

    def run(self, progress: bool) -> None:
        self.workers = self.backend.workers()
        self.live = [w for w in self.workers if worker_live(w, self.time)]
        live_ids = {w.worker_id for w in self.live}
        self.acks = self.backend.all_acks()
        records = self.backend.scan_with_history()  # streamed where the backend can
        sc = self.scanned
        sc.workers = len(self.workers)
        sc.live_workers = len(self.live)
        seen: set[str] = set()
        with _progress_bar(progress, len(records), "checking records") as advance:
            for item, newest in records:
                seen.add(item.location)
                if isinstance(item, CorruptRecord):
                    self._corrupt(item.location, item.detail, part="record")
                    sc.corrupt += 1
                elif self._quiet(item, newest):
                    self._services += len(item.services)
                else:
                    self._record(item, newest)
                advance()
        sc.records = len(seen)
        sc.services = self._services
        sc.tombstones = self._tombstones
        if self.wanted is not None:
            for loc in sorted(set(self.wanted) - seen):
                self._missing(loc, None, self.wanted[loc])
        for w in self.workers:
            if w.corrupt is not None:
                self._corrupt_worker(w, w.worker_id in live_ids)
            elif w.lease_expires_at is not None and w.worker_id not in live_ids:
                self._expired(w)
            elif w.clock_offset_seconds is not None and abs(w.clock_offset_seconds) > self.max_skew:
                self._worker_skew(w)

    # -- per record ----------------------------------------------------------------------

    def _quiet(self, rec: LocationStatus, head: _Newest) -> bool:
        """The fast screen: True only when :meth:`_record` would find nothing in ``rec``, decided
        from the record and the newest history writes read with it, without a further read.

        Most records of a fleet are settled, have nothing due and agree with their history;
        this screen passes those in a few comparisons, and everything else (tombstones,
        transitions, due resumes, location-list drift, a history that needs more writes than the
        scan brought or disagrees, backends with two history copies) takes the full path, which
        reports it. ``tests/test_check_screen.py`` holds it to that."""
        if (
            type(head) is not list
            or not head
            or head[0].version != rec.version
            or rec.deleted_at is not None
            or self._gaps_possible
        ):
            return False
        services = rec.services
        if self.wanted is not None:
            want = self.wanted.get(rec.location)
            if want is None or any(s not in services for s in want):
                return False
        now = self.now
        for st in services.values():
            if st.state in _TRANSITIONAL or (st.resume_at is not None and st.resume_at <= now):
                return False
        return _head_agrees(services, head)

    def _record(self, rec: LocationStatus, newest: _Newest) -> None:
        self._services += len(rec.services)  # plain ints: Scanned's __setattr__ is slow
        entered = self._history(rec, newest)
        if entered is None:  # gone since the scan read it
            return
        loc = rec.location
        if rec.deleted:
            self._tombstones += 1
            if self.wanted is not None and loc in self.wanted:
                self._missing(loc, rec, self.wanted[loc])  # restored, so never purged
            else:
                self._tombstone(rec)
            return
        for svc, st in rec.services.items():  # findings are sorted once, at the end
            if st.state in _TRANSITIONAL:
                self._stuck(rec, svc, st, entered.get(svc) or st.updated_at)
            if st.resume_at is not None and st.paused and st.resume_at <= self.now:
                self._overdue(rec, svc, st)
        if self.wanted is not None:
            if loc not in self.wanted:
                self._unknown(rec)
            elif any(s not in rec.services for s in self.wanted[loc]):
                self._missing(loc, rec, self.wanted[loc])

    def _stuck(
        self, rec: LocationStatus, svc: str, st: ServiceStatus, since: datetime | None
    ) -> None:
        if since is not None and self.now - since < self.stuck_after:
            return
        loc = rec.location
        acks = self.acks.get(loc, {})
        lagging = [
            w
            for w in self.workers
            if w.applies(loc, svc) and acks.get(w.worker_id, {}).get(svc, -1) < st.generation
        ]
        alive = {w.worker_id: worker_live(w, self.time) for w in lagging}
        live = [w.worker_id for w in lagging if alive[w.worker_id]]
        stuck = stuck_handlers(lagging, live, self.now)
        evidence = {
            "state": st.state.value,
            "generation": st.generation,
            "version": rec.version,
            "lagging_workers": [
                {
                    "worker_id": w.worker_id,
                    "lease_alive": alive[w.worker_id],
                    "lease_expires_at": _iso(w.lease_expires_at),
                    "acked_generation": acks.get(w.worker_id, {}).get(svc),
                    "stuck": stuck.get(w.worker_id),
                }
                for w in lagging
            ],
        }
        target = "paused" if st.state is State.PAUSING else "running"
        if live:
            message = (
                f"{st.state.value} generation {st.generation} for {_human_age(self._age(since))}; "
                f"live workers not acknowledged: "
                + ", ".join(w + (f" ({stuck[w]})" if w in stuck else "") for w in live)
            )
            plan = RepairPlan(
                action=None,
                description=(
                    f"none while {', '.join(live)} {'lags' if len(live) == 1 else 'lag'} "
                    "with a live lease: fix or stop "
                    f"{'that worker' if len(live) == 1 else 'those workers'} "
                    "(a stopped worker's lease expires, then --repair settles)"
                ),
            )
        else:
            dead = [w.worker_id for w in lagging]
            message = (
                f"{st.state.value} generation {st.generation} for {_human_age(self._age(since))}; "
                + (f"only expired workers lag: {', '.join(dead)}" if dead else "nobody lags")
            )
            plan = RepairPlan(action=Action.SETTLE, description=f"settle to {target}")
        self._add(Kind.STUCK_TRANSITION, loc, svc, None, since, message, evidence, plan)

    def _overdue(self, rec: LocationStatus, svc: str, st: ServiceStatus) -> None:
        assert st.resume_at is not None
        self._add(
            Kind.OVERDUE_RESUME,
            rec.location,
            svc,
            None,
            st.resume_at,
            f"resume scheduled at {_iso(st.resume_at)} not fired; still {st.state.value}",
            {
                "state": st.state.value,
                "generation": st.generation,
                "resume_at": _iso(st.resume_at),
                "version": rec.version,
            },
            RepairPlan(action=Action.FIRE_DUE_RESUMES, description="fire the due resume"),
        )

    def _tombstone(self, rec: LocationStatus) -> None:
        assert rec.deleted_at is not None
        loc = rec.location
        ready = _tombstone_readiness(rec, self.workers, self.acks.get(loc, {}), self.time, self.ttl)
        if ready is None:
            return
        why, acked, waiting = ready
        message = (
            f"removed at {_iso(rec.deleted_at)}, older than the TTL"
            if why == "ttl"
            else f"removed at {_iso(rec.deleted_at)}, acknowledged by every live worker"
            + ("" if acked else " (none applies it)")
        )
        self._add(
            Kind.TOMBSTONE_READY,
            loc,
            None,
            None,
            rec.deleted_at,
            message,
            {
                "deleted_at": _iso(rec.deleted_at),
                "reason": why,
                "acknowledged_by": acked,
                "not_acknowledged_by": waiting,
                "version": rec.version,
            },
            RepairPlan(action=Action.PURGE_LOCATION, description="purge the tombstone"),
        )

    def _missing(self, loc: str, rec: LocationStatus | None, services: tuple[str, ...]) -> None:
        evidence: dict[str, Any] = {
            "expected_services": list(services),
            "stored_services": None if rec is None else sorted(rec.services),
            "removed_at": None if rec is None else _iso(rec.deleted_at),
            "version": None if rec is None else rec.version,
        }
        if rec is None:
            message, plan = "expected but not stored", "create it"
        elif rec.deleted:
            message = f"expected but removed at {_iso(rec.deleted_at)}"
            plan = "restore it"
        else:
            missing = [s for s in services if s not in rec.services]
            for svc in missing:
                self._add(
                    Kind.MISSING_LOCATION,
                    loc,
                    svc,
                    None,
                    None,
                    f"expected service {svc} not stored at this location",
                    evidence,
                    RepairPlan(action=Action.ADD_LOCATION, description=f"add service {svc}"),
                )
            return
        self._add(
            Kind.MISSING_LOCATION,
            loc,
            None,
            None,
            rec.deleted_at if rec is not None else None,
            message,
            evidence,
            RepairPlan(action=Action.ADD_LOCATION, description=plan),
        )

    def _unknown(self, rec: LocationStatus) -> None:
        self._add(
            Kind.UNKNOWN_LOCATION,
            rec.location,
            None,
            None,
            None,
            "stored but not in the expected location list",
            {"services": sorted(rec.services), "version": rec.version},
            RepairPlan(
                action=Action.REMOVE_LOCATION,
                description="remove it (tombstone; purged once acknowledged or after the TTL)",
            ),
        )

    def _corrupt(self, loc: str, detail: str, *, part: str) -> None:
        self._add(
            Kind.CORRUPT_RECORD,
            loc,
            None,
            None,
            None,
            f"{part} does not parse: {detail}",
            {"part": part, "detail": detail},
            RepairPlan(
                action=None,
                description=(
                    "none: never rewritten or deleted by the check; inspect it with the "
                    "backend's own client and restore it by hand"
                ),
            ),
        )

    def _corrupt_worker(self, w: WorkerInfo, live: bool) -> None:
        assert w.corrupt is not None
        expired = not live  # only a lease it still carries can have run out
        lease = (
            f"its lease ran out at {_iso(w.lease_expires_at)}" if expired
            else "counted as a live worker that applies every service at every location"
            + ("" if w.lease_expires_at is None else f" until {_iso(w.lease_expires_at)}")
        )
        self._add(
            Kind.CORRUPT_WORKER,
            None,
            None,
            w.worker_id,
            w.lease_expires_at if expired else None,
            f"registration does not parse: {w.corrupt}; {lease}",
            {
                "detail": w.corrupt,
                "lease_expires_at": _iso(w.lease_expires_at),
                "lease_alive": live,
                "locations_acknowledged": sum(
                    1 for per in self.acks.values() if w.worker_id in per
                ),
            },
            RepairPlan(
                action=Action.REMOVE_WORKER,
                description="unregister it (and drop its acknowledgements) if still expired",
            ) if expired else RepairPlan(
                action=None,
                description=(
                    "none while it may be a live worker: its worker's next registration "
                    "replaces it (ZooKeeper: the node goes with its session); if that worker "
                    "is gone, remove the registration with the backend's own client"
                ),
            ),
        )

    def _worker_skew(self, w: WorkerInfo) -> None:
        offset = w.clock_offset_seconds
        assert offset is not None
        self._add(
            Kind.CLOCK_SKEW,
            None,
            None,
            w.worker_id,
            None,
            f"host {w.host or '?'} (pid {w.pid}) clock is {_offset_text(offset)} the backend's "
            f"(bound {self.max_skew:g}s)",
            {
                "process": "worker",
                "host": w.host,
                "pid": w.pid,
                "offset_seconds": offset,
                "max_skew_seconds": self.max_skew,
                "uncertainty_seconds": None,
                "problem": None,
            },
            _SKEW_REPAIR,
        )

    def own_clock(self, refusals_before: int) -> None:
        """The ``clock_skew`` finding of this check's own process: its host clock is off by
        more than the bound, or it could not tell the backend's time within its own bound
        (then every deadline repair of this run was refused). Called once the repairs ran."""
        time_source = self.time
        offset = time_source.offset_seconds()
        problem = time_source.problem()
        refused = time_source.refusals - refusals_before
        skewed = offset is not None and abs(offset) > self.max_skew
        if not skewed and problem is None and not refused:
            return
        parts = []
        if skewed:
            assert offset is not None
            parts.append(f"this check's host clock is {_offset_text(offset)} the backend's "
                         f"(bound {self.max_skew:g}s)")
        if problem is not None or refused:
            parts.append(f"deadlines refused ({refused} this run): "
                         f"{problem or 'backend time uncertain'}")
        unc = time_source.uncertainty_seconds()
        self._add(
            Kind.CLOCK_SKEW,
            None,
            None,
            None,
            None,
            "; ".join(parts),
            {
                "process": "check",
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "offset_seconds": offset,
                "max_skew_seconds": self.max_skew,
                "uncertainty_seconds": unc if math.isfinite(unc) else None,
                "problem": problem,
            },
            _SKEW_REPAIR,
            key="check",
        )

    def _expired(self, w: WorkerInfo) -> None:
        assert w.lease_expires_at is not None
        acks = sum(1 for per in self.acks.values() if w.worker_id in per)
        self._add(
            Kind.EXPIRED_WORKER,
            None,
            None,
            w.worker_id,
            w.lease_expires_at,
            f"lease expired at {_iso(w.lease_expires_at)} (host {w.host or '?'}, pid {w.pid})",
            {
                "host": w.host,
                "pid": w.pid,
                "services": list(w.services),
                "locations": None if w.locations is None else list(w.locations),
                "started_at": _iso(w.started_at),
                "lease_expires_at": _iso(w.lease_expires_at),
                "locations_acknowledged": acks,
            },
            RepairPlan(
                action=Action.REMOVE_WORKER,
                description="unregister it (and drop its acknowledgements) if still expired",
            ),
        )

    # -- history -------------------------------------------------------------------------

    def _history(self, rec: LocationStatus, newest: _Newest) -> dict[str, datetime] | None:
        """Compare each service with its newest history entry. Returns when each transitional
        service entered its state (for stuck_transition), or None when the record is gone.
        ``newest``: the newest history writes read with the record, when the backend did."""
        gaps = self._gaps(rec.location)
        entered = self._compare(rec, newest)
        if entered is not None and gaps:
            # Confirmed by a second look, after the comparison, and only for writes old enough
            # that their writer has stopped: a write between its writer's two writes is in
            # flight, however long a loaded host keeps the writer from its history insert.
            again = self._gaps(rec.location)
            restorable = self._stopped(
                rec.location, sorted(set(gaps.restorable) & set(again.restorable))
            )
            lost = sorted(set(gaps.lost) & set(again.lost))
            if restorable:
                self._gap(rec, restorable, restorable=True)
            if lost:
                self._gap(rec, lost, restorable=False)
        return entered

    def _stopped(self, location: str, versions: list[int]) -> list[int]:
        """Of the restorable ``versions`` (ascending), those written ``stuck_after`` or longer
        ago by the backend's time (the write's entries' ``at``), as a stuck transition is
        judged: a younger one may be a write in flight, whose writer has done its
        ``findAndModify`` and not yet its history insert, and is no gap (docs/check.md,
        "Finding kinds"). Read newest first, one write each: the versions below an old write were
        written before it. A write with no entries to date it is taken as stopped."""
        for i in range(len(versions) - 1, -1, -1):
            try:
                entries = self.backend.history_write(location, versions[i])
            except NotFound:
                return []
            except CorruptRecord:
                entries = []  # reported as corrupt when read; the gap stays visible
            if not entries or self.now - max(e.at for e in entries) >= self.stuck_after:
                return versions[: i + 1]
        return []

    def _gap(self, rec: LocationStatus, versions: list[int], *, restorable: bool) -> None:
        listed = ", ".join(map(str, versions[:10])) + (", ..." if len(versions) > 10 else "")
        if restorable:
            message = (
                f"writes at versions {listed} are missing from the full history; the record's "
                "recent history still holds them (a writer stopped between its two writes)"
            )
            plan = RepairPlan(
                action=Action.RESTORE_HISTORY,
                description="copy them from the record's recent history",
            )
        else:
            message = (
                f"writes at versions {listed} are in neither the full history nor the "
                "record's recent history: that history is lost"
            )
            plan = RepairPlan(
                action=None,
                description=(
                    "none: nothing holds them any more; 'locstatus history' skips those "
                    "versions"
                ),
            )
        self._add(
            Kind.HISTORY_GAP,
            rec.location,
            None,
            None,
            None,
            message,
            {
                "missing_versions": versions,
                "in_recent_history": restorable,
                "version": rec.version,
            },
            plan,
            key="restorable" if restorable else "lost",
        )

    def _gaps(self, location: str) -> HistoryGaps:
        """Versions missing from the full history, for backends that keep two copies (MongoDB:
        embedded recent history and the history collection); see
        :meth:`Backend.history_gaps`."""
        if not self._gaps_possible:
            return HistoryGaps()
        try:
            return self.backend.history_gaps(location)
        except NotFound:
            return HistoryGaps()

    def _compare(self, rec: LocationStatus, newest: _Newest) -> dict[str, datetime] | None:
        for _ in range(_CONFIRM_ATTEMPTS):
            try:
                if isinstance(newest, CorruptRecord):
                    raise newest
                problems, entered = _compare_history(self.backend, rec, newest)
            except CorruptRecord as exc:
                self._corrupt(rec.location, exc.detail, part="history")
                return {}
            newest = None  # a confirming pass reads the history afresh
            if not problems:
                return entered
            try:  # changed while read, or drift: confirm with a fresh read
                fresh = self.backend.read(rec.location)
            except NotFound:
                return None
            except CorruptRecord:
                return entered  # reported by the next run's scan
            if fresh.version == rec.version:
                break  # the record did not move: the drift is real (history ahead included)
            rec = fresh
        else:
            return entered  # kept changing: nothing can be concluded now
        for svc, fields, rec_view, entry in problems:
            st = rec.services.get(svc) if svc != "*" else None
            since = st.updated_at if st is not None else None
            if entry is None:
                message = (
                    f"no history entry for this service (record version {rec.version})"
                    if svc != "*"
                    else f"record version {rec.version} has no history"
                )
            elif svc == "*" and entry.version > rec.version:
                message = (
                    f"the history holds a write at version {entry.version}, newer than the "
                    f"record (version {rec.version}): its next write will be refused"
                )
            elif svc == "*":
                message = (
                    f"record version {rec.version} has no history entry (newest is version "
                    f"{entry.version})"
                )
            else:
                message = (
                    f"{', '.join(fields)} {'differs' if len(fields) == 1 else 'differ'} from "
                    f"the newest history entry ({entry.event} at version {entry.version})"
                )
            self._add(
                Kind.HISTORY_MISMATCH,
                rec.location,
                None if svc == "*" else svc,
                None,
                since,
                message,
                {
                    "fields": fields,
                    "record": rec_view,
                    "history": None if entry is None else _entry_view(entry),
                },
                RepairPlan(
                    action=None,
                    description=(
                        "none: history is never rewritten; compare 'locstatus history' with the "
                        "record (the next change of the service records its state again)"
                    ),
                ),
            )
        return entered

    # -- helpers ---------------------------------------------------------------------------

    def _age(self, since: datetime | None) -> float | None:
        return None if since is None else round((self.now - since).total_seconds(), 3)

    def _add(
        self,
        kind: Kind,
        location: str | None,
        service: str | None,
        worker_id: str | None,
        since: datetime | None,
        message: str,
        evidence: dict[str, Any],
        plan: RepairPlan,
        *,
        key: str | None = None,
    ) -> Finding:
        ident = f"{kind.value}:{location or '-'}:{service or worker_id or '-'}"
        if key is not None:
            ident += f":{key}"
        finding = Finding(
            id=ident,
            kind=kind,
            location=location,
            service=service,
            worker_id=worker_id,
            since=since,
            age_seconds=self._age(since),
            message=message,
            evidence=evidence,
            repair=plan,
        )
        self.findings.append(finding)
        return finding


_Newest = list[HistoryEntry] | CorruptRecord | None
"""The newest history writes read with a record (see :meth:`Backend.scan_with_history`)."""

_Problem = tuple[str, list[str], dict[str, Any], HistoryEntry | None]
"""(service or ``*``, differing fields, the record's view, the entry compared with)."""


def _compare_history(
    backend: Backend, rec: LocationStatus, head: list[HistoryEntry] | None = None
) -> tuple[list[_Problem], dict[str, datetime]]:
    """Walk ``rec``'s history newest first until each service met its newest entry, starting
    with ``head`` (the newest writes' entries, already read with the record) when given.

    Returns (problems, entered): ``entered`` maps each transitional service to when it entered
    its state (when found). A history ahead of ``rec`` is one problem, alone: the record changed
    after it was read, or the history was written without it (the caller re-reads the record to
    tell which). Raises :class:`CorruptRecord`."""
    loc = rec.location
    services = rec.services
    pending = set(services)
    entering = {s for s, st in services.items() if st.state in _TRANSITIONAL}
    entered: dict[str, datetime] = {}
    problems: list[_Problem] = []
    first = True
    before: int | None = None
    for size in itertools.chain(_HISTORY_PAGES, itertools.repeat(_HISTORY_PAGES[-1])):
        if head is not None:
            page, head, size = head, None, 0  # one write: more may follow
        else:
            page = backend.history(loc, limit=size, before_version=before)
        if not page:
            break
        if first:
            first = False
            newest = page[0].version
            if newest > rec.version:  # changed after it was read, or drift: the caller re-reads
                return [("*", ["version"], {"version": rec.version}, page[0])], entered
            if newest != rec.version:
                problems.append(("*", ["version"], {"version": rec.version}, page[0]))
        for entry in page:
            svc = entry.service
            if entering and svc in entering:
                st = services[svc]
                if entry.to_state is st.state and entry.from_state is not st.state:
                    entered[svc] = entry.at
                    entering.discard(svc)
                elif entry.to_state is not st.state:
                    entering.discard(svc)  # history disagrees; reported below if newest
            if svc in pending:
                pending.discard(svc)
                st = services[svc]
                if not _agrees(st, entry):
                    fields = _diff_created(st, entry) if entry.event == "add_service" else _diff(
                        st, entry
                    )
                    problems.append((svc, fields, _status_view(st), entry))
            elif svc == "*" and entry.event == "create":
                for s in sorted(pending):
                    st = services[s]
                    if not _created_by(st, entry):
                        problems.append((s, _diff_created(st, entry), _status_view(st), entry))
                pending.clear()
                entering.clear()
            if not pending and not entering:
                return problems, entered
        before = page[-1].version
        if len(page) < size:
            break
    if first:  # no history at all: one finding for the record, not one per service
        return [("*", ["version"], {"version": rec.version}, None)], entered
    for s in sorted(pending):
        problems.append((s, ["op_id"], _status_view(rec.services[s]), None))
    return problems, entered


def _head_agrees(services: Mapping[str, ServiceStatus], head: list[HistoryEntry]) -> bool:
    """True when the newest writes ``head`` (entries newest first, the newest at the record's
    version) alone show every service of a record with no transitional service agreeing with
    its newest history entry: what :func:`_compare_history` would then find without problems.
    False when one disagrees or when older writes are needed (the full path decides)."""
    # Services not met yet; None for all of them: the usual head is a create entry alone, so
    # the set is built only when an entry of one service comes first.
    pending: set[str] | None = None
    for entry in head:
        svc = entry.service
        if svc == "*":
            if entry.event == "create":
                left = services if pending is None else pending
                for s in left:  # noqa: SIM110 (all() over a generator: +25% on this hot path)
                    if not _created_by(services[s], entry):
                        return False
                return True
            continue
        if pending is None:
            pending = set(services)
        if svc in pending:
            if not _agrees(services[svc], entry):
                return False
            pending.discard(svc)
            if not pending:
                return True
    return False


def _agrees(st: ServiceStatus, entry: HistoryEntry) -> bool:
    """True when ``entry``, the newest history entry of a service, shows ``st`` (see
    :func:`_diff` and :func:`_diff_created` for the fields that differ when not)."""
    if entry.event == "add_service":
        return _created_by(st, entry)
    return (
        entry.op_id == st.op_id
        and entry.to_state is st.state
        and entry.generation == st.generation
        and entry.resume_at == st.resume_at
    )


def _diff(st: ServiceStatus, entry: HistoryEntry) -> list[str]:
    out = []
    if entry.op_id != st.op_id:
        out.append("op_id")
    if entry.to_state is not st.state:
        out.append("state")
    if entry.generation != st.generation:
        out.append("generation")
    if entry.resume_at != st.resume_at:
        out.append("resume_at")
    return out


def _created_by(st: ServiceStatus, entry: HistoryEntry) -> bool:
    """True when ``st`` is what ``entry`` (create / add_service) left: running at generation 0,
    nothing scheduled, last changed by that operation (see :func:`_diff_created`)."""
    return (
        st.op_id == entry.op_id
        and st.state is State.RUNNING
        and st.generation == 0
        and st.resume_at is None
    )


def _diff_created(st: ServiceStatus, entry: HistoryEntry) -> list[str]:
    """A service untouched since it was created (or added) is running at generation 0."""
    out = []
    if entry.op_id != st.op_id:
        out.append("op_id")
    if st.state is not State.RUNNING:
        out.append("state")
    if st.generation != 0:
        out.append("generation")
    if st.resume_at is not None:
        out.append("resume_at")
    return out


def _status_view(st: ServiceStatus) -> dict[str, Any]:
    return {
        "op_id": st.op_id,
        "state": st.state.value,
        "generation": st.generation,
        "resume_at": _iso(st.resume_at),
    }


def _entry_view(e: HistoryEntry) -> dict[str, Any]:
    return {
        "version": e.version,
        "op_id": e.op_id,
        "event": e.event,
        "service": e.service,
        "to_state": None if e.to_state is None else e.to_state.value,
        "generation": e.generation,
        "resume_at": _iso(e.resume_at),
        "at": _iso(e.at),
    }


def _tombstone_readiness(
    rec: LocationStatus,
    workers: Sequence[WorkerInfo],
    acks: AckMap,
    time_source: TimeSource,
    ttl: timedelta,
) -> tuple[str, list[str], list[str]] | None:
    """(``ttl`` | ``acknowledged``, acked ids, not-acked ids) when the tombstone may be
    purged (docs/design.md §3.5), else None. A worker applies a tombstone when its location filter
    admits
    the location; as for settle, no live worker counts as all acknowledged. Older than the TTL
    means ``deleted_at + ttl`` passed by the backend's time beyond doubt (docs/time.md)."""
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


# -- repairs -----------------------------------------------------------------------------------


class _Repairer:
    """Applies (or plans) the repair of every finding that has one, re-checking each first."""

    def __init__(self, mgr: Manager, actor: str, dry_run: bool, tombstone_ttl: float) -> None:
        self.mgr = mgr
        self.backend = mgr.backend
        self.actor = actor
        self.dry_run = dry_run
        self.ttl = timedelta(seconds=tombstone_ttl)
        self.backend_down = False
        self.repairs: list[Repair] = []

    def run(self, findings: list[Finding], progress: bool) -> list[Repair]:
        todo = [f for f in findings if f.repair.action is not None]
        for f in findings:  # a stuck transition with live lagging workers: nothing safe to do
            if f.kind is Kind.STUCK_TRANSITION and f.repair.action is None:
                f.state = FindingState.BLOCKED
        order = (
            Action.RESTORE_HISTORY,
            Action.REMOVE_WORKER,
            Action.FIRE_DUE_RESUMES,
            Action.SETTLE,
            Action.ADD_LOCATION,
            Action.REMOVE_LOCATION,
            Action.PURGE_LOCATION,
        )
        todo.sort(key=lambda f: order.index(f.repair.action))
        groups: list[list[Finding]] = []
        for f in todo:  # one call per location for resumes and location sync
            last = groups[-1] if groups else None
            if (
                last is not None
                and f.repair.action in (Action.FIRE_DUE_RESUMES, Action.ADD_LOCATION)
                and last[0].repair.action is f.repair.action
                and last[0].location == f.location
            ):
                last.append(f)
            else:
                groups.append([f])
        # Same phase order everywhere, random order within a phase: concurrent checks spread
        # over different locations (sharing the work) instead of trailing each other.
        rng = random.Random()
        phases: dict[Action | None, list[list[Finding]]] = {}
        for group in groups:
            phases.setdefault(group[0].repair.action, []).append(group)
        groups = []
        for phase in order:
            batch = phases.get(phase, [])
            rng.shuffle(batch)
            groups.extend(batch)
        handlers: dict[Action, Callable[[list[Finding]], None]] = {
            Action.REMOVE_WORKER: self._remove_worker,
            Action.FIRE_DUE_RESUMES: self._fire,
            Action.SETTLE: self._settle,
            Action.ADD_LOCATION: self._add_location,
            Action.REMOVE_LOCATION: self._remove_location,
            Action.PURGE_LOCATION: self._purge,
            Action.RESTORE_HISTORY: self._restore_history,
        }
        with _progress_bar(progress, len(groups), "repairing") as advance:
            for group in groups:
                action = group[0].repair.action
                assert action is not None
                if self.dry_run:
                    for f in group:
                        self._record(f, Outcome.PLANNED, f.repair.description)
                elif self.backend_down:
                    for f in group:
                        self._record(f, Outcome.NOT_ATTEMPTED, "backend unavailable")
                else:
                    try:
                        handlers[action](group)
                    except BackendUnavailable as exc:
                        self.backend_down = True
                        for f in group:
                            self._record(f, Outcome.FAILED, f"backend unavailable: {exc}")
                    except LocstatusError as exc:
                        for f in group:
                            self._record(f, Outcome.FAILED, f"{type(exc).__name__}: {exc}")
                advance()
        return self.repairs

    def _record(
        self, f: Finding, outcome: Outcome, detail: str, version: int | None = None
    ) -> None:
        assert f.repair.action is not None
        f.state = _FINDING_STATE[outcome]
        self.repairs.append(
            Repair(
                finding=f.id,
                kind=f.kind,
                action=f.repair.action,
                location=f.location,
                service=f.service,
                worker_id=f.worker_id,
                outcome=outcome,
                detail=detail,
                version=version,
            )
        )

    def _read(self, location: str) -> LocationStatus | None:
        try:
            return self.mgr.status(location)
        except NotFound:
            return None

    def _wrote(self, location: str, since_version: int) -> bool:
        """True if this run's actor wrote ``location`` after ``since_version`` (the actor is
        unique per run, and the manager records it in the history of the writes it makes)."""
        for entry in self.backend.history(location, limit=20):
            if entry.version <= since_version:
                return False
            if entry.actor == self.actor:
                return True
        return False

    # -- one handler per action ----------------------------------------------------------

    def _restore_history(self, group: list[Finding]) -> None:
        for f in group:
            loc = f.location
            assert loc is not None
            wanted = set(f.evidence["missing_versions"])
            try:
                still = wanted & set(self.backend.history_gaps(loc).restorable)
            except NotFound:
                self._record(f, Outcome.ALREADY_DONE, "the location is gone")
                continue
            if not still:
                self._record(f, Outcome.ALREADY_DONE, "copied meanwhile")
                continue
            copied = set(self.backend.restore_history(loc))
            left = wanted & set(self.backend.history_gaps(loc).restorable)
            if left:
                self._record(
                    f, Outcome.FAILED, f"still missing: {', '.join(map(str, sorted(left)))}"
                )
            elif copied & still:
                self._record(
                    f, Outcome.APPLIED,
                    f"copied versions {', '.join(map(str, sorted(copied & still)))} from the "
                    "record's recent history",
                )
            else:
                self._record(f, Outcome.ALREADY_DONE, "copied meanwhile")

    def _remove_worker(self, group: list[Finding]) -> None:
        for f in group:
            wid = f.worker_id
            assert wid is not None
            current = next((w for w in self.backend.workers() if w.worker_id == wid), None)
            if current is None:
                self._record(f, Outcome.ALREADY_DONE, "no longer registered")
            elif worker_live(current, self.mgr.time):
                problem = self.mgr.time.problem()
                if problem is not None:
                    self._record(f, Outcome.BLOCKED, f"kept: {problem} (docs/time.md)")
                else:
                    self._record(f, Outcome.ALREADY_DONE, "lease renewed meanwhile; kept")
            elif self.backend.remove_worker(wid, if_expires=current.lease_expires_at):
                self._record(f, Outcome.APPLIED, "unregistered; its acknowledgements dropped")
            else:  # removal conditional on the lease seen expired (model/README.md, remove_race)
                self._record(
                    f, Outcome.ALREADY_DONE, "lease renewed or registered again meanwhile; kept"
                )

    def _fire(self, group: list[Finding]) -> None:
        loc = group[0].location
        assert loc is not None
        time_source = self.mgr.time
        before = self._read(loc)
        due = (
            set()
            if before is None or before.deleted
            else {
                f.service
                for f in group
                if f.service in before.services
                and (at := before.services[f.service].resume_at) is not None
                and time_source.is_past(at)
            }
        )
        rec = self.mgr.fire_due_resumes(loc, actor=self.actor) if due else before
        now = self.mgr.clock()
        for f in group:
            st = None if rec is None else rec.services.get(f.service or "")
            version = None if rec is None else rec.version
            if st is None or rec is None or rec.deleted:
                self._record(f, Outcome.ALREADY_DONE, "location gone or removed meanwhile")
            elif f.service in due and st.actor == self.actor and st.resume_at is None:
                self._record(f, Outcome.APPLIED, f"resumed: now {st.state.value}", version)
            elif st.resume_at is None or st.resume_at > now:
                self._record(
                    f, Outcome.ALREADY_DONE, f"fired or rescheduled meanwhile ({st.state.value})",
                    version,
                )
            elif f.service not in due:
                problem = time_source.problem()
                self._record(
                    f, Outcome.BLOCKED,
                    f"not fired: {problem} (docs/time.md)" if problem is not None
                    else "not fired: not yet past by the backend's time beyond doubt",
                    version,
                )
            else:
                self._record(f, Outcome.FAILED, "still due after firing", version)

    def _settle(self, group: list[Finding]) -> None:
        for f in group:
            loc, svc = f.location, f.service
            assert loc is not None and svc is not None
            before = self._read(loc)
            gen = f.evidence["generation"]
            if (
                before is None
                or before.deleted
                or svc not in before.services
                or not before.services[svc].state.transitional
                or before.services[svc].generation != gen
            ):
                self._record(f, Outcome.ALREADY_DONE, "settled or changed meanwhile")
                continue
            writes = self.mgr.stats["writes"]
            rec = self.mgr.settle(loc, svc)
            st = rec.services[svc]
            if not st.state.transitional:
                if self.mgr.stats["writes"] > writes:  # this manager committed the settle
                    self._record(f, Outcome.APPLIED, f"settled: now {st.state.value}", rec.version)
                else:
                    self._record(f, Outcome.ALREADY_DONE, "settled meanwhile", rec.version)
                continue
            lagging = lagging_workers(
                loc, svc, st.generation, self.backend.workers(), self.backend.acks(loc),
                self.mgr.time,
            )
            problem = self.mgr.time.problem()
            self._record(
                f,
                Outcome.BLOCKED,
                f"live workers still lag: {', '.join(lagging) or 'none'}; not settled"
                + (f" ({problem}: leases not judged, docs/time.md)" if problem else ""),
                rec.version,
            )

    def _add_location(self, group: list[Finding]) -> None:
        loc = group[0].location
        assert loc is not None
        services = tuple(group[0].evidence["expected_services"])
        before = self._read(loc)
        if before is not None and not before.deleted and all(
            s in before.services for s in services
        ):
            for f in group:
                self._record(f, Outcome.ALREADY_DONE, "present meanwhile", before.version)
            return
        rec = self.mgr.add_location(loc, services, actor=self.actor)
        if self._wrote(loc, 0 if before is None else before.version):
            what = "created" if before is None else "restored" if before.deleted else "added"
            outcome = Outcome.APPLIED
        else:
            what, outcome = "added meanwhile", Outcome.ALREADY_DONE
        for f in group:
            self._record(f, outcome, what, rec.version)

    def _remove_location(self, group: list[Finding]) -> None:
        for f in group:
            loc = f.location
            assert loc is not None
            before = self._read(loc)
            if before is None or before.deleted:
                self._record(f, Outcome.ALREADY_DONE, "removed meanwhile")
                continue
            rec = self.mgr.remove_location(loc, actor=self.actor)
            if self._wrote(loc, before.version):
                self._record(f, Outcome.APPLIED, f"removed at {_iso(rec.deleted_at)}", rec.version)
            else:
                self._record(f, Outcome.ALREADY_DONE, "removed meanwhile", rec.version)

    def _purge(self, group: list[Finding]) -> None:
        for f in group:
            loc = f.location
            assert loc is not None
            version = int(f.evidence["version"])
            for _ in range(2):
                try:
                    self.mgr.purge_location(loc, version)
                except NotFound:
                    self._record(f, Outcome.ALREADY_DONE, "purged meanwhile")
                except InvalidTransition:
                    self._record(f, Outcome.ALREADY_DONE, "restored meanwhile; kept")
                except VersionConflict:
                    # Changed since the scan: purge only if it is still the same, ready tombstone.
                    rec = self._read(loc)
                    if rec is None:
                        self._record(f, Outcome.ALREADY_DONE, "purged meanwhile")
                    elif not rec.deleted:
                        self._record(f, Outcome.ALREADY_DONE, "restored meanwhile; kept")
                    elif rec.deleted_at != f.since or _tombstone_readiness(
                        rec, self.backend.workers(), self.backend.acks(loc), self.mgr.time,
                        self.ttl,
                    ) is None:
                        self._record(f, Outcome.BLOCKED, "changed meanwhile; no longer ready")
                    else:
                        version = rec.version
                        continue
                else:
                    self._record(f, Outcome.APPLIED, "purged")
                break
            else:
                self._record(f, Outcome.BLOCKED, "kept changing; left for the next check")


# -- small helpers -----------------------------------------------------------------------------

_SKEW_REPAIR = RepairPlan(
    action=None,
    description=(
        "none: fix that host's time sync (NTP); deadlines are judged on the backend's time "
        "meanwhile (docs/time.md)"
    ),
)


def _offset_text(offset: float) -> str:
    """``10800.0s ahead of`` / ``3.2s behind``: a clock offset for a sentence."""
    return f"{abs(offset):.1f}s {'ahead of' if offset > 0 else 'behind'}"


def _clock_view(time_source: TimeSource, refusals: int) -> ClockView:
    unc = time_source.uncertainty_seconds()
    return ClockView(
        offset_seconds=time_source.offset_seconds(),
        uncertainty_seconds=unc if math.isfinite(unc) else None,
        max_uncertainty_seconds=time_source.max_uncertainty_seconds,
        refusals=refusals,
        problem=time_source.problem(),
    )


def _seconds(name: str, value: float) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{name} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return seconds


def _normalise_expected(
    expected: Mapping[str, Sequence[str]], configured: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    if isinstance(expected, str) or not isinstance(expected, Mapping):
        raise InvalidInput("expected locations must be a mapping location -> services")
    if not expected:
        raise InvalidInput(
            "the expected location list is empty: checking against it would remove every location"
        )
    out: dict[str, tuple[str, ...]] = {}
    for name, services in expected.items():
        check_location(name)
        if isinstance(services, str):
            raise InvalidInput(f"services of {name!r} must be a list, not a string")
        canon = {canonical_service(s, configured) for s in services}
        if not canon:
            raise InvalidInput(f"expected location {name!r} has no service")
        out[name] = tuple(sorted(canon))
    return out


def _summary(findings: Sequence[Finding], repairs: Sequence[Repair]) -> Summary:
    by_kind = dict.fromkeys(KINDS, 0)
    left_by_kind = dict.fromkeys(KINDS, 0)
    for f in findings:
        by_kind[f.kind] += 1
        if f.state.left:
            left_by_kind[f.kind] += 1
    outcomes = dict.fromkeys((o.value for o in Outcome), 0)
    for r in repairs:
        outcomes[r.outcome] += 1
    return Summary(
        findings=len(findings),
        left=sum(left_by_kind.values()),
        repaired=sum(1 for f in findings if f.state is FindingState.REPAIRED),
        resolved=sum(1 for f in findings if f.state is FindingState.RESOLVED),
        by_kind=by_kind,
        left_by_kind=left_by_kind,
        repairs_by_outcome=outcomes,
    )


@contextlib.contextmanager
def _progress_bar(enabled: bool, total: int, label: str) -> Iterator[Callable[[], None]]:
    """Yield ``advance()``; draws a transient bar on stderr when enabled and ``total`` is more
    than :data:`PROGRESS_THRESHOLD`."""
    if not enabled or total <= PROGRESS_THRESHOLD:
        yield lambda: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        step = max(1, total // 200)
        count = [0]

        def advance() -> None:
            count[0] += 1
            if count[0] % step == 0 or count[0] == total:
                bar.update(task, completed=count[0])

        yield advance


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _human_age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // subsize}{sub}"
    return f"{s // 60}m{s % 60}s"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


_STATE_STYLE = {
    FindingState.OPEN: "red",
    FindingState.PLANNED: "yellow",
    FindingState.REPAIRED: "green",
    FindingState.RESOLVED: "green",
    FindingState.BLOCKED: "red",
    FindingState.FAILED: "bold red",
}


def _summary_line(report: CheckReport) -> Text:
    s, sc = report.summary, report.scanned
    head = (
        f"{sc.records} records ({sc.tombstones} removed, {sc.corrupt} corrupt), "
        f"{sc.workers} workers ({sc.workers - sc.live_workers} expired) checked in "
        f"{report.duration_seconds:.2f}s: "
    )
    if report.status == "clean":
        return Text(head + "clean", style="green")
    kinds = ", ".join(f"{n} {k}" for k, n in s.by_kind.items() if n)
    noun = "finding" if s.findings == 1 else "findings"
    tail = f"{s.findings} {noun} ({kinds}); {s.repaired} repaired, {s.resolved} resolved"
    tail += f", {s.left} left" if s.left else ""
    if report.options.dry_run:
        tail += " (dry run: nothing written)"
    if report.status == "error":
        tail += "; backend unavailable during repairs"
    style = {"repaired": "green", "findings": "yellow", "error": "bold red"}[report.status]
    return Text(f"{head}{tail} -> exit {report.exit_code}", style=style)


__all__ = [
    "FORMAT",
    "KINDS",
    "PROGRESS_THRESHOLD",
    "Action",
    "CheckReport",
    "Finding",
    "FindingState",
    "Kind",
    "Outcome",
    "Repair",
    "metrics_text",
    "render_report",
    "run_check",
    "write_metrics",
]
