"""Was anything reported ``paused`` while a live worker still ran it? The false-settle check
of the backend-fault scenarios (``test_faults_backend_errors.py``).

A ``settle`` history entry that moves a service to ``paused`` at time *T* says: every live
worker that applies it has stopped. :func:`false_settles` checks that against what each worker
process really did, from its handler events (``agent_proc.py`` writes ``start``/``end`` of
every handler, with the state it applies, and ``stopped`` when it stops): at *T*, the last
handler event of every running worker for that (location, service) must be the ``end`` of a
pause handler (or one must end within :data:`SLACK` after *T*: stamps have millisecond
resolution on ZooKeeper and MongoDB). A pause handler still running, one that raised
(``start`` without ``end``), a resume handler begun or ended, or no handler yet: that worker
was running while the record said ``paused``: a false settle.

History stamps and handler events are wall-clock times of processes on one host. A worker
process counts as running from its first event to its ``stopped`` event; a killed process
would count until its next life stops, so this check suits scenarios that do not kill workers
(those of ``test_faults_backend_errors.py``). A worker frozen past its lease counts as running,
as it is: a settle without it is exactly what this check reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agent_proc import AgentProc

from locstatus.models import HistoryEntry, State

SLACK = 0.05
"""Seconds a settle stamp may lead the handler event it follows (clock resolution)."""


@dataclass
class WorkerEvents:
    """One worker's handler events per (location, service), and its lives."""

    worker_id: str
    by_key: dict[tuple[str, str], list[tuple[float, str, str]]] = field(default_factory=dict)
    """(location, service) -> [(t, "start" | "end", "paused" | "running")], in order."""
    lives: list[tuple[float, float]] = field(default_factory=list)
    """(first event, ``stopped`` or last event) of each life of the process."""


def load_events(agent: AgentProc) -> WorkerEvents:
    """The events of every life of ``agent``'s process: a life runs from its first event (the
    handlers ``start()`` runs come before ``ready``) to its ``stopped`` event, or on while the
    process is alive."""
    out = WorkerEvents(agent.id)
    if not agent.events.exists():
        return out
    began: float | None = None
    last = 0.0
    for line in agent.events.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed process
        t = last = float(ev["t"])
        kind = ev.get("ev")
        if began is None:
            began = t
        if kind == "stopped":
            out.lives.append((began, t))
            began = None
        elif kind in ("start", "end"):
            key = (str(ev["location"]), str(ev["service"]))
            out.by_key.setdefault(key, []).append((t, kind, str(ev.get("to"))))
    if began is not None:
        out.lives.append((began, float("inf") if agent.alive else last))
    return out


def _state_at(events: list[tuple[float, str, str]], at: float) -> tuple[float, str, str] | None:
    before = [e for e in events if e[0] <= at]
    return before[-1] if before else None


def _running_at(w: WorkerEvents, key: tuple[str, str], at: float) -> str | None:
    """Why worker ``w`` may be running ``key`` at ``at`` (a settle's stamp, which may lead the
    true time by up to :data:`SLACK`), or None when it had stopped it: its pause handler had
    ended by ``at``, or ended within ``SLACK`` after it."""
    if not any(a <= at <= b for a, b in w.lives):
        return None  # not running at all then
    events = w.by_key.get(key, [])
    last = _state_at(events, at)
    if last is not None and last[1] == "end" and last[2] == State.PAUSED.value:
        return None
    if any(at < t <= at + SLACK and kind == "end" and to == State.PAUSED.value
           for t, kind, to in events):
        return None
    if last is None:
        return "had run no handler yet"
    t, kind, to = last
    if kind == "end":
        return f"had ended its resume handler at {t:.3f}"
    return f"was in its {to} handler since {t:.3f} (or it raised: a raising handler never ends)"


def false_settles(
    history: dict[str, list[HistoryEntry]], agents: Sequence[AgentProc]
) -> list[str]:
    """Every settle to ``paused`` in ``history`` (location -> entries) made while a worker of
    ``agents`` still ran that service there (each of them applies every service at every
    location of the history)."""
    workers = [load_events(a) for a in agents]
    found: list[str] = []
    for loc, entries in history.items():
        for e in entries:
            if e.event != "settle" or e.to_state is not State.PAUSED:
                continue
            at = e.at.timestamp()
            for w in workers:
                why = _running_at(w, (loc, e.service), at)
                if why is not None:
                    found.append(f"{loc}/{e.service} settled paused at {at:.3f} (v{e.version}, "
                                 f"g{e.generation}) while worker {w.worker_id} {why}")
    return found


def read_histories(url: str, locations: Iterable[str]) -> dict[str, list[HistoryEntry]]:
    """The full history of each location, oldest first (``history_check.full_history``)."""
    from support.history_check import full_history

    return {loc: full_history(url, loc) for loc in locations}
