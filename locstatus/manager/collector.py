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
first run after it scan every one of those objects (0.24-0.51 s after a 100 000-location pause),
and its next young runs again as they age, mostly for a report its caller is about to drop. So
as the collector is enabled again, everything alive is moved to the oldest generation
(``gc.freeze`` then ``gc.unfreeze``: both are list splices): only the next full collection
scans it, once, and never if it is freed before; cyclic garbage made during the operation is
collected by that full collection instead of a young one. No collector hook is involved (a
Python ``gc.callbacks`` function swallows a Ctrl-C that lands in it). A process that froze
objects itself (``gc.get_freeze_count()`` not 0, e.g. before forking workers) is left alone:
the move would thaw them.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collection_paused() -> Iterator[None]:
    """Hold off automatic cyclic collection while the block runs (nestable, thread-safe: the
    collector is enabled again when the outermost block of any thread ends, if it was enabled
    when the first began, with what is alive moved to the oldest generation: see the module
    docstring)."""
    global _depth, _was_enabled
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
                if gc.get_freeze_count() == 0:  # (a walk of what is frozen: nothing here)
                    gc.freeze()  # everything alive to the oldest generation
                    gc.unfreeze()
                gc.enable()
