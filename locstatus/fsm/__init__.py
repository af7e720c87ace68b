"""Pure state machine of docs/design.md §3: the table as data, its interpreter and its drawings.

- :mod:`.table`: every state, event, guard and effect as data (``TRANSITIONS``), the one place
  the behaviour is defined;
- :mod:`.machine`: :func:`transition`, the table compiled once (a ``transitions.Machine``
  validates it) and interpreted purely: a service's status and an event in, a :class:`Change`
  (the new status and its history entry) or nothing out;
- :mod:`.diagram`: the Mermaid diagram and the Markdown table of the README, docs/fsm.md,
  ``GET /v1/fsm`` and the status page, drawn from the table (``python -m locstatus.fsm.diagram``).

No I/O and nothing above :mod:`locstatus.models` is imported here (an import contract in
``pyproject.toml`` checks it): the manager applies the machine, the backends never see it.
"""

from locstatus.fsm.machine import Change, Event, transition

__all__ = ["Change", "Event", "transition"]
