"""What every part of the manager works with: the backend, its time, the configured services and
the write loop (:class:`Core`).

The manager is one public class (:class:`~locstatus.manager.Manager`) with thin methods over the
functions of its parts (operator events, reconcile primitives, location sync, bulk operations);
those functions take this small value instead of the manager, so each part is a module of its
own that imports only what lies beneath it.
"""

from __future__ import annotations

from dataclasses import dataclass

from locstatus.backends.base import Backend
from locstatus.clock import Clock, TimeSource

from .writes import Writer


@dataclass(frozen=True, eq=False)
class Core:
    """``backend``; ``time``: the backend's time (docs/time.md), every deadline is judged on
    it; ``services``: the configured service set; ``writer``: the compare-and-set loop."""

    backend: Backend
    time: TimeSource
    services: tuple[str, ...]
    writer: Writer

    @property
    def clock(self) -> Clock:
        return self.time.now
