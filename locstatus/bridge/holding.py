"""Who holds the bridge's standing registrations, so that one bridge publishes at a time
(docs/backbeat.md, "2. The bridge", One bridge publishes).

Two bridges on one configuration would both publish to Backbeat's processors, which then
apply orders concurrently (their read-then-write chains interleave) and leave the state node
disagreeing with the consumer. Each registration names the process that wrote it last (its
``host``, ``pid`` and ``instance`` id: two containers of one host name each run their bridge as
pid 1); a bridge judges from that alone, through the registrations every
backend already stores, so no backend needs a new operation.

Why it is shaped so:

- **A newcomer waits as a standby.** A bridge that finds any of its registrations held by
  another process whose holder is present (not away: its lease ahead, on ZooKeeper its
  ``holder`` node held) registers nothing and publishes nothing; it takes over once every
  one is free (its holder stopped, killed and its lease lapsed, or its session gone). An
  operator runs bridges under a supervisor: a second one refusing to start would be restarted
  in a loop, while a standby is a hot spare that takes over within the lease.
- **Two that run at once settle on one** (both started in the same instant, or one frozen past
  its lease and back): each compares its own identity with the other's (:func:`rank`, host
  then pid then instance id), the same total order on both sides, so exactly one steps down
  to standby (its agents stopped without writing, :meth:`~locstatus.agent.Agent.stop`
  ``handed_over``) and the other takes back what the loser wrote.
- Pure judgement over ``client.workers()`` (one list read per tick, served from a copy on
  ZooKeeper); the bridge acts on it (:mod:`.bridge`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from locstatus.client import Client
from locstatus.instance import process_instance
from locstatus.manager import holder_away
from locstatus.models import WorkerInfo

log = logging.getLogger("locstatus.bridge")

PREFIX = "backbeat."


@dataclass(frozen=True)
class Holder:
    """A process that holds registrations: its host name, pid and instance id (what a
    standing registration stores, ``WorkerInfo.host``/``pid``/``instance``). The instance
    tells apart two processes of one host name and pid (each pid 1 in its own pid namespace);
    None when unknown (a registration of an older version): then host and pid alone tell."""

    host: str
    pid: int
    instance: str | None = None

    def same(self, other: Holder) -> bool:
        """Whether ``other`` is this process: the same host, pid and (when both are known)
        instance."""
        return (self.host, self.pid) == (other.host, other.pid) and (
            self.instance is None or other.instance is None or self.instance == other.instance)

    def __str__(self) -> str:
        known = f", instance {self.instance[:8]}" if self.instance else ""
        return f"host {self.host or '?'}, pid {self.pid}{known}"


def this_process() -> Holder:
    """The identity this process's agents write into their standing registrations."""
    return Holder(socket.gethostname(), os.getpid(), process_instance())


def holder_of(worker: WorkerInfo) -> Holder:
    return Holder(worker.host, worker.pid, worker.instance)


def rank(holder: Holder) -> tuple[str, int, str]:
    """The order two running bridges agree on (host, then pid, then instance id; an unknown
    one first): the lower one keeps publishing."""
    return (holder.host, holder.pid, holder.instance or "")


def bridge_ids(worker_id: str, services: Iterable[str]) -> bool:
    """True when ``worker_id`` is one of the bridge's registrations for ``services``
    (``backbeat.<service>.<location>``, ``backbeat.<service>``, ``backbeat.lifecycle``)."""
    parts = worker_id.split(".", 2)
    return len(parts) in (2, 3) and parts[0] == "backbeat" and parts[1] in set(services)


class Holding:
    """Judge who holds the bridge's standing registrations.

    ``client``: the bridge's store; ``services``: what it bridges; ``me``: this process
    (default :func:`this_process`). Every method reads ``client.workers()`` once and raises
    what it raises (:class:`~locstatus.errors.LocstatusError`: the caller tries again)."""

    def __init__(self, client: Client, services: Iterable[str],
                 me: Holder | None = None) -> None:
        self.client = client
        self.services = tuple(services)
        self.me = me or this_process()
        self._reported: frozenset[tuple[str, Holder]] = frozenset()

    def others(self) -> list[WorkerInfo]:
        """The bridge's standing registrations held by another process whose holder is
        present (not away), sorted by worker id."""
        return [
            w for w in self.client.workers()
            if w.standing and bridge_ids(w.worker_id, self.services)
            and not self.me.same(holder_of(w)) and not holder_away(w, self.client.time)
        ]

    def outranked_by(self, others: list[WorkerInfo]) -> Holder | None:
        """The first holder among ``others`` that ranks before this process, or None."""
        better = sorted((holder_of(w) for w in others if rank(holder_of(w)) < rank(self.me)),
                        key=rank)
        return better[0] if better else None

    def report(self, others: list[WorkerInfo], what: str) -> None:
        """Log ``what`` once per set of (registration, holder) seen (not at every tick)."""
        seen = frozenset((w.worker_id, holder_of(w)) for w in others)
        if seen == self._reported:
            return
        self._reported = seen
        if not others:
            return
        holders = sorted({holder_of(w) for w in others}, key=rank)
        names = ", ".join(w.worker_id for w in others[:3]) + (
            f" and {len(others) - 3} more" if len(others) > 3 else "")
        log.warning("bridge %s: %s %s held by another bridge (%s): %s", self.me, names,
                    "is" if len(others) == 1 else "are",
                    "; ".join(str(h) for h in holders), what)

    @property
    def reported(self) -> bool:
        """Another holder was reported and not forgotten since."""
        return bool(self._reported)

    def forget(self) -> None:
        """Forget what was reported (a new standby period logs again)."""
        self._reported = frozenset()


def judge(holding: Holding, standby: bool, *, take: Callable[[], None],
          step_down: Callable[[], None], retake: Callable[[list[str]], None]) -> bool:
    """One look at who holds the bridge's registrations, and what the bridge does about it;
    returns whether it is (now) a standby.

    - A standby (``standby``) whose registrations are all free (held by nobody present, or by
      itself) takes them over (``take()``: registers its agents); else it keeps waiting.
    - A running bridge that finds one held by a process that ranks before it (:func:`rank`)
      steps down (``step_down()``: its agents stopped without writing) and stands by; one held
      by a process it outranks is taken back (``retake(worker_ids)``): the other steps down
      when it sees that.

    Each change is logged once, naming the other holder's host and pid. Raises what
    ``client.workers()`` raises (nothing was done)."""
    others = holding.others()
    if standby:
        if others:
            holding.report(others, "standing by, publishing nothing, until its holder is away")
            return True
        if holding.reported:
            log.warning("bridge %s: the other bridge is away: taking its registrations over",
                        holding.me)
        holding.forget()
        take()
        return False
    if not others:
        holding.forget()
        return False
    if holding.outranked_by(others) is not None:
        holding.report(others, "this bridge stops publishing and stands by until its holder "
                               "is away")
        step_down()
        return True
    holding.report(others, f"this bridge ({holding.me}) ranks first and keeps them; the "
                           "other stands by")
    retake([w.worker_id for w in others])
    return False
