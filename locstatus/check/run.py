"""``run_check``: one consistency check run, from arguments to report (docs/design.md §5.4).

The order is the design: validate every argument before anything is read; scan (reads only);
repair when asked (each repair re-reads first); judge this process's own clock last, once the
repairs had their chance to be refused; then sort and count. The report's instants are the
backend's time as this process estimates it (``mgr.clock()``); the run's duration is measured on
the monotonic clock.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import time
from collections.abc import Mapping, Sequence

from locstatus.backends import redact_url
from locstatus.check.render import progress_bar
from locstatus.check.repair import Repairer
from locstatus.check.report import (
    KINDS,
    CheckReport,
    Options,
    Repair,
    clock_view,
    summarize,
    verdict,
)
from locstatus.check.scan import Scan
from locstatus.errors import InvalidInput
from locstatus.manager import Manager
from locstatus.names import canonical_service, check_location

DEFAULT_MAX_SKEW = 1.0
"""Seconds of clock offset to the backend above which ``clock_skew`` is reported. Nothing in
locstatus acts on a host's own clock (docs/time.md), so an offset only shows a host whose time
sync is broken, which its other software (logs, TLS, schedulers) still suffers from."""

_actor_ids = itertools.count(1)


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
    - ``repair``: fix what is safe (see :mod:`locstatus.check.repair`); ``dry_run``: only plan
      the repairs (no write at all; findings with a repair are ``planned``).
    - ``stuck_after``: seconds a service may stay ``pausing``/``resuming``, and a write may
      stay out of the full history while its recent copy holds it (>= 0).
    - ``expected``: location -> services that should exist (as returned by
      :func:`locstatus.locations.load_locations`); None skips missing/unknown locations. An empty
      mapping is refused: it would remove every location.
    - ``tombstone_ttl``: seconds after which a removed location is purged even if not every
      live worker acknowledged it (>= 0).
    - ``progress``: show a progress bar on stderr when there are more than
      :data:`~locstatus.check.render.PROGRESS_THRESHOLD` records.
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
    host, pid = socket.gethostname(), os.getpid()
    actor = f"check:{host}:{pid}:{next(_actor_ids)}"
    bar = progress_bar(progress)

    scan = Scan(mgr, now, stuck_after, tombstone_ttl, wanted, max_skew)
    scan.run(bar)
    repairs: list[Repair] = []
    backend_down = False
    if repair or dry_run:
        repairer = Repairer(mgr, actor, dry_run, tombstone_ttl)
        repairs = repairer.run(scan.findings, bar)
        backend_down = repairer.backend_down
    scan.own_clock(refusals, host=host, pid=pid)

    findings = sorted(
        scan.findings,
        key=lambda f: (KINDS.index(f.kind), f.location or "", f.service or "", f.worker_id or ""),
    )
    summary = summarize(findings, repairs)
    status, code = verdict(summary, backend_down=backend_down)
    return CheckReport(
        backend=redact_url(mgr.backend.url),
        actor=actor,
        started_at=now,
        finished_at=mgr.clock(),
        duration_seconds=round(time.monotonic() - started, 6),
        now=now,
        clock=clock_view(mgr.time, mgr.time.refusals - refusals),
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
