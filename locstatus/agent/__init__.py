"""The worker side (docs/agent.md): apply the pause/resume state, acknowledge it, settle.

A worker process runs one :class:`Agent`. The agent registers the worker with a lease, keeps a
local copy of the records it watches (so :meth:`Agent.is_paused` is a dictionary lookup, no
I/O), runs the worker's ``on_pause`` / ``on_resume`` / ``on_remove`` handlers whenever the
desired state differs from what the worker applied, acknowledges the generation it applied
(``observed_generation``) and settles ``pausing -> paused`` / ``resuming -> running`` when its
acknowledgement was the last one missing.

Why it is shaped so:

- **Level-triggered, not edge-triggered.** Hints from the backend only say *where* to look; the
  agent always re-reads the record and compares the stored generation with the generation it
  applied. A hint that was coalesced, dropped, or missed while disconnected costs latency, never
  correctness: the agent re-reads every record on start, on every (re)connection, after a lapsed
  lease, and every ``resync_interval`` seconds as a safety net.
- **Acknowledge only what was applied.** After a handler returns, the acknowledgement is written
  on the condition that the record is still at the version whose state was applied; if the
  generation moved while the handler ran, the handler runs again for the newer state.
- **Small threads, one job each, none of which dies.** The *heartbeat* thread renews the lease
  (it must never wait behind a slow handler). The *watch* thread turns hints into reads of the
  backend and keeps the local copy fresh (so ``is_paused`` flips as soon as a pause is read,
  even while a slow handler runs). The *apply* threads run handlers, several locations at once
  and each location's one at a time, in the order their work became due. The *guard* thread
  does no I/O: it reports handlers stuck past their deadline and notices the lease's own end.
  Hint callbacks only record what to look at and return; they never block the backend's thread.
- **Self-fencing.** A worker judges its lease on its own monotonic clock; when it may have
  lapsed it stops what it runs (``on_fence`` or ``on_pause``), acknowledges nothing, and
  re-applies the real state once the lease is back, the fence's handlers returned and every
  record was read again (:mod:`.lease`, :mod:`.heartbeat`, :mod:`.fence`).
- **Settling is everybody's job, but one worker goes first** (:mod:`.settle`).

Where things live (each part a small object with its own tests, tests/test_agent_parts.py):

- :mod:`.worker`: :class:`Agent`, the public worker: settings, handler registration, local
  reads, start/stop, the supervised threads;
- :mod:`.watch`: hints, reads, the local copy kept fresh, settle attempts, due resumes;
- :mod:`.apply`: running handlers, acknowledging what they applied, fencing;
- :mod:`.lease`: the registration, its renewal, how long it holds by the monotonic clock;
- :mod:`.heartbeat`: the heartbeat thread, imposing the self-fence and starting the return;
- :mod:`.fence`: the self-fence: what it must stop, when it may be lifted, pure;
- :mod:`.guard`: the guard thread (stuck handlers, the lease's own end);
- :mod:`.settle`: the settle schedule (debounce, settler choice, retries, sweeps), pure;
- :mod:`.queue`: the due-work queue, pure;
- :mod:`.replica`: the local copy and the work it plans, pure;
- :mod:`.lives`: whether a record read is of the life of the location the worker applied;
- :mod:`.handlers`: the registered handlers and how one is called;
- :mod:`.state`: what the threads share, under one lock.

The agent sits above the manager: it imports :mod:`locstatus.manager`, never the reverse.
``connect(url)`` returns a :class:`locstatus.client.Client`, a manager that also makes agents.

Usage::

    from locstatus import connect

    mgr = connect("sqlite:///./locstatus.db")
    agent = mgr.agent("worker-7", services=["replication"])

    @agent.on_pause("replication")
    def stop(location: str) -> None:
        consumers[location].stop()

    @agent.on_resume("replication")
    def start(location: str) -> None:
        consumers[location].start()

    with agent:                       # start(): register, read, run handlers; stop() on exit
        ...
        if agent.is_paused("us-east-1", "replication"):
            ...
"""

from locstatus.agent.handlers import Applying, Handler, HandlerRetry
from locstatus.agent.lease import UNREGISTER_GRACE
from locstatus.agent.worker import HANDLER_CONCURRENCY, HANDLER_DEADLINE, Agent

__all__ = [
    "HANDLER_CONCURRENCY",
    "HANDLER_DEADLINE",
    "UNREGISTER_GRACE",
    "Agent",
    "Applying",
    "Handler",
    "HandlerRetry",
]
