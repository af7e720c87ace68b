"""The check's report as Prometheus text, for node-exporter's textfile collector (docs/check.md,
"Metrics").

A check run is a job, not a server: it cannot be scraped, so it leaves a file the node
exporter serves. The file is replaced atomically (written beside it, fsynced, renamed over it),
so a scrape never sees half a file. Every family is a gauge; every kind and outcome is always
present, so an alert on ``locstatus_check_findings_left > 0`` never reads "no data" as "clean".
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable

from locstatus.check.report import KINDS, CheckReport, Outcome
from locstatus.errors import InvalidInput


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


Family = tuple[str, str, list[tuple[dict[str, str], float]]]
"""One gauge family: name, help text, samples (labels, value)."""


def metrics_text(report: CheckReport) -> str:
    """The Prometheus text exposition of ``report`` (what :func:`write_metrics` writes)."""
    out: list[str] = []
    for name, help_, samples in report_families(report):
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            out.append(f"{name}{{{inner}}} {_num(value)}" if inner else f"{name} {_num(value)}")
    return "\n".join(out) + "\n"


def report_families(report: CheckReport) -> list[Family]:
    """The gauge families of ``report``: what :func:`metrics_text` writes for the textfile
    collector, and what the sidecar serves at ``/metrics`` after its periodic check
    (``serve --check-interval``), under the same names, so one alert rule reads either."""
    out: list[Family] = []

    def family(name: str, help_: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        out.append((name, help_, [(labels, float(value)) for labels, value in samples]))

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
    return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
