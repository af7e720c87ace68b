"""The check's report as log events (``--log-format json``; docs/check.md "Logs"): one record
per finding, per repair and one summary, each carrying the location, service and worker it is
about, so a log pipeline can alert or search on them without parsing the report.

Why it is shaped so: the report stays the one result of a run (``--json``, the metrics file);
this only walks it, after the run, on the ``locstatus.check`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Container

from locstatus.check.report import CheckReport

log = logging.getLogger("locstatus.check")


def log_report(
    report: CheckReport,
    logger: logging.Logger = log,
    *,
    known: Container[str] = (),
) -> None:
    """Log ``report``: a WARNING per finding whose ``id`` is not in ``known`` (a finding
    already logged by an earlier run of the same process is not logged again), an INFO per
    repair and an INFO summary. Fields (docs/http.md "Logs"): ``location``, ``service``,
    ``worker``, ``kind``, ``finding``; repairs add ``action``, ``outcome``, ``version``."""
    for f in report.findings:
        if f.id in known:
            continue
        logger.warning(
            "%s: %s", f.kind.value, f.message,
            extra=_fields(f.location, f.service, f.worker_id)
            | {"kind": f.kind.value, "finding": f.id, "finding_state": f.state.value},
        )
    for r in report.repairs:
        logger.info(
            "repair %s %s: %s", r.action.value, r.outcome.value, r.detail,
            extra=_fields(r.location, r.service, r.worker_id)
            | {"kind": r.kind.value, "finding": r.finding, "action": r.action.value,
               "outcome": r.outcome.value, "version": r.version},
        )
    s = report.summary
    logger.info(
        "check done in %.2fs: %d finding(s), %d left, %d repaired",
        report.duration_seconds, s.findings, s.left, s.repaired,
        extra={"findings": s.findings, "left": s.left, "repaired": s.repaired,
               "exit_code": int(report.exit_code), "duration_seconds": report.duration_seconds},
    )


def _fields(location: str | None, service: str | None, worker: str | None) -> dict[str, object]:
    out: dict[str, object] = {}
    if location is not None:
        out["location"] = location
    if service is not None:
        out["service"] = service
    if worker is not None:
        out["worker"] = worker
    return out
