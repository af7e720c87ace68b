"""Hint fan-out: how every backend hands a change hint to its subscribers (contract invariant 7).

Why it is shaped so: each backend used to deliver hints with a loop of its own, and the loops
disagreed about a subscriber that raises. The memory backend let the exception escape out of
``compare_and_set`` after the write had committed (the caller saw an error for a write that
landed), SQLite let it escape into its poller thread (which died: no hint ever again, for any
subscriber), ZooKeeper and MongoDB logged it. A hint is advisory and a subscriber is someone
else's code, so there is one rule, written here: every subscriber is called in turn, one that
raises is logged and skipped, and neither the write that caused the hint nor the other
subscribers notice.

:class:`Subscribers` is that list (thread-safe, unsubscribe by the returned function);
:class:`HintBatch` coalesces the hints of one batch of changes (one per kind and location, a
``resync`` that says ``session_lost`` stays so) for backends that deliver in batches.

Usage::

    subscribers = Subscribers("sqlite:///./locstatus.db")
    unsubscribe = subscribers.add(callback)             # every kind
    subscribers.emit(Hint(kind="location", location="us-east-1"))
    subscribers.close()                                  # nothing is delivered after this
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable

from locstatus.backends.base import HintCallback, Unsubscribe
from locstatus.models import Hint

log = logging.getLogger(__name__)


def wants(kinds: frozenset[str] | None, kind: str) -> bool:
    """Whether a subscriber that asked for ``kinds`` (None: every kind) gets ``kind`` hints;
    every subscriber gets ``resync``."""
    return kinds is None or kind in kinds or kind == "resync"


class Subscribers:
    """The subscribers of one backend and the delivery of hints to them.

    ``where`` names the backend in log lines (a URL without credentials). A subscriber added
    with ``kinds`` gets only those kinds and ``resync``; one added without gets every kind.
    A backend whose hints cost nothing to deliver may add every subscriber without ``kinds``
    (the contract lets it deliver kinds nobody asked for). Delivery runs on the calling thread:
    the backend's hint thread, or the writer's own for the memory backend.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self._lock = threading.Lock()
        self._entries: list[tuple[HintCallback, frozenset[str] | None]] = []
        self._closed = False

    def add(self, callback: HintCallback, kinds: Collection[str] | None = None) -> Unsubscribe:
        """Deliver hints to ``callback`` (of ``kinds``, None: every kind) until the returned
        function is called (idempotent)."""
        entry = (callback, None if kinds is None else frozenset(kinds))
        with self._lock:
            self._entries.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._entries:
                    self._entries.remove(entry)

        return unsubscribe

    def __bool__(self) -> bool:
        """Whether anyone is subscribed."""
        with self._lock:
            return bool(self._entries)

    def wanted(self, kind: str) -> bool:
        """Whether some subscriber gets ``kind`` hints (a backend need not watch what none
        asked for)."""
        with self._lock:
            return any(wants(kinds, kind) for _, kinds in self._entries)

    def emit(self, hint: Hint) -> None:
        """Deliver one hint (see :meth:`deliver`)."""
        self.deliver((hint,))

    def deliver(self, hints: Iterable[Hint]) -> None:
        """Call every subscriber with each of ``hints`` it wants, in order. A subscriber that
        raises is logged and skipped: the other subscribers, the other hints and the caller
        (a write that has committed, a poller thread) carry on. Nothing once closed."""
        batch = tuple(hints)
        with self._lock:
            if self._closed:
                return
            entries = list(self._entries)
        for callback, kinds in entries:
            for hint in batch:
                if not wants(kinds, hint.kind):
                    continue
                try:
                    callback(hint)
                except Exception:  # someone else's code: log it, never let it stop the others
                    log.exception("%s: hint callback %r failed on %s", self.where, callback, hint)

    def close(self) -> None:
        """Deliver nothing from now on (a closing backend's hint thread may still be winding
        down). Subscribers stay listed, so :meth:`wanted` still answers."""
        with self._lock:
            self._closed = True


class HintBatch:
    """The hints of one batch of changes, coalesced: one per ``(kind, location)``, the latest
    kept, in the order each was first added; a ``resync`` that says ``session_lost`` keeps
    saying so when a plain one is added after it."""

    def __init__(self) -> None:
        self._hints: dict[tuple[str, str | None], Hint] = {}

    def add(self, hint: Hint) -> None:
        if hint.kind == "resync":
            self.resync(session_lost=hint.session_lost)
            return
        self._hints[(hint.kind, hint.location)] = hint

    def resync(self, *, session_lost: bool = False) -> None:
        """Add a ``resync`` hint (re-read everything); ``session_lost`` is never taken back."""
        earlier = self._hints.get(("resync", None))
        lost = session_lost or (earlier is not None and earlier.session_lost)
        self._hints[("resync", None)] = Hint(kind="resync", session_lost=lost)

    def take(self) -> list[Hint]:
        """The hints gathered so far, leaving the batch empty."""
        out = list(self._hints.values())
        self._hints.clear()
        return out

    def __bool__(self) -> bool:
        return bool(self._hints)

    def __len__(self) -> int:
        return len(self._hints)
