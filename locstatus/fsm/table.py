"""The state table of docs/design.md §3, as data.

This list is the single definition of the machine: :mod:`locstatus.fsm.machine` builds one
``transitions.Machine`` from it and interprets it, :mod:`locstatus.fsm.diagram` draws it, and the
README's table and Mermaid diagram are generated from it (a test fails when they drift).

Rows with ``dest: None`` are internal transitions (the state stays, a field changes). Conditions
and effects are names of pure functions in :mod:`locstatus.fsm.machine`. An event with no row
for the current state is an idempotent no-op, except the pairs in :data:`REFUSED`, which raise
``InvalidTransition``.
"""

from __future__ import annotations

from typing import Any, Final

STATES: Final = ["running", "pausing", "paused", "resuming"]
INITIAL: Final = "running"

EVENTS: Final = (
    "pause",
    "resume",
    "schedule_resume",
    "cancel_scheduled_resume",
    "resume_due",
    "settle",
)

TRANSITIONS: Final[list[dict[str, Any]]] = [
    {"trigger": "pause", "source": ["running", "resuming"], "dest": "pausing",
     "after": ["bump_generation", "clear_resume_at"]},
    {"trigger": "pause", "source": ["pausing", "paused"], "dest": None,
     "conditions": ["has_resume_at"], "after": ["clear_resume_at"]},
    {"trigger": "resume", "source": ["paused", "pausing"], "dest": "resuming",
     "after": ["bump_generation", "clear_resume_at"]},
    {"trigger": "schedule_resume", "source": ["paused", "pausing"], "dest": None,
     "conditions": ["schedule_changes"], "after": ["set_resume_at"]},
    {"trigger": "cancel_scheduled_resume", "source": ["paused", "pausing"], "dest": None,
     "conditions": ["has_resume_at"], "after": ["clear_resume_at"]},
    {"trigger": "resume_due", "source": ["paused", "pausing"], "dest": "resuming",
     "conditions": ["resume_is_due"], "after": ["bump_generation", "clear_resume_at"]},
    {"trigger": "settle", "source": "pausing", "dest": "paused",
     "conditions": ["generation_matches", "all_acked"]},
    {"trigger": "settle", "source": "resuming", "dest": "running",
     "conditions": ["generation_matches", "all_acked"]},
]

REFUSED: Final[dict[str, tuple[str, ...]]] = {
    "schedule_resume": ("running", "resuming"),
}
"""(event, states) pairs that are errors rather than no-ops (HTTP 409, CLI exit 1)."""

RULES: Final[dict[str, str]] = {
    "bump_generation": "generation+1",
    "clear_resume_at": "resume_at = null",
    "set_resume_at": "resume_at = at (must be in the future)",
    "has_resume_at": "a resume is scheduled",
    "schedule_changes": "at differs from resume_at",
    "resume_is_due": "resume_at <= now and resume_at == expected",
    "generation_matches": "generation == g",
    "all_acked": "every live worker acked >= g",
}
"""Human wording of each condition and effect, used by the generated docs."""
