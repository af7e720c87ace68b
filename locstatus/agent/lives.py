"""Asking the backend whether a record read is of the life of the location the agent applied.

A location removed, purged and created again is a new location for the worker (agent/
replica.py, "Lives"). The local copy tells when a record read *may* be of another life
(:meth:`LocalCopy.life_check`); this module asks the backend, in the thread that read the
record (the watch thread, or an apply thread re-reading after a handler), never under the
agent's lock, and never from a backend's hint thread (a hint's record that needs asking is
read again by the watch thread). The answer goes to :meth:`AgentState.store_locked`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from locstatus.agent.replica import Life
from locstatus.agent.state import AgentState
from locstatus.errors import CorruptRecord
from locstatus.models import LocationStatus

if TYPE_CHECKING:
    from locstatus.backends.base import Backend

__all__ = ["ask_lives"]

log = logging.getLogger("locstatus.agent")


def ask_lives(
    state: AgentState, backend: Backend, worker_id: str, records: Iterable[LocationStatus]
) -> dict[str, Life]:
    """For each of ``records`` that may be of another life than the record held, whether the
    version held is still a write of the record's current life, by location: one history
    read each (``Backend.history_write`` finds every write of the current life and none of
    an earlier one, backends/base.py invariant 9), none for the others. A history write that
    does not read answers "cannot tell" (``same`` None). Raises what the read raises
    (:class:`~locstatus.errors.LocstatusError`)."""
    with state.lock:
        asks = [(r.location, v) for r in records if (v := state.copy.life_check(r)) is not None]
    out: dict[str, Life] = {}
    for loc, version in asks:
        same: bool | None
        try:
            same = bool(backend.history_write(loc, version))
        except CorruptRecord as exc:
            same = None
            log.warning(
                "agent %s: cannot tell whether %s is still the record of version %d (%s): "
                "applying it again",
                worker_id,
                loc,
                version,
                exc.detail,
            )
        if same is False:
            log.warning(
                "agent %s: %s was removed and created again since version %d: on_remove for "
                "the one applied, then applying the new one",
                worker_id,
                loc,
                version,
            )
        out[loc] = Life(version, same)
    return out
