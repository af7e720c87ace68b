"""The check's vocabulary: finding kinds, repair outcomes and the JSON report (docs/check.md).

Everything a run produces is one of these pydantic models, so the report has one shape whatever
made it: :meth:`CheckReport.as_dict` is its JSON dump, every key is always present (``null``/``0``
when not applicable), every finding kind and repair outcome is always counted, and
``docs/check.md`` documents each key (a test holds the two together). The scan and the repair
fill :class:`Finding` and :class:`Repair` in; :func:`summarize` counts them, purely. Nothing here
reads a backend or prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from locstatus.clock import TimeSource

FORMAT = "locstatus.check/1"
"""Value of the report's ``format`` key; bumped only when a key changes meaning or goes away."""


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


FINDING_STATE = {
    Outcome.PLANNED: FindingState.PLANNED,
    Outcome.APPLIED: FindingState.REPAIRED,
    Outcome.ALREADY_DONE: FindingState.RESOLVED,
    Outcome.BLOCKED: FindingState.BLOCKED,
    Outcome.FAILED: FindingState.FAILED,
    Outcome.NOT_ATTEMPTED: FindingState.OPEN,
}
"""The state a finding is left in by the outcome of its repair."""


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
    """The result of :func:`locstatus.check.run_check`. ``as_dict()`` (also what
    ``GET /v1/check`` serves) is the JSON of this model; see ``docs/check.md`` for every key.

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


ProgressBar = Callable[[int, str], AbstractContextManager[Callable[[], None]]]
"""``bar(total, label)``: a context yielding ``advance()``, called once per item done. The scan
and the repair take one; :func:`locstatus.check.render.progress_bar` draws it (rich stays in
rendering), :func:`no_progress` draws nothing."""


def _nothing() -> None:
    return None


def no_progress(total: int, label: str) -> AbstractContextManager[Callable[[], None]]:
    """A :data:`ProgressBar` that draws nothing."""
    return nullcontext(_nothing)


def summarize(findings: Sequence[Finding], repairs: Sequence[Repair]) -> Summary:
    """The report's counts: every kind and every outcome present, 0 when none; ``left`` counts
    findings whose state is left (:attr:`FindingState.left`)."""
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


def verdict(summary: Summary, *, backend_down: bool) -> tuple[str, int]:
    """The report's ``(status, exit_code)``: ``error``/2 when the backend went down during the
    repairs, ``findings``/1 when some are left, else ``repaired`` (findings, none left) or
    ``clean`` (none at all), 0."""
    if backend_down:
        return "error", 2
    if summary.left:
        return "findings", 1
    return ("repaired" if summary.findings else "clean"), 0


def clock_view(time_source: TimeSource, refusals: int) -> ClockView:
    """The report's ``clock`` section from ``time_source`` as it stands now; ``refusals``: the
    deadline decisions this run refused (docs/time.md)."""
    unc = time_source.uncertainty_seconds()
    return ClockView(
        offset_seconds=time_source.offset_seconds(),
        uncertainty_seconds=unc if math.isfinite(unc) else None,
        max_uncertainty_seconds=time_source.max_uncertainty_seconds,
        refusals=refusals,
        problem=time_source.problem(),
    )
