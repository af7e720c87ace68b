"""A record against its history, compared purely (``history_mismatch``, docs/check.md).

Every write of the manager stores a change and its history entries in one atomic write
(docs/design.md §2), so each service of a record shows what the newest history entry of that
service left: its operation id, state, generation and scheduled resume; a service untouched since
its location was created (or the service added) shows what that entry left (running, generation
0, nothing scheduled). A service that disagrees is drift: a hand edit, a write that bypassed the
manager, lost history.

The functions here only compare. The history is handed to :func:`compare_history` as pages,
newest first, by the scan, which reads each page from the backend only when the walk asks for
it (so the walk stops reading as soon as every service met its newest entry); tests hand plain
lists. :func:`head_agrees` is the scan's screen for the usual case, the newest writes alone
deciding (docs/check.md, "Cost").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import NamedTuple

from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus, State


class Problem(NamedTuple):
    """One disagreement: ``service`` (``*`` for the record as a whole: its version has no
    history entry, or the history is ahead of it), the ``fields`` that differ, and the history
    ``entry`` compared with (None when the service, or the record, has none)."""

    service: str
    fields: list[str]
    entry: HistoryEntry | None


def compare_history(
    rec: LocationStatus, pages: Iterable[list[HistoryEntry]]
) -> tuple[list[Problem], dict[str, datetime]]:
    """Walk ``rec``'s history, ``pages`` of entries newest first (the first page starting at
    the newest write), until each service met its newest entry.

    Returns ``(problems, entered)``: ``entered`` maps each transitional service to when it
    entered its state (for ``stuck_transition``), when the history shows it. A history ahead of
    ``rec`` is one problem, alone: the record changed after it was read, or the history was
    written without it (the caller re-reads the record to tell which). No page at all is one
    problem for the record, not one per service. Pages are consumed lazily: the walk stops
    pulling as soon as it is decided. An error raised by ``pages`` (``CorruptRecord``)
    propagates."""
    services = rec.services
    pending = set(services)
    entering = {s for s, st in services.items() if st.state.transitional}
    entered: dict[str, datetime] = {}
    problems: list[Problem] = []
    first = True
    for page in pages:
        if not page:
            break
        if first:
            first = False
            newest = page[0].version
            if newest > rec.version:  # changed after it was read, or drift: the caller re-reads
                return [Problem("*", ["version"], page[0])], entered
            if newest != rec.version:
                problems.append(Problem("*", ["version"], page[0]))
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
                if not agrees(st, entry):
                    fields = (
                        diff_created(st, entry) if entry.event == "add_service" else diff(st, entry)
                    )
                    problems.append(Problem(svc, fields, entry))
            elif svc == "*" and entry.event == "create":
                for s in sorted(pending):
                    st = services[s]
                    if not created_by(st, entry):
                        problems.append(Problem(s, diff_created(st, entry), entry))
                pending.clear()
                entering.clear()
            if not pending and not entering:
                return problems, entered
    if first:  # no history at all: one finding for the record, not one per service
        return [Problem("*", ["version"], None)], entered
    for s in sorted(pending):
        problems.append(Problem(s, ["op_id"], None))
    return problems, entered


def head_agrees(services: Mapping[str, ServiceStatus], head: list[HistoryEntry]) -> bool:
    """True when the newest writes ``head`` (entries newest first, the newest at the record's
    version) alone show every service of a record with no transitional service agreeing with
    its newest history entry: what :func:`compare_history` would then find without problems.
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
                    if not created_by(services[s], entry):
                        return False
                return True
            continue
        if pending is None:
            pending = set(services)
        if svc in pending:
            if not agrees(services[svc], entry):
                return False
            pending.discard(svc)
            if not pending:
                return True
    return False


def agrees(st: ServiceStatus, entry: HistoryEntry) -> bool:
    """True when ``entry``, the newest history entry of a service, shows ``st`` (see
    :func:`diff` and :func:`diff_created` for the fields that differ when not)."""
    if entry.event == "add_service":
        return created_by(st, entry)
    return (
        entry.op_id == st.op_id
        and entry.to_state is st.state
        and entry.generation == st.generation
        and entry.resume_at == st.resume_at
    )


def diff(st: ServiceStatus, entry: HistoryEntry) -> list[str]:
    """The fields of ``st`` (``op_id``, ``state``, ``generation``, ``resume_at``) that differ
    from what ``entry``, a change of the service, left."""
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


def created_by(st: ServiceStatus, entry: HistoryEntry) -> bool:
    """True when ``st`` is what ``entry`` (create / add_service) left: running at generation 0,
    nothing scheduled, last changed by that operation (see :func:`diff_created`)."""
    return (
        st.op_id == entry.op_id
        and st.state is State.RUNNING
        and st.generation == 0
        and st.resume_at is None
    )


def diff_created(st: ServiceStatus, entry: HistoryEntry) -> list[str]:
    """The fields of ``st`` that differ from what ``entry`` (create / add_service) left: a
    service untouched since it was created (or added) is running at generation 0."""
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
