"""Who changed what: a location's history filtered by actor (docs/http.md "Callers and roles",
``GET /v1/locations/{location}/history?actor=``, ``locstatus history --actor``).

Why it is shaped so: the backends keep history per location, newest first, in pages that never
split one write (``Backend.history``), and index no actor; an audit question ("what did alice
do at us-east-1") is rare and bounded by the history kept, so it pages through that history
and keeps the matching entries instead of adding an index to every backend. The sidecar and the
CLI share it, so both answer the same.
"""

from __future__ import annotations

from locstatus.errors import InvalidInput
from locstatus.manager import Manager
from locstatus.models import HistoryEntry
from locstatus.names import MAX_ACTOR, check_location, check_text

__all__ = ["PAGE", "history_by_actor"]

PAGE = 1000
"""History entries read per request while filtering."""


def history_by_actor(
    mgr: Manager,
    location: str,
    actor: str,
    *,
    limit: int = 50,
    before_version: int | None = None,
) -> list[HistoryEntry]:
    """The newest ``limit`` (1..10000) entries of ``location``'s history whose ``actor`` is
    exactly ``actor``, newest first, of versions below ``before_version`` when given. Raises
    :class:`InvalidInput` (bad name, limit or actor), :class:`NotFound` (unknown location),
    :class:`BackendUnavailable`."""
    check_location(location)
    check_text("actor", actor, MAX_ACTOR)
    if not actor:
        raise InvalidInput("actor must not be empty")
    if not 1 <= limit <= 10_000:
        raise InvalidInput(f"history limit must be 1..10000, got {limit}")
    out: list[HistoryEntry] = []
    cursor = before_version
    while len(out) < limit:
        page = mgr.backend.history(location, limit=PAGE, before_version=cursor)
        if not page:
            if cursor is None and not out:
                mgr.status(location)  # NotFound for an unknown location rather than []
            break
        out.extend(e for e in page if e.actor == actor)
        oldest = min(e.version for e in page)
        if cursor is not None and oldest >= cursor:  # a backend that ignored the bound
            break
        cursor = oldest
    return out[:limit]
