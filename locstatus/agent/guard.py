"""The agent's guard: the deadlines nobody else may be awake to see.

Every other thread of the agent may be blocked: the heartbeat inside a renewal to a server
that stopped answering, the watch thread inside a read, an apply thread inside a handler that
hangs. The guard does no I/O and runs no user code; it wakes at the earliest of its deadlines,
computed in one place (:meth:`Guard.next_deadline`):

- a running handler's *stuck deadline* (``handler_deadline`` seconds after it started): it is
  marked stuck, which the registration publishes at once (``WorkerInfo.stuck``, docs/agent.md
  "Handlers");
- the end of the lease by the worker's own monotonic clock (:mod:`.lease`): past it, the agent
  self-fences (docs/agent.md "Self-fencing").

A stuck handler also ends what ``start(wait=True)`` waits for at its location (and everywhere
once every apply thread is stuck: nothing else can run), so a handler that hangs at start never
hangs the worker's start (docs/agent.md "Handlers").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from locstatus.agent.state import AgentState

__all__ = ["Guard"]

log = logging.getLogger("locstatus.agent")

IDLE_WAKE = 1.0
"""Seconds between wake-ups when no deadline is nearer (a safety net, not a timer)."""


class Guard:
    """Watches ``state``'s running handlers (and, with ``lease_until``, the lease) for one
    worker.

    ``deadline``: seconds a handler may run before it is reported stuck.
    ``threads``: the number of apply threads (when every one runs a stuck handler, nothing
    else can run; 0: not known, never assumed).
    ``lease_until``: the monotonic time the worker's lease holds until by its own clock, or
    None when it is fenced already; ``on_lapse`` fences it (both from :mod:`.worker`).
    """

    def __init__(
        self,
        state: AgentState,
        worker_id: str,
        *,
        deadline: float,
        threads: int = 0,
        lease_until: Callable[[], float | None] = lambda: None,
        on_lapse: Callable[[], None] = lambda: None,
    ) -> None:
        self.state = state
        self.worker_id = worker_id
        self.deadline = deadline
        self.threads = threads
        self.lease_until = lease_until
        self.on_lapse = on_lapse

    def run(self) -> None:
        """The guard loop, until the agent stops."""
        s = self.state
        while not s.stopping.is_set():
            self.check()
            now = s.monotonic()
            nxt = self.next_deadline()
            wait = IDLE_WAKE if nxt is None else min(IDLE_WAKE, max(0.0, nxt - now))
            s.guard_wake.wait(wait)
            s.guard_wake.clear()

    def next_deadline(self) -> float | None:
        """The earliest monotonic time at which something here is due."""
        s = self.state
        with s.lock:
            times = [r.started + self.deadline for r in s.running.values() if not r.stuck]
        until = self.lease_until()
        if until is not None:
            times.append(until)
        return min(times) if times else None

    def _release_start_locked(self) -> None:
        """What ``start(wait=True)`` waits for, less what a stuck handler holds up: the first
        pass of every location with a stuck handler (its other services queue behind it), and
        all of it once every apply thread is stuck. Caller holds the lock."""
        s = self.state
        stuck = [key for key, r in s.running.items() if r.stuck]
        where = {loc for loc, _ in stuck}
        s.first_pass_discard_locked([k for k in s.first_pass if k[0] in where])
        if self.threads and len(stuck) >= self.threads:
            s.first_pass_discard_locked(list(s.first_pass))

    def check(self) -> None:
        """Mark the handlers past their deadline stuck; fence when the lease ran out."""
        s = self.state
        now = s.monotonic()
        newly: list[tuple[tuple[str, str], str, float]] = []
        with s.lock:
            for key, r in s.running.items():
                if not r.stuck and now >= r.started + self.deadline:
                    r.stuck = True
                    s.metrics["stuck_handlers"] += 1
                    newly.append((key, r.handler, now - r.started))
            if newly:
                self._release_start_locked()
        for (loc, svc), handler, age in newly:
            log.warning(
                "agent %s: handler %s for %s/%s has run %.1fs, past its %gs deadline: stuck",
                self.worker_id,
                handler,
                loc,
                svc,
                age,
                self.deadline,
            )
        if newly:
            s.beat_now.set()  # publish it now
        until = self.lease_until()
        if until is not None and now >= until:
            self.on_lapse()
