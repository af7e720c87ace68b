"""The consistency check (docs/design.md §5.4, §3.5; docs/check.md): find drift between what is
stored and what should hold, and repair what is safe to repair through the manager's
compare-and-set path.

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

What lives here, one idea per module, layered so that each only looks down:

- :mod:`.report`: the vocabulary and the JSON report (kinds, outcomes, :class:`Finding`,
  :class:`Repair`, :class:`CheckReport`), its counts and verdict;
- :mod:`.history`: a record against its history, compared purely;
- :mod:`.screen`: the fast screen that passes quiet records without a further read;
- :mod:`.tombstones`: when a tombstone may be purged;
- :mod:`.text`: times, ages and clock offsets as plain text, shared by the findings' messages
  and the rendering;
- :mod:`.findings`: what each finding kind says (message, evidence, repair plan);
- :mod:`.scan`: the one pass that reads and judges;
- :mod:`.repair`: the repairs, planned purely and made through the manager's guarded writes;
- :mod:`.render` (rich: the table, the summary line, the progress bar),
  :mod:`.prometheus` (the textfile collector's file, and the families the sidecar serves) and
  :mod:`.events` (one log record per finding and repair): the only modules that format for
  an outside reader;
- :mod:`.run`: :func:`run_check`, which strings them together.

Why it is shaped so:

- **It only consumes the manager.** Reads go through the manager and the
  :class:`~locstatus.backends.base.Backend` interface; every repair is a guarded manager (or
  backend) call, so any number of checks may repair at once from several hosts: each repair
  happens once and the others find it done.
- **Deadlines on the backend's time.** A worker is expired, a tombstone past its TTL, a resume
  due to fire, only when the deadline passed by the backend's time beyond doubt (docs/time.md;
  ``ServiceStatus.resume_due``); how long something has been stuck or overdue is reported
  against ``mgr.clock()``, the backend's time as this process estimates it. A check on a host
  whose clock is off judges exactly as one on a host whose clock is right, and reports the
  offset.
- **Re-check before repairing.** Each repair re-reads what it is about to fix and reports
  ``already_done`` when someone else fixed it meanwhile, ``blocked`` when it is not safe, or
  ``applied``.
- **Report, never rewrite, what cannot be repaired safely.** A corrupt record is never deleted
  or rewritten and history is never rewritten: both stay findings (exit 1) until an operator
  acts (``locstatus history LOCATION`` shows what is known).
- **Stable output.** :class:`CheckReport` is a pydantic model: :meth:`CheckReport.as_dict` is its
  JSON dump, every key is always present, every finding kind is always counted, and
  ``docs/check.md`` documents each key.

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

from locstatus.check.events import log_report
from locstatus.check.prometheus import metrics_text, report_families, write_metrics
from locstatus.check.render import PROGRESS_THRESHOLD, render_report
from locstatus.check.report import (
    FORMAT,
    KINDS,
    Action,
    CheckReport,
    Finding,
    FindingState,
    Kind,
    Outcome,
    Repair,
)
from locstatus.check.run import DEFAULT_MAX_SKEW, run_check

__all__ = [
    "DEFAULT_MAX_SKEW",
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
    "log_report",
    "metrics_text",
    "render_report",
    "report_families",
    "run_check",
    "write_metrics",
]
