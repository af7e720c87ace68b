"""Bulk work with CPython's cyclic garbage collector held off (:func:`collection_paused`).

Why: a bulk operation over 100 000 locations keeps a report item (with its record) per location
and allocates millions of short-lived objects on the way; each allocation burst triggers the
cyclic collector, whose oldest generation re-scans every live object each time, so its cost
grows with the square of the fleet (measured: half of a 50 000-location pause's CPU time, and
the reason a 100 000-location pause took 45 s instead of ~10 s; docs/benchmarks.md, "Bulk
operations"). What a bulk operation allocates is freed by reference counting (records,
plans and history entries form no cycles), so nothing waits for the collector. Reference
counting still frees everything meanwhile, and the collector runs again, for every thread, as
soon as the last bulk operation of the process ends; one that was disabled before is left so.

What the operation leaves alive (its report: a record per location) would make the collector's
first run after it scan every one of those objects (0.4-0.5 s after a 100 000-location pause),
and its next runs again as they age, mostly for a report its caller is about to drop. So as the
collector is enabled again, everything alive is frozen (``gc.freeze``: left out of collections)
until the next collection of the oldest generation, which takes it back (``gc.unfreeze`` from a
``gc.callbacks`` hook as that collection starts): scanned once then if still alive, never if
freed before; cyclic garbage made meanwhile waits for that collection instead of a younger one.
A process that froze objects itself (something is frozen while this module froze nothing, e.g.
before forking workers) is left alone: nothing is frozen here then, and nothing thawed. (One
that freezes objects while this module's are frozen has them thawed with these by the next full
collection. The hook takes no lock: it runs inside the collector, on any thread.)
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_depth = 0
_was_enabled = False
_frozen = False  # what is frozen, this module froze (until _thaw)
_OLDEST = len(gc.get_threshold()) - 1  # the oldest generation's number (2)


@contextmanager
def collection_paused() -> Iterator[None]:
    """Hold off automatic cyclic collection while the block runs (nestable, thread-safe: the
    collector is enabled again when the outermost block of any thread ends, if it was enabled
    when the first began, with what is alive frozen until the next full collection: see the
    module docstring)."""
    global _depth, _was_enabled, _frozen
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                # (counting is a walk of what is frozen: only while this module froze nothing,
                # when it is what the process froze itself, usually nothing)
                if _frozen or gc.get_freeze_count() == 0:
                    gc.freeze()
                    _frozen = True
                gc.enable()


def _thaw(phase: str, info: dict[str, Any]) -> None:
    """As a collection of the oldest generation starts: what :func:`collection_paused` froze
    goes back to that generation, so this collection scans it (``gc.unfreeze`` merges it into
    the generation being collected)."""
    global _frozen
    if _frozen and phase == "start" and info.get("generation") == _OLDEST:
        _frozen = False
        gc.unfreeze()


gc.callbacks.append(_thaw)
