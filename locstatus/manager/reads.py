"""Reads: one record, every record (with the corrupt ones beside the readable ones), history,
workers and who lags. No write and no retry: what a read returns is as fresh as the backend's
read (docs/design.md §4), and a corrupt record is a value here, never a gap in a listing
(docs/http.md, "Corrupt records in listings").
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import NamedTuple

from locstatus.errors import CorruptRecord, InvalidInput, LocstatusError
from locstatus.models import HistoryEntry, LocationStatus
from locstatus.names import check_location

from .core import Core
from .liveness import lagging_workers
from .plans import services_arg, targets


class Listing(NamedTuple):
    """Every record as one read of all of them found it (:meth:`Manager.listing
    <locstatus.manager.Manager.listing>`): what front ends list, corrupt records as errors
    beside the readable ones (docs/http.md, "Corrupt records in listings"). Unpacks as
    ``records, corrupt``."""

    records: list[LocationStatus]
    """The readable records, sorted by location (tombstones only if asked)."""
    corrupt: list[CorruptRecord]
    """Every record that does not validate, sorted by location; each names its location."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector during a bulk decode: 10^5 freshly allocated,
    acyclic models would otherwise trigger repeated full-heap scans (about 45% of the time of
    ``statuses()`` at 100 000 locations, bench/scale.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def scan(core: Core) -> list[LocationStatus | CorruptRecord]:
    """Every record, corrupt ones as :class:`CorruptRecord` values."""
    with gc_paused():
        return core.backend.read_all()


def statuses(core: Core, *, include_removed: bool = False) -> list[LocationStatus]:
    """Every readable record, sorted by location (tombstones only if asked)."""
    return [
        r
        for r in scan(core)
        if isinstance(r, LocationStatus) and (include_removed or not r.deleted)
    ]


def listing(core: Core, *, include_removed: bool = False) -> Listing:
    """:func:`statuses` with the corrupt records beside them."""
    records: list[LocationStatus] = []
    corrupt: list[CorruptRecord] = []
    for item in scan(core):
        if isinstance(item, CorruptRecord):
            corrupt.append(item)
        elif include_removed or not item.deleted:
            records.append(item)
    return Listing(records, corrupt)


def history(
    core: Core, location: str, limit: int = 50, *, before_version: int | None = None
) -> list[HistoryEntry]:
    """History of ``location``, newest first (``limit`` entries, 1..10000)."""
    check_location(location)
    if not 1 <= limit <= 10_000:
        raise InvalidInput(f"history limit must be 1..10000, got {limit}")
    entries = core.backend.history(location, limit=limit, before_version=before_version)
    if not entries and before_version is None:
        core.writer.read(location)  # NotFound for an unknown location rather than []
    return entries[:limit]


def lagging(core: Core, location: str, service: str) -> list[str]:
    """Live workers that have not acknowledged the current generation of a service."""
    rec = core.writer.read(check_location(location))
    chosen = targets(rec, services_arg(service, core.services))
    if isinstance(chosen, LocstatusError):
        raise chosen
    svc = chosen[0]
    return lagging_workers(
        location,
        svc,
        rec.services[svc].generation,
        core.backend.workers(),
        core.backend.acks(location),
        core.time,
    )
