"""The agent's local copy: the records it read, and what it applied of each.

``is_paused`` is answered from here (a dictionary lookup, no I/O), and the apply side compares
the stored generation of each (location, service) with the generation this worker applied:
work is planned level-triggered, from state, never from the notification that brought it
(docs/agent.md, "What the agent guarantees"). :meth:`LocalCopy.store` only *plans*: it returns
the keys whose stored generation differs from the applied one, and the agent queues them. The
copy is pure (no I/O, no clock) and not thread-safe: the agent calls it under its lock.

**Lives.** A location removed, purged and created again is a new location for the worker,
even when it missed all of that (hints merged, a freeze, a partition): what it applied of the
old life says nothing of the new one, whose generations start again from 0. Comparing
generations alone, a new pause at the generation the worker acknowledged in the old life was
never applied nor acknowledged, and stayed pausing for good (the protocol model's
``stale_applied`` finding, model/README.md). Versions tell lives apart only in each backend's
own numbering, so :meth:`LocalCopy.life_check` only says when a record *may* be of another life
than the one held (its version does not follow the held one within a life) and the worker
applied something there; the agent then asks the backend (:class:`Life`, agent/watch.py), and
a new life is handled like a purge the worker missed (``on_remove`` for the old one), then
applied from scratch.
"""

from __future__ import annotations

from typing import NamedTuple

from locstatus.agent.queue import Key
from locstatus.models import TOMBSTONE_ACK, LocationStatus, tombstone_generation

__all__ = ["PURGED", "Life", "LocalCopy"]

PURGED = -2
"""The generation a removal key ``(location, TOMBSTONE_ACK)`` is queued with when the record
disappeared (purged) before this worker ran ``on_remove`` for it: nothing to acknowledge."""


class Life(NamedTuple):
    """What the backend said of a version :meth:`LocalCopy.life_check` asked about."""

    version: int
    """The version of the record held when the question was asked."""
    same: bool | None
    """True: still a write of the record's current life. False: of an earlier life (the
    location was purged and created again). None: cannot tell (that write's history does
    not read)."""


class LocalCopy:
    """Records by location, plus per (location, service):

    - ``applied``: the generation this worker applied and acknowledged;
    - ``handled``: the generation whose handlers succeeded, acknowledgement still due.

    A removal is the key ``(location, TOMBSTONE_ACK)`` with the tombstone's generation.
    ``touched``: locations whose pause/resume (or fence) handlers ran since their last
    ``on_remove``: the worker has consumers there to tear down.
    ``running``: keys whose last handlers that succeeded were ``on_resume`` (what the worker is
    running, hence what a self-fence stops).
    ``scheduled``: locations with a resume scheduled for one of ``services``.
    ``purged``: locations that disappeared (purged) while this worker had applied some of their
    services and not run ``on_remove`` yet (a freeze, a partition, a lost session): it runs
    ``on_remove`` for them all the same (docs/agent.md "Tombstones").

    Usage::

        copy = LocalCopy(("replication",))
        work = copy.store(record)          # [(("us-east-1", "replication"), 3)]
    """

    def __init__(self, services: tuple[str, ...]) -> None:
        self.services = services
        self.records: dict[str, LocationStatus] = {}
        self.applied: dict[Key, int] = {}
        self.handled: dict[Key, int] = {}
        self.purged: set[str] = set()
        self.running: set[Key] = set()
        self.touched: set[str] = set()
        self.scheduled: set[str] = set()
        """Locations whose record (not removed) has a resume scheduled for a watched service:
        the watch loop looks at these only, not at every record at every pass (a burst wakes
        it thousands of times)."""

    def store(self, rec: LocationStatus) -> list[tuple[Key, int]]:
        """Keep ``rec`` unless a newer version is already known; return the work it implies:
        ``(key, generation)`` for each watched key whose stored generation is not the one
        applied (for a tombstone, its removal). A location whose ``on_remove`` is still due
        for an earlier life (:attr:`purged`) implies no work until that ran (the agent stores
        it again then). Call :meth:`life_check` first."""
        old = self.records.get(rec.location)
        if old is not None and old.version > rec.version:
            return []
        self.records[rec.location] = rec
        loc = rec.location
        if not rec.deleted and any(
            (st := rec.services.get(svc)) is not None and st.scheduled_resume is not None
            for svc in self.services
        ):
            self.scheduled.add(loc)
        else:
            self.scheduled.discard(loc)
        if loc in self.purged:
            return []
        if rec.deleted_at is not None:
            removal = tombstone_generation(rec.deleted_at)
            if self.applied.get((loc, TOMBSTONE_ACK)) != removal:
                return [((loc, TOMBSTONE_ACK), removal)]
            return []
        self.applied.pop((loc, TOMBSTONE_ACK), None)
        self.handled.pop((loc, TOMBSTONE_ACK), None)
        work: list[tuple[Key, int]] = []
        for svc in self.services:
            st = rec.services.get(svc)
            if st is not None and self.applied.get((loc, svc)) != st.generation:
                work.append(((loc, svc), st.generation))
        return work

    def life_check(self, rec: LocationStatus) -> int | None:
        """The version held of ``rec.location`` to ask the backend about before storing
        ``rec`` (is it still a write of the record's current life?), or None: nothing to ask.

        Nothing to ask when ``rec`` is not newer, when it is the very next write after the
        one held (a record is created again only after it was removed, a write of its own,
        and every write of one life is the previous version + 1 while versions increase
        across lives: backends/base.py invariants 1 and 3), or when the worker applied
        nothing there that could be stale."""
        old = self.records.get(rec.location)
        if old is None or rec.version <= old.version:
            return None
        if rec.version == old.version + 1 and old.deleted_at is None:
            return None
        if not self._holds(rec.location):
            return None
        return old.version

    def reapply(self, location: str) -> None:
        """Nothing applied at ``location`` counts any more: its pause/resume handlers run
        again for the state stored next (nothing is torn down). For a record whose life
        cannot be told (:class:`Life` ``same`` None)."""
        for table in (self.applied, self.handled):
            for key in [k for k in table if k[0] == location and k[1] != TOMBSTONE_ACK]:
                del table[key]

    def _holds(self, location: str) -> bool:
        """Something of ``location`` was applied or its handlers ran (tombstone aside)."""
        return location in self.touched or any(
            k[0] == location and k[1] != TOMBSTONE_ACK
            for table in (self.applied, self.handled)
            for k in table
        )

    def forget(self, location: str, *, under_way: bool = False) -> bool:
        """The record is gone (purged): drop it and what was applied of it. Returns True when
        ``on_remove`` is due for it (handlers ran for it since its last removal, and the
        removal itself was not applied, or ``under_way``: one runs now): the location joins
        :attr:`purged`."""
        self.records.pop(location, None)
        self.scheduled.discard(location)
        self.running = {k for k in self.running if k[0] != location}
        for table in (self.applied, self.handled):
            for key in [k for k in table if k[0] == location]:
                del table[key]
        due = location in self.touched or under_way
        self.touched.discard(location)
        if due:
            self.purged.add(location)
        return due

    def removed(self, location: str) -> None:
        """The ``on_remove`` handlers ran: the consumers of ``location`` were torn down, so if
        the location comes back its pause/resume handlers run again."""
        self.touched.discard(location)
        for svc in self.services:
            self.applied.pop((location, svc), None)
            self.handled.pop((location, svc), None)
            self.running.discard((location, svc))

    def stopped(self, key: Key) -> None:
        """A self-fence stopped ``key``: nothing of it counts as applied any more, so once the
        lease is back its handlers run again for the state then read."""
        self.running.discard(key)
        self.applied.pop(key, None)
        self.handled.pop(key, None)

    def acknowledge_again(self) -> None:
        """Everything applied so far is to be acknowledged again, after the next read, without
        running the handlers again (the backend may have dropped the acknowledgements: a
        lapsed lease, a lost ZooKeeper session)."""
        self.handled.update(self.applied)
        self.applied.clear()

    def transitional(self) -> list[str]:
        """Locations (not removed) with a pausing or resuming service, sorted."""
        return sorted(
            loc
            for loc, rec in self.records.items()
            if not rec.deleted and any(s.state.transitional for s in rec.services.values())
        )

    def clear(self) -> None:
        self.records.clear()
        self.scheduled.clear()
        self.applied.clear()
        self.handled.clear()
        self.purged.clear()
        self.running.clear()
        self.touched.clear()
