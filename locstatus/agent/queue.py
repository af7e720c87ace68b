"""The agent's due-work queue: which (location, service) to apply next, and when.

The watch side plans work ("this key's stored generation differs from the one applied") and
the apply threads take it in the order it became due, one location at a time each: a key
whose location is being applied by another thread waits (parked) until that work is done, so
the handlers of one location run one after the other while different locations run at once.
A failing key is put back with a backoff; a new plan for the same key supersedes the old entry
(a newer generation is tried at once, without waiting for the backoff of the old one). The
queue is pure: every call takes the current monotonic time, so the order and the backoff rules
are tested with a fake clock (tests/test_agent_parts.py). It is not thread-safe: the agent
calls it under its lock.
"""

from __future__ import annotations

import heapq
from collections.abc import Container

__all__ = ["DueQueue", "Key"]

Key = tuple[str, str]
"""(location, service); service is :data:`~locstatus.models.TOMBSTONE_ACK` for a removal."""


class DueQueue:
    """Keys by the monotonic time (seconds) they become due, plus each key's run of failures.

    - :meth:`schedule` makes a key due now or after a delay. A key already due keeps its place
      when scheduled again without a delay, unless it is backing off after a failure of another
      generation (then the newer generation is due now).
    - :meth:`pop` takes the earliest due key whose location is not busy (the others are
      parked until :meth:`release`); :meth:`next_at` says when one will be.
    - :meth:`failed` / :meth:`succeeded` count consecutive failures of one generation.

    Usage::

        q = DueQueue()
        q.schedule(("us-east-1", "replication"), 4, now=10.0)
        assert q.pop(now=10.0) == ("us-east-1", "replication")
    """

    def __init__(self) -> None:
        self._due: dict[Key, float] = {}
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = 0
        self._failures: dict[Key, tuple[int, int]] = {}  # key -> (generation, count)
        self._parked: dict[str, list[tuple[float, int, Key]]] = {}  # busy location -> entries

    def __len__(self) -> int:
        """Keys waiting (due now or later)."""
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def keys(self) -> set[Key]:
        """The keys waiting."""
        return set(self._due)

    def schedule(
        self, key: Key, generation: int, *, now: float, delay: float = 0.0, force: bool = False
    ) -> bool:
        """Make ``key`` (planned for ``generation``) due at ``now + delay``. Returns False when
        nothing changed (the key is already due and keeps its place or its backoff). With
        ``force`` the new time replaces any earlier plan (a fence does not wait for a
        backoff)."""
        failed = self._failures.get(key)
        if (
            not force
            and delay == 0.0
            and key in self._due
            and (failed is None or failed[0] == generation)
        ):
            return False
        when = now + delay
        self._due[key] = when
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, key))
        return True

    def pop(self, *, now: float, busy: Container[str] = ()) -> Key | None:
        """Remove and return the earliest key due at ``now`` whose location is not in
        ``busy``; None when none is. Due keys of busy locations are parked (they keep their
        place among their location's keys) until :meth:`release`."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            when, _, key = entry
            if self._due.get(key) != when:
                continue  # superseded
            if key[0] in busy:
                self._parked.setdefault(key[0], []).append(entry)
                continue
            del self._due[key]
            return key
        return None

    def release(self, location: str) -> None:
        """The work on ``location`` is done: its parked keys are due again, in their order."""
        for entry in self._parked.pop(location, ()):
            heapq.heappush(self._heap, entry)

    def next_at(self) -> float | None:
        """The monotonic time at which the earliest key not parked is due; None when none."""
        self._drop_superseded()
        return self._heap[0][0] if self._heap else None

    def failed(self, key: Key, generation: int) -> int:
        """Record a failure of ``key`` at ``generation``; return the number of consecutive
        failures of that generation (a failure of another generation starts again at 1)."""
        previous = self._failures.get(key)
        count = previous[1] + 1 if previous and previous[0] == generation else 1
        self._failures[key] = (generation, count)
        return count

    def succeeded(self, key: Key) -> None:
        """Forget the failures of ``key``."""
        self._failures.pop(key, None)

    def discard_location(self, location: str) -> None:
        """Drop every key (and failure count) of ``location``."""
        for table in (self._due, self._failures):
            for key in [k for k in table if k[0] == location]:
                del table[key]
        self._parked.pop(location, None)

    def clear(self) -> None:
        self._due.clear()
        self._heap.clear()
        self._failures.clear()
        self._parked.clear()

    def _drop_superseded(self) -> None:
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
