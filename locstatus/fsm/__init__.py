"""Pure state machine of docs/design.md §3: the table as data, its interpreter and its drawings."""

from locstatus.fsm.machine import Change, Event, transition

__all__ = ["Change", "Event", "transition"]
