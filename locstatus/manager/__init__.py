"""The manager: the one place that combines the state machine with a backend.

What lives here, each part a module that only looks down:

- :mod:`.manager`: :class:`Manager`, the public class: thin methods over the parts below.
- :mod:`.bulk`: one bulk operation for every location or any list of them, with its per-location
  :class:`BulkReport`, ``wait=``, progress and a clean stop on Ctrl-C (:class:`BulkInterrupted`).
- :mod:`.operator`: operator events (:class:`Operation`: pause, resume now or scheduled, cancel)
  on one location: the write, the settle of what no live worker applies, the wait.
- :mod:`.locations`: location sync (``sync_locations``, dry run included) and the tombstone.
- :mod:`.reconcile`: settle, fire due resumes, the settle right after a write, waits.
- :mod:`.reads`: reads and listings (corrupt records beside the readable ones).
- :mod:`.liveness`: which workers are live and which lag (the settle rule, pure).
- :mod:`.workers`: the workers with their liveness and lag, one shape for every front end.
- :mod:`.writes`: the compare-and-set write loop (read, plan, write with the expected version,
  retry conflicts, resolve ambiguity by version) and the version hints.
- :mod:`.plans`: pure planning: a record in, a decision (write, nothing, refuse) out.
- :mod:`.core`: the small value the parts share (backend, time, services, write loop).

Nothing here is trusted between calls: a stale process can never write back an old view
(:mod:`.writes` says the one exception, a version hint, and why it is safe). The manager imports
neither the agent, the api, the cli, the check nor the bridge (import contracts, pyproject).
"""

from .bulk import BulkInterrupted, BulkItem, BulkReport, Outcome, Progress, interrupted
from .liveness import (
    acks_lapsed,
    away_note,
    away_notes,
    holder_away,
    lagging_workers,
    stuck_handlers,
    worker_live,
)
from .locations import SyncReport
from .manager import Manager
from .operator import Operation
from .plans import ServiceArg
from .reads import Listing
from .workers import Lag, WorkerReport, WorkerStatus
from .writes import RetryPolicy

__all__ = [
    "BulkInterrupted",
    "BulkItem",
    "BulkReport",
    "Lag",
    "Listing",
    "Manager",
    "Operation",
    "Outcome",
    "Progress",
    "RetryPolicy",
    "ServiceArg",
    "SyncReport",
    "WorkerReport",
    "WorkerStatus",
    "acks_lapsed",
    "away_note",
    "away_notes",
    "holder_away",
    "interrupted",
    "lagging_workers",
    "stuck_handlers",
    "worker_live",
]
